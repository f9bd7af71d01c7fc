//! What the clients' load reports (LRS, gRFC A27) say about draining
//! endpoints, fleet-wide: for each DRAINING endpoint, which clients hold
//! its cluster (their ADS streams subscribe to its endpoints), what each
//! one's reports since the endpoint went DRAINING say, and a verdict:
//!
//! - `busy`: a client's latest report shows requests to it (issued or in
//!   progress): the endpoint still serves someone's sessions;
//! - `unknown`: a client that holds the cluster does not report (Envoy
//!   without a load stats config, a client without LRS), or has not
//!   reported since the endpoint went DRAINING;
//! - `idle`: every client that holds the cluster reported since, and none
//!   of their latest reports shows a request to it; `idle_for` counts from
//!   the later of the drain's start and the last report that did.
//!
//! Never `idle` while a reporting client still sends to it. A client that
//! reports per locality only (gRPC C-core) is counted busy while the
//! endpoint's locality has traffic in its latest report: its figures
//! cannot tell the endpoint from its neighbours. Pure state: the caller
//! hands in every event and the time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;

/// A locality as reports name it: `region/zone/sub_zone`.
pub type LocalityKey = String;

/// A DRAINING endpoint as the snapshot serves it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DrainingEndpoint {
    /// The service (EDS resource name).
    pub service: String,
    /// The endpoint's address.
    pub address: SocketAddr,
    /// Its locality.
    pub locality: LocalityKey,
}

/// One report of one cluster from one client, reduced to what the
/// verdicts read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterReport {
    /// Requests issued plus in progress, per locality.
    pub localities: BTreeMap<LocalityKey, u64>,
    /// Requests issued plus in progress, per endpoint, when the client
    /// reports per endpoint (Envoy asked for it, tether's channel).
    pub endpoints: Option<BTreeMap<SocketAddr, EndpointLoad>>,
}

impl ClusterReport {
    /// Adds `other`'s figures (another cluster of the same service).
    pub fn add(&mut self, other: ClusterReport) {
        for (locality, n) in other.localities {
            *self.localities.entry(locality).or_default() += n;
        }
        if let Some(endpoints) = other.endpoints {
            let mine = self.endpoints.get_or_insert_with(BTreeMap::new);
            for (address, load) in endpoints {
                let e = mine.entry(address).or_default();
                e.requests += load.requests;
                e.sessions = match (e.sessions, load.sessions) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
        }
    }
}

/// One endpoint's figures in a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointLoad {
    /// Requests issued in the interval plus those in progress.
    pub requests: u64,
    /// Sessions the client pins there, when it says (a named metric).
    pub sessions: Option<u64>,
}

/// What is known of one client's load on one service.
#[derive(Debug, Clone)]
struct Reported {
    /// When its last report came.
    last: Instant,
    report: ClusterReport,
    /// Per endpoint, when a report last showed requests to it.
    busy_at: HashMap<SocketAddr, Instant>,
    /// Per locality, likewise (clients that report per locality).
    locality_busy_at: HashMap<LocalityKey, Instant>,
}

/// An ADS or LRS stream's client.
#[derive(Debug, Clone)]
struct Client {
    node: String,
}

/// Every stream's load and holdings, and when each endpoint went DRAINING.
#[derive(Debug, Default)]
pub struct LoadState {
    /// ADS streams: their node and the services whose endpoints they hold.
    holders: HashMap<u64, (Client, BTreeSet<String>)>,
    /// LRS streams: their node and what they reported, by service.
    reporters: HashMap<u64, (Client, HashMap<String, Reported>)>,
    /// DRAINING endpoints and since when.
    draining: BTreeMap<DrainingEndpoint, Instant>,
}

/// The drain status's JSON (`GET /drain`): these names are a contract.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DrainStatus {
    /// Every DRAINING endpoint.
    pub endpoints: Vec<EndpointStatus>,
}

/// One DRAINING endpoint's status.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointStatus {
    /// Its service (the EDS resource name; proxyless clusters name it).
    pub cluster: String,
    /// `IP:PORT`.
    pub address: String,
    /// Always `DRAINING` (the list holds draining endpoints only).
    pub health: &'static str,
    /// `busy`, `idle` or `unknown`.
    pub verdict: &'static str,
    /// Seconds since the endpoint was last used, when `idle`.
    pub idle_for_s: Option<f64>,
    /// Seconds since it went DRAINING.
    pub draining_for_s: f64,
    /// Every client that holds its cluster.
    pub clients: Vec<ClientStatus>,
}

/// One client's view of a draining endpoint.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClientStatus {
    /// The client's node ID.
    pub node: String,
    /// `busy`, `idle`, `not reporting` or `no report since draining`.
    pub state: &'static str,
    /// Requests to the endpoint (or its locality, for a client that
    /// reports per locality) in its latest report.
    pub requests: Option<u64>,
    /// Sessions it pins there, when it reports them.
    pub sessions: Option<u64>,
    /// Whether its figures are per endpoint or per locality.
    pub granularity: Option<&'static str>,
}

