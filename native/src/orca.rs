//! ORCA load reports (gRFC A51): what a backend says about its own load,
//! for client-side policies such as `weighted_round_robin` (gRFC A58).
//!
//! - [`OrcaLoadReport`]: the `xds.data.orca.v3.OrcaLoadReport` message
//!   (Envoy's API crate does not carry the `xds.data.orca` package, so its
//!   fields are declared here by their proto tags).
//! - Per-call reports travel in the response trailer
//!   [`PER_CALL_TRAILER`] (`endpoint-load-metrics-bin`), the binary
//!   serialized message, base64 on the wire as every `-bin` metadata is;
//!   [`report_from_trailers`] reads one.
//! - [`LoadReportLayer`]: a tower `Layer` for a tonic server that adds the
//!   server's current [`ServerMetrics`] as that trailer to every response,
//!   so a tether user's backend can report its load.
//!
//! Not yet here: the out-of-band reporting stream
//! (`xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use base64::Engine as _;
use http::HeaderValue;
use http_body::{Body as HttpBody, Frame};
use prost::Message as _;

/// Base64 as gRPC's `-bin` metadata uses it: the standard alphabet, padded
/// by some senders and not by others, so decoding accepts both.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The response trailer that carries a per-call load report.
pub const PER_CALL_TRAILER: &str = "endpoint-load-metrics-bin";

/// `xds.data.orca.v3.OrcaLoadReport`: a backend's load, as gRFC A51 reports it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OrcaLoadReport {
    /// CPU utilization, usually in [0, 1] (may exceed 1 on a busy host).
    #[prost(double, tag = "1")]
    pub cpu_utilization: f64,
    /// Memory utilization in [0, 1].
    #[prost(double, tag = "2")]
    pub mem_utilization: f64,
    /// Deprecated integer queries per second; `rps_fractional` replaces it.
    #[prost(uint64, tag = "3")]
    pub rps: u64,
    /// Per-request costs by name.
    #[prost(map = "string, double", tag = "4")]
    pub request_cost: HashMap<String, f64>,
    /// Named utilizations in [0, 1].
    #[prost(map = "string, double", tag = "5")]
    pub utilization: HashMap<String, f64>,
    /// Queries per second the backend serves.
    #[prost(double, tag = "6")]
    pub rps_fractional: f64,
    /// Errors per second.
    #[prost(double, tag = "7")]
    pub eps: f64,
    /// Application-defined metrics.
    #[prost(map = "string, double", tag = "8")]
    pub named_metrics: HashMap<String, f64>,
    /// The application's own notion of utilization; preferred over
    /// `cpu_utilization` by `weighted_round_robin` when set.
    #[prost(double, tag = "9")]
    pub application_utilization: f64,
}

impl prost::Name for OrcaLoadReport {
    const NAME: &'static str = "OrcaLoadReport";
    const PACKAGE: &'static str = "xds.data.orca.v3";
}

/// The per-call load report in a call's trailers (or trailers-only
/// headers), if it carries a valid one. A malformed trailer is logged and
/// ignored: the call itself is unaffected.
pub fn report_from_trailers(trailers: &http::HeaderMap) -> Option<OrcaLoadReport> {
    let value = trailers.get(PER_CALL_TRAILER)?;
    let bytes = match BASE64.decode(value.as_bytes()) {
        Ok(b) => b,
        Err(e) => {
            log::debug!("{PER_CALL_TRAILER} {value:?} is not base64: {e}");
            return None;
        }
    };
    match OrcaLoadReport::decode(bytes.as_slice()) {
        Ok(r) => Some(r),
        Err(e) => {
            log::debug!("{PER_CALL_TRAILER} is not an OrcaLoadReport: {e}");
            None
        }
    }
}

/// The trailer value for `report`: the serialized message, base64.
pub fn trailer_value(report: &OrcaLoadReport) -> HeaderValue {
    let encoded = BASE64.encode(report.encode_to_vec());
    // Base64 is always a valid header value.
    HeaderValue::from_str(&encoded).expect("base64 is a valid header value")
}

