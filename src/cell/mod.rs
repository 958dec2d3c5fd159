//! One key's state under one synchronisation discipline.
//!
//! A cell applies an [`Algorithm`]'s pure decision to one state that many
//! threads share:
//!
//! * [`Atomic`]: the state packed in one `AtomicU64`, updated by
//!   compare-and-swap. A denial is a load and a compare, and writes nothing.
//!   Serves every [`PackedAlgorithm`](crate::algorithm::PackedAlgorithm)
//!   (GCRA, fixed window).
//! * [`Adaptive`]: the sliding window counter's, an [`Atomic`] cell where
//!   the counter's quota lets every state pack into a word, a [`Locked`]
//!   one where it does not.
//! * [`Locked`]: any state behind a mutex. Read, decide and write happen
//!   inside one critical section, which is what makes it correct: a lock held
//!   only across the write would decide on stale data.
//!
//! Which cell an algorithm's state lives in is chosen here, not by the
//! algorithm: [`CellFor`] maps algorithms to cells, [`Preferred`] picks the
//! atomic cell wherever the state packs into a word, and [`AlwaysLocked`]
//! picks the mutex for every algorithm, so that a benchmark can vary the
//! cell alone (`LockFree::cells`).
//!
//! A cell can be **retired**: taken out of service by idle eviction or by a
//! table rebuild. A retired cell answers every check with `None`, and the
//! store then looks the key up again. Retirement is terminal, and it is
//! decided on the same word (or under the same lock) as admissions, so an
//! admission cannot slip into a cell after its state has been judged idle or
//! copied away.
//!
//! [`Cell`] is sealed: its protocol is what the stores' correctness rests
//! on. Its methods are public, so that a store written outside the crate can
//! hold these cells and apply the same arithmetic.

mod adaptive;
mod atomic;
mod locked;

use std::fmt::Debug;

pub use adaptive::Adaptive;
pub use atomic::Atomic;
pub use locked::Locked;

use crate::algorithm::{
    Algorithm, Carry, CarryAt, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};
use crate::decision::Decision;
use crate::error::CheckError;

/// One key's state, shared between threads, with retirement.
///
/// A cell is used with the algorithm it was made with (`new`,
/// `with_state`) or one of that algorithm's
/// [`for_quota`](Algorithm::for_quota): its word, where it packs one, is
/// in that algorithm's layout, which another algorithm may read otherwise.
/// Used with another, its decisions are unspecified (they may be wrong, or
/// panic); memory stays safe, as with a `HashMap` whose keys' `Hash`
/// changes. The crate's stores and limiters hold one algorithm for all
/// their cells, and check with its `for_quota`.
pub trait Cell<A: Algorithm>: private::Sealed<A> + Debug + Send + Sync + Sized {
    /// A fresh key's cell.
    fn new(algorithm: &A) -> Self;

    /// A cell holding `state`: a new key's, with its first admission
    /// applied before the cell is shared.
    fn with_state(algorithm: &A, state: A::State) -> Self;

