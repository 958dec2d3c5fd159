//! [`RequestHead`]: what extractors, predicates and cost functions see of a
//! request.

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

/// A request without its body: what the layer's key extractors, rule
/// predicates and cost functions read. A view of references, made without
/// moving or copying the request.
///
/// ```
/// use tollgate_http::RequestHead;
///
/// let request = http::Request::post("/upload?tenant=acme")
///     .header("content-length", "2048")
///     .body(())
///     .unwrap();
/// let head = RequestHead::of(&request);
/// assert_eq!(head.method(), http::Method::POST);
/// assert_eq!(head.uri().query(), Some("tenant=acme"));
/// assert_eq!(head.headers()["content-length"], "2048");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// Views the head of `request`.
    pub fn of<B>(request: &'a Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            version: request.version(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// Returns the request's method.
    #[must_use]
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// Returns the request's target.
    #[must_use]
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// Returns the request's HTTP version.
    #[must_use]
    pub fn version(&self) -> Version {
        self.version
    }

    /// Returns the request's headers.
    #[must_use]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// Returns the request's extensions (where servers record the peer's
    /// address).
    #[must_use]
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}
