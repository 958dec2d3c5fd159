//! One handle over a standalone server or a Cluster.

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, RedisResult};

/// A cheap-to-clone handle to Redis: one multiplexed connection to a
/// standalone server (concurrent checks share it, pipelined), or a Cluster
/// connection that follows `MOVED` and `ASK` redirections.
///
/// TLS comes with the `rediss://` scheme when the `redis` crate is built
/// with one of its TLS features; a password or an ACL user in the URL
/// (`redis://user:password@host:port`) authenticates the connection.
#[derive(Clone)]
pub struct Connection(Inner);

#[derive(Clone)]
enum Inner {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Connects to a standalone server, for example `redis://127.0.0.1:6379/`.
    ///
    /// # Errors
    ///
    /// A bad URL, or a server that cannot be reached or refuses the
    /// credentials.
    pub async fn open(url: impl IntoConnectionInfo) -> RedisResult<Self> {
        let client = redis::Client::open(url)?;
        Ok(Self::from(client.get_multiplexed_async_connection().await?))
    }

    /// Connects to a Redis Cluster through any of its nodes.
    ///
    /// # Errors
    ///
    /// A bad URL, or no node that can be reached.
    pub async fn cluster<I: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = I>,
    ) -> RedisResult<Self> {
        let client = redis::cluster::ClusterClient::new(nodes)?;
        Ok(Self::from(client.get_async_connection().await?))
    }

    pub(crate) async fn query<T: FromRedisValue>(&self, command: &Cmd) -> RedisResult<T> {
        match &self.0 {
            Inner::Standalone(connection) => command.query_async(&mut connection.clone()).await,
            Inner::Cluster(connection) => command.query_async(&mut connection.clone()).await,
        }
    }
}

impl From<MultiplexedConnection> for Connection {
    fn from(connection: MultiplexedConnection) -> Self {
        Self(Inner::Standalone(connection))
    }
}

impl From<ClusterConnection> for Connection {
    fn from(connection: ClusterConnection) -> Self {
        Self(Inner::Cluster(connection))
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Inner::Standalone(_) => "Connection::Standalone",
            Inner::Cluster(_) => "Connection::Cluster",
        })
    }
}
