//! The local half of a GCRA limiter decided elsewhere (a Redis script): an
//! exact deny cache and leases, so that most checks take no round trip and
//! no lock.
//!
//! Users meet it through a backend: `tollgate-redis` runs its
//! `Mode::DenyCached` and `Mode::Leased` on it. What a user chooses here is
//! [`Leases`]: how many units a lease may hold, and how long past its
//! deadline a unit may still be spent. A configuration that cannot be used
//! is a [`RemoteError`].
//!
//! ```
//! use tollgate::remote::Leases;
//!
//! # fn main() -> Result<(), tollgate::remote::RemoteError> {
//! // Leases of at most 64 units, none spent past its deadline: no window
//! // admits more than the remote limiter alone would.
//! let leases = Leases::new().with_max_units(64)?;
//! assert_eq!((leases.max_units(), leases.slack()), (64, 0));
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees
//!
//! A remote GCRA key is one number, its theoretical arrival time (TAT). It
//! only moves later: an admission moves it on, a denial writes nothing, and
//! time pays the debt `TAT − now` back one for one. (Only units given back,
//! a cancelled reservation's or a lease's, move it back, and only over
//! units nobody was admitted after.) So anything a node learns of it stays
//! true: a TAT of `T` seen at the remote's instant `s` means a TAT of at
//! least `T` from then on, unless units were given back since. Two uses
//! follow.
//!
//! * **The deny cache.** A request of cost `n` at the remote's instant `t`
//!   is denied there if `T − t > tolerance − n × interval`. A node that knows
//!   `T` denies such a request itself, and the remote would have: **exact**,
//!   not merely safe (it denies nothing the remote would admit at that
//!   instant), while no units are given back on the key; units given back
//!   can make it deny for at most their intervals longer than the remote
//!   would. It never admits. Every reply teaches a `T`: a denial's, and an
//!   admission's.
//! * **Leases.** A node asks the remote for `n + L` units at once (one
//!   GCRA admission, so nothing the remote limiter would not admit), spends
//!   `n` at once and keeps `L`. GCRA gave them the slots `T − (L − 1) ×
//!   interval … T` (the TAT after each unit). The remote limiter admits a
//!   unit no later than its slot less one interval, and no earlier than its
//!   slot less the tolerance; a lease unit keeps both if it is **spent no
//!   later than its slot less one interval** (the second holds already: the
//!   lease was admitted). Any window of length `W` then holds at most
//!   `burst + ⌊W / interval⌋` admissions, those of every node and of the
//!   remote together: each admission at `t` has its own slot in `[t +
//!   interval, t + tolerance]`, slots lie an interval apart, and that window
//!   holds no more of them. That is the most the remote limiter alone admits
//!   in a window of that length: **no over-admission, in any window**. A
//!   unit past its deadline expires; with a `slack` of `k`, units serve `k`
//!   intervals longer and a window holds at most `k` more.
//!
//! * **Holds** ([`Leases::with_holds`], off by default). A key many nodes
//!   want at once runs short of units, and every node's knowledge of it
//!   lapses within an interval: each would call for nearly every check.
//!   With holds, a node whose call finds a key short of units that others
//!   take from too denies the key's checks itself, once the call's lease
//!   (if any) is spent, for about as long as its sharers take to call once
//!   each, never longer than the key takes to rest. Those denials are no
//!   longer exact (the remote might admit them; the units go to the
//!   sharers' calls), and they never admit: the bound above stands.
//!
//! The design notes on leases have the proofs, the bounds on
//! under-admission and extra wait, and the measurements; the note on
//! fleets simulates them on up to ten thousand nodes.
//!
//! # For backend implementers
//!
//! The rest of this module is the protocol a backend drives: the view of a
//! node's knowledge (`LocalView`), the calls it sends (`LeaseRequest`,
//! `LeaseReply`), the remote's side as a pure function (`lease`, the Rust
//! twin of the Redis script), and the quota and clocks it decides on
//! (`RemoteQuota`, `RemoteClock`). Those items are hidden from these pages:
//! `tollgate-redis` is their user, they are documented in the source, and
//! they are under no semver promise.

