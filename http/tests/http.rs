//! The layer in front of a real axum server on a loopback port, read by a
//! real HTTP client (reqwest), every rate-limit field parsed with a
//! structured-field parser and every problem body with a JSON parser.

mod support;

use std::time::Duration;

use http::HeaderName;
use reqwest::StatusCode;
use serde_json::Value;
use support::{Server, client, list, retry_after, send};
use tollgate::{Builder, Quota, RateLimiter};
use tollgate_http::{Header, IpKey, IpNet, KeyFn, PeerIp, RateLimitLayer, Rule, Tiers};

fn per_ip(quota: Quota, peer: PeerIp) -> Rule {
    Rule::new("per-ip", RateLimiter::<IpKey>::keyed(quota), peer).unwrap()
}

fn layer(rules: impl IntoIterator<Item = Rule>) -> RateLimitLayer {
    rules
        .into_iter()
        .fold(RateLimitLayer::builder(), tollgate_http::Builder::rule)
        .build()
}

#[tokio::test]
async fn admitted_responses_carry_both_fields() {
    let server = Server::start(layer([per_ip(
        Quota::per_minute(5).unwrap(),
        PeerIp::new(),
    )]))
    .await;
    let client = client();
    for expected_remaining in (0..5).rev() {
        let response = client.get(server.url("/")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let policy = list(response.headers(), "ratelimit-policy");
        assert_eq!(policy.len(), 1);
        assert_eq!(policy[0].name, "per-ip");
        assert_eq!(policy[0].param("q"), 5);
        assert_eq!(policy[0].param("w"), 60);
        let limit = list(response.headers(), "ratelimit");
        assert_eq!(limit.len(), 1);
        assert_eq!(limit[0].name, "per-ip");
        assert_eq!(limit[0].param("r"), expected_remaining);
        // Full again after (5 - remaining) intervals of 12 s.
        assert_eq!(limit[0].param("t"), 12 * (5 - expected_remaining));
        assert_eq!(response.text().await.unwrap(), "hello");
    }
}

#[tokio::test]
async fn a_denial_is_a_429_with_retry_after_fields_and_a_problem() {
    let server = Server::start(layer([per_ip(
        Quota::per_minute(3).unwrap(),
        PeerIp::new(),
    )]))
    .await;
    let client = client();
    let (admitted, denied) = send(&client, &server.url("/"), &[], 5).await;
    assert_eq!(admitted, 3);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = denied.headers().clone();
    // Twenty seconds an interval, a few milliseconds of which have passed:
    // rounded up, 20.
    let wait = retry_after(&headers);
    assert_eq!(wait, 20);
    let limit = list(&headers, "ratelimit");
    assert_eq!(limit.len(), 1);
    assert_eq!(limit[0].param("r"), 0);
    assert_eq!(
        u64::try_from(limit[0].param("t")).unwrap(),
        wait,
        "t is Retry-After"
    );
    let policy = list(&headers, "ratelimit-policy");
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (3, 60));
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: Value = serde_json::from_str(&denied.text().await.unwrap()).unwrap();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["title"], "Quota Exceeded");
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"], serde_json::json!(["per-ip"]));
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("retry in 20 s")
    );
}

#[tokio::test]
async fn a_sub_second_wait_is_retry_after_one_never_zero() {
    // One request every 100 ms: the wait is under a second.
    let server = Server::start(layer([per_ip(
        Quota::per_second(10).unwrap().with_burst(1).unwrap(),
        PeerIp::new(),
    )]))
    .await;
    let (admitted, denied) = send(&client(), &server.url("/"), &[], 2).await;
    assert_eq!(admitted, 1);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(denied.headers()), 1);
    assert_eq!(list(denied.headers(), "ratelimit")[0].param("t"), 1);
    // The advertised policy is 10 per second, in whole seconds.
    let policy = list(denied.headers(), "ratelimit-policy");
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (10, 1));
    // Retrying after the wait succeeds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (admitted, _) = send(&client(), &server.url("/"), &[], 1).await;
    assert_eq!(admitted, 1);
}

fn per_key(quota: Quota) -> Rule {
    Rule::new(
        "per-key",
        RateLimiter::keyed(quota),
        Header::new(HeaderName::from_static("x-api-key")),
    )
    .unwrap()
}

