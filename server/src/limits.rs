//! Deciding a request in memory: a lock-free limiter per rule, kept
//! across reloads, and a request's descriptors decided all or nothing.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use tollgate::algorithm::{
    Carry, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::store::{ChangeError, WhenFull};
use tollgate::{AllError, Builder, Charge, CheckError, Decision, Quota, RateLimiter};

use crate::config::{Algorithm, Config, Limit, Rule, Unit};

/// One rule's limiter, whatever its algorithm.
trait RuleLimiter: Send + Sync + fmt::Debug {
    /// A check of `cost` units of `key`, for [`tollgate::check_all_slice`].
    fn charge<'a>(&'a self, key: &'a str, cost: u32) -> Box<dyn Charge + 'a>;
    /// What a check of `key` would decide now, charging nothing.
    fn peek(&self, key: &str) -> Result<Decision, CheckError>;
    /// Changes the quota, each key's state carried by `carry`.
    fn change(&self, quota: Quota, carry: Carry) -> Result<(), ChangeError>;
    /// Removes the keys that decide as absent ones.
    fn evict_idle(&self) -> usize;
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
}

/// A limiter of `limit`'s algorithm and quota, holding at most
/// `max_keys` keys (a new key past them is over its limit).
fn limiter_of(limit: &Limit, max_keys: NonZeroUsize) -> Arc<dyn RuleLimiter> {
    let builder = Builder::new(limit.quota).max_keys(max_keys, WhenFull::Reject);
    match limit.algorithm {
        Algorithm::FixedWindow => Arc::new(builder.algorithm::<FixedWindow>().build::<String>()),
        Algorithm::Gcra => Arc::new(builder.algorithm::<Gcra>().build::<String>()),
        Algorithm::TokenBucket => Arc::new(builder.algorithm::<TokenBucket>().build::<String>()),
        Algorithm::SlidingWindowCounter => Arc::new(
            builder
                .algorithm::<SlidingWindowCounter>()
                .build::<String>(),
        ),
        Algorithm::SlidingWindowLog => {
            Arc::new(builder.algorithm::<SlidingWindowLog>().build::<String>())
        }
    }
}

/// A configuration's limiters: one per limited rule, by the rule's path.
#[derive(Debug)]
pub struct Limits {
    config: Config,
    /// The keys each limiter holds at most.
    max_keys: NonZeroUsize,
    limiters: HashMap<String, Held>,
    /// Limiters of the limits requests bring themselves (a descriptor's
    /// `limit`), by domain, count and unit; at most [`OVERRIDES`].
    overrides: Arc<Mutex<Overrides>>,
}

/// The limiters of limits requests bring, by domain, count and unit.
type Overrides = HashMap<(String, u32, Unit), Arc<dyn RuleLimiter>>;

/// The override limiters a service holds at most, whatever requests ask.
pub const OVERRIDES: usize = 1_024;

/// A rule's limiter and the limit it was built for.
#[derive(Debug, Clone)]
struct Held {
    limit: Limit,
    limiter: Arc<dyn RuleLimiter>,
}

/// A request to decide: its domain and descriptors.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a, D> {
    /// The domain.
    pub domain: &'a str,
    /// The descriptors, each decided against the rule it matches.
    pub descriptors: &'a [D],
}

/// A request's descriptor, as the service reads it.
pub trait Descriptor {
    /// Its entries, (key, value), in order.
    fn entries(&self) -> impl Iterator<Item = (&str, &str)> + '_;
    /// The units it costs (0: decided, not charged).
    fn cost(&self) -> u64;
    /// The limit it brings itself, if any: a count a unit.
    fn limit(&self) -> Option<(u32, Unit)>;
}

/// What one descriptor got.
#[derive(Debug, Clone)]
pub struct Status {
    /// Whether it is over its limit (never for a rule in shadow mode).
    pub over_limit: bool,
    /// The rule that decided it, if any (none: no rule matched, or the
    /// rule is unlimited or replaced).
    pub rule: Option<Arc<Rule>>,
    /// The limit it was held to (the rule's, or the one it brought).
    pub limit: Option<(u32, Unit)>,
    /// The decision, if a limit decided it.
    pub decision: Option<Decision>,
    /// A rule in shadow mode that would have refused it.
    pub shadow_refused: bool,
    /// The units it cost (0: decided, not charged).
    pub cost: u64,
}

