//! [`RateLimit`]: the service the layer wraps around another, and the
//! run of a request through the rules, from the first to the inner
//! service or a refusal.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::body::RefusalBody;
use crate::future::ResponseFuture;
use crate::head::RequestHead;
use crate::layer::Config;
use crate::passed::{Fields, Passed};
use crate::refusal::Refusal;
use crate::rule::{Keep, Pending, Step};

/// The service [`RateLimitLayer`](crate::RateLimitLayer) wraps around
/// another.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }
}

/// Where a request stands after the checks that could be decided at once.
enum Progress {
    /// Every applicable rule admitted it: call the inner service, then add
    /// these fields (boxed: the response future carries them while the
    /// inner service runs, and a future without fields stays as small as
    /// the inner one).
    Admitted(Option<Box<Fields>>),
    /// Refused, for this reason (what it charged is given back).
    Refused(Refusal),
    /// Rule `index` waits for its backend.
    Waiting(usize, Pending),
}

impl Config {
    /// What rule `index` keeps of an admission: the last rule's admission
    /// only for the fields (no later rule can refuse the request, and
    /// nothing gives it back), the others' to give back.
    fn keep(&self, index: usize) -> Keep {
        if index + 1 < self.rules.len() {
            Keep::Refund
        } else if self.fields_on_success {
            Keep::Decision
        } else {
            Keep::Nothing
        }
    }

    /// Records rule `index`'s step; `None` to go on to the next rule.
    fn settle(&self, index: usize, step: Step, passed: &mut Passed) -> Option<Progress> {
        let outcome = match step {
            Step::Skip | Step::Admitted => return None,
            Step::Done(outcome) => outcome,
            Step::NoKey(error) => {
                passed.refund_all();
                return Some(Progress::Refused(Refusal::NoKey(error)));
            }
            Step::Pending(pending) => return Some(Progress::Waiting(index, pending)),
        };
        passed
            .record(self, index, outcome)
            .err()
            .map(Progress::Refused)
    }

    /// Runs the rules from `first` on, until one must wait, one refuses, or
    /// all are done.
    fn run(&self, request: &RequestHead<'_>, passed: &mut Passed, first: usize) -> Progress {
        for (index, rule) in self.rules.iter().enumerate().skip(first) {
            if let Some(progress) =
                self.settle(index, rule.start(request, self.keep(index)), passed)
            {
                return progress;
            }
        }
        // Through: the admissions stand.
        passed.keep_all();
        let fields = if self.fields_on_success {
            passed.fields(self, None).map(Box::new)
        } else {
            None
        };
        Progress::Admitted(fields)
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: RefusalBody + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let head = RequestHead::of(&request);
        let config = &*self.config;
        // The first rule is checked before anything is set up for the
        // others: the usual layer (one rule, no fields on success) sends an
        // admitted request straight on, with nothing to record or drop.
        let first = match config.rules.first() {
            Some(rule) => rule.start(&head, config.keep(0)),
            None => Step::Skip,
        };
        if config.rules.len() <= 1 && matches!(first, Step::Admitted | Step::Skip) {
            // Neither step owns anything. Forgotten, not dropped: with no
            // drop left to run should the inner call unwind, its future
            // (hundreds of bytes) is written in place, not copied.
            std::mem::forget(first);
            return ResponseFuture::inner(self.inner.call(request), None);
        }
        let mut passed = Passed::new();
        let progress = match config.settle(0, first, &mut passed) {
            Some(progress) => progress,
            None => config.run(&head, &mut passed, 1),
        };
        match progress {
            Progress::Admitted(fields) => ResponseFuture::inner(self.inner.call(request), fields),
            Progress::Refused(refusal) => {
                ResponseFuture::refused(self.config.refuse(&head, &passed, &refusal))
            }
            Progress::Waiting(index, pending) => {
                // The inner service that was polled ready goes with the
                // request; its clone stays here for the next one.
                let ready = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, ready);
                ResponseFuture::waiting(Box::pin(finish(
                    Arc::clone(&self.config),
                    request,
                    passed,
                    index,
                    pending,
                    inner,
                )))
            }
        }
    }
}

/// Runs the checks from a rule that had to wait, then the inner service.
async fn finish<S, ReqBody, ResBody>(
    config: Arc<Config>,
    request: Request<ReqBody>,
    mut passed: Passed,
    mut index: usize,
    mut pending: Pending,
    mut inner: S,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: RefusalBody,
{
    let fields = loop {
        let outcome = pending.await;
        let head = RequestHead::of(&request);
        if let Err(refusal) = passed.record(&config, index, outcome) {
            return Ok(config.refuse(&head, &passed, &refusal));
        }
        match config.run(&head, &mut passed, index + 1) {
            Progress::Admitted(fields) => break fields,
            Progress::Refused(refusal) => return Ok(config.refuse(&head, &passed, &refusal)),
            Progress::Waiting(next, next_pending) => {
                index = next;
                pending = next_pending;
            }
        }
    };
    let mut response = inner.call(request).await?;
    if let Some(fields) = fields {
        fields.add_to(response.headers_mut());
    }
    Ok(response)
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("rules", &self.config.rules)
            .finish_non_exhaustive()
    }
}
