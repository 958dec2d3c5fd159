//! [`RateLimitLayer`] and its [`Builder`]: the rules a request is held
//! to, and what the layer does besides checking them.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use crate::rule::Rule;
use crate::service::RateLimit;

/// What the layer does when a limiter cannot decide (its backend is down
/// and its own failure policy gave up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnUnavailable {
    /// Refuse the request: 503 with the draft's temporary-reduced-capacity
    /// problem and `Retry-After: 1` (gRPC: `UNAVAILABLE`). The default.
    #[default]
    Refuse,
    /// Let the request through, unlimited by that rule. This covers every
    /// [`Failure::Unavailable`](crate::Failure::Unavailable), in-process
    /// rules' included: a new key their lock-free store refuses while a
    /// check stalled inside it holds back reclamation
    /// ([`CheckError::Reclaiming`](tollgate::CheckError::Reclaiming)) then
    /// passes uncounted for as long as the stall lasts. Choose it to ride
    /// out a backend's outage only where that is acceptable.
    Allow,
}

/// A tower [`Layer`] that holds every request to its [`Rule`]s, in front
/// of any HTTP or gRPC service (axum, hyper, tonic).
///
/// Its service answers with the inner service's body type, which must be
/// a [`RefusalBody`](crate::RefusalBody) so that refusals can be written in
/// it: axum's `Body` (feature `axum`) and tonic's (feature `tonic`) are;
/// wrap any other in a [`LimitBody`](crate::LimitBody).
///
/// Each request is checked against every rule that applies to it, in the
/// order the rules were added. The first refusal answers the request,
/// which goes no further: the rules after it are not checked (nor
/// charged), and the admissions of the rules before it are given back as
/// far as that cannot admit more than their quotas (in process, see
/// [`Limit::refund`](crate::Limit::refund): in full for the window
/// algorithms; for GCRA and the token bucket in full, or, when other
/// requests were admitted on the same key since, all but the time elapsed
/// since). Requests checked meanwhile may see the charge and be refused
/// (over-denial, never over-admission): put the most specific limits (per
/// key, per user) before the shared ones, so that what they refuse never
/// reaches the shared budget. The same holds for a request dropped while
/// a limit waits for its backend.
///
/// A refusal is a 429 with `Retry-After` in whole seconds rounded up
/// (never 0), the `RateLimit-Policy` and `RateLimit` fields of
/// draft-ietf-httpapi-ratelimit-headers-11, and an RFC 9457
/// `application/problem+json` body of the draft's quota-exceeded type
/// naming the `violated-policies`. A gRPC request (`content-type:
/// application/grpc…`) gets `RESOURCE_EXHAUSTED` instead, with the wait in
/// a `google.rpc.RetryInfo`. An admitted request's response carries the
/// two fields too, unless [`fields_on_success`](Builder::fields_on_success)
/// turns that off.
///
/// ```
/// use tollgate::{Quota, RateLimiter};
/// use tollgate_http::{PeerIp, RateLimitLayer, Rule};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("per-ip", RateLimiter::keyed(Quota::per_minute(100)?), PeerIp::new())?)
///     .build();
/// // axum: Router::new().route(...).layer(layer)
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

/// Builds a [`RateLimitLayer`].
pub struct Builder {
    config: Config,
}

/// What every service of one layer shares.
pub(crate) struct Config {
    pub(crate) rules: Vec<Rule>,
    pub(crate) fields_on_success: bool,
    pub(crate) on_unavailable: OnUnavailable,
}

impl RateLimitLayer {
    /// Starts building a layer with no rules yet, answering with the
    /// fields on success and refusing when a limiter cannot decide.
    #[must_use]
    pub fn builder() -> Builder {
        Builder {
            config: Config {
                rules: Vec::new(),
                fields_on_success: true,
                on_unavailable: OnUnavailable::Refuse,
            },
        }
    }
}

impl Builder {
    /// Adds a rule, checked after those added before it.
    #[must_use]
    pub fn rule(mut self, rule: Rule) -> Self {
        self.config.rules.push(rule);
        self
    }

    /// Sets whether admitted requests' responses carry `RateLimit-Policy`
    /// and `RateLimit` (true by default).
    #[must_use]
    pub fn fields_on_success(mut self, send: bool) -> Self {
        self.config.fields_on_success = send;
        self
    }

    /// Sets what to do when a limiter cannot decide.
    #[must_use]
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Self {
        self.config.on_unavailable = policy;
        self
    }

    /// Builds the layer.
    #[must_use]
    pub fn build(self) -> RateLimitLayer {
        RateLimitLayer {
            config: Arc::new(self.config),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, Arc::clone(&self.config))
    }
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.config.rules)
            .field("fields_on_success", &self.config.fields_on_success)
            .field("on_unavailable", &self.config.on_unavailable)
            .finish()
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("rules", &self.config.rules)
            .finish_non_exhaustive()
    }
}
