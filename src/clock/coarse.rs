use std::fmt;
use std::time::Duration;

use super::{Clock, MonotonicClock, saturating_nanos};
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};

/// A cached clock: a reading is one atomic load of the last instant that a
/// precise source clock reported, refreshed by [`refresh`](CoarseClock::refresh)
/// or by a background thread ([`spawn_refresher`](CoarseClock::spawn_refresher)).
///
/// # Error bound
///
/// A reading lags true time by at most the time since the last refresh: with
/// a refresher every `interval`, by `interval` plus the thread's scheduling
/// delay. A lagging clock only makes a limiter stricter: it sees less time
/// elapsed, so less refill, and never admits more than a precise clock
/// would. A `retry_after` is measured from the cached instant, so a client
/// may wait up to the lag longer than needed. Readings never decrease (the
/// cache only moves forward).
///
/// Clones share one cache, so one refresher serves every clone.
///
/// ```
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() {
/// use tollgate::clock::{Clock, CoarseClock};
///
/// let clock = CoarseClock::new();
/// let cached = clock.now_ns();
/// assert_eq!(clock.now_ns(), cached); // no refresh, no movement
/// assert!(clock.refresh() >= cached);
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
pub struct CoarseClock<C: Clock = MonotonicClock> {
    shared: Arc<Shared<C>>,
}

struct Shared<C> {
    cached_ns: AtomicU64,
    source: C,
}

impl CoarseClock {
    /// A coarse clock over a new [`MonotonicClock`], refreshed once now.
    #[must_use]
    pub fn new() -> Self {
        Self::over(MonotonicClock::new())
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> CoarseClock<C> {
    /// A coarse clock caching readings of `source`, refreshed once now.
    #[must_use]
    pub fn over(source: C) -> Self {
        let cached_ns = AtomicU64::new(source.now_ns());
        Self {
            shared: Arc::new(Shared { cached_ns, source }),
        }
    }

    /// Reads the source and moves the cache forward to it; returns the new
    /// cached reading.
    #[allow(clippy::must_use_candidate)] // called for its effect; the value is a convenience
    pub fn refresh(&self) -> u64 {
        let now_ns = self.shared.source.now_ns();
        // Relaxed: the cache carries no other data (see `ManualClock`); the
        // max keeps it monotone when refreshes race.
        let previous_ns = self.shared.cached_ns.fetch_max(now_ns, Ordering::Relaxed);
        previous_ns.max(now_ns)
    }
}

impl<C: Clock + 'static> CoarseClock<C> {
    /// Starts a thread that refreshes the cache every `interval` until the
    /// returned handle is dropped.
    ///
    /// # Errors
    ///
    /// The error `std::thread::Builder::spawn` returns when the thread
    /// cannot be created.
    pub fn spawn_refresher(&self, interval: Duration) -> std::io::Result<Refresher> {
        let stop = Arc::new(AtomicBool::new(false));
        let clock = self.clone();
        let stop_seen = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tollgate-coarse-clock".into())
            .spawn(move || {
                // Relaxed: the flag carries no data; the handle joins the
                // thread after setting it.
                while !stop_seen.load(Ordering::Relaxed) {
                    clock.refresh();
                    std::thread::park_timeout(interval);
                }
            })?;
        Ok(Refresher {
            stop,
            thread: Some(thread),
            interval_ns: saturating_nanos(interval),
        })
    }
}

impl<C: Clock> Clone for CoarseClock<C> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Clock> Clock for CoarseClock<C> {
    #[inline]
    fn now_ns(&self) -> u64 {
        // Relaxed: see `refresh`.
        self.shared.cached_ns.load(Ordering::Relaxed)
    }

    /// The cache only moves forward (`refresh`).
    fn ordered(&self) -> bool {
        true
    }
}

impl<C: Clock> fmt::Debug for CoarseClock<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("cached_ns", &self.now_ns())
            .finish_non_exhaustive()
    }
}

/// The background refresher of a [`CoarseClock`]; dropping it stops and
/// joins the thread.
pub struct Refresher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    interval_ns: u64,
}

impl Drop for Refresher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            // A refresher thread cannot panic (it only reads clocks); if it
            // somehow did, there is nothing useful to do with that here.
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for Refresher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refresher")
            .field("interval_ns", &self.interval_ns)
            .finish_non_exhaustive()
    }
}
