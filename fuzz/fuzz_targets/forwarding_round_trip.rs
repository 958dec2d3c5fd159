//! The forwarding-header parsers read back exactly what proxies wrote.
//!
//! From the fuzzer's bytes: a list of nodes (addresses, IPv4 and IPv6 and
//! IPv4-mapped, some in the trusted networks; `unknown`; obfuscated
//! identifiers), written as well-formed `X-Forwarded-For` and `Forwarded`
//! (RFC 7239: IPv6 in brackets, ports and obfuscated ports, quoted strings
//! with escapes, other parameters in any order whose quoted values hold
//! any byte a quoted string may, names in any case, whitespace around the
//! commas), after an optional prefix of arbitrary bytes that a client wrote
//! before the proxies appended their entries. Checked:
//!
//! * each parser returns exactly those nodes, from the last back, as many
//!   as `MAX_HOPS` lets it read, whatever the client's prefix holds;
//! * `PeerIp`, with the list cut into several header lines, keys the
//!   request by the first node from the end that is not a trusted proxy,
//!   or by the last one read when the walk stops on a node that is not
//!   an address or at the bound.

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tollgate_http::fuzzing::{MAX_HOPS, forwarded_for, x_forwarded_for};
use tollgate_http::{IpNet, KeyExtractor, PeerIp, RequestHead};

fuzz_target!(|data: &[u8]| {
    let _ = check(&mut Unstructured::new(data));
});

/// What one proxy names: the node of its entry.
#[derive(Debug, Clone, Copy)]
enum Node {
    Address(IpAddr),
    /// `unknown`.
    Unknown,
    /// An obfuscated identifier (`_hidden`).
    Obfuscated,
    /// A `Forwarded` element with no `for=` (`unknown` in
    /// `X-Forwarded-For`).
    Missing,
}

impl Node {
    fn address(self) -> Option<IpAddr> {
        match self {
            Node::Address(address) => Some(address),
            _ => None,
        }
    }
}

fn check(u: &mut Unstructured<'_>) -> Result<()> {
    let count = u.int_in_range(1..=MAX_HOPS + 6)?;
    let mut nodes = Vec::with_capacity(count);
    for _ in 0..count {
        nodes.push(node(u)?);
    }
    let prefix = if u.ratio(1, 2)? {
        let len = u.int_in_range(0..=24)?;
        Some(u.bytes(len)?.to_vec())
    } else {
        None
    };
    // The nodes a parser must return: from the last back, up to the bound.
    let expected: Vec<Option<IpAddr>> = nodes.iter().rev().map(|node| node.address()).collect();
    let read = expected.len().min(MAX_HOPS);

    let mut xff_elements = Vec::with_capacity(count);
    let mut forwarded_elements = Vec::with_capacity(count);
    for node in &nodes {
        xff_elements.push(xff_entry(u, *node)?);
        forwarded_elements.push(forwarded_element(u, *node)?);
    }
    for (parse, elements, name) in [
        (
            x_forwarded_for as fn(&[u8]) -> Vec<Option<IpAddr>>,
            &xff_elements,
            "x-forwarded-for",
        ),
        (forwarded_for, &forwarded_elements, "forwarded"),
    ] {
        // One line: the client's prefix, then the proxies' list.
        let mut value = Vec::new();
        if let Some(prefix) = &prefix {
            value.extend_from_slice(prefix);
            push_comma(u, &mut value)?;
        }
        for (index, element) in elements.iter().enumerate() {
            if index > 0 {
                push_comma(u, &mut value)?;
            }
            value.extend_from_slice(element);
        }
        let nodes_read = parse(&value);
        assert_eq!(
            nodes_read[..read],
            expected[..read],
            "{name}: b\"{}\"",
            value.escape_ascii()
        );
        if prefix.is_none() {
            assert_eq!(nodes_read.len(), read);
        }
        walk(u, name, prefix.as_deref(), elements, &expected)?;
    }
    Ok(())
}

