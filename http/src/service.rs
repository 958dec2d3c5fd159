//! [`RateLimitLayer`] → [`RateLimit`] (the service) → [`ResponseFuture`],
//! and [`LimitBody`], the body of a response that is either the inner
//! service's or the layer's own refusal.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate::{Decision, Quota};
use tower_layer::Layer;
use tower_service::Service;

use crate::fields::{
    QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY, exhausted_problem, limit_item, problem,
    push_decimal, whole_seconds_up,
};
use crate::grpc;
use crate::head::RequestHead;
use crate::key::KeyError;
use crate::limit::Failure;
use crate::rule::{Outcome, Pending, Refund, Rule, Step};

/// The `RateLimit-Policy` field.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

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
/// Each request is checked against every rule that applies to it, in the
/// order the rules were added. The first refusal answers the request,
/// which goes no further: the rules after it are not checked (nor
/// charged), and the admissions of the rules before it are given back
/// where that cannot admit more than their quotas, that is, where nothing
/// else was admitted on the same key since (in process, for GCRA limits;
/// see [`Limit::refund`](crate::Limit::refund)). A key shared by many
/// requests at once (a [`Global`](crate::Global) limit under load) is
/// rarely left untouched for that long: put the most specific limits
/// (per key, per user) before the shared ones, so that what they refuse
/// never reaches the shared budget. The same holds for a request dropped
/// while a limit waits for its backend.
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

struct Config {
    rules: Vec<Rule>,
    fields_on_success: bool,
    on_unavailable: OnUnavailable,
}

impl RateLimitLayer {
    /// A layer with no rules yet, answering with the fields on success and
    /// refusing when a limiter cannot decide.
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

    /// Whether admitted requests' responses carry `RateLimit-Policy` and
    /// `RateLimit` (true by default).
    #[must_use]
    pub fn fields_on_success(mut self, send: bool) -> Self {
        self.config.fields_on_success = send;
        self
    }

    /// What to do when a limiter cannot decide.
    #[must_use]
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Self {
        self.config.on_unavailable = policy;
        self
    }

    /// The layer.
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
        RateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    config: Arc<Config>,
}

/// A short list whose first item needs no allocation: most layers have
/// one rule, and a request through them allocates nothing for it.
struct Few<T> {
    first: Option<T>,
    rest: Vec<T>,
}

