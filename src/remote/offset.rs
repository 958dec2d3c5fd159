//! Where the deciding clock is, seen from the local one.
//!
//! The remote decides on a clock of its own ([`RemoteClock`]). A local check
//! needs an **upper bound** of the remote's reading at the local instant
//! `t`: a lease unit must be spent no later than its deadline on the
//! remote's clock, and a cached denial must not outlive the remote's.
//!
//! * The remote decides on the local clock's readings (a client clock sent
//!   with each call): the bound is `t` itself, known from the start.
//! * One remote clock (a standalone server's `TIME`): each round trip gives
//!   a bound. Sent at the local reading `q`, the script ran at some local
//!   instant `e >= q` and read `s` whole microseconds, so the remote's
//!   nanoseconds at `e` were below `(s + 1) × 1000`, and at any `t` (clocks
//!   at one rate) the remote reads less than `t + b` with
//!
//!   ```text
//!   b = (s + 1) × 1000 − q.
//!   ```
//!
//!   The newest round trip's bound is kept.
//! * Several remote clocks (a Cluster: each master runs a key's script on
//!   its own `TIME`): the largest bound any round trip gave within the last
//!   `window` (a word's lifetime: the tolerance, the slack and the claim
//!   timeout), an upper bound for every master a word's knowledge came
//!   from. (The newest alone would judge a key on master B by master A's
//!   clock; B's lease units could then be spent past their deadlines by
//!   the two clocks' difference: the review found it.)
//!
//! Measuring from the send, not from the reply's arrival, is what makes
//! the bound hold: from the arrival it would fall short by the reply's
//! time in flight, and a reply that arrives late would look fresh.
//!
//! Clocks on two machines do not run at exactly one rate. A bound read at
//! `at` is widened by [`DRIFT_SHIFT`]: `|t − at| / 512` (1 953 ppm, more than
//! twice the 500 ppm NTP lets either clock slew), so it stays an upper bound
//! while the two rates differ by less than that.
//!
//! # Implementation details
//!
//! The bound `(b, earliest at, latest at)` is read on every local check and
//! written after every round trip. Writers take a mutex (they follow a
//! round trip: rare); readers take no lock. Two slots and a version: a
//! writer fills the slot the current version does not name, then publishes
//! the next version with `Release`. A reader loads the version (`Acquire`),
//! the slot it names (`Acquire`, pairing with the slot's `Release` stores),
//! and the version again: if it moved, a writer may have been filling the
//! slot it read (only the writer two versions on touches it, after the one
//! in between was published, and reading any of its stores makes that
//! publication visible), so it reads again. Retries need a writer to
//! overtake a reader twice: a round trip's worth of time.

use std::time::Duration;

use crate::clock::saturating_nanos;
use crate::sync::canary::{self, Canary};
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// Widens a bound by `|t − at| >> DRIFT_SHIFT`: 1/512 of the time since it
/// was read.
pub(crate) const DRIFT_SHIFT: u32 = 9;

/// Which clock the remote decides on, seen from a [`LocalView`](super::LocalView).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemoteClock {
    /// The local clock's own readings, sent with each call (a client clock
    /// the remote decides on).
    Local,
    /// One clock of its own (a standalone Redis's `TIME`).
    One,
    /// A clock of its own per server, the servers sharing the keys (a Redis
    /// Cluster's masters, each deciding on its `TIME`).
    Several,
}

/// Bounds of the remote's clock; see the module documentation. Public only
/// for the loom model (`model-tests/loom.rs`), under the loom feature.
#[derive(Debug)]
pub struct Offset {
    clock: RemoteClock,
    /// How long a bound of [`RemoteClock::Several`] is kept, ns.
    window_ns: u64,
    /// 0 until the first round trip; then the slot `version & 1` holds the
    /// bound.
    version: AtomicU64,
    slots: [Slot; 2],
    /// The writers' bookkeeping: the bounds of the current and previous
    /// windows.
    writer: Mutex<Windows>,
}

