//! A limiter's counts for the `metrics` crate's facade (feature
//! `metrics`), kept without a shared write on the check path.
//!
//! Each thread counts in a slot of its own: a `Relaxed` load and store of
//! words no other thread writes, no read-modify-write and no cache line
//! two threads both write. A thread takes a number when it first counts and
//! gives it back when it exits, through a mutex (which hands a reused
//! number's slot over with everything its last owner wrote; the lowest
//! free number goes first); the threads beyond 64 at once count in one
//! shared slot with `fetch_add`.
//! [`RateLimiter::publish_metrics`](crate::RateLimiter::publish_metrics)
//! adds the slots up and hands the recorder what was counted since its last
//! call, so that limiters of one name add up, and one built again under a
//! name goes on from where the old one left it.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_checks_total` | counter | `limiter`, `outcome` (`admitted`, `denied`) |
//! | `tollgate_units_total` | counter | `limiter`, `outcome`: the checks' costs |
//! | `tollgate_new_key_refusals_total` | counter | `limiter`, `reason` (`full`: a rejecting key cap; `reclaiming`: a check stalled inside the store holds room back) |
//! | `tollgate_evictions_total` | counter | `limiter`: idle keys `evict_idle` removed |
//! | `tollgate_keys` | gauge | `limiter`: the keys the store holds (limiters of one name add up) |
//!
//! Counted: the checks of a keyed limiter built with
//! [`Builder::metrics`](crate::Builder::metrics) (`check`, `check_n`,
//! `check_with` and their receipts, and so `check_all` and the layer's
//! rules). Not counted: peeks, reservations (`reserve_n`, `until_ready`),
//! admissions given back later (they stay counted as admitted), the
//! evictions the stores make as they grow, and a direct limiter.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use metrics::{SharedString, counter, gauge};

use crate::decision::Decision;
use crate::error::CheckError;

/// The threads that count in slots of their own at once; the others share
/// one.
const SLOTS: usize = 64;

/// One thread's counts (or the shared slot's), on lines of their own. A
/// check of one unit (the common case) counts once; the units a check costs
/// past its first are counted apart, so that the units total is the checks
/// plus those.
#[derive(Default)]
#[repr(align(128))]
struct Slot {
    /// Checks denied and admitted (indexed by `allowed`).
    checks: [AtomicU64; 2],
    /// The units those checks cost past their first, likewise.
    extra_units: [AtomicU64; 2],
    /// Checks a remote limiter's local half decided (`tollgate-redis`).
    local: AtomicU64,
}

impl Slot {
    /// Counts a decision of `cost` units, as the slot's only writer.
    #[inline]
    fn count_owned(&self, allowed: bool, cost: u32) {
        let outcome = usize::from(allowed);
        // Relaxed, load and store: this thread is the slot's only writer
        // (its number is its own until it exits), and a reader only sums.
        let checks = &self.checks[outcome];
        checks.store(checks.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if cost > 1 {
            let extra_units = &self.extra_units[outcome];
            extra_units.store(
                extra_units.load(Ordering::Relaxed) + u64::from(cost - 1),
                Ordering::Relaxed,
            );
        }
    }

    /// Counts a decision in the shared slot.
    fn count_shared(&self, allowed: bool, cost: u32) {
        let outcome = usize::from(allowed);
        self.checks[outcome].fetch_add(1, Ordering::Relaxed);
        self.extra_units[outcome].fetch_add(u64::from(cost.saturating_sub(1)), Ordering::Relaxed);
    }
}

/// The counts of one limiter. Public for `tollgate-redis`, whose limiters
/// count their checks the same way; not part of the API.
#[doc(hidden)]
pub struct Counts {
    name: SharedString,
    slots: [Slot; SLOTS],
    shared: Slot,
    refused_full: AtomicU64,
    refused_reclaiming: AtomicU64,
    evicted: AtomicU64,
    /// The totals last handed to the recorder (in [`Published`]'s order),
    /// and the keys then stored: what the next publication adds to.
    published: Mutex<Published>,
}

/// What a limiter last handed the recorder.
#[derive(Default)]
struct Published {
    /// Checks and units admitted, checks and units denied, new keys refused
    /// (full, reclaiming), evictions.
    totals: [u64; 7],
    keys: u64,
}

impl Counts {
    /// Counts for the limiter `name`.
    #[must_use]
    pub fn new(name: SharedString) -> Self {
        Self {
            name,
            slots: std::array::from_fn(|_| Slot::default()),
            shared: Slot::default(),
            refused_full: AtomicU64::new(0),
            refused_reclaiming: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            published: Mutex::new(Published::default()),
        }
    }

