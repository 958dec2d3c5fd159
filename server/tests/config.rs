//! The configuration: envoyproxy/ratelimit's YAML, matched as that service
//! matches it, and every error named by file, line, column and rule.

use std::path::Path;
use std::time::Duration;

use tollgate::Quota;
use tollgate_server::config::{Algorithm, Config, ConfigError, LoadError, Mode, Unit};

const SHOP: &str = "\
domain: shop
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: path
    value: /checkout
    rate_limit:
      name: checkout
      unit: MINUTE
      requests_per_unit: 100
      algorithm: gcra
      burst: 20
      mode: leased
    shadow_mode: true
  - key: path
    value: /api/*
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: path
    rate_limit:
      unlimited: true
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit:
          replaces:
            - name: checkout
          unit: day
          requests_per_unit: 5
";

fn shop() -> Config {
    Config::parse(Path::new("shop.yaml"), SHOP).unwrap()
}

fn path_of(config: &Config, entries: &[(&str, &str)]) -> Option<String> {
    config
        .matches("shop", entries.iter().copied())
        .map(|rule| rule.path.clone())
}

#[test]
fn descriptors_match_as_envoyproxy_ratelimit_matches_them() {
    let config = shop();
    // A key alone: every value.
    assert_eq!(
        path_of(&config, &[("remote_address", "10.0.0.1")]).as_deref(),
        Some("shop.remote_address")
    );
    // Key and value first, then a prefix, then the key alone.
    assert_eq!(
        path_of(&config, &[("path", "/checkout")]).as_deref(),
        Some("shop.path_/checkout")
    );
    assert_eq!(
        path_of(&config, &[("path", "/api/orders")]).as_deref(),
        Some("shop.path_/api/*")
    );
    assert_eq!(
        path_of(&config, &[("path", "/about")]).as_deref(),
        Some("shop.path")
    );
    // Nested: the limit of the last entry, only at the rules' depth.
    assert_eq!(
        path_of(&config, &[("tenant", "acme"), ("plan", "free")]).as_deref(),
        Some("shop.tenant.plan_free")
    );
    assert_eq!(path_of(&config, &[("tenant", "acme")]), None);
    assert_eq!(
        path_of(&config, &[("tenant", "acme"), ("plan", "pro")]),
        None
    );
    assert_eq!(
        path_of(&config, &[("remote_address", "10.0.0.1"), ("path", "/")]),
        None
    );
    assert_eq!(path_of(&config, &[("unknown", "x")]), None);
    assert_eq!(path_of(&config, &[]), None);
    assert!(config.matches("other", [("path", "/")]).is_none());
    assert!(config.has_domain("shop") && !config.has_domain("other"));
    assert_eq!(config.rules().count(), 5);
}

#[test]
fn a_rule_reads_every_key() {
    let config = shop();
    let checkout = config.matches("shop", [("path", "/checkout")]).unwrap();
    let limit = checkout.limit.unwrap();
    assert_eq!(checkout.name.as_deref(), Some("checkout"));
    assert!(checkout.shadow_mode && !checkout.detailed_metric);
    assert_eq!(
        (
            limit.requests_per_unit,
            limit.unit,
            limit.algorithm,
            limit.mode
        ),
        (100, Unit::Minute, Algorithm::Gcra, Mode::Leased)
    );
    assert_eq!(
        limit.quota,
        Quota::per_minute(100).unwrap().with_burst(20).unwrap()
    );
    assert_eq!(
        (checkout.origin.line, checkout.origin.column),
        (9, 5),
        "its `rate_limit` key"
    );
    let address = config.matches("shop", [("remote_address", "a")]).unwrap();
    let limit = address.limit.unwrap();
    assert_eq!(
        (limit.algorithm, limit.mode, limit.quota),
        (
            Algorithm::FixedWindow,
            Mode::Exact,
            Quota::per_second(10).unwrap()
        )
    );
    assert_eq!(
        config.matches("shop", [("path", "/")]).unwrap().limit,
        None,
        "unlimited"
    );
    let free = config
        .matches("shop", [("tenant", "t"), ("plan", "free")])
        .unwrap();
    assert_eq!(free.replaces, ["checkout"]);
    assert_eq!(free.limit.unwrap().unit.span(), Duration::from_secs(86_400));
}

/// The error `text` gives, as `file:line:column: rule: reason`.
fn refused(text: &str) -> String {
    Config::parse(Path::new("bad.yaml"), text)
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

#[test]
fn every_error_names_the_file_the_line_and_the_rule() {
    let deep_indent = format!("domain: d\ndescriptors:\n{}- key: k\n", " ".repeat(300));
    let deep_dashes = format!("domain: d\ndescriptors:\n  {}k\n", "- ".repeat(200));
    let cases: [(&str, &str); 20] = [
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limt:\n      unit: second\n",
            "bad.yaml:4:5: d: unknown key `rate_limt` (known: key, value, rate_limit, descriptors, \
             shadow_mode, detailed_metric)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      \
             requests_per_unit: 1\n",
            "bad.yaml:5:13: d.k: `unit` is one of second, minute, hour, day, week, month, year, \
             not \"fortnight\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n",
            "bad.yaml:4:5: d.k: a limit with no `requests_per_unit`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      \
             requests_per_unit: -1\n",
            "bad.yaml:6:26: d.k: `requests_per_unit` is a whole number from 0 to 4294967295, in \
             decimal, not \"-1\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "bad.yaml:5:10: d.k_v: a descriptor configured twice at one level",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      \
             unit: second\n",
            "bad.yaml:6:13: d.k: an unlimited rule with a `unit`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      \
             requests_per_unit: 1\n      replaces:\n        - name: nobody\n",
            "bad.yaml:4:5: d.k: `replaces` names `nobody`, which no rule of the domain is named",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      \
             requests_per_unit: 1\n      mode: leased\n",
            "bad.yaml:7:13: d.k: `mode: leased` needs `algorithm: gcra`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      \
             requests_per_unit: 4\n      burst: 8\n",
            "bad.yaml:7:14: d.k: a window algorithm counts `requests_per_unit` a window: a `burst` \
             is for gcra and token_bucket",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    key: j\n",
            "bad.yaml:4:5: bad.yaml: the key `key` twice in one mapping",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      \
             requests_per_unit: 010\n",
            "bad.yaml:6:26: d.k: `requests_per_unit` is a whole number from 0 to 4294967295, in \
             decimal, not \"010\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a_b\n    value: c\n    rate_limit:\n      unit: \
             second\n      requests_per_unit: 1\n  - key: a\n    value: b_c\n    rate_limit:\n      \
             unlimited: true\n",
            "bad.yaml:10:5: d.a_b_c: the path of the rule at bad.yaml:5:5 too (a key or value \
             holding `.` or `_`)",
        ),
        (
            &deep_indent,
            "bad.yaml:3:303: bad.yaml: nested deeper than 256 columns, which this service reads",
        ),
        (
            &deep_dashes,
            "bad.yaml:3:403: bad.yaml: nested deeper than 256 columns, which this service reads",
        ),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "bad.yaml:3:5: d: a descriptor with no `key`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: n\n      \
             unlimited: true\n      replaces:\n        - name: n\n",
            "bad.yaml:8:11: d.k: a rule that replaces itself",
        ),
        (
            "domain: \"\"\n",
            "bad.yaml:1:9: the file: an empty `domain`",
        ),
        ("descriptors: []\n", "bad.yaml:1:1: bad.yaml: no `domain`"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please\n",
            "bad.yaml:4:18: d.k: `shadow_mode` is true or false, not \"yes please\"",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: n\n      unit: \
             second\n      requests_per_unit: 1\n  - key: j\n    rate_limit:\n      name: n\n      \
             unlimited: true\n",
            "bad.yaml:10:13: d.j: the name `n` is taken by the rule at bad.yaml:5:13",
        ),
    ];
    for (text, expected) in cases {
        let error = refused(text);
        assert_eq!(error, expected, "for\n{text}");
    }
    // Not YAML: the loader's own words after ours.
    let error = refused("domain: d\ndescriptors: [\n");
    assert!(
        error.starts_with("bad.yaml:3:1: bad.yaml: not YAML: ") && error.len() > 35,
        "{error}"
    );
}

#[test]
fn a_directory_loads_every_file_and_refuses_a_domain_twice() {
    let directory = std::env::temp_dir().join(format!("tollgate-config-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    std::fs::write(directory.join("a.yaml"), SHOP).unwrap();
    std::fs::write(directory.join("b.yml"), "domain: other\n").unwrap();
    std::fs::write(directory.join("notes.txt"), "not read").unwrap();
    let config = Config::load(&directory).unwrap();
    assert!(config.has_domain("shop") && config.has_domain("other"));
    std::fs::write(directory.join("c.yaml"), "domain: shop\n").unwrap();
    match Config::load(&directory) {
        Err(LoadError::Config(ConfigError {
            origin,
            rule,
            reason,
        })) => {
            assert_eq!(
                (origin.file.file_name().unwrap(), origin.line, origin.column),
                (std::ffi::OsStr::new("c.yaml"), 1, 9)
            );
            assert_eq!(rule, "shop");
            assert_eq!(reason, "a domain configured twice (once in another file)");
        }
        other => panic!("{other:?}"),
    }
    std::fs::remove_dir_all(&directory).unwrap();
    assert!(matches!(
        Config::load(&directory),
        Err(LoadError::Read { .. })
    ));
}

/// The example configuration the README starts the server on is valid.
#[test]
fn the_example_configuration_loads() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/ratelimit.yaml"
    ));
    let config = Config::load(path).unwrap();
    assert_eq!(config.rules().count(), 6);
}

/// What the reference's YAML 1.1 loader reads, read alike: `yes` and `on`
/// as true, a null value as the key alone, an empty `descriptors`, and a
/// count beside `unlimited` ignored.
#[test]
fn the_reference_s_yaml_readings() {
    let config = Config::parse(
        Path::new("compat.yaml"),
        "domain: d\ndescriptors:\n  - key: a\n    value: ~\n    rate_limit:\n      unit: second\n      \
         requests_per_unit: 1\n    shadow_mode: yes\n    detailed_metric: on\n  - key: b\n    \
         descriptors:\n  - key: c\n    rate_limit:\n      unlimited: true\n      \
         requests_per_unit: 5\n",
    )
    .unwrap();
    let a = config.matches("d", [("a", "anything")]).unwrap();
    assert_eq!(a.path, "d.a");
    assert!(a.shadow_mode && a.detailed_metric);
    assert_eq!(config.matches("d", [("b", "x")]), None);
    assert_eq!(config.matches("d", [("c", "x")]).unwrap().limit, None);
    let empty = Config::parse(Path::new("e.yaml"), "domain: e\ndescriptors:\n").unwrap();
    assert_eq!(empty.rules().count(), 0);
}

/// Two files whose rules have one path (domain `d` with key `x.y`, domain
/// `d.x` with key `y`): the second is refused.
#[test]
fn a_path_taken_in_another_file_is_refused() {
    let directory = std::env::temp_dir().join(format!("tollgate-paths-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let rule = "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n";
    std::fs::write(
        directory.join("a.yaml"),
        format!("domain: d\ndescriptors:\n  - key: x.y\n{rule}"),
    )
    .unwrap();
    std::fs::write(
        directory.join("b.yaml"),
        format!("domain: d.x\ndescriptors:\n  - key: y\n{rule}"),
    )
    .unwrap();
    let refused = Config::load(&directory).unwrap_err().to_string();
    std::fs::remove_dir_all(&directory).unwrap();
    let a = directory.join("a.yaml");
    let b = directory.join("b.yaml");
    assert_eq!(
        refused,
        format!(
            "{}:4:5: d.x.y: the path of the rule at {}:4:5 too (a key or value holding `.` or `_`)",
            b.display(),
            a.display()
        )
    );
}
