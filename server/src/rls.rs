//! Envoy's rate-limit service (`envoy.service.ratelimit.v3`) over gRPC, on
//! a [`Service`].

use std::sync::{Arc, PoisonError, RwLock};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::{Request, Response, Status};

use crate::config::Unit;
use crate::limits;
use crate::service::Service;

/// The limits a service decides by, swapped whole by a reload.
pub type Shared = Arc<RwLock<Arc<Service>>>;

/// The limits `shared` holds now (a reload swaps them; a request keeps the
/// ones it began with).
#[must_use]
pub fn current(shared: &Shared) -> Arc<Service> {
    shared
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// The gRPC service: `ShouldRateLimit` decided on the current [`Service`].
#[derive(Debug, Clone)]
pub struct RateLimiting {
    limits: Shared,
    bounds: Bounds,
}

impl RateLimiting {
    /// A service deciding on `limits` (which a reload replaces), refusing
    /// requests past `bounds`.
    #[must_use]
    pub fn new(limits: Shared, bounds: Bounds) -> Self {
        Self { limits, bounds }
    }
}

/// What a request may bring: each descriptor's entries become a key the
/// service may keep, so their size is bounded (with the keys a rule holds,
/// `Limits::new`'s `max_keys`, that bounds the memory clients can make the
/// service hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The descriptors a request may bring.
    pub descriptors: usize,
    /// The bytes of a descriptor's keys and values together.
    pub descriptor_bytes: usize,
}

impl Default for Bounds {
    /// 64 descriptors of at most 4 KiB each.
    fn default() -> Self {
        Bounds {
            descriptors: 64,
            descriptor_bytes: 4_096,
        }
    }
}

/// A descriptor of a request whose own `hits_addend` is `addend`.
struct Described<'a> {
    descriptor: &'a RateLimitDescriptor,
    /// The request's `hits_addend` (0 read as 1).
    addend: u64,
}

impl limits::Descriptor for Described<'_> {
    fn entries(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.descriptor
            .entries
            .iter()
            .map(|entry| (entry.key.as_str(), entry.value.as_str()))
    }

    fn cost(&self) -> u64 {
        // A descriptor's own `hits_addend` wins, 0 included (decided, not
        // charged); else the request's.
        self.descriptor
            .hits_addend
            .map_or(self.addend, |addend| addend.value)
    }

    fn limit(&self) -> Option<(u32, Unit)> {
        let limit = self.descriptor.limit.as_ref()?;
        Some((limit.requests_per_unit, unit_of(limit.unit)?))
    }
}

/// The unit of Envoy's enumeration value, if it names one.
fn unit_of(value: i32) -> Option<Unit> {
    Some(match ProtoUnit::try_from(value).ok()? {
        ProtoUnit::Unknown => return None,
        ProtoUnit::Second => Unit::Second,
        ProtoUnit::Minute => Unit::Minute,
        ProtoUnit::Hour => Unit::Hour,
        ProtoUnit::Day => Unit::Day,
        ProtoUnit::Week => Unit::Week,
        ProtoUnit::Month => Unit::Month,
        ProtoUnit::Year => Unit::Year,
    })
}

/// Envoy's enumeration value of `unit`.
fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

/// Checks what the service needs of a request before deciding it.
fn validate(request: &RateLimitRequest, bounds: Bounds) -> Result<(), Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("the domain is empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument("the request has no descriptor"));
    }
    if request.descriptors.len() > bounds.descriptors {
        return Err(Status::invalid_argument(format!(
            "{} descriptors, more than the {} a request may bring",
            request.descriptors.len(),
            bounds.descriptors
        )));
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(Status::invalid_argument(format!(
                "descriptor {index} has no entry"
            )));
        }
        let bytes = limits::key_len(
            descriptor
                .entries
                .iter()
                .map(|entry| (entry.key.as_str(), entry.value.as_str())),
        );
        if bytes > bounds.descriptor_bytes {
            return Err(Status::invalid_argument(format!(
                "descriptor {index} holds {bytes} bytes, more than the {} a descriptor may",
                bounds.descriptor_bytes
            )));
        }
        if let Some(limit) = &descriptor.limit {
            if unit_of(limit.unit).is_none() {
                return Err(Status::invalid_argument(format!(
                    "descriptor {index} brings a limit of no known unit ({})",
                    limit.unit
                )));
            }
            if limit.requests_per_unit == 0 {
                return Err(Status::invalid_argument(format!(
                    "descriptor {index} brings a limit of 0 requests"
                )));
            }
        }
    }
    Ok(())
}

