//! TLS: a `redis-server` that speaks only TLS on its client port, with a
//! certificate made for the test, and a limiter reaching it through a
//! `rediss://` URL whose client trusts that certificate (and only that
//! one). The test build has redis-rs's rustls support (a dev-dependency);
//! users enable it with the crate's `tls-rustls` feature.

mod support {
    #[allow(dead_code)]
    pub mod redis;
}

use tollgate::Quota;
use tollgate_redis::{Connection, RedisLimiter};

use support::redis::{RedisServer, free_port};

#[test]
fn a_limiter_reaches_redis_over_tls_and_only_with_the_trusted_certificate() {
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("a self-signed certificate");
    let dir = std::env::temp_dir().join(format!("tollgate-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
    let tls_port = free_port().unwrap_or_else(|error| panic!("{error}"));
    let tls_port_arg = tls_port.to_string();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port_arg,
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--tls-ca-cert-file",
        cert.to_str().unwrap(),
        "--tls-auth-clients",
        "no",
    ])
    .unwrap_or_else(|error| panic!("redis-server with TLS (Debian's is built with it): {error}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    // Trusting the test's certificate: checks are decided as on plain TCP.
    let client = redis::Client::build_with_tls(
        url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(certified.cert.pem().into_bytes()),
        },
    )
    .unwrap();
    let connection = runtime
        .block_on(Connection::open(client.get_connection_info().clone()))
        .unwrap_or_else(|error| panic!("TLS connection to {url}: {error}"));
    let limiter = RedisLimiter::builder("tls", Quota::per_hour(3).unwrap())
        .build(connection)
        .unwrap();
    let admitted = (0..5)
        .filter(|_| runtime.block_on(limiter.check("k")).unwrap().is_allowed())
        .count();
    assert_eq!(admitted, 3);
    // The system's roots do not include the test's certificate: refused.
    let error = runtime
        .block_on(Connection::open(url.as_str()))
        .expect_err("an untrusted certificate");
    assert!(
        error.to_string().to_lowercase().contains("certificate"),
        "{error}"
    );
    // Plain TCP to the TLS port: no connection either.
    let plain = format!("redis://127.0.0.1:{tls_port}/");
    assert!(runtime.block_on(Connection::open(plain.as_str())).is_err());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
