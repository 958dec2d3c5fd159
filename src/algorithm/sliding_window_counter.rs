//! The sliding window counter: two fixed windows, the older one weighted.

use std::cmp::Ordering;

use super::{
    Algorithm, Carry, CarryAt, PackedAlgorithm, Receipt, Refund, Verdict, carry_count, same_window,
    to_u32, validate_cost,
};
use crate::clock::{END_OF_TIME_NS, clamp_time};
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;

/// A sliding window counter: counts per aligned window like
/// [`FixedWindow`](super::FixedWindow), but estimates the trailing window as
/// the current count plus the previous window's count weighted by how much of
/// the previous window the trailing one still overlaps:
///
/// ```text
/// estimate = previous × (window − elapsed) / window + current
/// ```
///
/// A request of `cost` fits while `estimate + cost <= burst`. The comparison is
/// made exactly, in integers scaled by the window
/// (`previous × (window − elapsed) + (current + cost) × window <= burst ×
/// window`, in `u128`), so no float rounds a decision either way.
///
/// Its honest `retry_after` can exceed one window: exhaust the burst at the
/// start of a window and the estimate stays at the burst for that whole
/// window, then carries into the next with weight 1. It never exceeds
/// `reset_after`.
///
/// A clock reading from before the stored window is treated as the stored
/// window's first instant (where the previous window weighs most).
///
/// # Packed state
///
/// Where the quota lets every state fit, the state packs into one `u64`,
/// and the default cell
/// ([`Adaptive`](crate::cell::Adaptive)) updates it with one
/// compare-and-swap: a denial is a load and a compare, and writes nothing.
/// Both counts take `k` bits, the most the window leaves room for (1 to
/// 31), and the window index the other `64 − 2k`, in that order from the
/// top; the index must reach the time horizon ([`END_OF_TIME_NS`] /
/// window) without the all-ones word, the atomic cell's retired marker.
/// `k` depends on the window alone, so every quota of one window packs
/// alike ([`for_quota`](Algorithm::for_quota)), and a quota packs when its
/// burst fits in `k` bits. That holds when the window is at least about
/// `burst²` nanoseconds (an emission interval of at least about `burst`
/// ns): a window of 1 s leaves two 15-bit counts and 34 index bits (for
/// 2^33 windows), so 1 000 a second in bursts of 1 000 packs, and a
/// million a second in bursts of a million does not (it would need two
/// 20-bit counts, leaving 24 index bits for 2^33 windows). A mixed-radix word (the index times
/// `(burst + 1)²` plus the counts) would pack windows down to about
/// `(burst + 1)² / 2` ns, up to 4× shorter at power-of-two bursts, at the
/// price of a division on every check; below that, no encoding can: the
/// states of one key outnumber the values of a word. A quota that does
/// not pack keeps its state behind a mutex, as every quota did before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowCounter {
    capacity: u32,
    window_ns: u64,
    /// `k`, the bits of each count in the packed word.
    count_bits: u32,
    /// Whether every state of this quota packs.
    packs: bool,
}

/// Packs a sliding-window-counter state into a word.
///
/// ```text
///  63                  2k  2k−1          k  k−1           0
/// +----------------------+---------------+---------------+
/// |  window index        |  previous (k) |  current (k)  |
/// |  (64 − 2k)           |               |               |
/// +----------------------+---------------+---------------+
/// ```
///
/// | word | meaning |
/// |---|---|
/// | `0` | a fresh key: window 0, nothing counted |
/// | `index << 2k \| previous << k \| current` | `current` units in window `index`, `previous` in the one before |
/// | `u64::MAX` | never a state: the retired marker (a packing quota's index stays below `2^(64−2k) − 1`) |
///
/// `count_bits` is `k`, from 1 to 31; both counts must fit in it and
/// `window_index` in the remaining bits.
#[must_use]
const fn pack_counts(window_index: u64, previous: u32, current: u32, count_bits: u32) -> u64 {
    (window_index << (2 * count_bits)) | ((previous as u64) << count_bits) | current as u64
}

