//! A limiter's counts for the [`metrics`] facade (feature `metrics`),
//! kept without a shared write on the check path.
//!
//! Each thread counts in a slot of its own: a `Relaxed` load and store of
//! words no other thread writes, no read-modify-write and no cache line
//! two threads both write. A thread takes a number when it first counts and
//! gives it back when it exits, through a mutex (which hands a reused
//! number's slot over with everything its last owner wrote); the threads
//! beyond [`SLOTS`] at once count in one shared slot with `fetch_add`.
//! [`RateLimiter::publish_metrics`](crate::RateLimiter::publish_metrics)
//! adds the slots up and hands the totals to the installed recorder.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_checks_total` | counter | `limiter`, `outcome` (`admitted`, `denied`) |
//! | `tollgate_units_total` | counter | `limiter`, `outcome`: the checks' costs |
//! | `tollgate_key_cap_refusals_total` | counter | `limiter`: new keys a full store refused |
//! | `tollgate_evictions_total` | counter | `limiter`: idle keys `evict_idle` removed |
//! | `tollgate_keys` | gauge | `limiter`: the keys the store holds |

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use metrics::{SharedString, counter, gauge};

use crate::decision::Decision;
use crate::error::CheckError;

/// The threads that count in slots of their own at once; the others share
/// one.
pub const SLOTS: usize = 64;

/// One thread's counts (or the shared slot's), on lines of their own. A
/// check of one unit (the common case) counts once; the units a check costs
/// past its first are counted apart, so that the units total is the checks
/// plus those.
#[derive(Default)]
#[repr(align(128))]
struct Slot {
    admitted: AtomicU64,
    admitted_extra_units: AtomicU64,
    denied: AtomicU64,
    denied_extra_units: AtomicU64,
}

impl Slot {
    /// Counts a decision of `cost` units, as the slot's only writer.
    #[inline]
    fn count_owned(&self, allowed: bool, cost: u32) {
        let (checks, extra_units) = self.outcome(allowed);
        // Relaxed, load and store: this thread is the slot's only writer
        // (its number is its own until it exits), and a reader only sums.
        checks.store(checks.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if cost > 1 {
            let extra = u64::from(cost - 1);
            extra_units.store(
                extra_units.load(Ordering::Relaxed) + extra,
                Ordering::Relaxed,
            );
        }
    }

    /// Counts a decision in the shared slot.
    #[cold]
    fn count_shared(&self, allowed: bool, cost: u32) {
        let (checks, extra_units) = self.outcome(allowed);
        checks.fetch_add(1, Ordering::Relaxed);
        extra_units.fetch_add(u64::from(cost.saturating_sub(1)), Ordering::Relaxed);
    }

    #[inline]
    fn outcome(&self, allowed: bool) -> (&AtomicU64, &AtomicU64) {
        if allowed {
            (&self.admitted, &self.admitted_extra_units)
        } else {
            (&self.denied, &self.denied_extra_units)
        }
    }
}

/// The counts of one limiter.
pub(crate) struct Counts {
    name: SharedString,
    slots: Box<[Slot]>,
    shared: Slot,
    refused: AtomicU64,
    evicted: AtomicU64,
}

impl Counts {
    pub(crate) fn new(name: SharedString) -> Self {
        Self {
            name,
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            shared: Slot::default(),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    /// Counts a check's outcome: its decision, or a new key a full store
    /// refused.
    #[inline]
    pub(crate) fn count(&self, outcome: &Result<Decision, CheckError>, cost: u32) {
        match outcome {
            Ok(decision) => match self.slots.get(thread_number()) {
                Some(slot) => slot.count_owned(decision.is_allowed(), cost),
                None => self.shared.count_shared(decision.is_allowed(), cost),
            },
            Err(CheckError::StoreFull { .. }) => self.count_refused(),
            Err(_) => {}
        }
    }

    #[cold]
    fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts keys `evict_idle` removed.
    pub(crate) fn count_evicted(&self, keys: usize) {
        self.evicted.fetch_add(keys as u64, Ordering::Relaxed);
    }

    /// Hands the totals, and `keys` stored, to the installed recorder.
    pub(crate) fn publish(&self, keys: usize) {
        let sum = |field: fn(&Slot) -> &AtomicU64| {
            self.slots
                .iter()
                .chain([&self.shared])
                .map(|slot| field(slot).load(Ordering::Relaxed))
                .fold(0_u64, u64::wrapping_add)
        };
        let name = &self.name;
        for (outcome, checks, extra_units) in [
            (
                "admitted",
                sum(|slot| &slot.admitted),
                sum(|slot| &slot.admitted_extra_units),
            ),
            (
                "denied",
                sum(|slot| &slot.denied),
                sum(|slot| &slot.denied_extra_units),
            ),
        ] {
            let units = checks.wrapping_add(extra_units);
            counter!("tollgate_checks_total", "limiter" => name.clone(), "outcome" => outcome)
                .absolute(checks);
            counter!("tollgate_units_total", "limiter" => name.clone(), "outcome" => outcome)
                .absolute(units);
        }
        counter!("tollgate_key_cap_refusals_total", "limiter" => name.clone())
            .absolute(self.refused.load(Ordering::Relaxed));
        counter!("tollgate_evictions_total", "limiter" => name.clone())
            .absolute(self.evicted.load(Ordering::Relaxed));
        #[allow(clippy::cast_precision_loss)] // a gauge is an f64
        gauge!("tollgate_keys", "limiter" => name.clone()).set(keys as f64);
    }
}

impl std::fmt::Debug for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counts")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Numbers given back by exited threads, for the next threads to count.
static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
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
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(number);
        }
    }
}

/// This thread's number, taken on its first call.
#[inline]
fn thread_number() -> usize {
    let number = NUMBER.with(Cell::get);
    if number == usize::MAX {
        take_number()
    } else {
        number
    }
}

#[cold]
fn take_number() -> usize {
    let reused = FREE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .pop();
    let number = reused.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
    NUMBER.with(|cell| cell.set(number));
    // Registers the destructor that gives it back; a thread already
    // tearing down its thread-locals keeps the number (it counts no more).
    let _ = OWNER.try_with(|_| ());
    number
}
