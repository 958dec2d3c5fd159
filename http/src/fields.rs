//! What a `Decision` says to a client: `Retry-After`, the `RateLimit-Policy`
//! and `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers-11, and an
//! RFC 9457 problem body. Pure functions of decisions and quotas, written
//! once and used by every response the layer builds.

use std::fmt::Write as _;
use std::time::Duration;

use http::HeaderName;
use tollgate::{Decision, Quota};

/// The `RateLimit-Policy` field.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` field.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The problem type of a denial (the draft's registration).
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The problem type of a limiter that could not decide (the draft's
/// registration).
pub(crate) const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// Whole seconds, rounded **up**, and never zero: a client told to retry in
/// 0 seconds would retry at once and be denied, and one told to retry
/// after the floor of a wait retries before it.
pub(crate) fn whole_seconds_up(wait: Duration) -> u64 {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    seconds.max(1)
}

/// Whether `name` can be a policy's name: the draft's items are
/// structured-field Strings, which hold printable ASCII.
pub(crate) fn is_field_string(name: &str) -> bool {
    name.bytes().all(|byte| (0x20..=0x7e).contains(&byte))
}

/// `name` as a structured-field String: quoted, `"` and `\` escaped.
fn push_field_string(out: &mut String, name: &str) {
    out.push('"');
    for character in name.chars() {
        if matches!(character, '"' | '\\') {
            out.push('\\');
        }
        out.push(character);
    }
    out.push('"');
}

/// One `RateLimit-Policy` item: `"name";q=Q;w=W`, the quota's sustained
/// rate as `q` requests per `w` whole seconds.
///
/// The draft's window is whole seconds; a quota whose window is not is
/// advertised over the window rounded up, with `q` scaled to it and
/// rounded down (10 per 500 ms: `q=20;w=1`; 3 per 1.5 s: `q=4;w=2`), so
/// the advertised rate never exceeds the enforced one.
pub(crate) fn policy_item(name: &str, quota: &Quota) -> String {
    let nanos = quota.window().as_nanos();
    let seconds = nanos.div_ceil(1_000_000_000).max(1);
    let units = u128::from(quota.limit()) * seconds * 1_000_000_000 / nanos;
    let mut item = String::with_capacity(name.len() + 24);
    push_field_string(&mut item, name);
    // Writing to a String cannot fail.
    let _ = write!(item, ";q={units};w={seconds}");
    item
}

/// The start of a rule's `RateLimit` items: its name as a
/// structured-field String, then `;r=` (made once, when the rule is).
pub(crate) fn limit_prefix(name: &str) -> String {
    let mut prefix = String::with_capacity(name.len() + 5);
    push_field_string(&mut prefix, name);
    prefix.push_str(";r=");
    prefix
}

/// One `RateLimit` item for a decision: `"name";r=R;t=T`, from the rule's
/// [`limit_prefix`], in a buffer of exactly its length (so that a `Bytes`
/// made of it needs no allocation of its own).
///
/// `r` is the units left; `t`, "the number of seconds until additional
/// quota is made available" (the draft), is chosen so that a client that
/// waits it finds quota:
///
/// * on a denial, the `Retry-After` of the same response (the wait for
///   this request's cost, rounded up), so that `t` is never earlier than
///   `Retry-After`, and `Retry-After` never earlier than `t`, as the draft
///   asks of servers;
/// * on an admission, the time until the key is full again, rounded up
///   (`0` for a key still full), which is never earlier than the next
///   unit's refill.
pub(crate) fn limit_item(prefix: &str, decision: &Decision) -> Vec<u8> {
    let t = if decision.is_allowed() {
        let reset = decision.reset_after();
        if reset.is_zero() {
            0
        } else {
            whole_seconds_up(reset)
        }
    } else {
        whole_seconds_up(decision.retry_after())
    };
    let (mut r_digits, mut t_digits) = ([0; 20], [0; 20]);
    let r = decimal(u64::from(decision.remaining()), &mut r_digits);
    let t = decimal(t, &mut t_digits);
    let mut item = Vec::with_capacity(prefix.len() + r.len() + 3 + t.len());
    item.extend_from_slice(prefix.as_bytes());
    item.extend_from_slice(r);
    item.extend_from_slice(b";t=");
    item.extend_from_slice(t);
    item
}

/// The `RateLimit-Policy` item of a limit named `name` enforcing `quota`
/// (`"name";q=Q;w=W`, see the draft), for a server that writes the field
/// itself (as `tollgate-server` writes it for a proxy). `None` for a name
/// a structured-field String cannot hold (outside printable ASCII).
#[must_use]
pub fn ratelimit_policy_item(name: &str, quota: &Quota) -> Option<String> {
    is_field_string(name).then(|| policy_item(name, quota))
}

/// The `RateLimit` item of a limit named `name` for `decision`
/// (`"name";r=R;t=T`, with `t` never earlier than the `Retry-After` of a
/// denial; see the draft). `None` for a name a structured-field String
/// cannot hold.
#[must_use]
pub fn ratelimit_item(name: &str, decision: &Decision) -> Option<String> {
    if !is_field_string(name) {
        return None;
    }
    // The prefix is printable ASCII and the rest digits: UTF-8.
    String::from_utf8(limit_item(&limit_prefix(name), decision)).ok()
}

/// The `Retry-After` of a denial, in whole seconds rounded up and never 0.
#[must_use]
pub fn retry_after_seconds(decision: &Decision) -> u64 {
    whole_seconds_up(decision.retry_after())
}

/// Writes `value` in decimal at the end of `digits`, without the
/// formatting machinery (this is on every admitted request's path), and
/// returns the digits written.
fn decimal(mut value: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut start = digits.len();
    loop {
        start -= 1;
        // A digit: the remainder is below 10.
        #[allow(clippy::cast_possible_truncation)]
        let digit = (value % 10) as u8;
        digits[start] = b'0' + digit;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    &digits[start..]
}

/// Appends `value` in decimal.
pub(crate) fn push_decimal(out: &mut String, value: u64) {
    for &digit in decimal(value, &mut [0; 20]) {
        out.push(char::from(digit));
    }
}

/// Appends `text` to a JSON string body, escaped.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    if !text
        .bytes()
        .any(|byte| byte < 0x20 || byte == b'"' || byte == b'\\')
    {
        out.push_str(text);
        out.push('"');
        return;
    }
    for character in text.chars() {
        match character {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            control if u32::from(control) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(control));
            }
            other => out.push(other),
        }
    }
    out.push('"');
}