mod call;
mod holds;
mod offset;
mod script;
mod view;
mod word;

pub use call::{GiveBack, LeaseReply, LeaseRequest};
// The loom model of the clocks' offset reaches it here.
#[cfg(feature = "loom")]
#[doc(hidden)]
pub use offset::Offset;
pub use offset::RemoteClock;
pub use script::lease;
pub use view::{Ask, Local, LocalView};
pub use word::MAX_LEASE_UNITS;

use crate::quota::Quota;

/// The longest span a remote quota may hold: 2^51 µs (71 years), as the
/// Redis script's exact arithmetic requires.
#[doc(hidden)]
pub const MAX_SPAN_US: u64 = 1 << 51;

/// A GCRA quota as the remote decides it: whole microseconds.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteQuota {
    interval_us: u64,
    burst: u32,
}

impl RemoteQuota {
    /// Creates a quota of an emission interval of `interval_us`
    /// microseconds and a burst of `burst`.
    ///
    /// # Errors
    ///
    /// [`RemoteError::ZeroQuota`] for a zero interval or burst, and
    /// [`RemoteError::SpanTooLong`] when `burst × interval` exceeds
    /// [`MAX_SPAN_US`].
    pub fn new(interval_us: u64, burst: u32) -> Result<Self, RemoteError> {
        if interval_us == 0 || burst == 0 {
            return Err(RemoteError::ZeroQuota);
        }
        if interval_us
            .checked_mul(u64::from(burst))
            .is_none_or(|span| span > MAX_SPAN_US)
        {
            return Err(RemoteError::SpanTooLong);
        }
        Ok(Self { interval_us, burst })
    }

    /// `quota` in whole microseconds, its emission interval rounded up (a
    /// slower rate: never more than the quota).
    ///
    /// # Errors
    ///
    /// As [`RemoteQuota::new`].
    pub fn from_quota(quota: &Quota) -> Result<Self, RemoteError> {
        let interval_us = quota.emission_interval_ns().div_ceil(1_000);
        Self::new(interval_us, quota.burst())
    }

    /// One unit's refill time, µs.
    #[must_use]
    pub const fn interval_us(&self) -> u64 {
        self.interval_us
    }

    /// The most units a key holds at once.
    #[must_use]
    pub const fn burst(&self) -> u32 {
        self.burst
    }

    /// A drained key's refill time, µs: `burst × interval`.
    #[must_use]
    pub const fn tolerance_us(&self) -> u64 {
        self.interval_us * self.burst as u64
    }
}

/// How a node leases: the most units a lease holds, and how many
/// intervals past its deadline a unit may still be spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Leases {
    max_units: u32,
    slack: u32,
    holds: bool,
}

