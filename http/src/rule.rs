//! [`Rule`]: one limit of the layer (a name, a limiter, a key, when it
//! applies and what a request costs), type-erased so that limits of
//! different key types and backends sit in one layer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::head::RequestHead;
use http::HeaderValue;
use tollgate::{LayoutError, Quota};

use crate::fields::{RuleJson, is_field_string, limit_prefix, policy_item};
use crate::key::{KeyError, KeyExtractor};
use crate::limit::{Checked, Failure, Limit};
use crate::tiers::{Table, TierError, Tiers};

/// Gives an admission back: the units given back, if it could be (see
/// [`Limit::refund`]).
pub(crate) type Refund = Box<dyn FnOnce() -> Option<u32> + Send>;

/// An admission or a denial, the quota that made it, and for an admission
/// that can be given back, what gives it back.
pub(crate) type Outcome = Result<Checked<Refund>, Failure>;

/// Whether a rule applies to a request.
type Predicate = Box<dyn Fn(&RequestHead<'_>) -> bool + Send + Sync>;

/// What a request costs under a rule.
type CostFn = Box<dyn Fn(&RequestHead<'_>) -> u32 + Send + Sync>;

/// A check waiting for its backend.
pub(crate) type Pending = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// One limit a request is held to: a policy name, a limiter, how to find
/// the request's key, and optionally when the limit applies and what a
/// request costs.
///
/// ```
/// use tollgate::{Quota, RateLimiter};
/// use tollgate_http::{Header, PeerIp, RequestHead, Rule};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // 100 a minute per client network.
/// let per_ip = Rule::new("per-ip", RateLimiter::keyed(Quota::per_minute(100)?), PeerIp::new())?;
/// // Uploads cost by the kilobyte, per API key, on /upload only.
/// let uploads = Rule::new(
///     "upload-kb",
///     RateLimiter::keyed(Quota::per_minute(10_000)?),
///     Header::new(http::HeaderName::from_static("x-api-key")),
/// )?
/// .when(|parts: &RequestHead<'_>| parts.uri().path().starts_with("/upload"))
/// .cost(|parts: &RequestHead<'_>| {
///     let bytes: u64 = parts.headers().get(http::header::CONTENT_LENGTH)
///         .and_then(|value| value.to_str().ok()?.parse().ok())
///         .unwrap_or(0);
///     u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).max(1)
/// });
/// # let _ = (per_ip, uploads);
/// # Ok(())
/// # }
/// ```
pub struct Rule {
    name: Arc<str>,
    /// The limiter's quota ([`Limit::quota`]).
    quota: Quota,
    /// Its `RateLimit-Policy` item, made once.
    policy: HeaderValue,
    /// The start of its `RateLimit` items.
    limit_prefix: String,
    /// Its pieces of a denial's problem body, made once.
    json: RuleJson,
    check: Box<dyn Check>,
    when: Option<Predicate>,
    cost: Option<CostFn>,
    tiers: Option<Table>,
}

/// A policy name that cannot go in a structured field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a policy name must be non-empty printable ASCII (a structured-field String): {0:?}")]
pub struct NameError(String);

impl Rule {
    /// Makes a limit named `name` (the policy's name in `RateLimit-Policy`,
    /// `RateLimit` and the problem's `violated-policies`): each request's
    /// key is found by `key`, and checked against `limiter` with a cost of
    /// one.
    ///
    /// # Errors
    ///
    /// [`NameError`] for an empty name or one with a byte outside printable
    /// ASCII.
    pub fn new<E, L>(name: impl Into<String>, limiter: L, key: E) -> Result<Self, NameError>
    where
        E: KeyExtractor,
        L: Limit<E::Key>,
    {
        let name: String = name.into();
        if name.is_empty() || !is_field_string(&name) {
            return Err(NameError(name));
        }
        let quota = limiter.quota();
        let policy = policy_value(&name, &quota).ok_or_else(|| NameError(name.clone()))?;
        Ok(Self {
            json: RuleJson::new(&name),
            limit_prefix: limit_prefix(&name),
            name: name.into(),
            quota,
            policy,
            check: Box::new(Bound {
                limiter: Arc::new(limiter),
                extractor: key,
            }),
            when: None,
            cost: None,
            tiers: None,
        })
    }

    /// Checks each request's key under the quota of the request's tier
    /// (see [`Tiers`]), and the limiter's own for a request of no listed
    /// tier. `RateLimit-Policy` then advertises, for each response, the
    /// quota that decided it, under the rule's name.
    ///
    /// # Errors
    ///
    /// [`TierError::Layout`] for a tier whose quota the rule's limiter
    /// cannot check its keys under ([`Limit::accepts`]: a window
    /// algorithm's quota of another window, a limiter that takes no quota
    /// but its own), and [`TierError::Duplicate`] for a name listed twice.
    pub fn tiers(mut self, tiers: Tiers) -> Result<Self, TierError> {
        let name = &self.name;
        self.tiers = Some(Table::new(
            tiers,
            |quota| self.check.accepts(quota),
            |quota| policy_value(name, quota),
        )?);
        Ok(self)
    }

    /// Applies the limit only to requests for which `predicate` holds (a
    /// route, a method); by default it applies to every request.
    #[must_use]
    pub fn when(
        mut self,
        predicate: impl Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.when = Some(Box::new(predicate));
        self
    }

    /// Charges each request `cost(request)` units instead of one. A cost of
    /// zero charges nothing and checks nothing; a cost above the quota's
    /// burst is refused at once (no wait could admit it).
    #[must_use]
    pub fn cost(mut self, cost: impl Fn(&RequestHead<'_>) -> u32 + Send + Sync + 'static) -> Self {
        self.cost = Some(Box::new(cost));
        self
    }

    /// Returns the policy's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns this rule's `RateLimit-Policy` item for a decision made by
    /// `quota`: the one made once for the limiter's own or a tier's, else
    /// one made now (a backend's fallback decided).
    pub(crate) fn policy(&self, quota: &Quota) -> Option<HeaderValue> {
        if *quota == self.quota {
            Some(self.policy.clone())
        } else if let Some(policy) = self.tiers.as_ref().and_then(|tiers| tiers.policy(quota)) {
            Some(policy.clone())
        } else {
            policy_value(&self.name, quota)
        }
    }

    /// Returns the start of this rule's `RateLimit` items.
    pub(crate) fn limit_prefix(&self) -> &str {
        &self.limit_prefix
    }

    /// Returns this rule's pieces of a denial's problem body.
    pub(crate) fn json(&self) -> &RuleJson {
        &self.json
    }

    /// Starts checking `request` against this rule, keeping of an
    /// admission what `keep` says.
    #[inline]
    pub(crate) fn start(&self, request: &RequestHead<'_>, keep: Keep) -> Step {
        if self.when.as_ref().is_some_and(|when| !when(request)) {
            return Step::Skip;
        }
        let cost = self.cost.as_ref().map_or(1, |cost| cost(request));
        if cost == 0 {
            return Step::Skip;
        }
        let quota = self.tiers.as_ref().and_then(|tiers| tiers.quota(request));
        self.check.start(request, cost, keep, quota)
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("policy", &self.policy)
            .field("when", &self.when.is_some())
            .field("cost", &self.cost.is_some())
            .field("tiers", &self.tiers.is_some())
            .finish_non_exhaustive()
    }
}

/// Makes the `RateLimit-Policy` item of the policy `name` enforcing `quota`;
/// `None` only for a name that is not printable ASCII, which a rule checks
/// first.
fn policy_value(name: &str, quota: &Quota) -> Option<HeaderValue> {
    HeaderValue::try_from(policy_item(name, quota)).ok()
}

/// What the layer needs of a rule's admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Nothing: no later rule can refuse the request, and no field is
    /// sent on success.
    Nothing,
    /// Its decision, for the fields.
    Decision,
    /// Its decision, and what gives it back: a later rule may refuse the
    /// request.
    Refund,
}

/// Where a rule's check of one request stands.
pub(crate) enum Step {
    /// The rule does not apply, or the request costs nothing.
    Skip,
    /// Admitted, and nothing of the admission is to be kept
    /// ([`Keep::Nothing`]).
    Admitted,
    /// Decided (or failed) without waiting.
    Done(Outcome),
    /// The request has no key for this rule.
    NoKey(KeyError),
    /// Waiting for the backend.
    Pending(Pending),
}

/// A limiter and its key extractor, with their types erased.
trait Check: Send + Sync {
    fn accepts(&self, quota: &Quota) -> Result<(), LayoutError>;

    fn start(
        &self,
        request: &RequestHead<'_>,
        cost: u32,
        keep: Keep,
        quota: Option<&Quota>,
    ) -> Step;
}

struct Bound<L, E> {
    limiter: Arc<L>,
    extractor: E,
}

impl<L, E> Check for Bound<L, E>
where
    E: KeyExtractor,
    L: Limit<E::Key>,
{
    fn accepts(&self, quota: &Quota) -> Result<(), LayoutError> {
        self.limiter.accepts(quota)
    }

    fn start(
        &self,
        request: &RequestHead<'_>,
        cost: u32,
        keep: Keep,
        quota: Option<&Quota>,
    ) -> Step {
        let key = match self.extractor.extract(request) {
            Ok(key) => key,
            Err(error) => return Step::NoKey(error),
        };
        let refundable = keep == Keep::Refund;
        let decided = if refundable {
            self.limiter.check_now(&key, cost, quota)
        } else {
            self.limiter.check_now_without_receipt(&key, cost, quota)
        };
        if let Some(decided) = decided {
            if keep == Keep::Nothing
                && matches!(&decided, Ok(checked) if checked.decision.is_allowed())
            {
                return Step::Admitted;
            }
            return Step::Done(
                decided.map(|checked| with_refund(&self.limiter, key, cost, checked, refundable)),
            );
        }
        let limiter = Arc::clone(&self.limiter);
        let quota = quota.copied();
        Step::Pending(Box::pin(async move {
            let checked = if refundable {
                limiter.check_n(&key, cost, quota.as_ref()).await?
            } else {
                limiter
                    .check_n_without_receipt(&key, cost, quota.as_ref())
                    .await?
            };
            Ok(with_refund(&limiter, key, cost, checked, refundable))
        }))
    }
}

/// Returns the decision and its quota, and when asked for, what gives its
/// admission back.
fn with_refund<K, L>(
    limiter: &Arc<L>,
    key: K,
    cost: u32,
    checked: Checked<L::Receipt>,
    refundable: bool,
) -> Checked<Refund>
where
    K: Send + Sync + 'static,
    L: Limit<K>,
{
    let receipt = match checked.receipt {
        Some(receipt) if refundable => {
            let limiter = Arc::clone(limiter);
            // Only a full refund brings the decision's units back in the
            // fields; a partial one leaves them as they were (fewer than
            // the key may have).
            Some(Box::new(move || {
                (limiter.refund(&key, receipt) == tollgate::algorithm::Refund::Full).then_some(cost)
            }) as Refund)
        }
        _ => None,
    };
    Checked {
        decision: checked.decision,
        quota: checked.quota,
        receipt,
    }
}
