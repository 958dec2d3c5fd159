//! The Redis key encoding (`tollgate-redis`, `key.rs`) is injective, keeps
//! every key inside its prefix and its own hash tag, and its `SCAN` pattern
//! matches exactly its own keys.
//!
//! Two inputs (prefix, limiter name, algorithm, fixed hash tag or none,
//! user key) are built from the fuzzer's bytes: the second is
//! either independent of the first, the first with some fields changed, or
//! the first's name and user key cut at another place (the encoding's
//! weak spot, were it not length-prefixed). Checked, for each:
//!
//! * the key starts with the prefix and `{`;
//! * the hash tag Redis Cluster reads (between the first `{` and the first
//!   `}` after it) is the fixed tag, or else eight lowercase hex digits of
//!   FNV-1a over everything after the tag: never bytes of the user key;
//! * a decoder written here recovers every field from the key (the
//!   encoding has an inverse, so it is injective);
//! * and for the pair: equal keys only for equal inputs, with one intended
//!   exception, a fixed tag equal to the hash another limiter of the same
//!   name and algorithm computes for that key: the tag places a key, the
//!   name and algorithm identify it;
//! * the first's `SCAN` pattern, matched as Redis matches globs, matches
//!   the second's key exactly when the two share a prefix, a name and an
//!   algorithm, and the second's tag is one the first's
//!   pattern names (its fixed tag, or eight lowercase hex digits).

#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tollgate::algorithm::{FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket};
use tollgate_redis::fuzzing::Namespace;

fuzz_target!(|data: &[u8]| {
    let _ = check(&mut Unstructured::new(data));
});

/// The layout version every key carries (`key.rs`'s `LAYOUT`).
const LAYOUT: u64 = 2;

const CODES: [u8; 5] = *b"gtfcl";

#[derive(Debug, Clone, PartialEq, Eq)]
struct Input {
    prefix: String,
    name: String,
    code: u8,
    tag: Option<String>,
    key: Vec<u8>,
}

impl Input {
    fn namespace(&self) -> Option<Namespace> {
        let (prefix, name, tag) = (&*self.prefix, &*self.name, self.tag.as_deref());
        match self.code {
            b'g' => Namespace::new::<Gcra>(prefix, name, tag),
            b't' => Namespace::new::<TokenBucket>(prefix, name, tag),
            b'f' => Namespace::new::<FixedWindow>(prefix, name, tag),
            b'c' => Namespace::new::<SlidingWindowCounter>(prefix, name, tag),
            _ => Namespace::new::<SlidingWindowLog>(prefix, name, tag),
        }
        .ok()
    }

    /// Whether the namespace refuses this input: a brace in the prefix or
    /// the tag, or an empty tag.
    fn refused(&self) -> bool {
        self.prefix.contains(['{', '}'])
            || self
                .tag
                .as_ref()
                .is_some_and(|tag| tag.is_empty() || tag.contains(['{', '}']))
    }
}

/// A short string, now and then with a brace, a glob character or a
/// multi-byte character.
fn text(u: &mut Unstructured<'_>, max: usize) -> Result<String> {
    const PIECES: [&str; 16] = [
        "a", "b", ":", "/", "v", "1", "0", "{", "}", "*", "?", "[", "]", "\\", "é", "g",
    ];
    let mut text = String::new();
    for _ in 0..u.int_in_range(0..=max)? {
        if u.ratio(1, 4)? {
            text.push(char::from(u.int_in_range(0x20..=0x7e)?));
        } else {
            text.push_str(u.choose(&PIECES)?);
        }
    }
    Ok(text)
}

fn input(u: &mut Unstructured<'_>) -> Result<Input> {
    Ok(Input {
        prefix: text(u, 6)?,
        name: text(u, 10)?,
        code: *u.choose(&CODES)?,
        tag: if u.ratio(1, 3)? {
            Some(if u.ratio(1, 2)? {
                text(u, 4)?
            } else {
                // A tag that looks like a hash.
                format!("{:08x}", u.arbitrary::<u32>()?)
            })
        } else {
            None
        },
        key: {
            let len = u.int_in_range(0..=24)?;
            u.bytes(len)?.to_vec()
        },
    })
}