/// A published bound: `b`, and the earliest and latest sends it was
/// measured from (the drift allowance counts from the further).
#[derive(Debug)]
#[allow(clippy::struct_field_names)] // all nanoseconds
struct Slot {
    /// `b`, as a wrapping (two's complement) offset.
    bound_ns: AtomicU64,
    earliest_ns: AtomicU64,
    latest_ns: AtomicU64,
}

/// One window's largest bound and its sends' range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bound {
    window: u64,
    offset_ns: i64,
    earliest_ns: u64,
    latest_ns: u64,
}

impl Bound {
    fn merge(self, other: Bound) -> Bound {
        Bound {
            window: self.window.max(other.window),
            offset_ns: self.offset_ns.max(other.offset_ns),
            earliest_ns: self.earliest_ns.min(other.earliest_ns),
            latest_ns: self.latest_ns.max(other.latest_ns),
        }
    }
}

#[derive(Debug, Default)]
struct Windows {
    current: Option<Bound>,
    previous: Option<Bound>,
}

impl Slot {
    fn new() -> Self {
        Self {
            bound_ns: AtomicU64::new(0),
            earliest_ns: AtomicU64::new(0),
            latest_ns: AtomicU64::new(0),
        }
    }
}

impl Offset {
    /// No round trip yet, the remote deciding on `clock`; a bound of several
    /// clocks is kept `window` (at least a word's lifetime).
    #[must_use]
    pub fn new(clock: RemoteClock, window: Duration) -> Self {
        Self {
            clock,
            window_ns: saturating_nanos(window).max(1),
            version: AtomicU64::new(0),
            slots: [Slot::new(), Slot::new()],
            writer: Mutex::new(Windows::default()),
        }
    }

    /// Records a round trip sent at local `sent_ns` that the remote decided
    /// at `remote_us`.
    pub fn observe(&self, remote_us: u64, sent_ns: u64) {
        if self.clock == RemoteClock::Local {
            return;
        }
        // A two's complement difference: the remote's clock may be behind
        // the local one.
        #[allow(clippy::cast_possible_wrap)]
        let bound_ns = remote_us
            .wrapping_add(1)
            .wrapping_mul(1_000)
            .wrapping_sub(sent_ns) as i64;
        let observed = Bound {
            window: sent_ns / self.window_ns,
            offset_ns: bound_ns,
            earliest_ns: sent_ns,
            latest_ns: sent_ns,
        };
        let mut windows = lock(&self.writer);
        let published = if self.clock == RemoteClock::Several {
            // In the current window, or a send older than it (a reply that
            // took long: the bound of a word installed now): kept with the
            // current. In a later window: the current one becomes the
            // previous, if it is the one just before.
            if windows
                .current
                .is_none_or(|current| current.window < observed.window)
            {
                windows.previous = windows
                    .current
                    .filter(|current| current.window + 1 == observed.window);
            }
            let current = match windows.current {
                Some(current) if current.window >= observed.window => current.merge(observed),
                _ => observed,
            };
            windows.current = Some(current);
            windows
                .previous
                .map_or(current, |previous| previous.merge(current))
        } else {
            if windows
                .current
                .is_some_and(|current| current.latest_ns > sent_ns)
            {
                return;
            }
            windows.current = Some(observed);
            observed
        };
        // Relaxed: writers are serialised by the mutex, which orders them.
        let next = self.version.load(Ordering::Relaxed) + 1;
        let slot = &self.slots[slot_of(next)];
        // Release: a reader whose Acquire load reads any of these stores
        // sees every write before it, the previous version's publication
        // included, so its second version load sees the version move.
        #[allow(clippy::cast_sign_loss)]
        slot.bound_ns
            .store(published.offset_ns as u64, Ordering::Release);
        slot.earliest_ns
            .store(published.earliest_ns, Ordering::Release);
        slot.latest_ns.store(published.latest_ns, Ordering::Release);
        // Release: publishes the slot to readers that Acquire the version.
        self.version.store(next, Ordering::Release);
    }

