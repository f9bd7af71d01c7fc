//! The load reporting service (LRS, gRFC A27) on the ADS port: a client
//! opens a stream, tether-control answers with the clusters whose services
//! ask for load reports (`loadReporting`), their interval and
//! `report_endpoint_granularity`, and each report updates the drain
//! status ([`crate::load`]). The answer is sent again when the snapshot
//! changes what the client should report. A report for a cluster nobody
//! asked about, or with figures no client could have counted, is logged
//! and left out. The clusters accepted are also kept as they came, for
//! `GET /load` ([`crate::reports`]); the ones left out are not.
//!
//! An endpoint's `tether.sessions` named metric (tether's channel sends
//! it: one "request" whose value is the sessions it pins there) becomes
//! [`EndpointLoad::sessions`]; a value no client could hold (negative, not
//! a number, 10^12 or more) is logged and ignored, the rest of the report
//! kept.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::service::load_stats::v3::load_reporting_service_server::{
    LoadReportingService, LoadReportingServiceServer,
};
use envoy_types::pb::envoy::service::load_stats::v3::{LoadStatsRequest, LoadStatsResponse};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::load::{ClusterReport, DrainingEndpoint, EndpointLoad};
use crate::server::{ControlPlane, Snapshot};
use crate::translate::Flavor;
use tether_xds::load_report::SESSIONS_METRIC;
use tether_xds::resource::ResourceKind;

/// The interval asked for when no service asks for reports (clients then
/// report nothing: the cluster list is empty).
const IDLE_INTERVAL: Duration = Duration::from_secs(10);

/// More requests than any client counts in one interval: such a report is
/// refused rather than let skew a verdict.
const ABSURD: u64 = 1_000_000_000_000;

/// The LRS service of a control plane.
#[derive(Debug, Clone)]
pub struct LrsService {
    plane: ControlPlane,
}

impl LrsService {
    /// The service answering for `plane`.
    pub fn new(plane: ControlPlane) -> LoadReportingServiceServer<LrsService> {
        LoadReportingServiceServer::new(LrsService { plane })
    }
}

type ResponseStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<LoadStatsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl LoadReportingService for LrsService {
    type StreamLoadStatsStream = ResponseStream;

    async fn stream_load_stats(
        &self,
        request: Request<Streaming<LoadStatsRequest>>,
    ) -> Result<Response<Self::StreamLoadStatsStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let plane = self.plane.clone();
        tokio::spawn(run(plane, request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// What one stream's client is asked under one snapshot, made once per
/// snapshot (the clusters decoded once, not on every report).
struct Plan {
    /// The EDS service of each cluster the client may report, by name.
    services: BTreeMap<String, String>,
    /// The response asking for the reporting services' clusters.
    answer: LoadStatsResponse,
}

impl Plan {
    /// What a client of `flavor` is asked to report under `snapshot`.
    fn new(snapshot: &Snapshot, flavor: Flavor, node: &str) -> Plan {
        let reporting = &snapshot.resources.load_reporting;
        let mut services = BTreeMap::new();
        let mut clusters = Vec::new();
        let mut interval: Option<Duration> = None;
        let resources = snapshot.resources.for_node(flavor, node);
        for (name, any) in resources.get(&ResourceKind::Cluster).into_iter().flatten() {
            let Ok(cluster) = cpb::Cluster::decode(any.value.as_slice()) else {
                continue;
            };
            let Some(service) = cluster.eds_cluster_config.map(|e| e.service_name) else {
                continue;
            };
            if let Some(every) = reporting.get(&service) {
                clusters.push(name.clone());
                interval = Some(interval.map_or(*every, |i| i.min(*every)));
            }
            services.insert(name.clone(), service);
        }
        let every = interval.unwrap_or(IDLE_INTERVAL);
        let answer = LoadStatsResponse {
            clusters,
            send_all_clusters: false,
            load_reporting_interval: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: every.as_secs() as i64,
                nanos: every.subsec_nanos() as i32,
            }),
            report_endpoint_granularity: true,
        };
        Plan { services, answer }
    }
}

async fn run(
    plane: ControlPlane,
    mut inbound: Streaming<LoadStatsRequest>,
    tx: mpsc::Sender<Result<LoadStatsResponse, Status>>,
) {
    let stream = plane.next_stream_id();
    let mut snapshots = plane.subscribe();
    let mut node = None::<(String, Flavor)>;
    // The plan for the latest snapshot, and the response last sent.
    let mut plan: Option<Plan> = None;
    let mut asked: Option<LoadStatsResponse> = None;
    loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(request)) => {
                    if node.is_none() {
                        let n = request.node.clone().unwrap_or_default();
                        let flavor = if n.user_agent_name == "envoy" { Flavor::Envoy } else { Flavor::Proxyless };
                        log::info!("load reports from node {:?}", n.id);
                        plane.load(|l| l.log().open(stream, &n.id, Instant::now()));
                        node = Some((n.id, flavor));
                    }
                    let Some((id, flavor)) = &node else { continue };
                    let current = plan.get_or_insert_with(|| {
                        Plan::new(&snapshots.borrow_and_update(), *flavor, id)
                    });
                    record(&plane, stream, id, &current.services, &request);
                }
                Ok(None) | Err(_) => break,
            },
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break;
                }
                let Some((id, flavor)) = &node else { continue };
                plan = Some(Plan::new(&snapshots.borrow_and_update(), *flavor, id));
            }
        }
        if let Some(current) = &plan {
            if asked.as_ref() != Some(&current.answer) {
                if tx.send(Ok(current.answer.clone())).await.is_err() {
                    break;
                }
                asked = Some(current.answer.clone());
            }
        }
    }
    if let Some((id, _)) = &node {
        log::info!("load reports from node {id:?} ended");
    }
    plane.load(|l| l.stop_reporting(stream, Instant::now()));
}

/// Records what `request` reports of each service: a service's clusters
/// (one per strategy its routes use, all over its one EDS resource) are
/// added up, so that an idle cluster never hides a busy one.
fn record(
    plane: &ControlPlane,
    stream: u64,
    node: &str,
    services: &BTreeMap<String, String>,
    request: &LoadStatsRequest,
) {
    let now = Instant::now();
    let mut by_service: BTreeMap<String, ClusterReport> = BTreeMap::new();
    // The accepted clusters' stats as a `LoadStatsRequest`'s (field 2),
    // for `GET /load`: encoded here, outside the lock.
    let mut accepted = Vec::new();
    for stats in &request.cluster_stats {
        let service = if stats.cluster_service_name.is_empty() {
            services.get(&stats.cluster_name).cloned()
        } else {
            Some(stats.cluster_service_name.clone())
        };
        let Some(service) = service.filter(|s| services.values().any(|v| v == s)) else {
            log::debug!(
                "node {node:?} reported load for cluster {:?} ({:?}), which it was not given: left out",
                stats.cluster_name,
                stats.cluster_service_name
            );
            continue;
        };
        match report(node, stats) {
            Ok(r) => {
                by_service.entry(service).or_default().add(r);
                prost::encoding::message::encode(2, stats, &mut accepted);
            }
            Err(why) => log::warn!(
                "node {node:?} reported load for cluster {:?} that is left out: {why}",
                stats.cluster_name
            ),
        }
    }
    plane.load(|l| {
        if !accepted.is_empty() {
            l.log().record(stream, accepted, now);
        }
        for (service, r) in by_service {
            l.report(stream, node, &service, r, now);
        }
    });
}