/// A request refused as a whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The request brings more distinct limits of its own than the service
    /// keeps.
    #[error("more than {OVERRIDES} distinct descriptor limits")]
    TooManyOverrides,
    /// A descriptor brings a limit no quota can be (0 requests a unit).
    #[error("descriptor {descriptor} brings a limit of {count} a unit: {reason}")]
    BadLimit {
        /// The descriptor's index.
        descriptor: usize,
        /// Its `requests_per_unit`.
        count: u32,
        /// Why no quota is that.
        reason: tollgate::QuotaError,
    },
}

/// A request's descriptors matched and sorted, before any is charged.
struct Plan {
    statuses: Vec<Status>,
    enforced: Vec<ToCharge>,
    shadow: Vec<ToCharge>,
    peeked: Vec<ToCharge>,
}

/// A descriptor to charge: its index, limiter, key and cost.
struct ToCharge {
    index: usize,
    limiter: Arc<dyn RuleLimiter>,
    key: String,
    cost: u32,
}

impl Limits {
    /// The limiters of `config`, every rule fresh, each holding at most
    /// `max_keys` keys: a descriptor that would add a key past them is
    /// over its limit (the keys held keep working), so that clients
    /// choosing descriptor values cannot grow the service without bound.
    #[must_use]
    pub fn new(config: Config, max_keys: NonZeroUsize) -> Self {
        let limiters = config
            .rules()
            .filter_map(|rule| {
                let limit = rule.limit?;
                Some((
                    rule.path.clone(),
                    Held {
                        limit,
                        limiter: limiter_of(&limit, max_keys),
                    },
                ))
            })
            .collect();
        Limits {
            config,
            max_keys,
            limiters,
            overrides: Arc::default(),
        }
    }

    /// The limiters of `config`, keeping the state of every rule of `self`
    /// at the same path with the same algorithm (its quota changed, each
    /// key carried by `carry`, if its limit differs); the others fresh.
    #[must_use]
    pub fn reload(&self, config: Config, carry: Carry) -> Self {
        let limiters = config
            .rules()
            .filter_map(|rule| {
                let limit = rule.limit?;
                let kept = self.limiters.get(&rule.path).filter(|held| {
                    held.limit.algorithm == limit.algorithm
                        && (held.limit.quota == limit.quota
                            || held.limiter.change(limit.quota, carry).is_ok())
                });
                let limiter = kept.map_or_else(
                    || limiter_of(&limit, self.max_keys),
                    |held| held.limiter.clone(),
                );
                Some((rule.path.clone(), Held { limit, limiter }))
            })
            .collect();
        Limits {
            config,
            max_keys: self.max_keys,
            limiters,
            overrides: self.overrides.clone(),
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Removes every limiter's idle keys; returns how many.
    pub fn evict_idle(&self) -> usize {
        let overrides: Vec<_> = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        self.limiters
            .values()
            .map(|held| held.limiter.clone())
            .chain(overrides)
            .map(|limiter| limiter.evict_idle())
            .sum()
    }

    /// Decides `request`: each descriptor against the rule it matches (or
    /// the limit it brings), all or nothing across the descriptors whose
    /// rules enforce; a rule in shadow mode is decided and charged on its
    /// own, and never refuses.
    ///
    /// # Errors
    ///
    /// [`DecideError`]: nothing of the request is charged.
    pub fn decide<D: Descriptor>(
        &self,
        request: &Request<'_, D>,
    ) -> Result<Vec<Status>, DecideError> {
        let Plan {
            mut statuses,
            enforced,
            shadow,
            peeked,
        } = self.plan(request)?;
        let charges: Vec<Box<dyn Charge + '_>> = enforced
            .iter()
            .map(|check| check.limiter.charge(&check.key, check.cost))
            .collect();
        let limits: Vec<&dyn Charge> = charges.iter().map(|charge| &**charge).collect();
        match tollgate::check_all_slice(&limits) {
            Ok(checked) => {
                let refused = checked.refused;
                let decided = enforced.iter().zip(checked.decisions).enumerate();
                for (position, (check, decision)) in decided {
                    match decision {
                        Some(decision) => {
                            statuses[check.index].decision = Some(decision);
                            statuses[check.index].over_limit = Some(position) == refused;
                        }
                        // After the refusal: not checked, only peeked.
                        None => peeked_status(&mut statuses[check.index], check),
                    }
                }
            }
            // A limit that cannot decide the descriptor (a cost above its
            // burst, which can never be admitted; a new key past the key
            // cap) holds it over its limit; the others are given back.
            Err(AllError { limit, .. }) => {
                for (position, check) in enforced.iter().enumerate() {
                    if position == limit {
                        statuses[check.index].over_limit = true;
                    } else {
                        peeked_status(&mut statuses[check.index], check);
                    }
                }
            }
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
            peeked_status(&mut statuses[check.index], check);
        }
        Ok(statuses)
    }

    /// Matches each descriptor of `request` to its limit, and sorts the
    /// checks: enforced, in shadow mode, and decided without a charge.
    fn plan<D: Descriptor>(&self, request: &Request<'_, D>) -> Result<Plan, DecideError> {
        let rules: Vec<Option<Arc<Rule>>> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                if descriptor.limit().is_some() {
                    None
                } else {
                    self.config.matches(request.domain, descriptor.entries())
                }
            })
            .collect();
        // A rule another matched rule replaces is not applied.
        let replaced: HashSet<&str> = rules
            .iter()
            .flatten()
            .flat_map(|rule| rule.replaces.iter().map(String::as_str))
            .collect();
        let mut plan = Plan {
            statuses: Vec::with_capacity(rules.len()),
            enforced: Vec::new(),
            shadow: Vec::new(),
            peeked: Vec::new(),
        };
        for (index, (descriptor, rule)) in request.descriptors.iter().zip(&rules).enumerate() {
            let rule = rule.clone().filter(|rule| {
                rule.name
                    .as_deref()
                    .is_none_or(|name| !replaced.contains(name))
            });
            let mut status = Status {
                over_limit: false,
                rule: rule.clone(),
                limit: None,
                decision: None,
                shadow_refused: false,
                cost: descriptor.cost(),
            };
            let target = match (descriptor.limit(), &rule) {
                (Some((count, unit)), _) => Some((
                    self.override_limiter(request.domain, count, unit, index)?,
                    count,
                    unit,
                    false,
                )),
                (None, Some(rule)) => rule.limit.map(|limit| {
                    (
                        self.limiters[&rule.path].limiter.clone(),
                        limit.requests_per_unit,
                        limit.unit,
                        rule.shadow_mode,
                    )
                }),
                (None, None) => None,
            };
            if let Some((limiter, count, unit, shadow_mode)) = target {
                status.limit = Some((count, unit));
                let check = ToCharge {
                    index,
                    limiter,
                    key: key_of(descriptor.entries()),
                    cost: u32::try_from(descriptor.cost()).unwrap_or(u32::MAX),
                };
                if check.cost == 0 {
                    plan.peeked.push(check);
                } else if shadow_mode {
                    plan.shadow.push(check);
                } else {
                    plan.enforced.push(check);
                }
            }
            plan.statuses.push(status);
        }
        Ok(plan)
    }