/// The second input: independent, changed in a few fields, or the first
/// with its name and key cut elsewhere in the encoded scope.
fn other(u: &mut Unstructured<'_>, first: &Input) -> Result<Input> {
    Ok(match u.int_in_range(0..=2)? {
        0 => input(u)?,
        1 => {
            let fresh = input(u)?;
            let mut second = first.clone();
            if u.ratio(1, 4)? {
                second.prefix = fresh.prefix;
            }
            if u.ratio(1, 3)? {
                second.name = fresh.name;
            }
            if u.ratio(1, 4)? {
                second.code = fresh.code;
            }
            if u.ratio(1, 4)? {
                second.tag = fresh.tag;
            }
            if u.ratio(1, 3)? {
                second.key = fresh.key;
            }
            second
        }
        _ => {
            // The bytes after the name's length, cut at another place: the
            // new name takes the old name and some of what follows, or
            // gives some of its end to the key.
            let mut tail = first.name.clone().into_bytes();
            tail.extend_from_slice(format!(":{}/v{LAYOUT}:", char::from(first.code)).as_bytes());
            tail.extend_from_slice(&first.key);
            let cut = u.int_in_range(0..=tail.len())?;
            let (name, key) = tail.split_at(cut);
            let mut second = first.clone();
            second.name = String::from_utf8_lossy(name).into_owned();
            second.key = key.to_vec();
            second
        }
    })
}

fn check(u: &mut Unstructured<'_>) -> Result<()> {
    let first = input(u)?;
    let second = other(u, &first)?;
    let mut built = Vec::with_capacity(2);
    for input in [&first, &second] {
        let Some(namespace) = input.namespace() else {
            assert!(input.refused(), "{input:?}: a valid input refused");
            return Ok(());
        };
        assert!(!input.refused(), "{input:?}: an invalid input accepted");
        let key = namespace.key(&input.key);
        let decoded = decode(&key).unwrap_or_else(|| panic!("{input:?}: {key:?} does not decode"));
        let hash = format!(
            "{:08x}",
            fold(fnv1a(
                &key[key.iter().position(|&byte| byte == b'}').unwrap() + 1..]
            ))
        );
        assert_eq!(decoded.prefix, input.prefix.as_bytes());
        assert_eq!(
            cluster_tag(&key),
            Some(decoded.tag.as_slice()),
            "{input:?}: {key:?}"
        );
        match &input.tag {
            Some(tag) => assert_eq!(decoded.tag, tag.as_bytes()),
            None => assert_eq!(decoded.tag, hash.as_bytes()),
        }
        assert_eq!(decoded.name, input.name.as_bytes());
        assert_eq!(decoded.code, input.code);
        assert_eq!(decoded.layout, LAYOUT);
        assert_eq!(decoded.key, input.key);
        let pattern = namespace.pattern();
        assert!(glob_match(&pattern, &key), "{pattern:?} misses {key:?}");
        built.push((namespace, key, decoded));
    }
    let [(first_namespace, first_key, a), (_, second_key, b)] = &built[..] else {
        unreachable!()
    };
    let identity = |decoded: &Decoded| {
        (
            decoded.prefix.clone(),
            decoded.name.clone(),
            decoded.code,
            decoded.key.clone(),
        )
    };
    if first_key == second_key {
        assert_eq!(identity(a), identity(b));
        assert!(
            first == second || first.tag.is_none() != second.tag.is_none(),
            "{first:?} and {second:?} share {first_key:?}"
        );
    }
    let same_limit = a.prefix == b.prefix && a.name == b.name && a.code == b.code;
    let named_tag = match &first.tag {
        Some(tag) => b.tag == tag.as_bytes(),
        None => b.tag.len() == 8 && b.tag.iter().all(|byte| b"0123456789abcdef".contains(byte)),
    };
    assert_eq!(
        glob_match(&first_namespace.pattern(), second_key),
        same_limit && named_tag,
        "{first:?} {second:?}"
    );
    Ok(())
}

