//! The real `tollgate-server` binary on a loopback port, driven over gRPC
//! as Envoy drives it (`envoy.service.ratelimit.v3.RateLimitService`):
//! every field of the response, all or nothing across descriptors, shadow
//! mode, `replaces`, `unlimited`, `hits_addend`, a descriptor's own limit,
//! unknown domains, malformed requests, health and a reload.

mod support;

use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{Client, Server, ask, descriptor, hang_up, request, wait_for_metric};
use tonic::transport::Channel;

const CONFIG: &str = "\
domain: shop
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: tenant
    rate_limit:
      name: tenant
      unit: hour
      requests_per_unit: 10
  - key: plan
    value: free
    rate_limit:
      name: free
      unit: hour
      requests_per_unit: 2
      replaces:
        - name: tenant
  - key: path
    value: /beta
    rate_limit:
      unit: hour
      requests_per_unit: 1
    shadow_mode: true
  - key: path
    value: /health
    rate_limit:
      unlimited: true
  - key: api_key
    rate_limit:
      name: api
      unit: minute
      requests_per_unit: 3
      algorithm: gcra
  - key: user
    rate_limit:
      name: user
      unit: second
      requests_per_unit: 5
      algorithm: gcra
";

/// The headers a response asks Envoy to add, as (name, value).
fn headers(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|header| (header.key.clone(), header.value.clone()))
        .collect()
}

/// The draft's fields (and `Retry-After`) on every response: GCRA, whose
/// waits do not depend on when the server started, so that each is exact.
#[tokio::test]
async fn the_ratelimit_fields_and_retry_after() {
    let server = Server::start(CONFIG);
    let mut client = server.client().await;
    let key = || request("shop", vec![descriptor(&[("api_key", "k1")])]);
    let policy = ("RateLimit-Policy".to_owned(), "\"api\";q=3;w=60".to_owned());
    // 3 a minute: a unit every 20 s; each admission books 20 s more. `t`
    // is the wait until the key is full, rounded up: the status's own
    // `duration_until_reset`, which the time between calls can shorten (a
    // slow host: up to 10 s allowed).
    for (remaining, full_in) in [(2, 20), (1, 40), (0, 60)] {
        let response = ask(&mut client, key()).await;
        let reset = response.statuses[0].duration_until_reset.unwrap();
        let t = whole_seconds_up(&reset);
        assert!((full_in - 10..=full_in).contains(&t), "{reset:?}");
        assert_eq!(
            headers(&response),
            [
                policy.clone(),
                (
                    "RateLimit".to_owned(),
                    format!("\"api\";r={remaining};t={t}")
                ),
            ]
        );
    }
    // Refused: `t` and `Retry-After` are the wait for the next unit, at
    // most 20 s.
    let refused = ask(&mut client, key()).await;
    assert_eq!(refused.overall_code(), Code::OverLimit);
    let found = headers(&refused);
    let wait = found[2].1.parse::<u64>().unwrap();
    assert!((10..=20).contains(&wait), "{found:?}");
    assert_eq!(
        found,
        [
            policy.clone(),
            ("RateLimit".to_owned(), format!("\"api\";r=0;t={wait}")),
            ("Retry-After".to_owned(), wait.to_string()),
        ]
    );
    // Two limits: an item each, in the descriptors' order; a rule in
    // shadow mode, unlimited or unmatched shows none.
    let mixed = ask(
        &mut client,
        request(
            "shop",
            vec![
                descriptor(&[("path", "/beta")]),
                descriptor(&[("api_key", "k2")]),
                descriptor(&[("path", "/health")]),
                descriptor(&[("user", "u")]),
            ],
        ),
    )
    .await;
    assert_eq!(
        headers(&mixed),
        [
            (
                "RateLimit-Policy".to_owned(),
                "\"api\";q=3;w=60, \"user\";q=5;w=1".to_owned()
            ),
            (
                "RateLimit".to_owned(),
                "\"api\";r=2;t=20, \"user\";r=4;t=1".to_owned()
            ),
        ]
    );
}

