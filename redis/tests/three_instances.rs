//! The three-instance break (issue 9): three OS processes, each with its own
//! in-process limiter of 100 per window, driven by one load generator that
//! spreads 1 000 requests for one key across them, as a round-robin load
//! balancer would: 300 are admitted, three times the limit. The same three
//! processes on one real Redis admit exactly 100.

mod support {
    #[allow(dead_code)]
    pub mod redis;
}

use support::redis::RedisServer;

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::{Child, Command, Stdio};

/// A `tollgate-instance` process, killed when dropped.
struct Instance {
    child: Child,
    port: u16,
}

impl Instance {
    /// 100 requests an hour: no unit refills while the test runs, so the
    /// count is exact however slow the machine. In-process, or on the Redis
    /// at `redis_url`.
    fn start(redis_url: Option<&str>) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-instance"))
            .args(["100", "3600"])
            .args(redis_url)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning tollgate-instance");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("piped"))
            .read_line(&mut line)
            .expect("reading the instance's port");
        let port = line.trim().parse().expect("the instance prints its port");
        Self { child, port }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends 1 000 requests for one user round-robin over `instances`, one
/// connection per instance, each on its own thread (so the instances are
/// asked concurrently); returns how many were admitted.
fn admitted(instances: &[Instance]) -> usize {
    let count = instances.len();
    std::thread::scope(|scope| {
        let workers: Vec<_> = instances
            .iter()
            .enumerate()
            .map(|(index, instance)| {
                let port = instance.port;
                scope.spawn(move || {
                    let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                        .expect("connecting to an instance");
                    let mut writer = stream.try_clone().expect("cloning the stream");
                    let mut replies = BufReader::new(stream).lines();
                    (index..1_000)
                        .step_by(count)
                        .filter(|_| {
                            writer.write_all(b"user-1\n").expect("sending");
                            replies.next().expect("a reply").expect("reading") == "allow"
                        })
                        .count()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().unwrap())
            .sum()
    })
}

#[test]
fn three_in_process_limiters_admit_three_times_the_limit() {
    let instances: Vec<Instance> = (0..3).map(|_| Instance::start(None)).collect();
    assert_eq!(
        admitted(&instances),
        300,
        "three instances of a limit of 100"
    );
}

#[test]
fn three_instances_on_one_redis_admit_exactly_the_limit() {
    let server = RedisServer::start().unwrap_or_else(|error| panic!("{error}"));
    let url = format!("redis://127.0.0.1:{}/", server.port());
    let instances: Vec<Instance> = (0..3).map(|_| Instance::start(Some(&url))).collect();
    assert_eq!(
        admitted(&instances),
        100,
        "three instances sharing a limit of 100"
    );
}
