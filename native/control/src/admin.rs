//! The admin listener (`--admin ADDR`): plain HTTP/1.1 for operators, kept
//! off the ADS port, and read-only: nothing on it changes state.
//! `GET /` is the status page and `GET /status` its JSON
//! ([`crate::status`]); `GET /metrics` answers the control plane's metrics ([`crate::metrics`])
//! in the OpenMetrics text format Prometheus scrapes; `GET /drain` the
//! drain status of every DRAINING endpoint, and of those lately removed by
//! their service's `drain`, as JSON ([`crate::load`]); anything else is
//! 404.

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

/// What the admin pages read.
#[derive(Debug, Clone)]
pub struct Admin {
    plane: ControlPlane,
    dns: Option<watch::Receiver<DnsStatus>>,
    drain: Arc<JsonPage>,
    status: Arc<JsonPage>,
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
        }
    }

    /// The `/metrics` page: figures read at scrape time.
    pub fn metrics(&self) -> String {
        let metrics = self.plane.metrics();
        metrics.serving(self.plane.snapshot().version);
        if let Some(dns) = &self.dns {
            metrics.dns(&dns.borrow());
        }
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
                (_, "/" | "/status" | "/metrics" | "/drain") => (
                    StatusCode::METHOD_NOT_ALLOWED,
                    "text/plain; charset=utf-8",
                    Bytes::from_static(b"GET only\n"),
                ),
                (_, path) => (
                    StatusCode::NOT_FOUND,
                    "text/plain; charset=utf-8",
                    format!("no page {path:?}: try /, /status, /metrics or /drain\n").into(),
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
