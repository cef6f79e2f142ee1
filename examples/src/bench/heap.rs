//! The live heap of a process, counted: a wrapper around the system allocator that P6 installs
//! as the global allocator of the binaries that measure it (`bench_memory`, `bench_suite`, the
//! P6 test), so the runtime's own memory is its allocations, not the resident memory the
//! allocator keeps around them (arenas, fragmentation; see docs/performance.md).
//!
//! Counting is off until [`start`] and off again after [`stop`]; while off, each allocation
//! costs one relaxed load more than the system allocator's, so P1 to P5 in the same binary
//! measure what they measure without it. While on, the counter is the heap's growth since
//! [`start`] (frees of older memory make it negative) and the peak is its highest value.
//!
//! Why a hand-written wrapper: the counting allocators on crates.io count always
//! (`peakmem-alloc`, `cap`) or change every allocation's layout (`tracking-allocator`), which
//! would slow down the P1 and P2 runs of the suite, in the same process as P6's parent.

// The one place in the workspace with `unsafe`: a `GlobalAlloc` implementation cannot be
// written without it. Every method forwards the caller's contract to `System` unchanged.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};

/// The system allocator, counting the live heap between [`start`] and [`stop`]. Declare it in
/// a binary with `#[global_allocator] static HEAP: CountingAllocator = CountingAllocator;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
/// Allocations counted: only ever rises, whatever other threads free meanwhile.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn grew(bytes: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let live = LIVE.fetch_add(bytes as isize, Ordering::Relaxed) + bytes as isize;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    LIVE.fetch_sub(bytes as isize, Ordering::Relaxed);
}

fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

/// Counts a new block of `size` bytes at `ptr` (unless the allocation failed) and returns `ptr`.
fn allocated(ptr: *mut u8, size: usize) -> *mut u8 {
    if !ptr.is_null() && counting() {
        grew(size);
    }
    ptr
}

// SAFETY: every method calls the same method of `System` with the caller's arguments, so it
// keeps `GlobalAlloc`'s contract exactly as `System` does; the counting touches only atomics
// and never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged (see above).
        allocated(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        allocated(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counting() {
            shrank(layout.size());
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() && counting() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        moved
    }
}

/// Starts counting from zero: the live heap from now on is measured against what it is now.
pub fn start() {
    LIVE.store(0, Ordering::Relaxed);
    PEAK.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
}

/// Stops counting and returns the peak growth of the live heap since [`start`], in bytes.
pub fn stop() -> usize {
    COUNTING.store(false, Ordering::Relaxed);
    peak()
}

/// The peak growth of the live heap since [`start`], in bytes (0 if it never grew).
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed).max(0) as usize
}

/// The live heap's growth since [`start`], in bytes (negative when more was freed than
/// allocated since).
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Whether [`CountingAllocator`] is this process's global allocator: counting must be on, and
/// an allocation made now must show. A binary that forgot the declaration would otherwise
/// report a heap of zero.
pub fn installed() -> bool {
    if !counting() {
        return false;
    }
    // Counted allocations, not the live heap: another thread freeing meanwhile (a runtime
    // winding down) could hide the probe from the heap, never from this count.
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let probe = std::hint::black_box(vec![0u8; 4096]);
    let seen = ALLOCATIONS.load(Ordering::Relaxed) > before;
    drop(probe);
    seen
}
