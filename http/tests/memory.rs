//! Memory per stored key, on a real server: a real axum server on
//! loopback, a real client (reqwest), every request padded with a 300 KB
//! header, and a counting global allocator (this test binary's alone) that
//! reads how many bytes stay live once the responses are in and the
//! connections closed.
//!
//! hyper parses a request's headers as slices of the connection's read
//! buffer; a key that kept such a slice would keep the whole buffer (here
//! over 300 KB) alive for as long as the limiter stores the key. Each
//! extractor's figure is printed (`--nocapture`) and held to
//! [`MAX_BYTES_PER_KEY`].

#[allow(dead_code)]
// The support module serves every test file; this one reads fewer of its answers.
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use http::HeaderName;
use support::{Server, client};
use tollgate::store::{Key, WhenFull};
use tollgate::{Builder, Quota};
use tollgate_http::{Global, Header, IpNet, KeyExtractor, PeerIp, RateLimitLayer, Rule};

/// Counts the bytes the process has allocated and not freed.
struct Counting;

/// Live bytes: allocated minus freed, as requested of the allocator (its
/// own per-block overhead is not counted).
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// The most [`LIVE_BYTES`] has been since it was last reset.
static PEAK_BYTES: AtomicIsize = AtomicIsize::new(0);

/// Counts `bytes` more live bytes.
fn grew(bytes: isize) {
    // Relaxed, both: statistics, read after the measured work has been
    // joined; ordered with nothing.
    let live = LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
}

