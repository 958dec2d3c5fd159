use std::fmt;
use std::marker::PhantomData;

use super::{Cell, private};
use crate::algorithm::{PackedAlgorithm, Verdict};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::sync::canary::{self, Canary};
use crate::sync::{AtomicU64, Backoff, Ordering};

/// The word no packed state ever takes ([`PackedAlgorithm::pack`]): marks a
/// cell retired (evicted, or moved to a new table). A checker that reads it
/// looks the key up again.
const RETIRED_WORD: u64 = u64::MAX;

// How the cell works. A check loads the word, unpacks it and runs the
// algorithm's pure decision. A denial returns there: one load and a
// compare, no store of any kind, so threads hammering a drained key never
// write the cache line and share it read-only. An admission tries one
// `compare_exchange_weak` from the word it decided on to the packed
// admission. When the word has changed (another thread won, or the weak CAS
// failed spuriously), it re-decides on the word it found, after a `Backoff`
// spin (the spin alone out of line, on a `#[cold]` path). The word `RETIRED_WORD` (`u64::MAX`) marks the
// cell retired: every check answers `None`; any other word is
// `algorithm.unpack(word)`, the key's state.
//
// Orderings: every access is `Relaxed`. The word is the key's whole state
// and carries no other data: nothing is published through it, and no other
// memory is read because of it. What exactness needs is that
// read-decide-write is one atomic step, and the compare-and-swap gives that
// through the single modification order of one location. A CAS succeeds
// only if no other write came between the load it decided on and its own
// write, whatever the ordering argument. Retirement is a CAS or a swap on
// the same word, so it is ordered against every admission the same way.
// The store publishes a cell's memory to other threads (the table's control
// bytes and table pointer use Release/Acquire); the cell itself does not.

/// A packed state in one `AtomicU64`, updated by compare-and-swap: the
/// lock-free cell, for algorithms whose state fits one word
/// ([`PackedAlgorithm`]: GCRA, the fixed window).
///
/// A denial is one load and a compare and writes nothing, so threads
/// checking a drained key share its cache line read-only; an admission is
/// one compare-and-swap from the state it decided on, so no admission is
/// lost or doubled however many threads contend. The default cell of the
/// algorithms that pack ([`Preferred`](super::Preferred)).
pub struct Atomic<A: PackedAlgorithm> {
    word: AtomicU64,
    algorithm: PhantomData<fn() -> A>,
}

/// What one compare-and-swap attempt at a check came to.
enum Cas {
    /// Decided (and installed, if admitted); `None` for a retired cell.
    Done(Option<Decision>),
    /// The word changed under us; this is what it holds now.
    Conflict(u64),
}

impl<A: PackedAlgorithm> Atomic<A> {
    fn holding(word: u64) -> Self {
        Self {
            word: AtomicU64::new(word),
            algorithm: PhantomData,
        }
    }

    /// Decides on `word` and, if admitted, tries to install the admission.
    #[inline]
    fn attempt(&self, algorithm: &A, word: u64, now_ns: u64, cost: u32) -> Result<Cas, CheckError> {
        if word == RETIRED_WORD {
            return Ok(Cas::Done(None));
        }
        match algorithm.decide(&algorithm.unpack(word), now_ns, cost)? {
            // The deny path: nothing is written.
            Verdict::Deny(decision) => Ok(Cas::Done(Some(decision))),
            Verdict::Allow {
                decision,
                admission,
            } if canary::planted(Canary::StoreInsteadOfCas) => {
                self.word
                    .store(algorithm.pack(&admission), Ordering::Relaxed);
                Ok(Cas::Done(Some(decision)))
            }
            Verdict::Allow {
                decision,
                admission,
            } => match self.word.compare_exchange_weak(
                word,
                algorithm.pack(&admission),
                // Relaxed, both: see "Orderings" on the type.
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => Ok(Cas::Done(Some(decision))),
                Err(actual) => Ok(Cas::Conflict(actual)),
            },
        }
    }

    /// One step of the retry loop's backoff, off the fast path.
    #[cold]
    #[inline(never)]
    fn back_off(backoff: &Backoff) {
        backoff.spin();
    }

    /// The raw word, for `Debug` and the tests of the deny path.
    fn load_word(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }
}

impl<A: PackedAlgorithm> Cell<A> for Atomic<A> {
    fn new(algorithm: &A) -> Self {
        Self::with_state(algorithm, A::State::default())
    }

    fn with_state(algorithm: &A, state: A::State) -> Self {
        Self::holding(algorithm.pack(&state))
    }