impl Leases {
    /// Leases of up to [`MAX_LEASE_UNITS`] units, no slack: no window holds
    /// more than the remote limiter alone admits.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            max_units: MAX_LEASE_UNITS,
            slack: 0,
            holds: false,
        }
    }

    /// Leases of at most `max_units` units.
    ///
    /// # Errors
    ///
    /// [`RemoteError::LeaseSize`] for 0 or more than [`MAX_LEASE_UNITS`].
    pub const fn with_max_units(self, max_units: u32) -> Result<Self, RemoteError> {
        if max_units == 0 || max_units > MAX_LEASE_UNITS {
            return Err(RemoteError::LeaseSize(max_units));
        }
        Ok(Self { max_units, ..self })
    }

    /// Lets a unit be spent `slack` intervals past its deadline. Leases
    /// then serve nodes whose requests arrive slower than the quota's rate
    /// on a key far from its limit (units otherwise expire faster than
    /// they are spent there), at a price: a window may hold up to `slack`
    /// more admissions than the remote limiter alone would admit.
    #[must_use]
    pub const fn with_slack(self, slack: u32) -> Self {
        Self { slack, ..self }
    }

    /// Makes a node hold off asking for a key that other nodes take from
    /// too, when a call finds the key with less than half its burst free:
    /// once the call's lease (if any) is spent, the node denies the key's
    /// checks itself for a while, so that a key many nodes want costs
    /// about a call per node and hold rather than nearly a call per check.
    ///
    /// How long: the admissions since its previous call (the key's TAT
    /// moved by one interval each), over its own (the call's cost and the
    /// units it was granted), estimate how many nodes share the key, as if
    /// each took what it did; it holds off for as many times the refill
    /// time of the lease it asked for, at most the key's debt after the
    /// call (the time until the key would be fully rested if nobody took
    /// from it again, at most a tolerance), and of that a share from half
    /// to all, drawn for each hold, so that nodes that called together do
    /// not call again together. That is for a check of one unit under the
    /// view's own quota: a check of cost `c` is denied `c − 1` intervals
    /// longer, a carried quota of a smaller burst the difference of the
    /// tolerances longer, and after the remote's clock stepped forward, by
    /// up to the step longer until a reply corrects the node's bound of
    /// it. The key never rests full during a hold, whatever the sharers
    /// do, and the units it leaves stay on the remote for the sharers, or
    /// for this node when the hold ends. The checks it denies meanwhile
    /// stay denied: on a key whose sharers come and go, that is
    /// under-admission. No hold on a key with half its burst free or more,
    /// on one the node knew nothing recent of, or when the estimate finds
    /// fewer than two sharers.
    ///
    /// Where: a hold that starts at once (the call left no units) raises
    /// the key's floor; one that starts when the lease is spent, and the
    /// floor the next estimate starts from, wait in a table beside the
    /// keys (256 slots by the key's hash, 4 KiB). The key's next claim
    /// applies the hold only while the key's word stands where that call
    /// left it (a change of quota or a later call forgets it), and only
    /// while it still denies at the node's upper bound of the remote's
    /// clock (on a Cluster, widened by the declared skew: a found hold
    /// ends up to that much early). The table is a hint: a slot another
    /// key's running hold takes is lost to this one, which then only
    /// costs calls.
    ///
    /// The price: the deny cache is no longer exact while a node holds
    /// off. It may deny a check the remote would admit (the units go to the
    /// sharers' calls; the key's admissions stay at its limit). Such a
    /// denial reads as one the remote would give at the hold's end: a
    /// `remaining` of 0, a `retry_after` of the hold's end (and the cost's
    /// further intervals), a `reset_after` about a tolerance past it. It
    /// never admits more: no window holds more than the remote limiter
    /// alone admits.
    #[must_use]
    pub const fn with_holds(self, holds: bool) -> Self {
        Self { holds, ..self }
    }

    /// Whether a node holds off asking for a key it shares
    /// ([`with_holds`](Leases::with_holds)).
    #[must_use]
    pub const fn holds(&self) -> bool {
        self.holds
    }

    /// The most units a lease holds.
    #[must_use]
    pub const fn max_units(&self) -> u32 {
        self.max_units
    }

    /// Intervals past its deadline a unit may be spent.
    #[must_use]
    pub const fn slack(&self) -> u32 {
        self.slack
    }
}

impl Default for Leases {
    fn default() -> Self {
        Self::new()
    }
}

/// A remote quota or lease configuration that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// A zero interval or burst.
    #[error("a remote quota needs a positive interval and burst")]
    ZeroQuota,
    /// `burst × interval` (or the slack's intervals) beyond 2^51 µs.
    #[error("a remote span must be at most 2^51 µs")]
    SpanTooLong,
    /// A lease size of 0 or above [`MAX_LEASE_UNITS`].
    #[error("a lease holds 1 to {MAX_LEASE_UNITS} units, not {0}")]
    LeaseSize(u32),
    /// A lease call the script refuses (the errors of `lease`, its Rust
    /// twin).
    #[error(
        "a lease call needs a cost of 1 to the burst, at most a burst wanted or given back, and an instant below 2^52 µs"
    )]
    BadRequest,
    /// A view's table could not change its quota now
    /// ([`ChangeError`](crate::store::ChangeError)); nothing changed.
    #[error("the view's quota could not change: {0}")]
    Change(#[source] crate::store::ChangeError),
}
