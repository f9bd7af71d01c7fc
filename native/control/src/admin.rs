//! The admin listener (`--admin ADDR`): plain HTTP/1.1 for operators, kept
//! off the ADS port, and read-only: nothing on it changes state.
//! `GET /` is the status page and `GET /status` its JSON
//! ([`crate::status`]); `GET /metrics` answers the control plane's metrics ([`crate::metrics`])
//! in the OpenMetrics text format Prometheus scrapes; `GET /drain` the
//! drain status of every DRAINING endpoint, and of those lately removed by
//! their service's `drain`, as JSON ([`crate::load`]); `GET /load` each
//! client's recent load reports as they came (`?node=NAME`: that node's
//! only; [`crate::reports`]); anything else is 404.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::dns::DnsStatus;
use crate::server::ControlPlane;

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A page that takes longer than this to make (a fleet of clients) is
/// served from its last answer while the next is made; a quicker one is
/// made for each request.
const SLOW: Duration = Duration::from_millis(5);
/// How old a slow page's answer may be before a request has the next made.
const FRESH: Duration = Duration::from_millis(200);
/// A slow page's answer older than this is not served while the next is
/// made: the request waits for it.
const STALE_AT_MOST: Duration = Duration::from_secs(2);

/// A JSON page built from the load state. With a thousand clients one
/// takes tens of milliseconds, under the load state's lock: such a page is
/// answered at once from its last answer, and the next is made in the
/// background once that one is [`FRESH`] no more. A page quicker than
/// [`SLOW`] to make is made for every request, so what a small fleet's
/// operator (or a test) reads is always current.
#[derive(Default)]
struct JsonPage {
    /// The last answer: when it was made, how long that took, the body.
    last: std::sync::Mutex<Option<(Instant, Duration, Bytes)>>,
    making: AtomicBool,
}

impl std::fmt::Debug for JsonPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonPage").finish_non_exhaustive()
    }
}

impl JsonPage {
    fn get(self: &Arc<Self>, make: impl Fn() -> String + Send + 'static) -> Bytes {
        let last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match last {
            Some((at, took, body)) if took >= SLOW && at.elapsed() < FRESH => body,
            Some((at, took, body)) if took >= SLOW && at.elapsed() < STALE_AT_MOST => {
                if !self.making.swap(true, Ordering::AcqRel) {
                    let page = self.clone();
                    tokio::task::spawn_blocking(move || {
                        page.make(&make);
                        page.making.store(false, Ordering::Release);
                    });
                }
                body
            }
            _ => self.make(&make),
        }
    }

    fn make(&self, make: &impl Fn() -> String) -> Bytes {
        let started = Instant::now();
        let body = Bytes::from(make());
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((started, started.elapsed(), body.clone()));
        body
    }
}

/// The value of `key` in a URL query (`a=1&node=x%2Fy`), percent-decoded;
/// the first when given twice.
fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decoded(k)? == key).then(|| percent_decoded(v))?
    })
}

/// `text` with `%XX` escapes and `+` (a space, as forms write it)
/// decoded; `None` when the bytes are not UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let hex = |i: usize| {
        let digit = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
        Some(digit(bytes.get(i))? * 16 + digit(bytes.get(i + 1))?)
    };
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], hex(i + 1)) {
            (b'%', Some(b)) => {
                out.push(b as u8);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// What the admin pages read.
#[derive(Debug, Clone)]
pub struct Admin {
    plane: ControlPlane,
    dns: Option<watch::Receiver<DnsStatus>>,
    drain: Arc<JsonPage>,
    status: Arc<JsonPage>,
    /// `/load` with every node (one node's page is made for each request).
    load: Arc<JsonPage>,
}

/// A value as JSON, or an object naming why it could not be.
fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
}

impl Admin {
    /// Pages of `plane`, with the DNS names' status from `dns` when names
    /// are in use ([`crate::Reloader::dns_status`]).
    pub fn new(plane: ControlPlane, dns: Option<watch::Receiver<DnsStatus>>) -> Self {
        Admin {
            plane,
            dns,
            drain: Arc::default(),
            status: Arc::default(),
            load: Arc::default(),
        }
    }

    /// The `/metrics` page: figures read at scrape time.
    pub fn metrics(&self) -> String {
        let metrics = self.plane.metrics();
        metrics.serving(self.plane.snapshot().version);
        if let Some(dns) = &self.dns {
            metrics.dns(&dns.borrow());
        }
        let now = std::time::Instant::now();
        metrics.draining(&self.plane.load(|l| l.status(now)));
        metrics.encode()
    }

    fn answer(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        let (status, content_type, body): (_, _, Bytes) =
            match (request.method(), request.uri().path()) {
                (&Method::GET, "/") => (
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    Bytes::from_static(crate::status::PAGE.as_bytes()),
                ),
                (&Method::GET, "/status") => {
                    let plane = self.plane.clone();
                    let body = self.status.get(move || json(&plane.status()));
                    (StatusCode::OK, "application/json", body)
                }
                (&Method::GET, "/metrics") => (StatusCode::OK, OPENMETRICS, self.metrics().into()),
                (&Method::GET, "/drain") => {
                    let plane = self.plane.clone();
                    let body = self.drain.get(move || json(&plane.drain_status()));
                    (StatusCode::OK, "application/json", body)
                }
                (&Method::GET, "/load") => {
                    let node = request.uri().query().and_then(|q| query_value(q, "node"));
                    let plane = self.plane.clone();
                    let make = move |node: Option<&str>| {
                        let kept = plane.load(|l| l.kept_reports(node, Instant::now()));
                        json(&kept.page())
                    };
                    let body = match node {
                        Some(node) => make(Some(&node)).into(),
                        None => self.load.get(move || make(None)),
                    };
                    (StatusCode::OK, "application/json", body)
                }
                (_, "/" | "/status" | "/metrics" | "/drain" | "/load") => (
                    StatusCode::METHOD_NOT_ALLOWED,
                    "text/plain; charset=utf-8",
                    Bytes::from_static(b"GET only\n"),
                ),
                (_, path) => (
                    StatusCode::NOT_FOUND,
                    "text/plain; charset=utf-8",
                    format!("no page {path:?}: try /, /status, /metrics, /drain or /load\n").into(),
                ),
            };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        // The page loads nothing from elsewhere and talks to this listener only.
        response.headers_mut().insert(
            http::header::CONTENT_SECURITY_POLICY,
            http::HeaderValue::from_static(
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
        );
        response
    }

    /// Serves the pages on `listener` until `shutdown` completes; a
    /// connection's error ends that connection only.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                () = &mut shutdown => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        log::debug!("admin listener: accept failed: {e}");
                        // EMFILE and the like: let descriptors free up.
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let admin = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let response = admin.answer(&request);
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    log::debug!("admin connection: {e}");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::query_value;

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            query_value("node=a%2Fb+c", "node").as_deref(),
            Some("a/b c")
        );
        assert_eq!(
            query_value("x=1&node=n&node=m", "node").as_deref(),
            Some("n")
        );
        assert_eq!(query_value("node", "node").as_deref(), Some(""));
        assert_eq!(query_value("node=100%", "node").as_deref(), Some("100%"));
        assert_eq!(query_value("x=1", "node"), None);
        assert_eq!(query_value("node=%FF", "node"), None, "not UTF-8");
    }
}
