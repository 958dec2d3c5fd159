//! Choosing a request's key: the peer's address (grouped by prefix, read
//! through trusted proxies only), a header, a closure, or one global key.
//!
//! Every key a limiter stores is kept past its request, so every key the
//! extractors give owns its bytes (none borrows the request's buffers) and
//! has a bounded length.

mod header;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use crate::head::RequestHead;
use http::{Extensions, HeaderName, StatusCode};

pub use header::{Header, HeaderKey};

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

    /// The key of `request`.
    ///
    /// # Errors
    ///
    /// A [`KeyError`] when the request carries no key (the layer answers
    /// with the error's status and a problem body, and the request goes no
    /// further).
    fn extract(&self, request: &RequestHead<'_>) -> Result<Self::Key, KeyError>;
}

/// A request the layer could find no key for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The connection's peer address is not in the request's extensions:
    /// the server was not set up to record it (with axum,
    /// `into_make_service_with_connect_info::<SocketAddr>()`). A
    /// configuration error: 500.
    NoPeerAddress,
    /// The header the key is read from is absent or empty: 400.
    MissingHeader(HeaderName),
    /// The header the key is read from appears more than once: 400 (which
    /// one is the key would be a guess, and a client could make the limit
    /// and the handler read different ones).
    RepeatedHeader(HeaderName),
    /// The header the key is read from is longer than its extractor's
    /// bound ([`Header::max_len`]): 431 Request Header Fields Too Large,
    /// the status RFC 6585 gives a single header field that is too large
    /// (its problem body names the field, as the RFC asks). Not 400: the
    /// request is well formed, and the client can send it again with a
    /// shorter value.
    HeaderTooLarge {
        /// The header.
        name: HeaderName,
        /// Its value's length in bytes.
        len: usize,
        /// The most the extractor keys by.
        max_len: usize,
    },
    /// A [`KeyFn`] found no key: 400.
    Unidentified,
}

impl KeyError {
    /// The status the layer answers with.
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

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::NoPeerAddress => f.write_str(
                "the server records no peer address for this connection, so the request cannot be rate limited by it",
            ),
            KeyError::MissingHeader(name) => {
                write!(f, "the request has no {name} header to be rate limited by")
            }
            KeyError::RepeatedHeader(name) => write!(
                f,
                "the request has more than one {name} header, and is rate limited by exactly one"
            ),
            KeyError::HeaderTooLarge { name, len, max_len } => write!(
                f,
                "the {name} header is {len} bytes long, above the {max_len} bytes a key may be"
            ),
            KeyError::Unidentified => f.write_str("the request carries no key to be rate limited by"),
        }
    }
}

impl std::error::Error for KeyError {}

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