/// The trusted proxies' networks.
const TRUSTED: [&str; 2] = ["10.0.0.0/8", "fd00::/8"];

/// `PeerIp` over the list cut into header lines (the client's prefix on
/// a line of its own or at the start of the first) keys the request as
/// the walk over the expected nodes does.
fn walk(
    u: &mut Unstructured<'_>,
    name: &'static str,
    prefix: Option<&[u8]>,
    elements: &[Vec<u8>],
    expected: &[Option<IpAddr>],
) -> Result<()> {
    let trusted = TRUSTED.map(|net| net.parse::<IpNet>().unwrap());
    let is_trusted = |address: IpAddr| trusted.iter().any(|net| net.contains(address));
    let peer: IpAddr = if u.ratio(7, 8)? {
        "10.0.0.1".parse().unwrap()
    } else {
        "198.51.100.1".parse().unwrap()
    };
    let mut lines: Vec<Vec<u8>> = Vec::new();
    let mut line = Vec::new();
    if let Some(prefix) = prefix {
        // Only bytes a header value may hold.
        line.extend(
            prefix
                .iter()
                .filter(|&&byte| byte == b'\t' || (byte >= 0x20 && byte != 0x7f)),
        );
        if u.ratio(1, 2)? {
            lines.push(std::mem::take(&mut line));
        } else {
            push_comma(u, &mut line)?;
        }
    }
    for (index, element) in elements.iter().enumerate() {
        if index > 0 {
            if u.ratio(1, 4)? {
                lines.push(std::mem::take(&mut line));
            } else {
                push_comma(u, &mut line)?;
            }
        }
        line.extend_from_slice(element);
    }
    lines.push(line);

    let extractor = match name {
        "x-forwarded-for" => PeerIp::new().trust_x_forwarded_for(trusted),
        _ => PeerIp::new().trust_forwarded(trusted),
    };
    let mut request = http::Request::new(());
    for line in &lines {
        let value = http::HeaderValue::from_bytes(line).expect("only header bytes");
        request.headers_mut().append(name, value);
    }
    request.extensions_mut().insert(SocketAddr::new(peer, 443));
    let key = extractor
        .extract(&RequestHead::of(&request))
        .expect("a peer address");

    // The walk, on the nodes written rather than parsed.
    let mut client = peer;
    let mut decided = !is_trusted(peer);
    if !decided {
        for hop in expected.iter().take(MAX_HOPS) {
            let Some(address) = hop.map(canonical) else {
                decided = true;
                break;
            };
            client = address;
            if !is_trusted(address) {
                decided = true;
                break;
            }
        }
    }
    // A walk past every proxy's entry, short of the bound, goes on into
    // the client's prefix, whose reading is not this target's business.
    if decided || expected.len() >= MAX_HOPS || prefix.is_none() {
        let bits = if client.is_ipv4() { 32 } else { 64 };
        assert_eq!(
            key.net(),
            IpNet::new(client, bits).unwrap(),
            "{name}: {lines:?}"
        );
    }
    Ok(())
}

fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

fn node(u: &mut Unstructured<'_>) -> Result<Node> {
    Ok(match u.int_in_range(0..=15)? {
        0 => Node::Unknown,
        1 => Node::Obfuscated,
        2 => Node::Missing,
        3..=6 => Node::Address(IpAddr::V4(Ipv4Addr::from(u.arbitrary::<u32>()?))),
        7..=9 => Node::Address(IpAddr::V6(Ipv6Addr::from(u.arbitrary::<u128>()?))),
        10 => Node::Address(IpAddr::V6(
            Ipv4Addr::from(u.arbitrary::<u32>()?).to_ipv6_mapped(),
        )),
        // Trusted proxies.
        11..=13 => Node::Address(IpAddr::V4(Ipv4Addr::from(
            0x0a00_0000 | (u.arbitrary::<u32>()? & 0x00ff_ffff),
        ))),
        14 => Node::Address(IpAddr::V6(Ipv6Addr::from(
            (0xfd << 120) | (u.arbitrary::<u128>()? >> 8),
        ))),
        _ => Node::Address(IpAddr::V6(
            Ipv4Addr::from(0x0a00_0000 | (u.arbitrary::<u32>()? & 0x00ff_ffff)).to_ipv6_mapped(),
        )),
    })
}