/// Unpacks a word built by [`pack_counts`] into (window index, previous,
/// current).
#[must_use]
const fn unpack_counts(word: u64, count_bits: u32) -> (u64, u32, u32) {
    let count_mask = (1_u64 << count_bits) - 1;
    // The masks keep k <= 31 bits: the casts are lossless.
    #[allow(clippy::cast_possible_truncation)]
    let (previous, current) = (
        ((word >> count_bits) & count_mask) as u32,
        (word & count_mask) as u32,
    );
    (word >> (2 * count_bits), previous, current)
}

/// Whether every state of a quota of `count_bits` and this window packs.
fn every_state_packs(count_bits: u32, window_ns: u64) -> bool {
    let Some(index_bits) = u64::BITS
        .checked_sub(2 * count_bits)
        .filter(|&bits| bits > 0)
    else {
        return false;
    };
    // The index of the last instant, END_OF_TIME_NS (readings are clamped
    // to it), must stay below the all-ones index: then no state is the
    // retired word.
    END_OF_TIME_NS / window_ns < (1_u64 << index_bits) - 1
}

/// A sliding-window-counter key: its current window and the counts of that
/// window and the one before. The default is a fresh key.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindowCounterState {
    window_index: u64,
    previous: u32,
    current: u32,
}

/// The state as seen from one instant: the windows rolled forward to it.
#[derive(Debug, Clone, Copy)]
struct View {
    window_index: u64,
    previous: u32,
    current: u32,
    elapsed_ns: u64,
}

impl SlidingWindowCounter {
    fn view(&self, state: &SlidingWindowCounterState, now_ns: u64) -> View {
        let now_index = now_ns / self.window_ns;
        let elapsed_ns = now_ns % self.window_ns;
        match now_index.cmp(&state.window_index) {
            Ordering::Equal => View {
                window_index: now_index,
                previous: state.previous,
                current: state.current,
                elapsed_ns,
            },
            Ordering::Greater if now_index - state.window_index == 1 => View {
                window_index: now_index,
                previous: state.current,
                current: 0,
                elapsed_ns,
            },
            Ordering::Greater => View {
                window_index: now_index,
                previous: 0,
                current: 0,
                elapsed_ns,
            },
            Ordering::Less => View {
                window_index: state.window_index,
                previous: state.previous,
                current: state.current,
                elapsed_ns: 0,
            },
        }
    }

    /// `previous × (window − elapsed)`: the previous window's weighted count,
    /// scaled by the window.
    fn carried(&self, view: &View) -> u128 {
        u128::from(view.previous) * u128::from(self.window_ns - view.elapsed_ns)
    }

    /// Unit requests that fit beside `current` and the carried count.
    fn units_free(&self, carried: u128, current: u32) -> u32 {
        let scaled_capacity = u128::from(self.capacity) * u128::from(self.window_ns);
        let whole = scaled_capacity.saturating_sub(carried) / u128::from(self.window_ns);
        // whole <= capacity, a u32.
        to_u32(u64::try_from(whole).unwrap_or(u64::MAX)).saturating_sub(current)
    }

    /// The earliest offset into a window at which `previous` carried from the
    /// window before leaves room for `room` units beside it:
    /// the least `e` with `previous × (window − e) <= room × window`.
    fn earliest_offset_ns(&self, previous: u32, room: u32) -> u64 {
        if previous == 0 {
            return 0;
        }
        let allowed_weight = u128::from(room) * u128::from(self.window_ns) / u128::from(previous);
        let allowed_weight = u64::try_from(allowed_weight).unwrap_or(u64::MAX);
        self.window_ns - allowed_weight.min(self.window_ns)
    }

    /// Time until both windows weigh nothing.
    fn reset_after_ns(&self, previous: u32, current: u32, elapsed_ns: u64) -> u64 {
        if current > 0 {
            2 * self.window_ns - elapsed_ns
        } else if previous > 0 {
            self.window_ns - elapsed_ns
        } else {
            0
        }
    }
}

impl Algorithm for SlidingWindowCounter {
    type State = SlidingWindowCounterState;
    type Admission = SlidingWindowCounterState;