/// A server's current load as it reports it, shared between the code that
/// measures it and [`LoadReportLayer`]. Cloning shares the same values.
#[derive(Debug, Clone, Default)]
pub struct ServerMetrics {
    inner: Arc<Mutex<OrcaLoadReport>>,
}

impl ServerMetrics {
    /// Metrics with nothing set (an empty report).
    pub fn new() -> Self {
        ServerMetrics::default()
    }

    fn set(&self, f: impl FnOnce(&mut OrcaLoadReport)) {
        // A panic while holding the lock cannot leave a report half-made
        // in a way that matters: keep serving the last values.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard);
    }

    /// Sets the CPU utilization.
    pub fn set_cpu_utilization(&self, v: f64) {
        self.set(|r| r.cpu_utilization = v);
    }

    /// Sets the application utilization (preferred over CPU by
    /// `weighted_round_robin`).
    pub fn set_application_utilization(&self, v: f64) {
        self.set(|r| r.application_utilization = v);
    }

    /// Sets the memory utilization.
    pub fn set_mem_utilization(&self, v: f64) {
        self.set(|r| r.mem_utilization = v);
    }

    /// Sets the queries per second.
    pub fn set_qps(&self, v: f64) {
        self.set(|r| r.rps_fractional = v);
    }

    /// Sets the errors per second.
    pub fn set_eps(&self, v: f64) {
        self.set(|r| r.eps = v);
    }

    /// Sets one named metric.
    pub fn set_named_metric(&self, name: impl Into<String>, v: f64) {
        self.set(|r| {
            r.named_metrics.insert(name.into(), v);
        });
    }

