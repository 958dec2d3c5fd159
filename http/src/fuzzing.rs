//! The crate's parsers and formatters for its fuzz targets (`fuzz/` in the
//! repository), behind the `fuzzing` feature: not part of the API and under
//! no semver promise. Each function is the crate's own, unchanged.

use std::net::IpAddr;

use tollgate::{Decision, Quota};

/// The most entries of a forwarding header the key extractor reads.
pub const MAX_HOPS: usize = crate::key::MAX_HOPS;

/// The nodes of an `X-Forwarded-For` value's last [`MAX_HOPS`] entries,
/// from the last back (`None`: an entry that is not an address).
#[must_use]
pub fn x_forwarded_for(value: &[u8]) -> Vec<Option<IpAddr>> {
    crate::key::x_forwarded_for(value)
}

/// The `for=` nodes of a `Forwarded` value's last [`MAX_HOPS`] elements,
/// from the last back (`None`: an element without an address).
#[must_use]
pub fn forwarded_for(value: &[u8]) -> Vec<Option<IpAddr>> {
    crate::key::forwarded_for(value)
}

/// Whether `name` can be a rule's name in the fields.
#[must_use]
pub fn is_field_string(name: &str) -> bool {
    crate::fields::is_field_string(name)
}

/// The `RateLimit-Policy` item of policy `name` enforcing `quota`.
#[must_use]
pub fn policy_item(name: &str, quota: &Quota) -> String {
    crate::fields::policy_item(name, quota)
}

/// The `RateLimit` item of policy `name` for `decision`.
#[must_use]
pub fn limit_item(name: &str, decision: &Decision) -> String {
    let mut item = String::new();
    crate::fields::limit_item(&mut item, name, decision);
    item
}
