//! [`Header`]: a request's key read from one of its headers, copied out of
//! the request and bounded in length.

use std::fmt;
use std::num::NonZeroUsize;

use http::HeaderName;

use super::{KeyError, KeyExtractor};
use crate::head::RequestHead;

/// Keys a request by the value of one of its headers (an API key, a
/// tenant).
///
/// A request without the header, or with it empty, is answered 400, so
/// that leaving it out is not a way around the limit (apply the rule only
/// to requests that carry it with [`Rule::when`](crate::Rule::when) to let
/// the others through). So is a request that carries it **more than
/// once** ([`KeyError::RepeatedHeader`]): the limit and the handler behind
/// it could read different occurrences, and a client could then send a
/// fresh key to the limit on every request while its handler reads the
/// real one.
///
/// # What it stores
///
/// Each key is a [`HeaderKey`]: the value's bytes, **copied** into an
/// allocation of their own. The value in the request is not kept: a server
/// such as hyper parses headers in place, so the request's `HeaderValue`
/// is a slice of the connection's read buffer, and a stored clone of it
/// would keep that whole buffer alive (hundreds of kilobytes for a request
/// padded with a large header) for as long as the limiter keeps the key.
///
/// A value longer than [`max_len`](Header::max_len) bytes
/// ([`DEFAULT_MAX_LEN`](Header::DEFAULT_MAX_LEN), 256, by default) is
/// answered **431 Request Header Fields Too Large**
/// ([`KeyError::HeaderTooLarge`]), naming the header, and nothing is
/// stored. A stored key is then 16 bytes in the store's table and at most
/// `max_len` bytes in an allocation of its own, so a limiter's key cap
/// bounds the keys' memory: 100 000 keys of up to 256 bytes hold at most
/// 25.6 MB of key bytes.
///
/// ```
/// use std::num::NonZeroUsize;
/// use http::HeaderName;
/// use tollgate_http::{Header, KeyError, KeyExtractor, RequestHead};
///
/// let api_key = Header::new(HeaderName::from_static("x-api-key"));
/// let request = http::Request::get("/").header("x-api-key", "alice").body(()).unwrap();
/// assert_eq!(api_key.extract(&RequestHead::of(&request)).unwrap().as_bytes(), b"alice");
///
/// // A key longer than the bound: refused, 431.
/// let short = api_key.max_len(NonZeroUsize::new(4).unwrap());
/// let error = short.extract(&RequestHead::of(&request)).unwrap_err();
/// assert_eq!(error.status(), http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
/// assert!(matches!(error, KeyError::HeaderTooLarge { len: 5, max_len: 4, .. }));
/// ```
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
    max_len: NonZeroUsize,
}

impl Header {
    /// The longest value [`Header::new`] keys by: 256 bytes.
    ///
    /// Ample for the keys clients are usually given: a UUID is 36 bytes,
    /// a 256-bit secret in base64 44, in hex with a prefix under 80. A
    /// stored key costs its length beside its entry in the store, and
    /// clients choose it: the bound caps what each key can cost, and with
    /// the store's key cap, what all of them can (100 000 keys, 25.6 MB of
    /// key bytes). Raise it for longer keys; a JSON Web Token is better
    /// keyed by its subject, with a [`KeyFn`](crate::KeyFn), than whole.
    pub const DEFAULT_MAX_LEN: NonZeroUsize = NonZeroUsize::new(256).expect("nonzero");

    /// Keys requests by the header `name`, values of at most
    /// [`DEFAULT_MAX_LEN`](Header::DEFAULT_MAX_LEN) bytes.
    #[must_use]
    pub fn new(name: HeaderName) -> Self {
        Self {
            name,
            max_len: Self::DEFAULT_MAX_LEN,
        }
    }

    /// Refuses values longer than `max_len` bytes (431).
    #[must_use]
    pub fn max_len(mut self, max_len: NonZeroUsize) -> Self {
        self.max_len = max_len;
        self
    }
}

impl KeyExtractor for Header {
    type Key = HeaderKey;

    fn extract(&self, request: &RequestHead<'_>) -> Result<HeaderKey, KeyError> {
        let mut values = request.headers().get_all(&self.name).iter();
        let value = values
            .next()
            .ok_or_else(|| KeyError::MissingHeader(self.name.clone()))?;
        if values.next().is_some() {
            return Err(KeyError::RepeatedHeader(self.name.clone()));
        }
        if value.is_empty() {
            return Err(KeyError::MissingHeader(self.name.clone()));
        }
        let len = value.len();
        if len > self.max_len.get() {
            return Err(KeyError::HeaderTooLarge {
                name: self.name.clone(),
                len,
                max_len: self.max_len.get(),
            });
        }
        // A copy: an allocation of the value's length, holding nothing of
        // the request's buffer.
        Ok(HeaderKey::from(value.as_bytes()))
    }
}

