//! The answer every check returns.

use std::time::Duration;

/// The outcome of one check: whether the request is admitted, and the numbers
/// a client needs to behave well (they map onto `RateLimit-*` and
/// `Retry-After` response headers).
///
/// Invariants, held by every algorithm and checked by the conformance suite:
///
/// * `remaining <= limit`;
/// * `retry_after` is zero when allowed, and when denied
///   `0 < retry_after <= reset_after`;
/// * `retry_after` is exact: the same request retried `retry_after` later (with
///   no other traffic on the key) is admitted, and one nanosecond earlier it is
///   not.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a decision says whether the request may proceed"]
// No `allowed` field: a decision is allowed exactly when its wait is zero
// (a denial's is positive), so the flag is derived and the invariant cannot
// break. It also keeps the type three whole words with no padding: with a
// `bool`, rustc moved it through `Result<Option<_>, _>` on the hot path with
// overlapping odd-offset copies of the padding that stalled store forwarding
// (measured: notes/04).
pub struct Decision {
    retry_after_ns: u64,
    reset_after_ns: u64,
    limit: u32,
    remaining: u32,
}

impl Decision {
    /// An admission. `reset_after_ns` is measured after this admission.
    pub(crate) const fn allow(limit: u32, remaining: u32, reset_after_ns: u64) -> Self {
        Self {
            limit,
            remaining,
            retry_after_ns: 0,
            reset_after_ns,
        }
    }

    /// A denial. Callers guarantee `0 < retry_after_ns <= reset_after_ns`:
    /// a zero wait would read as an admission.
    pub(crate) const fn deny(
        limit: u32,
        remaining: u32,
        retry_after_ns: u64,
        reset_after_ns: u64,
    ) -> Self {
        debug_assert!(retry_after_ns > 0 && retry_after_ns <= reset_after_ns);
        Self {
            retry_after_ns,
            reset_after_ns,
            limit,
            remaining,
        }
    }

    /// A decision from its parts, for a backend that decides elsewhere (a
    /// server-side script): allowed when `retry_after` is zero.
    ///
    /// Returns `None` when the parts break an invariant of the contract:
    /// `remaining > limit`, `retry_after > reset_after`, or a duration
    /// beyond `u64` nanoseconds (about 584 years).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Decision;
    ///
    /// let denied = Decision::from_parts(10, 0, Duration::from_millis(5), Duration::from_secs(1))
    ///     .expect("a well-formed denial");
    /// assert!(!denied.is_allowed());
    /// assert_eq!(denied.retry_after(), Duration::from_millis(5));
    /// assert_eq!(Decision::from_parts(10, 11, Duration::ZERO, Duration::ZERO), None);
    /// assert_eq!(Decision::from_parts(10, 0, Duration::from_secs(2), Duration::from_secs(1)), None);
    /// ```
    #[must_use]
    pub fn from_parts(
        limit: u32,
        remaining: u32,
        retry_after: Duration,
        reset_after: Duration,
    ) -> Option<Self> {
        let retry_after_ns = u64::try_from(retry_after.as_nanos()).ok()?;
        let reset_after_ns = u64::try_from(reset_after.as_nanos()).ok()?;
        if remaining > limit || retry_after_ns > reset_after_ns {
            return None;
        }
        Some(Self {
            retry_after_ns,
            reset_after_ns,
            limit,
            remaining,
        })
    }

    /// Whether the request was admitted (and its cost consumed).
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        self.retry_after_ns == 0
    }

    /// The key's capacity: the most unit requests it can admit at once (the
    /// quota's burst).
    #[must_use]
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// How many more unit requests would be admitted right now, after this
    /// decision. Never more than [`limit`](Decision::limit).
    #[must_use]
    pub const fn remaining(&self) -> u32 {
        self.remaining
    }

    /// The wait before the same request is admitted: zero when allowed; when
    /// denied, the earliest wait after which it is, rounded **up** to the
    /// nanosecond, so that retrying at it succeeds.
    #[must_use]
    pub const fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_ns)
    }

    /// The time until the key is fully replenished (`remaining == limit`),
    /// with no further traffic. Never less than
    /// [`retry_after`](Decision::retry_after).
    #[must_use]
    pub const fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.is_allowed())
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("retry_after_ns", &self.retry_after_ns)
            .field("reset_after_ns", &self.reset_after_ns)
            .finish()
    }
}
