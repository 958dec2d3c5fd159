//! The three-instance break's parts: `tollgate-instance` processes and the
//! load generator that spreads one user's requests over them round-robin,
//! as a load balancer would. The test and the lab share them.

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
        Self::start_with(binary, redis_url.map(|url| (url, "exact")))
    }

    /// As [`start`](Instance::start), on the Redis at the URL with the
    /// mode named (`exact`, `deny-cached`, `leased`).
    pub fn start_with(binary: &Path, redis: Option<(&str, &str)>) -> Self {
        let mut child = Command::new(binary)
            .args(["100", "3600"])
            .args(redis.iter().flat_map(|&(url, mode)| [url, mode]))
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

/// Sends `requests` requests for one user, one at a time, to each instance
/// in turn (0, 1, 2, 0, …): the same interleaving on every run. Returns how
/// many were admitted, and the round trips each instance's checks took.
pub fn admitted_in_turn(instances: &[Instance], requests: usize) -> (usize, Vec<u64>) {
    let mut connections: Vec<_> = instances
        .iter()
        .map(|instance| {
            let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, instance.port))
                .expect("connecting to an instance");
            let writer = stream.try_clone().expect("cloning the stream");
            (writer, BufReader::new(stream).lines())
        })
        .collect();
    let mut ask = |index: usize, line: &[u8]| {
        let (writer, replies) = &mut connections[index];
        writer.write_all(line).expect("sending");
        replies.next().expect("a reply").expect("reading")
    };
    let admitted = (0..requests)
        .filter(|request| ask(request % instances.len(), b"user-1\n") == "allow")
        .count();
    let calls = (0..instances.len())
        .map(|index| ask(index, b"?calls\n").parse().expect("a count"))
        .collect();
    (admitted, calls)
}
