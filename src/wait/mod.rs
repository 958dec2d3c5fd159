//! Waiting for an admission instead of being denied: GCRA limiters
//! reserve the next free slot for a request, and a caller waits for it.
//!
//! [`RateLimiter::reserve_n`] (and [`DirectLimiter::reserve_n`]) reserves
//! `n` units at the earliest instant the key can admit them, provided that
//! is at most `max_wait` away, and returns a [`Reservation`]. With the
//! `tokio` feature, `RateLimiter::until_ready` reserves and sleeps on
//! tokio's timer until the slot in one call.
//!
//! What a caller can count on:
//!
//! * **In order.** Reservations of one key are served in the order they
//!   were made, each at its own slot, one cost's worth of intervals after
//!   the one before. Nothing polls: a waiter sleeps until exactly its slot,
//!   and is not woken for another's.
//! * **Never past the quota.** A reserved admission counts against the key
//!   as an admission now would: checks made meanwhile are decided behind
//!   it.
//! * **Nothing lost to cancellation.** A reservation dropped before its
//!   slot gives its units back, and every reservation behind it on the same
//!   key moves forward by its cost, exactly as if the abandoned request had
//!   never arrived. Dropped at or after its slot, it was admitted, and
//!   dropping it changes nothing.
//! * **Bounded waits.** A request whose slot is further than its
//!   `max_wait` is refused at once ([`WaitError::TooLong`]), with nothing
//!   reserved.
//!
//! Only GCRA can admit a request in the future, so only GCRA limiters
//! (the default algorithm) reserve ([`Ledger`]).
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Quota, RateLimiter};
//! use tollgate::wait::WaitError;
//!
//! # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Two a second, one at a time: a slot every 500 ms.
//! let limiter: RateLimiter<String> = RateLimiter::keyed(Quota::per_second(2)?.with_burst(1)?);
//! let max_wait = Duration::from_millis(600);
//! let mut first = limiter.reserve_n("upstream", 1, max_wait)?;
//! assert!(first.is_ready()); // the key had the unit: admitted now
//! let second = limiter.reserve_n("upstream", 1, max_wait)?;
//! assert!(second.wait() > Duration::ZERO); // its slot: about 500 ms away
//! // A third would wait about a second: refused, nothing reserved.
//! assert!(matches!(
//!     limiter.reserve_n("upstream", 1, max_wait),
//!     Err(WaitError::TooLong { .. })
//! ));
//! // Abandoning `second` before its slot gives its unit back.
//! drop(second);
//! assert_eq!(limiter.waiting_reservations(), 0);
//! # Ok(())
//! # }
//! # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
//! ```
//!
//! With the `tokio` feature, waiting is one call:
//!
//! ```
//! # #[cfg(all(feature = "tokio", not(any(feature = "loom", feature = "shuttle"))))]
//! # mod example {
//! use std::time::Duration;
//! use tollgate::{Quota, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # pub async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter: RateLimiter<String> = RateLimiter::keyed(Quota::per_second(100)?.with_burst(1)?);
//! for _ in 0..3 {
//!     // Sleeps until this request's slot (10 ms apart), in arrival order.
//!     limiter.until_ready("upstream", Duration::from_secs(1)).await?;
//! }
//! # Ok(())
//! # }
//! # }
//! # #[cfg(all(feature = "tokio", not(any(feature = "loom", feature = "shuttle"))))]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> { example::main() }
//! # #[cfg(not(all(feature = "tokio", not(any(feature = "loom", feature = "shuttle")))))]
//! # fn main() {}
//! ```

#[cfg(feature = "tokio")]
mod future;
mod queue;

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::task::Waker;
use std::time::Duration;

#[cfg(feature = "tokio")]
pub use future::Ready;
pub(crate) use queue::Queues;
use queue::{Booked, Standing, Ticket};

use crate::algorithm::{Gcra, GcraState};
use crate::cell::{Cell, CellFor};
use crate::clock::{Clock, clamp_time, saturating_nanos};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::store::{Derived, Generation, Key, Lookup, Store, StoreKind, Under};
use crate::{DirectLimiter, RateLimiter};