/// One cluster's stats from `node` as the verdicts read them.
fn report(node: &str, stats: &epb::ClusterStats) -> Result<ClusterReport, String> {
    let mut out = ClusterReport::default();
    for l in &stats.upstream_locality_stats {
        let load = l
            .total_issued_requests
            .checked_add(l.total_requests_in_progress)
            .filter(|n| *n < ABSURD)
            .ok_or_else(|| {
                format!(
                    "locality {:?}: {} issued and {} in progress",
                    locality_key(l.locality.as_ref()),
                    l.total_issued_requests,
                    l.total_requests_in_progress
                )
            })?;
        *out.localities
            .entry(locality_key(l.locality.as_ref()))
            .or_default() += load;
        for e in &l.upstream_endpoint_stats {
            let Some(address) = socket_address(e.address.as_ref()) else {
                return Err(format!("endpoint address {:?} is not IP:PORT", e.address));
            };
            let requests = e
                .total_issued_requests
                .checked_add(e.total_requests_in_progress)
                .filter(|n| *n < ABSURD)
                .ok_or_else(|| format!("endpoint {address}: {} issued", e.total_issued_requests))?;
            let endpoints = out.endpoints.get_or_insert_with(BTreeMap::new);
            let entry: &mut EndpointLoad = endpoints.entry(address).or_default();
            entry.requests += requests;
            match sessions(&e.load_metric_stats) {
                Ok(None) => {}
                Ok(Some(n)) => entry.sessions = Some(entry.sessions.unwrap_or(0) + n),
                Err(why) => log::warn!(
                    "node {node:?} reported {SESSIONS_METRIC} for endpoint {address} of cluster \
                     {:?} that is ignored: {why}",
                    stats.cluster_name
                ),
            }
        }
    }
    Ok(out)
}

/// The sessions an endpoint's `tether.sessions` metric says: its total
/// over its count, rounded; `None` without the metric (or a count of 0).
fn sessions(metrics: &[epb::EndpointLoadMetricStats]) -> Result<Option<u64>, String> {
    let mut out = None;
    for m in metrics.iter().filter(|m| m.metric_name == SESSIONS_METRIC) {
        if m.num_requests_finished_with_metric == 0 {
            continue;
        }
        let n = m.total_metric_value / m.num_requests_finished_with_metric as f64;
        if !(0.0..ABSURD as f64).contains(&n) {
            return Err(format!(
                "a total of {} over {}",
                m.total_metric_value, m.num_requests_finished_with_metric
            ));
        }
        out = Some(out.unwrap_or(0) + n.round() as u64);
    }
    Ok(out)
}

/// `region/zone/sub_zone`, as the draining endpoints name their locality.
pub(crate) fn locality_key(l: Option<&core::Locality>) -> String {
    let l = l.cloned().unwrap_or_default();
    format!("{}/{}/{}", l.region, l.zone, l.sub_zone)
}

pub(crate) fn socket_address(a: Option<&core::Address>) -> Option<SocketAddr> {
    match a?.address.as_ref()? {
        core::address::Address::SocketAddress(s) => {
            let ip: IpAddr = s.address.parse().ok()?;
            let port = match s.port_specifier.as_ref()? {
                core::socket_address::PortSpecifier::PortValue(p) => u16::try_from(*p).ok()?,
                _ => return None,
            };
            Some(SocketAddr::new(ip, port))
        }
        _ => None,
    }
}

