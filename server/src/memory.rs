//! The in-memory backend: a lock-free limiter per rule, in this process,
//! and a request's descriptors decided all or nothing by the core's
//! [`tollgate::check_all_slice`].

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;

use tollgate::algorithm::{
    Carry, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::store::{ChangeError, WhenFull};
use tollgate::{AllError, Builder, Charge, CheckError, Decision, Quota, RateLimiter};

use crate::config::{Algorithm, Limit};
use crate::limits::{Backend, Descriptor, Limits, Name, Plan, Refused, Request, Status, ToCharge};

/// Limits held in this process: nothing to install, nothing shared with
/// another process (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory;

/// One rule's limiter in memory, whatever its algorithm.
pub trait RuleLimiter: Send + Sync + fmt::Debug {
    /// A check of `cost` units of `key`, for [`tollgate::check_all_slice`].
    fn charge<'a>(&'a self, key: &'a str, cost: u32) -> Box<dyn Charge + 'a>;
    /// What a check of `key` would decide now, charging nothing.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::peek`].
    fn peek(&self, key: &str) -> Result<Decision, CheckError>;
    /// Changes the quota, each key's state carried by `carry`.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::set_quota`].
    fn change(&self, quota: Quota, carry: Carry) -> Result<(), ChangeError>;
    /// Removes the keys that decide as absent ones.
    fn evict_idle(&self) -> usize;
    /// Whether it holds no key.
    fn is_empty(&self) -> bool;
}

impl<A: tollgate::algorithm::Algorithm> RuleLimiter for RateLimiter<String, A>
where
    tollgate::store::DefaultStore: tollgate::store::StoreKind<String, A>,
{
    fn charge<'a>(&'a self, key: &'a str, cost: u32) -> Box<dyn Charge + 'a> {
        Box::new(self.on(key).cost(cost))
    }

    fn peek(&self, key: &str) -> Result<Decision, CheckError> {
        RateLimiter::peek(self, key)
    }

    fn change(&self, quota: Quota, carry: Carry) -> Result<(), ChangeError> {
        self.set_quota(quota, carry)
    }

    fn evict_idle(&self) -> usize {
        RateLimiter::evict_idle(self)
    }

    fn is_empty(&self) -> bool {
        RateLimiter::len(self) == 0
    }
}

impl Backend for Memory {
    type Limiter = Arc<dyn RuleLimiter>;

    /// A lock-free limiter of `limit`'s algorithm and quota; a new key past
    /// `max_keys` is over its limit. Never refuses.
    fn limiter(
        &self,
        _name: &Name<'_>,
        limit: &Limit,
        max_keys: NonZeroUsize,
    ) -> Result<Self::Limiter, String> {
        let builder = Builder::new(limit.quota).max_keys(max_keys, WhenFull::Reject);
        Ok(match limit.algorithm {
            Algorithm::FixedWindow => {
                Arc::new(builder.algorithm::<FixedWindow>().build::<String>())
            }
            Algorithm::Gcra => Arc::new(builder.algorithm::<Gcra>().build::<String>()),
            Algorithm::TokenBucket => {
                Arc::new(builder.algorithm::<TokenBucket>().build::<String>())
            }
            Algorithm::SlidingWindowCounter => Arc::new(
                builder
                    .algorithm::<SlidingWindowCounter>()
                    .build::<String>(),
            ),
            Algorithm::SlidingWindowLog => {
                Arc::new(builder.algorithm::<SlidingWindowLog>().build::<String>())
            }
        })
    }

    fn change(limiter: &Self::Limiter, quota: Quota, carry: Carry) -> Result<(), Refused> {
        limiter
            .change(quota, carry)
            .map_err(|refused| match refused {
                ChangeError::Reclaiming => Refused::Later,
                refused => Refused::Never(refused.to_string()),
            })
    }

    fn evict_idle(limiter: &Self::Limiter) -> usize {
        limiter.evict_idle()
    }

    fn holds_state(&self, limiter: &Self::Limiter) -> bool {
        !limiter.is_empty()
    }
}

impl Limits<Memory> {
    /// Decides `request`: each descriptor against the rule it matches (or
    /// the limit it brings, in a configured domain), all or nothing across
    /// the descriptors whose rules enforce. A descriptor of cost 0 is
    /// decided without a charge and never refuses; a rule in shadow mode
    /// is decided and charged on its own, and never refuses. A request
    /// refused is charged by no limit (as [`tollgate::check_all_slice`]).
    #[must_use]
    pub fn decide<D: Descriptor>(&self, request: &Request<'_, D>) -> Vec<Status> {
        let Plan {
            mut statuses,
            enforced,
            shadow,
            peeked,
            blocked,
        } = self.plan(request);
        if blocked {
            for check in &enforced {
                peek_into(&mut statuses[check.index], check);
            }
        } else {
            charge_all(&mut statuses, &enforced);
        }
        for check in &shadow {
            let status = &mut statuses[check.index];
            match check.limiter.charge(&check.key, check.cost).charge() {
                Ok((decision, _)) => {
                    status.shadow_refused = !decision.is_allowed();
                    status.decision = Some(decision);
                }
                Err(_) => status.shadow_refused = true,
            }
        }
        for check in &peeked {
            peek_into(&mut statuses[check.index], check);
        }
        statuses
    }
}

/// A check of a rule in memory.
type Check = ToCharge<Arc<dyn RuleLimiter>>;

/// Charges `enforced` all or nothing into `statuses`.
fn charge_all(statuses: &mut [Status], enforced: &[Check]) {
    let charges: Vec<Box<dyn Charge + '_>> = enforced
        .iter()
        .map(|check| check.limiter.charge(&check.key, check.cost))
        .collect();
    let limits: Vec<&dyn Charge> = charges.iter().map(|charge| &**charge).collect();
    // A limit that cannot decide its descriptor (a cost above its
    // burst, which can never be admitted; a new key past the key cap)
    // holds it over its limit, and the others are given back.
    let (decisions, refused) = match tollgate::check_all_slice(&limits) {
        Ok(checked) => (checked.decisions, checked.refused),
        Err(AllError { limit, .. }) => (vec![None; enforced.len()], Some(limit)),
    };
    for (position, (check, decision)) in enforced.iter().zip(decisions).enumerate() {
        let status = &mut statuses[check.index];
        if Some(position) == refused {
            status.over_limit = true;
            status.decision = decision;
        } else if refused.is_some() {
            // Given back, or never checked: shown as they stand.
            peek_into(status, check);
            status.over_limit = false;
        } else {
            status.decision = decision;
        }
    }
}

/// Fills `status` with a peek of `check`'s key: its decision as it stands,
/// charging nothing (whether it is over its limit is the caller's).
fn peek_into(status: &mut Status, check: &Check) {
    if let Ok(decision) = check.limiter.peek(&check.key) {
        status.decision = Some(decision);
    }
}
