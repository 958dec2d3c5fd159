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
//!   bound a node can hold is safe: keeping the newest judges a key on
//!   master B by master A's clock, and keeping the largest of a window
//!   drops B's while B's words are still alive when B is far enough
//!   ahead. Either spends units past their deadlines.)
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
#[doc(hidden)]
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
    /// Serialises the writers, and holds the pair they published last.
    writer: Mutex<Option<Pair>>,
    /// On [`RemoteClock::Local`]: the latest reading any call was sent
    /// with (the remote may have decided on it already), recorded before
    /// the call is sent.
    sent_ns: AtomicU64,
}

// Every field a time in nanoseconds, named with its unit (STYLE.md, 9).
#[allow(clippy::struct_field_names)]
#[derive(Debug)]
struct Slot {
    /// `b`, as a wrapping (two's complement) offset: the remote's clock may
    /// be behind the local one.
    bound_ns: AtomicU64,
    /// The local reading `q` it was measured from.
    at_ns: AtomicU64,
    /// The high-water mark: the most the remote's clock can have read
    /// under every pair before this one, so that a bound never falls
    /// below an instant the remote may already have decided on, whatever
    /// its clock did since (see [`Offset::remote_ns`]).
    floor_ns: AtomicU64,
}

impl Slot {
    fn new() -> Self {
        Self {
            bound_ns: AtomicU64::new(0),
            at_ns: AtomicU64::new(0),
            floor_ns: AtomicU64::new(0),
        }
    }
}

