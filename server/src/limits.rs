//! Deciding a request: a limiter per rule, kept across reloads, on a
//! backend (in memory or on Redis), and a request's descriptors matched to
//! the rules before they are decided all or nothing.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use tollgate::algorithm::Carry;
use tollgate::{Decision, Quota};

use crate::config::{Algorithm, Config, Limit, Rule, Unit};

/// What makes each rule's limiter, and what a reload can do with one: in
/// memory ([`crate::memory::Memory`]) or on Redis ([`crate::remote::Redis`]).
pub trait Backend: fmt::Debug + Send + Sync + 'static {
    /// A rule's limiter, shared by the requests deciding on it.
    type Limiter: Clone + fmt::Debug + Send + Sync;

    /// A limiter enforcing `limit`, holding at most `max_keys` keys in
    /// this process, named `name` (a rule's path, or for a limit requests
    /// bring, its domain, count and unit): what a Redis backend's keys
    /// are placed by.
    ///
    /// # Errors
    ///
    /// Why the backend cannot enforce `limit` (a quota Redis's script
    /// cannot hold, a failure policy's share too small).
    fn limiter(
        &self,
        name: &Name<'_>,
        limit: &Limit,
        max_keys: NonZeroUsize,
    ) -> Result<Self::Limiter, String>;

    /// Changes `limiter`'s quota, each key carried by `carry`.
    ///
    /// # Errors
    ///
    /// [`Refused::Later`] when it must be tried again, [`Refused::Never`]
    /// when the change cannot be carried (the rule then starts fresh).
    fn change(limiter: &Self::Limiter, quota: Quota, carry: Carry) -> Result<(), Refused>;

    /// A limiter to take over from `held` (made for `old`) when it cannot
    /// take `new` in place, or `None` when it can (its quota then changed
    /// by [`Backend::change`]). The algorithm is the same. In memory,
    /// always `None`; on Redis, a new limiter for a new mode, on the same
    /// keys, carrying them by `carry` when the quota changed too.
    ///
    /// # Errors
    ///
    /// Why the backend cannot enforce `new`.
    fn remade(
        &self,
        _held: &Self::Limiter,
        _path: &str,
        _change: (&Limit, &Limit, Carry),
        _max_keys: NonZeroUsize,
    ) -> Option<Result<Self::Limiter, String>> {
        None
    }

    /// Removes the keys of `limiter` that decide as absent ones; returns
    /// how many.
    fn evict_idle(limiter: &Self::Limiter) -> usize;

    /// Whether `limiter` holds anything a new one would not (a limiter of
    /// a limit requests bring is dropped when it holds nothing).
    fn holds_state(&self, limiter: &Self::Limiter) -> bool;
}

/// Why a rule's change of limit was not carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not now (a check stalled in the store): the old limit decides until
    /// it is tried again.
    Later,
    /// Never: the rule's keys start fresh, for this reason.
    Never(String),
}