impl<T> Few<T> {
    const fn new() -> Self {
        Self {
            first: None,
            rest: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    fn push(&mut self, item: T) {
        if self.first.is_none() {
            self.first = Some(item);
        } else {
            self.rest.push(item);
        }
    }

    fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        match index.checked_sub(1) {
            None => self.first.as_mut(),
            Some(rest) => self.rest.get_mut(rest),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.first.iter().chain(&self.rest)
    }

    fn into_iter(self) -> impl Iterator<Item = T> {
        self.first.into_iter().chain(self.rest)
    }
}

/// A rule's decision, and the quota that made it.
struct RuleDecision {
    /// The rule's index.
    rule: usize,
    decision: Decision,
    /// `None`: no quota counted the request, and the fields leave the rule
    /// out.
    quota: Option<Quota>,
}

/// The decisions of the rules a request has passed so far.
struct Passed {
    decisions: Few<RuleDecision>,
    /// What gives back the admissions that can be, should a later rule
    /// refuse the request, by their place in `decisions`.
    refunds: Vec<(usize, Refund)>,
}

/// Why a request is refused.
enum Refusal {
    Denied(RuleDecision),
    Failed(usize, Failure),
    NoKey(KeyError),
}

impl Passed {
    const fn new() -> Self {
        Self {
            decisions: Few::new(),
            refunds: Vec::new(),
        }
    }

    /// Records rule `index`'s outcome; a refusal ends the checks.
    fn record(&mut self, config: &Config, index: usize, outcome: Outcome) -> Result<(), Refusal> {
        let refusal = match outcome {
            Ok(checked) => {
                let decided = RuleDecision {
                    rule: index,
                    decision: checked.decision,
                    quota: checked.quota,
                };
                if decided.decision.is_allowed() {
                    if let Some(refund) = checked.receipt {
                        self.refunds.push((self.decisions.len(), refund));
                    }
                    self.decisions.push(decided);
                    return Ok(());
                }
                Refusal::Denied(decided)
            }
            Err(Failure::Unavailable(_)) if config.on_unavailable == OnUnavailable::Allow => {
                return Ok(());
            }
            Err(failure) => Refusal::Failed(index, failure),
        };
        self.refund_all();
        Err(refusal)
    }

    /// Gives back every admission that can be: the request is refused.
    /// A rule's `RateLimit` item then counts the units given back; an
    /// admission another request followed stays charged (giving it back
    /// could admit more than the quota), and its item says so.
    fn refund_all(&mut self) {
        for (place, refund) in self.refunds.drain(..).rev() {
            let Some(units) = refund() else {
                continue;
            };
            let Some(RuleDecision { decision, .. }) = self.decisions.get_mut(place) else {
                continue;
            };
            // The reset time stays as it was: never earlier than the truth.
            if let Some(restored) = Decision::from_parts(
                decision.limit(),
                decision
                    .remaining()
                    .saturating_add(units)
                    .min(decision.limit()),
                decision.retry_after(),
                decision.reset_after(),
            ) {
                *decision = restored;
            }
        }
    }

    /// The two fields for these decisions (and `extra`, a refusing one):
    /// one line of each a rule, which a client reads as one list per field
    /// (a structured-field list may be split over several lines). Each
    /// rule's policy is the quota that made its decision; a decision no
    /// quota made has no lines.
    fn fields(&self, config: &Config, extra: Option<&RuleDecision>) -> Option<Fields> {
        thread_local! {
            // Where each `RateLimit` item is written before it is copied
            // into its header value: no allocation of its own a request.
            static ITEM: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        let mut fields = Few::new();
        for decided in self.decisions.iter().chain(extra) {
            let Some(quota) = &decided.quota else {
                continue;
            };
            let rule = &config.rules[decided.rule];
            let policy = rule.policy(quota)?;
            let limit = ITEM.with(|item| {
                let mut item = item.borrow_mut();
                item.clear();
                limit_item(&mut item, rule.name(), &decided.decision);
                // Printable ASCII (names are checked when a rule is made).
                HeaderValue::from_str(&item).ok()
            })?;
            fields.push((policy, limit));
        }
        (fields.len() > 0).then_some(Fields(fields))
    }
}

/// A request dropped before it went through (its client gone, a timeout
/// while a limit waited for its backend) gives its admissions back, as a
/// refused one does.
impl Drop for Passed {
    fn drop(&mut self) {
        self.refund_all();
    }
}

/// `RateLimit-Policy` and `RateLimit` lines, ready to add to a response.
struct Fields(Few<(HeaderValue, HeaderValue)>);

impl Fields {
    fn add_to(self, headers: &mut http::HeaderMap) {
        // Appended: an inner layer's items stay, and one list is read from
        // every line of a field.
        for (policy, limit) in self.0.into_iter() {
            headers.append(RATELIMIT_POLICY, policy);
            headers.append(RATELIMIT, limit);
        }
    }
}

/// Where a request stands after the checks that could be decided at once.
enum Checked<B> {
    /// Every applicable rule admitted it: call the inner service.
    Admitted(Option<Fields>),
    /// Refused: this is the answer.
    Refused(Response<LimitBody<B>>),
    /// Rule `index` waits for its backend.
    Waiting(usize, Pending),
}

impl Config {
    /// Runs the rules from `first` on, until one must wait, one refuses, or
    /// all are done.
    fn run<B>(&self, request: &RequestHead<'_>, passed: &mut Passed, first: usize) -> Checked<B> {
        for (index, rule) in self.rules.iter().enumerate().skip(first) {
            let refundable = index + 1 < self.rules.len();
            let outcome = match rule.start(request, refundable) {
                Step::Skip => continue,
                Step::Done(outcome) => outcome,
                Step::NoKey(error) => {
                    passed.refund_all();
                    return Checked::Refused(self.refuse(request, passed, &Refusal::NoKey(error)));
                }
                Step::Pending(pending) => return Checked::Waiting(index, pending),
            };
            if let Err(refusal) = passed.record(self, index, outcome) {
                return Checked::Refused(self.refuse(request, passed, &refusal));
            }
        }
        // Through: the admissions stand.
        passed.refunds.clear();
        let fields = if self.fields_on_success {
            passed.fields(self, None)
        } else {
            None
        };
        Checked::Admitted(fields)
    }

    /// The layer's answer to a refused request.
    fn refuse<B>(
        &self,
        request: &RequestHead<'_>,
        passed: &Passed,
        refusal: &Refusal,
    ) -> Response<LimitBody<B>> {
        let grpc = request
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|value| is_grpc(value.as_bytes()));
        let answer = match refusal {
            Refusal::Denied(denied) => {
                let rule = &self.rules[denied.rule];
                let wait = whole_seconds_up(denied.decision.retry_after());
                // Every refusal's path, the one an attacker drives: the
                // body from pieces the rule made once, the text only for
                // gRPC, which carries it.
                let (detail, body) = if grpc {
                    let mut detail = String::with_capacity(64 + rule.name().len());
                    detail.push_str("the \"");
                    detail.push_str(rule.name());
                    detail.push_str("\" quota is exhausted for this client; retry in ");
                    push_decimal(&mut detail, wait);
                    detail.push_str(" s");
                    (detail, None)
                } else {
                    (String::new(), Some(exhausted_problem(rule.json(), wait)))
                };
                Answer {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    grpc_code: grpc::RESOURCE_EXHAUSTED,
                    kind: QUOTA_EXCEEDED,
                    title: "Quota Exceeded",
                    detail,
                    body,
                    violated: Some(rule.name()),
                    retry_after: Some(wait),
                    fields: passed.fields(self, Some(denied)),
                }
            }
            Refusal::Failed(index, Failure::Cost(error)) => {
                let rule = &self.rules[*index];
                Answer {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    grpc_code: grpc::RESOURCE_EXHAUSTED,
                    kind: QUOTA_EXCEEDED,
                    title: "Quota Exceeded",
                    detail: format!(
                        "the {:?} quota can never admit this request: {error}",
                        rule.name()
                    ),
                    body: None,
                    violated: Some(rule.name()),
                    // No wait admits it: no Retry-After.
                    retry_after: None,
                    fields: passed.fields(self, None),
                }
            }
            Refusal::Failed(index, failure) => {
                let rule = &self.rules[*index];
                Answer {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    grpc_code: grpc::UNAVAILABLE,
                    kind: TEMPORARY_REDUCED_CAPACITY,
                    title: "Temporary Reduced Capacity",
                    detail: format!(
                        "the {:?} limit could not be decided: {failure}",
                        rule.name()
                    ),
                    body: None,
                    violated: None,
                    retry_after: Some(1),
                    fields: passed.fields(self, None),
                }
            }
            Refusal::NoKey(error) => {
                let status = error.status();
                Answer {
                    status,
                    grpc_code: if status.is_server_error() {
                        grpc::INTERNAL
                    } else {
                        grpc::INVALID_ARGUMENT
                    },
                    kind: "about:blank",
                    title: status.canonical_reason().unwrap_or("Error"),
                    detail: error.to_string(),
                    body: None,
                    violated: None,
                    retry_after: None,
                    fields: None,
                }
            }
        };
        answer.into_response(grpc)
    }
}

/// Whether a `content-type` is gRPC's (`application/grpc`, alone or with
/// a `+format` or parameters; not gRPC-Web, whose clients read a refusal
/// from the HTTP status), case-insensitively.
fn is_grpc(content_type: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    content_type.len() >= GRPC.len()
        && content_type[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(content_type.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// A refusal, before it is written for HTTP or for gRPC.
struct Answer<'a> {
    status: StatusCode,
    grpc_code: u32,
    kind: &'static str,
    title: &'static str,
    detail: String,
    /// The problem body, when made already.
    body: Option<String>,
    violated: Option<&'a str>,
    retry_after: Option<u64>,
    fields: Option<Fields>,
}

impl Answer<'_> {
    fn into_response<B>(self, grpc: bool) -> Response<LimitBody<B>> {
        let mut response = Response::new(LimitBody::empty());
        let headers = response.headers_mut();
        // Room for every field below in one allocation.
        headers.reserve(8);
        if let Some(wait) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(wait));
        }
        if let Some(fields) = self.fields {
            fields.add_to(headers);
        }
        if grpc {
            // A trailers-only response: HTTP 200, the status in headers.
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert("grpc-status", HeaderValue::from(self.grpc_code));
            if let Ok(message) = HeaderValue::try_from(grpc::percent_encode(&self.detail)) {
                headers.insert("grpc-message", message);
            }
            let delay = self.retry_after.map(std::time::Duration::from_secs);
            if let Ok(details) =
                HeaderValue::try_from(grpc::status_details(self.grpc_code, &self.detail, delay))
            {
                headers.insert("grpc-status-details-bin", details);
            }
            return response;
        }
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        *response.status_mut() = self.status;
        let body = self.body.unwrap_or_else(|| {
            problem(
                self.kind,
                self.title,
                self.status.as_u16(),
                &self.detail,
                self.violated.as_slice(),
            )
        });
        *response.body_mut() = LimitBody::full(Bytes::from(body));
        response
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<LimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let mut passed = Passed::new();
        let checked = self.config.run(&RequestHead::of(&request), &mut passed, 0);
        let state = match checked {
            Checked::Admitted(fields) => State::Inner {
                future: self.inner.call(request),
                fields,
            },
            Checked::Refused(response) => State::Refused {
                response: Some(response),
            },
            Checked::Waiting(index, pending) => {
                // The inner service that was polled ready goes with the
                // request; its clone stays here for the next one.
                let ready = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, ready);
                State::Waiting {
                    future: Box::pin(finish(
                        Arc::clone(&self.config),
                        request,
                        passed,
                        index,
                        pending,
                        inner,
                    )),
                }
            }
        };
        ResponseFuture { state }
    }
}

