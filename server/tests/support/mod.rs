//! What the server's tests share: the real binary on free loopback ports,
//! and requests as Envoy sends them.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

/// A gRPC client of the rate-limit service.
pub type Client = RateLimitServiceClient<Channel>;

/// A server process on a free port, killed when dropped.
pub struct Server {
    pub child: Child,
    pub address: String,
    pub http_address: String,
    pub config: PathBuf,
}

impl Server {
    pub fn start(config: &str) -> Server {
        Server::start_with(config, &[])
    }

    /// A server given `flags` besides its address and configuration.
    pub fn start_with(config: &str, flags: &[&str]) -> Server {
        let (mut command, file) = Server::command(config, flags);
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the tollgate-server binary starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let (address, http_address) = line
            .trim()
            .strip_prefix("tollgate-server listening on ")
            .and_then(|rest| rest.strip_suffix(" (HTTP)"))
            .and_then(|rest| rest.split_once(" (gRPC) and "))
            .unwrap_or_else(|| panic!("the server printed {line:?}"));
        Server {
            address: address.to_owned(),
            http_address: http_address.to_owned(),
            child,
            config: file,
        }
    }

    /// A server that refuses to start on `config` with `flags`: what it
    /// said.
    pub fn refused(config: &str, flags: &[&str]) -> String {
        let (mut command, file) = Server::command(config, flags);
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the tollgate-server binary runs");
        // A server that started would never exit: ten seconds at most.
        let mut status = None;
        for _ in 0..200 {
            status = child.try_wait().unwrap();
            if status.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(file);
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server started");
        };
        assert!(!status.success(), "the server exited successfully");
        let mut said = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut said).unwrap();
        said
    }

    /// The command that starts a server on `config` (written to the file
    /// returned) with `flags`.
    fn command(config: &str, flags: &[&str]) -> (Command, PathBuf) {
        let file = std::env::temp_dir().join(format!(
            "tollgate-rls-{}-{}.yaml",
            std::process::id(),
            unique()
        ));
        std::fs::write(&file, config).unwrap();
        // The files are looked at once a minute unless a test asks sooner.
        let watch: &[&str] = if flags.contains(&"--watch-ms") {
            &[]
        } else {
            &["--watch-ms", "60000"]
        };
        let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate-server"));
        command
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(watch)
            .arg("--config")
            .arg(&file)
            .args(flags);
        (command, file)
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.address))
            .await
            .expect("a gRPC connection")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}

pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|&(key, value)| Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

/// The server's `/metrics` page.
pub async fn metrics(server: &Server) -> String {
    reqwest::get(format!("http://{}/metrics", server.http_address))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Waits until the server's `/metrics` shows `name` at `value` (a reload
/// is asynchronous), for at most ten seconds.
pub async fn wait_for_metric(server: &Server, name: &str, value: u64) {
    let expected = format!("{name} {value}");
    for _ in 0..200 {
        if metrics(server).await.lines().any(|line| line == expected) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{expected} never showed");
}

/// Sends SIGHUP to the server.
pub fn hang_up(server: &Server) {
    let status = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
