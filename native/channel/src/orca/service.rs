//! [`OrcaService`]: the server side of out-of-band load reporting
//! (gRFC A51), `xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`
//! served from a server's [`ServerMetrics`]: a report at once, then one per
//! interval the client asked for, never more often than the server's
//! minimum.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::STREAM_CORE_METRICS_PATH;
use super::{OrcaLoadReport, OrcaLoadReportRequest, ServerMetrics, SERVICE_NAME};

/// The shortest interval a server reports at unless told otherwise, as
/// gRPC's own servers (a client asking for less gets this).
pub const DEFAULT_MIN_REPORT_INTERVAL: Duration = Duration::from_secs(30);

/// The out-of-band load reporting service: add it to a tonic server beside
/// the application's services, and clients running `weighted_round_robin`
/// with `enable_oob_load_report` read the server's [`ServerMetrics`] from it.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let metrics = tether::orca::ServerMetrics::new();
/// metrics.set_cpu_utilization(0.4);
/// metrics.set_qps(100.0);
/// tonic::transport::Server::builder()
///     .add_service(tether::orca::OrcaService::new(metrics.clone()))
///     // .add_service(...) the application's own
///     .serve("127.0.0.1:50051".parse()?)
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct OrcaService {
    metrics: ServerMetrics,
    min_interval: Duration,
}

impl OrcaService {
    /// A service reporting `metrics`, at most every
    /// [`DEFAULT_MIN_REPORT_INTERVAL`].
    pub fn new(metrics: ServerMetrics) -> Self {
        OrcaService {
            metrics,
            min_interval: DEFAULT_MIN_REPORT_INTERVAL,
        }
    }

    /// Reports at most every `interval` whatever clients ask (tests and
    /// fast-moving loads want less than the default; zero is taken as 1 ms).
    pub fn min_report_interval(mut self, interval: Duration) -> Self {
        self.min_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The interval for a client's request: what it asked, or the minimum
    /// when that is shorter, unset or malformed.
    fn interval_for(&self, request: &OrcaLoadReportRequest) -> Duration {
        let asked = request
            .report_interval
            .as_ref()
            .filter(|d| d.seconds >= 0 && (0..1_000_000_000).contains(&d.nanos))
            .map(|d| Duration::new(d.seconds as u64, d.nanos as u32));
        asked.map_or(self.min_interval, |d| d.max(self.min_interval))
    }
}

impl tonic::server::NamedService for OrcaService {
    const NAME: &'static str = SERVICE_NAME;
}

/// Boxed response future of [`OrcaService`].
type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<tonic::body::Body>, Infallible>> + Send>>;

impl<B> tower_service::Service<http::Request<B>> for OrcaService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != STREAM_CORE_METRICS_PATH {
            let path = request.uri().path().to_owned();
            return Box::pin(async move {
                Ok(
                    Status::unimplemented(format!("{SERVICE_NAME} has no method {path}"))
                        .into_http(),
                )
            });
        }
        let streamer = Streamer(self.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.server_streaming(streamer, request).await)
        })
    }
}

/// One stream's handler.
struct Streamer(OrcaService);

impl tonic::server::ServerStreamingService<OrcaLoadReportRequest> for Streamer {
    type Response = OrcaLoadReport;
    type ResponseStream = Reports;
    type Future = std::future::Ready<Result<Response<Reports>, Status>>;

    fn call(&mut self, request: Request<OrcaLoadReportRequest>) -> Self::Future {
        let interval = self.0.interval_for(request.get_ref());
        log::debug!(
            "out-of-band load reports every {interval:?} to {:?}",
            request.remote_addr()
        );
        let mut ticks = tokio::time::interval(interval);
        // A slow reader gets the next report, not a burst of old ones.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        std::future::ready(Ok(Response::new(Reports {
            metrics: self.0.metrics.clone(),
            ticks,
        })))
    }
}

/// The reports of one stream: the first at once (an interval's first tick),
/// then one per tick, each the metrics at that moment.
pub struct Reports {
    metrics: ServerMetrics,
    ticks: tokio::time::Interval,
}

impl tokio_stream::Stream for Reports {
    type Item = Result<OrcaLoadReport, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        std::task::ready!(self.ticks.poll_tick(cx));
        Poll::Ready(Some(Ok(self.metrics.snapshot())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    fn asking(d: Option<PbDuration>) -> OrcaLoadReportRequest {
        OrcaLoadReportRequest {
            report_interval: d,
            request_cost_names: Vec::new(),
        }
    }

    #[test]
    fn the_interval_is_what_the_client_asks_but_never_below_the_minimum() {
        let s = OrcaService::new(ServerMetrics::new());
        let secs = |seconds, nanos| Some(PbDuration { seconds, nanos });
        assert_eq!(
            s.interval_for(&asking(secs(60, 0))),
            Duration::from_secs(60)
        );
        assert_eq!(
            s.interval_for(&asking(secs(1, 0))),
            DEFAULT_MIN_REPORT_INTERVAL
        );
        assert_eq!(s.interval_for(&asking(None)), DEFAULT_MIN_REPORT_INTERVAL);
        assert_eq!(
            s.interval_for(&asking(secs(-5, 0))),
            DEFAULT_MIN_REPORT_INTERVAL
        );
        assert_eq!(
            s.interval_for(&asking(secs(1, -1))),
            DEFAULT_MIN_REPORT_INTERVAL
        );
        let fast = s.min_report_interval(Duration::from_millis(50));
        assert_eq!(
            fast.interval_for(&asking(secs(0, 200_000_000))),
            Duration::from_millis(200)
        );
        assert_eq!(
            fast.interval_for(&asking(secs(0, 1))),
            Duration::from_millis(50)
        );
    }
}
