//! The forwarding-header parsers on arbitrary bytes: they never panic, and
//! each reads at most `MAX_HOPS` entries from the end (`X-Forwarded-For`:
//! exactly the last `min(entries, MAX_HOPS)`). The same bytes, cut into
//! header lines at each `\n`, go through `PeerIp`, which trusts every
//! address, so that its walk reads as far as the bound lets it.

#![no_main]

use std::net::SocketAddr;

use libfuzzer_sys::fuzz_target;
use tollgate_http::fuzzing::{MAX_HOPS, forwarded_for, x_forwarded_for};
use tollgate_http::{IpNet, KeyExtractor, PeerIp, RequestHead};

fuzz_target!(|data: &[u8]| {
    let entries = data.iter().filter(|&&byte| byte == b',').count() + 1;
    assert_eq!(x_forwarded_for(data).len(), entries.min(MAX_HOPS));
    let elements = forwarded_for(data);
    assert!((1..=MAX_HOPS).contains(&elements.len()), "{elements:?}");

    let everything = ["0.0.0.0/0", "::/0"].map(|net| net.parse::<IpNet>().unwrap());
    for (name, extractor) in [
        (
            "x-forwarded-for",
            PeerIp::new().trust_x_forwarded_for(everything),
        ),
        ("forwarded", PeerIp::new().trust_forwarded(everything)),
    ] {
        let mut request = http::Request::new(());
        for line in data.split(|&byte| byte == b'\n') {
            if let Ok(value) = http::HeaderValue::from_bytes(line) {
                request.headers_mut().append(name, value);
            }
        }
        request
            .extensions_mut()
            .insert("10.0.0.1:443".parse::<SocketAddr>().unwrap());
        extractor
            .extract(&RequestHead::of(&request))
            .expect("a peer address is all PeerIp needs");
    }
});
