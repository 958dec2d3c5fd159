//! The fixed window counter.

use std::cmp::Ordering;

use super::{Algorithm, Verdict, clamp_time, validate_cost};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::quota::Quota;

/// A fixed window counter: at most `burst` units per window of
/// [`Quota::burst_window`], windows aligned to whole multiples of it from the
/// clock's origin.
///
/// The cheapest algorithm, and the only one here whose burst is not the one
/// configured: a client that knows where the boundary falls gets up to
/// `2 × burst` inside any span containing it, because each window
/// independently admits `burst`. That is a property of the algorithm, not a
/// defect; `tests/algorithms.rs` demonstrates it (199 admitted in 1 ms
/// against 100 per minute).
///
/// Because windows are aligned, every key's window resets at the same instant;
/// a key's window therefore does not start at its first request.
///
/// A clock reading from before the stored window is treated as the stored
/// window's first instant: it sees the stored count and the longest wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    capacity: u32,
    window_ns: u64,
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
        Self {
            capacity: quota.burst(),
            window_ns: quota.burst_window_ns(),
        }
    }

    fn capacity(&self) -> u32 {
        self.capacity
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
        let now_index = now_ns / self.window_ns;
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
}