/// Optional whitespace, a comma, optional whitespace.
fn push_comma(u: &mut Unstructured<'_>, out: &mut Vec<u8>) -> Result<()> {
    push_whitespace(u, out)?;
    out.push(b',');
    push_whitespace(u, out)
}

fn push_whitespace(u: &mut Unstructured<'_>, out: &mut Vec<u8>) -> Result<()> {
    for _ in 0..u.int_in_range(0..=2)? {
        out.push(if u.ratio(1, 4)? { b'\t' } else { b' ' });
    }
    Ok(())
}

/// An IPv6 address as text: compressed (`Display`), every group written
/// (with or without leading zeros, in either case), or with the last 32
/// bits as a dotted quad.
fn ipv6_text(u: &mut Unstructured<'_>, address: Ipv6Addr) -> Result<String> {
    let groups = address.segments();
    let group = |u: &mut Unstructured<'_>, value: u16| -> Result<String> {
        let text = if u.ratio(1, 2)? {
            format!("{value:x}")
        } else {
            format!("{value:04x}")
        };
        Ok(if u.ratio(1, 3)? {
            text.to_uppercase()
        } else {
            text
        })
    };
    Ok(match u.int_in_range(0..=2)? {
        0 => address.to_string(),
        1 => {
            let mut parts = Vec::with_capacity(8);
            for &value in &groups {
                parts.push(group(u, value)?);
            }
            parts.join(":")
        }
        _ => {
            let mut parts = Vec::with_capacity(7);
            for &value in &groups[..6] {
                parts.push(group(u, value)?);
            }
            let [a, b] = groups[6].to_be_bytes();
            let [c, d] = groups[7].to_be_bytes();
            parts.push(format!("{a}.{b}.{c}.{d}"));
            parts.join(":")
        }
    })
}

/// A port: up to five digits, leading zeros allowed.
fn port(u: &mut Unstructured<'_>) -> Result<String> {
    let port = u.arbitrary::<u16>()?;
    let width = u.int_in_range(0..=5)?;
    Ok(format!("{port:0width$}"))
}

/// An obfuscated identifier: `_` and 1 to 8 of ALPHA, DIGIT, `.`, `_`, `-`.
fn obfuscated(u: &mut Unstructured<'_>) -> Result<String> {
    const CHARS: &[u8] = b"abcXYZ019._-";
    let mut text = String::from("_");
    for _ in 0..u.int_in_range(1..=8)? {
        text.push(char::from(*u.choose(CHARS)?));
    }
    Ok(text)
}

/// A node's text in `X-Forwarded-For`: an address, with or without a port
/// (an IPv6 address with one in brackets), `unknown`, or an obfuscated
/// identifier, with whitespace around it.
fn xff_entry(u: &mut Unstructured<'_>, node: Node) -> Result<Vec<u8>> {
    let text = match node {
        Node::Address(IpAddr::V4(v4)) => {
            if u.ratio(1, 3)? {
                format!("{v4}:{}", port(u)?)
            } else {
                v4.to_string()
            }
        }
        Node::Address(IpAddr::V6(v6)) => {
            let address = ipv6_text(u, v6)?;
            match u.int_in_range(0..=2)? {
                0 => address,
                1 => format!("[{address}]"),
                _ => format!("[{address}]:{}", port(u)?),
            }
        }
        Node::Unknown | Node::Missing => "unknown".to_owned(),
        Node::Obfuscated => obfuscated(u)?,
    };
    Ok(text.into_bytes())
}

