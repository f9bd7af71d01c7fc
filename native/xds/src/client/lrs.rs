//! The client's LRS stream (gRFC A27): started when the first cluster
//! with an `lrs_server` asks to report, on the same connection as the ADS
//! stream (the cluster's `lrs_server` is `self`), as C-core does.
//!
//! The first request carries the node (with the client feature
//! `envoy.lrs.supports_send_all_clusters`); the server answers which
//! clusters it wants, how often, and whether per endpoint; then a report
//! goes out every interval, each covering the time since the previous one
//! (as C-core: one all-zero report when the load stops, none after it
//! until there is load again).
//! A stream that ends is opened again after a backoff (reset once the
//! server has answered), and its first report covers from the new
//! answer.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::load_stats::v3::{
    load_reporting_service_client::LoadReportingServiceClient, LoadStatsRequest, LoadStatsResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::backoff::Backoff;
use crate::load_report::{LoadStore, ReportPlan};

/// The client feature saying the client honours `send_all_clusters`.
pub const SEND_ALL_CLUSTERS: &str = "envoy.lrs.supports_send_all_clusters";

/// The shortest interval taken from a server (a smaller one is raised to it).
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// What the LRS task needs.
pub(super) struct Lrs {
    pub channel: Channel,
    pub node: Node,
    pub store: LoadStore,
    pub server_uri: String,
    /// Call credentials (gRFC A97), sent only over TLS.
    pub call_creds: Vec<crate::call_creds::JwtTokenFile>,
    pub secure: bool,
    pub backoff: Backoff,
}

impl Lrs {
    /// Runs streams until the task is aborted (the client dropped).
    pub async fn run(mut self) {
        let mut node = self.node.clone();
        if !node.client_features.iter().any(|f| f == SEND_ALL_CLUSTERS) {
            node.client_features.push(SEND_ALL_CLUSTERS.to_owned());
        }
        loop {
            let answered = self.stream(&node).await;
            if answered {
                self.backoff.reset();
            }
            tokio::time::sleep(self.backoff.next_delay()).await;
        }
    }

    /// One stream; whether the server answered on it.
    async fn stream(&self, node: &Node) -> bool {
        let (tx, rx) = mpsc::channel::<LoadStatsRequest>(4);
        let _ = tx
            .send(LoadStatsRequest {
                node: Some(node.clone()),
                cluster_stats: Vec::new(),
            })
            .await;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Err(status) = self.authorize(request.metadata_mut()) {
            log::warn!("LRS to {}: {}", self.server_uri, status.message());
            return false;
        }
        let mut client = LoadReportingServiceClient::new(self.channel.clone());
        let mut inbound = match client.stream_load_stats(request).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                log::debug!("LRS to {}: {}", self.server_uri, status.message());
                return false;
            }
        };
        let mut answered = false;
        let mut last_zero = false;
        let mut plan: Option<(ReportPlan, Duration)> = None;
        let mut next = tokio::time::Instant::now();
        loop {
            let tick = async {
                match plan {
                    Some(_) => tokio::time::sleep_until(next).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                message = inbound.message() => match message {
                    Ok(Some(response)) => {
                        let (p, interval) = read_response(&response);
                        log::debug!(
                            "LRS to {}: report {} every {interval:?}{}",
                            self.server_uri,
                            if p.all { "every cluster".to_owned() } else { p.clusters.join(", ") },
                            if p.per_endpoint { ", per endpoint" } else { "" }
                        );
                        if !answered {
                            // The first report covers from the server's answer.
                            self.store.restart(std::time::Instant::now());
                            answered = true;
                        }
                        next = tokio::time::Instant::now() + interval;
                        plan = Some((p, interval));
                    }
                    Ok(None) => return answered,
                    Err(status) => {
                        log::debug!("LRS to {}: stream ended: {}", self.server_uri, status.message());
                        return answered;
                    }
                },
                () = tick => {
                    let Some((p, interval)) = &plan else { continue };
                    next += *interval;
                    let (stats, zero) = self.store.report(p, std::time::Instant::now());
                    // As C-core: one all-zero report says the load stopped;
                    // more would say nothing new.
                    if zero && last_zero {
                        continue;
                    }
                    last_zero = zero;
                    let request = LoadStatsRequest { node: None, cluster_stats: stats };
                    if tx.send(request).await.is_err() {
                        return answered;
                    }
                }
            }
        }
    }

    /// Adds the call credentials' headers, as on the ADS stream.
    fn authorize(&self, metadata: &mut tonic::metadata::MetadataMap) -> Result<(), tonic::Status> {
        crate::call_creds::authorize(&self.call_creds, self.secure, metadata)
    }
}

/// The plan and interval a server's answer asks for.
fn read_response(r: &LoadStatsResponse) -> (ReportPlan, Duration) {
    let interval = r
        .load_reporting_interval
        .as_ref()
        .and_then(|d| {
            let secs = u64::try_from(d.seconds).ok()?;
            let nanos = u32::try_from(d.nanos).ok()?;
            Some(Duration::new(secs, nanos))
        })
        .unwrap_or(Duration::from_secs(10))
        .max(MIN_INTERVAL);
    (
        ReportPlan {
            all: r.send_all_clusters,
            clusters: r.clusters.clone(),
            per_endpoint: r.report_endpoint_granularity,
        },
        interval,
    )
}
