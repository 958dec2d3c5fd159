//! The fixed window counter.

use std::cmp::Ordering;

use super::{
    Algorithm, Carry, CarryAt, PackedAlgorithm, Receipt, Refund, Verdict, carry_count, same_window,
    validate_cost,
};
use crate::clock::clamp_time;
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;

/// A fixed window counter: at most `burst` units per window of
/// [`Quota::burst_window`], windows aligned to whole multiples of it from the
/// clock's origin.
///
/// The cheapest algorithm, and the only one here whose burst is not the one
/// configured: a client that knows where the boundary falls gets up to
/// `2 × burst` inside any span containing it, because each window
/// independently admits `burst`. That is a property of the algorithm, not a
/// defect, and the crate's tests show it (199 admitted within 1 ms against
/// 100 per minute).
///
/// Because windows are aligned, every key's window resets at the same instant;
/// a key's window therefore does not start at its first request.
///
/// A clock reading from before the stored window is treated as the stored
/// window's first instant: it sees the stored count and the longest wait.
///
/// # Packed state
///
/// The state packs into one `u64` (see `pack_window`) so that the lock-free
/// cell updates it with one compare-and-swap. The count takes `k` bits,
/// as many as the window's length in nanoseconds needs, at most 32; the
/// window index takes the other `64 − k`. The layout depends on the window
/// alone, so every quota of one window packs alike
/// ([`for_quota`](Algorithm::for_quota)): a burst is at most the window in
/// nanoseconds (a quota allows at most one request per nanosecond) and at
/// most `u32::MAX`, so it fits in `k` bits. The index never runs out: a
/// window holds at least `2^(k−1)` nanoseconds, so by the time horizon
/// (2^63 ns) the index is at most `2^(64−k)`. It is clamped to
/// `2^(64−k) − 2`, so that time stops at most two windows early at the
/// 292-year horizon, and so that no state packs to `u64::MAX`, the atomic
/// cell's retired marker.
///
/// # Several quotas
///
/// A key read under another quota of the same window
/// ([`RateLimiter::check_with`](crate::RateLimiter::check_with)) keeps its
/// count: the units it was admitted in this window count against that
/// quota's burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    capacity: u32,
    window_ns: u64,
    count_bits: u32,
    max_window_index: u64,
}

/// Packs a fixed-window state into a word.
///
/// ```text
///  63                       k   k−1          0
/// +---------------------------+---------------+
/// |  window index (64 − k)    |  count (k)    |
/// +---------------------------+---------------+
/// ```
///
/// | word | meaning |
/// |---|---|
/// | `0` | a fresh key: window 0, nothing admitted |
/// | `index << k \| count` | `count` units admitted in window `index` |
/// | `u64::MAX` | never a state: the retired marker (the index is at most `2^(64−k) − 2`) |
///
/// `count_bits` is `k`, from 1 to 32; `count` must fit in it and `window_index`
/// in the remaining bits.
#[must_use]
const fn pack_window(window_index: u64, count: u32, count_bits: u32) -> u64 {
    (window_index << count_bits) | count as u64
}

/// Unpacks a word built by [`pack_window`] into (window index, count).
#[must_use]
const fn unpack_window(word: u64, count_bits: u32) -> (u64, u32) {
    let count_mask = (1_u64 << count_bits) - 1;
    // The mask keeps k <= 32 bits: the cast is lossless.
    #[allow(clippy::cast_possible_truncation)]
    let count = (word & count_mask) as u32;
    (word >> count_bits, count)
}

/// A fixed-window key: which window it last counted in, and how many units it
/// admitted there. The default (window 0, count 0) is a fresh key.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    window_index: u64,
    count: u32,
}

impl FixedWindowState {
    /// The window this state counts in: `now / window`.
    #[must_use]
    pub const fn window_index(&self) -> u64 {
        self.window_index
    }