/// Why a request cannot wait for an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The cost is invalid (zero, above the burst: no wait admits it), or
    /// a new key found the store full.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The request would have to wait longer than the most it accepts.
    /// Nothing was reserved.
    #[error("the request would wait {wait:?}, more than its maximum of {max_wait:?}")]
    TooLong {
        /// How long it would have waited.
        wait: Duration,
        /// The most it accepted.
        max_wait: Duration,
    },
}

/// A limiter that can reserve future admissions: GCRA, keyed
/// ([`RateLimiter`]) or direct ([`DirectLimiter`]). Sealed: its methods
/// are the crate's.
pub trait Ledger: private::Sealed {}

// The sealed trait's methods are the crate's, and so are the types they
// name: no user can call or implement them.
#[allow(private_interfaces)]
mod private {
    use super::Queues;

    /// What a [`Reservation`](super::Reservation) needs of its limiter.
    pub trait Sealed {
        /// The key a queue is kept for (`()` for a direct limiter).
        type Key;

        /// The limiter's clock.
        fn now_ns(&self) -> u64;

        /// Moves `key`'s TAT from `tail_ns` to `restored_ns` if it still
        /// is `tail_ns`, in the generation numbered `stamp`.
        fn refund(&self, key: &Self::Key, stamp: u64, tail_ns: u64, restored_ns: u64) -> bool;

        /// The queues of its keys.
        fn queues(&self) -> &Queues<Self::Key>;
    }
}

/// A reserved admission of a GCRA limiter ([`RateLimiter::reserve_n`],
/// [`DirectLimiter::reserve_n`]): admitted now, or at its slot, for which
/// it waits in line.
///
/// Dropping a reservation before its slot gives its units back, and moves
/// every reservation behind it on the same key forward; at or after its
/// slot it was admitted, and dropping it changes nothing.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Builder, Quota};
/// use tollgate::clock::ManualClock;
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = ManualClock::new();
/// let limiter = Builder::new(Quota::per_second(2)?.with_burst(1)?)
///     .clock(clock.clone())
///     .build::<String>();
/// let mut now = limiter.reserve_n("k", 1, Duration::from_secs(1))?;
/// assert!(now.is_ready());
/// let next = limiter.reserve_n("k", 1, Duration::from_secs(1))?;
/// let mut after = limiter.reserve_n("k", 1, Duration::from_secs(1))?;
/// assert_eq!(next.wait(), Duration::from_millis(500));
/// assert_eq!(after.wait(), Duration::from_millis(1000));
/// // A third would wait 1.5 s, more than it accepts: refused, nothing reserved.
/// assert!(limiter.reserve_n("k", 1, Duration::from_secs(1)).is_err());
/// // Abandoning `next` moves `after` into its slot.
/// drop(next);
/// assert_eq!(after.wait(), Duration::from_millis(500));
/// clock.advance(Duration::from_millis(500));
/// assert!(after.is_ready());
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
#[must_use = "dropping a reservation before its slot gives it back"]
pub struct Reservation<'a, L: Ledger> {
    limiter: &'a L,
    /// `None` once due (or admitted at once).
    ticket: Option<Ticket<L::Key>>,
    decision: Decision,
}

/// A reservation's check: the generation's GCRA with its tolerance widened
/// by the wait a caller accepts, in nanoseconds (see [`reserve`]).
struct Widened(u64);

impl Under<Gcra> for Widened {
    type Chosen<'g> = Derived<Gcra>;

    fn choose(&self, generation: &Generation<Gcra>) -> Result<Derived<Gcra>, CheckError> {
        Ok(Derived(generation.algorithm().widened(self.0)))
    }
}