/// A protobuf duration in whole seconds, rounded up.
fn whole_seconds_up(duration: &envoy_types::pb::google::protobuf::Duration) -> u64 {
    u64::try_from(duration.seconds).unwrap() + u64::from(duration.nanos > 0)
}

/// A status's fields but the time to reset, which the clock moves.
fn fields(status: &DescriptorStatus) -> (Code, Option<RateLimit>, u32) {
    (
        status.code(),
        status.current_limit.clone(),
        status.limit_remaining,
    )
}

fn limit(name: &str, requests_per_unit: u32, unit: Unit) -> Option<RateLimit> {
    Some(RateLimit {
        name: name.to_owned(),
        requests_per_unit,
        unit: unit.into(),
    })
}

#[tokio::test]
async fn every_field_of_a_descriptor_s_status() {
    let server = Server::start(CONFIG);
    let mut client = server.client().await;
    let address = || request("shop", vec![descriptor(&[("remote_address", "10.0.0.1")])]);
    for remaining in [2, 1, 0] {
        let response = ask(&mut client, address()).await;
        assert_eq!(response.overall_code(), Code::Ok);
        assert_eq!(
            fields(&response.statuses[0]),
            (Code::Ok, limit("", 3, Unit::Minute), remaining)
        );
        // The window is one of the server's minutes: it ends within one.
        let reset = response.statuses[0].duration_until_reset.unwrap();
        assert!((1..=60).contains(&whole_seconds_up(&reset)), "{reset:?}");
    }
    let refused = ask(&mut client, address()).await;
    assert_eq!(refused.overall_code(), Code::OverLimit);
    assert_eq!(
        fields(&refused.statuses[0]),
        (Code::OverLimit, limit("", 3, Unit::Minute), 0)
    );
    // Another address has its own counter.
    let other = ask(
        &mut client,
        request("shop", vec![descriptor(&[("remote_address", "10.0.0.2")])]),
    )
    .await;
    assert_eq!(fields(&other.statuses[0]).2, 2);
}

#[tokio::test]
async fn a_request_one_descriptor_refuses_is_charged_by_none() {
    let server = Server::start(CONFIG);
    let mut client = server.client().await;
    // The tenant's 10 an hour beside an address's 3 a minute.
    let both = || {
        request(
            "shop",
            vec![
                descriptor(&[("tenant", "acme")]),
                descriptor(&[("remote_address", "10.0.0.9")]),
            ],
        )
    };
    for _ in 0..3 {
        assert_eq!(ask(&mut client, both()).await.overall_code(), Code::Ok);
    }
    for _ in 0..4 {
        let refused = ask(&mut client, both()).await;
        assert_eq!(refused.overall_code(), Code::OverLimit);
        // The tenant was given back: it still has 7 of 10 (a check would
        // leave 6), and it is reported OK.
        assert_eq!(
            fields(&refused.statuses[0]),
            (Code::Ok, limit("tenant", 10, Unit::Hour), 6)
        );
        assert_eq!(refused.statuses[1].code(), Code::OverLimit);
    }
    let tenant = ask(
        &mut client,
        request("shop", vec![descriptor(&[("tenant", "acme")])]),
    )
    .await;
    assert_eq!(fields(&tenant.statuses[0]).2, 6, "three charged, no more");
}