    fn from_quota(quota: &Quota) -> Self {
        let window_ns = quota.burst_window_ns();
        // The widest counts the window leaves room for (0 if none).
        let count_bits = (1..=31)
            .rev()
            .find(|&bits| every_state_packs(bits, window_ns))
            .unwrap_or(0);
        Self {
            capacity: quota.burst(),
            window_ns,
            count_bits,
            packs: u32::BITS - quota.burst().leading_zeros() <= count_bits,
        }
    }

    /// Every quota of the same burst window, in this counter's form: a
    /// counter that packs takes quotas whose burst fits its word; one that
    /// does not keeps every quota's states behind its mutex. A key read
    /// under a quota of another burst keeps its counts: the units counted
    /// in each window weigh against that quota's burst.
    fn for_quota(&self, quota: &Quota) -> Result<Self, LayoutError> {
        same_window(self.window_ns, quota)?;
        let burst = quota.burst();
        if self.packs && u32::BITS - burst.leading_zeros() > self.count_bits {
            return Err(LayoutError::BurstDoesNotPack {
                burst,
                max: to_u32((1_u64 << self.count_bits) - 1),
            });
        }
        Ok(Self {
            capacity: burst,
            ..*self
        })
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Both counts, rolled forward to `now`, are carried (see [`Carry`]):
    /// in proportion, each rounded up; as is, a raise adds `b' − b` to the
    /// current window's count, and a cut takes it from the current count
    /// and then from the previous one (whose weight is below one, so the
    /// estimate falls by at most the cut: conservative); unchanged, both
    /// stay as they are. `to` counts in the same windows.
    fn carry(
        &self,
        to: &Self,
        carry: Carry,
        state: &SlidingWindowCounterState,
        at: CarryAt,
    ) -> Option<SlidingWindowCounterState> {
        if to == self {
            return Some(*state);
        }
        let view = self.view(state, clamp_time(at.now_ns));
        let (from_burst, to_burst) = (self.capacity, to.capacity);
        let (previous, current) = match carry {
            _ if view.previous == 0 && view.current == 0 => return Some(*state),
            Carry::Unchanged => (view.previous, view.current),
            Carry::Proportional => (
                carry_count(from_burst, to_burst, carry, view.previous),
                carry_count(from_burst, to_burst, carry, view.current),
            ),
            Carry::AsIs if to_burst >= from_burst => {
                let raised = view.current.saturating_add(to_burst - from_burst);
                (view.previous, raised.min(view.current.max(to_burst)))
            }
            Carry::AsIs => {
                let cut = from_burst - to_burst;
                let from_current = cut.min(view.current);
                let from_previous = (cut - from_current).min(view.previous);
                (view.previous - from_previous, view.current - from_current)
            }
        };
        Some(SlidingWindowCounterState {
            window_index: view.window_index,
            previous,
            current,
        })
    }

    #[inline]
    fn decide(
        &self,
        state: &SlidingWindowCounterState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<SlidingWindowCounterState>, CheckError> {
        let cost = validate_cost(cost, self.capacity)?;
        let view = self.view(state, clamp_time(now_ns));
        let carried = self.carried(&view);
        let free = self.units_free(carried, view.current);
        if cost <= free {
            let current = view.current + cost;
            return Ok(Verdict::Allow {
                decision: Decision::allow(
                    self.capacity,
                    free - cost,
                    self.reset_after_ns(view.previous, current, view.elapsed_ns),
                ),
                admission: SlidingWindowCounterState {
                    window_index: view.window_index,
                    previous: view.previous,
                    current,
                },
            });
        }
        let room_now = self.capacity.saturating_sub(view.current);
        let retry_after_ns = if cost <= room_now {
            // Fits in this window once the previous window weighs less.
            // Denied now, so the offset lies beyond `elapsed` (and at most at
            // the window's end, where the previous window weighs nothing).
            self.earliest_offset_ns(view.previous, room_now - cost) - view.elapsed_ns
        } else {
            // Not in this window: in the next, this window's count is carried
            // with weight falling from 1. May exceed one window.
            (self.window_ns - view.elapsed_ns)
                + self.earliest_offset_ns(view.current, self.capacity - cost)
        };
        Ok(Verdict::Deny(Decision::deny(
            self.capacity,
            free,
            retry_after_ns,
            self.reset_after_ns(view.previous, view.current, view.elapsed_ns),
        )))
    }

    #[inline]
    fn admit(&self, state: &mut SlidingWindowCounterState, admission: SlidingWindowCounterState) {
        *state = admission;
    }

    /// A count weighs on the next window too: idle two windows on.
    fn rest_ns(&self) -> u64 {
        2 * self.window_ns
    }

    /// Idle when neither window, rolled forward to now, counts anything.
    fn is_idle(&self, state: &SlidingWindowCounterState, now_ns: u64) -> bool {
        let view = self.view(state, clamp_time(now_ns));
        view.previous == 0 && view.current == 0
    }

    /// The admission counted its units in the window of its reading: they
    /// leave that window's count, the current one if the key still counts
    /// there, the previous one if the key has moved one window on, which
    /// then decides as if they had never been admitted. A key two windows
    /// on (or evicted) holds nothing of them; as for the fixed window, a
    /// stale reading's units, counted in a later window, stay charged
    /// there.
    fn release(
        &self,
        state: &SlidingWindowCounterState,
        receipt: &Receipt,
        _now_ns: Option<u64>,
    ) -> Option<(SlidingWindowCounterState, Refund)> {
        let window_index = receipt.now_ns() / self.window_ns;
        let charge = u32::try_from(receipt.charge()).unwrap_or(u32::MAX);
        let mut released = *state;
        let count = if state.window_index == window_index {
            &mut released.current
        } else if state.window_index.checked_sub(window_index) == Some(1) {
            &mut released.previous
        } else {
            return None;
        };
        if *count == 0 {
            return None;
        }
        *count = count.saturating_sub(charge);
        Some((released, Refund::Full))
    }
}

impl SlidingWindowCounter {
    /// Whether every state of this counter's quota packs into one word, so
    /// that the default cell ([`Adaptive`](crate::cell::Adaptive)) holds it
    /// in an `AtomicU64` and denies without writing (see "Packed state").
    #[must_use]
    pub const fn packs(&self) -> bool {
        self.packs
    }

    /// The counter in its packed form: exact only where [`packs`] holds
    /// (the cell that calls it has checked).
    ///
    /// [`packs`]: SlidingWindowCounter::packs
    pub(crate) const fn packed(&self) -> Packed {
        Packed { counter: *self }
    }
}

/// A [`SlidingWindowCounter`] whose states pack into one word: the
/// algorithm the [`Adaptive`](crate::cell::Adaptive) cell's atomic form
/// runs, for a counter that [`packs`](SlidingWindowCounter::packs). It
/// decides exactly as the counter it wraps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Packed {
    counter: SlidingWindowCounter,
}

impl Algorithm for Packed {
    type State = SlidingWindowCounterState;
    type Admission = SlidingWindowCounterState;

