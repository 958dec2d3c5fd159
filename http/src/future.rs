//! [`ResponseFuture`]: the inner service's response, the layer's refusal,
//! or the checks still waiting for a backend and then the inner service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::passed::Fields;

/// The checks still waiting for a backend, then the inner service.
pub(crate) type Finishing<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<F, B, E> {
        Inner { #[pin] future: F, fields: Option<Box<Fields>> },
        Refused { response: Option<Response<B>> },
        Waiting { future: Finishing<B, E> },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            // Without fields, the inner service's answer as it comes.
            StateProjection::Inner { future, fields } if fields.is_none() => future.poll(cx),
            StateProjection::Inner { future, fields } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some(fields) = fields.take() {
                    fields.add_to(response.headers_mut());
                }
                Poll::Ready(Ok(response))
            }
            StateProjection::Refused { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            StateProjection::Waiting { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    /// Waits for the inner service's response, adding `fields` to it.
    pub(crate) fn inner(future: F, fields: Option<Box<Fields>>) -> Self {
        Self {
            state: State::Inner { future, fields },
        }
    }

    /// Answers with the layer's refusal.
    pub(crate) fn refused(response: Response<B>) -> Self {
        Self {
            state: State::Refused {
                response: Some(response),
            },
        }
    }

    /// Runs the checks still waiting, then the inner service.
    pub(crate) fn waiting(future: Finishing<B, E>) -> Self {
        Self {
            state: State::Waiting { future },
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