    /// A copy of the current report.
    pub fn snapshot(&self) -> OrcaLoadReport {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A tower `Layer` for a gRPC server: every response gets the server's
/// current [`ServerMetrics`] in its `endpoint-load-metrics-bin` trailer
/// (in the headers of a trailers-only response), read when the response
/// ends.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let metrics = tether::orca::ServerMetrics::new();
/// metrics.set_application_utilization(0.4);
/// metrics.set_qps(100.0);
/// tonic::transport::Server::builder()
///     .layer(tether::orca::LoadReportLayer::new(metrics.clone()))
///     // .add_service(...)
/// #   .add_routes(tonic::service::Routes::default())
///     .serve("127.0.0.1:50051".parse()?)
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct LoadReportLayer {
    metrics: ServerMetrics,
}

impl LoadReportLayer {
    /// A layer that reports `metrics`.
    pub fn new(metrics: ServerMetrics) -> Self {
        LoadReportLayer { metrics }
    }
}

impl<S> tower_layer::Layer<S> for LoadReportLayer {
    type Service = LoadReportService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadReportService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`LoadReportLayer`] makes.
#[derive(Debug, Clone)]
pub struct LoadReportService<S> {
    inner: S,
    metrics: ServerMetrics,
}

impl<S, Req, ResBody> tower_service::Service<Req> for LoadReportService<S>
where
    S: tower_service::Service<Req, Response = http::Response<ResBody>>,
{
    type Response = http::Response<LoadReportBody<ResBody>>;
    type Error = S::Error;
    type Future = LoadReportFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        LoadReportFuture {
            inner: self.inner.call(req),
            metrics: Some(self.metrics.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`LoadReportService`].
    pub struct LoadReportFuture<F> {
        #[pin]
        inner: F,
        metrics: Option<ServerMetrics>,
    }
}

impl<F, ResBody, E> std::future::Future for LoadReportFuture<F>
where
    F: std::future::Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<LoadReportBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let mut metrics = this.metrics.take();
        let (mut parts, body) = response.into_parts();
        if parts.headers.contains_key("grpc-status") {
            // Trailers-only: the headers are the trailers.
            if let Some(m) = metrics.take() {
                parts
                    .headers
                    .insert(PER_CALL_TRAILER, trailer_value(&m.snapshot()));
            }
        }
        Poll::Ready(Ok(http::Response::from_parts(
            parts,
            LoadReportBody {
                inner: body,
                metrics,
            },
        )))
    }
}

pin_project_lite::pin_project! {
    /// A response body whose trailers get the load report.
    pub struct LoadReportBody<B> {
        #[pin]
        inner: B,
        metrics: Option<ServerMetrics>,
    }
}

impl<B: HttpBody> HttpBody for LoadReportBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match std::task::ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_trailers() {
                Ok(mut trailers) => {
                    if let Some(m) = this.metrics.take() {
                        trailers.insert(PER_CALL_TRAILER, trailer_value(&m.snapshot()));
                    }
                    Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => Poll::Ready(other),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower_layer::Layer;
    use tower_service::Service;

    type Frames = std::vec::IntoIter<Result<Frame<bytes::Bytes>, std::convert::Infallible>>;

    /// A body of one data frame then trailers with `grpc-status: 0`.
    fn grpc_body() -> http_body_util::StreamBody<tokio_stream::Iter<Frames>> {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        http_body_util::StreamBody::new(tokio_stream::iter(vec![
            Ok(Frame::data(bytes::Bytes::from_static(b"hello"))),
            Ok(Frame::trailers(trailers)),
        ]))
    }

    #[test]
    fn trailer_round_trips_padded_or_not() {
        let report = OrcaLoadReport {
            cpu_utilization: 0.5,
            application_utilization: 0.25,
            rps_fractional: 12.5,
            eps: 1.0,
            ..Default::default()
        };
        let mut h = http::HeaderMap::new();
        h.insert(PER_CALL_TRAILER, trailer_value(&report));
        assert_eq!(report_from_trailers(&h), Some(report.clone()));
        let padded = base64::engine::general_purpose::STANDARD.encode(report.encode_to_vec());
        h.insert(PER_CALL_TRAILER, HeaderValue::from_str(&padded).unwrap());
        assert_eq!(report_from_trailers(&h), Some(report));
        h.insert(PER_CALL_TRAILER, HeaderValue::from_static("!!!"));
        assert_eq!(report_from_trailers(&h), None);
        assert_eq!(report_from_trailers(&http::HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn layer_adds_the_report_to_trailers() {
        let metrics = ServerMetrics::new();
        metrics.set_application_utilization(0.4);
        metrics.set_qps(100.0);
        let mut svc = LoadReportLayer::new(metrics.clone())
            .layer(tower_service_fn(|| http::Response::new(grpc_body())));
        // The values at the end of the call are reported.
        let response = svc.call(()).await.unwrap();
        metrics.set_application_utilization(0.8);
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().expect("trailers").clone();
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        let report = report_from_trailers(&trailers).expect("a report");
        assert_eq!(report.application_utilization, 0.8);
        assert_eq!(report.rps_fractional, 100.0);
    }

    #[tokio::test]
    async fn layer_reports_in_trailers_only_headers() {
        let metrics = ServerMetrics::new();
        metrics.set_cpu_utilization(0.3);
        let mut svc = LoadReportLayer::new(metrics).layer(tower_service_fn(|| {
            let mut r = http::Response::new(http_body_util::Empty::<bytes::Bytes>::new());
            r.headers_mut()
                .insert("grpc-status", HeaderValue::from_static("14"));
            r
        }));
        let response = svc.call(()).await.unwrap();
        let report = report_from_trailers(response.headers()).expect("a report");
        assert_eq!(report.cpu_utilization, 0.3);
    }

    /// A service answering every request with `f()`.
    fn tower_service_fn<B>(
        f: impl Fn() -> http::Response<B> + Clone,
    ) -> impl tower_service::Service<
        (),
        Response = http::Response<B>,
        Error = std::convert::Infallible,
        Future = std::future::Ready<Result<http::Response<B>, std::convert::Infallible>>,
    > {
        struct Fixed<F>(F);
        impl<F: Fn() -> http::Response<B>, B> tower_service::Service<()> for Fixed<F> {
            type Response = http::Response<B>;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<http::Response<B>, std::convert::Infallible>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: ()) -> Self::Future {
                std::future::ready(Ok((self.0)()))
            }
        }
        Fixed(f)
    }
}
