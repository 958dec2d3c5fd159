//! A counting global allocator: live bytes, live allocations, and the peak of
//! live bytes, so memory is measured at every instant, not sampled. Shared
//! by the lab (`lab/src/main.rs`) and the memory tests (`tests/memory.rs`);
//! each installs it as its binary's `#[global_allocator]`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Wraps the system allocator and counts what is live; with `PER_THREAD`,
/// also each thread's own share ([`thread_live`]), which costs every
/// allocation two thread-local accesses: only the tests that read it pay.
pub struct Counting<const PER_THREAD: bool = false>;

static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Cleared for good by [`stop`].
static COUNTING: AtomicBool = AtomicBool::new(true);

/// Stops counting for the rest of the process, so that what runs after
/// (timed code that allocates) does not pay for three shared atomic
/// read-modify-writes an allocation; reading the counts afterwards panics.
/// Allocations still pay one relaxed load.
#[allow(dead_code)] // the lab's alone
pub fn stop() {
    COUNTING.store(false, Ordering::Relaxed);
}

/// Whether the counts are still kept (no [`stop`] yet).
fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

/// Panics if the counts stopped: they are no longer what is live.
fn assert_counting() {
    assert!(counting(), "the counting allocator was stopped");
}

thread_local! {
    // This thread's own share: bytes it allocated less bytes it freed, and
    // the peak of that. Const-initialised with nothing to drop, so that
    // reaching them never allocates.
    static THREAD_LIVE: Cell<i64> = const { Cell::new(0) };
    static THREAD_PEAK: Cell<i64> = const { Cell::new(0) };
}

/// Moves this thread's share by `bytes` (negative: freed), raising its peak.
fn thread_moved(bytes: i64) {
    // `try_with`: a thread's last frees can come after its locals are gone.
    let _ = THREAD_LIVE.try_with(|live| {
        let now = live.get() + bytes;
        live.set(now);
        let _ = THREAD_PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

/// Adds `bytes` to the live count and raises the peak to it.
fn grew(bytes: u64) {
    // Relaxed: statistics that no allocation depends on. The peak is exact
    // for one thread; with several, a racing pair can record the higher of
    // two sums that never coexisted, which only ever overstates the peak.
    let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counters are plain
// statistics that no allocation depends on.
unsafe impl<const PER_THREAD: bool> GlobalAlloc for Counting<PER_THREAD> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's valid layout.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() && counting() {
            grew(layout.size() as u64);
            if PER_THREAD {
                thread_moved(layout.size() as i64);
            }
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: forwarded; the caller guarantees `pointer` came from us with
        // this layout.
        unsafe { System.dealloc(pointer, layout) };
        if !counting() {
            return;
        }
        LIVE_BYTES.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        if PER_THREAD {
            thread_moved(-(layout.size() as i64));
        }
        ALLOCATIONS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's arguments.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() && counting() {
            // Counted as the new block arriving before the old one leaves:
            // the most a moving realloc can have live at once.
            grew(new_size as u64);
            LIVE_BYTES.fetch_sub(layout.size() as u64, Ordering::Relaxed);
            if PER_THREAD {
                // In the same order: new block first, for the peak.
                thread_moved(new_size as i64);
                thread_moved(-(layout.size() as i64));
            }
        }
        moved
    }
}

/// Live bytes and live allocations right now. Relaxed: read from the thread
/// that did the allocating, or after joining the others.
pub fn live() -> (u64, u64) {
    assert_counting();
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        ALLOCATIONS.load(Ordering::Relaxed),
    )
}

/// Starts a peak measurement: the peak becomes the live bytes now.
pub fn reset_peak() {
    assert_counting();
    PEAK_BYTES.store(LIVE_BYTES.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The most bytes live at any instant since [`reset_peak`].
pub fn peak() -> u64 {
    assert_counting();
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// This thread's own live bytes: what it allocated less what it freed, so
/// that a single-threaded measurement sees none of what other threads (the
/// test harness's among them) allocate meanwhile.
#[allow(dead_code)] // the memory tests' alone
pub fn thread_live() -> i64 {
    THREAD_LIVE.with(Cell::get)
}

/// Starts a peak measurement of this thread's own bytes.
#[allow(dead_code)] // the memory tests' alone
pub fn reset_thread_peak() {
    THREAD_PEAK.with(|peak| peak.set(thread_live()));
}

/// The most of this thread's own bytes live at once since
/// [`reset_thread_peak`].
#[allow(dead_code)] // the memory tests' alone
pub fn thread_peak() -> i64 {
    THREAD_PEAK.with(Cell::get)
}