/// The client's IP address, grouped into networks by prefix.
///
/// # The peer
///
/// The address is the connection's peer, found in the request's
/// extensions as a `SocketAddr`, as axum's `ConnectInfo<SocketAddr>`
/// (feature `axum`), or by a function of your own
/// ([`peer_from`](PeerIp::peer_from), for tonic's `TcpConnectInfo` or a
/// server that records it elsewhere). An IPv4-mapped IPv6 address
/// (`::ffff:192.0.2.1`, as dual-stack sockets report IPv4 peers) is the
/// IPv4 address.
///
/// # Grouping
///
/// One host on IPv6 is usually given a whole /64, so it could mint 2^64
/// keys, each with a fresh burst: IPv6 addresses are grouped by their
/// first 64 bits by default ([`ipv6_prefix`](PeerIp::ipv6_prefix)). IPv4
/// addresses are their own key (/32) unless
/// [`ipv4_prefix`](PeerIp::ipv4_prefix) says otherwise.
///
/// # Proxies
///
/// `X-Forwarded-For` and `Forwarded` (RFC 7239) are read **only when the
/// connecting peer is a trusted proxy**: anyone can send these headers, so
/// from any other peer they are ignored, and the peer is the key. Behind
/// trusted proxies, the header is read from its last entry backwards
/// (each proxy appends the address it received the request from), past
/// every trusted proxy: the first address that is not one is the client.
/// An entry that is not an address (`unknown`, an obfuscated identifier,
/// garbage) stops the walk, and the request is keyed by the trusted proxy
/// that reported it, which a client cannot choose (an address with an
/// obfuscated port, `192.0.2.43:_p1`, is an address). `Forwarded` is split
/// into its elements from the end, so that what a client wrote before the
/// proxies' elements (an unclosed quote) cannot change how theirs read.
/// The walk reads at most the last 32 entries (of all the header's lines
/// together): a request that passed more trusted proxies than that is
/// keyed by the last one read. A client can write any number of entries
/// before its proxy's; they are at most scanned, never parsed nor held.
///
/// # What it stores
///
/// Each key is an [`IpKey`]: the network (the address's family, its prefix
/// and the masked address) in 19 bytes of its own, with no allocation and
/// nothing of the request, whatever the headers it was read from. Reading
/// a forwarding header holds at most 32 entries' addresses (about 1 KB)
/// a line, while the request is decided.
///
/// ```
/// use tollgate_http::{IpNet, KeyExtractor, PeerIp, RequestHead};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let peer = PeerIp::new().trust_x_forwarded_for(["10.0.0.0/8".parse::<IpNet>()?]);
///
/// // From the load balancer at 10.0.0.2: the client it names.
/// let mut request = http::Request::get("/")
///     .header("x-forwarded-for", "198.51.100.7, 10.0.0.9")
///     .body(())?;
/// request.extensions_mut().insert("10.0.0.2:443".parse::<std::net::SocketAddr>()?);
/// assert_eq!(peer.extract(&RequestHead::of(&request))?.to_string(), "198.51.100.7/32");
///
/// // The same header straight from a client: ignored.
/// let mut spoofed = http::Request::get("/")
///     .header("x-forwarded-for", "198.51.100.7")
///     .body(())?;
/// spoofed.extensions_mut().insert("203.0.113.5:50000".parse::<std::net::SocketAddr>()?);
/// assert_eq!(peer.extract(&RequestHead::of(&spoofed))?.to_string(), "203.0.113.5/32");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PeerIp {
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    trusted: Vec<IpNet>,
    forwarded: ForwardedHeader,
    peer: fn(&Extensions) -> Option<IpAddr>,
}

/// Which header names the client behind a trusted proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ForwardedHeader {
    None,
    XForwardedFor,
    Forwarded,
}

impl PeerIp {
    /// The peer's address: IPv4 addresses alone, IPv6 by /64, no trusted
    /// proxies.
    #[must_use]
    pub fn new() -> Self {
        Self {
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            trusted: Vec::new(),
            forwarded: ForwardedHeader::None,
            peer: peer_from_extensions,
        }
    }

    /// Groups IPv6 addresses by their first `bits` bits (0 to 128; 64 by
    /// default).
    ///
    /// # Errors
    ///
    /// [`PrefixError`] for more than 128 bits.
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, PrefixError> {
        if bits > 128 {
            return Err(PrefixError { bits, max: 128 });
        }
        self.ipv6_prefix = bits;
        Ok(self)
    }

    /// Groups IPv4 addresses by their first `bits` bits (0 to 32; 32 by
    /// default).
    ///
    /// # Errors
    ///
    /// [`PrefixError`] for more than 32 bits.
    pub fn ipv4_prefix(mut self, bits: u8) -> Result<Self, PrefixError> {
        if bits > 32 {
            return Err(PrefixError { bits, max: 32 });
        }
        self.ipv4_prefix = bits;
        Ok(self)
    }

    /// Reads `X-Forwarded-For` from requests whose peer is in `proxies`.
    #[must_use]
    pub fn trust_x_forwarded_for(self, proxies: impl IntoIterator<Item = IpNet>) -> Self {
        self.trusting(ForwardedHeader::XForwardedFor, proxies)
    }

    /// Reads `Forwarded` (RFC 7239, its `for=` parameters) from requests
    /// whose peer is in `proxies`.
    #[must_use]
    pub fn trust_forwarded(self, proxies: impl IntoIterator<Item = IpNet>) -> Self {
        self.trusting(ForwardedHeader::Forwarded, proxies)
    }

    fn trusting(
        mut self,
        header: ForwardedHeader,
        proxies: impl IntoIterator<Item = IpNet>,
    ) -> Self {
        self.forwarded = header;
        self.trusted = proxies.into_iter().collect();
        self
    }

