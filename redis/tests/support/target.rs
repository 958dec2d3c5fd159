//! A real Redis to run limiters on (a standalone server or a three-master
//! Cluster), with a tokio runtime for the async limiter and a blocking
//! bridge for the synchronous test suites.

use std::sync::atomic::{AtomicU32, Ordering};

use tollgate::Quota;
use tollgate::clock::ManualClock;
use tollgate_redis::{Connection, RedisLimiter, Scripted};

use super::redis::{RedisCluster, RedisServer};

/// Which deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Standalone,
    Cluster,
}

enum Servers {
    // Held for their `Drop`, which stops the processes.
    Standalone(#[allow(dead_code)] RedisServer),
    Cluster(#[allow(dead_code)] RedisCluster),
}

/// Running servers, a connection to them, and a runtime to drive it.
pub struct Target {
    pub runtime: tokio::runtime::Runtime,
    pub connection: Connection,
    kind: Kind,
    urls: Vec<String>,
    ports: Vec<u16>,
    next_name: AtomicU32,
    _servers: Servers,
}

impl Target {
    pub fn start(kind: Kind) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let (servers, ports) = match kind {
            Kind::Standalone => {
                let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
                let ports = vec![server.port()];
                (Servers::Standalone(server), ports)
            }
            Kind::Cluster => {
                let cluster = RedisCluster::start().unwrap_or_else(|error| panic!("{error}"));
                let ports = cluster.ports();
                (Servers::Cluster(cluster), ports)
            }
        };
        let urls: Vec<String> = ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect();
        let connection = runtime.block_on(connect(kind, &urls));
        Self {
            runtime,
            connection,
            kind,
            urls,
            ports,
            next_name: AtomicU32::new(0),
            _servers: servers,
        }
    }

    /// A second connection to the same servers, apart from the first.
    pub async fn reconnect(&self) -> Connection {
        connect(self.kind, &self.urls).await
    }

    /// The string value of a Redis key, read from whichever master holds
    /// it.
    pub fn get(&self, key: &[u8]) -> Option<String> {
        self.ports.iter().find_map(|port| {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            redis::cmd("GET")
                .arg(key)
                .query::<Option<String>>(&mut client.get_connection().unwrap())
                .ok()
                .flatten()
        })
    }

    /// The servers' ports (the masters', for a Cluster).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// A limiter with a name no other limiter of this target has, on a
    /// client `ManualClock`, with an hour's expiry grace.
    pub fn limiter<A: Scripted>(&self, quota: Quota, clock: ManualClock) -> RedisLimiter<A> {
        let name = format!("t{}", self.next_name.fetch_add(1, Ordering::Relaxed));
        RedisLimiter::builder(name, quota)
            .algorithm::<A>()
            .clock(clock)
            // The suites freeze the clock while real time passes: keep keys
            // an hour past their freshness (the expiry test sets none).
            .expiry_grace(std::time::Duration::from_secs(3_600))
            .build(self.connection.clone())
            .expect("a valid test limiter")
    }

    /// How many keys match `pattern` over every server.
    pub fn count_keys(&self, pattern: &[u8]) -> usize {
        let mut count = 0;
        for &port in &self.ports {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
            let mut connection = client.get_connection().unwrap();
            let mut cursor = 0_u64;
            loop {
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1_000)
                    .query(&mut connection)
                    .unwrap();
                count += keys.len();
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        count
    }
}

async fn connect(kind: Kind, urls: &[String]) -> Connection {
    match kind {
        Kind::Standalone => Connection::open(urls[0].as_str()).await,
        Kind::Cluster => Connection::cluster(urls.iter().map(String::as_str)).await,
    }
    .unwrap_or_else(|error| panic!("connecting to {urls:?}: {error}"))
}
