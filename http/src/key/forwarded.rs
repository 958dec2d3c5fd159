//! Reading `X-Forwarded-For` and `Forwarded` (RFC 7239): the nodes their
//! last entries name, read from the end, so that what a client wrote
//! before its proxies' entries cannot change how theirs read.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Reads an address as proxies write it: bare, or as RFC 7239's `node` (an
/// IPv4 address, or an IPv6 address in brackets, either with a port after
/// a colon). The port may be obfuscated (section 6.3: `_hidden`); the
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

/// Returns whether `port` is RFC 7239's `node-port`: one to five digits,
/// or an obfuscated port (`_` and at least one letter, digit, `.`, `_` or
/// `-`).
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

/// Reads the nodes of an `X-Forwarded-For` value's last [`MAX_HOPS`]
/// entries, from the last back: `None` for an entry that is not an address.
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

/// Reads the `for=` nodes of a `Forwarded` value's last [`MAX_HOPS`]
/// elements, from the last back: `None` for an element without one, or
/// whose node is not an address (`unknown`, an obfuscated `_identifier`,
/// bytes that are not text).
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

/// Splits a `Forwarded` value into its elements, from the last back: at
/// each comma outside a quoted string, read from the end.
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

/// Returns the address of a `Forwarded` element's `for=` node, if it has
/// one that is an address.
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

/// Returns the bytes of a quoted string's inside, its escapes undone;
/// `None` for a lone backslash at the end.
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

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::{MAX_HOPS, forwarded_for, parse_node, x_forwarded_for};

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

    /// An address with an obfuscated port (RFC 7239 section 6.3) is an
    /// address: read as none, it would stop a walk at its proxy, and every
    /// client of that proxy would share one key.
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

    /// Read from the start, a client's unclosed quote would pair with the
    /// first quote the proxies wrote after it, and the commas they quoted
    /// (here escaped ones, in a parameter's value) would split their
    /// elements: both nodes would be lost. Read from the end, neither is.
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