/// A node's `Forwarded` element (RFC 7239): `for=` with the node (a token
/// where the node is one, else a quoted string, some of whose characters
/// are escaped without need), beside other parameters, in any order.
fn forwarded_element(u: &mut Unstructured<'_>, node: Node) -> Result<Vec<u8>> {
    let port = |u: &mut Unstructured<'_>| -> Result<String> {
        Ok(match u.int_in_range(0..=3)? {
            0 => format!(":{}", port(u)?),
            1 => format!(":{}", obfuscated(u)?),
            _ => String::new(),
        })
    };
    let node_text = match node {
        Node::Address(IpAddr::V4(v4)) => Some(format!("{v4}{}", port(u)?)),
        Node::Address(IpAddr::V6(v6)) => Some(format!("[{}]{}", ipv6_text(u, v6)?, port(u)?)),
        Node::Unknown => Some(if u.ratio(1, 2)? { "unknown" } else { "UnKnown" }.to_owned()),
        Node::Obfuscated => Some(format!("{}{}", obfuscated(u)?, port(u)?)),
        Node::Missing => None,
    };
    let mut pairs: Vec<Vec<u8>> = Vec::new();
    if let Some(text) = node_text {
        let mut pair = case(u, "for")?.into_bytes();
        pair.push(b'=');
        if text.bytes().all(is_tchar) && u.ratio(1, 2)? {
            pair.extend_from_slice(text.as_bytes());
        } else {
            push_quoted(u, &mut pair, text.as_bytes())?;
        }
        pairs.push(pair);
    }
    for _ in 0..u.int_in_range(0..=3)? {
        let name = match u.int_in_range(0..=3)? {
            0 => case(u, "by")?,
            1 => case(u, "proto")?,
            2 => case(u, "host")?,
            _ => token(u)?,
        };
        // A parameter appears once in an element.
        if name.eq_ignore_ascii_case("for")
            || pairs.iter().any(|pair| {
                pair.len() > name.len()
                    && pair[name.len()] == b'='
                    && pair[..name.len()].eq_ignore_ascii_case(name.as_bytes())
            })
        {
            continue;
        }
        let mut pair = name.into_bytes();
        pair.push(b'=');
        if u.ratio(1, 3)? {
            pair.extend_from_slice(token(u)?.as_bytes());
        } else {
            let len = u.int_in_range(0..=16)?;
            let text: Vec<u8> = u
                .bytes(len)?
                .iter()
                .map(|&byte| {
                    // A quoted string holds HTAB, SP, VCHAR and obs-text.
                    if byte == b'\t' || (byte >= 0x20 && byte != 0x7f) {
                        byte
                    } else {
                        b','
                    }
                })
                .collect();
            push_quoted(u, &mut pair, &text)?;
        }
        let at = u.int_in_range(0..=pairs.len())?;
        pairs.insert(at, pair);
    }
    Ok(pairs.join(&b';'))
}

/// `text` as a quoted string: `"` and `\` escaped, and any other character
/// now and then.
fn push_quoted(u: &mut Unstructured<'_>, out: &mut Vec<u8>, text: &[u8]) -> Result<()> {
    out.push(b'"');
    for &byte in text {
        if byte == b'"' || byte == b'\\' || u.ratio(1, 8)? {
            out.push(b'\\');
        }
        out.push(byte);
    }
    out.push(b'"');
    Ok(())
}

/// `name` with each letter in either case.
fn case(u: &mut Unstructured<'_>, name: &str) -> Result<String> {
    let mut text = String::with_capacity(name.len());
    for character in name.chars() {
        text.push(if u.ratio(1, 4)? {
            character.to_ascii_uppercase()
        } else {
            character
        });
    }
    Ok(text)
}

fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// A token of 1 to 8 characters.
fn token(u: &mut Unstructured<'_>) -> Result<String> {
    const CHARS: &[u8] = b"!#$%&'*+-.^_`|~azAZ09";
    let mut text = String::new();
    for _ in 0..u.int_in_range(1..=8)? {
        text.push(char::from(*u.choose(CHARS)?));
    }
    Ok(text)
}
