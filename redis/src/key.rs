//! Where a user's key lives in Redis.
//!
//! A user key is attacker-chosen bytes. Its Redis key is
//!
//! ```text
//! <prefix> "{" <tag> "}" <name length> ":" <name> ":" <algorithm> "/v" <layout> ":" <user key>
//! ```
//!
//! * The prefix holds no brace (checked when the limiter is built), so the
//!   first `{` of every key is the crate's, and Redis Cluster hashes only
//!   the tag between it and the first `}`: braces in a user key, which come
//!   after, cannot choose a slot.
//! * The tag is eight hex digits of a hash of everything after it, which
//!   spreads one limiter's keys over the cluster, or for limits that must be
//!   decided together, a tag the limiters were given (one slot for all).
//! * The name is length-prefixed, the algorithm is one letter, and the user
//!   key is last, so the encoding is injective: two different (limiter
//!   name, algorithm, user key) never share a Redis key, whatever bytes the
//!   user key holds, and every key starts with the prefix.
//! * The quota is not part of the key: each value carries the stamp of the
//!   quota that wrote it (its revision, span and burst), and a limiter whose
//!   quota changes reads every key on by that stamp, carrying its state over
//!   (notes/14). The algorithm is, because the values' layouts differ by
//!   algorithm.

use crate::error::ConfigError;

/// The version of the stored values' layout, part of every key: a version
/// that stores a state differently must raise it, so that it never reads
/// (and an older version still running never reads) a value in the other
/// layout. Version 2: GCRA's "TAT", "deficit last", "index count" and
/// "index previous current", each followed by the stamp "revision span
/// burst"; the log's list of the stamp, then its runs "stamp count
/// cumulative". (Version 1 held no stamp and put the quota in the key.)
const LAYOUT: u32 = 2;

/// A limiter's place in the key space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Namespace {
    prefix: Vec<u8>,
    /// `<name length>:<name>:<algorithm>/v<layout>:`, the part before the
    /// user key.
    scope: Vec<u8>,
    /// A fixed hash tag (limits decided together), or none: one per key.
    tag: Option<String>,
}

impl Namespace {
    pub(crate) fn new(
        prefix: &str,
        name: &str,
        code: &str,
        tag: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let bad = |setting, value: &str| ConfigError::BadKeyPart {
            setting,
            value: value.to_owned(),
        };
        if prefix.contains(['{', '}']) {
            return Err(bad("key prefix", prefix));
        }
        if let Some(tag) = tag.filter(|tag| tag.is_empty() || tag.contains(['{', '}'])) {
            return Err(bad("hash tag", tag));
        }
        let scope = format!("{}:{name}:{code}/v{LAYOUT}:", name.len()).into_bytes();
        Ok(Self {
            prefix: prefix.as_bytes().to_vec(),
            scope,
            tag: tag.map(str::to_owned),
        })
    }

    /// Returns the Redis key for `key`.
    pub(crate) fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut encoded = Vec::with_capacity(self.prefix.len() + 10 + self.scope.len() + key.len());
        encoded.extend_from_slice(&self.prefix);
        encoded.push(b'{');
        if let Some(tag) = &self.tag {
            encoded.extend_from_slice(tag.as_bytes());
        } else {
            let hash = fnv1a(fnv1a(FNV_OFFSET, &self.scope), key);
            // Eight hex digits of the 64-bit hash's fold: 2^32 tags spread
            // keys evenly over 16 384 slots.
            let folded = (hash ^ (hash >> 32)) & 0xffff_ffff;
            encoded.extend(
                (0..8)
                    .rev()
                    .map(|digit| HEX[(folded >> (4 * digit)) as usize & 0xf]),
            );
        }
        encoded.push(b'}');
        encoded.extend_from_slice(&self.scope);
        encoded.extend_from_slice(key);
        encoded
    }

    /// Returns the fixed hash tag, if any.
    pub(crate) fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// Returns the glob pattern matching every key of this limiter, for
    /// `SCAN`.
    pub(crate) fn pattern(&self) -> Vec<u8> {
        let mut pattern = Vec::new();
        let escape = |pattern: &mut Vec<u8>, bytes: &[u8]| {
            for &byte in bytes {
                if matches!(byte, b'*' | b'?' | b'[' | b']' | b'\\') {
                    pattern.push(b'\\');
                }
                pattern.push(byte);
            }
        };
        escape(&mut pattern, &self.prefix);
        pattern.push(b'{');
        match &self.tag {
            Some(tag) => escape(&mut pattern, tag.as_bytes()),
            // Exactly the eight hex digits the crate writes: a user key of
            // another limiter cannot be shaped to match.
            None => {
                for _ in 0..8 {
                    pattern.extend_from_slice(b"[0-9a-f]");
                }
            }
        }
        pattern.push(b'}');
        escape(&mut pattern, &self.scope);
        pattern.push(b'*');
        pattern
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a: a fixed hash, the same on every instance and every build, as a
/// key's place must be.
fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::Namespace;

    #[test]
    fn keys_are_prefixed_tagged_and_injective() {
        let api = Namespace::new("app:", "api", "g", None).unwrap();
        let key = api.key(b"alice");
        assert!(key.starts_with(b"app:{"));
        assert_eq!(&key[13..], b"}3:api:g/v2:alice");
        // A name that ends like another name's scope starts: still apart.
        let a = Namespace::new("p", "a:g/v2:", "g", None).unwrap().key(b"x");
        let b = Namespace::new("p", "a", "g", None).unwrap().key(b"g/v2:x");
        assert_ne!(a[11..], b[11..]);
        let fixed = Namespace::new("p", "n", "f", Some("req")).unwrap();
        assert_eq!(fixed.key(b"{x}"), b"p{req}1:n:f/v2:{x}");
        // Another algorithm under the same name: other keys.
        let other = Namespace::new("p", "n", "c", Some("req")).unwrap();
        assert_ne!(other.key(b"x"), fixed.key(b"x"));
    }

    #[test]
    fn the_scan_pattern_names_the_tag_exactly() {
        let spread = Namespace::new("p*", "n", "g", None).unwrap();
        assert_eq!(
            spread.pattern(),
            b"p\\*{[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]}1:n:g/v2:*"
        );
        let fixed = Namespace::new("p", "n", "g", Some("t?")).unwrap();
        assert_eq!(fixed.pattern(), b"p{t\\?}1:n:g/v2:*");
    }

    #[test]
    fn braces_in_the_prefix_or_tag_are_refused() {
        assert!(Namespace::new("a{b", "n", "g", None).is_err());
        assert!(Namespace::new("a", "n", "g", Some("x}")).is_err());
        assert!(Namespace::new("a", "n", "g", Some("")).is_err());
    }
}
