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
    env: Vec<(String, Option<String>)>,
}

/// Starts `redis-server` on `port` in `dir`, logging to `dir/server.log`,
/// with `env` set (a `None` value removes the variable).
fn spawn(
    port: u16,
    dir: &Path,
    extra: &[String],
    env: &[(String, Option<String>)],
) -> Result<Child, StartError> {
    let (server, _) = binaries()?;
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .map_err(|error| StartError(format!("creating the server log: {error}")))?;
    let mut command = Command::new(server);
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command
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
        Self::start_with_env(extra, &[])
    }

    /// A server with `extra` configuration and `env` in its environment (a
    /// `None` value removes the variable).
    pub fn start_with_env(
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Result<Self, StartError> {
        let port = free_port()?;
        let dir =
            std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|error| StartError(format!("creating {}: {error}", dir.display())))?;
        let extra: Vec<String> = extra.iter().map(|&arg| arg.to_owned()).collect();
        let env: Vec<(String, Option<String>)> = env
            .iter()
            .map(|&(name, value)| (name.to_owned(), value.map(str::to_owned)))
            .collect();
        let child = spawn(port, &dir, &extra, &env)?;
        let mut started = Self {
            port,
            child,
            dir,
            extra,
            env,
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
        self.child = spawn(self.port, &self.dir, &self.extra, &self.env)?;
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

/// Where libfaketime's preload library may be: Debian's `faketime` package
/// puts it in `/usr/lib/<multiarch triple>/faketime/` (searched first),
/// builds from source in these.
const LIBFAKETIME: &[&str] = &[
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The libfaketime preload library. A test does not install it: the
/// README's test command does, and a test run without it fails saying so.
fn libfaketime() -> Result<PathBuf, StartError> {
    let multiarch = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"));
    let mut candidates = multiarch.chain(LIBFAKETIME.iter().map(PathBuf::from));
    match candidates.find(|path| path.is_file()) {
        Some(path) => Ok(path),
        None => fail(format!(
            "libfaketime is not installed (looked for /usr/lib/*/faketime/libfaketime.so.1 \
             and {LIBFAKETIME:?}): the clock-step tests need it to step redis-server's own \
             clock; install Debian's faketime package (`apt-get update && apt-get install -y \
             faketime`), which `.ci/test` does on a fresh machine"
        )),
    }
}

/// A standalone server whose own wall clock (its `TIME`, the clock its
/// scripts decide on, and its keys' expiry) steps while it runs, as after
/// an NTP step or a failover to a master whose clock is behind.
///
/// The mechanism is libfaketime's, on the real `redis-server`:
///
/// * `LD_PRELOAD="<libfaketime.so.1> libc.so.6"`. libfaketime first, so
///   that its clock functions replace glibc's; glibc next, so that
///   `malloc` and `calloc` resolve to glibc's ahead of the jemalloc that
///   Debian's `redis-server` links. Under jemalloc the server hangs at
///   start-up: libfaketime initialises on the first clock read, jemalloc's
///   own start-up makes one, libfaketime's initialisation calls `dlsym`,
///   which allocates, and jemalloc, not ready, reads the clock again
///   ("Unexpected recursive calls to clock_gettime() without proper
///   initialization", libfaketime's issue 130). Which allocator the test
///   server uses changes nothing the tests look at.
/// * `FAKETIME_TIMESTAMP_FILE`, a file holding a relative offset in
///   seconds (`-0.200000`), replaced by a rename (never seen half
///   written), with `FAKETIME_NO_CACHE=1`: every clock read of the server
///   reads it again (libfaketime would otherwise keep it 10 s). `FAKETIME`
///   itself is removed from the server's environment: it would take
///   precedence over the file.
/// * `FAKETIME_DONT_FAKE_MONOTONIC=1`: only the wall clock steps, as an NTP
///   step moves `CLOCK_REALTIME` alone; the server's monotonic clock (its
///   event loop's timers) runs on undisturbed.
///
/// Every change of the offset is verified on the server: its `TIME` is
/// measured against this process's wall clock (which libfaketime does not
/// touch) before and after, and a step that did not take effect is an
/// error, as is a server that did not load the library.
pub struct FakeClockRedis {
    server: RedisServer,
    /// Holds the offset file (made before the server, which reads it from
    /// its start).
    dir: PathBuf,
    /// The offset the file holds, µs.
    offset_us: i64,
}

/// One measurement of the server's `TIME` against this process's wall
/// clock.
#[derive(Debug, Clone, Copy)]
pub struct ClockReading {
    /// The server's `TIME`, µs since the Unix epoch.
    pub time_us: u64,
    /// `TIME` less this process's wall clock at the call's midpoint, µs.
    pub offset_us: i64,
    /// How far `offset_us` may be off: half the call's local duration, µs.
    pub uncertainty_us: i64,
}

/// A step of the server's clock: its readings just before and after.
#[derive(Debug, Clone, Copy)]
pub struct ClockStep {
    pub before: ClockReading,
    pub after: ClockReading,
}

/// How much further than its uncertainty a measured offset may be from the
/// file's: libfaketime applies the offset to the microsecond, so this only
/// absorbs the clock reads on either side of the server's.
const OFFSET_SLACK_US: i64 = 2_000;

impl FakeClockRedis {
    /// A standalone server on a clock at the real time (offset zero),
    /// persisting nothing.
    pub fn start() -> Result<Self, StartError> {
        let library = libfaketime()?;
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-faketime-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|error| StartError(format!("creating {}: {error}", dir.display())))?;
        write_offset(&dir, 0)?;
        let file = dir.join("offset");
        let file = file.to_str().ok_or_else(|| {
            StartError(format!(
                "the offset file's path is not UTF-8: {}",
                file.display()
            ))
        })?;
        let preload = format!("{} libc.so.6", library.display());
        let server = RedisServer::start_with_env(
            &[],
            &[
                ("LD_PRELOAD", Some(preload.as_str())),
                ("FAKETIME", None),
                ("FAKETIME_TIMESTAMP_FILE", Some(file)),
                ("FAKETIME_NO_CACHE", Some("1")),
                ("FAKETIME_DONT_FAKE_MONOTONIC", Some("1")),
            ],
        );
        let server = match server {
            Ok(server) => server,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(error);
            }
        };
        let started = Self {
            server,
            dir,
            offset_us: 0,
        };
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", started.server.pid()))
            .map_err(|error| StartError(format!("reading the server's memory map: {error}")))?;
        if !maps.contains("libfaketime") {
            return fail(format!(
                "redis-server did not load {} (LD_PRELOAD={preload}): its clock cannot be \
                 stepped",
                library.display()
            ));
        }
        started.verify()?;
        Ok(started)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Measures the server's `TIME` against this process's wall clock.
    pub fn reading(&self) -> Result<ClockReading, StartError> {
        let before = wall_clock_us();
        let time_us = time_us(self.port())
            .map_err(|error| StartError(format!("reading the server's TIME: {error}")))?;
        let after = wall_clock_us();
        let midpoint = before + (after - before) / 2;
        Ok(ClockReading {
            time_us,
            offset_us: i64::try_from(time_us).unwrap_or(i64::MAX) - midpoint,
            uncertainty_us: (after - before) / 2 + 1,
        })
    }

    /// Steps the server's wall clock back by `by`, and checks on its `TIME`
    /// that it did.
    pub fn step_back(&mut self, by: Duration) -> Result<ClockStep, StartError> {
        let by_us = i64::try_from(by.as_micros()).unwrap_or(i64::MAX);
        self.step(-by_us)
    }

    fn step(&mut self, delta_us: i64) -> Result<ClockStep, StartError> {
        let before = self.verify()?;
        write_offset(&self.dir, self.offset_us + delta_us)?;
        self.offset_us += delta_us;
        let after = self.verify()?;
        Ok(ClockStep { before, after })
    }

    /// A reading whose offset is the file's, or an error saying how far off
    /// it is.
    fn verify(&self) -> Result<ClockReading, StartError> {
        let reading = self.reading()?;
        let error_us = (reading.offset_us - self.offset_us).abs();
        if error_us > reading.uncertainty_us + OFFSET_SLACK_US {
            return fail(format!(
                "redis-server's clock is {} µs from this process's, not the {} µs libfaketime \
                 was told (±{} µs): the offset file is not being read",
                reading.offset_us, self.offset_us, reading.uncertainty_us
            ));
        }
        Ok(reading)
    }
}

impl Drop for FakeClockRedis {
    fn drop(&mut self) {
        self.server.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Replaces the offset file in `dir` with `offset_us` in libfaketime's
/// relative format (seconds, a sign, a decimal point: the server's numeric
/// locale is C), by a rename.
fn write_offset(dir: &Path, offset_us: i64) -> Result<(), StartError> {
    let sign = if offset_us < 0 { '-' } else { '+' };
    let magnitude = offset_us.unsigned_abs();
    let text = format!(
        "{sign}{}.{:06}\n",
        magnitude / 1_000_000,
        magnitude % 1_000_000
    );
    let staged = dir.join("offset.new");
    std::fs::write(&staged, text)
        .and_then(|()| std::fs::rename(&staged, dir.join("offset")))
        .map_err(|error| StartError(format!("writing libfaketime's offset file: {error}")))
}

/// This process's wall clock, µs since the Unix epoch.
fn wall_clock_us() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

/// The server's `TIME` (an array of two bulk strings: seconds and
/// microseconds), in µs.
pub fn time_us(port: u16) -> std::io::Result<u64> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"*1\r\n$4\r\nTIME\r\n")?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if line.trim_end() != "*2" {
        return Err(std::io::Error::other(format!("TIME answered {line:?}")));
    }
    let mut parts = [0_u64; 2];
    for part in &mut parts {
        // A bulk string's length line, then its text.
        line.clear();
        reader.read_line(&mut line)?;
        line.clear();
        reader.read_line(&mut line)?;
        *part = line.trim_end().parse().map_err(std::io::Error::other)?;
    }
    Ok(parts[0] * 1_000_000 + parts[1])
}