#[tokio::test]
async fn shadow_mode_replaces_unlimited_and_unknown_descriptors() {
    let server = Server::start(CONFIG);
    let mut client = server.client().await;
    // Shadow mode: decided and counted, never refused.
    for remaining in [0, 0, 0] {
        let beta = ask(
            &mut client,
            request("shop", vec![descriptor(&[("path", "/beta")])]),
        )
        .await;
        assert_eq!(beta.overall_code(), Code::Ok);
        assert_eq!(
            fields(&beta.statuses[0]),
            (Code::Ok, limit("", 1, Unit::Hour), remaining)
        );
    }
    // `free` replaces `tenant` in a request matching both: only free's 2.
    let free_tenant = || {
        request(
            "shop",
            vec![
                descriptor(&[("tenant", "acme")]),
                descriptor(&[("plan", "free")]),
            ],
        )
    };
    for _ in 0..2 {
        let response = ask(&mut client, free_tenant()).await;
        assert_eq!(response.overall_code(), Code::Ok);
        assert_eq!(fields(&response.statuses[0]), (Code::Ok, None, 0));
    }
    assert_eq!(
        ask(&mut client, free_tenant()).await.overall_code(),
        Code::OverLimit
    );
    let tenant = ask(
        &mut client,
        request("shop", vec![descriptor(&[("tenant", "acme")])]),
    )
    .await;
    assert_eq!(
        fields(&tenant.statuses[0]).2,
        9,
        "the tenant was never charged"
    );
    // Unlimited, unmatched, and an unknown domain: OK, no limit.
    for (domain, entries) in [
        ("shop", [("path", "/health")]),
        ("shop", [("path", "/elsewhere")]),
        ("other", [("remote_address", "10.0.0.1")]),
    ] {
        let response = ask(&mut client, request(domain, vec![descriptor(&entries)])).await;
        assert_eq!(response.overall_code(), Code::Ok);
        assert_eq!(fields(&response.statuses[0]), (Code::Ok, None, 0));
        assert_eq!(response.statuses[0].duration_until_reset, None);
    }
}

#[tokio::test]
async fn hits_addend_and_a_descriptor_s_own_limit() {
    let server = Server::start(CONFIG);
    let mut client = server.client().await;
    // The request's hits_addend: 3 units at once.
    let mut heavy = request("shop", vec![descriptor(&[("remote_address", "a")])]);
    heavy.hits_addend = 3;
    let response = ask(&mut client, heavy.clone()).await;
    assert_eq!(fields(&response.statuses[0]).2, 0);
    assert_eq!(
        ask(&mut client, heavy).await.overall_code(),
        Code::OverLimit
    );
    // A descriptor's own hits_addend wins; 0 decides without charging.
    let mut peek = descriptor(&[("remote_address", "b")]);
    peek.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..3 {
        let response = ask(&mut client, request("shop", vec![peek.clone()])).await;
        assert_eq!(fields(&response.statuses[0]).2, 2, "nothing charged");
    }
    // More than the limit holds: over it, whatever comes after.
    let mut too_many = descriptor(&[("remote_address", "c")]);
    too_many.hits_addend = Some(UInt64Value { value: 4 });
    let response = ask(&mut client, request("shop", vec![too_many])).await;
    assert_eq!(response.statuses[0].code(), Code::OverLimit);
    // A descriptor bringing its own limit: 2 an hour, whatever the rules.
    let mut own = descriptor(&[("anything", "x")]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: Unit::Hour.into(),
    });
    let mut codes = Vec::new();
    for _ in 0..3 {
        let response = ask(&mut client, request("shop", vec![own.clone()])).await;
        assert_eq!(response.statuses[0].current_limit, limit("", 2, Unit::Hour));
        codes.push(response.overall_code());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
}

#[tokio::test]
async fn malformed_requests_are_typed_errors() {
    let server = Server::start(CONFIG);
    let mut client = server.client().await;
    let mut no_unit = descriptor(&[("k", "v")]);
    no_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let mut zero = descriptor(&[("k", "v")]);
    zero.limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: Unit::Second.into(),
    });
    for (malformed, message) in [
        (
            request("", vec![descriptor(&[("k", "v")])]),
            "the domain is empty",
        ),
        (request("shop", vec![]), "the request has no descriptor"),
        (
            request("shop", vec![descriptor(&[])]),
            "descriptor 0 has no entry",
        ),
        (
            request("shop", vec![no_unit]),
            "descriptor 0 brings a limit of no known unit (0)",
        ),
    ] {
        let status = client.should_rate_limit(malformed).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), message);
    }
    let status = client
        .should_rate_limit(request("shop", vec![zero]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "descriptor 0 brings a limit of 0 requests"
    );
    // The server still answers.
    let fine = ask(
        &mut client,
        request("shop", vec![descriptor(&[("tenant", "t")])]),
    )
    .await;
    assert_eq!(fine.overall_code(), Code::Ok);
}

