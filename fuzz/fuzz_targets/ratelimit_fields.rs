//! The `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-
//! ratelimit-headers-11), as `tollgate-http` formats them, read back by a
//! structured-field parser (`sfv`, RFC 9651).
//!
//! From the fuzzer's bytes: one to four policies, each a name (any
//! printable ASCII, quotes and backslashes included; other names are
//! refused, which `is_field_string` is checked to say), a quota (any the
//! crate accepts: any limit, window and burst) and a decision (any the
//! crate can hold: admitted or denied, any remaining count up to the
//! limit, any durations up to `u64` nanoseconds). Each field's items are
//! joined as a client joins the field's lines (`, `). Checked:
//!
//! * both fields are valid header values and parse as a structured-field
//!   List of Items, each a String with Integer parameters;
//! * every item reads back as written: the name, `q` and `w` (policy),
//!   `r` and `t` (limit), in that order, and nothing else;
//! * each item is exactly what `sfv`'s own serializer writes for those
//!   values;
//! * `w` is the window in whole seconds rounded up (at least 1), and `q`
//!   the most units whose rate over `w` does not exceed the quota's; `r`
//!   the decision's remaining units; `t` the retry time in whole seconds
//!   rounded up (at least 1) on a denial, and on an admission the reset
//!   time so rounded, 0 for a key still full.

#![no_main]

use std::time::Duration;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use sfv::{BareItem, Integer, KeyRef, List, ListEntry, ListSerializer, Parser, StringRef};
use tollgate::{Decision, Quota};
use tollgate_http::fuzzing::{is_field_string, limit_item, policy_item};

fuzz_target!(|data: &[u8]| {
    let _ = check(&mut Unstructured::new(data));
});

const NANOS_PER_SECOND: u128 = 1_000_000_000;

fn check(u: &mut Unstructured<'_>) -> Result<()> {
    let mut policies = Vec::new();
    let mut limits = Vec::new();
    let mut expected = Vec::new();
    for _ in 0..u.int_in_range(1..=4)? {
        let name = name(u)?;
        if name.is_empty() || !is_field_string(&name) {
            assert!(
                name.is_empty() || name.bytes().any(|byte| !(0x20..=0x7e).contains(&byte)),
                "{name:?} refused"
            );
            continue;
        }
        let Some(quota) = quota(u)? else {
            continue;
        };
        let Some(decision) = decision(u, quota.burst())? else {
            continue;
        };
        policies.push(policy_item(&name, &quota));
        limits.push(limit_item(&name, &decision));
        expected.push((name, quota, decision));
    }
    if expected.is_empty() {
        return Ok(());
    }
    let policy_field = policies.join(", ");
    let limit_field = limits.join(", ");
    for field in [&policy_field, &limit_field] {
        http::HeaderValue::from_str(field).expect("a header value");
    }
    let policy_list = parse(&policy_field);
    let limit_list = parse(&limit_field);
    assert_eq!(policy_list.len(), expected.len());
    assert_eq!(limit_list.len(), expected.len());
    for (index, (name, quota, decision)) in expected.iter().enumerate() {
        let (q, w) = advertised(quota);
        assert_eq!(
            policy_list[index],
            (name.clone(), vec![("q".to_owned(), q), ("w".to_owned(), w)]),
            "{quota:?}"
        );
        assert_eq!(policies[index], serialize(name, &[("q", q), ("w", w)]));
        let (r, t) = (i64::from(decision.remaining()), wait(decision));
        assert_eq!(
            limit_list[index],
            (name.clone(), vec![("r".to_owned(), r), ("t".to_owned(), t)]),
            "{decision:?}"
        );
        assert_eq!(limits[index], serialize(name, &[("r", r), ("t", t)]));
    }
    Ok(())
}

/// A name: printable ASCII mostly, with the characters a String escapes,
/// and now and then one it cannot hold.
fn name(u: &mut Unstructured<'_>) -> Result<String> {
    let mut name = String::new();
    for _ in 0..u.int_in_range(0..=12)? {
        name.push(match u.int_in_range(0..=9)? {
            0 => '"',
            1 => '\\',
            2 => ' ',
            3 => char::from(u.arbitrary::<u8>()? & 0x7f),
            4 => u.arbitrary::<char>()?,
            _ => char::from(u.int_in_range(0x21..=0x7e)?),
        });
    }
    Ok(name)
}

