//! The status page (`GET /` on the admin listener) and the JSON it reads
//! (`GET /status`): every cluster's endpoints as proxyless clients get
//! them (locality, priority, weight, health), what each client reports for
//! each endpoint, the drain verdict of the DRAINING ones, and the clients
//! connected to this replica. The page is one file with no external
//! assets; it asks for the JSON every second and sets every value as text.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use prost::Message;
use serde::Serialize;
use tether_xds::resource::ResourceKind;

use crate::drain::address_of;
use crate::load::{ClientSummary, ClusterReport, DrainStatus, EndpointStatus, SCOPE};
use crate::translate::Translated;

/// The page.
pub const PAGE: &str = include_str!("status.html");

/// `GET /status`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    /// The snapshot version served.
    pub version: u64,
    /// What the clients and verdicts cover (this replica's clients).
    pub scope: &'static str,
    /// Every cluster (EDS resource) served to proxyless clients.
    pub clusters: Vec<ClusterStatus>,
    /// Clients connected to this replica.
    pub clients: Vec<ClientStatus>,
}

/// One cluster's endpoints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClusterStatus {
    /// The EDS resource name.
    pub name: String,
    /// Its endpoints, by priority then locality.
    pub endpoints: Vec<EndpointView>,
}

/// One endpoint.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointView {
    /// `IP:PORT`.
    pub address: String,
    /// `region/zone/sub_zone` (empty parts kept), or empty when all are.
    pub locality: String,
    /// Its priority.
    pub priority: u32,
    /// Its weight.
    pub weight: u32,
    /// The EDS health status (`HEALTHY`, `DRAINING`, ...).
    pub health: String,
    /// The drain verdict, when DRAINING.
    pub drain: Option<EndpointStatus>,
    /// The reporting clients with the most requests to it, at most
    /// [`LOAD_SHOWN`] (a fleet of clients would make the page megabytes).
    pub load: Vec<EndpointLoadView>,
    /// How many clients report figures for it.
    pub load_clients: usize,
    /// Their requests, added up.
    pub load_requests: u64,
}

/// How many clients' figures an endpoint lists in `GET /status`.
pub const LOAD_SHOWN: usize = 10;

/// One client's figures for one endpoint.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointLoadView {
    /// The client's node ID.
    pub node: String,
    /// Requests issued in its latest interval plus those in progress (for
    /// a client that reports per locality: the locality's).
    pub requests: u64,
    /// Sessions it pins there, when it says.
    pub sessions: Option<u64>,
    /// `endpoint` or `locality`.
    pub granularity: &'static str,
}

/// A connected client.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClientStatus {
    /// Its node ID.
    pub node: String,
    /// Its streams: `ADS`, `LRS`, with a count when several.
    pub streams: Vec<String>,
    /// The clusters whose endpoints it holds.
    pub holds: Vec<String>,
    /// The clusters it reports load for.
    pub reports: Vec<String>,
}

/// The status from the resources served, the drain status and the load
/// state's clients and reports (`reports_of(cluster)`).
pub fn status(
    version: u64,
    resources: &Translated,
    drain: &DrainStatus,
    clients: Vec<ClientSummary>,
    reports_of: impl Fn(&str) -> BTreeMap<String, ClusterReport>,
) -> Status {
    let mut clusters = Vec::new();
    if let Some(assignments) = resources.proxyless.get(&ResourceKind::Endpoints) {
        for (name, any) in assignments {
            let Ok(cla) = epb::ClusterLoadAssignment::decode(any.value.as_slice()) else {
                continue;
            };
            let reports = reports_of(name);
            clusters.push(ClusterStatus {
                name: name.clone(),
                endpoints: endpoints(name, &cla, drain, &reports),
            });
        }
    }
    Status {
        version,
        scope: SCOPE,
        clusters,
        clients: clients
            .into_iter()
            .map(|c| ClientStatus {
                streams: [("ADS", c.ads_streams), ("LRS", c.lrs_streams)]
                    .into_iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(kind, n)| {
                        if n == 1 {
                            kind.to_owned()
                        } else {
                            format!("{kind} ×{n}")
                        }
                    })
                    .collect(),
                holds: c.holds.into_iter().collect(),
                reports: c.reports.into_iter().collect(),
                node: c.node,
            })
            .collect(),
    }
}

fn endpoints(
    cluster: &str,
    cla: &epb::ClusterLoadAssignment,
    drain: &DrainStatus,
    reports: &BTreeMap<String, ClusterReport>,
) -> Vec<EndpointView> {
    let mut out = Vec::new();
    for group in &cla.endpoints {
        // As reports name it; shown empty when every part is.
        let locality = crate::lrs::locality_key(group.locality.as_ref());
        let shown = if locality == "//" {
            String::new()
        } else {
            locality.clone()
        };
        for e in &group.lb_endpoints {
            let Some(address) = address_of(e) else {
                continue;
            };
            let text = address.to_string();
            let mut load: Vec<EndpointLoadView> = reports
                .iter()
                .filter_map(|(node, r)| {
                    let (requests, sessions, granularity) = match &r.endpoints {
                        Some(by_endpoint) => {
                            let l = by_endpoint.get(&address)?;
                            (l.requests, l.sessions, "endpoint")
                        }
                        None => (*r.localities.get(&locality)?, None, "locality"),
                    };
                    Some(EndpointLoadView {
                        node: node.clone(),
                        requests,
                        sessions,
                        granularity,
                    })
                })
                .collect();
            let load_clients = load.len();
            let load_requests = load.iter().map(|l| l.requests).sum();
            load.sort_by(|a, b| {
                b.requests
                    .cmp(&a.requests)
                    .then_with(|| a.node.cmp(&b.node))
            });
            load.truncate(LOAD_SHOWN);
            out.push(EndpointView {
                drain: drain
                    .endpoints
                    .iter()
                    .find(|d| d.cluster == cluster && d.address == text)
                    .cloned(),
                address: text,
                locality: shown.clone(),
                priority: group.priority,
                weight: e.load_balancing_weight.as_ref().map_or(1, |w| w.value),
                health: core::HealthStatus::try_from(e.health_status).map_or_else(
                    |_| e.health_status.to_string(),
                    |h| h.as_str_name().to_owned(),
                ),
                load,
                load_clients,
                load_requests,
            });
        }
    }
    out
}