    /// An upper bound of the remote's reading, in nanoseconds on its axis,
    /// at the local reading `now_ns`; `None` before the first round trip
    /// (never for [`RemoteClock::Local`]).
    #[inline]
    #[must_use]
    pub fn remote_ns(&self, now_ns: u64) -> Option<u64> {
        if self.clock == RemoteClock::Local {
            return Some(now_ns);
        }
        loop {
            let version = self.version.load(Ordering::Acquire);
            if version == 0 {
                return None;
            }
            let slot = &self.slots[slot_of(version)];
            let bound_ns = slot.bound_ns.load(Ordering::Acquire);
            let earliest_ns = slot.earliest_ns.load(Ordering::Acquire);
            let latest_ns = slot.latest_ns.load(Ordering::Acquire);
            // Relaxed: the Acquire loads above already order it after them.
            if self.version.load(Ordering::Relaxed) == version
                || canary::planted(Canary::OffsetTornRead)
            {
                let drift_ns =
                    now_ns.abs_diff(earliest_ns).max(now_ns.abs_diff(latest_ns)) >> DRIFT_SHIFT;
                return Some(now_ns.wrapping_add(bound_ns).saturating_add(drift_ns));
            }
        }
    }
}

/// The slot a version names.
const fn slot_of(version: u64) -> usize {
    (version & 1) as usize
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use std::time::Duration;

    use super::{Offset, RemoteClock};

    #[test]
    fn one_clock_keeps_the_newest_bound_measured_from_the_send() {
        let offset = Offset::new(RemoteClock::One, Duration::from_secs(1));
        assert_eq!(offset.remote_ns(5), None);
        // Sent at local 10 000 ns; the remote read 7 µs (7 000–7 999 ns):
        // b = 8 000 − 10 000, so local 10 000 is at most remote 8 000.
        offset.observe(7, 10_000);
        assert_eq!(offset.remote_ns(10_000), Some(8_000));
        // 512 µs later: 1 µs of drift allowance.
        assert_eq!(offset.remote_ns(522_000), Some(521_000));
        // An older round trip does not replace a newer one.
        offset.observe(1, 9_000);
        assert_eq!(offset.remote_ns(10_000), Some(8_000));
        offset.observe(20, 30_000);
        assert_eq!(offset.remote_ns(30_000), Some(21_000));
    }

    #[test]
    fn several_clocks_keep_the_largest_bound_of_a_window() {
        // Windows of 1 ms. Master A: b = 1 000 ns; master B, 5 µs ahead:
        // b = 6 000 ns.
        let offset = Offset::new(RemoteClock::Several, Duration::from_millis(1));
        offset.observe(10, 10_000);
        offset.observe(16, 11_000);
        offset.observe(12, 12_000);
        // The largest, B's, with the drift counted from the earliest send.
        assert_eq!(offset.remote_ns(12_000), Some(18_000 + (2_000 >> 9)));
        // The next window keeps the previous one's bound...
        offset.observe(1_005, 1_005_000);
        assert_eq!(
            offset.remote_ns(1_005_000),
            Some(1_011_000 + (995_000 >> 9))
        );
        // ... and the one after forgets it.
        offset.observe(2_005, 2_005_000);
        assert_eq!(
            offset.remote_ns(2_005_000),
            Some(2_006_000 + (1_000_000 >> 9))
        );
    }

    #[test]
    fn a_local_clock_is_its_own_bound() {
        let offset = Offset::new(RemoteClock::Local, Duration::from_secs(1));
        assert_eq!(offset.remote_ns(123_456), Some(123_456));
        offset.observe(1, 999_999);
        assert_eq!(offset.remote_ns(123_456), Some(123_456));
    }
}
