//! A lease call's messages: what a node asks of the remote, and the
//! remote's answer. A backend builds them from its wire format with the
//! constructors (the structs are `#[non_exhaustive]`, so that a field can
//! be added without breaking it).

/// What a lease call asks of the remote ([`lease`](super::lease) decides
/// it).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseRequest {
    /// The request's own units, admitted now or denied.
    pub cost: u32,
    /// Units to lease beyond them (zero: a plain check that teaches the
    /// TAT).
    pub want: u32,
    /// Units of an earlier lease to give back first.
    pub give_back: Option<GiveBack>,
}

impl LeaseRequest {
    /// Creates a request for `cost` units and `want` more to lease, giving
    /// back `give_back` first.
    #[must_use]
    pub const fn new(cost: u32, want: u32, give_back: Option<GiveBack>) -> Self {
        Self {
            cost,
            want,
            give_back,
        }
    }

    /// Creates a plain check of `cost` units: nothing leased, nothing given
    /// back (it teaches the key's TAT).
    #[must_use]
    pub const fn plain(cost: u32) -> Self {
        Self::new(cost, 0, None)
    }
}

/// Unspent units of a lease, given back if the key still holds the TAT
/// that lease wrote.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GiveBack {
    /// The TAT the lease wrote (its last slot).
    pub end_us: u64,
    /// Its units left unspent (the top slots up to `end_us`).
    pub units: u32,
}

impl GiveBack {
    /// Creates a give-back of `units` unspent units of the lease that wrote
    /// the TAT `end_us`.
    #[must_use]
    pub const fn new(end_us: u64, units: u32) -> Self {
        Self { end_us, units }
    }
}

/// The remote's answer to a lease call.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseReply {
    /// Whether the request's own units were admitted.
    pub allowed: bool,
    /// Units still free on the remote after this call.
    pub remaining: u32,
    /// When denied, µs until the request's cost fits; zero when allowed.
    pub retry_us: u64,
    /// µs until the key is fully rested (its debt after this call).
    pub reset_us: u64,
    /// Units leased beyond the request's (zero when denied).
    pub granted: u32,
    /// The key's TAT after this call: the lease's last slot.
    pub end_us: u64,
    /// The remote's instant of the decision, µs.
    pub now_us: u64,
    /// Units given back.
    pub returned: u32,
}

impl LeaseReply {
    /// Creates a reply from its fields, in the order the Redis script
    /// returns them.
    #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
    #[must_use]
    pub const fn new(
        allowed: bool,
        remaining: u32,
        retry_us: u64,
        reset_us: u64,
        granted: u32,
        end_us: u64,
        now_us: u64,
        returned: u32,
    ) -> Self {
        Self {
            allowed,
            remaining,
            retry_us,
            reset_us,
            granted,
            end_us,
            now_us,
            returned,
        }
    }
}
