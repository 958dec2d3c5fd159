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
    /// The keys held.
    fn len(&self) -> usize;
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

    fn len(&self) -> usize {
        RateLimiter::len(self)
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

/// What bounds the limiters clients can fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// The keys each limiter holds at most: a descriptor that would add a
    /// key past them is over its limit (the keys held keep working).
    pub max_keys: NonZeroUsize,
    /// The limiters of limits descriptors bring themselves (a count and a
    /// unit each, per configured domain) the service holds at most: a
    /// descriptor bringing another, when none of them is idle, is over its
    /// limit.
    pub max_overrides: usize,
}

/// A configuration's limiters: one per limited rule, by the rule's path.
#[derive(Debug)]
pub struct Limits {
    config: Config,
    capacity: Capacity,
    limiters: HashMap<String, Held>,
    /// Limiters of the limits requests bring themselves.
    overrides: Arc<Mutex<Overrides>>,
    /// Rules whose limit changed but whose keys could not be carried yet
    /// (a stalled check held the store): they decide by their old limit
    /// until a later reload carries them.
    pending: Vec<String>,
}

/// The limiters of limits requests bring, by domain, count and unit.
type Overrides = HashMap<(String, u32, Unit), Arc<dyn RuleLimiter>>;

/// A rule's limiter and the limit it enforces (which a pending change can
/// leave behind the rule's configured one).
#[derive(Debug, Clone)]
struct Held {
    limit: Limit,
    limiter: Arc<dyn RuleLimiter>,
}

/// What a reload did to a rule that existed before it with a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// Its limit changed, and every key was carried.
    Carried(String),
    /// It starts fresh: its algorithm, or its window, changed (a window
    /// algorithm's counts mean nothing in windows of another length).
    Fresh(String, String),
    /// Its keys could not be carried now (a check stalled in the store):
    /// it keeps deciding by its old limit, and the next reload tries again.
    Pending(String),
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
    /// The units it costs (0: decided, not charged, never refused).
    fn cost(&self) -> u64;
    /// The limit it brings itself, if any: a count (at least 1) a unit.
    fn limit(&self) -> Option<(u32, Unit)>;
}

/// What one descriptor got.
#[derive(Debug, Clone)]
pub struct Status {
    /// Whether it is over its limit (never for a rule in shadow mode, nor
    /// for a descriptor of cost 0).
    pub over_limit: bool,
    /// The rule that decided it, if any (none: no rule matched, the rule
    /// is unlimited or replaced, or the descriptor brought its limit).
    pub rule: Option<Arc<Rule>>,
    /// The limit it was held to: a count a unit, and the quota.
    pub limit: Option<(u32, Unit, Quota)>,
    /// The decision, if a limit decided it.
    pub decision: Option<Decision>,
    /// A rule in shadow mode that would have refused it.
    pub shadow_refused: bool,
    /// The units it cost (0: decided, not charged).
    pub cost: u64,
}

/// A descriptor to check: its index, limiter, key and cost.
struct ToCharge {
    index: usize,
    limiter: Arc<dyn RuleLimiter>,
    key: String,
    cost: u32,
}

/// A request's descriptors matched and sorted, before any is charged.
struct Plan {
    statuses: Vec<Status>,
    /// Charged all or nothing.
    enforced: Vec<ToCharge>,
    /// Charged each on its own, never refusing.
    shadow: Vec<ToCharge>,
    /// Decided without a charge (cost 0), never refusing.
    peeked: Vec<ToCharge>,
    /// A descriptor over its limit before any check (its limiter could not
    /// be made): nothing is charged.
    blocked: bool,
}

impl Limits {
    /// The limiters of `config`, every rule fresh.
    #[must_use]
    pub fn new(config: Config, capacity: Capacity) -> Self {
        let limiters = config
            .rules()
            .filter_map(|rule| {
                let limit = rule.limit?;
                let limiter = limiter_of(&limit, capacity.max_keys);
                Some((rule.path.clone(), Held { limit, limiter }))
            })
            .collect();
        Limits {
            config,
            capacity,
            limiters,
            overrides: Arc::default(),
            pending: Vec::new(),
        }
    }