/// The key [`Header`] gives a request: the header value's bytes, owned (a
/// copy, in an allocation of exactly their length), any bytes a header may
/// hold, text or not.
///
/// `AsRef<[u8]>` for a backend that keys by bytes; made from bytes (a
/// copy) to ask a limiter about a key outside a request.
///
/// ```
/// use tollgate::{Quota, RateLimiter};
/// use tollgate_http::HeaderKey;
///
/// let limiter: RateLimiter<HeaderKey> = RateLimiter::keyed(Quota::per_minute(5).unwrap());
/// let alice = HeaderKey::from(b"alice".as_slice());
/// assert_eq!(limiter.check(&alice).unwrap().remaining(), 4);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HeaderKey(Box<[u8]>);

impl HeaderKey {
    /// Returns the value's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for HeaderKey {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Copies `bytes`, of any length (the bound is [`Header`]'s, on what
/// clients send).
impl From<&[u8]> for HeaderKey {
    fn from(bytes: &[u8]) -> Self {
        Self(Box::from(bytes))
    }
}

impl fmt::Debug for HeaderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HeaderKey(\"{}\")", self.0.escape_ascii())
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use http::{HeaderName, HeaderValue, Request};

    use super::{Header, HeaderKey};
    use crate::head::RequestHead;
    use crate::key::{KeyError, KeyExtractor};

    const NAME: HeaderName = HeaderName::from_static("x-api-key");

    fn extract(header: &Header, values: &[&[u8]]) -> Result<HeaderKey, KeyError> {
        let mut request = Request::new(());
        for value in values {
            request
                .headers_mut()
                .append(NAME, HeaderValue::from_bytes(value).unwrap());
        }
        header.extract(&RequestHead::of(&request))
    }

    #[test]
    fn a_key_is_a_copy_of_the_value_not_a_slice_of_the_request() {
        let buffer = bytes::Bytes::from(b"padding-then-the-key:alice".to_vec());
        let value = HeaderValue::from_maybe_shared(buffer.slice(21..)).unwrap();
        let mut request = Request::new(());
        request.headers_mut().insert(NAME, value);
        let key = Header::new(NAME)
            .extract(&RequestHead::of(&request))
            .unwrap();
        assert_eq!(key.as_bytes(), b"alice");
        let buffer_range = buffer.as_ptr_range();
        assert!(!buffer_range.contains(&key.as_bytes().as_ptr()));
    }

    #[test]
    fn values_up_to_the_bound_are_keys_and_longer_ones_are_431() {
        let header = Header::new(NAME);
        let longest = vec![b'k'; 256];
        assert_eq!(
            extract(&header, &[&longest]).unwrap().as_bytes(),
            &longest[..]
        );
        let error = extract(&header, &[&[b'k'; 257]]).unwrap_err();
        assert_eq!(
            error,
            KeyError::HeaderTooLarge {
                name: NAME,
                len: 257,
                max_len: 256
            }
        );
        assert_eq!(
            error.status(),
            http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        assert_eq!(
            error.to_string(),
            "the x-api-key header is 257 bytes long, above the 256 bytes a key may be"
        );
        let one = Header::new(NAME).max_len(NonZeroUsize::MIN);
        assert_eq!(extract(&one, &[b"k"]).unwrap().as_bytes(), b"k");
        assert!(matches!(
            extract(&one, &[b"kk"]),
            Err(KeyError::HeaderTooLarge {
                len: 2,
                max_len: 1,
                ..
            })
        ));
    }

    #[test]
    fn absent_empty_and_repeated_headers_are_400s() {
        let header = Header::new(NAME);
        for values in [&[][..], &[b"".as_slice()], &[b"", b"alice"]] {
            let error = extract(&header, values).unwrap_err();
            assert_eq!(error.status(), http::StatusCode::BAD_REQUEST, "{values:?}");
        }
        assert_eq!(extract(&header, &[]), Err(KeyError::MissingHeader(NAME)));
        assert_eq!(
            extract(&header, &[b"alice", b"mallory"]),
            Err(KeyError::RepeatedHeader(NAME))
        );
        assert_eq!(
            extract(&header, &[b"", b"alice"]),
            Err(KeyError::RepeatedHeader(NAME))
        );
        assert_eq!(extract(&header, &[b""]), Err(KeyError::MissingHeader(NAME)));
    }

    #[test]
    fn bytes_that_are_not_text_are_keys_of_their_own() {
        let header = Header::new(NAME);
        let key = extract(&header, &[b"\xff\xfe key"]).unwrap();
        assert_eq!(key.as_bytes(), b"\xff\xfe key");
        assert_ne!(key, extract(&header, &[b"\xfd\xfe key"]).unwrap());
        assert_eq!(format!("{key:?}"), r#"HeaderKey("\xff\xfe key")"#);
    }
}
