//! One instance of a service guarded by a rate limiter: the unit of the
//! three-instance break (notes/10). It listens on a free loopback port,
//! prints the port on its first line of output, and answers each line it
//! receives (a key) with `allow` or `deny`.
//!
//! `tollgate-instance LIMIT WINDOW_SECS [REDIS_URL]`: `LIMIT` requests per
//! `WINDOW_SECS` seconds (100 and 60 by default), from its own in-process
//! limiter, or with a Redis URL from the Redis limiter that every instance
//! shares. Three in-process instances behind one load balancer admit three
//! times the limit, each reporting itself healthy; three on Redis admit the
//! limit.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Builder, Quota, RateLimiter};
use tollgate_redis::{Connection, RedisLimiter};

/// Where decisions come from.
enum Limiter {
    InProcess(RateLimiter<String>),
    Redis(Box<(tokio::runtime::Runtime, RedisLimiter)>),
}

impl Limiter {
    fn allows(&self, key: &str) -> bool {
        match self {
            Limiter::InProcess(limiter) => limiter.check(key).is_ok_and(|d| d.is_allowed()),
            Limiter::Redis(redis) => redis
                .0
                .block_on(redis.1.check(key))
                .is_ok_and(|d| d.is_allowed()),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let limit: u32 = args.next().map_or(Ok(100), |arg| arg.parse())?;
    let window_secs: u64 = args.next().map_or(Ok(60), |arg| arg.parse())?;
    let quota = Quota::new(limit, Duration::from_secs(window_secs))?;
    let limiter = Arc::new(match args.next() {
        None => Limiter::InProcess(Builder::new(quota).build::<String>()),
        Some(url) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?;
            let connection = runtime.block_on(Connection::open(url.as_str()))?;
            let limiter = RedisLimiter::builder("instance", quota).build(connection)?;
            Limiter::Redis(Box::new((runtime, limiter)))
        }
    });
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let stream = stream?;
        let limiter = Arc::clone(&limiter);
        std::thread::spawn(move || serve(&limiter, stream));
    }
    Ok(())
}

/// Answers each key on `stream` until the client closes it.
fn serve(limiter: &Limiter, stream: TcpStream) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    for key in BufReader::new(stream).lines() {
        let reply: &[u8] = if limiter.allows(&key?) {
            b"allow\n"
        } else {
            b"deny\n"
        };
        writer.write_all(reply)?;
    }
    Ok(())
}