/// Decides `request` on `limits`: the response Envoy reads.
///
/// # Errors
///
/// `INVALID_ARGUMENT` for a request the protocol does not allow (no
/// domain, no descriptor, a descriptor of no entry, a limit of no unit or
/// of no requests) or past `bounds`: nothing of the request is charged.
/// `UNAVAILABLE` when Redis cannot decide and the failure policy is to say
/// so (a proxy then applies its own: Envoy admits unless
/// `failure_mode_deny` is set).
pub async fn decide(
    limits: &Service,
    request: &RateLimitRequest,
    bounds: Bounds,
) -> Result<RateLimitResponse, Status> {
    validate(request, bounds)?;
    let addend = match request.hits_addend {
        0 => 1,
        addend => u64::from(addend),
    };
    let descriptors: Vec<Described<'_>> = request
        .descriptors
        .iter()
        .map(|descriptor| Described { descriptor, addend })
        .collect();
    let statuses = limits
        .decide(&limits::Request {
            domain: &request.domain,
            descriptors: &descriptors,
        })
        .await
        .map_err(|failed| Status::unavailable(failed.to_string()))?;
    crate::stats::count(&request.domain, &statuses);
    let over_limit = statuses.iter().any(|status| status.over_limit);
    let response_headers_to_add = fields(&statuses);
    let statuses = statuses
        .into_iter()
        .map(|status| DescriptorStatus {
            code: if status.over_limit {
                Code::OverLimit
            } else {
                Code::Ok
            }
            .into(),
            current_limit: status.limit.map(|(requests_per_unit, unit, _)| RateLimit {
                name: status
                    .rule
                    .as_ref()
                    .and_then(|rule| rule.name.clone())
                    .unwrap_or_default(),
                requests_per_unit,
                unit: proto_unit(unit).into(),
            }),
            limit_remaining: status.decision.map_or(0, |decision| decision.remaining()),
            duration_until_reset: status.decision.map(|decision| {
                let reset = decision.reset_after();
                ProtoDuration {
                    seconds: i64::try_from(reset.as_secs()).unwrap_or(i64::MAX),
                    nanos: i32::try_from(reset.subsec_nanos()).unwrap_or(0),
                }
            }),
            quota: None,
        })
        .collect();
    Ok(RateLimitResponse {
        overall_code: if over_limit {
            Code::OverLimit
        } else {
            Code::Ok
        }
        .into(),
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    })
}

/// The headers Envoy adds to the client's response: the `RateLimit-Policy`
/// and `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers-11, an
/// item per descriptor a limit decided (named by its rule's `name`, else
/// its path; a limit a descriptor brought, `descriptor<index>`), and on a
/// refusal `Retry-After`, the longest wait of the refusing limits. A rule
/// in shadow mode shows nothing: it does not limit the client.
fn fields(statuses: &[limits::Status]) -> Vec<HeaderValue> {
    let (mut policies, mut items, mut retry_after) = (Vec::new(), Vec::new(), None);
    for (index, status) in statuses.iter().enumerate() {
        let (Some((_, _, quota)), Some(decision)) = (status.limit, status.decision) else {
            continue;
        };
        let name = match &status.rule {
            Some(rule) if rule.shadow_mode => continue,
            Some(rule) => rule.name.clone().unwrap_or_else(|| rule.path.clone()),
            None => format!("descriptor{index}"),
        };
        policies.extend(tollgate_http::ratelimit_policy_item(&name, &quota));
        items.extend(tollgate_http::ratelimit_item(&name, &decision));
        if status.over_limit {
            let wait = tollgate_http::retry_after_seconds(&decision);
            retry_after = Some(retry_after.map_or(wait, |longest: u64| longest.max(wait)));
        }
    }
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    let mut headers = Vec::new();
    if !policies.is_empty() {
        headers.push(header("RateLimit-Policy", policies.join(", ")));
        headers.push(header("RateLimit", items.join(", ")));
    }
    if let Some(seconds) = retry_after {
        headers.push(header("Retry-After", seconds.to_string()));
    }
    headers
}

#[tonic::async_trait]
impl RateLimitService for RateLimiting {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let limits = current(&self.limits);
        decide(&limits, request.get_ref(), self.bounds)
            .await
            .map(Response::new)
    }
}