#[tokio::test]
async fn health_and_a_reload_that_keeps_each_key() {
    let server = Server::start(CONFIG);
    let channel = Channel::from_shared(format!("http://{}", server.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serving.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    let mut client = RateLimitServiceClient::new(channel);
    let tenant = || request("shop", vec![descriptor(&[("tenant", "acme")])]);
    for _ in 0..4 {
        ask(&mut client, tenant()).await;
    }
    // Raised from 10 to 20 an hour, carried as is (the default): the key
    // keeps its 6 free units, and a key in use gets none of the raise.
    std::fs::write(
        &server.config,
        CONFIG.replace("requests_per_unit: 10", "requests_per_unit: 20"),
    )
    .unwrap();
    hang_up(&server);
    let raised = wait_for(&mut client, tenant, |response| {
        response.statuses[0].current_limit == limit("tenant", 20, Unit::Hour)
    })
    .await;
    assert_eq!(
        fields(&raised.statuses[0]).2,
        5,
        "6 free before this check (19 had the state been lost)"
    );
    // A configuration with an error is refused (the refusal counted), and
    // the last good one stays.
    std::fs::write(&server.config, "domain: shop\ndescriptors: [\n").unwrap();
    hang_up(&server);
    wait_for_metric(&server, "ratelimit_service_config_load_error", 1).await;
    let kept = ask(&mut client, tenant()).await;
    assert_eq!(
        fields(&kept.statuses[0]),
        (Code::Ok, limit("tenant", 20, Unit::Hour), 4)
    );
}

/// A bad file at start: the server does not start, and says the file,
/// line, column and rule.
#[test]
fn a_bad_file_at_start_names_its_file_line_and_rule() {
    let bad = "\
domain: shop
descriptors:
  - key: tenant
    rate_limit:
      unit: fortnight
      requests_per_unit: 10
";
    let refused = Server::refused(bad, &[]);
    let (file, rest) = refused
        .trim()
        .strip_prefix("tollgate-server: ")
        .and_then(|message| message.split_once(".yaml:"))
        .unwrap_or_else(|| panic!("{refused}"));
    assert!(file.starts_with(&std::env::temp_dir().display().to_string()));
    assert!(rest.starts_with("5:13: shop.tenant: "), "{refused}");
    assert!(rest.contains("fortnight"), "{refused}");
}

/// A file changed is read again without a signal, once it has stayed
/// unchanged for a tick; a rule whose algorithm changed starts fresh, and
/// the others keep their keys.
#[tokio::test]
async fn a_file_changed_is_reloaded_and_a_new_algorithm_starts_fresh() {
    let server = Server::start_with(CONFIG, &["--watch-ms", "50"]);
    let mut client = server.client().await;
    let tenant = || request("shop", vec![descriptor(&[("tenant", "acme")])]);
    let key = || request("shop", vec![descriptor(&[("api_key", "k")])]);
    for _ in 0..4 {
        ask(&mut client, tenant()).await;
    }
    for _ in 0..3 {
        ask(&mut client, key()).await;
    }
    // The tenant's rule becomes a sliding window log of the same limit;
    // the api key's is unchanged.
    std::fs::write(
        &server.config,
        CONFIG.replace(
            "      name: tenant\n      unit: hour\n      requests_per_unit: 10\n",
            "      name: tenant\n      unit: hour\n      requests_per_unit: 10\n      \
             algorithm: sliding_window_log\n",
        ),
    )
    .unwrap();
    wait_for_metric(&server, "ratelimit_service_config_load_success", 1).await;
    assert_eq!(
        fields(&ask(&mut client, tenant()).await.statuses[0]).2,
        9,
        "fresh"
    );
    let kept = ask(&mut client, key()).await;
    assert_eq!(
        kept.statuses[0].code(),
        Code::OverLimit,
        "kept: 3 of 3 used"
    );
}

/// A descriptor of cost 0 is decided and never refuses (its key may be
/// spent: the request still passes, charged by its other descriptors); a
/// limit brought in an unknown domain limits nothing; and past
/// `--max-overrides` limiters in use, a descriptor bringing another is
/// over its limit, charging nothing of its request.
#[tokio::test]
async fn peeks_brought_limits_and_their_bounds() {
    let server = Server::start_with(CONFIG, &["--max-overrides", "1"]);
    let mut client = server.client().await;
    let address = || descriptor(&[("remote_address", "spent")]);
    for _ in 0..3 {
        ask(&mut client, request("shop", vec![address()])).await;
    }
    let mut peek = address();
    peek.hits_addend = Some(UInt64Value { value: 0 });
    let mut shadow_peek = descriptor(&[("path", "/beta")]);
    shadow_peek.hits_addend = Some(UInt64Value { value: 0 });
    let passed = ask(
        &mut client,
        request(
            "shop",
            vec![descriptor(&[("tenant", "peeking")]), peek, shadow_peek],
        ),
    )
    .await;
    assert_eq!(passed.overall_code(), Code::Ok);
    assert_eq!(
        passed.statuses.iter().map(fields).collect::<Vec<_>>(),
        [
            (Code::Ok, limit("tenant", 10, Unit::Hour), 9),
            (Code::Ok, limit("", 3, Unit::Minute), 0),
            (Code::Ok, limit("", 1, Unit::Hour), 0),
        ]
    );
    // Brought in an unknown domain: nothing to hold it to.
    let brought = |count, domain: &str| {
        let mut own = descriptor(&[("anything", "x")]);
        own.limit = Some(RateLimitOverride {
            requests_per_unit: count,
            unit: Unit::Hour.into(),
        });
        request(domain, vec![descriptor(&[("tenant", "brought")]), own])
    };
    let unknown = ask(&mut client, brought(1, "elsewhere")).await;
    assert_eq!(fields(&unknown.statuses[1]), (Code::Ok, None, 0));
    // One override limiter in use (its key holds a unit): another count
    // has no room, and the tenant beside it is not charged.
    assert_eq!(
        ask(&mut client, brought(5, "shop")).await.overall_code(),
        Code::Ok
    );
    let full = ask(&mut client, brought(6, "shop")).await;
    assert_eq!(full.overall_code(), Code::OverLimit);
    assert_eq!(
        full.statuses.iter().map(fields).collect::<Vec<_>>(),
        [
            (Code::Ok, limit("tenant", 10, Unit::Hour), 8),
            (Code::OverLimit, limit("", 6, Unit::Hour), 0),
        ]
    );
}

/// What clients choose cannot grow the service without bound: a rule
/// holds at most `--max-keys` keys (a new one past them is over its
/// limit, the keys held keep working, and other rules are unaffected),
/// and a request at most `--max-descriptors` descriptors of at most
/// `--max-descriptor-bytes` each.
#[tokio::test]
async fn clients_cannot_grow_the_service_without_bound() {
    let server = Server::start_with(
        CONFIG,
        &[
            "--max-keys",
            "2",
            "--max-descriptors",
            "3",
            "--max-descriptor-bytes",
            "32",
        ],
    );
    let mut client = server.client().await;
    let address = |value: &str| request("shop", vec![descriptor(&[("remote_address", value)])]);
    for value in ["a", "b"] {
        assert_eq!(
            ask(&mut client, address(value)).await.overall_code(),
            Code::Ok
        );
    }
    let third = ask(&mut client, address("c")).await;
    assert_eq!(
        fields(&third.statuses[0]),
        (Code::OverLimit, limit("", 3, Unit::Minute), 0)
    );
    // The keys held keep their counts; another rule has room of its own.
    assert_eq!(
        fields(&ask(&mut client, address("a")).await.statuses[0]).2,
        1
    );
    let tenant = ask(
        &mut client,
        request("shop", vec![descriptor(&[("tenant", "t")])]),
    )
    .await;
    assert_eq!(tenant.overall_code(), Code::Ok);
    let four = request("shop", vec![descriptor(&[("k", "v")]); 4]);
    let status = client.should_rate_limit(four).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "4 descriptors, more than the 3 a request may bring"
    );
    let long = "v".repeat(30);
    let status = client
        .should_rate_limit(request("shop", vec![descriptor(&[("key", &long)])]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        // Kept as `3:key30:vvv…`, each length before its text.
        "descriptor 0 holds 38 bytes, more than the 32 a descriptor may"
    );
}

/// Asks `request` until `done` holds (a reload is asynchronous), for at
/// most five seconds.
async fn wait_for(
    client: &mut Client,
    request: impl Fn() -> RateLimitRequest,
    done: impl Fn(&RateLimitResponse) -> bool,
) -> RateLimitResponse {
    // Peeks (hits_addend 0 on the descriptor) until the change shows, so
    // that waiting charges nothing.
    for _ in 0..100 {
        let mut peek = request();
        for descriptor in &mut peek.descriptors {
            descriptor.hits_addend = Some(UInt64Value { value: 0 });
        }
        if done(&ask(client, peek).await) {
            return ask(client, request()).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the reload never showed");
}

/// The example Envoy configuration is Envoy's: read by Python with
/// Envoy's generated configuration types (xds-protos), every typed config
/// resolved and an unknown field refused, and checked against what the
/// example configuration serves (`envoy_config.py` lists what: the domain,
/// every descriptor a rule path, the client's own address, the service's
/// address over HTTP/2, …). Envoy's own field rules are not applied, and
/// no Envoy runs here: none is installable on this machine.
#[test]
fn the_example_envoy_configuration_is_envoy_s() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let output = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/envoy_config.py"
        ))
        .arg(format!("{examples}/envoy.yaml"))
        .arg(format!("{examples}/ratelimit.yaml"))
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "the Envoy configuration check failed (the test command installs PyYAML and \
         xds-protos):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8(output.stdout).unwrap(), "ok\n");
}

/// The same service called from Python, with Envoy's generated stubs
/// (xds-protos) over grpcio: a client written outside this project, as
/// the proxies' own are. The test command installs both; without them
/// this test fails saying so.
#[test]
fn a_client_written_outside_the_project_reads_every_field() {
    let server = Server::start(CONFIG);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/rls_client.py");
    let output = Command::new("python3")
        .arg(script)
        .arg(&server.address)
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "the Python client failed (the test command installs grpcio and xds-protos: \
         pip install grpcio==1.85.1 xds-protos==1.85.0):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let status = |code: &str, limit: serde_json::Value, remaining: u32| {
        serde_json::json!({
            "code": code,
            "limit": limit,
            "remaining": remaining,
            "has_reset": !limit.is_null(),
        })
    };
    let address = serde_json::json!(["", 3, "MINUTE"]);
    let tenant = serde_json::json!(["tenant", 10, "HOUR"]);
    let day = serde_json::json!(["", 1, "DAY"]);
    let expected = [
        serde_json::json!({"overall": "OK", "statuses": [status("OK", address.clone(), 2)]}),
        // hits_addend 2: the last two units.
        serde_json::json!({"overall": "OK", "statuses": [status("OK", address.clone(), 0)]}),
        serde_json::json!({"overall": "OVER_LIMIT",
            "statuses": [status("OVER_LIMIT", address.clone(), 0)]}),
        // The address refuses; the tenant is given back (10 free, a peek
        // predicts 9).
        serde_json::json!({"overall": "OVER_LIMIT", "statuses": [
            status("OK", tenant.clone(), 9), status("OVER_LIMIT", address, 0)]}),
        // A descriptor's hits_addend of 0: decided, not charged.
        serde_json::json!({"overall": "OK", "statuses": [status("OK", tenant, 9)]}),
        serde_json::json!({"overall": "OK", "statuses": [status("OK", day.clone(), 0)]}),
        serde_json::json!({"overall": "OVER_LIMIT", "statuses": [status("OVER_LIMIT", day, 0)]}),
        serde_json::json!({"error": "INVALID_ARGUMENT", "details": "the domain is empty"}),
    ];
    assert_eq!(lines, expected);
}

