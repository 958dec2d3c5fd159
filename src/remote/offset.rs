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
//!   its own `TIME`): the newest bound, whichever master gave it, plus the
//!   most the masters' clocks may differ, which the user declares. A bound
//!   of any master is then a bound of every master, so a key is never
//!   judged by a clock behind its own. (Without the declared skew, no
//!   bound a node can hold is safe: the first version kept the newest and
//!   judged a key on master B by master A's clock; the second kept the
//!   largest of a window and dropped B's while B's words were still alive
//!   when B was far enough ahead. Both reviews showed units spent past
//!   their deadlines.)
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
//! The pair `(b, at)` is read on every local check and written after every
//! round trip. Writers take a mutex (they follow a round trip: rare) and
//! keep the newest pair; readers take no lock. Two slots and a version: a
//! writer fills the slot the current version does not name, then publishes
//! the next version with `Release`. A reader loads the version (`Acquire`),
//! the slot it names (`Acquire`, pairing with the slot's `Release` stores),
//! and the version again: if it moved, a writer may have been filling the
//! slot it read (only the writer two versions on touches it, after the one
//! in between was published, and reading any of its stores makes that
//! publication visible), so it reads again. Retries need a writer to
//! overtake a reader twice: a round trip's worth of time. Any bound is a
//! bound of every clock the remote decides on, so a reader needs no
//! ordering with the words it judges.

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
    /// Cluster's masters, each deciding on its `TIME`), no two differing by
    /// more than `skew`.
    Several {
        /// The most two of the servers' clocks differ.
        skew: Duration,
    },
}

/// Bounds of the remote's clock; see the module documentation. Public only
/// for the loom model (`model-tests/loom.rs`), under the loom feature.
#[derive(Debug)]
pub struct Offset {
    clock: RemoteClock,
    /// What [`RemoteClock::Several`] adds to every bound, ns.
    skew_ns: u64,
    /// 0 until the first round trip; then the slot `version & 1` holds the
    /// newest pair.
    version: AtomicU64,
    slots: [Slot; 2],
    writer: Mutex<()>,
}

#[derive(Debug)]
struct Slot {
    /// `b`, as a wrapping (two's complement) offset: the remote's clock may
    /// be behind the local one.
    bound_ns: AtomicU64,
    /// The local reading `q` it was measured from.
    at_ns: AtomicU64,
}

impl Slot {
    fn new() -> Self {
        Self {
            bound_ns: AtomicU64::new(0),
            at_ns: AtomicU64::new(0),
        }
    }
}

impl Offset {
    /// No round trip yet, the remote deciding on `clock`.
    #[must_use]
    pub fn new(clock: RemoteClock) -> Self {
        let skew_ns = match clock {
            RemoteClock::Several { skew } => saturating_nanos(skew),
            RemoteClock::Local | RemoteClock::One => 0,
        };
        Self {
            clock,
            skew_ns,
            version: AtomicU64::new(0),
            slots: [Slot::new(), Slot::new()],
            writer: Mutex::new(()),
        }
    }

    /// Records a round trip sent at local `sent_ns` that the remote decided
    /// at `remote_us`, unless a newer one is recorded.
    pub fn observe(&self, remote_us: u64, sent_ns: u64) {
        // On the local clock the bound is the reading itself; the send is
        // recorded all the same, for `recent_ns`.
        let bound_ns = if self.clock == RemoteClock::Local {
            0
        } else {
            remote_us
                .wrapping_add(1)
                .wrapping_mul(1_000)
                .wrapping_sub(sent_ns)
        };
        let _writer = lock(&self.writer);
        // Relaxed: writers are serialised by the mutex, which orders them.
        let version = self.version.load(Ordering::Relaxed);
        if version != 0 && self.slots[slot_of(version)].at_ns.load(Ordering::Relaxed) > sent_ns {
            return;
        }
        let next = version + 1;
        let slot = &self.slots[slot_of(next)];
        // Release: a reader whose Acquire load reads either store sees
        // every write before it, the previous version's publication
        // included, so its second version load sees the version move.
        slot.bound_ns.store(bound_ns, Ordering::Release);
        slot.at_ns.store(sent_ns, Ordering::Release);
        // Release: publishes the slot to readers that Acquire the version.
        self.version.store(next, Ordering::Release);
    }

    /// The remote's instant (a bound, ns) at the latest round trip's send,
    /// read without a clock: a recent "now" for what needs no precision
    /// (the table's sweeps as it grows and at its cap); `None` before the first
    /// round trip. It can run ahead of a later decision's instant, by at
    /// most 1 µs on one server (a call sent later whose script ran earlier
    /// read a `TIME` at most a microsecond below this bound) and by the
    /// declared skew on a Cluster (a later send answered by a master
    /// behind the others); a word judged idle that much early loses only
    /// units it could still have spent in that margin: under-admission,
    /// never a decision Redis would not make.
    #[inline]
    #[must_use]
    pub fn recent_ns(&self) -> Option<u64> {
        let (bound_ns, at_ns) = self.read()?;
        Some(at_ns.wrapping_add(bound_ns).saturating_add(self.skew_ns))
    }

    /// Whether a bound is known: after the first round trip, or from the
    /// start on the local clock.
    #[inline]
    #[must_use]
    pub fn known(&self) -> bool {
        self.clock == RemoteClock::Local || self.version.load(Ordering::Relaxed) != 0
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
        let (bound_ns, at_ns) = self.read()?;
        let drift_ns = now_ns.abs_diff(at_ns) >> DRIFT_SHIFT;
        Some(
            now_ns
                .wrapping_add(bound_ns)
                .saturating_add(drift_ns)
                .saturating_add(self.skew_ns),
        )
    }

    /// The newest `(b, at)`, read as one pair; `None` before the first
    /// round trip.
    #[inline]
    fn read(&self) -> Option<(u64, u64)> {
        loop {
            let version = self.version.load(Ordering::Acquire);
            if version == 0 {
                return None;
            }
            let slot = &self.slots[slot_of(version)];
            let bound_ns = slot.bound_ns.load(Ordering::Acquire);
            let at_ns = slot.at_ns.load(Ordering::Acquire);
            // Relaxed: the Acquire loads above already order it after them.
            if self.version.load(Ordering::Relaxed) == version
                || canary::planted(Canary::OffsetTornRead)
            {
                return Some((bound_ns, at_ns));
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
        let offset = Offset::new(RemoteClock::One);
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
    fn several_clocks_add_their_skew_to_any_bound() {
        // A master 3 µs behind the other answered last: its bound plus the
        // declared skew (5 µs) bounds both.
        let offset = Offset::new(RemoteClock::Several {
            skew: Duration::from_micros(5),
        });
        offset.observe(7, 10_000);
        assert_eq!(offset.remote_ns(10_000), Some(13_000));
    }

    #[test]
    fn a_local_clock_is_its_own_bound() {
        let offset = Offset::new(RemoteClock::Local);
        assert!(offset.known());
        assert_eq!(offset.recent_ns(), None);
        assert_eq!(offset.remote_ns(123_456), Some(123_456));
        offset.observe(1, 999_999);
        assert_eq!(offset.remote_ns(123_456), Some(123_456));
        assert_eq!(offset.recent_ns(), Some(999_999));
    }
}