    /// Counts a check's outcome: its decision, or a new key a full store
    /// refused.
    #[inline]
    pub fn count(&self, outcome: &Result<Decision, CheckError>, cost: u32) {
        match outcome {
            // A thread with no number yet reads `usize::MAX`, past every
            // slot: one comparison sends both it and the threads past the
            // slots to the cold path.
            Ok(decision) => match self.slots.get(NUMBER.with(Cell::get)) {
                Some(slot) => slot.count_owned(decision.is_allowed(), cost),
                None => self.count_unowned(decision.is_allowed(), cost),
            },
            Err(CheckError::StoreFull { .. }) => Self::count_refused(&self.refused_full),
            Err(CheckError::Reclaiming) => Self::count_refused(&self.refused_reclaiming),
            Err(_) => {}
        }
    }

    /// Counts for a thread with no number yet (it takes one) or past the
    /// slots (the shared slot).
    #[cold]
    fn count_unowned(&self, allowed: bool, cost: u32) {
        let number = match NUMBER.with(Cell::get) {
            usize::MAX => take_number(),
            number => Some(number),
        };
        match number.and_then(|number| self.slots.get(number)) {
            Some(slot) => slot.count_owned(allowed, cost),
            None => self.shared.count_shared(allowed, cost),
        }
    }

    #[cold]
    fn count_refused(refused: &AtomicU64) {
        refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a check a remote limiter's local half decided, in this
    /// thread's slot as [`count`](Counts::count) does.
    #[inline]
    pub fn count_local(&self) {
        match self.slots.get(NUMBER.with(Cell::get)) {
            Some(slot) => slot
                .local
                .store(slot.local.load(Ordering::Relaxed) + 1, Ordering::Relaxed),
            None => self.count_local_unowned(),
        }
    }

    #[cold]
    fn count_local_unowned(&self) {
        let number = match NUMBER.with(Cell::get) {
            usize::MAX => take_number(),
            number => Some(number),
        };
        match number.and_then(|number| self.slots.get(number)) {
            Some(slot) => slot
                .local
                .store(slot.local.load(Ordering::Relaxed) + 1, Ordering::Relaxed),
            None => {
                self.shared.local.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The checks [`count_local`](Counts::count_local) counted so far.
    #[must_use]
    pub fn local(&self) -> u64 {
        self.sum(|slot| &slot.local)
    }

    fn sum(&self, field: fn(&Slot) -> &AtomicU64) -> u64 {
        self.slots
            .iter()
            .chain([&self.shared])
            .map(|slot| field(slot).load(Ordering::Relaxed))
            .fold(0_u64, u64::wrapping_add)
    }

    /// Counts keys `evict_idle` removed.
    pub(crate) fn count_evicted(&self, keys: usize) {
        self.evicted.fetch_add(keys as u64, Ordering::Relaxed);
    }

    /// Hands the installed recorder what was counted since the last call,
    /// and the change in `keys` stored (`None`: a store whose keys are not
    /// known here, as Redis's; no gauge).
    pub fn publish(&self, keys: Option<usize>) {
        // Held while the totals are read and the recorder is told, so that
        // two publications of one limiter hand it each count once, in
        // order. The counters' totals are recorded as published before the
        // recorder runs (one that panics loses a publication rather than
        // handing the next one it again); the keys once the gauge has
        // moved by them (it moves by differences: one lost would stay).
        let mut held = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let sum = |field| self.sum(field);
        let admitted = sum(|slot| &slot.checks[1]);
        let denied = sum(|slot| &slot.checks[0]);
        let totals = [
            admitted,
            admitted.wrapping_add(sum(|slot| &slot.extra_units[1])),
            denied,
            denied.wrapping_add(sum(|slot| &slot.extra_units[0])),
            self.refused_full.load(Ordering::Relaxed),
            self.refused_reclaiming.load(Ordering::Relaxed),
            self.evicted.load(Ordering::Relaxed),
        ];
        let previous = std::mem::replace(&mut held.totals, totals);
        let name = &self.name;
        let since = |index: usize| totals[index].wrapping_sub(previous[index]);
        for (outcome, checks, units) in [("admitted", 0, 1), ("denied", 2, 3)] {
            counter!("tollgate_checks_total", "limiter" => name.clone(), "outcome" => outcome)
                .increment(since(checks));
            counter!("tollgate_units_total", "limiter" => name.clone(), "outcome" => outcome)
                .increment(since(units));
        }
        for (reason, index) in [("full", 4), ("reclaiming", 5)] {
            counter!("tollgate_new_key_refusals_total", "limiter" => name.clone(), "reason" => reason)
                .increment(since(index));
        }
        counter!("tollgate_evictions_total", "limiter" => name.clone()).increment(since(6));
        held.keys = match keys.map(|keys| keys as u64) {
            Some(keys) => {
                let stored = gauge!("tollgate_keys", "limiter" => name.clone());
                #[allow(clippy::cast_precision_loss)] // a gauge is an f64
                if keys > held.keys {
                    stored.increment((keys - held.keys) as f64);
                } else {
                    stored.decrement((held.keys - keys) as f64);
                }
                keys
            }
            None => 0,
        };
    }
}

/// A limiter dropped takes its keys out of its name's gauge (the installed
/// global recorder's).
impl Drop for Counts {
    fn drop(&mut self) {
        let published = self
            .published
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if published.keys > 0 {
            // A recorder's panic stops here: the limiter may be dropped
            // while another panic unwinds, where a second would abort.
            let (name, keys) = (&self.name, published.keys);
            drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                || {
                    #[allow(clippy::cast_precision_loss)] // a gauge is an f64
                    gauge!("tollgate_keys", "limiter" => name.clone()).decrement(keys as f64);
                },
            )));
        }
    }
}

impl std::fmt::Debug for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counts")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Numbers given back by exited threads, for the next threads to count:
/// the lowest first, so that the slots of a burst's threads are used again
/// before the shared one.
static FREE: Mutex<BinaryHeap<Reverse<usize>>> = Mutex::new(BinaryHeap::new());
/// The next number never taken.
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number; `usize::MAX` until it first counts.
    static NUMBER: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Gives the number back when the thread exits.
    static OWNER: Owner = const { Owner };
}

/// Gives this thread's number back when dropped (the thread exits).
struct Owner;

impl Drop for Owner {
    fn drop(&mut self) {
        let number = NUMBER.with(|number| number.replace(usize::MAX));
        if number != usize::MAX {
            FREE.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Reverse(number));
        }
    }
}

