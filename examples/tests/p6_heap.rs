//! P6's measurement, checked both ways: the runtime's peak heap stays flat when the backlog
//! grows tenfold, and a planted leak (a handler that keeps every event) is caught by the same
//! measurement. Figures are not asserted here (docs/performance.md has them, from a release
//! build); only the property and that its check can fail.
//!
//! One test: the heap counter is process-wide, so two measurements must not overlap.

use flowwarden_examples::bench::heap::CountingAllocator;
use flowwarden_examples::bench::p6::{measure, Mode};

#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;

const SMALL: u64 = 2_000;
const LARGE: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peak_heap_is_flat_in_the_backlog_and_a_leak_is_caught() {
    let normal = Mode::default();
    let small = measure(SMALL, normal).await.expect("small backlog");
    let large = measure(LARGE, normal).await.expect("large backlog");
    let (s, l) = (small.heap_peak as f64, large.heap_peak as f64);
    eprintln!("peak heap: {SMALL} events {s} bytes, {LARGE} events {l} bytes");
    assert!(s > 0.0, "the counter saw the runtime allocate: {small:?}");
    assert!(
        l <= 2.0 * s,
        "10x the backlog must not double the runtime's peak heap: {s} -> {l} bytes"
    );

    // The same check on a runtime whose memory grows with the backlog fails.
    let hold = Mode {
        hold: true,
        ..Mode::default()
    };
    let small = measure(SMALL, hold).await.expect("small backlog, held");
    let large = measure(LARGE, hold).await.expect("large backlog, held");
    let (s, l) = (small.heap_peak as f64, large.heap_peak as f64);
    eprintln!("peak heap, held: {SMALL} events {s} bytes, {LARGE} events {l} bytes");
    assert!(
        l > 5.0 * s,
        "a handler keeping every event must show as growth: {s} -> {l} bytes"
    );
}
