//! The load reports clients sent lately, as they sent them (`GET /load` on
//! the admin listener): per node, the last [`KEPT`] reports tether-control
//! accepted (a report, or the part of it, refused as absurd or for a
//! cluster the client was not asked about is not kept), each with a
//! sequence number, when it came and every figure it carries. The drain
//! verdicts ([`crate::load`]) read the latest report only; this log lets an
//! operator (or a test) see what a client counted interval by interval.
//!
//! Bounded: a node keeps at most [`KEPT`] reports and [`BYTES_KEPT`] bytes
//! of them (encoded as they came, so a fleet of clients with many clusters
//! keeps fewer each); a node whose last LRS stream ended is kept for
//! [`GONE_SHOWN`], at most [`GONE_KEPT`] such nodes. Reports are kept
//! encoded and decoded only when the page is asked for.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::service::load_stats::v3::LoadStatsRequest;
use prost::Message;
use serde::Serialize;

/// Reports kept per node.
pub const KEPT: usize = 32;
/// Bytes of encoded reports kept per node: 16 MiB for 1,000 clients (each
/// reporting 10 clusters of 6 endpoints keeps about 8 of its 2 kB
/// reports).
pub const BYTES_KEPT: usize = 16 * 1024;
/// How long a node whose LRS streams ended stays listed.
pub const GONE_SHOWN: Duration = Duration::from_secs(600);
/// Nodes whose LRS streams ended kept at most (the earliest gone go first).
pub const GONE_KEPT: usize = 100;

/// One report as it came.
#[derive(Debug, Clone)]
struct Entry {
    seq: u64,
    stream: u64,
    at: Instant,
    /// The accepted clusters' stats, encoded as a `LoadStatsRequest`; or
    /// its size, when larger than [`BYTES_KEPT`] alone.
    body: Result<Arc<[u8]>, usize>,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.body.as_ref().map_or(0, |b| b.len())
    }
}

#[derive(Debug, Default)]
struct Node {
    /// Its open LRS streams.
    streams: BTreeSet<u64>,
    /// When its last stream ended, while none is open.
    gone_at: Option<Instant>,
    reports: VecDeque<Entry>,
    bytes: usize,
}

/// Every node's recent reports.
#[derive(Debug, Default)]
pub struct ReportLog {
    nodes: HashMap<String, Node>,
    /// Open streams' nodes.
    streams: HashMap<u64, String>,
    /// Nodes without an open stream, in the order they went (a node back
    /// since has a `gone_at` of its own or none: the entry is stale).
    gone: VecDeque<(Instant, String)>,
    /// The last sequence number given.
    seq: u64,
}

impl ReportLog {
    /// LRS stream `stream` of `node` opened.
    pub fn open(&mut self, stream: u64, node: &str, now: Instant) {
        self.streams.insert(stream, node.to_owned());
        let n = self.nodes.entry(node.to_owned()).or_default();
        n.streams.insert(stream);
        n.gone_at = None;
        self.forget_gone(now);
    }

    /// LRS stream `stream` ended.
    pub fn close(&mut self, stream: u64, now: Instant) {
        let Some(node) = self.streams.remove(&stream) else {
            return;
        };
        if let Some(n) = self.nodes.get_mut(&node) {
            n.streams.remove(&stream);
            if n.streams.is_empty() {
                n.gone_at = Some(now);
                self.gone.push_back((now, node));
            }
        }
        self.forget_gone(now);
    }

