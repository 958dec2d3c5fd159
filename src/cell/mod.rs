//! One key's state under one synchronisation discipline.
//!
//! A cell applies an [`Algorithm`]'s pure decision to one state that many
//! threads share. [`Locked`] puts any algorithm's state behind a mutex: read,
//! decide and write happen inside one critical section, which is what makes
//! it correct (a lock held only across the write would decide on stale data).

use std::fmt;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Mutex, lock};

/// Any algorithm's state behind one mutex.
pub struct Locked<A: Algorithm> {
    state: Mutex<A::State>,
}

impl<A: Algorithm> Locked<A> {
    /// A cell holding a fresh key's state.
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: Mutex::new(A::State::default()),
        }
    }

    /// Decides and applies `cost` units at `now_ns`, all under the lock.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`]; nothing is consumed on error.
    #[inline]
    pub fn check(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Decision, CheckError> {
        algorithm.check(&mut lock(&self.state), now_ns, cost)
    }

    /// The decision `check` would return, consuming nothing.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::decide`].
    #[inline]
    pub fn peek(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Decision, CheckError> {
        Ok(algorithm
            .decide(&lock(&self.state), now_ns, cost)?
            .decision())
    }
}

impl<A: Algorithm> Default for Locked<A> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A: Algorithm> fmt::Debug for Locked<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locked")
            .field("state", &*lock(&self.state))
            .finish()
    }
}
