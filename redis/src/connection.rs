//! One handle over a standalone server or a Cluster, with timeouts and a
//! circuit breaker.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError, RedisResult};

use crate::failure::{Breaker, Unavailable};

/// How long to wait, and when to stop asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// The longest a (re)connection may take: 1 s by default.
    pub connect_timeout: Duration,
    /// The longest a check waits for its reply: 250 ms by default. A reply
    /// later than this is a failure (and the script may have run).
    pub call_timeout: Duration,
    /// Consecutive failures that open the circuit breaker: 3 by default.
    pub failures_to_open: u32,
    /// How long an open breaker keeps checks away from Redis before it lets
    /// one probe through: 500 ms by default.
    pub cooldown: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_millis(250),
            failures_to_open: 3,
            cooldown: Duration::from_millis(500),
        }
    }
}

impl Options {
    /// Returns these options with another per-call timeout.
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Returns these options with another breaker threshold and cooldown.
    #[must_use]
    pub fn breaker(mut self, failures_to_open: u32, cooldown: Duration) -> Self {
        self.failures_to_open = failures_to_open;
        self.cooldown = cooldown;
        self
    }
}

/// A cheap-to-clone handle to Redis: one multiplexed connection to a
/// standalone server that reconnects by itself (concurrent checks share it,
/// pipelined), or a Cluster connection that follows `MOVED` and `ASK`
/// redirections. Its limiters share its timeouts and circuit breaker.
///
/// A command is never sent twice: a check whose reply is lost is reported
/// as failed, not retried (at most once, as the design notes argue).
///
/// Opening a connection spawns one small task on the current tokio runtime,
/// which wakes every half call timeout (125 ms by default) while a clone of
/// the connection lives: it keeps a timer pending, so that arming each
/// call's timeout does not have to wake the thread that waits on tokio's
/// timers.
///
/// TLS comes with the `rediss://` scheme and this crate's `tls-rustls`
/// feature (rustls then needs a crypto provider: its `ring` or `aws-lc-rs`
/// feature). A server whose certificate no system root signs is reached by
/// building the address with the certificate it trusts, as the crate's TLS
/// test does:
///
/// ```no_run
/// # use tollgate_redis::Connection;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let ca_pem = std::fs::read("/etc/redis/ca.pem")?;
/// let client = redis::Client::build_with_tls(
///     "rediss://10.0.0.5:6380/",
///     redis::TlsCertificates { client_tls: None, root_cert: Some(ca_pem) },
/// )?;
/// let connection = Connection::open(client.get_connection_info().clone()).await?;
/// # Ok(())
/// # }
/// ```
///
/// A password, or an ACL user and password,
/// in the URL (`redis://user:password@host:port/`) authenticates every
/// connection, reconnections included.
#[derive(Clone)]
pub struct Connection {
    inner: Inner,
    options: Options,
    breaker: Arc<Breaker>,
}

#[derive(Clone)]
enum Inner {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Returns the longest a call waits for its reply.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.options.call_timeout
    }

    /// Returns whether this is a Cluster connection: keys on several
    /// masters, each with its own clock.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }

    /// Connects to a standalone server, for example `redis://127.0.0.1:6379/`,
    /// with the default [`Options`].
    ///
    /// # Errors
    ///
    /// A bad URL, or a server that cannot be reached in time or refuses the
    /// credentials.
    pub async fn open(url: impl IntoConnectionInfo) -> RedisResult<Self> {
        Self::open_with(url, Options::default()).await
    }

    /// Connects to a standalone server with `options`.
    ///
    /// # Errors
    ///
    /// As [`open`](Connection::open).
    pub async fn open_with(url: impl IntoConnectionInfo, options: Options) -> RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(options.connect_timeout)
            // Reconnection is retried in the background by the next calls;
            // a call never waits for more than one attempt. No response
            // timeout here: `within` times the whole call (one timer).
            .set_number_of_retries(1);
        let manager = ConnectionManager::new_with_config(client, config).await?;
        Ok(Self::new(Inner::Standalone(manager), options))
    }

    /// Connects to a Redis Cluster through any of its nodes, with the
    /// default [`Options`].
    ///
    /// # Errors
    ///
    /// A bad URL, or no node that can be reached.
    pub async fn cluster<I: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = I>,
    ) -> RedisResult<Self> {
        Self::cluster_with(nodes, Options::default()).await
    }

    /// Connects to a Redis Cluster with `options`.
    ///
    /// # Errors
    ///
    /// As [`cluster`](Connection::cluster).
    pub async fn cluster_with<I: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = I>,
        options: Options,
    ) -> RedisResult<Self> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.call_timeout)
            // redis-rs retries a command whose connection broke (up to 16
            // times by default): a script whose reply was lost would run
            // twice. Never resend; a redirection during resharding then
            // fails once, as unavailable.
            .retries(0)
            .build()?;
        Ok(Self::new(
            Inner::Cluster(client.get_async_connection().await?),
            options,
        ))
    }

    fn new(inner: Inner, options: Options) -> Self {
        let breaker = Arc::new(Breaker::new(
            options.failures_to_open,
            options.cooldown,
            options.call_timeout,
        ));
        keep_the_timer_armed(Arc::downgrade(&breaker), options.call_timeout);
        Self {
            inner,
            options,
            breaker,
        }
    }

    pub(crate) fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Returns whether `other` is a clone of this handle.
    pub(crate) fn same_as(&self, other: &Connection) -> bool {
        Arc::ptr_eq(&self.breaker, &other.breaker)
    }

    /// Sends `command` once.
    pub(crate) async fn send<T: FromRedisValue>(&self, command: &Cmd) -> RedisResult<T> {
        match &self.inner {
            Inner::Standalone(connection) => command.query_async(&mut connection.clone()).await,
            Inner::Cluster(connection) => command.query_async(&mut connection.clone()).await,
        }
    }

    /// Waits for `reply` (one call, which may send more than one command)
    /// within the call timeout. An error that says Redis is out of reach is
    /// [`CallError::Unavailable`]; any other error reply is returned as it is.
    pub(crate) async fn within<T>(
        &self,
        reply: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.options.call_timeout, reply).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) if out_of_reach(&error, matches!(self.inner, Inner::Cluster(_))) => {
                Err(CallError::Unavailable(Unavailable::Redis(error)))
            }
            Ok(Err(error)) => Err(CallError::Failed(error)),
            Err(_) => Err(CallError::Unavailable(Unavailable::Timeout(
                self.options.call_timeout,
            ))),
        }
    }
}