impl LoadState {
    /// The DRAINING endpoints the snapshot serves now: new ones start
    /// their drain at `now`, ones no longer draining are forgotten.
    pub fn set_draining(&mut self, endpoints: BTreeSet<DrainingEndpoint>, now: Instant) {
        self.draining.retain(|e, _| endpoints.contains(e));
        for e in endpoints {
            self.draining.entry(e).or_insert(now);
        }
    }

    /// ADS stream `stream` of `node` holds `services`' endpoints.
    pub fn hold(&mut self, stream: u64, node: &str, services: BTreeSet<String>) {
        self.holders.insert(
            stream,
            (
                Client {
                    node: node.to_owned(),
                },
                services,
            ),
        );
    }

    /// ADS stream `stream` ended.
    pub fn release(&mut self, stream: u64) {
        self.holders.remove(&stream);
    }

    /// LRS stream `stream` of `node` reported `report` for `service`.
    pub fn report(
        &mut self,
        stream: u64,
        node: &str,
        service: &str,
        report: ClusterReport,
        now: Instant,
    ) {
        let (_, services) = self.reporters.entry(stream).or_insert_with(|| {
            (
                Client {
                    node: node.to_owned(),
                },
                HashMap::new(),
            )
        });
        let entry = services
            .entry(service.to_owned())
            .or_insert_with(|| Reported {
                last: now,
                report: ClusterReport::default(),
                busy_at: HashMap::new(),
                locality_busy_at: HashMap::new(),
            });
        entry.last = now;
        if let Some(endpoints) = &report.endpoints {
            for (address, load) in endpoints {
                if load.requests > 0 {
                    entry.busy_at.insert(*address, now);
                }
            }
        }
        for (locality, requests) in &report.localities {
            if *requests > 0 {
                entry.locality_busy_at.insert(locality.clone(), now);
            }
        }
        entry.report = report;
    }

    /// LRS stream `stream` ended: its client no longer reports.
    pub fn stop_reporting(&mut self, stream: u64) {
        self.reporters.remove(&stream);
    }

    /// Every DRAINING endpoint's verdict at `now`.
    pub fn status(&self, now: Instant) -> DrainStatus {
        let endpoints = self
            .draining
            .iter()
            .map(|(e, since)| self.endpoint_status(e, *since, now))
            .collect();
        DrainStatus { endpoints }
    }

    fn endpoint_status(
        &self,
        e: &DrainingEndpoint,
        since: Instant,
        now: Instant,
    ) -> EndpointStatus {
        // One entry per node: a node with several streams counts once,
        // with the freshest report.
        let nodes: BTreeSet<&str> = self
            .holders
            .values()
            .filter(|(_, services)| services.contains(&e.service))
            .map(|(c, _)| c.node.as_str())
            .collect();
        let mut clients = Vec::new();
        let mut busy = false;
        let mut unknown = false;
        let mut last_use = since;
        for node in nodes {
            let reported = self
                .reporters
                .values()
                .filter(|(c, _)| c.node == node)
                .filter_map(|(_, services)| services.get(&e.service))
                .max_by_key(|r| r.last);
            let Some(r) = reported else {
                unknown = true;
                clients.push(ClientStatus {
                    node: node.to_owned(),
                    state: "not reporting",
                    requests: None,
                    sessions: None,
                    granularity: None,
                });
                continue;
            };
            let (load, busy_at, granularity) = match &r.report.endpoints {
                Some(endpoints) => (
                    endpoints.get(&e.address).copied().unwrap_or_default(),
                    r.busy_at.get(&e.address).copied(),
                    "endpoint",
                ),
                None => (
                    EndpointLoad {
                        requests: r.report.localities.get(&e.locality).copied().unwrap_or(0),
                        sessions: None,
                    },
                    r.locality_busy_at.get(&e.locality).copied(),
                    "locality",
                ),
            };
            let state = if r.last <= since {
                unknown = true;
                "no report since draining"
            } else if load.requests > 0 || load.sessions.is_some_and(|s| s > 0) {
                busy = true;
                "busy"
            } else {
                "idle"
            };
            if let Some(at) = busy_at.filter(|at| *at > last_use) {
                last_use = at;
            }
            clients.push(ClientStatus {
                node: node.to_owned(),
                state,
                requests: Some(load.requests),
                sessions: load.sessions,
                granularity: Some(granularity),
            });
        }
        let verdict = if busy {
            "busy"
        } else if unknown {
            "unknown"
        } else {
            "idle"
        };
        EndpointStatus {
            cluster: e.service.clone(),
            address: e.address.to_string(),
            health: "DRAINING",
            verdict,
            idle_for_s: (verdict == "idle")
                .then(|| seconds(now.saturating_duration_since(last_use))),
            draining_for_s: seconds(now.saturating_duration_since(since)),
            clients,
        }
    }
}

fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: &str = "10.0.0.2:8080";

    fn draining() -> DrainingEndpoint {
        DrainingEndpoint {
            service: "shop".into(),
            address: B.parse().unwrap(),
            locality: "us/a/".into(),
        }
    }

    fn per_endpoint(requests: u64) -> ClusterReport {
        ClusterReport {
            localities: BTreeMap::from([("us/a/".to_owned(), requests + 5)]),
            endpoints: Some(BTreeMap::from([
                (
                    B.parse().unwrap(),
                    EndpointLoad {
                        requests,
                        sessions: None,
                    },
                ),
                (
                    "10.0.0.1:8080".parse().unwrap(),
                    EndpointLoad {
                        requests: 5,
                        sessions: None,
                    },
                ),
            ])),
        }
    }

    fn per_locality(requests: u64) -> ClusterReport {
        ClusterReport {
            localities: BTreeMap::from([("us/a/".to_owned(), requests)]),
            endpoints: None,
        }
    }

    fn verdict(s: &LoadState, now: Instant) -> (&'static str, Option<f64>) {
        let st = s.status(now);
        (st.endpoints[0].verdict, st.endpoints[0].idle_for_s)
    }

    #[test]
    fn busy_until_every_reporting_client_stops_then_idle_since_the_last_use() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut s = LoadState::default();
        s.hold(1, "envoy-1", BTreeSet::from(["shop".to_owned()]));
        s.hold(2, "grpc-1", BTreeSet::from(["shop".to_owned()]));
        s.set_draining(BTreeSet::from([draining()]), at(0));
        // Nobody reported since: unknown, never idle.
        assert_eq!(verdict(&s, at(1)).0, "unknown");
        s.report(10, "envoy-1", "shop", per_endpoint(3), at(2));
        s.report(11, "grpc-1", "shop", per_locality(0), at(2));
        assert_eq!(verdict(&s, at(2)).0, "busy");
        let clients = &s.status(at(2)).endpoints[0].clients;
        assert_eq!(clients[0].node, "envoy-1");
        assert_eq!(clients[0].state, "busy");
        assert_eq!(clients[0].requests, Some(3));
        assert_eq!(clients[1].state, "idle");
        // Envoy stops: idle, counted from its last busy report.
        s.report(10, "envoy-1", "shop", per_endpoint(0), at(4));
        assert_eq!(verdict(&s, at(7)), ("idle", Some(5.0)));
        // Traffic on the locality of a per-locality client: busy again.
        s.report(11, "grpc-1", "shop", per_locality(2), at(8));
        assert_eq!(verdict(&s, at(8)).0, "busy");
    }

    #[test]
    fn a_client_that_does_not_report_keeps_it_unknown_until_its_stream_ends() {
        let t0 = Instant::now();
        let mut s = LoadState::default();
        s.hold(1, "envoy-1", BTreeSet::from(["shop".to_owned()]));
        s.hold(2, "silent", BTreeSet::from(["shop".to_owned()]));
        s.set_draining(BTreeSet::from([draining()]), t0);
        s.report(
            10,
            "envoy-1",
            "shop",
            per_endpoint(0),
            t0 + Duration::from_secs(1),
        );
        let st = s.status(t0 + Duration::from_secs(2));
        assert_eq!(st.endpoints[0].verdict, "unknown");
        assert_eq!(st.endpoints[0].clients[1].state, "not reporting");
        s.release(2);
        assert_eq!(
            verdict(&s, t0 + Duration::from_secs(2)),
            ("idle", Some(2.0))
        );
        // A reporter whose LRS stream ends is not reporting any more.
        s.stop_reporting(10);
        assert_eq!(verdict(&s, t0 + Duration::from_secs(3)).0, "unknown");
    }

    #[test]
    fn a_services_clusters_add_up() {
        let mut r = per_endpoint(0);
        r.add(per_endpoint(4));
        let b: SocketAddr = B.parse().unwrap();
        assert_eq!(r.endpoints.as_ref().unwrap()[&b].requests, 4);
        assert_eq!(r.localities["us/a/"], 5 + 9);
        let mut locality_only = per_locality(0);
        locality_only.add(per_endpoint(2));
        assert_eq!(locality_only.endpoints.unwrap()[&b].requests, 2);
    }

    #[test]
    fn a_drain_that_ends_is_forgotten_and_a_new_one_starts_over() {
        let t0 = Instant::now();
        let mut s = LoadState::default();
        s.set_draining(BTreeSet::from([draining()]), t0);
        assert_eq!(s.status(t0).endpoints.len(), 1);
        // No client holds the cluster: nobody can use it.
        assert_eq!(
            verdict(&s, t0 + Duration::from_secs(1)),
            ("idle", Some(1.0))
        );
        s.set_draining(BTreeSet::new(), t0 + Duration::from_secs(2));
        assert!(s.status(t0).endpoints.is_empty());
        s.set_draining(BTreeSet::from([draining()]), t0 + Duration::from_secs(5));
        assert_eq!(
            s.status(t0 + Duration::from_secs(6)).endpoints[0].draining_for_s,
            1.0
        );
    }
}