/// `/metrics` renders envoyproxy/ratelimit's statistics, per rule, in
/// units: every count exact.
#[tokio::test]
async fn metrics_count_each_rule_s_hits_exactly() {
    let server = Server::start(CONFIG);
    let mut client = server.client().await;
    // 3 a minute: 4 checks of one unit (3 within, the third past four
    // fifths of the limit, so near it; 1 over), then a check of 2 units
    // over it.
    for _ in 0..4 {
        ask(
            &mut client,
            request("shop", vec![descriptor(&[("remote_address", "m")])]),
        )
        .await;
    }
    let mut heavy = request("shop", vec![descriptor(&[("remote_address", "m")])]);
    heavy.hits_addend = 2;
    ask(&mut client, heavy).await;
    // Shadow mode: 1 an hour, checked 3 times: 2 would have been refused.
    for _ in 0..3 {
        ask(
            &mut client,
            request("shop", vec![descriptor(&[("path", "/beta")])]),
        )
        .await;
    }
    let text = support::metrics(&server).await;
    let sample = |name: &str, key: &str| -> Option<u64> {
        let prefix = format!("{name}{{domain=\"shop\",key=\"{key}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map(|value| value.parse().unwrap())
    };
    let address = "remote_address";
    assert_eq!(
        sample("ratelimit_service_rate_limit_total_hits", address),
        Some(6)
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_within_limit", address),
        Some(3)
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_near_limit", address),
        Some(1)
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_over_limit", address),
        Some(3)
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_shadow_mode", address),
        None
    );
    let beta = "path_/beta";
    assert_eq!(
        sample("ratelimit_service_rate_limit_total_hits", beta),
        Some(3)
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_within_limit", beta),
        Some(1)
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_shadow_mode", beta),
        Some(2)
    );
    assert_eq!(
        sample("ratelimit_service_rate_limit_over_limit", beta),
        None
    );
}

/// `/json`: the same request in protobuf's JSON mapping, answered in it,
/// 429 over the limit; `/healthcheck`.
#[tokio::test]
async fn the_json_endpoint_and_the_health_check() {
    let server = Server::start(CONFIG);
    let http = reqwest::Client::new();
    let post = |body: String| {
        http.post(format!("http://{}/json", server.http_address))
            .body(body)
            .send()
    };
    let body = r#"{"domain": "shop", "descriptors": [{"entries": [{"key": "api_key", "value": "j"}]}], "hitsAddend": 3}"#;
    let admitted = post(body.to_owned()).await.unwrap();
    assert_eq!(admitted.status(), 200);
    let admitted: serde_json::Value =
        serde_json::from_str(&admitted.text().await.unwrap()).unwrap();
    assert_eq!(
        admitted,
        serde_json::json!({
            "overallCode": "OK",
            "statuses": [{
                "code": "OK",
                "currentLimit": {"name": "api", "requestsPerUnit": 3, "unit": "MINUTE"},
                "limitRemaining": 0,
                "durationUntilReset": "60.000000000s",
            }],
            "responseHeadersToAdd": [
                {"key": "RateLimit-Policy", "value": "\"api\";q=3;w=60"},
                {"key": "RateLimit", "value": "\"api\";r=0;t=60"},
            ],
        })
    );
    // The proto's own field names are read too.
    let refused = post(
        r#"{"domain": "shop", "descriptors": [{"entries": [{"key": "api_key", "value": "j"}]}], "hits_addend": 1}"#
            .to_owned(),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), 429);
    let refused: serde_json::Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    assert_eq!(refused["overallCode"], "OVER_LIMIT");
    assert_eq!(refused["statuses"][0]["code"], "OVER_LIMIT");
    for (body, message) in [
        (
            "{",
            "not JSON: EOF while parsing an object at line 1 column 1",
        ),
        ("[]", "the request is not an object"),
        (r#"{"domain": "shop"}"#, "the request has no descriptor"),
        (
            r#"{"domain": "shop", "descriptors": [{"entries": [{"key": "k"}]}], "hitsAddend": -1}"#,
            "`hitsAddend` is not an unsigned integer",
        ),
        (
            r#"{"domain": "shop", "descriptors": [{"entries": [{"key": "k"}], "limit": {"requestsPerUnit": 1, "unit": "FORTNIGHT"}}]}"#,
            "no unit is named \"FORTNIGHT\"",
        ),
    ] {
        let response = post(body.to_owned()).await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        assert_eq!(response.text().await.unwrap(), message, "{body}");
    }
    let health = reqwest::get(format!("http://{}/healthcheck", server.http_address))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "OK");
}
