//! A real axum server on a loopback port, and what a client reads of its
//! answers: every rate-limit field parsed by a structured-field parser
//! (`sfv`), the problem body by a JSON parser.

use std::net::{Ipv4Addr, SocketAddr};

use axum::Router;
use axum::routing::get;
use reqwest::header::HeaderMap;
use sfv::{BareItem, List, ListEntry, Parser};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tollgate_http::RateLimitLayer;

/// A server, stopped when dropped.
pub struct Server {
    pub address: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// `/` and `/api/hello` answer "hello" behind `layer`; the peer's
    /// address is recorded as axum's `ConnectInfo`.
    pub async fn start(layer: RateLimitLayer) -> Self {
        let app = Router::new()
            .route("/", get(|| async { "hello" }))
            .route("/api/hello", get(|| async { "hello" }))
            .layer(layer);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("binding a loopback port");
        let address = listener.local_addr().expect("a bound address");
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .expect("the server runs");
        });
        Self { address, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }
}

/// One item of a `RateLimit` or `RateLimit-Policy` list: its name (a
/// String, as the draft requires) and its integer parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub name: String,
    pub params: Vec<(String, i64)>,
}

impl Item {
    pub fn param(&self, name: &str) -> i64 {
        self.params
            .iter()
            .find(|(key, _)| key == name)
            .unwrap_or_else(|| panic!("{self:?} has no {name}"))
            .1
    }
}

/// Every line of field `name`, parsed as one structured-field List whose
/// members are Items with a String value and Integer parameters; panics
/// (fails the test) on anything else.
pub fn list(headers: &HeaderMap, name: &str) -> Vec<Item> {
    let lines: Vec<&[u8]> = headers
        .get_all(name)
        .iter()
        .map(|value| value.as_bytes())
        .collect();
    assert!(!lines.is_empty(), "no {name} field in {headers:?}");
    let list: List = Parser::new(&lines.join(&b", "[..]))
        .parse()
        .unwrap_or_else(|error| panic!("{name} is not a structured-field List: {error}"));
    list.into_iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else {
                panic!("{name}: an inner list where an item belongs");
            };
            let BareItem::String(value) = item.bare_item else {
                panic!("{name}: the item is not a String: {:?}", item.bare_item);
            };
            let params = item
                .params
                .into_iter()
                .map(|(key, value)| match value {
                    BareItem::Integer(integer) => (key.as_str().to_owned(), i64::from(integer)),
                    other => panic!("{name}: parameter {key:?} is not an Integer: {other:?}"),
                })
                .collect();
            Item {
                name: value.as_str().to_owned(),
                params,
            }
        })
        .collect()
}

/// `Retry-After` as delay-seconds.
pub fn retry_after(headers: &HeaderMap) -> u64 {
    headers
        .get("retry-after")
        .expect("a Retry-After field")
        .to_str()
        .expect("ASCII")
        .parse()
        .expect("delay-seconds")
}

/// A client whose connection pool keeps nothing: each request on a new
/// connection, so that nothing carries over between tests' servers.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("a client")
}

/// Sends `requests` GETs to `url` with `headers`, returning how many were
/// admitted (200) and the last response.
pub async fn send(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    requests: usize,
) -> (usize, reqwest::Response) {
    let mut admitted = 0;
    let mut last = None;
    for _ in 0..requests {
        let mut request = client.get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("the server answers");
        if response.status() == reqwest::StatusCode::OK {
            admitted += 1;
        }
        last = Some(response);
    }
    (admitted, last.expect("at least one request"))
}