    /// The quota's counter in its packed form (the cell builds its own from
    /// the counter it is given, and only where it packs).
    fn from_quota(quota: &Quota) -> Self {
        SlidingWindowCounter::from_quota(quota).packed()
    }

    fn capacity(&self) -> u32 {
        self.counter.capacity()
    }

    #[inline]
    fn decide(
        &self,
        state: &SlidingWindowCounterState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<SlidingWindowCounterState>, CheckError> {
        self.counter.decide(state, now_ns, cost)
    }

    #[inline]
    fn admit(&self, state: &mut SlidingWindowCounterState, admission: SlidingWindowCounterState) {
        self.counter.admit(state, admission);
    }

    fn is_idle(&self, state: &SlidingWindowCounterState, now_ns: u64) -> bool {
        self.counter.is_idle(state, now_ns)
    }

    fn rest_ns(&self) -> u64 {
        self.counter.rest_ns()
    }
}

impl PackedAlgorithm for Packed {
    #[inline]
    fn pack(&self, state: &SlidingWindowCounterState) -> u64 {
        pack_counts(
            state.window_index,
            state.previous,
            state.current,
            self.counter.count_bits,
        )
    }

    #[inline]
    fn unpack(&self, word: u64) -> SlidingWindowCounterState {
        let (window_index, previous, current) = unpack_counts(word, self.counter.count_bits);
        SlidingWindowCounterState {
            window_index,
            previous,
            current,
        }
    }
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use super::{
        SlidingWindowCounter, SlidingWindowCounterState, every_state_packs, pack_counts,
        unpack_counts,
    };
    use crate::Quota;
    use crate::algorithm::{Algorithm, PackedAlgorithm};
    use crate::clock::END_OF_TIME_NS;

