//! A minimal HTTP/1.1 client for tests: one request per connection, or a
//! [`Connection`] kept alive for many. Every response header is kept, in
//! order, repeated ones included (tests look at `set-cookie`).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;

/// A response as tests need it.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// All headers, names lowercase, in order.
    pub headers: Vec<(String, String)>,
    /// Body as text (lossy UTF-8).
    pub body: String,
}

impl Response {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name` (lowercase).
    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body parsed as JSON, or `Value::Null`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

const TIMEOUT: Duration = Duration::from_secs(10);

/// A kept-alive HTTP/1.1 connection.
pub struct Connection {
    sender: http1::SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    local: SocketAddr,
}

impl Connection {
    /// Connects to `addr`.
    pub async fn open(addr: SocketAddr) -> Result<Connection, String> {
        let stream = tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| format!("connect {addr}: timed out"))?
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let local = stream
            .local_addr()
            .map_err(|e| format!("local address of {addr}: {e}"))?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake {addr}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Connection {
            sender,
            addr,
            local,
        })
    }

    /// The client side's address (what the server sees as the peer).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Sends a request with `method`, `path` and extra `headers`.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string());
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let req = req
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|e| format!("request {path}: {e}"))?;
        let addr = self.addr;
        let fut = async {
            self.sender
                .ready()
                .await
                .map_err(|e| format!("{addr}{path}: {e}"))?;
            let resp = self
                .sender
                .send_request(req)
                .await
                .map_err(|e| format!("{addr}{path}: {e}"))?;
            let status = resp.status().as_u16();
            let headers = resp
                .headers()
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("{addr}{path}: body: {e}"))?
                .to_bytes();
            Ok(Response {
                status,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(TIMEOUT, fut)
            .await
            .map_err(|_| format!("{addr}{path}: timed out"))?
    }

    /// `GET path` with extra `headers`.
    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<Response, String> {
        self.send("GET", path, headers, b"").await
    }
}

/// `GET path` on a new connection to `addr`.
pub async fn get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Response, String> {
    Connection::open(addr).await?.get(path, headers).await
}

/// Polls `GET path` on `addr` every 100 ms until its JSON satisfies `want`
/// (a page that changes as reports or updates arrive), within 30 s; panics
/// naming `what` and the last page otherwise.
pub async fn until_json(
    addr: SocketAddr,
    path: &str,
    what: &str,
    want: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        let page = match get(addr, path, &[]).await {
            Ok(r) => r.json(),
            Err(e) => serde_json::Value::String(e),
        };
        if want(&page) {
            return page;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "{what}: GET {path} is {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// What tether-control's `GET /status` page (`status`) shows of `node`'s
/// load on the endpoint `address` of `cluster`: its entry in the
/// endpoint's `load`, or `null`.
pub fn status_load(
    status: &serde_json::Value,
    cluster: &str,
    address: SocketAddr,
    node: &str,
) -> serde_json::Value {
    status["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == cluster))
        .and_then(|c| c["endpoints"].as_array())
        .and_then(|e| e.iter().find(|e| e["address"] == address.to_string()))
        .and_then(|e| e["load"].as_array())
        .and_then(|l| l.iter().find(|l| l["node"] == node))
        .cloned()
        .unwrap_or_default()
}