    /// Finds the peer's address with `peer` instead of the default lookup
    /// (a `SocketAddr`, or axum's `ConnectInfo<SocketAddr>` with feature
    /// `axum`, in the extensions). For tonic:
    /// `|extensions| extensions.get::<TcpConnectInfo>()?.remote_addr().map(|addr| addr.ip())`.
    #[must_use]
    pub fn peer_from(mut self, peer: fn(&Extensions) -> Option<IpAddr>) -> Self {
        self.peer = peer;
        self
    }

    /// The client's address, before grouping.
    fn client(&self, request: &RequestHead<'_>) -> Result<IpAddr, KeyError> {
        let peer = canonical((self.peer)(request.extensions()).ok_or(KeyError::NoPeerAddress)?);
        if self.forwarded == ForwardedHeader::None || !self.is_trusted(peer) {
            return Ok(peer);
        }
        let name = match self.forwarded {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            _ => "forwarded",
        };
        // Every occurrence of the header, in order, is one list; it is read
        // from its last entry back, each entry on its own, so that what a
        // client wrote before (bytes that are not text, an unclosed quote)
        // cannot spoil what the proxies appended after it. At most
        // `MAX_HOPS` entries are read, so that a client's long list costs
        // the walk nothing but a scan.
        let hops = request
            .headers()
            .get_all(name)
            .iter()
            .rev()
            .flat_map(|value| match self.forwarded {
                ForwardedHeader::XForwardedFor => x_forwarded_for(value.as_bytes()),
                _ => forwarded_for(value.as_bytes()),
            })
            .take(MAX_HOPS);
        let mut client = peer;
        for hop in hops {
            let Some(address) = hop.map(canonical) else {
                break;
            };
            client = address;
            if !self.is_trusted(address) {
                break;
            }
        }
        Ok(client)
    }

    fn is_trusted(&self, address: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(address))
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for PeerIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerIp")
            .field("ipv4_prefix", &self.ipv4_prefix)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .field("trusted", &self.trusted)
            .field("forwarded", &self.forwarded)
            .finish_non_exhaustive()
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpKey;

    fn extract(&self, request: &RequestHead<'_>) -> Result<IpKey, KeyError> {
        let client = self.client(request)?;
        let prefix = match client {
            IpAddr::V4(_) => self.ipv4_prefix,
            IpAddr::V6(_) => self.ipv6_prefix,
        };
        Ok(IpKey::new(
            IpNet::new(client, prefix).expect("prefix validated by PeerIp"),
        ))
    }
}

/// The default peer lookup: a `SocketAddr` in the extensions, or axum's
/// `ConnectInfo<SocketAddr>`.
fn peer_from_extensions(extensions: &Extensions) -> Option<IpAddr> {
    if let Some(address) = extensions.get::<SocketAddr>() {
        return Some(address.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    None
}

/// An IPv4-mapped IPv6 address as the IPv4 address it maps.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// An address as proxies write it: bare, or as RFC 7239's `node` (an IPv4
/// address, or an IPv6 address in brackets, either with a port after a
/// colon). The port may be obfuscated (section 6.3: `_hidden`); the
/// address is the node's all the same.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(address) = node.parse::<IpAddr>() {
        return Some(address);
    }
    let (address, port) = if let Some(bracketed) = node.strip_prefix('[') {
        let (inner, rest) = bracketed.split_once(']')?;
        let port = if rest.is_empty() {
            None
        } else {
            Some(rest.strip_prefix(':')?)
        };
        (IpAddr::V6(inner.parse::<Ipv6Addr>().ok()?), port)
    } else {
        let (name, port) = node.rsplit_once(':')?;
        (IpAddr::V4(name.parse::<Ipv4Addr>().ok()?), Some(port))
    };
    port.is_none_or(is_node_port).then_some(address)
}

