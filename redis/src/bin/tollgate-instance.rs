//! One instance of a service guarded by an in-process limiter: the unit of
//! the three-instance break (notes/10). It listens on a free loopback port,
//! prints the port on its first line of output, and answers each line it
//! receives (a key) with `allow` or `deny`, from its own limiter of
//! `LIMIT` requests per `WINDOW_SECS` seconds (the arguments, 100 and 60 by
//! default). Three of these behind one load balancer admit three times the
//! limit, each reporting itself healthy.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Builder, Quota, RateLimiter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let limit: u32 = args.next().map_or(Ok(100), |arg| arg.parse())?;
    let window_secs: u64 = args.next().map_or(Ok(60), |arg| arg.parse())?;
    let quota = Quota::new(limit, Duration::from_secs(window_secs))?;
    let limiter = Arc::new(Builder::new(quota).build::<String>());
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
fn serve(limiter: &RateLimiter<String>, stream: TcpStream) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    for key in BufReader::new(stream).lines() {
        let allowed = limiter
            .check(key?.as_str())
            .is_ok_and(|decision| decision.is_allowed());
        writer.write_all(if allowed { b"allow\n" } else { b"deny\n" })?;
    }
    Ok(())
}
