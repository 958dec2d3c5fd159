//! The three-instance break's parts (issue 9): `tollgate-instance`
//! processes and the load generator that spreads one user's requests over
//! them round-robin, as a load balancer would. The test and the lab share
//! them.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A `tollgate-instance` process, killed when dropped.
pub struct Instance {
    child: Child,
    port: u16,
}

impl Instance {
    /// 100 requests an hour: no unit refills while the load runs, so the
    /// count is exact however slow the machine. In-process, or on the Redis
    /// at `redis_url`.
    pub fn start(binary: &Path, redis_url: Option<&str>) -> Self {
        let mut child = Command::new(binary)
            .args(["100", "3600"])
            .args(redis_url)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("spawning {}: {error}", binary.display()));
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
pub fn admitted(instances: &[Instance]) -> usize {
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