    #[test]
    fn pack_and_unpack_round_trip_at_the_edges() {
        for count_bits in [1_u32, 7, 16, 31] {
            let max_count = u32::try_from((1_u64 << count_bits) - 1).unwrap();
            let max_index = (1_u64 << (64 - 2 * count_bits)) - 1;
            for (index, previous, current) in [
                (0, 0, 0),
                (0, max_count, 0),
                (0, 0, max_count),
                (max_index, 0, 0),
                (max_index - 1, max_count, max_count),
                (max_index / 3, max_count / 2, 1),
            ] {
                let word = pack_counts(index, previous, current, count_bits);
                assert_eq!(
                    unpack_counts(word, count_bits),
                    (index, previous, current),
                    "k = {count_bits}"
                );
            }
            // Full counts never spill into each other or the index.
            assert_eq!(pack_counts(0, 0, max_count, count_bits) >> count_bits, 0);
            assert_eq!(
                pack_counts(0, max_count, 0, count_bits) >> (2 * count_bits),
                0
            );
            // Only the all-ones index with full counts is the retired word.
            assert_eq!(
                pack_counts(max_index, max_count, max_count, count_bits),
                u64::MAX
            );
        }
    }

    #[test]
    fn a_quota_packs_exactly_when_its_last_window_index_fits() {
        // 1 000 a second in bursts of 1 000: a 1 s window, k = 10, 44
        // index bits for 2^63 / 10^9 < 2^34 windows.
        let packs = |quota: Quota| SlidingWindowCounter::from_quota(&quota).packs();
        assert!(packs(Quota::per_second(1_000).unwrap()));
        assert!(packs(Quota::per_minute(100).unwrap()));
        // A million a second in bursts of a million: k = 20, 24 index bits
        // for 2^33 windows of 1 s.
        assert!(!packs(Quota::per_second(1_000_000).unwrap()));
        // The largest burst (k = 32) leaves no index bit.
        assert!(!packs(Quota::per_hour(u32::MAX).unwrap()));
        // At the edge: k = 1 leaves 62 index bits, which a window of 2 ns
        // needs all of (2^63 / 2 = 2^62 windows reach the all-ones index)
        // and a window of 3 ns does not.
        assert!(!every_state_packs(1, 2));
        assert!(every_state_packs(1, 3));
        assert_eq!(END_OF_TIME_NS / 2, 1 << 62);
    }

    #[test]
    fn the_packed_counter_decides_as_the_counter() {
        let counter = SlidingWindowCounter::from_quota(&Quota::per_second(10).unwrap());
        assert!(counter.packs());
        let packed = counter.packed();
        let mut plain = SlidingWindowCounterState::default();
        let mut word = packed.pack(&plain);
        assert_eq!(word, 0, "a fresh key packs to 0");
        for step in 0_u64..400 {
            let now_ns = step * 7_919_000;
            let cost = u32::try_from(step % 3).unwrap() + 1;
            let expected = counter.check(&mut plain, now_ns, cost).unwrap();
            // The packed side keeps its state only as a word between
            // steps, as the atomic cell does.
            let mut unpacked = packed.unpack(word);
            let got = packed.check(&mut unpacked, now_ns, cost).unwrap();
            word = packed.pack(&unpacked);
            assert_eq!(got, expected, "step {step}");
            assert_eq!(packed.unpack(word), plain, "step {step}");
        }
    }
}
