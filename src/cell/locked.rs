use std::fmt;

use super::{Cell, private};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Mutex, lock};

/// Any algorithm's state behind one mutex. `None` inside the mutex is the
/// retired marker.
pub struct Locked<A: Algorithm> {
    state: Mutex<Option<A::State>>,
}

impl<A: Algorithm> Cell<A> for Locked<A> {
    fn new(_algorithm: &A) -> Self {
        Self {
            state: Mutex::new(Some(A::State::default())),
        }
    }

    #[inline]
    fn check(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Option<Decision>, CheckError> {
        lock(&self.state)
            .as_mut()
            .map(|state| algorithm.check(state, now_ns, cost))
            .transpose()
    }

    #[inline]
    fn peek(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Option<Decision>, CheckError> {
        lock(&self.state)
            .as_ref()
            .map(|state| Ok(algorithm.decide(state, now_ns, cost)?.decision()))
            .transpose()
    }

    fn retire_if_idle(&self, algorithm: &A, now_ns: u64) -> bool {
        let mut state = lock(&self.state);
        let idle = state
            .as_ref()
            .is_some_and(|state| algorithm.is_idle(state, now_ns));
        if idle {
            *state = None;
        }
        idle
    }

    fn retire_into_new(&self) -> Option<Self> {
        lock(&self.state).take().map(|state| Self {
            state: Mutex::new(Some(state)),
        })
    }
}

impl<A: Algorithm> private::Sealed<A> for Locked<A> {
    fn is_idle_unretired(&self, algorithm: &A, now_ns: u64) -> bool {
        lock(&self.state)
            .as_ref()
            .is_some_and(|state| algorithm.is_idle(state, now_ns))
    }
}

impl<A: Algorithm> fmt::Debug for Locked<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locked")
            .field("state", &*lock(&self.state))
            .finish()
    }
}