/// Takes a number for this thread; `None` for a thread already tearing
/// down its thread-locals, which could not give one back (it counts in the
/// shared slot).
#[cold]
fn take_number() -> Option<usize> {
    // Registers the destructor that gives the number back, first.
    OWNER.try_with(|_| ()).ok()?;
    let reused = FREE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop()
        .map(|Reverse(number)| number);
    let number = reused.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
    NUMBER.with(|cell| cell.set(number));
    Some(number)
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use std::sync::Barrier;

    use super::{Counts, SLOTS};
    use crate::decision::Decision;

    /// 80 threads count at once, each holding its number until all have
    /// counted once: 64 in slots of their own, 16 in the shared one, and
    /// every count there. Then a lone thread takes the lowest free number.
    #[test]
    fn threads_past_the_slots_count_in_the_shared_one() {
        let counts = Counts::new("test".into());
        let denied = Decision::deny(1, 0, 1, 1);
        let all = Barrier::new(80);
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..80)
                .map(|_| {
                    scope.spawn(|| {
                        counts.count(&Ok(denied), 3);
                        all.wait();
                        for _ in 0..9 {
                            counts.count(&Ok(denied), 3);
                        }
                    })
                })
                .collect();
            // Joined one by one: a scope's end waits for each closure, not
            // for the thread-local destructors that give the numbers back.
            for thread in threads {
                thread.join().unwrap();
            }
        });
        let shared = counts.shared.checks[0].load(std::sync::atomic::Ordering::Relaxed);
        let owned: u64 = counts
            .slots
            .iter()
            .map(|slot| slot.checks[0].load(std::sync::atomic::Ordering::Relaxed))
            .sum();
        assert!(shared >= 10 * (80 - SLOTS as u64), "shared {shared}");
        assert_eq!(owned + shared, 800);
        assert_eq!(
            counts.shared.extra_units[0].load(std::sync::atomic::Ordering::Relaxed),
            2 * shared
        );
        let number = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    counts.count(&Ok(denied), 1);
                    super::NUMBER.with(std::cell::Cell::get)
                })
                .join()
                .unwrap()
        });
        assert_eq!(number, 0, "the lowest free number first");
    }
}