/// RFC 7239's `node-port`: one to five digits, or an obfuscated port (`_`
/// and at least one letter, digit, `.`, `_` or `-`).
fn is_node_port(port: &str) -> bool {
    match port.as_bytes().split_first() {
        Some((b'_', rest)) => {
            !rest.is_empty()
                && rest
                    .iter()
                    .all(|&byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
        }
        _ => (1..=5).contains(&port.len()) && port.bytes().all(|byte| byte.is_ascii_digit()),
    }
}

/// The most entries of a forwarding header read, from its last back: a
/// request that comes through more trusted proxies than this is keyed by
/// the last one read. A client can write hundreds of thousands of entries
/// before its proxy's; they are scanned, never held.
pub(crate) const MAX_HOPS: usize = 32;

/// The nodes of an `X-Forwarded-For` value's last [`MAX_HOPS`] entries, from
/// the last back: `None` for an entry that is not an address.
pub(crate) fn x_forwarded_for(value: &[u8]) -> Vec<Option<IpAddr>> {
    value
        .rsplit(|&byte| byte == b',')
        .take(MAX_HOPS)
        .map(|entry| {
            std::str::from_utf8(entry.trim_ascii())
                .ok()
                .and_then(parse_node)
        })
        .collect()
}

/// The `for=` nodes of a `Forwarded` value's last [`MAX_HOPS`] elements,
/// from the last back: `None` for an element without one, or whose node is
/// not an address (`unknown`, an obfuscated `_identifier`, bytes that are
/// not text).
///
/// The elements are split from the end ([`elements_from_end`]), so that
/// the elements proxies appended are read exactly as they wrote them,
/// whatever a client wrote before them: an unclosed quote, bytes that are
/// not text, or a quoted string that the proxies' own quoted strings
/// would close.
pub(crate) fn forwarded_for(value: &[u8]) -> Vec<Option<IpAddr>> {
    elements_from_end(value)
        .take(MAX_HOPS)
        .map(for_node)
        .collect()
}

/// A `Forwarded` value's elements, from the last back: split at each comma
/// outside a quoted string, read from the end.
///
/// Read from the end, a well-formed element is delimited exactly: a `"`
/// met outside a quoted string closes one, and inside one, a `"` after an
/// odd number of backslashes is escaped, any other opens it (in a
/// well-formed value an opening quote follows `=`, never a backslash).
/// Read from the start, a client's unclosed quote would swallow the
/// elements appended after it, and its quote would pair with theirs,
/// putting their quoted commas outside and their separators inside a
/// quoted string (a quoted `host` holding `, for=` and an address would
/// then read as an element). What a client wrote is reached only after
/// every element appended after it; a quote of its own that does not
/// close from the end ends the last element read at the value's start.
fn elements_from_end(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(value);
    std::iter::from_fn(move || {
        let current = rest?;
        let mut quoted = false;
        for index in (0..current.len()).rev() {
            match current[index] {
                b'"' if !quoted => quoted = true,
                b'"' => {
                    let backslashes = current[..index]
                        .iter()
                        .rev()
                        .take_while(|&&byte| byte == b'\\')
                        .count();
                    quoted = backslashes % 2 == 1;
                }
                b',' if !quoted => {
                    rest = Some(&current[..index]);
                    return Some(&current[index + 1..]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(current)
    })
}

/// The address of a `Forwarded` element's `for=` node, if it has one that
/// is an address.
fn for_node(element: &[u8]) -> Option<IpAddr> {
    split_unquoted(element, b';').find_map(|pair| {
        let equals = pair.iter().position(|&byte| byte == b'=')?;
        let (name, node) = (&pair[..equals], &pair[equals + 1..]);
        if !name.trim_ascii().eq_ignore_ascii_case(b"for") {
            return None;
        }
        let node = node.trim_ascii();
        let node = match node.strip_prefix(b"\"") {
            Some(quoted) => unquote(quoted.strip_suffix(b"\"")?)?,
            None => node.to_vec(),
        };
        parse_node(std::str::from_utf8(&node).ok()?)
    })
}

/// Splits `value` at each `separator` (an ASCII byte, so never inside a
/// UTF-8 character) outside a quoted string.
fn split_unquoted(value: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(value);
    std::iter::from_fn(move || {
        let current = rest?;
        let mut quoted = false;
        let mut escaped = false;
        for (index, &byte) in current.iter().enumerate() {
            match byte {
                _ if escaped => escaped = false,
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                _ if byte == separator && !quoted => {
                    rest = Some(&current[index + 1..]);
                    return Some(&current[..index]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(current)
    })
}

/// The bytes of a quoted string's inside, its escapes undone; `None` for a
/// lone backslash at the end.
fn unquote(inside: &[u8]) -> Option<Vec<u8>> {
    let mut text = Vec::with_capacity(inside.len());
    let mut bytes = inside.iter();
    while let Some(&byte) = bytes.next() {
        if byte == b'\\' {
            text.push(*bytes.next()?);
        } else {
            text.push(byte);
        }
    }
    Some(text)
}

/// A prefix longer than the address family has bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixError {
    bits: u8,
    max: u8,
}

impl fmt::Display for PrefixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a prefix of {} bits is longer than the {} the address has",
            self.bits, self.max
        )
    }
}

impl std::error::Error for PrefixError {}

/// An IP network: an address and a prefix length, such as `10.0.0.0/8` or
/// `2001:db8::/32` (a bare address is the network of that one address).
/// The address is kept masked to its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    address: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// The network of `prefix` bits that holds `address` (IPv4-mapped IPv6
    /// addresses are IPv4, with the prefix counted in IPv4 bits).
    ///
    /// # Errors
    ///
    /// [`PrefixError`] for a prefix longer than the address.
    pub fn new(address: IpAddr, prefix: u8) -> Result<Self, PrefixError> {
        let address = canonical(address);
        let max = match address {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > max {
            return Err(PrefixError { bits: prefix, max });
        }
        Ok(Self {
            address: mask(address, prefix),
            prefix,
        })
    }

    /// The network's first address.
    #[must_use]
    pub const fn address(&self) -> IpAddr {
        self.address
    }

    /// The prefix length in bits.
    #[must_use]
    pub const fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `address` is in this network.
    #[must_use]
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        address.is_ipv4() == self.address.is_ipv4() && mask(address, self.prefix) == self.address
    }
}

/// `address` with every bit past the first `prefix` cleared.
fn mask(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & kept))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & kept))
        }
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// Why a string is not an [`IpNet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpNetError(String);