    /// The limiter of a limit a request brings, made on first use.
    fn override_limiter(
        &self,
        domain: &str,
        count: u32,
        unit: Unit,
        descriptor: usize,
    ) -> Result<Arc<dyn RuleLimiter>, DecideError> {
        let mut overrides = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (domain.to_owned(), count, unit);
        if let Some(limiter) = overrides.get(&key) {
            return Ok(limiter.clone());
        }
        if overrides.len() >= OVERRIDES {
            return Err(DecideError::TooManyOverrides);
        }
        let quota = Quota::new(count, unit.span()).map_err(|reason| DecideError::BadLimit {
            descriptor,
            count,
            reason,
        })?;
        let limiter = limiter_of(
            &Limit {
                requests_per_unit: count,
                unit,
                quota,
                algorithm: Algorithm::FixedWindow,
                mode: crate::config::Mode::Exact,
            },
            self.max_keys,
        );
        overrides.insert(key, limiter.clone());
        Ok(limiter)
    }
}

/// Fills `status` with a peek of `check`'s key: decided, not charged.
fn peeked_status(status: &mut Status, check: &ToCharge) {
    match check.limiter.peek(&check.key) {
        Ok(decision) => {
            status.over_limit = !decision.is_allowed();
            status.decision = Some(decision);
        }
        Err(_) => status.over_limit = true,
    }
}

/// A descriptor's key in its rule's limiter: every entry's key and value,
/// each prefixed by its length, so that no two descriptors share one.
fn key_of<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut key = String::new();
    for (name, value) in entries {
        for part in [name, value] {
            key.push_str(&part.len().to_string());
            key.push(':');
            key.push_str(part);
        }
    }
    key
}
