//! A TCP proxy between a client and a real `redis-server` that can lose a
//! reply on the way back: the server has run the command, the client never
//! hears of it and its connection closes. The at-most-once tests (and the
//! lab's client comparison) put it in front of a server to see whether a
//! client sends a command whose reply was lost a second time.
//!
//! Every connection the client opens is relayed to the server byte for
//! byte by two threads. Armed ([`Proxy::lose_next_script_reply`]), the
//! proxy watches what the client sends: the next write that carries a
//! script call (`EVALSHA` or `EVAL`) is forwarded, and the first bytes the
//! server sends back on that connection are dropped, both sockets shut
//! down. The next connection is relayed as before.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A running proxy on a loopback port.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: u16,
    /// Set to lose the reply of the next script call.
    armed: AtomicBool,
    /// Replies lost so far.
    lost: AtomicU32,
    stopped: AtomicBool,
}

impl Proxy {
    /// Relays a free loopback port to `upstream` on 127.0.0.1.
    pub fn start(upstream: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream,
            armed: AtomicBool::new(false),
            lost: AtomicU32::new(0),
            stopped: AtomicBool::new(false),
        });
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, accepting.upstream))
                else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                relay(&accepting, client, server);
            }
        });
        Ok(Self { port, shared })
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Loses the reply of the next script call: the call reaches the server
    /// and runs; its reply is dropped and the client's connection closed.
    pub fn lose_next_script_reply(&self) {
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    /// Loses no reply after all (an armed loss that met no script call).
    pub fn disarm(&self) {
        self.shared.armed.store(false, Ordering::SeqCst);
    }

    /// How many replies the proxy has lost.
    pub fn replies_lost(&self) -> u32 {
        self.shared.lost.load(Ordering::SeqCst)
    }

    /// Whether an armed loss is still waiting for its script call.
    pub fn armed(&self) -> bool {
        self.shared.armed.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then stops.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
    }
}

/// Relays one client connection, each direction on a thread of its own.
fn relay(shared: &Arc<Shared>, client: TcpStream, server: TcpStream) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Set (before the call is forwarded, so before any reply to it can
    // come back) when this connection carries the call whose reply is lost.
    let doomed = Arc::new(AtomicBool::new(false));
    let (Ok(mut client_in), Ok(mut server_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (upward, up_doomed) = (Arc::clone(shared), Arc::clone(&doomed));
    std::thread::spawn(move || {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let read = match client_in.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let bytes = &buffer[..read];
            if carries_script_call(bytes)
                && upward
                    .armed
                    .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                up_doomed.store(true, Ordering::SeqCst);
            }
            if server_out.write_all(bytes).is_err() {
                break;
            }
        }
        let _ = server_out.shutdown(Shutdown::Write);
    });
    let downward = Arc::clone(shared);
    let (mut server_in, mut client_out) = (server, client);
    std::thread::spawn(move || {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let read = match server_in.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            if doomed.load(Ordering::SeqCst) {
                // The server has answered: the call ran. The answer goes
                // nowhere, and the client's connection closes under it.
                downward.lost.fetch_add(1, Ordering::SeqCst);
                let _ = server_in.shutdown(Shutdown::Both);
                let _ = client_out.shutdown(Shutdown::Both);
                return;
            }
            if client_out.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = client_out.shutdown(Shutdown::Write);
    });
}

/// Whether a client's write holds a script call (RESP: the command name is
/// a bulk string of its own).
fn carries_script_call(bytes: &[u8]) -> bool {
    let has = |name: &[u8]| {
        bytes
            .windows(name.len())
            .any(|window| window.eq_ignore_ascii_case(name))
    };
    has(b"\r\nEVALSHA\r\n") || has(b"\r\nEVAL\r\n")
}
