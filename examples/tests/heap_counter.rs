//! The heap counter of P6 (`flowwarden_examples::bench::heap`), in a process whose global
//! allocator it is. Its own test binary with one test: counting is process-wide, and tests
//! running in parallel threads would count each other's allocations.

use flowwarden_examples::bench::heap::{installed, live, peak, start, stop, CountingAllocator};

#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;

#[test]
fn counts_growth_peak_and_frees_while_on_and_nothing_while_off() {
    // Off: nothing is counted.
    let off = vec![1u8; 1 << 20];
    assert_eq!(live(), 0, "counted while off");
    start();
    assert!(installed(), "the wrapper is the global allocator here");
    let held = vec![2u8; 1 << 20];
    assert!(
        live() >= 1 << 20,
        "an allocation of 1 MiB shows: {}",
        live()
    );
    drop(held);
    assert!(live() < 1 << 20, "its free shows: {}", live());
    assert!(peak() >= 1 << 20, "the peak remembers it: {}", peak());
    // Freeing memory from before the start makes the growth negative, not the peak.
    drop(off);
    assert!(live() < 0, "freeing older memory counts down: {}", live());
    let mut grown = vec![0u8; 16];
    let before = live();
    grown.resize(4 << 20, 3);
    assert!(
        live() - before >= (4 << 20) - 16,
        "a realloc that grows shows: {} -> {}",
        before,
        live()
    );
    assert!(peak() as isize >= live(), "the peak follows: {}", peak());
    drop(grown);
    let peak_at_stop = stop();
    assert!(!installed(), "off after stop");
    let after = vec![4u8; 8 << 20];
    assert_eq!(peak(), peak_at_stop, "nothing counted after stop");
    drop(after);
}
