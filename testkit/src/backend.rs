//! HTTP backends that say who they are.
//!
//! Each answers every request with status 200, a header `x-backend: <name>`
//! and a JSON body `{"backend", "address", "path", "headers"}` (the request's
//! headers, names lowercase), over HTTP/1.1 or HTTP/2 (prior knowledge).
//! [`HttpBackend::stop`] closes the listener and every open connection, so
//! later connects are refused, as with a crashed backend.

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A running backend that serves protocol `P` ([`Http`], or
/// `grpc::Grpc` with the feature `grpc`); stopped on drop.
pub struct Backend<P> {
    name: String,
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
    task: Mutex<Option<JoinHandle<()>>>,
    protocol: PhantomData<P>,
}

/// HTTP/1.1 and HTTP/2 (prior knowledge), answered as the module says.
pub enum Http {}

/// A running HTTP backend.
pub type HttpBackend = Backend<Http>;

impl<P> Backend<P> {
    /// A backend called `name` at `addr`, served by `task`, which counts
    /// what it serves in `hits`.
    pub(crate) fn new(
        name: &str,
        addr: SocketAddr,
        hits: Arc<AtomicU64>,
        task: JoinHandle<()>,
    ) -> Backend<P> {
        Backend {
            name: name.to_string(),
            addr,
            hits,
            task: Mutex::new(Some(task)),
            protocol: PhantomData,
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Requests (gRPC: calls) served so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// Waits until it has served `n` requests in all; panics after
    /// `within`. A gRPC call counts as soon as its handler starts, so a
    /// slow call (a `sleep:MS` message) is in flight once counted.
    pub async fn until_hits(&self, n: u64, within: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.hits() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: {} of {n} requests after {within:?}",
                self.name,
                self.hits()
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Stops serving and returns once it has: the task that owns the
    /// listener (for HTTP, and every open connection) is aborted and gone,
    /// so the port refuses connections when this returns.
    pub async fn stop(&self) {
        let task = self.task.lock().expect("lock").take();
        if let Some(t) = task {
            t.abort();
            // Resolves once the aborted task has been dropped.
            let _ = t.await;
        }
    }
}

impl<P> Drop for Backend<P> {
    fn drop(&mut self) {
        if let Some(t) = self.task.get_mut().ok().and_then(Option::take) {
            t.abort();
        }
    }
}

impl Backend<Http> {
    /// Starts a backend called `name` on a random 127.0.0.1 port.
    pub async fn start(name: &str) -> HttpBackend {
        Self::start_on(name, "127.0.0.1:0".parse().expect("addr")).await
    }

    /// Starts a backend called `name` on `addr` (e.g. to restart on the same port).
    pub async fn start_on(name: &str, addr: SocketAddr) -> HttpBackend {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind backend");
        let addr = listener.local_addr().expect("backend addr");
        let hits = Arc::new(AtomicU64::new(0));
        let (n, h) = (name.to_string(), hits.clone());
        let task = accept_loop(listener, move |stream| {
            let (n, h) = (n.clone(), h.clone());
            async move {
                let svc = service_fn(move |req| answer(req, n.clone(), addr, h.clone()));
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            }
        });
        Backend::new(name, addr, hits, task)
    }
}

/// A task accepting connections on `listener` for ever, each served by
/// `serve` in a task of its own that it owns: aborting it closes the
/// listener and every connection.
pub(crate) fn accept_loop<F, Fut>(listener: TcpListener, serve: F) -> JoinHandle<()>
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            conns.spawn(serve(stream));
            while conns.try_join_next().is_some() {}
        }
    })
}

pub(crate) async fn answer(
    req: Request<hyper::body::Incoming>,
    name: String,
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    hits.fetch_add(1, Ordering::SeqCst);
    let mut headers = serde_json::Map::new();
    for (k, v) in req.headers() {
        headers.entry(k.as_str().to_string()).or_insert_with(|| {
            serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned())
        });
    }
    let body = serde_json::json!({
        "backend": name,
        "address": addr.to_string(),
        "path": req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        "headers": headers,
    });
    let resp = Response::builder()
        .status(200)
        .header("x-backend", name.as_str())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("response");
    Ok(resp)
}