    /// Keeps `body` (the accepted clusters' stats of a report, encoded as
    /// a `LoadStatsRequest`) as stream `stream`'s latest report; returns
    /// its sequence number.
    pub fn record(&mut self, stream: u64, body: Vec<u8>, now: Instant) -> Option<u64> {
        let node = self.streams.get(&stream)?;
        let n = self.nodes.get_mut(node)?;
        self.seq += 1;
        let body = if body.len() > BYTES_KEPT {
            Err(body.len())
        } else {
            Ok(Arc::from(body))
        };
        let entry = Entry {
            seq: self.seq,
            stream,
            at: now,
            body,
        };
        n.bytes += entry.bytes();
        n.reports.push_back(entry);
        while n.reports.len() > KEPT || n.bytes > BYTES_KEPT {
            let Some(old) = n.reports.pop_front() else {
                break;
            };
            n.bytes -= old.bytes();
        }
        Some(self.seq)
    }

    /// Forgets the nodes gone longer than [`GONE_SHOWN`], and the earliest
    /// gone beyond [`GONE_KEPT`].
    fn forget_gone(&mut self, now: Instant) {
        while let Some((at, node)) = self.gone.front() {
            let current = self.nodes.get(node).and_then(|n| n.gone_at) == Some(*at);
            let expired = now.saturating_duration_since(*at) >= GONE_SHOWN;
            if current && !expired && self.gone.len() <= GONE_KEPT {
                break;
            }
            if current {
                self.nodes.remove(node);
            }
            self.gone.pop_front();
        }
    }

    /// What `GET /load` shows at `now`: every node's reports, or
    /// `node`'s only. Takes copies of the handles only: the reports are
    /// decoded by [`Kept::page`], outside the caller's lock.
    pub fn kept(&self, node: Option<&str>, now: Instant) -> Kept {
        let mut clients: Vec<KeptNode> = self
            .nodes
            .iter()
            .filter(|(name, _)| node.is_none_or(|want| want == name.as_str()))
            .filter(|(_, n)| {
                n.gone_at
                    .is_none_or(|at| now.saturating_duration_since(at) < GONE_SHOWN)
            })
            .map(|(name, n)| KeptNode {
                node: name.clone(),
                streams: n.streams.len(),
                gone_at: n.gone_at,
                reports: n.reports.iter().cloned().collect(),
            })
            .collect();
        clients.sort_by(|a, b| a.node.cmp(&b.node));
        Kept {
            at: now,
            last_seq: self.seq,
            clients,
        }
    }
}

/// A copy of the kept reports, to make the page from.
#[derive(Debug, Clone)]
pub struct Kept {
    at: Instant,
    last_seq: u64,
    clients: Vec<KeptNode>,
}

#[derive(Debug, Clone)]
struct KeptNode {
    node: String,
    streams: usize,
    gone_at: Option<Instant>,
    reports: Vec<Entry>,
}

/// `GET /load`: these names are a contract.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LoadPage {
    /// What it covers: this replica's clients.
    pub scope: &'static str,
    /// The sequence number of the latest report taken (from any node):
    /// the reports after a moment are those numbered above its figure.
    pub last_seq: u64,
    /// Reports kept per node at most ([`KEPT`]).
    pub reports_kept: usize,
    /// Bytes of reports kept per node at most ([`BYTES_KEPT`]).
    pub bytes_kept: usize,
    /// Each node (connected, or gone within [`GONE_SHOWN`]), by name.
    pub clients: Vec<ClientReports>,
}

/// One node's kept reports.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClientReports {
    /// Its node ID.
    pub node: String,
    /// Whether it has an LRS stream open.
    pub connected: bool,
    /// Its open LRS streams.
    pub lrs_streams: usize,
    /// Seconds since its last stream ended, when none is open.
    pub gone_for_s: Option<f64>,
    /// Its reports, oldest first.
    pub reports: Vec<ReportView>,
}

/// One report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReportView {
    /// Its number: taken in this order, across nodes.
    pub seq: u64,
    /// The LRS stream it came on.
    pub stream: u64,
    /// Seconds since it came.
    pub received_s_ago: f64,
    /// Its size in bytes when too large to keep (its figures are then
    /// not shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub too_large_bytes: Option<usize>,
    /// Its clusters' figures.
    pub clusters: Vec<ClusterView>,
}

