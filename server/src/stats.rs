//! The service's statistics, through the `metrics` facade: envoyproxy's
//! names where it has them, so that its dashboards read tollgate's.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `ratelimit_service_rate_limit_total_hits` | counter | `domain`, `key`: the units every matched rule's descriptors cost |
//! | `ratelimit_service_rate_limit_within_limit` | counter | the same: units admitted |
//! | `ratelimit_service_rate_limit_near_limit` | counter | the same: units admitted that left less than a fifth of the limit |
//! | `ratelimit_service_rate_limit_over_limit` | counter | the same: units refused |
//! | `ratelimit_service_rate_limit_shadow_mode` | counter | the same: units a rule in shadow mode would have refused |
//! | `ratelimit_service_config_load_success` | counter | reloads taken |
//! | `ratelimit_service_config_load_error` | counter | reloads refused |
//!
//! `key` is the rule's path below its domain (`path_/checkout`), as
//! envoyproxy's statsd names carry it; a descriptor's own limit counts
//! under `key="override"`. The values of a key-only rule's descriptors are
//! chosen by clients and are never a label (`detailed_metric` is read and
//! changes nothing here): the statistics stay as many as the rules.

use metrics::counter;

use crate::limits::Status;

/// Counts a decided request's statuses in `domain`.
pub fn count(domain: &str, statuses: &[Status]) {
    for status in statuses {
        let Some((requests_per_unit, _, _)) = status.limit else {
            continue;
        };
        let key = status.rule.as_ref().map_or("override", |rule| {
            rule.path
                .strip_prefix(domain)
                .and_then(|path| path.strip_prefix('.'))
                .unwrap_or(&rule.path)
        });
        let labels = [("domain", domain.to_owned()), ("key", key.to_owned())];
        let hits = status.cost;
        counter!("ratelimit_service_rate_limit_total_hits", &labels).increment(hits);
        if status.shadow_refused {
            counter!("ratelimit_service_rate_limit_shadow_mode", &labels).increment(hits);
        }
        match status.decision {
            _ if status.over_limit => {
                counter!("ratelimit_service_rate_limit_over_limit", &labels).increment(hits);
            }
            Some(decision) if decision.is_allowed() => {
                counter!("ratelimit_service_rate_limit_within_limit", &labels).increment(hits);
                if u64::from(decision.remaining()) * 5 < u64::from(requests_per_unit) {
                    counter!("ratelimit_service_rate_limit_near_limit", &labels).increment(hits);
                }
            }
            _ => {}
        }
    }
}

/// Counts a reload: taken or refused.
pub fn reloaded(taken: bool) {
    if taken {
        counter!("ratelimit_service_config_load_success").increment(1);
    } else {
        counter!("ratelimit_service_config_load_error").increment(1);
    }
}