impl fmt::Display for IpNetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an IP network (address/prefix): {:?}", self.0)
    }
}

impl std::error::Error for IpNetError {}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(text: &str) -> Result<Self, IpNetError> {
        let invalid = || IpNetError(text.to_owned());
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => {
                // Digits only: `u8::from_str` would take a leading `+`.
                if prefix.is_empty() || !prefix.bytes().all(|byte| byte.is_ascii_digit()) {
                    return Err(invalid());
                }
                (address, Some(prefix.parse::<u8>().map_err(|_| invalid())?))
            }
            None => (text, None),
        };
        let address = canonical(address.parse::<IpAddr>().map_err(|_| invalid())?);
        let prefix = prefix.unwrap_or(if address.is_ipv4() { 32 } else { 128 });
        Self::new(address, prefix).map_err(|_| invalid())
    }
}

/// The key [`PeerIp`] gives a request: the client's network, as bytes
/// (`AsRef<[u8]>`, for a backend that keys by bytes) and as text
/// (`Display`: `198.51.100.7/32`, `2001:db8:1:2::/64`).
///
/// Owned and fixed in size: 19 bytes inline (at most 18 of them
/// meaningful), no allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpKey {
    /// The family (4 or 6), the prefix, then the masked address's bytes.
    bytes: [u8; 18],
    len: u8,
}

impl IpKey {
    fn new(net: IpNet) -> Self {
        let mut bytes = [0; 18];
        bytes[1] = net.prefix;
        let len = match net.address {
            IpAddr::V4(v4) => {
                bytes[0] = 4;
                bytes[2..6].copy_from_slice(&v4.octets());
                6
            }
            IpAddr::V6(v6) => {
                bytes[0] = 6;
                bytes[2..18].copy_from_slice(&v6.octets());
                18
            }
        };
        Self { bytes, len }
    }

    /// The network.
    #[must_use]
    pub fn net(&self) -> IpNet {
        let address = if self.bytes[0] == 4 {
            IpAddr::V4(Ipv4Addr::new(
                self.bytes[2],
                self.bytes[3],
                self.bytes[4],
                self.bytes[5],
            ))
        } else {
            let mut octets = [0; 16];
            octets.copy_from_slice(&self.bytes[2..18]);
            IpAddr::V6(Ipv6Addr::from(octets))
        };
        IpNet {
            address,
            prefix: self.bytes[1],
        }
    }
}

/// The meaningful bytes in one write: a keyed check hashes this on every
/// request (`SipHash` by default), and one call costs less than the derived
/// array's length prefix and bytes.
impl std::hash::Hash for IpKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.as_ref());
    }
}

