//! [`OobStream`]: the client side of out-of-band load reporting (gRFC
//! A51). One `StreamCoreMetrics` stream on a subchannel's connection, each
//! report handed to the policy that started it. A failed stream is opened
//! again after gRPC's connection backoff (reset once a stream delivered a
//! report), on the subchannel's next connection if this one is gone; a
//! server without the service (UNIMPLEMENTED) is not asked again, as gRPC
//! clients give up on it too. Dropping the stream ends it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::{Code, Status};

use super::{OrcaLoadReport, OrcaLoadReportRequest, STREAM_CORE_METRICS_PATH};
use crate::subchannel::backoff::{Backoff, BackoffConfig};
use crate::subchannel::{Connection, Subchannel};

/// What a stream does with each report.
pub type ReportSink = Arc<dyn Fn(&OrcaLoadReport) + Send + Sync>;

/// An out-of-band reporting stream kept open on one subchannel.
#[derive(Debug)]
pub struct OobStream {
    task: tokio::task::AbortHandle,
}

impl OobStream {
    /// Opens the stream on `subchannel` (now, or once it is READY), asking
    /// for a report every `interval`; `sink` gets each report.
    pub fn start(subchannel: Subchannel, interval: Duration, sink: ReportSink) -> Self {
        let task = tokio::spawn(run(subchannel, interval, sink));
        OobStream {
            task: task.abort_handle(),
        }
    }
}

impl Drop for OobStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(subchannel: Subchannel, interval: Duration, sink: ReportSink) {
    let address = subchannel.address();
    let mut backoff = Backoff::new(BackoffConfig::default());
    let mut state = subchannel.watch();
    loop {
        let Some(connection) = subchannel.connection() else {
            // Not READY: wait for the subchannel to change (the policy
            // ends this stream when its endpoint leaves READY for good).
            if state.changed().await.is_err() {
                return;
            }
            continue;
        };
        let mut reported = false;
        match stream(connection, address, interval, &sink, &mut reported).await {
            Ok(()) => log::debug!("{address}: out-of-band load report stream ended"),
            Err(status) if status.code() == Code::Unimplemented => {
                log::warn!(
                    "{address} does not serve out-of-band load reports ({}); its weight stays unknown",
                    status.message()
                );
                return;
            }
            Err(status) => log::debug!("{address}: out-of-band load report stream: {status}"),
        }
        if reported {
            backoff.reset();
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// One stream, until it ends.
async fn stream(
    connection: Connection,
    address: std::net::SocketAddr,
    interval: Duration,
    sink: &ReportSink,
    reported: &mut bool,
) -> Result<(), Status> {
    let origin: http::Uri = format!("http://{address}")
        .parse()
        .map_err(|e| Status::internal(format!("origin for {address}: {e}")))?;
    let mut grpc = tonic::client::Grpc::with_origin(ConnectionService(connection), origin);
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
    let request = OrcaLoadReportRequest {
        report_interval: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: interval.as_secs() as i64,
            nanos: interval.subsec_nanos() as i32,
        }),
        request_cost_names: Vec::new(),
    };
    let mut reports = grpc
        .server_streaming(
            tonic::Request::new(request),
            PathAndQuery::from_static(STREAM_CORE_METRICS_PATH),
            tonic_prost::ProstCodec::default(),
        )
        .await?
        .into_inner();
    while let Some(report) = reports.message().await? {
        log::trace!("{address}: out-of-band load report {report:?}");
        *reported = true;
        sink(&report);
    }
    Ok(())
}

/// A subchannel's connection as the tower service tonic's client sends on.
#[derive(Clone)]
struct ConnectionService(Connection);

type SendFuture = Pin<
    Box<dyn Future<Output = Result<http::Response<hyper::body::Incoming>, hyper::Error>> + Send>,
>;

impl tower_service::Service<http::Request<tonic::body::Body>> for ConnectionService {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = SendFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // `Connection::send` waits for the connection's stream capacity.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let connection = self.0.clone();
        Box::pin(async move { connection.send(request).await.map_err(|e| e.error) })
    }
}