/// What a limiter is for: a rule, or a limit requests bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name<'a> {
    /// The rule of this path.
    Rule(&'a str),
    /// A limit requests in `domain` bring: `count` a `unit`.
    Brought {
        /// The domain.
        domain: &'a str,
        /// The requests a unit.
        count: u32,
        /// The unit.
        unit: Unit,
    },
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

/// A configuration's limiters on backend `B`: one per limited rule, by the
/// rule's path.
#[derive(Debug)]
pub struct Limits<B: Backend> {
    config: Config,
    backend: Arc<B>,
    capacity: Capacity,
    limiters: HashMap<String, Held<B::Limiter>>,
    /// Limiters of the limits requests bring themselves.
    overrides: Arc<Mutex<Overrides<B::Limiter>>>,
    /// Rules whose limit changed but whose keys could not be carried yet
    /// (a stalled check held the store): they decide by their old limit
    /// until a later reload carries them.
    pending: Vec<String>,
}

/// The limiters of limits requests bring, by domain, count and unit.
type Overrides<L> = HashMap<(String, u32, Unit), L>;

/// A rule's limiter and the limit it enforces (which a pending change can
/// leave behind the rule's configured one).
#[derive(Debug, Clone)]
struct Held<L> {
    limit: Limit,
    limiter: L,
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
    /// Its mode changed: a new limiter on the same keys in Redis, which
    /// carries them if its limit changed too.
    Remade(String),
}

/// A rule the backend cannot enforce: the configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {path}: {reason}")]
pub struct Unenforceable {
    /// Where the rule is configured.
    pub origin: String,
    /// The rule's path.
    pub path: String,
    /// Why.
    pub reason: String,
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
pub(crate) struct ToCharge<L> {
    pub(crate) index: usize,
    pub(crate) limiter: L,
    pub(crate) key: String,
    pub(crate) cost: u32,
}

/// A request's descriptors matched and sorted, before any is charged.
pub(crate) struct Plan<L> {
    pub(crate) statuses: Vec<Status>,
    /// Charged all or nothing.
    pub(crate) enforced: Vec<ToCharge<L>>,
    /// Charged each on its own, never refusing.
    pub(crate) shadow: Vec<ToCharge<L>>,
    /// Decided without a charge (cost 0), never refusing.
    pub(crate) peeked: Vec<ToCharge<L>>,
    /// A descriptor over its limit before any check (its limiter could not
    /// be made): nothing is charged.
    pub(crate) blocked: bool,
}

impl<B: Backend> Limits<B> {
    /// The limiters of `config` on `backend`, every rule fresh.
    ///
    /// # Errors
    ///
    /// The first rule `backend` cannot enforce.
    pub fn new(config: Config, backend: B, capacity: Capacity) -> Result<Self, Unenforceable> {
        let backend = Arc::new(backend);
        let limiters = config
            .rules()
            .filter_map(|rule| {
                let limit = rule.limit?;
                Some(
                    made(&*backend, rule, &limit, capacity)
                        .map(|limiter| (rule.path.clone(), Held { limit, limiter })),
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(Limits {
            config,
            backend,
            capacity,
            limiters,
            overrides: Arc::default(),
            pending: Vec::new(),
        })
    }

    /// The limiters of `config`, keeping every rule of `self` at the same
    /// path: its keys as they are if its limit is the same, carried by
    /// `carry` if the limit changed, fresh if the algorithm or a window
    /// algorithm's window changed. Returns what happened to each rule that
    /// changed.
    ///
    /// # Errors
    ///
    /// The first rule the backend cannot enforce: nothing changed then
    /// (no limiter of `self` was changed either).
    pub fn reload(
        &self,
        config: Config,
        carry: Carry,
    ) -> Result<(Self, Vec<Reloaded>), Unenforceable> {
        // Every limiter a rule may need first, so that a configuration
        // refused changes nothing: a new rule's, and for a changed limit,
        // the one it starts fresh on if its keys cannot be carried.
        let mut made_now = HashMap::new();
        let mut remade = HashMap::new();
        for rule in config.rules() {
            let Some(limit) = rule.limit else { continue };
            let kept = self
                .limiters
                .get(&rule.path)
                .filter(|held| held.limit.algorithm == limit.algorithm);
            let taken_over = kept.and_then(|held| {
                self.backend.remade(
                    &held.limiter,
                    &rule.path,
                    (&held.limit, &limit, carry),
                    self.capacity.max_keys,
                )
            });
            if let Some(limiter) = taken_over {
                let limiter = limiter.map_err(|reason| unenforceable(rule, reason))?;
                remade.insert(rule.path.clone(), limiter);
            } else if kept.is_none_or(|held| held.limit.quota != limit.quota) {
                made_now.insert(
                    rule.path.clone(),
                    made(&*self.backend, rule, &limit, self.capacity)?,
                );
            }
        }
        let mut report = Vec::new();
        let mut pending = Vec::new();
        let mut limiters = HashMap::new();
        for rule in config.rules() {
            let Some(limit) = rule.limit else { continue };
            let path = rule.path.clone();
            if let Some(limiter) = remade.remove(&path) {
                report.push(Reloaded::Remade(path.clone()));
                limiters.insert(path, Held { limit, limiter });
                continue;
            }
            let fresh = made_now.remove(&path);
            let held = match (self.limiters.get(&path), fresh) {
                (None, Some(limiter)) => Held { limit, limiter },
                (Some(held), Some(limiter)) if held.limit.algorithm != limit.algorithm => {
                    report.push(Reloaded::Fresh(
                        path.clone(),
                        "its algorithm changed".into(),
                    ));
                    Held { limit, limiter }
                }
                (Some(held), Some(limiter)) => match B::change(&held.limiter, limit.quota, carry) {
                    Ok(()) => {
                        report.push(Reloaded::Carried(path.clone()));
                        Held {
                            limit,
                            ..held.clone()
                        }
                    }
                    Err(Refused::Later) => {
                        report.push(Reloaded::Pending(path.clone()));
                        pending.push(path.clone());
                        held.clone()
                    }
                    Err(Refused::Never(reason)) => {
                        report.push(Reloaded::Fresh(path.clone(), reason));
                        Held { limit, limiter }
                    }
                },
                (Some(held), None) => Held {
                    limit,
                    ..held.clone()
                },
                (None, None) => continue,
            };
            limiters.insert(path, held);
        }
        let limits = Limits {
            config,
            backend: self.backend.clone(),
            capacity: self.capacity,
            limiters,
            overrides: self.overrides.clone(),
            pending,
        };
        Ok((limits, report))
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

    /// The backend.
    #[must_use]
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Every rule's limiter, by path.
    pub fn limiters(&self) -> impl Iterator<Item = (&str, &B::Limiter)> {
        self.limiters
            .iter()
            .map(|(path, held)| (path.as_str(), &held.limiter))
    }

    /// Removes every limiter's idle keys, and the limiters of limits
    /// requests brought that hold nothing; returns the keys removed.
    pub fn evict_idle(&self) -> usize {
        let evicted: usize = self
            .limiters
            .values()
            .map(|held| B::evict_idle(&held.limiter))
            .sum();
        let mut overrides = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        evicted + drop_idle(&*self.backend, &mut overrides)
    }

    /// Matches each descriptor of `request` to its limit, and sorts the
    /// checks: enforced, in shadow mode, and decided without a charge.
    pub(crate) fn plan<D: Descriptor>(&self, request: &Request<'_, D>) -> Plan<B::Limiter> {
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
                            // No room for its limiter, or a limit the
                            // backend cannot enforce: over its limit, and
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
    /// limiters and all of them hold state, or when the backend cannot
    /// enforce the limit.
    fn override_limiter(
        &self,
        domain: &str,
        count: u32,
        unit: Unit,
        quota: Quota,
    ) -> Option<B::Limiter> {
        let mut overrides = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (domain.to_owned(), count, unit);
        if let Some(limiter) = overrides.get(&key) {
            return Some(limiter.clone());
        }
        if overrides.len() >= self.capacity.max_overrides {
            drop_idle(&*self.backend, &mut overrides);
            if overrides.len() >= self.capacity.max_overrides {
                return None;
            }
        }
        let limit = Limit {
            requests_per_unit: count,
            unit,
            quota,
            algorithm: Algorithm::FixedWindow,
            mode: crate::config::Mode::Exact,
        };
        let name = Name::Brought {
            domain,
            count,
            unit,
        };
        let limiter = self
            .backend
            .limiter(&name, &limit, self.capacity.max_keys)
            .ok()?;
        overrides.insert(key, limiter.clone());
        Some(limiter)
    }
}

/// A rule's limiter on `backend`, or why it cannot have one.
fn made<B: Backend>(
    backend: &B,
    rule: &Rule,
    limit: &Limit,
    capacity: Capacity,
) -> Result<B::Limiter, Unenforceable> {
    backend
        .limiter(&Name::Rule(&rule.path), limit, capacity.max_keys)
        .map_err(|reason| unenforceable(rule, reason))
}

/// `rule`, which the backend cannot enforce for `reason`.
fn unenforceable(rule: &Rule, reason: String) -> Unenforceable {
    Unenforceable {
        origin: rule.origin.to_string(),
        path: rule.path.clone(),
        reason,
    }
}

/// Evicts every override limiter's idle keys and drops the limiters left
/// holding nothing; returns the keys evicted.
fn drop_idle<B: Backend>(backend: &B, overrides: &mut Overrides<B::Limiter>) -> usize {
    let mut evicted = 0;
    overrides.retain(|_, limiter| {
        evicted += B::evict_idle(limiter);
        backend.holds_state(limiter)
    });
    evicted
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