#[tokio::test]
async fn several_policies_are_checked_together_and_reported_together() {
    let server = Server::start(layer([
        per_ip(Quota::per_minute(10).unwrap(), PeerIp::new()),
        per_key(Quota::per_hour(2).unwrap()),
    ]))
    .await;
    let client = client();
    let url = server.url("/");
    let (admitted, denied) = send(&client, &url, &[("x-api-key", "alice")], 3).await;
    assert_eq!(admitted, 2);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = denied.headers().clone();
    let policy = list(&headers, "ratelimit-policy");
    let names: Vec<&str> = policy.iter().map(|item| item.name.as_str()).collect();
    assert_eq!(names, ["per-ip", "per-key"]);
    assert_eq!((policy[1].param("q"), policy[1].param("w")), (2, 3600));
    let limit = list(&headers, "ratelimit");
    assert_eq!(limit.len(), 2);
    // The per-IP limit admitted this third request, and was given it back
    // when the per-key limit refused it (30 minutes to wait): 8 left, as
    // after two requests.
    assert_eq!((limit[0].name.as_str(), limit[0].param("r")), ("per-ip", 8));
    assert_eq!(
        (limit[1].name.as_str(), limit[1].param("r")),
        ("per-key", 0)
    );
    assert_eq!(retry_after(&headers), 1_800);
    assert_eq!(limit[1].param("t"), 1_800);
    let problem: Value = serde_json::from_str(&denied.text().await.unwrap()).unwrap();
    assert_eq!(problem["violated-policies"], serde_json::json!(["per-key"]));
    // Another key has its own budget, within the same IP's.
    let (admitted, last) = send(&client, &url, &[("x-api-key", "bob")], 1).await;
    assert_eq!(admitted, 1);
    assert_eq!(list(last.headers(), "ratelimit")[0].param("r"), 7);
    // No key: refused, and the per-IP admission given back.
    let (admitted, missing) = send(&client, &url, &[], 1).await;
    assert_eq!(admitted, 0);
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let problem: Value = serde_json::from_str(&missing.text().await.unwrap()).unwrap();
    assert_eq!(problem["status"], 400);
    assert!(
        problem["detail"].as_str().unwrap().contains("x-api-key"),
        "{problem}"
    );
    let (_, last) = send(&client, &url, &[("x-api-key", "carol")], 1).await;
    assert_eq!(list(last.headers(), "ratelimit")[0].param("r"), 6);
}

