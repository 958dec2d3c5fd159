//! A gRPC client's view of a refusal: `grpc-status`, `grpc-message`, and a
//! `google.rpc.Status` in `grpc-status-details-bin` carrying a
//! `google.rpc.RetryInfo` with the wait, as the gRPC richer error model
//! has every client library read it. Encoded by hand: four small protobuf
//! messages do not need a protobuf dependency.

use std::fmt::Write as _;
use std::time::Duration;

/// `RESOURCE_EXHAUSTED`: the code for a rate-limited call.
pub(crate) const RESOURCE_EXHAUSTED: u32 = 8;
/// `UNAVAILABLE`: the limiter could not decide.
pub(crate) const UNAVAILABLE: u32 = 14;
/// `INVALID_ARGUMENT`: no key in the request.
pub(crate) const INVALID_ARGUMENT: u32 = 3;
/// `INTERNAL`: the server cannot key requests (a configuration error).
pub(crate) const INTERNAL: u32 = 13;

const RETRY_INFO_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// `grpc-message`: the gRPC spec's percent-encoding (every byte outside
/// printable ASCII, and `%`).
pub(crate) fn percent_encode(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// `grpc-status-details-bin`: a `google.rpc.Status` with `code`, `message`
/// and, when `retry_delay` is given, one `RetryInfo` detail; base64
/// without padding, as the spec asks of senders.
pub(crate) fn status_details(code: u32, message: &str, retry_delay: Option<Duration>) -> String {
    let mut status = Vec::with_capacity(64 + message.len());
    varint_field(&mut status, 1, u64::from(code));
    bytes_field(&mut status, 2, message.as_bytes());
    if let Some(delay) = retry_delay {
        let mut duration = Vec::with_capacity(16);
        varint_field(&mut duration, 1, delay.as_secs());
        varint_field(&mut duration, 2, u64::from(delay.subsec_nanos()));
        let mut retry_info = Vec::with_capacity(20);
        bytes_field(&mut retry_info, 1, &duration);
        let mut any = Vec::with_capacity(64);
        bytes_field(&mut any, 1, RETRY_INFO_URL.as_bytes());
        bytes_field(&mut any, 2, &retry_info);
        bytes_field(&mut status, 3, &any);
    }
    base64(&status)
}

/// A varint field; zero, the default, is omitted as proto3 does.
fn varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    if value != 0 {
        varint(out, field << 3);
        varint(out, value);
    }
}

/// A length-delimited field (string, bytes or message); empty is omitted.
fn bytes_field(out: &mut Vec<u8>, field: u64, value: &[u8]) {
    if !value.is_empty() {
        varint(out, (field << 3) | 2);
        varint(out, value.len() as u64);
        out.extend_from_slice(value);
    }
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        // The low seven bits, with the continuation bit: truncation is the
        // encoding.
        #[allow(clippy::cast_possible_truncation)]
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)]
    out.push(value as u8);
}

/// Standard base64 (RFC 4648 §4), no padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut encoded = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let word = chunk.iter().enumerate().fold(0u32, |word, (index, &byte)| {
            word | u32::from(byte) << (16 - 8 * index)
        });
        for index in 0..=chunk.len() {
            let sextet = (word >> (18 - 6 * index)) & 0x3f;
            encoded.push(char::from(ALPHABET[sextet as usize]));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::{base64, percent_encode, varint};

    #[test]
    fn base64_matches_rfc_4648_vectors_unpadded() {
        let vectors = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
        }
    }

    #[test]
    fn varints_are_little_endian_groups_of_seven() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        out.clear();
        varint(&mut out, 1);
        assert_eq!(out, [1]);
    }

    #[test]
    fn messages_percent_encode_outside_printable_ascii() {
        assert_eq!(percent_encode("rate 100% é"), "rate 100%25 %C3%A9");
    }
}
