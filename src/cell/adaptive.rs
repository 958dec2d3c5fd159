use super::{Atomic, Cell, Locked, private};
use crate::algorithm::{SlidingWindowCounter, SlidingWindowCounterState, sliding_window_counter};
use crate::decision::Decision;
use crate::error::CheckError;

// How the cell works. The form is chosen when the cell is made, from the
// counter it is made for, and never changes: every cell of one limiter
// takes the same form (a counter's `for_quota` keeps its form), so the
// branch on it is the same on every check. A cell must be used with the
// counter it was made for or one of its `for_quota` (as every cell: the
// packed word's layout is that counter's). Each form's protocol is its own
// cell's, unchanged: the atomic form's compare-and-swap and retired word,
// the locked form's critical section. The locked form lives in its own
// allocation, so that the cell is two words (the form's tag and the packed
// word, or the pointer) where the locked cell inline would be four, and the
// enum of both five.

/// The sliding window counter's cell: its state packed in one `AtomicU64`
/// (an [`Atomic`] cell, lock-free, a denial a load and a compare) where the
/// counter's quota lets every state pack
/// ([`SlidingWindowCounter::packs`]), behind a mutex (a [`Locked`] cell)
/// where it does not.
///
/// A quota that packs costs a key less than behind a mutex; one that does
/// not pays one allocation a key, as in the per-key store. The sliding
/// window counter's default cell ([`Preferred`](super::Preferred)).
#[derive(Debug)]
pub struct Adaptive {
    form: Form,
}

#[derive(Debug)]
enum Form {
    Word(Atomic<sliding_window_counter::Packed>),
    Locked(Box<Locked<SlidingWindowCounter>>),
}

/// Runs `$call` on the cell's form, with `$counter` the algorithm that
/// form runs: the packed counter for the word, the counter for the lock.
macro_rules! on_form {
    ($self:ident, $algorithm:ident, |$cell:ident, $counter:ident| $call:expr) => {
        match &$self.form {
            Form::Word($cell) => {
                let $counter = &$algorithm.packed();
                $call
            }
            Form::Locked($cell) => {
                let $counter = $algorithm;
                $call
            }
        }
    };
}

impl Cell<SlidingWindowCounter> for Adaptive {
    fn new(algorithm: &SlidingWindowCounter) -> Self {
        Self::with_state(algorithm, SlidingWindowCounterState::default())
    }

    fn with_state(algorithm: &SlidingWindowCounter, state: SlidingWindowCounterState) -> Self {
        let form = if algorithm.packs() {
            Form::Word(Atomic::with_state(&algorithm.packed(), state))
        } else {
            Form::Locked(Box::new(Locked::with_state(algorithm, state)))
        };
        Self { form }
    }

    #[inline]
    fn check(
        &self,
        algorithm: &SlidingWindowCounter,
        now_ns: u64,
        cost: u32,
    ) -> Result<Option<Decision>, CheckError> {
        on_form!(self, algorithm, |cell, counter| cell
            .check(counter, now_ns, cost))
    }

    #[inline]
    fn peek(
        &self,
        algorithm: &SlidingWindowCounter,
        now_ns: u64,
        cost: u32,
    ) -> Result<Option<Decision>, CheckError> {
        on_form!(self, algorithm, |cell, counter| cell
            .peek(counter, now_ns, cost))
    }

    fn retire_if_idle(&self, algorithm: &SlidingWindowCounter, now_ns: u64) -> bool {
        on_form!(self, algorithm, |cell, counter| cell
            .retire_if_idle(counter, now_ns))
    }

    fn retire_into_new(&self) -> Option<Self> {
        let form = match &self.form {
            Form::Word(cell) => Form::Word(cell.retire_into_new()?),
            Form::Locked(cell) => Form::Locked(Box::new(cell.retire_into_new()?)),
        };
        Some(Self { form })
    }

    fn update(
        &self,
        algorithm: &SlidingWindowCounter,
        change: impl Fn(&SlidingWindowCounterState) -> Option<SlidingWindowCounterState>,
    ) -> Option<bool> {
        on_form!(self, algorithm, |cell, counter| cell
            .update(counter, change))
    }
}

impl private::Sealed<SlidingWindowCounter> for Adaptive {
    /// A retired word: it never held a state, answers every check with
    /// `None` before reading any layout, and is replaced by a moved cell.
    fn vacant() -> Self {
        Self {
            form: Form::Word(<Atomic<_> as private::Sealed<_>>::vacant()),
        }
    }

    fn is_idle_unretired(&self, algorithm: &SlidingWindowCounter, now_ns: u64) -> bool {
        on_form!(self, algorithm, |cell, counter| cell
            .is_idle_unretired(counter, now_ns))
    }
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use super::Adaptive;
    use crate::algorithm::SlidingWindowCounter;
    use crate::cell::Locked;

    /// Two words: a tag and the packed word (or the locked form's
    /// pointer), half the locked cell inline.
    #[test]
    fn the_cell_is_two_words() {
        assert_eq!(size_of::<Adaptive>(), 16);
        assert_eq!(size_of::<Locked<SlidingWindowCounter>>(), 32);
    }
}