/// The checks from a rule that had to wait, then the inner service.
async fn finish<S, ReqBody, ResBody>(
    config: Arc<Config>,
    request: Request<ReqBody>,
    mut passed: Passed,
    mut index: usize,
    mut pending: Pending,
    mut inner: S,
) -> Result<Response<LimitBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let fields = loop {
        let outcome = pending.await;
        let head = RequestHead::of(&request);
        if let Err(refusal) = passed.record(&config, index, outcome) {
            return Ok(config.refuse(&head, &passed, &refusal));
        }
        match config.run(&head, &mut passed, index + 1) {
            Checked::Admitted(fields) => break fields,
            Checked::Refused(response) => return Ok(response),
            Checked::Waiting(next, next_pending) => {
                index = next;
                pending = next_pending;
            }
        }
    };
    let mut response = inner.call(request).await?;
    if let Some(fields) = fields {
        fields.add_to(response.headers_mut());
    }
    Ok(response.map(LimitBody::inner))
}

type Finishing<B, E> = Pin<Box<dyn Future<Output = Result<Response<LimitBody<B>>, E>> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<F, B, E> {
        Inner { #[pin] future: F, fields: Option<Fields> },
        Refused { response: Option<Response<LimitBody<B>>> },
        Waiting { future: Finishing<B, E> },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<LimitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjection::Inner { future, fields } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some(fields) = fields.take() {
                    fields.add_to(response.headers_mut());
                }
                Poll::Ready(Ok(response.map(LimitBody::inner)))
            }
            StateProjection::Refused { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            StateProjection::Waiting { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

pin_project! {
    /// The body of a response through the layer: the inner service's, or
    /// the layer's refusal (a problem document, or nothing for gRPC).
    pub struct LimitBody<B> {
        #[pin]
        kind: BodyKind<B>,
    }
}

pin_project! {
    #[project = BodyProjection]
    enum BodyKind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> LimitBody<B> {
    fn inner(body: B) -> Self {
        Self {
            kind: BodyKind::Inner { body },
        }
    }

    fn full(data: Bytes) -> Self {
        Self {
            kind: BodyKind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    fn empty() -> Self {
        Self {
            kind: BodyKind::Full { data: None },
        }
    }
}

impl<B: Body<Data = Bytes>> Body for LimitBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            BodyProjection::Inner { body } => body.poll_frame(cx),
            BodyProjection::Full { data } => {
                Poll::Ready(data.take().map(|data| Ok(Frame::data(data))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Inner { body } => body.is_end_stream(),
            BodyKind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            BodyKind::Inner { body } => body.size_hint(),
            BodyKind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |data| data.len() as u64))
            }
        }
    }
}

impl<B> fmt::Debug for LimitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitBody").finish_non_exhaustive()
    }
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("rules", &self.config.rules)
            .finish_non_exhaustive()
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
