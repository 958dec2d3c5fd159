//! [`PeerIp`]: a request's key is its client's IP network, the peer's
//! address or, behind trusted proxies only, the address they forwarded.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use http::Extensions;

use super::forwarded::{MAX_HOPS, forwarded_for, x_forwarded_for};
use super::net::{IpKey, IpNet, PrefixError, canonical};
use super::{KeyError, KeyExtractor};
use crate::head::RequestHead;

/// The client's IP address, grouped into networks by prefix.
///
/// # The peer
///
/// The address is the connection's peer, found in the request's
/// extensions as a `SocketAddr` (which an application may insert to name
/// the client itself, behind a PROXY-protocol load balancer: it is read
/// first), as axum's `ConnectInfo<SocketAddr>` (feature `axum`), or by a
/// function of your own
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
    /// `None`: [`socket_from_extensions`], called directly.
    peer: Option<fn(&Extensions) -> Option<IpAddr>>,
}

/// Which header names the client behind a trusted proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ForwardedHeader {
    None,
    XForwardedFor,
    Forwarded,
}

impl PeerIp {
    /// Keys requests by the peer's address: IPv4 addresses alone, IPv6 by
    /// /64, no trusted proxies.
    #[must_use]
    pub fn new() -> Self {
        Self {
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            trusted: Vec::new(),
            forwarded: ForwardedHeader::None,
            peer: None,
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
        self.peer = Some(peer);
        self
    }

    /// Returns the key of `client`'s network: the address masked to its
    /// family's prefix (an IPv4-mapped IPv6 address is IPv4), in integers
    /// from the address on (this is on every request's path).
    #[inline]
    fn key(&self, client: IpAddr) -> IpKey {
        match client {
            IpAddr::V4(v4) => IpKey::v4(v4, self.ipv4_prefix),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpKey::v4(v4, self.ipv4_prefix),
                None => IpKey::v6(v6, self.ipv6_prefix),
            },
        }
    }

    /// Finds the client a trusted proxy at `peer` forwarded, or `peer`
    /// itself if it is not a trusted proxy.
    fn forwarded_client(&self, request: &RequestHead<'_>, peer: IpAddr) -> IpAddr {
        let peer = canonical(peer);
        if !self.is_trusted(peer) {
            return peer;
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
        client
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

    // Always inlined into the check that uses the key: returned from a
    // call, the key crosses memory in pieces the caller reads back whole,
    // and the read waits for the writes (a failed store-to-load forward on
    // every request: about half of `Bound::start`'s own samples by `perf`).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn extract(&self, request: &RequestHead<'_>) -> Result<IpKey, KeyError> {
        let peer = match self.peer {
            // The address read where the server recorded it, straight into
            // the key when no proxy is trusted (no copy of it in between:
            // this is on every request's path).
            None => match socket_from_extensions(request.extensions()) {
                Some(SocketAddr::V4(socket)) if self.forwarded == ForwardedHeader::None => {
                    return Ok(IpKey::v4(*socket.ip(), self.ipv4_prefix));
                }
                socket => socket.map(SocketAddr::ip),
            },
            Some(peer) => peer(request.extensions()),
        };
        let Some(peer) = peer else {
            return Err(KeyError::NoPeerAddress);
        };
        let client = match self.forwarded {
            ForwardedHeader::None => peer,
            _ => self.forwarded_client(request, peer),
        };
        Ok(self.key(client))
    }
}

/// Finds the peer the default way: a `SocketAddr` in the extensions, else
/// axum's `ConnectInfo<SocketAddr>` (feature `axum`). The `SocketAddr`
/// comes first although axum's is where most requests carry it (its miss
/// is one hash probe more on their path): no server records a bare
/// `SocketAddr`, so one is there because the application put it there for
/// this request (a PROXY-protocol listener's client), and it must not lose
/// to the connection's address, the load balancer's.
#[inline]
fn socket_from_extensions(extensions: &Extensions) -> Option<&SocketAddr> {
    if let Some(address) = extensions.get::<SocketAddr>() {
        return Some(address);
    }
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(&info.0);
    }
    None
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::super::forwarded::MAX_HOPS;
    use super::PeerIp;
    use crate::head::RequestHead;
    use crate::key::KeyExtractor;