/// An RFC 9457 problem body (`application/problem+json`). `violated`
/// names the policies that refused the request (the draft's
/// `violated-policies` member), when there are any.
pub(crate) fn problem(
    kind: &str,
    title: &str,
    status: u16,
    detail: &str,
    violated: &[&str],
) -> String {
    let mut body = String::with_capacity(256);
    body.push_str("{\"type\":");
    push_json_string(&mut body, kind);
    body.push_str(",\"title\":");
    push_json_string(&mut body, title);
    body.push_str(",\"status\":");
    push_decimal(&mut body, u64::from(status));
    body.push_str(",\"detail\":");
    push_json_string(&mut body, detail);
    if !violated.is_empty() {
        body.push_str(",\"violated-policies\":[");
        for (index, name) in violated.iter().enumerate() {
            if index > 0 {
                body.push(',');
            }
            push_json_string(&mut body, name);
        }
        body.push(']');
    }
    body.push('}');
    body
}

/// A rule's pieces of its quota-exceeded problem, JSON-escaped once when
/// the rule is made.
#[derive(Debug, Clone)]
pub(crate) struct RuleJson {
    /// The detail up to the wait.
    exhausted: String,
    /// The name as a JSON string, quoted.
    name: String,
}

/// The text of a quota-exceeded problem's detail before the wait.
fn exhausted_detail(name: &str) -> String {
    format!("the \"{name}\" quota is exhausted for this client; retry in ")
}

impl RuleJson {
    pub(crate) fn new(name: &str) -> Self {
        let mut exhausted = String::new();
        push_json_string(&mut exhausted, &exhausted_detail(name));
        // Without its closing quote: the wait follows.
        exhausted.pop();
        let mut quoted = String::new();
        push_json_string(&mut quoted, name);
        Self {
            exhausted,
            name: quoted,
        }
    }
}