/// Bytes as a signed count (no allocation reaches `isize::MAX`).
fn signed(bytes: usize) -> isize {
    isize::try_from(bytes).unwrap_or(isize::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, and only counts; the counter takes no lock and allocates
// nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            grew(signed(layout.size()));
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            grew(signed(layout.size()));
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: `block` was allocated by `System` with `layout` (every
        // allocation goes through this allocator).
        unsafe { System.dealloc(block, layout) };
        LIVE_BYTES.fetch_sub(signed(layout.size()), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`, with the caller's new size.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            grew(signed(new_size) - signed(layout.size()));
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The claim: a stored key costs less than this, its entry in the store
/// included (its share of the table's growth too).
const MAX_BYTES_PER_KEY: isize = 2 * 1024;

/// Distinct keys measured, after [`WARM_UP`] keys that set up the server,
/// the client and the store's first table.
const KEYS: usize = 1_000;
const WARM_UP: usize = 100;

/// The padding each request carries: a header of this many bytes, so that
/// the read buffer it is parsed from is this large.
const PADDING_BYTES: usize = 300 * 1024;

/// The measurements share one counter: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `measure` alone, on a runtime of its own.
fn alone<T>(measure: impl Future<Output = T>) -> T {
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(measure)
}

/// How the `index`-th request is made to carry a key of its own.
#[derive(Clone, Copy)]
enum Distinct {
    /// An `x-api-key` of 10 bytes (`key-000042`).
    ApiKey,
    /// A connection from its own loopback address (`127.0.x.y`).
    PeerAddress,
    /// An `X-Forwarded-For` naming its own client, through a trusted proxy
    /// (the loopback peer).
    ForwardedFor,
    /// Nothing: every request has the one key.
    Nothing,
}

/// The `index`-th loopback address past the server's 127.0.0.1:
/// 127.0.0.2 to 127.0.0.251, then 127.0.1.2 on (`index` below 64 000).
fn loopback(index: usize) -> IpAddr {
    let high = u8::try_from(index / 250).expect("a loopback network");
    let low = u8::try_from(index % 250 + 2).expect("a loopback host");
    IpAddr::V4(Ipv4Addr::new(127, 0, high, low))
}

/// Sends the `index`-th padded request, and reads its answer.
async fn send_padded(
    shared: &reqwest::Client,
    url: &str,
    padding: &str,
    distinct: Distinct,
    index: usize,
) {
    let own;
    let client = if let Distinct::PeerAddress = distinct {
        own = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .local_address(loopback(index))
            .build()
            .expect("a client");
        &own
    } else {
        shared
    };
    let mut request = client.get(url).header("x-padding", padding);
    match distinct {
        Distinct::ApiKey => request = request.header("x-api-key", format!("key-{index:06}")),
        Distinct::ForwardedFor => {
            let [.., high, low] = u32::try_from(index).expect("an index").to_be_bytes();
            request = request.header("x-forwarded-for", format!("198.51.{high}.{low}"));
        }
        Distinct::PeerAddress | Distinct::Nothing => {}
    }
    let response = request.send().await.expect("the server answers");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    response.bytes().await.expect("the body");
}

/// Live bytes once they have stopped moving: the connections' tasks on
/// both sides end shortly after the last response is read.
async fn settled_live_bytes() -> isize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = LIVE_BYTES.load(Ordering::Relaxed);
    let mut unchanged = 0;
    while unchanged < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = LIVE_BYTES.load(Ordering::Relaxed);
        unchanged = if now == last { unchanged + 1 } else { 0 };
        last = now;
    }
    last
}

/// Serves a rule keyed by `extractor`, sends [`WARM_UP`] then [`KEYS`]
/// padded requests with distinct keys (as `distinct` makes them), and
/// returns the live bytes the [`KEYS`] requests left behind, with the keys
/// the limiter then holds.
fn live_bytes_after<E>(extractor: E, distinct: Distinct) -> (isize, usize)
where
    E: KeyExtractor<Key: Key>,
{
    alone(async move {
        let limiter = Arc::new(
            Builder::new(Quota::per_hour(1_000_000).expect("a quota"))
                .max_keys(
                    NonZeroUsize::new(2 * (WARM_UP + KEYS)).expect("nonzero"),
                    WhenFull::Reject,
                )
                .build::<E::Key>(),
        );
        let rule = Rule::new("memory", Arc::clone(&limiter), extractor).expect("a rule");
        let server = Server::start(RateLimitLayer::builder().rule(rule).build()).await;
        let url = server.url("/");
        let shared = client();
        let padding = "p".repeat(PADDING_BYTES);
        for index in 0..WARM_UP {
            send_padded(&shared, &url, &padding, distinct, index).await;
        }
        let before = settled_live_bytes().await;
        for index in WARM_UP..WARM_UP + KEYS {
            send_padded(&shared, &url, &padding, distinct, index).await;
        }
        let after = settled_live_bytes().await;
        let stored = limiter.len();
        drop(server);
        (after - before, stored)
    })
}

/// Prints and checks one extractor's figure.
fn assert_bytes_per_key(extractor: &str, growth: isize, stored: usize) {
    assert_eq!(stored, WARM_UP + KEYS, "{extractor}: every key stored");
    let per_key = growth / signed(KEYS);
    println!(
        "{extractor}: {growth} bytes live after {KEYS} keys, each request padded with \
         {PADDING_BYTES} bytes: {per_key} bytes a key"
    );
    assert!(
        per_key < MAX_BYTES_PER_KEY,
        "{extractor}: {per_key} bytes a stored key (bound: {MAX_BYTES_PER_KEY})"
    );
}

#[test]
fn a_header_key_keeps_only_its_own_bytes() {
    let (growth, stored) = live_bytes_after(
        Header::new(HeaderName::from_static("x-api-key")),
        Distinct::ApiKey,
    );
    assert_bytes_per_key("Header", growth, stored);
}

#[test]
fn a_peer_address_key_keeps_only_its_own_bytes() {
    let (growth, stored) = live_bytes_after(PeerIp::new(), Distinct::PeerAddress);
    assert_bytes_per_key("PeerIp", growth, stored);
}

#[test]
fn a_forwarded_address_key_keeps_only_its_own_bytes() {
    let loopback: IpNet = "127.0.0.0/8".parse().expect("a network");
    let (growth, stored) = live_bytes_after(
        PeerIp::new().trust_x_forwarded_for([loopback]),
        Distinct::ForwardedFor,
    );
    assert_bytes_per_key("PeerIp through X-Forwarded-For", growth, stored);
}

#[test]
fn the_global_key_is_one_key_whatever_the_requests() {
    let (growth, stored) = live_bytes_after(Global, Distinct::Nothing);
    assert_eq!(stored, 1);
    println!(
        "Global: {growth} bytes live after {KEYS} requests, each padded with {PADDING_BYTES} bytes"
    );
    assert!(
        growth < MAX_BYTES_PER_KEY,
        "Global: {growth} bytes after {KEYS} requests on its one key (bound: {MAX_BYTES_PER_KEY})"
    );
}

/// The most bytes live while `request` is sent and answered, above those
/// live before it.
async fn peak_bytes_of(request: reqwest::RequestBuilder) -> isize {
    let before = settled_live_bytes().await;
    PEAK_BYTES.store(before, Ordering::Relaxed);
    let response = request.send().await.expect("the server answers");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    response.bytes().await.expect("the body");
    settled_live_bytes().await;
    PEAK_BYTES.load(Ordering::Relaxed) - before
}

/// The smallest peak of five requests padded with [`PADDING_BYTES`] of
/// `header` entries (`{node}192.0.2.1`, then the client's own) through a
/// trusted proxy, and of five padded as much with another header,
/// interleaved (the read buffer's growth varies a little with how the
/// bytes arrive), after a round that warms up.
fn forwarding_peaks(peer: PeerIp, header: &'static str, node: &'static str) -> (isize, isize) {
    alone(async move {
        let limiter = Builder::new(Quota::per_hour(1_000_000).expect("a quota"))
            .max_keys(NonZeroUsize::new(100).expect("nonzero"), WhenFull::Reject)
            .build();
        let rule = Rule::new("memory", limiter, peer).expect("a rule");
        let server = Server::start(RateLimitLayer::builder().rule(rule).build()).await;
        let url = server.url("/");
        let client = client();
        let entry = format!("{node}192.0.2.1,");
        let entries = entry.repeat(PADDING_BYTES / entry.len());
        let (mut padded, mut forwarded) = (isize::MAX, isize::MAX);
        for round in 0..6 {
            let value = format!("{entries}{node}198.51.100.{round}");
            let padded_peak = peak_bytes_of(client.get(&url).header("x-padding", &value)).await;
            let forwarded_peak = peak_bytes_of(client.get(&url).header(header, &value)).await;
            if round > 0 {
                padded = padded.min(padded_peak);
                forwarded = forwarded.min(forwarded_peak);
            }
        }
        (padded, forwarded)
    })
}

/// A client can write a long forwarding header before its proxy's entry;
/// reading it from its end touches only the entries walked (at most 32).
/// A request with 300 KB of entries peaks within 64 KiB of one padded as
/// much with another header.
fn assert_read_from_its_end(header: &str, (padded, forwarded): (isize, isize)) {
    const MAX_EXTRA_BYTES: isize = 64 * 1024;
    println!(
        "a request with {PADDING_BYTES} bytes of {header} peaked at {forwarded} bytes, \
         one padded as much with another header at {padded}"
    );
    assert!(
        forwarded - padded < MAX_EXTRA_BYTES,
        "reading {header} took {} bytes more than reading past it",
        forwarded - padded
    );
}

#[test]
fn a_long_x_forwarded_for_is_read_from_its_end_only() {
    let loopback: IpNet = "127.0.0.0/8".parse().expect("a network");
    let peaks = forwarding_peaks(
        PeerIp::new().trust_x_forwarded_for([loopback]),
        "x-forwarded-for",
        "",
    );
    assert_read_from_its_end("X-Forwarded-For", peaks);
}

#[test]
fn a_long_forwarded_is_read_from_its_end_only() {
    let loopback: IpNet = "127.0.0.0/8".parse().expect("a network");
    let peaks = forwarding_peaks(
        PeerIp::new().trust_forwarded([loopback]),
        "forwarded",
        "for=",
    );
    assert_read_from_its_end("Forwarded", peaks);
}