    /// The key of a request from `peer`, recorded as a `SocketAddr` or as
    /// axum's `ConnectInfo`, by `extractor`.
    fn keys(extractor: &PeerIp, peer: &str) -> [String; 2] {
        let peer: SocketAddr = peer.parse().unwrap();
        let mut socket = http::Request::get("/").body(()).unwrap();
        socket.extensions_mut().insert(peer);
        let mut connect_info = http::Request::get("/").body(()).unwrap();
        connect_info
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        [socket, connect_info].map(|request| {
            extractor
                .extract(&RequestHead::of(&request))
                .unwrap()
                .to_string()
        })
    }

    /// An address the application recorded (a PROXY-protocol listener's
    /// client) is the peer, not the connection's: the load balancer's
    /// `ConnectInfo` being a trusted proxy must not let the client's own
    /// `X-Forwarded-For` choose its key.
    #[test]
    fn an_application_recorded_socket_address_is_not_overridden_by_connect_info() {
        let peer = PeerIp::new().trust_x_forwarded_for(["10.0.0.0/8".parse().unwrap()]);
        let mut request = http::Request::get("/")
            .header("x-forwarded-for", "203.0.113.99")
            .body(())
            .unwrap();
        request.extensions_mut().insert(axum::extract::ConnectInfo(
            "10.0.0.2:443".parse::<SocketAddr>().unwrap(),
        ));
        request
            .extensions_mut()
            .insert("198.51.100.7:50000".parse::<SocketAddr>().unwrap());
        let key = peer.extract(&RequestHead::of(&request)).unwrap();
        assert_eq!(key.to_string(), "198.51.100.7/32");
    }

    /// The peer's own address, however the server recorded it: IPv4 whole,
    /// IPv6 by /64, an IPv4-mapped IPv6 address as the IPv4 one; the
    /// prefixes as configured; the same through a trusted proxy's path when
    /// the peer is not one.
    #[test]
    fn a_peer_is_keyed_by_its_network_whatever_its_family() {
        let default = PeerIp::new();
        let wide = PeerIp::new()
            .ipv4_prefix(24)
            .unwrap()
            .ipv6_prefix(48)
            .unwrap();
        let behind = PeerIp::new().trust_x_forwarded_for(["10.0.0.0/8".parse().unwrap()]);
        for (peer, expected, widened) in [
            ("198.51.100.7:443", "198.51.100.7/32", "198.51.100.0/24"),
            (
                "[::ffff:198.51.100.7]:443",
                "198.51.100.7/32",
                "198.51.100.0/24",
            ),
            (
                "[2001:db8:1:2:3:4:5:6]:443",
                "2001:db8:1:2::/64",
                "2001:db8:1::/48",
            ),
        ] {
            assert_eq!(keys(&default, peer), [expected, expected], "{peer}");
            assert_eq!(keys(&wide, peer), [widened, widened], "{peer}");
            assert_eq!(keys(&behind, peer), [expected, expected], "{peer}");
        }
        let mut none = http::Request::get("/").body(()).unwrap();
        assert_eq!(
            default.extract(&RequestHead::of(&none)),
            Err(crate::KeyError::NoPeerAddress)
        );
        none.extensions_mut().insert(1_u8);
        assert_eq!(
            behind.extract(&RequestHead::of(&none)),
            Err(crate::KeyError::NoPeerAddress)
        );
    }

    /// A client that sends an unclosed quote, and a `Host` that a proxy
    /// writes in its element's `host` parameter, cannot choose its own key:
    /// read from the start, the quote would pair with the proxy's, and the
    /// `for=` the client wrote in its `Host` would read as an element.
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
}