impl AsRef<[u8]> for IpKey {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Display for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.net(), f)
    }
}

impl fmt::Debug for IpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpKey({self})")
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, SocketAddr};

    use super::{
        IpNet, KeyExtractor, MAX_HOPS, PeerIp, forwarded_for, parse_node, x_forwarded_for,
    };
    use crate::head::RequestHead;

    #[test]
    fn networks_parse_mask_and_contain() {
        let net: IpNet = "10.1.2.3/8".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains("10.255.0.1".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        assert!(net.contains("::ffff:10.9.9.9".parse().unwrap()));
        let v6: IpNet = "2001:db8:1:2:3:4:5:6/64".parse().unwrap();
        assert_eq!(v6.to_string(), "2001:db8:1:2::/64");
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        let everything: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(everything.contains("203.0.113.9".parse().unwrap()));
        assert!(!everything.contains("::1".parse().unwrap()));
        assert_eq!("192.0.2.1".parse::<IpNet>().unwrap().prefix(), 32);
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "ten/8",
            "",
            "10.0.0.0/8/8",
        ] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn nodes_parse_with_ports_and_brackets() {
        let v6: IpAddr = "2001:db8::17".parse().unwrap();
        assert_eq!(parse_node("[2001:db8::17]:4711"), Some(v6));
        assert_eq!(parse_node("[2001:db8::17]"), Some(v6));
        assert_eq!(
            parse_node("192.0.2.60:80"),
            Some("192.0.2.60".parse().unwrap())
        );
        assert_eq!(parse_node("unknown"), None);
        assert_eq!(parse_node("_hidden"), None);
    }

    #[test]
    fn an_unclosed_quote_or_bytes_not_text_swallow_nothing_appended_after_them() {
        assert_eq!(
            forwarded_for(br#"for="[::1, for=198.51.100.9"#),
            [Some("198.51.100.9".parse().unwrap()), None]
        );
        assert_eq!(
            forwarded_for(b"for=\xff\xfe;by=\"\xfd\", for=198.51.100.9"),
            [Some("198.51.100.9".parse().unwrap()), None]
        );
    }

    /// Found by the `forwarding_round_trip` fuzz target: an address with
    /// an obfuscated port (RFC 7239 section 6.3) was read as no address,
    /// so a walk stopped at it, and every client of that proxy shared one
    /// key.
    #[test]
    fn an_obfuscated_port_names_its_address() {
        assert_eq!(
            forwarded_for(br#"FOR="\8\1\.\8\1\.\8\1\.\8\1\:\_\a\a\a\a\a\a\a\a",FOR=unknown"#),
            [None, Some("81.81.81.81".parse().unwrap())]
        );
        for (node, address) in [
            ("192.0.2.60:_hidden", Some("192.0.2.60")),
            ("[2001:db8::17]:_x.y-Z_9", Some("2001:db8::17")),
            ("192.0.2.60:00080", Some("192.0.2.60")),
            // One to five digits, as RFC 7239 writes ports.
            ("192.0.2.60:99999", Some("192.0.2.60")),
            ("192.0.2.60:123456", None),
            ("192.0.2.60:", None),
            ("192.0.2.60:_", None),
            ("192.0.2.60:_a b", None),
            ("192.0.2.60:8O", None),
            ("[2001:db8::17]:", None),
            ("[2001:db8::17]x", None),
            ("[192.0.2.60]", None),
            ("[192.0.2.60]:80", None),
            ("_hidden:80", None),
        ] {
            assert_eq!(
                parse_node(node),
                address.map(|address| address.parse().unwrap()),
                "{node}"
            );
        }
    }

    /// Found by the `forwarding_round_trip` fuzz target: read from the
    /// start, a client's unclosed quote paired with the first quote the
    /// proxies wrote after it, and the commas they quoted (here escaped
    /// ones, in a parameter's value) split their elements: both nodes
    /// were lost.
    #[test]
    fn a_clients_quote_does_not_pair_with_the_proxies_quotes() {
        let mapped = |v4: &str| {
            Some(IpAddr::V6(
                v4.parse::<std::net::Ipv4Addr>().unwrap().to_ipv6_mapped(),
            ))
        };
        assert_eq!(
            forwarded_for(
                b"\xa0\xa0\xa0\xa0\xa0\xa0\"\x00\x00\x00 , for=\"[::ffff:10.4.255.255]:65535\"\t,\thost=\"\\\xa0\\\xff\\\xfa\";|||=\"\\\xa0\\\xa0\\\xa0\\\xff\\,\\,\\,\";for=\"[::ffff:160.160.160.160]:9762\""
            ),
            [mapped("160.160.160.160"), mapped("10.4.255.255"), None]
        );
    }

    /// What the fuzz target's finding allowed: a client that sends an
    /// unclosed quote, and a `Host` that a proxy writes in its element's
    /// `host` parameter, chose its own key.
    #[test]
    fn a_client_cannot_choose_its_key_through_a_quoted_host() {
        let peer = PeerIp::new().trust_forwarded(["10.0.0.0/8".parse().unwrap()]);
        // The client's line, `"`, and its proxy's element appended to it,
        // with the client's `Host` (`a, for=203.0.113.66;x="`) quoted.
        let mut request = http::Request::get("/")
            .header(
                "forwarded",
                r#"", for=198.51.100.7;host="a, for=203.0.113.66;x=\"""#,
            )
            .body(())
            .unwrap();
        request
            .extensions_mut()
            .insert("10.0.0.2:443".parse::<SocketAddr>().unwrap());
        assert_eq!(
            peer.extract(&RequestHead::of(&request))
                .unwrap()
                .to_string(),
            "198.51.100.7/32"
        );
    }

    #[test]
    fn forwarded_elements_yield_their_for_nodes_from_the_last() {
        let nodes = forwarded_for(
            br#"for=192.0.2.60;proto=http;by=203.0.113.43, For="[2001:db8:cafe::17]:4711", for=unknown, proto=https, for="_x\"y,z", for="\xff", for=\xfe"#,
        );
        assert_eq!(
            nodes,
            [
                None,
                None,
                None,
                None,
                None,
                Some("2001:db8:cafe::17".parse().unwrap()),
                Some("192.0.2.60".parse().unwrap()),
            ]
        );
    }

    #[test]
    fn only_the_last_entries_are_read() {
        let mut x_forwarded_for_value = "junk, ".repeat(100_000).into_bytes();
        let mut forwarded_value = "for=\"[::1, ".repeat(100_000).into_bytes();
        for value in [&mut x_forwarded_for_value, &mut forwarded_value] {
            value.extend_from_slice(b"192.0.2.1");
        }
        forwarded_value.splice(
            forwarded_value.len() - 9..forwarded_value.len() - 9,
            *b"for=",
        );
        for nodes in [
            x_forwarded_for(&x_forwarded_for_value),
            forwarded_for(&forwarded_value),
        ] {
            assert_eq!(nodes.len(), MAX_HOPS);
            assert_eq!(nodes[0], Some("192.0.2.1".parse().unwrap()));
            assert!(nodes[1..].iter().all(Option::is_none));
        }
    }

    #[test]
    fn past_the_last_hops_read_the_last_trusted_proxy_read_is_the_key() {
        let peer = PeerIp::new().trust_x_forwarded_for(["10.0.0.0/8".parse().unwrap()]);
        let key = |hops: usize| {
            let value = std::iter::once("198.51.100.7".to_owned())
                .chain((1..=hops).rev().map(|hop| format!("10.0.0.{hop}")))
                .collect::<Vec<_>>()
                .join(", ");
            let mut request = http::Request::get("/")
                .header("x-forwarded-for", value)
                .body(())
                .unwrap();
            request
                .extensions_mut()
                .insert("10.0.0.254:443".parse::<SocketAddr>().unwrap());
            peer.extract(&RequestHead::of(&request))
                .unwrap()
                .to_string()
        };
        assert_eq!(key(MAX_HOPS - 1), "198.51.100.7/32");
        assert_eq!(key(MAX_HOPS), "10.0.0.32/32");
        assert_eq!(key(MAX_HOPS + 8), "10.0.0.32/32");
    }

    #[test]
    fn x_forwarded_for_entries_are_read_from_the_last_one_by_one() {
        assert_eq!(
            x_forwarded_for(b"\xff\xfe, 198.51.100.1 ,[2001:db8::1]:80,"),
            [
                None,
                Some("2001:db8::1".parse().unwrap()),
                Some("198.51.100.1".parse().unwrap()),
                None
            ]
        );
    }
}