    /// Decides `cost` units at `now_ns` and consumes them if admitted,
    /// atomically. `Ok(None)` means the cell is retired and nothing was done.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`]; nothing is consumed on error.
    fn check(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Option<Decision>, CheckError>;

    /// The decision `check` would return, consuming nothing; `Ok(None)` if
    /// retired.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`].
    fn peek(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Option<Decision>, CheckError>;

    /// Retires the cell if its state is idle at `now_ns` (see
    /// [`Algorithm::is_idle`]), atomically with respect to admissions.
    /// Returns whether this call retired it.
    fn retire_if_idle(&self, algorithm: &A, now_ns: u64) -> bool;

    /// Retires the cell and returns a new, unshared cell holding its final
    /// state, or `None` if it was already retired. Used to move a key to a
    /// new table without losing an admission.
    fn retire_into_new(&self) -> Option<Self>;

    /// Replaces the state with what `change` makes of it, atomically with
    /// respect to checks: `Some(true)` if `change` returned a state and it
    /// was installed, `Some(false)` if `change` returned `None` (nothing
    /// done), `None` if the cell is retired (nothing done, `change` not
    /// called).
    ///
    /// `change` may be called more than once: a lock-free cell calls it
    /// again on the state that won a race against it. Taking an admission
    /// back ([`RateLimiter::refund`](crate::RateLimiter::refund)) is such a
    /// change. A state that would pack to the atomic cell's retired word
    /// (a state no check produces) is not installed: `Some(false)`.
    fn update(&self, algorithm: &A, change: impl Fn(&A::State) -> Option<A::State>)
    -> Option<bool>;

    /// A new, unshared cell holding this cell's state carried from `from`
    /// to `to` at `at` by `carry` ([`Algorithm::carry`]), in `to`'s
    /// layout; `None` if this cell is retired or the algorithm does not
    /// carry the state. This cell is left as it is: a store carries the
    /// cells of a table no check can reach yet, and keeps them if the
    /// algorithm's code panics.
    fn carried(&self, from: &A, to: &A, carry: Carry, at: CarryAt) -> Option<Self> {
        let carried = std::cell::RefCell::new(None);
        self.update(from, |state| {
            *carried.borrow_mut() = from.carry(to, carry, state, at);
            None
        })?;
        Some(Self::with_state(to, carried.into_inner()?))
    }

    /// Replaces the state with `new` if it is `current`, as
    /// [`update`](Cell::update) does: `Some(true)` if it did,
    /// `Some(false)` if the state is another, `None` if the cell is
    /// retired.
    fn compare_exchange(&self, algorithm: &A, current: &A::State, new: &A::State) -> Option<bool>
    where
        A::State: PartialEq + Clone,
    {
        self.update(algorithm, |state| (state == current).then(|| new.clone()))
    }
}

pub(crate) mod private {
    use crate::algorithm::Algorithm;

    /// Seals [`Cell`](super::Cell), and carries what only the crate calls.
    pub trait Sealed<A: Algorithm> {
        /// A retired cell that never held a state: the placeholder a
        /// rebuild writes beside each key it copies, replaced by the key's
        /// moved cell. Creating and dropping it runs no user code.
        fn vacant() -> Self;

        /// Whether the state is idle at `now_ns`, judged without retiring
        /// the cell: the judgement of the loom canary that evicts without a
        /// tombstone (`sync::canary`), and nothing else.
        fn is_idle_unretired(&self, algorithm: &A, now_ns: u64) -> bool;
    }
}

/// Chooses the [`Cell`] an algorithm's per-key state lives in.
///
/// Implemented by [`Preferred`] for the five algorithms, and by
/// [`AlwaysLocked`] for every algorithm. An algorithm defined outside the
/// crate chooses its cell by implementing `CellFor<MyAlgorithm>` for
/// `Preferred` (a [`Locked`] cell, unless its state packs into a word).
pub trait CellFor<A: Algorithm> {
    /// The cell.
    type Cell: Cell<A>;
}

/// The fastest cell for each algorithm, the default: [`Atomic`] for GCRA and
/// the fixed window, whose states pack into one word; [`Adaptive`] for the
/// sliding window counter, whose states pack for most quotas; [`Locked`]
/// for the token bucket and the sliding log.
#[derive(Debug, Clone, Copy, Default)]
pub struct Preferred;

/// A [`Locked`] cell for every algorithm: the mutex discipline, to measure
/// what the atomic cell saves.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysLocked;

impl CellFor<Gcra> for Preferred {
    type Cell = Atomic<Gcra>;
}

impl CellFor<FixedWindow> for Preferred {
    type Cell = Atomic<FixedWindow>;
}

impl CellFor<TokenBucket> for Preferred {
    type Cell = Locked<TokenBucket>;
}

impl CellFor<SlidingWindowLog> for Preferred {
    type Cell = Locked<SlidingWindowLog>;
}

impl CellFor<SlidingWindowCounter> for Preferred {
    type Cell = Adaptive;
}

impl<A: Algorithm> CellFor<A> for AlwaysLocked {
    type Cell = Locked<A>;
}