/// One cluster's figures in a report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClusterView {
    /// The cluster's name.
    pub cluster: String,
    /// Its EDS service name (`cluster_service_name`), empty when not said.
    pub service: String,
    /// The interval the figures cover, as the client said, in seconds.
    pub interval_s: Option<f64>,
    /// Calls dropped, every category and none.
    pub total_dropped_requests: u64,
    /// Calls dropped per category.
    pub dropped: BTreeMap<String, u64>,
    /// Per locality.
    pub localities: Vec<LocalityView>,
}

/// One locality's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LocalityView {
    /// `region/zone/sub_zone`.
    pub locality: String,
    /// Its priority, as the client said.
    pub priority: u32,
    /// The call figures.
    #[serde(flatten)]
    pub calls: Calls,
    /// Named metrics: name → figures.
    pub load_metric_stats: BTreeMap<String, MetricView>,
    /// ORCA's CPU utilization, when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_utilization: Option<MetricView>,
    /// ORCA's memory utilization, when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_utilization: Option<MetricView>,
    /// ORCA's application utilization, when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub application_utilization: Option<MetricView>,
    /// Per endpoint, when the client reports so.
    pub endpoints: Vec<EndpointView>,
}

/// One endpoint's figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointView {
    /// `IP:PORT` (or the address as reported, when not one).
    pub address: String,
    /// The call figures.
    #[serde(flatten)]
    pub calls: Calls,
    /// Named metrics: name → figures.
    pub load_metric_stats: BTreeMap<String, MetricView>,
}

/// Calls, as LRS counts them.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Calls {
    /// Issued in the interval (`total_issued_requests`).
    pub issued: u64,
    /// Finished OK in the interval (`total_successful_requests`).
    pub succeeded: u64,
    /// Finished otherwise in the interval (`total_error_requests`).
    pub failed: u64,
    /// In progress at the report (`total_requests_in_progress`).
    pub in_progress: u64,
}

/// A metric's figures: calls that carried it, and its values' sum.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct MetricView {
    /// `num_requests_finished_with_metric`.
    pub num: u64,
    /// `total_metric_value`.
    pub total: f64,
}

