//! The layer in front of a real tonic server (the gRPC health service),
//! called by a real tonic client: a refusal is `RESOURCE_EXHAUSTED` with a
//! `google.rpc.RetryInfo` the client library reads.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tokio::net::TcpListener;
use tollgate::{Quota, RateLimiter};
use tollgate_http::{IpKey, PeerIp, RateLimitLayer, Rule};
use tonic::Code;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

/// tonic records the peer as `TcpConnectInfo`.
fn tonic_peer(extensions: &http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<TcpConnectInfo>()?
        .remote_addr()
        .map(|address| address.ip())
}

#[tokio::test]
async fn a_refused_call_is_resource_exhausted_with_its_retry_delay() {
    let rule = Rule::new(
        "per-ip",
        RateLimiter::<IpKey>::keyed(Quota::per_minute(2).unwrap()),
        PeerIp::new().peer_from(tonic_peer),
    )
    .unwrap();
    let layer = RateLimitLayer::builder().rule(rule).build();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut served = 0;
    let mut refusal = None;
    for _ in 0..3 {
        match client.check(HealthCheckRequest::default()).await {
            Ok(response) => {
                served += 1;
                // Admitted calls carry the fields too, as metadata.
                let limit = response
                    .metadata()
                    .get("ratelimit")
                    .expect("a RateLimit field");
                assert!(
                    limit.to_str().unwrap().starts_with("\"per-ip\";r="),
                    "{limit:?}"
                );
            }
            Err(status) => refusal = Some(status),
        }
    }
    server.abort();
    assert_eq!(served, 2);
    let status = refusal.expect("the third call is refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().contains("per-ip"), "{status:?}");
    let retry = status.get_details_retry_info().expect("a RetryInfo detail");
    // An interval is 30 s, a few milliseconds of which have passed: the
    // wait rounded up to whole seconds, as Retry-After.
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(30)));
    assert_eq!(status.metadata().get("retry-after").unwrap(), "30");
}