    /// The limiters of `config`, keeping every rule of `self` at the same
    /// path: its keys as they are if its limit is the same, carried by
    /// `carry` if the limit changed, fresh if the algorithm or a window
    /// algorithm's window changed. Returns what happened to each rule that
    /// changed.
    #[must_use]
    pub fn reload(&self, config: Config, carry: Carry) -> (Self, Vec<Reloaded>) {
        let mut report = Vec::new();
        let mut pending = Vec::new();
        let limiters = config
            .rules()
            .filter_map(|rule| {
                let limit = rule.limit?;
                let path = rule.path.clone();
                let Some(held) = self.limiters.get(&path) else {
                    let limiter = limiter_of(&limit, self.capacity.max_keys);
                    return Some((path, Held { limit, limiter }));
                };
                if held.limit.algorithm != limit.algorithm {
                    report.push(Reloaded::Fresh(
                        path.clone(),
                        "its algorithm changed".into(),
                    ));
                    let limiter = limiter_of(&limit, self.capacity.max_keys);
                    return Some((path, Held { limit, limiter }));
                }
                if held.limit.quota == limit.quota {
                    return Some((
                        path,
                        Held {
                            limit,
                            ..held.clone()
                        },
                    ));
                }
                match held.limiter.change(limit.quota, carry) {
                    Ok(()) => {
                        report.push(Reloaded::Carried(path.clone()));
                        Some((
                            path,
                            Held {
                                limit,
                                ..held.clone()
                            },
                        ))
                    }
                    Err(ChangeError::Reclaiming) => {
                        report.push(Reloaded::Pending(path.clone()));
                        pending.push(path.clone());
                        Some((path, held.clone()))
                    }
                    Err(refused) => {
                        report.push(Reloaded::Fresh(path.clone(), refused.to_string()));
                        let limiter = limiter_of(&limit, self.capacity.max_keys);
                        Some((path, Held { limit, limiter }))
                    }
                }
            })
            .collect();
        let limits = Limits {
            config,
            capacity: self.capacity,
            limiters,
            overrides: self.overrides.clone(),
            pending,
        };
        (limits, report)
    }

    /// Whether a rule's change is still to be carried (a reload of the
    /// same configuration tries again).
    #[must_use]
    pub fn pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Removes every limiter's idle keys, and the limiters of limits
    /// requests brought that hold no key; returns the keys removed.
    pub fn evict_idle(&self) -> usize {
        let evicted: usize = self
            .limiters
            .values()
            .map(|held| held.limiter.evict_idle())
            .sum();
        let mut overrides = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        evicted + drop_idle(&mut overrides)
    }

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

    /// Matches each descriptor of `request` to its limit, and sorts the
    /// checks: enforced, in shadow mode, and decided without a charge.
    fn plan<D: Descriptor>(&self, request: &Request<'_, D>) -> Plan {
        let configured = self.config.has_domain(request.domain);
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
            blocked: false,
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
            // The limiter, its limit, and whether it only watches.
            let target = match (descriptor.limit(), &rule) {
                // An unknown domain has no limits, brought ones included.
                (Some(_), _) if !configured => None,
                (Some((count, unit)), _) => match Quota::new(count, unit.span()) {
                    Ok(quota) => {
                        status.limit = Some((count, unit, quota));
                        let limiter = self.override_limiter(request.domain, count, unit, quota);
                        if limiter.is_none() {
                            // No room for its limiter: over its limit, and
                            // nothing of the request is charged.
                            status.over_limit = descriptor.cost() > 0;
                            plan.blocked |= status.over_limit;
                        }
                        limiter.map(|limiter| (limiter, false))
                    }
                    // Refused before deciding (a count of 0).
                    Err(_) => None,
                },
                (None, Some(rule)) => rule.limit.map(|_| {
                    let held = &self.limiters[&rule.path];
                    let limit = held.limit;
                    status.limit = Some((limit.requests_per_unit, limit.unit, limit.quota));
                    (held.limiter.clone(), rule.shadow_mode)
                }),
                (None, None) => None,
            };
            if let Some((limiter, shadow_mode)) = target {
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
        plan
    }

    /// The limiter of a limit a request brings in a configured domain,
    /// made on first use; `None` when the service holds its most such
    /// limiters and none of them holds no key.
    fn override_limiter(
        &self,
        domain: &str,
        count: u32,
        unit: Unit,
        quota: Quota,
    ) -> Option<Arc<dyn RuleLimiter>> {
        let mut overrides = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (domain.to_owned(), count, unit);
        if let Some(limiter) = overrides.get(&key) {
            return Some(limiter.clone());
        }
        if overrides.len() >= self.capacity.max_overrides {
            drop_idle(&mut overrides);
            if overrides.len() >= self.capacity.max_overrides {
                return None;
            }
        }
        let limiter = limiter_of(
            &Limit {
                requests_per_unit: count,
                unit,
                quota,
                algorithm: Algorithm::FixedWindow,
                mode: crate::config::Mode::Exact,
            },
            self.capacity.max_keys,
        );
        overrides.insert(key, limiter.clone());
        Some(limiter)
    }
}

/// Charges `enforced` all or nothing into `statuses`.
fn charge_all(statuses: &mut [Status], enforced: &[ToCharge]) {
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

/// Evicts every override limiter's idle keys and drops the limiters left
/// holding none; returns the keys evicted.
fn drop_idle(overrides: &mut Overrides) -> usize {
    let mut evicted = 0;
    overrides.retain(|_, limiter| {
        evicted += limiter.evict_idle();
        limiter.len() > 0
    });
    evicted
}

/// Fills `status` with a peek of `check`'s key: its decision as it stands,
/// charging nothing (whether it is over its limit is the caller's).
fn peek_into(status: &mut Status, check: &ToCharge) {
    if let Ok(decision) = check.limiter.peek(&check.key) {
        status.decision = Some(decision);
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

/// The bytes of the key the service keeps for a descriptor of `entries`
/// (each key and value with its length written before it: `3:key5:value`),
/// which a request's bounds limit.
pub fn key_len<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> usize {
    entries
        .flat_map(|(name, value)| [name.len(), value.len()])
        .map(|len| len.to_string().len() + 1 + len)
        .sum()
}