impl Kept {
    /// The page.
    pub fn page(&self) -> LoadPage {
        let since = |at: Instant| seconds(self.at.saturating_duration_since(at));
        LoadPage {
            scope: crate::load::SCOPE,
            last_seq: self.last_seq,
            reports_kept: KEPT,
            bytes_kept: BYTES_KEPT,
            clients: self
                .clients
                .iter()
                .map(|c| ClientReports {
                    node: c.node.clone(),
                    connected: c.streams > 0,
                    lrs_streams: c.streams,
                    gone_for_s: c.gone_at.map(since),
                    reports: c
                        .reports
                        .iter()
                        .map(|e| {
                            let (too_large_bytes, clusters) = match &e.body {
                                Ok(body) => (None, clusters(body)),
                                Err(size) => (Some(*size), Vec::new()),
                            };
                            ReportView {
                                seq: e.seq,
                                stream: e.stream,
                                received_s_ago: since(e.at),
                                too_large_bytes,
                                clusters,
                            }
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

fn clusters(body: &[u8]) -> Vec<ClusterView> {
    // Encoded here from a decoded message: it decodes.
    let request = LoadStatsRequest::decode(body).unwrap_or_default();
    request.cluster_stats.iter().map(cluster).collect()
}

fn cluster(c: &epb::ClusterStats) -> ClusterView {
    let mut dropped = BTreeMap::new();
    for d in &c.dropped_requests {
        *dropped.entry(d.category.clone()).or_default() += d.dropped_count;
    }
    ClusterView {
        cluster: c.cluster_name.clone(),
        service: c.cluster_service_name.clone(),
        interval_s: c
            .load_report_interval
            .as_ref()
            .map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9),
        total_dropped_requests: c.total_dropped_requests,
        dropped,
        localities: c
            .upstream_locality_stats
            .iter()
            .map(|l| LocalityView {
                locality: crate::lrs::locality_key(l.locality.as_ref()),
                priority: l.priority,
                calls: Calls {
                    issued: l.total_issued_requests,
                    succeeded: l.total_successful_requests,
                    failed: l.total_error_requests,
                    in_progress: l.total_requests_in_progress,
                },
                load_metric_stats: metrics(&l.load_metric_stats),
                cpu_utilization: l.cpu_utilization.as_ref().map(unnamed),
                mem_utilization: l.mem_utilization.as_ref().map(unnamed),
                application_utilization: l.application_utilization.as_ref().map(unnamed),
                endpoints: l
                    .upstream_endpoint_stats
                    .iter()
                    .map(|e| EndpointView {
                        address: crate::lrs::socket_address(e.address.as_ref())
                            .map_or_else(|| format!("{:?}", e.address), |a| a.to_string()),
                        calls: Calls {
                            issued: e.total_issued_requests,
                            succeeded: e.total_successful_requests,
                            failed: e.total_error_requests,
                            in_progress: e.total_requests_in_progress,
                        },
                        load_metric_stats: metrics(&e.load_metric_stats),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Named metrics by name (a name given twice: its figures added up).
fn metrics(stats: &[epb::EndpointLoadMetricStats]) -> BTreeMap<String, MetricView> {
    let mut out: BTreeMap<String, MetricView> = BTreeMap::new();
    for m in stats {
        let e = out
            .entry(m.metric_name.clone())
            .or_insert(MetricView { num: 0, total: 0.0 });
        e.num = e.num.saturating_add(m.num_requests_finished_with_metric);
        e.total += m.total_metric_value;
    }
    out
}

fn unnamed(m: &epb::UnnamedEndpointLoadMetricStats) -> MetricView {
    MetricView {
        num: m.num_requests_finished_with_metric,
        total: m.total_metric_value,
    }
}

fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3 as core;

    fn body(issued: u64, padding: usize) -> Vec<u8> {
        LoadStatsRequest {
            node: None,
            cluster_stats: vec![epb::ClusterStats {
                cluster_name: "x".repeat(padding.max(1)),
                cluster_service_name: "shop".into(),
                total_dropped_requests: 3,
                dropped_requests: vec![epb::cluster_stats::DroppedRequests {
                    category: "lb".into(),
                    dropped_count: 2,
                }],
                upstream_locality_stats: vec![epb::UpstreamLocalityStats {
                    locality: Some(core::Locality {
                        region: "us".into(),
                        zone: "a".into(),
                        ..Default::default()
                    }),
                    total_issued_requests: issued,
                    total_successful_requests: issued,
                    load_metric_stats: vec![epb::EndpointLoadMetricStats {
                        metric_name: "tether.sessions".into(),
                        num_requests_finished_with_metric: 1,
                        total_metric_value: 4.0,
                    }],
                    cpu_utilization: Some(epb::UnnamedEndpointLoadMetricStats {
                        num_requests_finished_with_metric: 2,
                        total_metric_value: 0.5,
                    }),
                    ..Default::default()
                }],
                load_report_interval: Some(envoy_types::pb::google::protobuf::Duration {
                    seconds: 1,
                    nanos: 500_000_000,
                }),
            }],
        }
        .encode_to_vec()
    }

    #[test]
    fn the_last_reports_of_each_node_are_kept_numbered_with_every_figure() {
        let t0 = Instant::now();
        let mut log = ReportLog::default();
        log.open(1, "a", t0);
        log.open(2, "b", t0);
        for issued in 0..(KEPT as u64 + 5) {
            log.record(1, body(issued, 1), t0);
        }
        assert_eq!(log.record(2, body(7, 1), t0), Some(KEPT as u64 + 6));
        assert_eq!(log.record(99, body(7, 1), t0), None, "no such stream");
        let page = log.kept(None, t0 + Duration::from_secs(2)).page();
        assert_eq!(page.last_seq, KEPT as u64 + 6);
        let a = &page.clients[0];
        assert_eq!((a.node.as_str(), a.connected), ("a", true));
        assert_eq!(a.reports.len(), KEPT, "the oldest dropped");
        assert_eq!(a.reports[0].seq, 6);
        assert_eq!(a.reports[0].received_s_ago, 2.0);
        let c = &a.reports[KEPT - 1].clusters[0];
        assert_eq!(c.service, "shop");
        assert_eq!(c.interval_s, Some(1.5));
        assert_eq!(c.total_dropped_requests, 3);
        assert_eq!(c.dropped["lb"], 2);
        let l = &c.localities[0];
        assert_eq!(l.locality, "us/a/");
        assert_eq!(l.calls.issued, KEPT as u64 + 4);
        assert_eq!(l.load_metric_stats["tether.sessions"].total, 4.0);
        assert_eq!(l.cpu_utilization.map(|m| m.num), Some(2));
        assert!(l.mem_utilization.is_none());
        let only_b = log.kept(Some("b"), t0).page();
        assert_eq!(only_b.clients.len(), 1);
        assert_eq!(only_b.clients[0].reports[0].seq, KEPT as u64 + 6);
        // Absent figures are left out of the JSON.
        let json = serde_json::to_value(&only_b).unwrap();
        let l = &json["clients"][0]["reports"][0]["clusters"][0]["localities"][0];
        assert!(l.get("mem_utilization").is_none(), "{l}");
        assert_eq!(l["issued"], 7, "{l}");
    }

    #[test]
    fn memory_is_bounded_per_node_and_gone_nodes_are_forgotten() {
        let t0 = Instant::now();
        let mut log = ReportLog::default();
        log.open(1, "a", t0);
        // Reports of a quarter of the budget: four kept at most.
        for _ in 0..10 {
            log.record(1, body(1, BYTES_KEPT / 4), t0);
        }
        let page = log.kept(Some("a"), t0).page();
        assert!(
            page.clients[0].reports.len() < 4,
            "{}",
            page.clients[0].reports.len()
        );
        // One larger than the budget: its size only.
        log.record(1, body(1, BYTES_KEPT + 1), t0);
        let page = log.kept(Some("a"), t0).page();
        let last = page.clients[0].reports.last().unwrap();
        assert!(last.too_large_bytes.is_some_and(|n| n > BYTES_KEPT));
        assert!(last.clusters.is_empty());
        // The node leaves: listed, then forgotten.
        log.close(1, t0 + Duration::from_secs(1));
        let page = log.kept(None, t0 + Duration::from_secs(2)).page();
        assert!(!page.clients[0].connected);
        assert_eq!(page.clients[0].gone_for_s, Some(1.0));
        assert!(log
            .kept(None, t0 + GONE_SHOWN * 2)
            .page()
            .clients
            .is_empty());
        // Back within the time: its reports are still there.
        log.open(3, "a", t0 + Duration::from_secs(3));
        assert!(!log.kept(Some("a"), t0).page().clients[0].reports.is_empty());
        log.close(3, t0 + Duration::from_secs(3));
        // At most GONE_KEPT gone nodes: the earliest gone go first.
        for i in 0..(GONE_KEPT as u64 + 10) {
            log.open(100 + i, &format!("n{i:03}"), t0 + Duration::from_secs(4));
            log.close(100 + i, t0 + Duration::from_secs(4));
        }
        let page = log.kept(None, t0 + Duration::from_secs(5)).page();
        assert_eq!(page.clients.len(), GONE_KEPT);
        assert!(page
            .clients
            .iter()
            .all(|c| c.node != "a" && c.node != "n000"));
        assert!(log.gone.len() <= GONE_KEPT);
    }
}
