//! Response bodies: [`RefusalBody`], a body type the layer can write its
//! own answers in, and [`LimitBody`], which makes one of any body.

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full};
use pin_project_lite::pin_project;

/// A response body type the layer can write its own answers in.
///
/// The layer answers with the inner service's own body type: an admitted
/// request's response is the inner service's, untouched but for the
/// fields; a refusal's body is made by [`refusal`](RefusalBody::refusal),
/// from the RFC 9457 problem document, or from nothing for a gRPC refusal
/// (whose status is in the headers).
///
/// Implemented for the bodies of the servers the layer goes in front of:
/// axum's `Body` (feature `axum`), tonic's `Body` (feature `tonic`), and
/// [`Full<Bytes>`], [`BoxBody`] and [`UnsyncBoxBody`] (hyper and tower-http
/// services), [`String`] and [`Bytes`]. An inner service whose body type
/// is none of these (a proxy's `hyper::body::Incoming`) can answer with a
/// [`LimitBody`] of it, which is one.
pub trait RefusalBody {
    /// Returns a body holding `bytes` (empty for a gRPC refusal).
    fn refusal(bytes: Bytes) -> Self;
}

impl RefusalBody for Bytes {
    fn refusal(bytes: Bytes) -> Self {
        bytes
    }
}

/// The layer's answers are text (a JSON problem document, or nothing).
impl RefusalBody for String {
    fn refusal(bytes: Bytes) -> Self {
        String::from_utf8(Vec::from(bytes))
            .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned())
    }
}

impl RefusalBody for Full<Bytes> {
    fn refusal(bytes: Bytes) -> Self {
        Full::new(bytes)
    }
}

impl<E: 'static> RefusalBody for BoxBody<Bytes, E> {
    fn refusal(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed()
    }
}

impl<E: 'static> RefusalBody for UnsyncBoxBody<Bytes, E> {
    fn refusal(bytes: Bytes) -> Self {
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed_unsync()
    }
}

#[cfg(feature = "axum")]
impl RefusalBody for axum::body::Body {
    fn refusal(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }
}

#[cfg(feature = "tonic")]
impl RefusalBody for tonic::body::Body {
    fn refusal(bytes: Bytes) -> Self {
        if bytes.is_empty() {
            tonic::body::Body::empty()
        } else {
            tonic::body::Body::new(Full::new(bytes))
        }
    }
}

pin_project! {
    /// A body that is the inner service's or the layer's own: the
    /// [`RefusalBody`] made of any body.
    ///
    /// The layer answers with its inner service's body type, which must be
    /// a [`RefusalBody`]. One that is not (a proxy's
    /// `hyper::body::Incoming`) can be wrapped in this one below the layer:
    ///
    /// ```
    /// use std::convert::Infallible;
    ///
    /// use http::{Request, Response};
    /// use tollgate::{Quota, RateLimiter};
    /// use tollgate_http::{LimitBody, PeerIp, RateLimitLayer, Rule};
    /// use tower::ServiceBuilder;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // A body no refusal can be written in (a proxy's `hyper::body::Incoming`).
    /// struct Incoming;
    /// let proxy = tower::service_fn(|_: Request<()>| async {
    ///     Ok::<_, Infallible>(Response::new(Incoming))
    /// });
    /// let layer = RateLimitLayer::builder()
    ///     .rule(Rule::new("per-ip", RateLimiter::keyed(Quota::per_minute(100)?), PeerIp::new())?)
    ///     .build();
    /// let service = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .map_response(|response: Response<Incoming>| response.map(LimitBody::new))
    ///     .service(proxy);
    /// # fn answers_limit_bodies<S>(_: &S)
    /// # where
    /// #     S: tower::Service<Request<()>, Response = Response<LimitBody<Incoming>>>,
    /// # {
    /// # }
    /// # answers_limit_bodies(&service);
    /// # Ok(())
    /// # }
    /// ```
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
    /// Carries the inner service's `body`.
    pub fn new(body: B) -> Self {
        Self {
            kind: BodyKind::Inner { body },
        }
    }
}

impl<B> RefusalBody for LimitBody<B> {
    fn refusal(data: Bytes) -> Self {
        Self {
            kind: BodyKind::Full {
                data: (!data.is_empty()).then_some(data),
            },
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
