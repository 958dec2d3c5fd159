//! tollgate in front of HTTP and gRPC services: a tower [`Layer`](tower_layer::Layer)
//! that holds each request to one or more limits and answers a refusal the
//! way clients read it.
//!
//! * **Keys** ([`KeyExtractor`]): the peer's IP address, IPv6 grouped by
//!   prefix (/64 by default) so one host cannot mint 2^64 keys
//!   ([`PeerIp`]); `X-Forwarded-For` or `Forwarded` **only from trusted
//!   proxies**; a header ([`Header`]); any closure ([`KeyFn`]); one global
//!   key ([`Global`]). Every key they give owns its bytes, copied out of
//!   the request, and is bounded in length (a header's value to 256 bytes
//!   by default, else 431).
//! * **Limits** ([`Rule`]): each a name, a limiter, a key, when it applies
//!   and what a request costs; several per request (per IP and per user),
//!   per route.
//! * **Any limiter** ([`Limit`]): the in-process [`RateLimiter`](tollgate::RateLimiter)
//!   and [`DirectLimiter`](tollgate::DirectLimiter), and with feature
//!   `redis` the Redis backend, behind one trait.
//! * **Standard answers**: 429 with `Retry-After` in whole seconds rounded
//!   up (never 0), the `RateLimit-Policy` and `RateLimit` fields of
//!   draft-ietf-httpapi-ratelimit-headers-11, an RFC 9457 problem body with
//!   the draft's quota-exceeded type and `violated-policies`; gRPC's
//!   `RESOURCE_EXHAUSTED` with a `RetryInfo`; 503 with the draft's
//!   temporary-reduced-capacity type when a limiter cannot decide.
//! * **The inner service's body type**: a response through the layer is
//!   the inner service's own, and a refusal is written in the same type
//!   ([`RefusalBody`]: axum's and, with feature `tonic`, tonic's bodies,
//!   hyper's `Full` and the boxed bodies; [`LimitBody`] wraps any other).
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use tollgate::{Quota, RateLimiter};
//! use tollgate_http::{Header, PeerIp, RateLimitLayer, Rule};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     .rule(Rule::new("per-ip", RateLimiter::keyed(Quota::per_minute(600)?), PeerIp::new())?)
//!     .rule(
//!         Rule::new(
//!             "per-key",
//!             RateLimiter::keyed(Quota::per_minute(100)?),
//!             Header::new(http::HeaderName::from_static("x-api-key")),
//!         )?
//!         .when(|parts| parts.uri().path().starts_with("/api/")),
//!     )
//!     .build();
//! let app: Router = Router::new().route("/api/hello", get(|| async { "hello" })).layer(layer);
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok(())
//! # }
//! ```
//!
//! The repository's design notes argue the key extractors and the proxy
//! trust model, and the mapping from a decision to each field.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs, missing_debug_implementations, unsafe_code)]
#![warn(clippy::pedantic)]
#![allow(clippy::module_name_repetitions)]

mod body;
mod fields;
mod future;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod grpc;
mod head;
mod key;
mod layer;
mod limit;
mod passed;
mod refusal;
mod rule;
mod service;
mod tiers;

pub use body::{LimitBody, RefusalBody};
pub use fields::{
    RATELIMIT, RATELIMIT_POLICY, ratelimit_item, ratelimit_policy_item, retry_after_seconds,
};
pub use future::ResponseFuture;
pub use head::RequestHead;
pub use key::{
    Global, GlobalKey, Header, HeaderKey, IpKey, IpNet, IpNetError, KeyError, KeyExtractor, KeyFn,
    PeerIp, PrefixError,
};
pub use layer::{Builder, OnUnavailable, RateLimitLayer};
pub use limit::{Checked, Failure, Limit, NoReceipt};
pub use rule::{NameError, Rule};
pub use service::RateLimit;
pub use tiers::{TierError, Tiers};

// The README's example is a doctest too (compiled, not run: it needs a
// server).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
