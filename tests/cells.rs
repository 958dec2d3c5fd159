//! The cells through their public API: the packed fixed-window layout, which
//! cell each algorithm gets, and retirement. The atomic cell's write-free
//! deny path is tested inside `src/cell/atomic.rs`, where its word is
//! visible.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::time::Duration;

use tollgate::Quota;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, PackedAlgorithm, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};
use tollgate::cell::{Adaptive, AlwaysLocked, Atomic, Cell, CellFor, Locked, Preferred};

/// The atomic cells reserve this word to mark a cell retired.
const RETIRED_WORD: u64 = u64::MAX;

#[test]
fn the_packed_layout_is_as_documented() {
    // A window of a minute (6 × 10^10 ns, 36 bits) gives the count its
    // widest, 32 bits; a window of 100 ns 7 bits.
    let window = FixedWindow::from_quota(&Quota::per_minute(100).unwrap());
    let mut state = Default::default();
    assert!(window.check(&mut state, 0, 5).unwrap().is_allowed());
    assert_eq!(window.pack(&state), 5);
    let mut later = state;
    assert!(
        window
            .check(&mut later, 3 * 60_000_000_000 + 1, 2)
            .unwrap()
            .is_allowed()
    );
    assert_eq!(window.pack(&later), (3 << 32) | 2);
    assert_eq!(window.unpack(window.pack(&later)), later);
    let short = FixedWindow::from_quota(&Quota::new(100, Duration::from_nanos(100)).unwrap());
    let mut state = Default::default();
    assert!(short.check(&mut state, 301, 2).unwrap().is_allowed());
    assert_eq!(short.pack(&state), (3 << 7) | 2);
    assert_eq!(
        window.pack(&Default::default()),
        0,
        "a fresh key packs to 0"
    );
}

#[test]
fn the_window_index_never_reaches_the_retired_word() {
    // The smallest windows for their burst: one request per nanosecond.
    for burst in [1_u32, 2, 127, 128, 65_535, u32::MAX] {
        let quota = Quota::per_second(1_000_000_000)
            .unwrap()
            .with_burst(burst)
            .unwrap();
        let window = FixedWindow::from_quota(&quota);
        let mut state = Default::default();
        for _ in 0..2 {
            let decision = window.check(&mut state, u64::MAX, burst).unwrap();
            let word = window.pack(&state);
            assert_ne!(word, RETIRED_WORD, "burst {burst}: {decision:?}");
            assert_eq!(window.unpack(word), state);
        }
    }
}

#[test]
fn retiring_an_idle_cell_and_what_a_retired_cell_answers() {
    fn retirement<A: Algorithm>()
    where
        Preferred: CellFor<A>,
    {
        let algorithm = A::from_quota(&Quota::per_second(2).unwrap());
        let cell = <Preferred as CellFor<A>>::Cell::new(&algorithm);
        assert!(cell.retire_if_idle(&algorithm, 0), "a fresh cell is idle");
        assert_eq!(cell.check(&algorithm, 0, 1), Ok(None));
        assert_eq!(cell.peek(&algorithm, 0, 1), Ok(None));
        assert!(!cell.retire_if_idle(&algorithm, 0), "already retired");
        assert!(cell.retire_into_new().is_none());

        let busy = <Preferred as CellFor<A>>::Cell::new(&algorithm);
        assert!(busy.check(&algorithm, 0, 2).unwrap().unwrap().is_allowed());
        assert!(
            !busy.retire_if_idle(&algorithm, 0),
            "a drained key is not idle"
        );
        assert!(!busy.retire_if_idle(&algorithm, 999_999_999));
        assert!(busy.retire_if_idle(&algorithm, Duration::from_secs(60).as_nanos() as u64));
    }
    retirement::<Gcra>();
    retirement::<FixedWindow>();
    retirement::<TokenBucket>();
    retirement::<SlidingWindowLog>();
    retirement::<SlidingWindowCounter>();
}

#[test]
fn retire_into_new_carries_the_state() {
    fn carries<A: Algorithm>()
    where
        Preferred: CellFor<A>,
    {
        let algorithm = A::from_quota(&Quota::per_hour(3).unwrap());
        let old = <Preferred as CellFor<A>>::Cell::new(&algorithm);
        assert!(old.check(&algorithm, 0, 2).unwrap().unwrap().is_allowed());
        let moved = old.retire_into_new().unwrap();
        assert_eq!(old.check(&algorithm, 0, 1), Ok(None));
        let last = moved.check(&algorithm, 0, 1).unwrap().unwrap();
        assert!(last.is_allowed());
        assert_eq!(last.remaining(), 0);
    }
    carries::<Gcra>();
    carries::<FixedWindow>();
    carries::<TokenBucket>();
    carries::<SlidingWindowLog>();
    carries::<SlidingWindowCounter>();
}

#[test]
fn each_algorithm_gets_its_cell() {
    fn is<A: Algorithm, C: Cell<A>, P: CellFor<A, Cell = C>>() {}
    is::<Gcra, Atomic<Gcra>, Preferred>();
    is::<FixedWindow, Atomic<FixedWindow>, Preferred>();
    is::<TokenBucket, Locked<TokenBucket>, Preferred>();
    is::<SlidingWindowLog, Locked<SlidingWindowLog>, Preferred>();
    is::<SlidingWindowCounter, Adaptive, Preferred>();
    is::<Gcra, Locked<Gcra>, AlwaysLocked>();
}