/// Reserves through `queues` for `key`: the check `check(now, n)` on the
/// key's state, under its queue's lock, by the GCRA of the key's state
/// widened by `max_wait`, which returns its decision, that GCRA (not
/// widened) and the number of the generation it is in (0 for a direct
/// limiter).
fn reserve<'a, L, Q>(
    limiter: &'a L,
    key: &Q,
    n: u32,
    max_wait: Duration,
    check: impl FnOnce(u64, u32) -> Result<(Decision, Gcra, u64), CheckError>,
) -> Result<Reservation<'a, L>, WaitError>
where
    L: Ledger,
    Q: Lookup<L::Key> + ?Sized,
{
    let mut decision = None;
    let ticket = limiter.queues().reserve(key, || {
        let now_ns = clamp_time(limiter.now_ns());
        let (reserved, gcra, stamp) = check(now_ns, n)?;
        let tolerance_ns = gcra.tolerance_ns();
        if !reserved.is_allowed() {
            // It would fit at `retry_after` with the widened tolerance,
            // which is that much further than the quota's.
            let widened = gcra.widened(saturating_nanos(max_wait));
            let extra = Duration::from_nanos(widened.tolerance_ns() - tolerance_ns);
            return Err(WaitError::TooLong {
                wait: reserved.retry_after().saturating_add(extra),
                max_wait,
            });
        }
        // The debt this admission leaves; the slot is when it is down to
        // the tolerance.
        let debt_ns = saturating_nanos(reserved.reset_after());
        let tat_ns = now_ns + debt_ns;
        if debt_ns <= tolerance_ns {
            decision = Some(gcra.allowed(debt_ns));
            return Ok((now_ns, None));
        }
        // At its slot, the key owes exactly the tolerance.
        decision = Some(gcra.allowed(tolerance_ns));
        Ok((
            now_ns,
            Some(Booked {
                slot_ns: tat_ns - tolerance_ns,
                tat_ns,
                cost_ns: gcra.cost_ns(n),
                stamp,
            }),
        ))
    })?;
    Ok(Reservation {
        limiter,
        ticket,
        decision: decision.expect("set by every reservation that returns"),
    })
}

impl<K: Key, C: Clock, S: StoreKind<K, Gcra>> Ledger for RateLimiter<K, Gcra, C, S> {}

#[allow(private_interfaces)] // see `private`
impl<K: Key, C: Clock, S: StoreKind<K, Gcra>> private::Sealed for RateLimiter<K, Gcra, C, S> {
    type Key = K;

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Only in the generation the reservation was written in: after a
    /// change, the key's booked time is carried, and the reservation's
    /// share of it is no longer its cost.
    fn refund(&self, key: &K, stamp: u64, tail_ns: u64, restored_ns: u64) -> bool {
        self.store.update(key, |generation, state| {
            (generation.number().get() == stamp && *state == GcraState::at(tail_ns))
                .then(|| GcraState::at(restored_ns))
        })
    }

    fn queues(&self) -> &Queues<K> {
        &self.queues
    }
}

impl<C: Clock, P: CellFor<Gcra>> Ledger for DirectLimiter<Gcra, C, P> {}

#[allow(private_interfaces)] // see `private`
impl<C: Clock, P: CellFor<Gcra>> private::Sealed for DirectLimiter<Gcra, C, P> {
    type Key = ();

    fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    fn refund(&self, (): &(), _stamp: u64, tail_ns: u64, restored_ns: u64) -> bool {
        // A direct limiter never retires its cell.
        self.cell
            .compare_exchange(
                &self.algorithm,
                &GcraState::at(tail_ns),
                &GcraState::at(restored_ns),
            )
            .unwrap_or(false)
    }

    fn queues(&self) -> &Queues<()> {
        &self.queues
    }
}

impl<K: Key, C: Clock, S: StoreKind<K, Gcra>> RateLimiter<K, Gcra, C, S> {
    /// Reserves `n` units for `key` at the earliest slot after every
    /// reservation already made on it, if that slot is at most `max_wait`
    /// away. The reservation is ready at once when the key has the units
    /// now.
    ///
    /// # Errors
    ///
    /// [`WaitError::Check`] for a cost of zero or above the burst, or a
    /// new key past a rejecting key cap; [`WaitError::TooLong`] when the
    /// slot is further than `max_wait`. Nothing is reserved on error.
    ///
    /// # Panics
    ///
    /// As [`check`](RateLimiter::check), for this key's user code.
    pub fn reserve_n<Q: Lookup<K> + ?Sized>(
        &self,
        key: &Q,
        n: u32,
        max_wait: Duration,
    ) -> Result<Reservation<'_, Self>, WaitError> {
        let widened = Widened(saturating_nanos(max_wait));
        reserve(self, key, n, max_wait, |now_ns, n| {
            self.store
                .check_then(key, &widened, now_ns, n, |generation, _, decision| {
                    (decision, *generation.algorithm(), generation.number().get())
                })
        })
    }

    /// How many keys have reservations waiting for their slot (each such
    /// key holds a queue): zero once every reservation is due or dropped.
    #[must_use]
    pub fn waiting_keys(&self) -> usize {
        self.queues.len()
    }

    /// How many reservations, over every key, wait for their slot: those
    /// callers hold whose slot has not been seen to come. A dropped
    /// reservation leaves at once, so this (and the memory the queues
    /// hold) follows what callers hold, whatever order they drop in.
    #[must_use]
    pub fn waiting_reservations(&self) -> usize {
        self.queues.reservations()
    }
}