/// The quota-exceeded problem of a denial by the rule of `json`, with a
/// wait of `wait` seconds: [`problem`]'s document, from pieces made once.
pub(crate) fn exhausted_problem(json: &RuleJson, wait: u64) -> String {
    const HEAD: &str = concat!(
        "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",",
        "\"title\":\"Quota Exceeded\",\"status\":429,\"detail\":"
    );
    let mut body = String::with_capacity(HEAD.len() + json.exhausted.len() + json.name.len() + 48);
    body.push_str(HEAD);
    body.push_str(&json.exhausted);
    push_decimal(&mut body, wait);
    body.push_str(" s\",\"violated-policies\":[");
    body.push_str(&json.name);
    body.push_str("]}");
    body
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate::{Decision, Quota};

    use super::{
        QUOTA_EXCEEDED, RuleJson, exhausted_detail, exhausted_problem, limit_item, limit_prefix,
        policy_item, problem, whole_seconds_up,
    };

    #[test]
    fn a_denials_problem_made_from_pieces_is_the_problem() {
        for name in ["per-ip", r#"odd "name" \ here"#] {
            let mut detail = exhausted_detail(name);
            detail.push_str("20 s");
            assert_eq!(
                exhausted_problem(&RuleJson::new(name), 20),
                problem(QUOTA_EXCEEDED, "Quota Exceeded", 429, &detail, &[name])
            );
        }
    }

    #[test]
    fn seconds_round_up_and_never_reach_zero() {
        assert_eq!(whole_seconds_up(Duration::from_nanos(1)), 1);
        assert_eq!(whole_seconds_up(Duration::from_millis(999)), 1);
        assert_eq!(whole_seconds_up(Duration::from_secs(1)), 1);
        assert_eq!(whole_seconds_up(Duration::new(1, 1)), 2);
        assert_eq!(whole_seconds_up(Duration::from_secs(20)), 20);
        assert_eq!(whole_seconds_up(Duration::ZERO), 1);
    }

    #[test]
    fn policies_advertise_whole_seconds_never_above_the_rate() {
        let per_minute = Quota::per_minute(100).unwrap();
        assert_eq!(policy_item("burst", &per_minute), r#""burst";q=100;w=60"#);
        let half_second = Quota::new(10, Duration::from_millis(500)).unwrap();
        assert_eq!(policy_item("fast", &half_second), r#""fast";q=20;w=1"#);
        let odd = Quota::new(3, Duration::from_millis(1_500)).unwrap();
        assert_eq!(policy_item("odd", &odd), r#""odd";q=4;w=2"#);
        assert_eq!(
            policy_item(r#"a"b\c"#, &per_minute),
            r#""a\"b\\c";q=100;w=60"#
        );
    }

    #[test]
    fn limit_items_wait_as_long_as_retry_after() {
        let denied = Decision::from_parts(
            100,
            0,
            Duration::from_millis(19_200),
            Duration::from_secs(60),
        )
        .unwrap();
        let prefix = limit_prefix("burst");
        let item = limit_item(&prefix, &denied);
        assert_eq!(item, br#""burst";r=0;t=20"#);
        assert_eq!(item.len(), item.capacity());
        let allowed =
            Decision::from_parts(100, 98, Duration::ZERO, Duration::from_millis(1_200)).unwrap();
        let item = limit_item(&prefix, &allowed);
        assert_eq!(item, br#""burst";r=98;t=2"#);
        assert_eq!(item.len(), item.capacity());
        let full =
            Decision::from_parts(u32::MAX, u32::MAX, Duration::ZERO, Duration::ZERO).unwrap();
        assert_eq!(
            limit_item(&limit_prefix(r#"a"b"#), &full),
            br#""a\"b";r=4294967295;t=0"#
        );
    }

    #[test]
    fn problems_are_escaped_json() {
        let body = problem("about:blank", "T", 429, "a \"quoted\"\nline", &["a", "b\\"]);
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"T","status":429,"detail":"a \"quoted\"\u000aline","violated-policies":["a","b\\"]}"#
        );
    }
}
