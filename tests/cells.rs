//! The cells: the packed fixed-window layout at its edges, the atomic cell's
//! write-free deny path, and retirement.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

use std::time::Duration;

use tollgate::Quota;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, PackedAlgorithm, RETIRED_WORD, SlidingWindowLog, TokenBucket,
    pack_window, unpack_window,
};
use tollgate::cell::{Atomic, Cell, Locked};

#[test]
fn pack_and_unpack_round_trip_at_the_edges() {
    for count_bits in [1_u32, 7, 16, 31, 32] {
        let max_count = u32::try_from((1_u64 << count_bits) - 1).unwrap();
        let max_index = (1_u64 << (64 - count_bits)) - 1;
        for (index, count) in [
            (0, 0),
            (0, max_count),
            (max_index, 0),
            (max_index - 1, max_count),
            (12_345, max_count / 2),
        ] {
            let word = pack_window(index, count, count_bits);
            assert_eq!(
                unpack_window(word, count_bits),
                (index, count),
                "k = {count_bits}"
            );
        }
        // A full count never spills into the index.
        assert_eq!(pack_window(0, max_count, count_bits) >> count_bits, 0);
        // Only the all-ones index with a full count is the retired word, and
        // the algorithm never produces that index (see below).
        assert_eq!(pack_window(max_index, max_count, count_bits), RETIRED_WORD);
    }
}

#[test]
fn the_packed_layout_is_as_documented() {
    // A burst of 100 needs 7 count bits.
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
    assert_eq!(window.pack(&later), (3 << 7) | 2);
    assert_eq!(window.unpack(window.pack(&later)), later);
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
fn a_late_reading_never_resets_a_newer_window() {
    let quota = Quota::per_second(10).unwrap();
    let window = FixedWindow::from_quota(&quota);
    let cell = Atomic::new(&window);
    // Window 10 fills.
    for _ in 0..10 {
        assert!(
            cell.check(&window, 10_000_000_000, 1)
                .unwrap()
                .unwrap()
                .is_allowed()
        );
    }
    let full = cell.load_word();
    // A thread whose clock read window 9 arrives late: denied, word unchanged.
    let late = cell.check(&window, 9_500_000_000, 1).unwrap().unwrap();
    assert!(!late.is_allowed());
    assert_eq!(late.remaining(), 0);
    assert_eq!(cell.load_word(), full);
}

/// The deny path writes nothing: the word is bit-for-bit the same across 100
/// denials, at moving times.
#[test]
fn atomic_denials_leave_the_word_unchanged() {
    fn deny_writes_nothing<A: PackedAlgorithm<Cell = Atomic<A>>>() {
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
fn retiring_an_idle_cell_and_what_a_retired_cell_answers() {
    fn retirement<A: Algorithm>() {
        let algorithm = A::from_quota(&Quota::per_second(2).unwrap());
        let cell = A::Cell::new(&algorithm);
        assert!(cell.retire_if_idle(&algorithm, 0), "a fresh cell is idle");
        assert_eq!(cell.check(&algorithm, 0, 1), Ok(None));
        assert_eq!(cell.peek(&algorithm, 0, 1), Ok(None));
        assert!(!cell.retire_if_idle(&algorithm, 0), "already retired");
        assert!(cell.retire_into_new().is_none());

        let busy = A::Cell::new(&algorithm);
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
}

#[test]
fn retire_into_new_carries_the_state() {
    fn carries<A: Algorithm>() {
        let algorithm = A::from_quota(&Quota::per_hour(3).unwrap());
        let old = A::Cell::new(&algorithm);
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
}

#[test]
fn locked_cells_are_the_cell_of_the_unpacked_algorithms() {
    fn is_locked<A: Algorithm<Cell = Locked<A>>>() {}
    is_locked::<TokenBucket>();
    is_locked::<SlidingWindowLog>();
}