    // Always: the denial's whole path; out of line, a keyed denial takes a
    // tenth more instructions (`tollgate-lab --deny-loop 0 N` under
    // callgrind; note 14).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn check(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Option<Decision>, CheckError> {
        let mut word = self.word.load(Ordering::Relaxed);
        // The retry loop is in line, its backoff out of it: a decision then
        // reaches the caller from one place, in registers, rather than
        // through a stack slot that an out-of-line retry would share (whose
        // 16-byte reload of two 8-byte stores stalls store forwarding).
        let backoff = Backoff::new();
        loop {
            match self.attempt(algorithm, word, now_ns, cost)? {
                Cas::Done(decision) => return Ok(decision),
                Cas::Conflict(actual) => {
                    word = actual;
                    Self::back_off(&backoff);
                }
            }
        }
    }

    #[inline]
    fn peek(&self, algorithm: &A, now_ns: u64, cost: u32) -> Result<Option<Decision>, CheckError> {
        let word = self.word.load(Ordering::Relaxed);
        if word == RETIRED_WORD {
            return Ok(None);
        }
        Ok(Some(
            algorithm
                .decide(&algorithm.unpack(word), now_ns, cost)?
                .decision(),
        ))
    }

    fn retire_if_idle(&self, algorithm: &A, now_ns: u64) -> bool {
        let mut word = self.word.load(Ordering::Relaxed);
        while word != RETIRED_WORD && algorithm.is_idle(&algorithm.unpack(word), now_ns) {
            // The CAS fails if an admission landed since the load: then the
            // key is judged again on the word that admission wrote.
            match self.word.compare_exchange_weak(
                word,
                RETIRED_WORD,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
        false
    }

    fn update(
        &self,
        algorithm: &A,
        change: impl Fn(&A::State) -> Option<A::State>,
    ) -> Option<bool> {
        // Relaxed, all: see "Orderings" on the type.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            if word == RETIRED_WORD {
                return None;
            }
            let Some(changed) = change(&algorithm.unpack(word)) else {
                return Some(false);
            };
            let new = algorithm.pack(&changed);
            if new == RETIRED_WORD {
                // No state a check produces packs to the retired word, but
                // one made by hand can: installed, it would retire the cell
                // behind the store's back.
                return Some(false);
            }
            if canary::planted(Canary::UpdateWithoutCas) {
                self.word.store(new, Ordering::Relaxed);
                return Some(true);
            }
            match self
                .word
                .compare_exchange_weak(word, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(true),
                Err(actual) => word = actual,
            }
        }
    }

    fn retire_into_new(&self) -> Option<Self> {
        // A swap reads the last word in the modification order: every
        // admission before it is in the copy, every check after it sees
        // RETIRED_WORD and looks the key up again.
        let word = self.word.swap(RETIRED_WORD, Ordering::Relaxed);
        (word != RETIRED_WORD).then(|| Self::holding(word))
    }
}

impl<A: PackedAlgorithm> private::Sealed<A> for Atomic<A> {
    fn vacant() -> Self {
        Self::holding(RETIRED_WORD)
    }

    fn is_idle_unretired(&self, algorithm: &A, now_ns: u64) -> bool {
        let word = self.load_word();
        word != RETIRED_WORD && algorithm.is_idle(&algorithm.unpack(word), now_ns)
    }
}

impl<A: PackedAlgorithm> fmt::Debug for Atomic<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Atomic")
            .field("word", &format_args!("{:#018x}", self.load_word()))
            .finish()
    }
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use super::{Atomic, Cell, RETIRED_WORD};
    use crate::Quota;
    use crate::algorithm::{Algorithm, FixedWindow, Gcra, PackedAlgorithm};

    #[test]
    fn a_late_reading_never_resets_a_newer_window() {
        let window = FixedWindow::from_quota(&Quota::per_second(10).unwrap());
        let cell = Atomic::new(&window);
        // Window 10 fills.
        for _ in 0..10 {
            let decision = cell.check(&window, 10_000_000_000, 1).unwrap().unwrap();
            assert!(decision.is_allowed());
        }
        let full = cell.load_word();
        // A thread whose clock read window 9 arrives late: denied, word
        // unchanged.
        let late = cell.check(&window, 9_500_000_000, 1).unwrap().unwrap();
        assert!(!late.is_allowed());
        assert_eq!(late.remaining(), 0);
        assert_eq!(cell.load_word(), full);
    }

    /// The deny path writes nothing: the word is bit-for-bit the same across
    /// 100 denials, at moving times.
    #[test]
    fn denials_leave_the_word_unchanged() {
        fn deny_writes_nothing<A: PackedAlgorithm>() {
            let algorithm = A::from_quota(&Quota::per_minute(5).unwrap());
            let cell = Atomic::new(&algorithm);
            for _ in 0..5 {
                assert!(cell.check(&algorithm, 0, 1).unwrap().unwrap().is_allowed());
            }
            let drained = cell.load_word();
            for step in 0..100 {
                let decision = cell
                    .check(&algorithm, step * 1_000_000, 1)
                    .unwrap()
                    .unwrap();
                assert!(!decision.is_allowed());
                assert_eq!(cell.load_word(), drained, "denial {step} wrote");
            }
        }
        deny_writes_nothing::<Gcra>();
        deny_writes_nothing::<FixedWindow>();
    }

    #[test]
    fn retirement_is_the_reserved_word() {
        let gcra = Gcra::from_quota(&Quota::per_second(2).unwrap());
        let cell = Atomic::new(&gcra);
        assert!(cell.retire_if_idle(&gcra, 0));
        assert_eq!(cell.load_word(), RETIRED_WORD);
    }
}