/// A locked GCRA cell decides exactly as the atomic one: the cell is a
/// discipline, not a different arithmetic.
#[test]
fn locked_and_atomic_gcra_decide_alike() {
    let gcra = Gcra::from_quota(&Quota::per_second(3).unwrap().with_burst(2).unwrap());
    let atomic = Atomic::new(&gcra);
    let locked = Locked::new(&gcra);
    for step in 0..200_u64 {
        let now_ns = step * 97_000_000;
        let cost = 1 + u32::try_from(step % 2).unwrap();
        assert_eq!(
            atomic.check(&gcra, now_ns, cost),
            locked.check(&gcra, now_ns, cost),
            "step {step}"
        );
    }
}

/// A million a second in bursts of a million: two 20-bit counts leave 24
/// index bits, fewer than the 2^33 one-second windows to the time horizon.
fn unpacking_counter_quota() -> Quota {
    Quota::per_second(1_000_000).unwrap()
}

/// The adaptive cell takes its packed form where the counter packs and
/// its locked form where it does not (its `Debug` names the form), and
/// both decide exactly as a locked cell on a trace that crosses windows,
/// with costs of 1 to 3 and readings that go back.
#[test]
fn the_counter_s_adaptive_cell_decides_as_a_locked_one_in_both_forms() {
    for (quota, form) in [
        (Quota::per_second(10).unwrap(), "Word"),
        (
            Quota::per_second(10).unwrap().with_burst(7).unwrap(),
            "Word",
        ),
        (unpacking_counter_quota(), "Locked"),
    ] {
        let counter = SlidingWindowCounter::from_quota(&quota);
        assert_eq!(counter.packs(), form == "Word", "{quota:?}");
        let adaptive = Adaptive::new(&counter);
        assert!(format!("{adaptive:?}").contains(form), "{adaptive:?}");
        let locked = Locked::new(&counter);
        let window_ns = u64::try_from(quota.burst_window().as_nanos()).unwrap();
        for step in 0..600_u64 {
            // Steps of about a sixth of a window, one in seven a step back.
            let now_ns =
                (step * window_ns / 6).saturating_sub((step % 7 == 0) as u64 * window_ns / 2);
            let cost = 1 + u32::try_from(step % 3).unwrap();
            assert_eq!(
                adaptive.check(&counter, now_ns, cost),
                locked.check(&counter, now_ns, cost),
                "{form}, step {step}"
            );
            assert_eq!(
                adaptive.peek(&counter, now_ns, 1),
                locked.peek(&counter, now_ns, 1),
                "{form}, step {step}"
            );
        }
    }
}

/// The packed counter's denial writes nothing: the cell's word, as its
/// `Debug` shows it, is the same across 100 denials at moving times.
#[test]
fn the_packed_counter_s_denials_leave_its_word_unchanged() {
    let counter = SlidingWindowCounter::from_quota(&Quota::per_minute(5).unwrap());
    let cell = Adaptive::new(&counter);
    for _ in 0..5 {
        assert!(cell.check(&counter, 0, 1).unwrap().unwrap().is_allowed());
    }
    let drained = format!("{cell:?}");
    assert!(drained.contains("word: 0x0000000000000005"), "{drained}");
    for step in 0..100 {
        let decision = cell
            .check(&counter, step * 100_000_000, 1)
            .unwrap()
            .unwrap();
        assert!(!decision.is_allowed());
        assert_eq!(format!("{cell:?}"), drained, "denial {step} wrote");
    }
}

/// A state made by hand that packs to the retired word (here from another
/// quota's checks at the end of time: window 2^62 − 1, one unit in each
/// count, which a burst of 1 packs to all ones) is never installed by a
/// compare-and-exchange (a refund with a hand-made receipt), which would
/// retire the cell behind its store's back, and never brings a retired
/// cell back as the state it expects.
#[test]
fn a_hand_made_state_that_packs_to_the_retired_word_is_refused() {
    use tollgate::algorithm::SlidingWindowCounterState;
    use tollgate::clock::END_OF_TIME_NS;
    let other = SlidingWindowCounter::from_quota(&Quota::new(2, Duration::from_nanos(2)).unwrap());
    let mut forged = SlidingWindowCounterState::default();
    assert!(
        other
            .check(&mut forged, END_OF_TIME_NS - 4, 1)
            .unwrap()
            .is_allowed()
    );
    assert!(
        other
            .check(&mut forged, END_OF_TIME_NS - 2, 1)
            .unwrap()
            .is_allowed()
    );
    // A burst of 1 in windows of 3 ns: k = 1, 62 index bits, and it packs.
    let counter =
        SlidingWindowCounter::from_quota(&Quota::new(1, Duration::from_nanos(3)).unwrap());
    assert!(counter.packs());
    let fresh = SlidingWindowCounterState::default();
    let cell = Adaptive::new(&counter);
    assert_eq!(
        cell.compare_exchange(&counter, &fresh, &forged),
        Some(false)
    );
    assert!(
        cell.check(&counter, 0, 1).unwrap().unwrap().is_allowed(),
        "still in service"
    );
    let retired = Adaptive::new(&counter);
    assert!(retired.retire_if_idle(&counter, 0));
    assert_eq!(retired.compare_exchange(&counter, &forged, &fresh), None);
    assert_eq!(retired.check(&counter, 0, 1), Ok(None), "still retired");
}
