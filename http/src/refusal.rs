//! A refused request's answer: 429 with `Retry-After`, 503, or the status
//! of a request without a key, with the fields and an RFC 9457 problem
//! body, or for a gRPC request the same told as a gRPC status.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::body::RefusalBody;
use crate::fields::{
    QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY, exhausted_problem, problem, push_decimal,
    whole_seconds_up,
};
use crate::grpc;
use crate::head::RequestHead;
use crate::key::KeyError;
use crate::layer::Config;
use crate::limit::Failure;
use crate::passed::{Fields, Passed, RuleDecision};

/// Why a request is refused.
pub(crate) enum Refusal {
    /// A rule denied it.
    Denied(RuleDecision),
    /// A rule, by its index, gave no decision.
    Failed(usize, Failure),
    /// A rule found no key in it.
    NoKey(KeyError),
}

impl Config {
    /// Writes the layer's answer to a refused request.
    pub(crate) fn refuse<B: RefusalBody>(
        &self,
        request: &RequestHead<'_>,
        passed: &Passed,
        refusal: &Refusal,
    ) -> Response<B> {
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
                    body,
                    violated: Some(rule.name()),
                    retry_after: Some(wait),
                    fields: passed.fields(self, Some(denied)),
                    ..Answer::new(StatusCode::TOO_MANY_REQUESTS, detail)
                }
            }
            Refusal::Failed(index, Failure::Cost(error)) => {
                let rule = &self.rules[*index];
                let detail = format!(
                    "the {:?} quota can never admit this request: {error}",
                    rule.name()
                );
                Answer {
                    violated: Some(rule.name()),
                    // No wait admits it: no Retry-After.
                    fields: passed.fields(self, None),
                    ..Answer::new(StatusCode::TOO_MANY_REQUESTS, detail)
                }
            }
            Refusal::Failed(index, failure) => {
                let detail = format!(
                    "the {:?} limit could not be decided: {failure}",
                    self.rules[*index].name()
                );
                Answer {
                    retry_after: Some(1),
                    fields: passed.fields(self, None),
                    ..Answer::new(StatusCode::SERVICE_UNAVAILABLE, detail)
                }
            }
            Refusal::NoKey(error) => Answer::new(error.status(), error.to_string()),
        };
        answer.into_response(grpc)
    }
}

/// Returns whether a `content-type` is gRPC's (`application/grpc`, alone
/// or with a `+format` or parameters; not gRPC-Web, whose clients read a
/// refusal from the HTTP status), case-insensitively.
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
    /// Starts the answer of `status` with `detail`. The problem type, its
    /// title and the gRPC code follow from the status: the draft's
    /// quota-exceeded type for 429 (`RESOURCE_EXHAUSTED`), its
    /// temporary-reduced-capacity type for 503 (`UNAVAILABLE`), and
    /// `about:blank` with the status's own reason for any other
    /// (`INTERNAL` for a server error, else `INVALID_ARGUMENT`). No body
    /// made yet, no policy named, no `Retry-After` and no fields.
    fn new(status: StatusCode, detail: String) -> Self {
        let (grpc_code, kind, title) = match status {
            StatusCode::TOO_MANY_REQUESTS => {
                (grpc::RESOURCE_EXHAUSTED, QUOTA_EXCEEDED, "Quota Exceeded")
            }
            StatusCode::SERVICE_UNAVAILABLE => (
                grpc::UNAVAILABLE,
                TEMPORARY_REDUCED_CAPACITY,
                "Temporary Reduced Capacity",
            ),
            _ => (
                if status.is_server_error() {
                    grpc::INTERNAL
                } else {
                    grpc::INVALID_ARGUMENT
                },
                "about:blank",
                status.canonical_reason().unwrap_or("Error"),
            ),
        };
        Self {
            status,
            grpc_code,
            kind,
            title,
            detail,
            body: None,
            violated: None,
            retry_after: None,
            fields: None,
        }
    }

    /// Writes the answer as a response: an HTTP status with a problem
    /// body, or for gRPC a trailers-only response.
    fn into_response<B: RefusalBody>(self, grpc: bool) -> Response<B> {
        let body = if grpc {
            // A trailers-only response: no body.
            Bytes::new()
        } else {
            Bytes::from(self.body.unwrap_or_else(|| {
                problem(
                    self.kind,
                    self.title,
                    self.status.as_u16(),
                    &self.detail,
                    self.violated.as_slice(),
                )
            }))
        };
        let mut response = Response::new(B::refusal(body));
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
            // HTTP 200, the status in headers.
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
        response
    }
}