/// A quota the crate accepts, or none.
fn quota(u: &mut Unstructured<'_>) -> Result<Option<Quota>> {
    let limit: u32 = match u.int_in_range(0..=2)? {
        0 => u.int_in_range(1..=100)?,
        _ => u.arbitrary()?,
    };
    let window_ns: u64 = match u.int_in_range(0..=4)? {
        0 => u.int_in_range(1..=60)? * 1_000_000_000,
        1 => u.int_in_range(1..=10_000)? * 1_000_000,
        2 => u64::from(limit) + u.int_in_range(0..=1_000)?,
        3 => 1 << 62,
        _ => u.arbitrary()?,
    };
    let Ok(quota) = Quota::new(limit, Duration::from_nanos(window_ns)) else {
        return Ok(None);
    };
    Ok(if u.ratio(1, 3)? {
        quota.with_burst(u.arbitrary()?).ok()
    } else {
        Some(quota)
    })
}

/// A decision a backend can report, or none.
fn decision(u: &mut Unstructured<'_>, burst: u32) -> Result<Option<Decision>> {
    let limit = if u.ratio(3, 4)? {
        burst
    } else {
        u.arbitrary()?
    };
    let remaining = u.int_in_range(0..=limit)?;
    let duration = |u: &mut Unstructured<'_>| -> Result<Duration> {
        Ok(Duration::from_nanos(match u.int_in_range(0..=3)? {
            0 => 0,
            1 => u.int_in_range(0..=3)? * 1_000_000_000 + u.int_in_range(0..=1)?,
            2 => u64::MAX - u.int_in_range(0..=1)?,
            _ => u.arbitrary()?,
        }))
    };
    let retry = if u.ratio(1, 2)? {
        Duration::ZERO
    } else {
        duration(u)?
    };
    let reset = duration(u)?.max(retry);
    Ok(Decision::from_parts(limit, remaining, retry, reset))
}

/// The advertised `q` and `w` of a quota, found by their definition: `w`
/// the fewest whole seconds (at least 1) that hold the window, `q` the
/// most units with `q / w <= limit / window`.
fn advertised(quota: &Quota) -> (i64, i64) {
    let window_ns = quota.window().as_nanos();
    let mut w = window_ns / NANOS_PER_SECOND;
    if w * NANOS_PER_SECOND < window_ns || w == 0 {
        w += 1;
    }
    let limit = u128::from(quota.limit());
    // q × window_ns <= limit × w × 10^9 < (q + 1) × window_ns.
    let q = limit * w * NANOS_PER_SECOND / window_ns;
    assert!(q * window_ns <= limit * w * NANOS_PER_SECOND);
    assert!((q + 1) * window_ns > limit * w * NANOS_PER_SECOND);
    (i64::try_from(q).unwrap(), i64::try_from(w).unwrap())
}

/// A duration in whole seconds, rounded up.
fn seconds_up(duration: Duration) -> i64 {
    let nanos = duration.as_nanos();
    i64::try_from(nanos.div_ceil(NANOS_PER_SECOND)).unwrap()
}

/// `t`: a denial's retry time (at least 1 s), an admission's reset time
/// (0 for a full key).
fn wait(decision: &Decision) -> i64 {
    if decision.is_allowed() {
        seconds_up(decision.reset_after())
    } else {
        seconds_up(decision.retry_after()).max(1)
    }
}

/// A field's items, each its String and Integer parameters.
fn parse(field: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: List = Parser::new(field)
        .parse()
        .unwrap_or_else(|error| panic!("{field:?} is not a List: {error}"));
    list.into_iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else {
                panic!("{field:?}: an inner list");
            };
            let BareItem::String(name) = item.bare_item else {
                panic!("{field:?}: {:?} is not a String", item.bare_item);
            };
            let params = item
                .params
                .into_iter()
                .map(|(key, value)| match value {
                    BareItem::Integer(integer) => (key.as_str().to_owned(), i64::from(integer)),
                    other => panic!("{field:?}: {key:?} is {other:?}"),
                })
                .collect();
            (name.as_str().to_owned(), params)
        })
        .collect()
}

/// The item `sfv` writes for `name` with `params`.
fn serialize(name: &str, params: &[(&str, i64)]) -> String {
    let mut list = ListSerializer::new();
    {
        let mut item = list.bare_item(StringRef::from_str(name).expect("a String"));
        for &(key, value) in params {
            item = item.parameter(
                KeyRef::from_str(key).unwrap(),
                Integer::try_from(value).expect("an Integer in range"),
            );
        }
    }
    list.finish().expect("one item")
}