/// Keeps a timer due within half a call timeout pending in the runtime, for
/// as long as a clone of the connection lives (`alive`, its breaker).
///
/// Every call arms its own timeout. tokio wakes the thread parked on its
/// time driver whenever a timer is registered that is due before the
/// driver's next wake, or while none is pending: with calls sent from
/// another thread (a runtime's other worker, a `block_on`), each batch of
/// calls would cost that thread a wake-up (a syscall, and a redis-rs
/// pipeline flushed early, splitting a batch of pipelined calls into more
/// writes). A pending tick sooner than any call's deadline means no
/// registration needs a wake-up; it costs one timer firing every half a
/// call timeout (125 ms by default).
fn keep_the_timer_armed(alive: std::sync::Weak<Breaker>, call_timeout: Duration) {
    let period = (call_timeout / 2).max(Duration::from_millis(1));
    tokio::spawn(async move {
        while alive.strong_count() > 0 {
            tokio::time::sleep(period).await;
        }
    });
}

/// Why a call returned no value.
pub(crate) enum CallError {
    /// Redis could not be asked or did not answer.
    Unavailable(Unavailable),
    /// Redis answered with an error.
    Failed(RedisError),
}

/// Returns whether an error means Redis could not decide now, though the
/// same call may succeed later (the failure policy applies), as opposed to
/// an error that every retry would meet (a configuration error, returned
/// as it is).
///
/// Out of reach: no connection or no reply; a server loading its data, busy
/// with a script, read-only (a replica after a failover), without its
/// replicas, out of memory under `noeviction` (`OOM`) or refusing writes
/// after a failed save (`MISCONF`), or a Cluster that is down or resharding (`MOVED`, `ASK`,
/// `TRYAGAIN` on a Cluster connection, which never resends a command); and
/// refused credentials (`NOAUTH`, `WRONGPASS`), which a password rotated
/// while the service runs produces, and which must then fall under the
/// policy like any outage. Not out of reach: `MOVED` or `ASK` on a
/// standalone connection (the URL names a Cluster node), a command or key
/// the ACL does not permit (`NOPERM`), and the script's own errors.
fn out_of_reach(error: &RedisError, cluster: bool) -> bool {
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
        || (cluster && error.is_cluster_error())
        || matches!(
            error.kind(),
            ErrorKind::AuthenticationFailed
                | ErrorKind::BusyLoadingError
                | ErrorKind::ClusterDown
                | ErrorKind::MasterDown
                | ErrorKind::ReadOnly
                | ErrorKind::ClusterConnectionNotFound
        )
        || matches!(
            error.code(),
            Some("NOAUTH" | "WRONGPASS" | "LOADING" | "BUSY" | "NOREPLICAS" | "OOM" | "MISCONF")
        )
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field(
                "kind",
                &match self.inner {
                    Inner::Standalone(_) => "standalone",
                    Inner::Cluster(_) => "cluster",
                },
            )
            .field("options", &self.options)
            .field("breaker", &self.breaker)
            .finish()
    }
}
