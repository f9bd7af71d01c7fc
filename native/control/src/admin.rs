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

/// What the admin pages read.
#[derive(Debug, Clone)]
pub struct Admin {
    plane: ControlPlane,
    dns: Option<watch::Receiver<DnsStatus>>,
}

impl Admin {
    /// Pages of `plane`, with the DNS names' status from `dns` when names
    /// are in use ([`crate::Reloader::dns_status`]).
    pub fn new(plane: ControlPlane, dns: Option<watch::Receiver<DnsStatus>>) -> Self {
        Admin { plane, dns }
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
        let (status, content_type, body) = match (request.method(), request.uri().path()) {
            (&Method::GET, "/") => (
                StatusCode::OK,
                "text/html; charset=utf-8",
                crate::status::PAGE.to_owned(),
            ),
            (&Method::GET, "/status") => (
                StatusCode::OK,
                "application/json",
                serde_json::to_string(&self.plane.status())
                    .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string())),
            ),
            (&Method::GET, "/metrics") => (StatusCode::OK, OPENMETRICS, self.metrics()),
            (&Method::GET, "/drain") => (
                StatusCode::OK,
                "application/json",
                serde_json::to_string(&self.plane.drain_status())
                    .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string())),
            ),
            (_, "/" | "/status" | "/metrics" | "/drain") => (
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain; charset=utf-8",
                "GET only\n".to_owned(),
            ),
            (_, path) => (
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                format!("no page {path:?}: try /, /status, /metrics or /drain\n"),
            ),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
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
