//! Choosing a request's key: the peer's address (grouped by prefix, read
//! through trusted proxies only), a header, a closure, or one global key.
//!
//! Every key a limiter stores is kept past its request, so every key the
//! extractors give owns its bytes (none borrows the request's buffers) and
//! has a bounded length.
//!
//! This file holds the trait, its error, and the two extractors that read
//! nothing of the request ([`KeyFn`], [`Global`]); the others, the
//! forwarding headers' parsing and the IP networks have files of their own.

pub(crate) mod forwarded;
mod header;
mod net;
mod peer;

use std::fmt;

use http::{HeaderName, StatusCode};

use crate::head::RequestHead;

pub use header::{Header, HeaderKey};
pub use net::{IpKey, IpNet, IpNetError, PrefixError};
pub use peer::PeerIp;

/// Chooses the key a request is limited by.
///
/// Implemented by [`PeerIp`], [`Header`], [`Global`] and [`KeyFn`] (any
/// closure from the request's [`RequestHead`] to a key).
///
/// A limiter stores each key it admits for as long as the key's state
/// matters, so an extractor's key must own its bytes: not a slice of the
/// request (see [`KeyFn`]), and of a bounded length.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key: owned, of a bounded size.
    type Key: Send + Sync + 'static;

    /// Returns the key of `request`.
    ///
    /// # Errors
    ///
    /// A [`KeyError`] when the request carries no key (the layer answers
    /// with the error's status and a problem body, and the request goes no
    /// further).
    fn extract(&self, request: &RequestHead<'_>) -> Result<Self::Key, KeyError>;
}

/// A request the layer could find no key for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The connection's peer address is not in the request's extensions:
    /// the server was not set up to record it (with axum,
    /// `into_make_service_with_connect_info::<SocketAddr>()`). A
    /// configuration error: 500.
    #[error(
        "the server records no peer address for this connection, so the request cannot be \
         rate limited by it"
    )]
    NoPeerAddress,
    /// The header the key is read from is absent or empty: 400.
    #[error("the request has no {0} header to be rate limited by")]
    MissingHeader(HeaderName),
    /// The header the key is read from appears more than once: 400 (which
    /// one is the key would be a guess, and a client could make the limit
    /// and the handler read different ones).
    #[error("the request has more than one {0} header, and is rate limited by exactly one")]
    RepeatedHeader(HeaderName),
    /// The header the key is read from is longer than its extractor's
    /// bound ([`Header::max_len`]): 431 Request Header Fields Too Large,
    /// the status RFC 6585 gives a single header field that is too large
    /// (its problem body names the field, as the RFC asks). Not 400: the
    /// request is well formed, and the client can send it again with a
    /// shorter value.
    #[error("the {name} header is {len} bytes long, above the {max_len} bytes a key may be")]
    HeaderTooLarge {
        /// The header.
        name: HeaderName,
        /// Its value's length in bytes.
        len: usize,
        /// The most the extractor keys by.
        max_len: usize,
    },
    /// A [`KeyFn`] found no key: 400.
    #[error("the request carries no key to be rate limited by")]
    Unidentified,
}

impl KeyError {
    /// Returns the status the layer answers with.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            KeyError::NoPeerAddress => StatusCode::INTERNAL_SERVER_ERROR,
            KeyError::MissingHeader(_) | KeyError::RepeatedHeader(_) | KeyError::Unidentified => {
                StatusCode::BAD_REQUEST
            }
            KeyError::HeaderTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        }
    }
}

/// A closure from the request's [`RequestHead`] to its key (`None`: no key, a
/// 400).
///
/// # The key must own its bytes, and be short
///
/// The limiter stores the key the closure returns for as long as the key's
/// state matters, long after the request. A key that borrows the request's
/// memory keeps it alive that long: servers such as hyper parse a request
/// in place, so a `HeaderValue`, a `Uri` or a `Bytes` taken from the
/// request (`.clone()`d, or `slice`d) shares the connection's whole read
/// buffer, hundreds of kilobytes for a request padded with a large header,
/// and each stored key would keep one. Return a copy: a `String`, a
/// `Box<[u8]>`, `Bytes::copy_from_slice`, or a number. (So does
/// `HeaderValue::from_bytes(value.as_bytes())`, which copies, where
/// `value.clone()` does not.) And bound the key's length, or a client
/// chooses what each of its keys costs: return `None` (400) for one too
/// long, as below, or use [`Header`], which does both for a header.
///
/// ```
/// use tollgate_http::{KeyFn, RequestHead};
///
/// // Wrong: `.cloned()` is a slice of the connection's read buffer, kept
/// // alive, whole, by every key the limiter stores.
/// let leaky = KeyFn::new(|head: &RequestHead<'_>| head.headers().get("x-tenant").cloned());
///
/// // Right: the value's bytes copied, at most 64 of them.
/// let tenant = KeyFn::new(|head: &RequestHead<'_>| {
///     let value = head.headers().get("x-tenant")?.as_bytes();
///     (value.len() <= 64).then(|| Box::<[u8]>::from(value))
/// });
/// # let _ = (leaky, tenant);
/// ```
///
/// ```
/// use tollgate_http::{KeyExtractor, KeyFn, RequestHead};
///
/// // The tenant in the path: /tenants/{tenant}/...
/// let tenant = KeyFn::new(|parts: &RequestHead<'_>| {
///     let mut segments = parts.uri().path().split('/').skip(1);
///     (segments.next() == Some("tenants")).then(|| segments.next().map(str::to_owned))?
/// });
/// let request = http::Request::get("/tenants/acme/orders").body(()).unwrap();
/// assert_eq!(tenant.extract(&RequestHead::of(&request)).unwrap(), "acme");
/// ```
#[derive(Clone)]
pub struct KeyFn<F>(F);

impl<F> KeyFn<F> {
    /// Keys requests with `key`.
    pub const fn new(key: F) -> Self {
        Self(key)
    }
}

impl<F, K> KeyExtractor for KeyFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<K> + Send + Sync + 'static,
    K: Send + Sync + 'static,
{
    type Key = K;

    fn extract(&self, request: &RequestHead<'_>) -> Result<K, KeyError> {
        (self.0)(request).ok_or(KeyError::Unidentified)
    }
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFn")
    }
}

/// One key for every request: a limit on the whole service.
///
/// Its key, [`GlobalKey`], is zero-sized and reads nothing of the request:
/// a limiter keyed by it stores one key, whatever the requests carry.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

/// The key [`Global`] gives every request: zero bytes (`*` to a backend
/// that keys by bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GlobalKey;

impl AsRef<[u8]> for GlobalKey {
    fn as_ref(&self) -> &[u8] {
        b"*"
    }
}

impl KeyExtractor for Global {
    type Key = GlobalKey;

    fn extract(&self, _request: &RequestHead<'_>) -> Result<GlobalKey, KeyError> {
        Ok(GlobalKey)
    }
}
