//! Real Redis servers for the tests: standalone and a three-master Cluster,
//! started from the system's `redis-server` on free loopback ports, each in
//! a temporary directory of its own, and stopped when dropped. Nothing here
//! is simulated. A server that cannot be started is an error that says why:
//! a test that needs Redis fails with it, never skips.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer `PING`, and a cluster to agree.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a server could not be started.
#[derive(Debug)]
pub struct StartError(String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

fn fail<T>(why: impl Into<String>) -> Result<T, StartError> {
    Err(StartError(why.into()))
}

/// The `redis-server` and `redis-cli` binaries, from `PATH`. A test does
/// not install them (it may not be root): the README's test command does,
/// before any test runs, and a test run without them fails saying so.
fn binaries() -> Result<(PathBuf, PathBuf), StartError> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|candidate| candidate.is_file())
        })
    };
    if let (Some(server), Some(cli)) = (find("redis-server"), find("redis-cli")) {
        return Ok((server, cli));
    }
    fail(
        "redis-server or redis-cli is not on PATH: install Debian's redis-server \
         package (`apt-get update && apt-get install -y redis-server`), which \
         `.ci/test` does on a fresh machine",
    )
}

/// A loopback port nothing listens on now, whose Cluster bus port (the port
/// plus 10 000) is free too.
pub fn free_port() -> Result<u16, StartError> {
    for _ in 0..100 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|error| StartError(format!("binding a loopback port: {error}")))?;
        let port = listener
            .local_addr()
            .map_err(|error| StartError(format!("reading a bound port: {error}")))?
            .port();
        let Some(bus) = port.checked_add(10_000) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).is_ok() {
            return Ok(port);
        }
    }
    fail("found no free loopback port pair (port, port + 10000) in 100 tries")
}

/// Sends one command in RESP and reads one reply, as text: enough for the
/// harness's own checks (`PING`, `CLUSTER INFO`), with no client crate.
pub fn command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end().to_owned();
    match line.as_bytes().first() {
        Some(b'$') => {
            let len: i64 = line[1..].parse().map_err(std::io::Error::other)?;
            if len < 0 {
                return Ok(String::new());
            }
            let mut body = vec![0; len as usize + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len as usize);
            String::from_utf8(body).map_err(std::io::Error::other)
        }
        _ => Ok(line),
    }
}

/// One `redis-server` process on a loopback port, killed when dropped.
pub struct RedisServer {
    port: u16,
    child: Child,
    dir: PathBuf,
    extra: Vec<String>,
}

/// Starts `redis-server` on `port` in `dir`, logging to `dir/server.log`.
fn spawn(port: u16, dir: &Path, extra: &[String]) -> Result<Child, StartError> {
    let (server, _) = binaries()?;
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .map_err(|error| StartError(format!("creating the server log: {error}")))?;
    Command::new(server)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| StartError(format!("spawning redis-server: {error}")))
}

impl RedisServer {
    /// A standalone server, persisting nothing.
    pub fn start() -> Result<Self, StartError> {
        Self::start_with(&[])
    }

    /// A server with `extra` configuration (`--name value` pairs).
    pub fn start_with(extra: &[&str]) -> Result<Self, StartError> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|error| StartError(format!("creating {}: {error}", dir.display())))?;
        let extra: Vec<String> = extra.iter().map(|&arg| arg.to_owned()).collect();
        let child = spawn(port, &dir, &extra)?;
        let mut started = Self {
            port,
            child,
            dir,
            extra,
        };
        started.await_pong()?;
        Ok(started)
    }

    /// Kills the server (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port, empty (nothing persists).
    pub fn restart(&mut self) -> Result<(), StartError> {
        self.kill();
        self.child = spawn(self.port, &self.dir, &self.extra)?;
        self.await_pong()
    }

    fn await_pong(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if command(self.port, &["PING"]).is_ok_and(|reply| reply == "+PONG") {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return fail(format!(
                    "redis-server on port {} exited with {status}:\n{}",
                    self.port,
                    tail(&self.dir.join("server.log"))
                ));
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "redis-server on port {} did not answer PING within {START_TIMEOUT:?}:\n{}",
                    self.port,
                    tail(&self.dir.join("server.log"))
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The last lines of a log, for an error message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Three masters, no replicas, all 16 384 slots assigned, on loopback.
pub struct RedisCluster {
    masters: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Result<Self, StartError> {
        let (_, cli) = binaries()?;
        let masters = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect::<Result<Vec<_>, _>>()?;
        let nodes: Vec<String> = masters
            .iter()
            .map(|master| format!("127.0.0.1:{}", master.port()))
            .collect();
        let output = Command::new(cli)
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .map_err(|error| StartError(format!("running redis-cli --cluster create: {error}")))?;
        if !output.status.success() {
            return fail(format!(
                "redis-cli --cluster create failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let cluster = Self { masters };
        cluster.await_ok()?;
        Ok(cluster)
    }

    /// Waits until every master reports the cluster up, every slot served.
    fn await_ok(&self) -> Result<(), StartError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let infos: Vec<String> = self
                .masters
                .iter()
                .map(|master| command(master.port(), &["CLUSTER", "INFO"]).unwrap_or_default())
                .collect();
            let ok = infos.iter().all(|info| {
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "the cluster did not come up within {START_TIMEOUT:?}:\n{}",
                    infos.join("\n---\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The masters' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.masters.iter().map(RedisServer::port).collect()
    }
}