    /// Units admitted in that window.
    #[must_use]
    pub const fn count(&self) -> u32 {
        self.count
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;
    type Admission = FixedWindowState;

    fn from_quota(quota: &Quota) -> Self {
        let window_ns = quota.burst_window_ns();
        // The bits the window's length needs, at most 32: see "Packed state".
        let count_bits = (u64::BITS - window_ns.leading_zeros()).min(u32::BITS);
        Self {
            capacity: quota.burst(),
            window_ns,
            count_bits,
            max_window_index: (1_u64 << (u64::BITS - count_bits)) - 2,
        }
    }

    /// Every quota of the same burst window: the layout is the window's
    /// (see "Packed state").
    fn for_quota(&self, quota: &Quota) -> Result<Self, LayoutError> {
        same_window(self.window_ns, quota)?;
        Ok(Self {
            capacity: quota.burst(),
            ..*self
        })
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The count of the window `now` falls in is carried (see [`Carry`]);
    /// a count of an earlier window counts nothing now and stays as it
    /// is. `to` counts in the same windows ([`for_quota`](Algorithm::for_quota)).
    fn carry(
        &self,
        to: &Self,
        carry: Carry,
        state: &FixedWindowState,
        at: CarryAt,
    ) -> Option<FixedWindowState> {
        if to == self || state.window_index < self.window_index(clamp_time(at.now_ns)) {
            return Some(*state);
        }
        Some(FixedWindowState {
            count: carry_count(self.capacity, to.capacity, carry, state.count),
            ..*state
        })
    }

    #[inline]
    fn decide(
        &self,
        state: &FixedWindowState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<FixedWindowState>, CheckError> {
        let cost = validate_cost(cost, self.capacity)?;
        let now_ns = clamp_time(now_ns);
        let now_index = self.window_index(now_ns);
        let (window_index, count, elapsed_ns) = match now_index.cmp(&state.window_index) {
            Ordering::Greater => (now_index, 0, now_ns % self.window_ns),
            Ordering::Equal => (now_index, state.count, now_ns % self.window_ns),
            // A reading from before the stored window never reopens an older
            // window: it is the stored window's first instant.
            Ordering::Less => (state.window_index, state.count, 0),
        };
        let window_ends_in_ns = self.window_ns - elapsed_ns;
        let free = self.capacity.saturating_sub(count);
        if cost <= free {
            Ok(Verdict::Allow {
                decision: Decision::allow(self.capacity, free - cost, window_ends_in_ns),
                admission: FixedWindowState {
                    window_index,
                    count: count + cost,
                },
            })
        } else {
            // Denied means count > 0, so the window's end is both the earliest
            // success and the full reset.
            Ok(Verdict::Deny(Decision::deny(
                self.capacity,
                free,
                window_ends_in_ns,
                window_ends_in_ns,
            )))
        }
    }

    #[inline]
    fn admit(&self, state: &mut FixedWindowState, admission: FixedWindowState) {
        *state = admission;
    }

    /// A count is idle once its window has ended.
    fn rest_ns(&self) -> u64 {
        self.window_ns
    }

    /// Idle when nothing is counted in the current window: a fresh key.
    /// An empty window (what a refund of its only admission leaves) is idle
    /// only from its own window on: at an older reading it counts in itself,
    /// which a fresh key does not.
    fn is_idle(&self, state: &FixedWindowState, now_ns: u64) -> bool {
        let now_index = self.window_index(clamp_time(now_ns));
        state.window_index < now_index || (state.count == 0 && state.window_index <= now_index)
    }

    /// The admission counted its units in the window of its reading: if
    /// the key still counts in that window, they leave the count, which
    /// then decides as if they had never been admitted (a count holds
    /// nothing else). A key counting in a later window holds nothing of
    /// them (nor does one that was evicted); neither does one whose
    /// admission read the clock before the window the key then counted in
    /// (a stale reading, counted in that later window): the units stay
    /// charged there until it ends.
    fn release(
        &self,
        state: &FixedWindowState,
        receipt: &Receipt,
        _now_ns: Option<u64>,
    ) -> Option<(FixedWindowState, Refund)> {
        let window_index = self.window_index(receipt.now_ns());
        let charge = u32::try_from(receipt.charge()).unwrap_or(u32::MAX);
        (state.window_index == window_index && state.count > 0).then(|| {
            let released = FixedWindowState {
                window_index,
                count: state.count.saturating_sub(charge),
            };
            (released, Refund::Full)
        })
    }
}

impl FixedWindow {
    /// The window `now_ns` falls in, clamped so that it always packs.
    #[inline]
    fn window_index(&self, now_ns: u64) -> u64 {
        (now_ns / self.window_ns).min(self.max_window_index)
    }
}

impl PackedAlgorithm for FixedWindow {
    #[inline]
    fn pack(&self, state: &FixedWindowState) -> u64 {
        pack_window(state.window_index, state.count, self.count_bits)
    }

    #[inline]
    fn unpack(&self, word: u64) -> FixedWindowState {
        let (window_index, count) = unpack_window(word, self.count_bits);
        FixedWindowState {
            window_index,
            count,
        }
    }
}

#[cfg(all(test, not(any(feature = "loom", feature = "shuttle"))))]
mod tests {
    use super::{pack_window, unpack_window};

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
            // Only the all-ones index with a full count is the cells' retired
            // word, and the algorithm never produces that index
            // (`tests/cells.rs`).
            assert_eq!(pack_window(max_index, max_count, count_bits), u64::MAX);
        }
    }
}
