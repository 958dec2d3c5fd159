//! The service's HTTP side: `/metrics` for Prometheus, `/json` for callers
//! without gRPC (a `RateLimitRequest` in protobuf's JSON mapping, answered
//! by a `RateLimitResponse` in it, 429 when over the limit, as
//! envoyproxy/ratelimit's `/json` answers), and `/healthcheck`.

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{Map, Value, json};

use crate::rls::{Bounds, Shared, current, decide};

/// The largest `/json` body read: far above what [`Bounds`] lets a request
/// hold, far below what would cost memory.
const BODY_LIMIT: usize = 1 << 20;

/// What the HTTP routes share.
#[derive(Clone, Debug)]
struct Served {
    limits: Shared,
    bounds: Bounds,
    metrics: PrometheusHandle,
}

/// The routes: `/metrics`, `/json` and `/healthcheck`.
pub fn router(limits: Shared, bounds: Bounds, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/metrics", get(render))
        .route("/json", post(check))
        .route("/healthcheck", get(|| async { "OK" }))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(Served {
            limits,
            bounds,
            metrics,
        })
}

async fn render(State(served): State<Served>) -> Response {
    current(&served.limits).publish_metrics();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        served.metrics.render(),
    )
        .into_response()
}

async fn check(State(served): State<Served>, body: String) -> Response {
    let request = match serde_json::from_str::<Value>(&body)
        .map_err(|error| format!("not JSON: {error}"))
        .and_then(|value| request_of(&value))
    {
        Ok(request) => request,
        Err(reason) => return (StatusCode::BAD_REQUEST, reason).into_response(),
    };
    let limits = current(&served.limits);
    match decide(&limits, &request, served.bounds).await {
        Ok(response) => {
            let status = if response.overall_code() == Code::OverLimit {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(json_of(&response))).into_response()
        }
        Err(failed) if failed.code() == tonic::Code::Unavailable => {
            (StatusCode::SERVICE_UNAVAILABLE, failed.message().to_owned()).into_response()
        }
        // Otherwise `decide` refuses only requests the protocol does not
        // allow.
        Err(refused) => (StatusCode::BAD_REQUEST, refused.message().to_owned()).into_response(),
    }
}

/// A field of `object` by its JSON name or its proto name (protobuf's
/// JSON mapping accepts both).
fn field<'v>(object: &'v Map<String, Value>, json: &str, proto: &str) -> Option<&'v Value> {
    object.get(json).or_else(|| object.get(proto))
}

/// An unsigned number, given as a JSON number or a decimal string (the
/// mapping writes 64-bit integers as strings).
fn unsigned(value: &Value, name: &str) -> Result<u64, String> {
    match value {
        Value::Number(number) => number.as_u64(),
        Value::String(text) => text.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("`{name}` is not an unsigned integer"))
}

fn string<'v>(value: &'v Value, name: &str) -> Result<&'v str, String> {
    value
        .as_str()
        .ok_or_else(|| format!("`{name}` is not a string"))
}

/// Reads a `RateLimitRequest` in protobuf's JSON mapping.
fn request_of(value: &Value) -> Result<RateLimitRequest, String> {
    let object = value.as_object().ok_or("the request is not an object")?;
    let domain = field(object, "domain", "domain")
        .map(|domain| string(domain, "domain"))
        .transpose()?
        .unwrap_or_default()
        .to_owned();
    let hits_addend = field(object, "hitsAddend", "hits_addend")
        .map(|addend| unsigned(addend, "hitsAddend"))
        .transpose()?
        .unwrap_or(0);
    let hits_addend =
        u32::try_from(hits_addend).map_err(|_| "`hitsAddend` is above 2^32 - 1".to_owned())?;
    let descriptors = match field(object, "descriptors", "descriptors") {
        None => Vec::new(),
        Some(list) => list
            .as_array()
            .ok_or("`descriptors` is not a list")?
            .iter()
            .map(descriptor_of)
            .collect::<Result<_, _>>()?,
    };
    Ok(RateLimitRequest {
        domain,
        descriptors,
        hits_addend,
    })
}

fn descriptor_of(value: &Value) -> Result<RateLimitDescriptor, String> {
    let object = value.as_object().ok_or("a descriptor is not an object")?;
    let entries = match field(object, "entries", "entries") {
        None => Vec::new(),
        Some(list) => list
            .as_array()
            .ok_or("`entries` is not a list")?
            .iter()
            .map(|entry| {
                let entry = entry.as_object().ok_or("an entry is not an object")?;
                let text = |name| {
                    field(entry, name, name)
                        .map(|value| string(value, name))
                        .transpose()
                        .map(Option::unwrap_or_default)
                };
                Ok(Entry {
                    key: text("key")?.to_owned(),
                    value: text("value")?.to_owned(),
                })
            })
            .collect::<Result<_, String>>()?,
    };
    let limit = field(object, "limit", "limit")
        .map(|limit| {
            let limit = limit.as_object().ok_or("`limit` is not an object")?;
            let requests = field(limit, "requestsPerUnit", "requests_per_unit")
                .map(|count| unsigned(count, "requestsPerUnit"))
                .transpose()?
                .unwrap_or(0);
            let unit = match field(limit, "unit", "unit") {
                Some(Value::String(name)) => ProtoUnit::from_str_name(name)
                    .ok_or_else(|| format!("no unit is named {name:?}"))?
                    .into(),
                Some(number) => i32::try_from(unsigned(number, "unit")?)
                    .map_err(|_| "`unit` is out of range".to_owned())?,
                None => 0,
            };
            Ok::<_, String>(RateLimitOverride {
                requests_per_unit: u32::try_from(requests)
                    .map_err(|_| "`requestsPerUnit` is above 2^32 - 1".to_owned())?,
                unit,
            })
        })
        .transpose()?;
    let hits_addend = field(object, "hitsAddend", "hits_addend")
        .map(|addend| unsigned(addend, "hitsAddend").map(|value| UInt64Value { value }))
        .transpose()?;
    Ok(RateLimitDescriptor {
        entries,
        limit,
        hits_addend,
    })
}

/// A `RateLimitResponse` in protobuf's JSON mapping.
fn json_of(response: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|status| {
            let mut object = Map::new();
            object.insert("code".into(), json!(status.code().as_str_name()));
            if let Some(limit) = &status.current_limit {
                object.insert(
                    "currentLimit".into(),
                    json!({
                        "name": limit.name,
                        "requestsPerUnit": limit.requests_per_unit,
                        "unit": limit.unit().as_str_name(),
                    }),
                );
            }
            object.insert("limitRemaining".into(), json!(status.limit_remaining));
            if let Some(reset) = &status.duration_until_reset {
                object.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}.{:09}s", reset.seconds, reset.nanos)),
                );
            }
            Value::Object(object)
        })
        .collect();
    let headers: Vec<Value> = response
        .response_headers_to_add
        .iter()
        .map(|header| json!({"key": header.key, "value": header.value}))
        .collect();
    json!({
        "overallCode": response.overall_code().as_str_name(),
        "statuses": statuses,
        "responseHeadersToAdd": headers,
    })
}
