use std::fmt;

use super::{Cell, private};
use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::{Mutex, lock};

/// Any algorithm's state behind one mutex.
///
/// Retiring the cell never drops a state: an evicted key's state stays in
/// its cell (`Evicted`) until the cell itself is dropped, which a store does
/// outside its locks, and a moved key's state leaves with the move. So a
/// state's `Drop` (user code, for an algorithm defined outside the crate)
/// never runs in the middle of a sweep or a rebuild, and retirement cannot
/// be left half-done by a panic in it.
pub struct Locked<A: Algorithm> {
    state: Mutex<Slot<A::State>>,
}

/// What a [`Locked`] cell holds.
#[derive(Debug)]
enum Slot<S> {
    /// The key's state: the cell is in service.
    Live(S),
    /// Retired by eviction: the state, idle, kept until the cell is dropped.
    Evicted(S),
    /// Retired by a move, or a placeholder that never held a state.
    Moved,
}

impl<A: Algorithm> Cell<A> for Locked<A> {
    fn new(algorithm: &A) -> Self {
        Self::with_state(algorithm, A::State::default())
    }

    fn with_state(_algorithm: &A, state: A::State) -> Self {
        Self::holding(Slot::Live(state))
    }

    #[inline]
    fn check(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Option<Decision>, CheckError> {
        match &mut *lock(&self.state) {
            Slot::Live(state) => algorithm.check(state, now_ns, cost).map(Some),
            Slot::Evicted(_) | Slot::Moved => Ok(None),
        }
    }

    #[inline]
    fn peek(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Option<Decision>, CheckError> {
        match &*lock(&self.state) {
            Slot::Live(state) => Ok(Some(algorithm.decide(state, now_ns, cost)?.decision())),
            Slot::Evicted(_) | Slot::Moved => Ok(None),
        }
    }

    fn retire_if_idle(&self, algorithm: &A, now_ns: u64) -> bool {
        let mut slot = lock(&self.state);
        if !matches!(&*slot, Slot::Live(state) if algorithm.is_idle(state, now_ns)) {
            return false;
        }
        if let Some(state) = slot.take_live() {
            *slot = Slot::Evicted(state);
        }
        true
    }

    fn retire_into_new(&self) -> Option<Self> {
        let state = lock(&self.state).take_live()?;
        Some(Self::holding(Slot::Live(state)))
    }

    fn update(
        &self,
        _algorithm: &A,
        change: impl Fn(&A::State) -> Option<A::State>,
    ) -> Option<bool> {
        // The replaced state is dropped after the lock (its `Drop` is user
        // code for an algorithm from outside the crate); `change` runs
        // before anything changes.
        let replaced = match &mut *lock(&self.state) {
            Slot::Live(state) => match change(state) {
                Some(changed) => std::mem::replace(state, changed),
                None => return Some(false),
            },
            Slot::Evicted(_) | Slot::Moved => return None,
        };
        drop(replaced);
        Some(true)
    }
}

impl<A: Algorithm> Locked<A> {
    fn holding(slot: Slot<A::State>) -> Self {
        Self {
            state: Mutex::new(slot),
        }
    }
}

impl<S> Slot<S> {
    /// Takes the live state out, leaving `Moved`; leaves a retired slot as
    /// it is. Drops nothing but the `Moved` placeholder, which holds nothing.
    fn take_live(&mut self) -> Option<S> {
        match std::mem::replace(self, Slot::Moved) {
            Slot::Live(state) => Some(state),
            retired => {
                *self = retired;
                None
            }
        }
    }
}

impl<A: Algorithm> private::Sealed<A> for Locked<A> {
    fn vacant() -> Self {
        Self::holding(Slot::Moved)
    }

    fn is_idle_unretired(&self, algorithm: &A, now_ns: u64) -> bool {
        matches!(&*lock(&self.state), Slot::Live(state) if algorithm.is_idle(state, now_ns))
    }
}

impl<A: Algorithm> fmt::Debug for Locked<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locked")
            .field("state", &*lock(&self.state))
            .finish()
    }
}
