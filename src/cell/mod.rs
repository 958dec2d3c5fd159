//! One key's state under one synchronisation discipline.
//!
//! A cell applies an [`Algorithm`]'s pure decision to one state that many
//! threads share:
//!
//! * [`Atomic`]: the state packed in one `AtomicU64`, updated by
//!   compare-and-swap. A denial is a load and a compare, and writes nothing.
//!   Used by every [`PackedAlgorithm`](crate::algorithm::PackedAlgorithm)
//!   (GCRA, fixed window).
//! * [`Locked`]: any state behind a mutex. Read, decide and write happen
//!   inside one critical section, which is what makes it correct: a lock held
//!   only across the write would decide on stale data.
//!
//! A cell can be **retired**: taken out of service by idle eviction or by a
//! table migration. A retired cell answers every check with `None`, and the
//! store then looks the key up again. Retirement is terminal, and it is
//! decided on the same word (or under the same lock) as admissions, so an
//! admission cannot slip into a cell after its state has been judged idle or
//! copied away.

mod atomic;
mod locked;

use std::fmt::Debug;

pub use atomic::Atomic;
pub use locked::Locked;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;

/// One key's state, shared between threads, with retirement.
pub trait Cell<A: Algorithm>: Debug + Send + Sync + Sized {
    /// A fresh key's cell.
    fn new(algorithm: &A) -> Self;

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
}
