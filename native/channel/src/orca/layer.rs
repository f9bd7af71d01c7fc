//! [`LoadReportLayer`]: a tonic server's per-call load reports (gRFC A51),
//! the server's current [`ServerMetrics`] in every response's
//! `endpoint-load-metrics-bin` trailer.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body as HttpBody, Frame};

use super::{trailer_value, ServerMetrics, PER_CALL_TRAILER};

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
    use crate::orca::report_from_trailers;
    use http::HeaderValue;
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