/// A key's fields, read back.
#[derive(Debug)]
struct Decoded {
    prefix: Vec<u8>,
    tag: Vec<u8>,
    name: Vec<u8>,
    code: u8,
    layout: u64,
    key: Vec<u8>,
}

/// `<prefix>{<tag>}<name length>:<name>:<code>/v<layout>:<key>`,
/// read from the left.
fn decode(mut rest: &[u8]) -> Option<Decoded> {
    fn until<'a>(rest: &mut &'a [u8], byte: u8) -> Option<&'a [u8]> {
        let at = rest.iter().position(|&found| found == byte)?;
        let (head, tail) = rest.split_at(at);
        *rest = &tail[1..];
        Some(head)
    }
    fn decimal(digits: &[u8]) -> Option<u64> {
        // Canonical decimal: digits only, no leading zero.
        if digits.is_empty()
            || !digits.iter().all(u8::is_ascii_digit)
            || (digits.len() > 1 && digits[0] == b'0')
        {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    }
    let prefix = until(&mut rest, b'{')?.to_vec();
    let tag = until(&mut rest, b'}')?.to_vec();
    let name_len = usize::try_from(decimal(until(&mut rest, b':')?)?).ok()?;
    let name = rest.get(..name_len)?.to_vec();
    rest = &rest[name_len..];
    rest = rest.strip_prefix(b":")?;
    let (&code, tail) = rest.split_first()?;
    rest = tail.strip_prefix(b"/v")?;
    let layout = decimal(until(&mut rest, b':')?)?;
    Some(Decoded {
        prefix,
        tag,
        name,
        code,
        layout,
        key: rest.to_vec(),
    })
}

/// The bytes Redis Cluster hashes to place `key` (`keyHashSlot`): between
/// the first `{` and the first `}` after it, if not empty.
fn cluster_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&byte| byte == b'{')?;
    let close = key[open + 1..].iter().position(|&byte| byte == b'}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

fn fold(hash: u64) -> u64 {
    (hash ^ (hash >> 32)) & 0xffff_ffff
}

/// Redis's glob matching (`stringmatchlen` in `util.c`), for the
/// patterns `SCAN` takes: `*`, `?`, `[...]` with `^`, ranges and escapes,
/// and `\` escapes, byte by byte.
fn glob_match(pattern: &[u8], string: &[u8]) -> bool {
    let (mut p, mut s) = (0, 0);
    while p < pattern.len() {
        match pattern[p] {
            b'*' => {
                while p + 1 < pattern.len() && pattern[p + 1] == b'*' {
                    p += 1;
                }
                if p + 1 == pattern.len() {
                    return true;
                }
                return (s..=string.len())
                    .any(|start| glob_match(&pattern[p + 1..], &string[start..]));
            }
            b'?' => {
                if s == string.len() {
                    return false;
                }
                s += 1;
            }
            b'[' => {
                if s == string.len() {
                    return false;
                }
                p += 1;
                let not = pattern.get(p) == Some(&b'^');
                if not {
                    p += 1;
                }
                let mut matched = false;
                loop {
                    if p >= pattern.len() {
                        // An unclosed class: Redis steps back onto its
                        // last byte.
                        p -= 1;
                        break;
                    }
                    if pattern[p] == b'\\' && p + 1 < pattern.len() {
                        p += 1;
                        if pattern[p] == string[s] {
                            matched = true;
                        }
                    } else if pattern[p] == b']' {
                        break;
                    } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' {
                        let (mut start, mut end) = (pattern[p], pattern[p + 2]);
                        if start > end {
                            std::mem::swap(&mut start, &mut end);
                        }
                        p += 2;
                        if (start..=end).contains(&string[s]) {
                            matched = true;
                        }
                    } else if pattern[p] == string[s] {
                        matched = true;
                    }
                    p += 1;
                }
                if matched == not {
                    return false;
                }
                s += 1;
            }
            byte => {
                let literal = if byte == b'\\' && p + 1 < pattern.len() {
                    p += 1;
                    pattern[p]
                } else {
                    byte
                };
                if string.get(s) != Some(&literal) {
                    return false;
                }
                s += 1;
            }
        }
        p += 1;
    }
    s == string.len()
}
