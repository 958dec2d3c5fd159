//! The crate's parsers and formatters for the repository's fuzz targets,
//! behind the `fuzzing` feature: not part of the API and under no semver
//! promise. Each function is the crate's own, unchanged.

use std::net::IpAddr;

use tollgate::{Decision, Quota};

/// The most entries of a forwarding header the key extractor reads.
pub const MAX_HOPS: usize = crate::key::forwarded::MAX_HOPS;

/// Reads the nodes of an `X-Forwarded-For` value's last [`MAX_HOPS`] entries,
/// from the last back (`None`: an entry that is not an address).
#[must_use]
pub fn x_forwarded_for(value: &[u8]) -> Vec<Option<IpAddr>> {
    crate::key::forwarded::x_forwarded_for(value)
}

/// Reads the `for=` nodes of a `Forwarded` value's last [`MAX_HOPS`] elements,
/// from the last back (`None`: an element without an address).
#[must_use]
pub fn forwarded_for(value: &[u8]) -> Vec<Option<IpAddr>> {
    crate::key::forwarded::forwarded_for(value)
}

/// Returns whether `name` can be a rule's name in the fields.
#[must_use]
pub fn is_field_string(name: &str) -> bool {
    crate::fields::is_field_string(name)
}

/// Writes the `RateLimit-Policy` item of policy `name` enforcing `quota`.
#[must_use]
pub fn policy_item(name: &str, quota: &Quota) -> String {
    crate::fields::policy_item(name, quota)
}

/// Writes the `RateLimit` item of policy `name` for `decision`.
#[must_use]
pub fn limit_item(name: &str, decision: &Decision) -> String {
    let item = crate::fields::limit_item(&crate::fields::limit_prefix(name), decision);
    String::from_utf8(item).expect("an item is written from text")
}