#[tokio::test]
async fn an_over_long_or_repeated_key_header_is_refused_and_charges_nothing() {
    let server = Server::start(layer([
        per_ip(Quota::per_hour(10).unwrap(), PeerIp::new()),
        per_key(Quota::per_hour(2).unwrap()),
    ]))
    .await;
    let client = client();
    let url = server.url("/");
    let longest = "k".repeat(256);
    let (admitted, last) = send(&client, &url, &[("x-api-key", &longest)], 1).await;
    assert_eq!(admitted, 1);
    assert_eq!(list(last.headers(), "ratelimit")[0].param("r"), 9);
    let too_long = "k".repeat(257);
    let (admitted, refused) = send(&client, &url, &[("x-api-key", &too_long)], 1).await;
    assert_eq!(
        (admitted, refused.status()),
        (0, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
    );
    let problem: Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    assert_eq!(
        problem,
        serde_json::json!({
            "type": "about:blank",
            "title": "Request Header Fields Too Large",
            "status": 431,
            "detail": "the x-api-key header is 257 bytes long, above the 256 bytes a key may be",
        })
    );
    let (admitted, refused) = send(
        &client,
        &url,
        &[("x-api-key", "fresh-every-time"), ("x-api-key", "alice")],
        1,
    )
    .await;
    assert_eq!((admitted, refused.status()), (0, StatusCode::BAD_REQUEST));
    let problem: Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    assert_eq!(
        problem["detail"],
        "the request has more than one x-api-key header, and is rate limited by exactly one"
    );
    // Neither refusal was charged to the per-IP limit before it.
    let (_, last) = send(&client, &url, &[("x-api-key", "alice")], 1).await;
    assert_eq!(list(last.headers(), "ratelimit")[0].param("r"), 8);
}

#[tokio::test]
async fn per_route_rules_apply_only_to_their_routes() {
    let server =
        Server::start(layer([per_key(Quota::per_hour(1).unwrap())
            .when(|parts| parts.uri().path().starts_with("/api/"))]))
        .await;
    let client = client();
    // The root has no rule: no key needed, no fields, never limited.
    let (admitted, last) = send(&client, &server.url("/"), &[], 5).await;
    assert_eq!(admitted, 5);
    assert!(last.headers().get("ratelimit").is_none());
    let (admitted, _) = send(&client, &server.url("/api/hello"), &[("x-api-key", "k")], 3).await;
    assert_eq!(admitted, 1);
}

#[tokio::test]
async fn a_cost_function_charges_units_and_refuses_what_never_fits() {
    let cost = |parts: &tollgate_http::RequestHead<'_>| -> u32 {
        parts
            .headers()
            .get("x-cost")
            .and_then(|value| value.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    };
    let server = Server::start(layer([
        per_ip(Quota::per_hour(10).unwrap(), PeerIp::new()).cost(cost)
    ]))
    .await;
    let client = client();
    let url = server.url("/");
    let (admitted, last) = send(&client, &url, &[("x-cost", "4")], 2).await;
    assert_eq!(admitted, 2);
    assert_eq!(list(last.headers(), "ratelimit")[0].param("r"), 2);
    let (admitted, denied) = send(&client, &url, &[("x-cost", "3")], 1).await;
    assert_eq!(admitted, 0);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // One unit refills in 6 minutes: the wait for 3 with 2 left.
    assert_eq!(retry_after(denied.headers()), 360);
    // Free requests check nothing.
    let (admitted, free) = send(&client, &url, &[("x-cost", "0")], 3).await;
    assert_eq!(admitted, 3);
    assert!(free.headers().get("ratelimit").is_none());
    // Above the burst: no wait admits it, so no Retry-After.
    let (admitted, never) = send(&client, &url, &[("x-cost", "11")], 1).await;
    assert_eq!(admitted, 0);
    assert_eq!(never.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(never.headers().get("retry-after").is_none());
    let problem: Value = serde_json::from_str(&never.text().await.unwrap()).unwrap();
    assert_eq!(problem["violated-policies"], serde_json::json!(["per-ip"]));
    assert!(
        problem["detail"].as_str().unwrap().contains("never"),
        "{problem}"
    );
}

#[tokio::test]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
    // Only 10.0.0.0/8 is trusted; the test client connects from 127.0.0.1.
    let trusted: IpNet = "10.0.0.0/8".parse().unwrap();
    let server = Server::start(layer([per_ip(
        Quota::per_hour(3).unwrap(),
        PeerIp::new().trust_x_forwarded_for([trusted]),
    )]))
    .await;
    let client = client();
    let mut admitted = 0;
    for spoof in [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "198.51.100.4",
        "198.51.100.5",
    ] {
        admitted += send(&client, &server.url("/"), &[("x-forwarded-for", spoof)], 1)
            .await
            .0;
    }
    // Five spoofed addresses, one real one: the real one's budget.
    assert_eq!(admitted, 3);
}

#[tokio::test]
async fn a_trusted_proxy_names_the_client_grouped_by_prefix() {
    // The test client at 127.0.0.1 plays a trusted proxy.
    let proxies: [IpNet; 2] = ["127.0.0.1".parse().unwrap(), "10.0.0.0/8".parse().unwrap()];
    let server = Server::start(layer([per_ip(
        Quota::per_hour(2).unwrap(),
        PeerIp::new().trust_x_forwarded_for(proxies),
    )]))
    .await;
    let client = client();
    let url = server.url("/");
    // Two hosts in one /64 share a budget: 2 of 4 admitted.
    let (first, _) = send(&client, &url, &[("x-forwarded-for", "2001:db8:1:2::a")], 2).await;
    let (second, _) = send(
        &client,
        &url,
        &[("x-forwarded-for", "[2001:db8:1:2:ffff::b]:4711")],
        2,
    )
    .await;
    assert_eq!(first + second, 2);
    // Another /64 has its own.
    let (other, _) = send(&client, &url, &[("x-forwarded-for", "2001:db8:1:3::a")], 2).await;
    assert_eq!(other, 2);
    // Past a chain of trusted proxies, and across two header lines, to the
    // first untrusted address: the client, whatever it put before.
    let (chained, _) = send(
        &client,
        &url,
        &[
            ("x-forwarded-for", "6.6.6.6, 198.51.100.9"),
            ("x-forwarded-for", "10.1.1.1, 10.2.2.2"),
        ],
        3,
    )
    .await;
    assert_eq!(chained, 2);
    let (direct, _) = send(&client, &url, &[("x-forwarded-for", "198.51.100.9")], 1).await;
    assert_eq!(direct, 0, "the same client, its budget spent");
    // An entry that is not an address stops the walk at the proxy that
    // reported it (127.0.0.1 here): one budget for all such requests.
    let (garbage, _) = send(&client, &url, &[("x-forwarded-for", "nonsense")], 1).await;
    let (unknown, _) = send(&client, &url, &[("x-forwarded-for", "1.2.3.4, unknown")], 2).await;
    assert_eq!(garbage + unknown, 2);
}

#[tokio::test]
async fn forwarded_is_read_the_same_way() {
    let proxy: IpNet = "127.0.0.1".parse().unwrap();
    let server = Server::start(layer([per_ip(
        Quota::per_hour(1).unwrap(),
        PeerIp::new().trust_forwarded([proxy]),
    )]))
    .await;
    let client = client();
    let url = server.url("/");
    let (quoted, _) = send(
        &client,
        &url,
        &[("forwarded", r#"for="[2001:db8:cafe::17]:4711";proto=https"#)],
        2,
    )
    .await;
    assert_eq!(quoted, 1);
    // The same /64, in another form, and X-Forwarded-For (not trusted
    // here) changes nothing.
    let (same, _) = send(
        &client,
        &url,
        &[
            ("forwarded", "for=\"[2001:db8:cafe:0:1::1]\""),
            ("x-forwarded-for", "9.9.9.9"),
        ],
        1,
    )
    .await;
    assert_eq!(same, 0);
    let (v4, _) = send(
        &client,
        &url,
        &[("forwarded", "for=192.0.2.60;by=203.0.113.43")],
        2,
    )
    .await;
    assert_eq!(v4, 1);
}

#[tokio::test]
async fn ipv4_prefixes_group_too() {
    let proxy: IpNet = "127.0.0.1".parse().unwrap();
    let server = Server::start(layer([per_ip(
        Quota::per_hour(1).unwrap(),
        PeerIp::new()
            .ipv4_prefix(24)
            .unwrap()
            .trust_x_forwarded_for([proxy]),
    )]))
    .await;
    let client = client();
    let url = server.url("/");
    let (a, _) = send(&client, &url, &[("x-forwarded-for", "203.0.113.1")], 1).await;
    let (b, _) = send(&client, &url, &[("x-forwarded-for", "203.0.113.200")], 1).await;
    let (mapped, _) = send(
        &client,
        &url,
        &[("x-forwarded-for", "::ffff:203.0.113.7")],
        1,
    )
    .await;
    let (c, _) = send(&client, &url, &[("x-forwarded-for", "203.0.114.1")], 1).await;
    assert_eq!((a, b, mapped, c), (1, 0, 0, 1));
}

#[tokio::test]
async fn a_global_rule_and_a_closure_key_limit_the_whole_service() {
    let global = Rule::new(
        "service",
        Builder::new(Quota::per_hour(4).unwrap()).build_direct(),
        tollgate_http::Global,
    )
    .unwrap();
    let by_query = Rule::new(
        "per-tenant",
        RateLimiter::<String>::keyed(Quota::per_hour(2).unwrap()),
        KeyFn::new(|parts: &tollgate_http::RequestHead<'_>| parts.uri().query().map(str::to_owned)),
    )
    .unwrap();
    let server = Server::start(layer([global, by_query])).await;
    let client = client();
    let (a, last) = send(&client, &server.url("/?a"), &[], 3).await;
    assert_eq!(a, 2);
    // The third request passed the service's limit and was refused by its
    // tenant's: the service's unit was given back.
    let problem: Value = serde_json::from_str(&last.text().await.unwrap()).unwrap();
    assert_eq!(
        problem["violated-policies"],
        serde_json::json!(["per-tenant"])
    );
    let (b, last) = send(&client, &server.url("/?b"), &[], 3).await;
    assert_eq!(b, 2, "the service's four: two for a, two for b");
    let problem: Value = serde_json::from_str(&last.text().await.unwrap()).unwrap();
    assert_eq!(problem["violated-policies"], serde_json::json!(["service"]));
    // The service's budget is spent: refused before the tenant's key is
    // looked for.
    let (none, spent) = send(&client, &server.url("/"), &[], 1).await;
    assert_eq!((none, spent.status()), (0, StatusCode::TOO_MANY_REQUESTS));
}

#[tokio::test]
async fn a_closure_that_finds_no_key_is_a_400() {
    let by_query = Rule::new(
        "per-tenant",
        RateLimiter::<String>::keyed(Quota::per_hour(2).unwrap()),
        KeyFn::new(|parts: &tollgate_http::RequestHead<'_>| parts.uri().query().map(str::to_owned)),
    )
    .unwrap();
    let server = Server::start(layer([by_query])).await;
    let (admitted, missing) = send(&client(), &server.url("/"), &[], 1).await;
    assert_eq!((admitted, missing.status()), (0, StatusCode::BAD_REQUEST));
    let problem: Value = serde_json::from_str(&missing.text().await.unwrap()).unwrap();
    assert_eq!(problem["status"], 400);
}

#[tokio::test]
async fn what_a_client_writes_before_the_proxy_cannot_spoil_the_proxys_entry() {
    let proxy: IpNet = "127.0.0.1".parse().unwrap();
    let xff = Server::start(layer([per_ip(
        Quota::per_hour(1).unwrap(),
        PeerIp::new().trust_x_forwarded_for([proxy]),
    )]))
    .await;
    let forwarded = Server::start(layer([per_ip(
        Quota::per_hour(1).unwrap(),
        PeerIp::new().trust_forwarded([proxy]),
    )]))
    .await;
    let client = client();
    // Bytes that are not text, then what the proxy appended: each client
    // address gets its own unit, as if the junk were not there.
    for client_address in ["198.51.100.1", "198.51.100.2", "198.51.100.3"] {
        let mut value = b"\xff\xfe, ".to_vec();
        value.extend_from_slice(client_address.as_bytes());
        let value = reqwest::header::HeaderValue::from_bytes(&value).unwrap();
        let response = client
            .get(xff.url("/"))
            .header("x-forwarded-for", value)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{client_address}");
        // An unclosed quote cannot swallow the element appended after it.
        let value = format!(r#"for="[::1, for={client_address}"#);
        let (admitted, _) = send(&client, &forwarded.url("/"), &[("forwarded", &value)], 1).await;
        assert_eq!(admitted, 1, "{client_address}");
    }
    // Nor can an unclosed quote pair with the proxy's quotes, so that a
    // `Host` the proxy quotes into its element names the key: one client,
    // a new address in each request's `Host`, one unit in all (a key per
    // request, were the quotes paired).
    let mut admitted = 0;
    for spoofed in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
        let value = format!(r#"", for=198.51.100.9;host="a, for={spoofed};x=\"""#);
        admitted += send(&client, &forwarded.url("/"), &[("forwarded", &value)], 1)
            .await
            .0;
    }
    assert_eq!(admitted, 1);
}

#[tokio::test]
async fn fields_on_success_can_be_turned_off() {
    let server = Server::start(
        RateLimitLayer::builder()
            .rule(per_ip(Quota::per_hour(1).unwrap(), PeerIp::new()))
            .fields_on_success(false)
            .build(),
    )
    .await;
    let (admitted, denied) = send(&client(), &server.url("/"), &[], 2).await;
    assert_eq!(admitted, 1);
    // The denial still carries them.
    assert_eq!(list(denied.headers(), "ratelimit")[0].param("r"), 0);
    let (_, again) = send(&client(), &server.url("/"), &[], 1).await;
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn without_a_peer_address_the_request_is_a_500_not_a_panic() {
    // A router served without connect info records no peer.
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello" }))
        .layer(layer([per_ip(Quota::per_hour(1).unwrap(), PeerIp::new())]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let response = client()
        .get(format!("http://{address}/"))
        .send()
        .await
        .unwrap();
    task.abort();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let problem: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains("peer address"),
        "{problem}"
    );
}

/// A first rule that does not apply (its route, or a cost of zero) leaves
/// the request to the next rule, with or without fields on success.
#[tokio::test]
async fn a_first_rule_that_skips_leaves_the_next_rule_to_decide() {
    for fields in [true, false] {
        for skipping in [
            per_key(Quota::per_hour(5).unwrap())
                .when(|parts| parts.uri().path().starts_with("/api/")),
            per_key(Quota::per_hour(5).unwrap()).cost(|_| 0),
        ] {
            let server = Server::start(
                RateLimitLayer::builder()
                    .rule(skipping)
                    .rule(per_ip(Quota::per_hour(2).unwrap(), PeerIp::new()))
                    .fields_on_success(fields)
                    .build(),
            )
            .await;
            let (admitted, denied) = send(&client(), &server.url("/"), &[], 3).await;
            assert_eq!(admitted, 2, "fields on success: {fields}");
            assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
            let problem: Value = serde_json::from_str(&denied.text().await.unwrap()).unwrap();
            assert_eq!(problem["violated-policies"], serde_json::json!(["per-ip"]));
        }
    }
}

#[tokio::test]
async fn a_layer_without_rules_passes_everything_without_fields() {
    for fields in [true, false] {
        let server =
            Server::start(RateLimitLayer::builder().fields_on_success(fields).build()).await;
        let (admitted, last) = send(&client(), &server.url("/"), &[], 3).await;
        assert_eq!(admitted, 3);
        assert!(last.headers().get("ratelimit").is_none());
        assert!(last.headers().get("ratelimit-policy").is_none());
    }
}

/// Without fields on success, the last rule keeps nothing of its
/// admission, and its refusal still gives the first rule's back.
#[tokio::test]
async fn without_fields_on_success_a_refusal_by_the_last_rule_gives_the_first_back() {
    let server = Server::start(
        RateLimitLayer::builder()
            .rule(per_ip(Quota::per_hour(10).unwrap(), PeerIp::new()))
            .rule(per_key(Quota::per_hour(1).unwrap()))
            .fields_on_success(false)
            .build(),
    )
    .await;
    let client = client();
    let url = server.url("/");
    let (admitted, ok) = send(&client, &url, &[("x-api-key", "alice")], 1).await;
    assert_eq!(admitted, 1);
    assert!(ok.headers().get("ratelimit").is_none());
    assert!(ok.headers().get("ratelimit-policy").is_none());
    let (admitted, denied) = send(&client, &url, &[("x-api-key", "alice")], 3).await;
    assert_eq!(admitted, 0);
    let limit = list(denied.headers(), "ratelimit");
    assert_eq!((limit[0].name.as_str(), limit[0].param("r")), ("per-ip", 9));
    assert_eq!(
        (limit[1].name.as_str(), limit[1].param("r")),
        ("per-key", 0)
    );
}

std::thread_local! {
    /// Whether [`Flaky`]'s `Hash` panics.
    static ARMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A key whose `Hash` panics once armed.
#[derive(Clone, PartialEq, Eq)]
struct Flaky(u64);

impl std::hash::Hash for Flaky {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        assert!(!ARMED.get(), "the key's Hash panics");
        self.0.hash(state);
    }
}

/// A later rule's user code panics after the first rule charged, and the
/// refund the unwinding runs panics too (the key's `Hash`): the process
/// does not abort, the panic reaches the caller, and the admission that
/// could not be given back stays charged.
#[test]
fn a_refund_that_panics_while_a_later_rule_unwinds_keeps_the_units_and_aborts_nothing() {
    use tower::{Layer, Service};

    let limiter = std::sync::Arc::new(RateLimiter::<Flaky>::keyed(Quota::per_hour(5).unwrap()));
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "flaky",
                std::sync::Arc::clone(&limiter),
                KeyFn::new(|_: &tollgate_http::RequestHead<'_>| Some(Flaky(1))),
            )
            .unwrap(),
        )
        .rule(
            Rule::new(
                "second",
                RateLimiter::<u64>::keyed(Quota::per_hour(5).unwrap()),
                KeyFn::new(|_: &tollgate_http::RequestHead<'_>| Some(2_u64)),
            )
            .unwrap()
            .when(|_| {
                ARMED.set(true);
                panic!("the second rule's predicate panics")
            }),
        )
        .build();
    let mut service = layer.layer(tower::service_fn(
        |_: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        },
    ));
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(service.call(http::Request::new(axum::body::Body::empty())));
    }));
    let message = unwound.expect_err("the predicate's panic reaches the caller");
    assert_eq!(
        message.downcast_ref::<&str>(),
        Some(&"the second rule's predicate panics")
    );
    ARMED.set(false);
    // One of five charged and kept: a peek sees four available (three
    // remaining after the unit it predicts).
    assert_eq!(limiter.peek(&Flaky(1)).unwrap().remaining(), 3);
}

/// A token bucket's or a fixed window's admission is given back too when a
/// later rule refuses the request.
#[tokio::test]
async fn a_token_bucket_or_fixed_window_admission_is_given_back_on_a_later_refusal() {
    use tollgate::algorithm::{FixedWindow, TokenBucket};

    fn first<A>(quota: Quota) -> Rule
    where
        A: tollgate::algorithm::Algorithm<State: PartialEq + Clone>,
        tollgate::store::LockFree: tollgate::store::StoreKind<IpKey, A>,
    {
        Rule::new(
            "per-ip",
            Builder::new(quota).algorithm::<A>().build::<IpKey>(),
            PeerIp::new(),
        )
        .unwrap()
    }
    for rule in [
        first::<TokenBucket>(Quota::per_hour(10).unwrap()),
        first::<FixedWindow>(Quota::per_hour(10).unwrap()),
    ] {
        let server = Server::start(layer([rule, per_key(Quota::per_hour(1).unwrap())])).await;
        let client = client();
        let url = server.url("/");
        let (admitted, _) = send(&client, &url, &[("x-api-key", "alice")], 1).await;
        assert_eq!(admitted, 1);
        let (admitted, denied) = send(&client, &url, &[("x-api-key", "alice")], 3).await;
        assert_eq!(admitted, 0);
        let limit = list(denied.headers(), "ratelimit");
        assert_eq!((limit[0].name.as_str(), limit[0].param("r")), ("per-ip", 9));
    }
}

#[tokio::test]
async fn each_tier_is_held_to_its_own_quota_and_advertises_it() {
    let rule = per_key(Quota::per_minute(2).unwrap())
        .tiers(
            Tiers::header(HeaderName::from_static("x-plan"))
                .tier("pro", Quota::per_minute(5).unwrap()),
        )
        .unwrap();
    let server = Server::start(layer([rule])).await;
    let client = client();
    let url = server.url("/");
    let pro = [("x-api-key", "alice"), ("x-plan", "pro")];
    let (admitted, denied) = send(&client, &url, &pro, 6).await;
    assert_eq!(admitted, 5);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let policy = list(denied.headers(), "ratelimit-policy");
    assert_eq!(policy[0].name, "per-key");
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (5, 60));
    assert_eq!(retry_after(denied.headers()), 12);
    // No tier, and a tier not listed: the limiter's own quota.
    for plan in [None, Some("gold")] {
        let key = format!("bob-{plan:?}");
        let mut headers = vec![("x-api-key", key.as_str())];
        headers.extend(plan.map(|plan| ("x-plan", plan)));
        let (admitted, denied) = send(&client, &url, &headers, 3).await;
        assert_eq!(admitted, 2, "{plan:?}");
        let policy = list(denied.headers(), "ratelimit-policy");
        assert_eq!((policy[0].param("q"), policy[0].param("w")), (2, 60));
    }
    // The same key under the free quota reads what the pro quota booked:
    // 5 of 5 intervals of 12 s, more than the free quota's 60 s allows.
    let (admitted, denied) = send(&client, &url, &[("x-api-key", "alice")], 1).await;
    assert_eq!(admitted, 0);
    assert_eq!(list(denied.headers(), "ratelimit")[0].param("r"), 0);
}

#[tokio::test]
async fn a_function_of_the_request_names_its_tier() {
    let rule = per_key(Quota::per_hour(1).unwrap())
        .tiers(
            Tiers::by(|request| (request.uri().query() == Some("bulk")).then_some("bulk"))
                .tier("bulk", Quota::per_hour(3).unwrap()),
        )
        .unwrap();
    let server = Server::start(layer([rule])).await;
    let client = client();
    let key = [("x-api-key", "alice")];
    let (admitted, _) = send(&client, &server.url("/?bulk"), &key, 4).await;
    assert_eq!(admitted, 3);
    let (admitted, _) = send(&client, &server.url("/"), &[("x-api-key", "bob")], 2).await;
    assert_eq!(admitted, 1);
}

#[test]
fn tiers_a_limiter_cannot_take_are_refused_when_the_rule_is_made() {
    use tollgate::LayoutError;
    use tollgate::algorithm::FixedWindow;
    use tollgate_http::TierError;

    let windows = Builder::new(Quota::per_minute(10).unwrap())
        .algorithm::<FixedWindow>()
        .build::<tollgate_http::HeaderKey>();
    let rule = Rule::new(
        "per-key",
        windows,
        Header::new(HeaderName::from_static("x-api-key")),
    )
    .unwrap();
    let refused = rule
        .tiers(
            Tiers::header(HeaderName::from_static("x-plan"))
                .tier("pro", Quota::per_minute(100).unwrap())
                .tier("fast", Quota::per_second(10).unwrap()),
        )
        .unwrap_err();
    assert_eq!(
        refused,
        TierError::Layout {
            tier: "fast".into(),
            error: LayoutError::WindowDiffers {
                limiter: Duration::from_secs(60),
                quota: Duration::from_secs(1),
            },
        }
    );
    let twice = per_key(Quota::per_minute(1).unwrap())
        .tiers(
            Tiers::header(HeaderName::from_static("x-plan"))
                .tier("pro", Quota::per_minute(100).unwrap())
                .tier("pro", Quota::per_minute(200).unwrap()),
        )
        .unwrap_err();
    assert_eq!(twice, TierError::Duplicate("pro".into()));
    // One budget takes one quota.
    let direct = Rule::new(
        "global",
        tollgate::DirectLimiter::direct(Quota::per_second(1).unwrap()),
        KeyFn::new(|_: &tollgate_http::RequestHead<'_>| Some(())),
    )
    .unwrap()
    .tiers(
        Tiers::header(HeaderName::from_static("x-plan")).tier("pro", Quota::per_second(2).unwrap()),
    )
    .unwrap_err();
    assert_eq!(
        direct,
        TierError::Layout {
            tier: "pro".into(),
            error: LayoutError::Unsupported,
        }
    );
}

/// A quota raised while the server runs, through the limiter the rule
/// shares: a drained key stays drained, its wait and the advertised policy
/// now the new quota's; a key that had used nothing gets the new burst.
#[tokio::test]
async fn a_quota_raised_at_runtime_is_advertised_and_keeps_what_keys_used() {
    use std::sync::Arc;

    use tollgate::algorithm::Carry;
    use tollgate_http::HeaderKey;

    let limiter = Arc::new(RateLimiter::<HeaderKey>::keyed(
        Quota::per_minute(3).unwrap(),
    ));
    let rule = Rule::new(
        "per-key",
        Arc::clone(&limiter),
        Header::new(HeaderName::from_static("x-api-key")),
    )
    .unwrap();
    let server = Server::start(layer([rule])).await;
    let client = client();
    let url = server.url("/");
    let alice = [("x-api-key", "alice")];
    let (admitted, denied) = send(&client, &url, &alice, 4).await;
    assert_eq!(admitted, 3);
    assert_eq!(retry_after(denied.headers()), 20);
    limiter
        .set_quota(Quota::per_minute(6).unwrap(), Carry::AsIs)
        .unwrap();
    // Drained, as is: still drained, a unit of the new quota away.
    let (admitted, denied) = send(&client, &url, &alice, 1).await;
    assert_eq!(admitted, 0);
    assert_eq!(retry_after(denied.headers()), 10);
    let policy = list(denied.headers(), "ratelimit-policy");
    assert_eq!((policy[0].param("q"), policy[0].param("w")), (6, 60));
    let (admitted, _) = send(&client, &url, &[("x-api-key", "bob")], 7).await;
    assert_eq!(admitted, 6);
}