/// The DRAINING endpoints of a snapshot's proxyless ClusterLoadAssignments.
pub(crate) fn draining_endpoints(snapshot: &Snapshot) -> BTreeSet<DrainingEndpoint> {
    let mut out = BTreeSet::new();
    let assignments = snapshot.resources.proxyless.get(&ResourceKind::Endpoints);
    for (service, any) in assignments.into_iter().flatten() {
        let Ok(cla) = epb::ClusterLoadAssignment::decode(any.value.as_slice()) else {
            continue;
        };
        for group in &cla.endpoints {
            let locality = locality_key(group.locality.as_ref());
            for e in &group.lb_endpoints {
                if e.health_status != core::HealthStatus::Draining as i32 {
                    continue;
                }
                let address = match &e.host_identifier {
                    Some(epb::lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                        socket_address(ep.address.as_ref())
                    }
                    _ => None,
                };
                if let Some(address) = address {
                    out.insert(DrainingEndpoint {
                        service: service.clone(),
                        address,
                        locality: locality.clone(),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(address: &str, port: u32, issued: u64) -> epb::UpstreamEndpointStats {
        epb::UpstreamEndpointStats {
            address: Some(core::Address {
                address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                    address: address.to_owned(),
                    port_specifier: Some(core::socket_address::PortSpecifier::PortValue(port)),
                    ..Default::default()
                })),
            }),
            total_issued_requests: issued,
            ..Default::default()
        }
    }

    fn stats(issued: u64, endpoints: Vec<epb::UpstreamEndpointStats>) -> epb::ClusterStats {
        epb::ClusterStats {
            cluster_name: "web/session".into(),
            upstream_locality_stats: vec![epb::UpstreamLocalityStats {
                locality: Some(core::Locality {
                    region: "us".into(),
                    zone: "a".into(),
                    ..Default::default()
                }),
                total_issued_requests: issued,
                total_requests_in_progress: 1,
                upstream_endpoint_stats: endpoints,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn reports_reduce_to_requests_per_locality_and_endpoint() {
        let r = report("n", &stats(4, vec![endpoint("10.0.0.2", 8080, 3)])).unwrap();
        assert_eq!(r.localities["us/a/"], 5, "issued plus in progress");
        let endpoints = r.endpoints.unwrap();
        assert_eq!(endpoints[&"10.0.0.2:8080".parse().unwrap()].requests, 3);
        // Per locality only (C-core): no endpoint figures at all.
        assert!(report("n", &stats(4, vec![])).unwrap().endpoints.is_none());
    }

    fn with_sessions(total: f64, num: u64) -> epb::UpstreamEndpointStats {
        let mut e = endpoint("10.0.0.2", 8080, 0);
        e.load_metric_stats = vec![
            epb::EndpointLoadMetricStats {
                metric_name: "other".into(),
                num_requests_finished_with_metric: 1,
                total_metric_value: 99.0,
            },
            epb::EndpointLoadMetricStats {
                metric_name: SESSIONS_METRIC.into(),
                num_requests_finished_with_metric: num,
                total_metric_value: total,
            },
        ];
        e
    }

    #[test]
    fn the_sessions_metric_is_read_and_absurd_values_ignored() {
        let b: SocketAddr = "10.0.0.2:8080".parse().unwrap();
        let sessions_of = |e| report("n", &stats(0, vec![e])).unwrap().endpoints.unwrap()[&b];
        assert_eq!(sessions_of(with_sessions(3.0, 1)).sessions, Some(3));
        // Two intervals' worth added up by a client: the mean, rounded.
        assert_eq!(sessions_of(with_sessions(5.0, 2)).sessions, Some(3));
        assert_eq!(sessions_of(with_sessions(0.0, 1)).sessions, Some(0));
        assert_eq!(sessions_of(with_sessions(4.0, 0)).sessions, None);
        assert_eq!(sessions_of(endpoint("10.0.0.2", 8080, 0)).sessions, None);
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e13] {
            let load = sessions_of(with_sessions(bad, 1));
            assert_eq!(load.sessions, None, "{bad}");
        }
    }

    #[test]
    fn absurd_figures_and_bad_addresses_are_refused() {
        let e = report("n", &stats(u64::MAX, vec![])).unwrap_err();
        assert!(e.contains("us/a/"), "{e}");
        let e = report("n", &stats(1, vec![endpoint("10.0.0.2", 8080, ABSURD)])).unwrap_err();
        assert!(e.contains("10.0.0.2:8080"), "{e}");
        let e = report("n", &stats(1, vec![endpoint("not-an-ip", 8080, 1)])).unwrap_err();
        assert!(e.contains("not IP:PORT"), "{e}");
        let e = report("n", &stats(1, vec![endpoint("10.0.0.2", 70000, 1)])).unwrap_err();
        assert!(e.contains("not IP:PORT"), "{e}");
    }
}