impl<C: Clock, P: CellFor<Gcra>> DirectLimiter<Gcra, C, P> {
    /// Reserves `n` units at the earliest slot after every reservation
    /// already made, if that slot is at most `max_wait` away, as
    /// [`RateLimiter::reserve_n`].
    ///
    /// # Errors
    ///
    /// [`WaitError::Check`] for a cost of zero or above the burst;
    /// [`WaitError::TooLong`] when the slot is further than `max_wait`.
    #[allow(clippy::missing_panics_doc)] // a direct limiter's cell is never retired
    pub fn reserve_n(
        &self,
        n: u32,
        max_wait: Duration,
    ) -> Result<Reservation<'_, Self>, WaitError> {
        let widened = self.algorithm.widened(saturating_nanos(max_wait));
        reserve(self, &(), n, max_wait, |now_ns, n| {
            let decision = self
                .cell
                .check(&widened, now_ns, n)?
                .expect("a direct limiter never retires its cell");
            Ok((decision, self.algorithm, 0))
        })
    }

    /// How many reservations wait for their slot, as
    /// [`RateLimiter::waiting_reservations`].
    #[must_use]
    pub fn waiting_reservations(&self) -> usize {
        self.queues.reservations()
    }
}

impl<L: Ledger> Reservation<'_, L> {
    /// Whether the slot has come: the units are admitted.
    pub fn is_ready(&mut self) -> bool {
        matches!(self.standing(None), Standing::Due)
    }

    /// How long until the slot, on the limiter's clock (zero when ready).
    /// Only ever shrinks: a reservation ahead that is given back moves this
    /// one forward.
    #[must_use]
    pub fn wait(&self) -> Duration {
        let Some(ticket) = &self.ticket else {
            return Duration::ZERO;
        };
        let mut now_ns = 0;
        match ticket.peek(|| {
            now_ns = self.limiter.now_ns();
            now_ns
        }) {
            Standing::Due => Duration::ZERO,
            Standing::WaitsFor(slot_ns) => Duration::from_nanos(slot_ns.saturating_sub(now_ns)),
        }
    }

    /// The decision the units are admitted with: at the slot, the key owes
    /// its whole tolerance (nothing remains) unless admitted at once.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Where the reservation stands now; `waker` is woken when its slot
    /// moves. Once due, the ticket is gone.
    fn standing(&mut self, waker: Option<&Waker>) -> Standing {
        let Some(ticket) = &self.ticket else {
            return Standing::Due;
        };
        let limiter = self.limiter;
        let standing = ticket.standing(|| limiter.now_ns(), waker);
        if standing == Standing::Due {
            let ticket = self.ticket.take().expect("checked above");
            limiter.queues().remove_if_empty(&ticket.queue);
        }
        standing
    }

    /// The limiter's clock.
    #[cfg(feature = "tokio")]
    fn now_ns(&self) -> u64 {
        self.limiter.now_ns()
    }
}

impl<L: Ledger> Drop for Reservation<'_, L> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        let limiter = self.limiter;
        let now = || limiter.now_ns();
        // The refund runs the key's `Hash` and `Eq` (user code); a panic
        // there keeps the units (the reservation is still cancelled), and
        // is not raised from a drop, which may run while another unwinds.
        let cancelled = catch_unwind(AssertUnwindSafe(|| {
            ticket.cancel(now, |tail_ns, restored_ns, stamp| {
                limiter.refund(&ticket.queue.key, stamp, tail_ns, restored_ns)
            });
        }));
        if cancelled.is_err() {
            // Whatever was done before the panic (a refund and its shift are
            // made whole before any waker runs), the entry leaves, with no
            // clock read and nothing more given back.
            ticket.forget();
        }
        limiter.queues().remove_if_empty(&ticket.queue);
    }
}

impl<L: Ledger> fmt::Debug for Reservation<'_, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("ticket", &self.ticket)
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}