/// One published pair and its floor.
// As `Slot`'s fields.
#[allow(clippy::struct_field_names)]
#[derive(Debug, Clone, Copy)]
struct Pair {
    bound_ns: u64,
    at_ns: u64,
    floor_ns: u64,
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
            writer: Mutex::new(None),
            sent_ns: AtomicU64::new(0),
        }
    }

    /// Records that a call is about to be sent with the local reading
    /// `sent_ns`: on [`RemoteClock::Local`] the remote decides on it, and
    /// no local decision may then be taken at an older instant (a reading
    /// taken earlier, or after the clock was stepped back).
    pub fn sending(&self, sent_ns: u64) {
        if self.clock == RemoteClock::Local {
            // Relaxed: no data is published with it. What orders it before
            // a check that must see it is outside the memory model: the
            // call is sent after this store (a system call and the network,
            // which synchronise), and reaches the remote only after; a
            // check linearised after the remote decided on it reads its
            // clock, and then this value, after that, in real time.
            self.sent_ns.fetch_max(sent_ns, Ordering::Relaxed);
        }
    }

    /// Records a round trip sent at local `sent_ns`, whose reply arrived
    /// by local `received_ns`, that the remote decided at `remote_us`,
    /// unless a newer one is recorded. The new pair's floor is the most
    /// the replaced pair allowed at `received_ns`: every instant the remote
    /// can have decided on before this reply, had its clock stepped back
    /// since (a bound that falls back to the new pair alone would let a
    /// unit expired under the old one be spent again).
    pub fn observe(&self, remote_us: u64, sent_ns: u64, received_ns: u64) {
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
        let mut published = lock(&self.writer);
        let mut floor_ns = 0;
        if let Some(replaced) = *published {
            if replaced.at_ns > sent_ns {
                return;
            }
            if !canary::planted(Canary::BoundFallsBack) {
                floor_ns = self.bound(replaced, received_ns.max(sent_ns));
            }
        }
        *published = Some(Pair {
            bound_ns,
            at_ns: sent_ns,
            floor_ns,
        });
        // Relaxed: writers are serialised by the mutex, which orders them.
        let version = self.version.load(Ordering::Relaxed);
        let next = version + 1;
        let slot = &self.slots[slot_of(next)];
        // Release: a reader whose Acquire load reads either store sees
        // every write before it, the previous version's publication
        // included, so its second version load sees the version move.
        slot.bound_ns.store(bound_ns, Ordering::Release);
        slot.at_ns.store(sent_ns, Ordering::Release);
        slot.floor_ns.store(floor_ns, Ordering::Release);
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
        let pair = self.read()?;
        Some(
            pair.at_ns
                .wrapping_add(pair.bound_ns)
                .saturating_add(self.skew_ns),
        )
    }

    /// Whether a bound is known: after the first round trip, or from the
    /// start on the local clock.
    #[inline]
    #[must_use]
    pub fn known(&self) -> bool {
        self.clock == RemoteClock::Local || self.version.load(Ordering::Relaxed) != 0
    }

    /// An upper bound of the remote's **high-water mark**, in nanoseconds
    /// on its axis, at the local reading `now_ns`: of every instant the
    /// remote can have decided on so far, not only of its reading now.
    /// `None` before the first round trip (never for
    /// [`RemoteClock::Local`]).
    ///
    /// The two differ when the remote's clock steps back (an NTP step, a
    /// failover to a master whose clock is behind, a client reading older
    /// than one sent before). Deciding at the reading now would spend
    /// again a lease unit whose deadline the remote had already passed:
    /// more admissions in some window than the remote alone makes. So
    /// the bound never falls below its pair's floor, and on the local
    /// clock never below a reading already sent (the leases design note,
    /// "Clocks that step back").
    #[inline]
    #[must_use]
    pub fn remote_ns(&self, now_ns: u64) -> Option<u64> {
        if self.clock == RemoteClock::Local {
            let sent_ns = if canary::planted(Canary::BoundFallsBack) {
                0
            } else {
                // Relaxed: see `sending`.
                self.sent_ns.load(Ordering::Relaxed)
            };
            return Some(now_ns.max(sent_ns));
        }
        let pair = self.read()?;
        Some(self.bound(pair, now_ns))
    }

    /// `pair`'s bound at the local reading `now_ns`: its offset, the drift
    /// allowance and the skew, and never below its floor.
    #[inline]
    fn bound(&self, pair: Pair, now_ns: u64) -> u64 {
        let drift_ns = now_ns.abs_diff(pair.at_ns) >> DRIFT_SHIFT;
        now_ns
            .wrapping_add(pair.bound_ns)
            .saturating_add(drift_ns)
            .saturating_add(self.skew_ns)
            .max(pair.floor_ns)
    }

    /// The newest pair, read whole; `None` before the first round trip.
    #[inline]
    fn read(&self) -> Option<Pair> {
        loop {
            let version = self.version.load(Ordering::Acquire);
            if version == 0 {
                return None;
            }
            let slot = &self.slots[slot_of(version)];
            let pair = Pair {
                bound_ns: slot.bound_ns.load(Ordering::Acquire),
                at_ns: slot.at_ns.load(Ordering::Acquire),
                floor_ns: slot.floor_ns.load(Ordering::Acquire),
            };
            // Relaxed: the Acquire loads above already order it after them.
            if self.version.load(Ordering::Relaxed) == version
                || canary::planted(Canary::OffsetTornRead)
            {
                return Some(pair);
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
        offset.observe(7, 10_000, 10_000);
        assert_eq!(offset.remote_ns(10_000), Some(8_000));
        // 512 µs later: 1 µs of drift allowance.
        assert_eq!(offset.remote_ns(522_000), Some(521_000));
        // An older round trip does not replace a newer one.
        offset.observe(1, 9_000, 530_000);
        assert_eq!(offset.remote_ns(10_000), Some(8_000));
        // A newer one does; on a clock that kept its pace, its floor (the
        // old bound at its receipt) is its own bound there.
        offset.observe(520, 522_000, 522_000);
        assert_eq!(offset.remote_ns(522_000), Some(521_000));
        assert_eq!(offset.remote_ns(1_034_000), Some(1_034_000 - 1_000 + 1_000));
    }

    #[test]
    fn a_clock_stepped_back_never_lowers_the_bound() {
        let offset = Offset::new(RemoteClock::One);
        offset.observe(7, 10_000, 10_000);
        // At local 30 000 the old pair allows up to 28 039 (39 of drift).
        // The remote's clock stepped back 13 µs meanwhile and reads 15 µs:
        // its new pair bounds its reading at 16 000, but it may have
        // decided at up to 28 039 before the step, so that stands.
        offset.observe(15, 30_000, 30_000);
        assert_eq!(offset.remote_ns(30_000), Some(28_039));
        assert_eq!(offset.remote_ns(40_000), Some(28_039));
        // Until the new pair passes it: 29 000 + 25 of drift at 43 000.
        assert_eq!(offset.remote_ns(43_000), Some(29_025));
        // The floor is the old bound at the receipt: a reply that arrived
        // late raises it by the time in flight.
        let late = Offset::new(RemoteClock::One);
        late.observe(7, 10_000, 10_000);
        late.observe(15, 30_000, 50_000);
        assert_eq!(late.remote_ns(30_000), Some(48_000 + 78));
    }

    #[test]
    fn a_local_clock_never_decides_before_a_reading_already_sent() {
        let offset = Offset::new(RemoteClock::Local);
        offset.sending(50_000);
        // A reading taken before that send, or after the clock stepped
        // back: the remote may have decided at 50 000 already.
        assert_eq!(offset.remote_ns(40_000), Some(50_000));
        assert_eq!(offset.remote_ns(60_000), Some(60_000));
    }

    #[test]
    fn several_clocks_add_their_skew_to_any_bound() {
        // A master 3 µs behind the other answered last: its bound plus the
        // declared skew (5 µs) bounds both.
        let offset = Offset::new(RemoteClock::Several {
            skew: Duration::from_micros(5),
        });
        offset.observe(7, 10_000, 10_000);
        assert_eq!(offset.remote_ns(10_000), Some(13_000));
    }

    #[test]
    fn a_local_clock_is_its_own_bound() {
        let offset = Offset::new(RemoteClock::Local);
        assert!(offset.known());
        assert_eq!(offset.recent_ns(), None);
        assert_eq!(offset.remote_ns(123_456), Some(123_456));
        offset.observe(1, 999_999, 999_999);
        assert_eq!(offset.remote_ns(123_456), Some(123_456));
        assert_eq!(offset.recent_ns(), Some(999_999));
    }
}
