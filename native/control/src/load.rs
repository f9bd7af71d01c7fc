//! What the clients' load reports (LRS, gRFC A27) say about draining
//! endpoints, fleet-wide: for each DRAINING endpoint, which clients hold
//! its cluster (their ADS streams subscribe to its endpoints), what each
//! one's reports since the endpoint went DRAINING say, and a verdict:
//!
//! - `busy`: a client's latest report shows requests to it (issued in the
//!   interval or in progress): the endpoint still serves someone's calls.
//!   Sessions a client says it pins there (the channel's `tether.sessions`
//!   metric) are shown, but alone do not make it busy: a pinned session
//!   lasts until the client's idle timeout (an hour by default), far
//!   longer than its use, and idle means that no client sent it a request;
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
//!
//! For the services with a `drain` ([`crate::drain`]) it also keeps when
//! each DRAINING endpoint's verdict turned `idle` (updated on every event,
//! so an idle spell broken between two looks still counts as broken), says
//! which are due for removal, and remembers the removed ones: kept out of
//! EDS while they stay DRAINING, shown by the status for
//! [`REMOVED_SHOWN`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::drain::{DrainPolicy, EndpointKey, RemovalReason};
use crate::reports::{Kept, ReportLog};

/// How long `GET /drain` shows an endpoint after its removal.
pub const REMOVED_SHOWN: Duration = Duration::from_secs(600);

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
    /// Sessions the client pins there, when it says (the `tether.sessions`
    /// metric): shown, not read by the verdict.
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

/// A DRAINING endpoint's drain.
#[derive(Debug, Clone, Copy)]
struct Drain {
    /// When it went DRAINING.
    since: Instant,
    /// While its verdict is `idle` (tracked for services with a `drain`
    /// only): since when without a break, the later of when the verdict
    /// turned idle and the last use a report shows.
    idle: Option<Instant>,
}

/// An endpoint removed by its service's `drain`.
#[derive(Debug, Clone)]
struct Removed {
    /// When.
    at: Instant,
    /// Its status at that moment.
    status: EndpointStatus,
    /// Still DRAINING in what is translated: kept out of EDS. `false`:
    /// gone from the file or DNS too, only shown.
    held_out: bool,
}

/// A removal [`LoadState::take_due`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The endpoint.
    pub endpoint: DrainingEndpoint,
    /// Why.
    pub reason: RemovalReason,
}

/// Every stream's load and holdings, and when each endpoint went DRAINING.
#[derive(Debug, Default)]
pub struct LoadState {
    /// ADS streams: their node and the services whose endpoints they hold.
    holders: HashMap<u64, (Client, BTreeSet<String>)>,
    /// LRS streams: their node and what they reported, by service.
    reporters: HashMap<u64, (Client, HashMap<String, Reported>)>,
    /// DRAINING endpoints served, since when and since when idle.
    draining: BTreeMap<DrainingEndpoint, Drain>,
    /// The services' `drain`, by EDS name.
    policies: BTreeMap<String, DrainPolicy>,
    /// Endpoints removed by their service's `drain`.
    removed: BTreeMap<EndpointKey, Removed>,
    /// The reports as they came (`GET /load`): kept here, under the lock
    /// every report takes anyway.
    log: ReportLog,
    /// A removal may have come due sooner than last said (see
    /// [`LoadState::take_wake`]).
    wake: bool,
}

/// What the reports say of one DRAINING endpoint.
struct Assessment {
    verdict: &'static str,
    /// The drain's start or the last report showing it used, the later.
    last_use: Instant,
    clients: Vec<ClientStatus>,
}

/// The drain status's JSON (`GET /drain`): these names are a contract.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DrainStatus {
    /// What the verdicts cover: this replica's clients only (replicas share
    /// nothing; `tether-control drain status` merges several).
    pub scope: &'static str,
    /// Clients connected to this replica now (ADS or LRS streams' nodes).
    pub clients_connected: usize,
    /// Every DRAINING endpoint.
    pub endpoints: Vec<EndpointStatus>,
}

/// [`DrainStatus::scope`].
pub const SCOPE: &str = "the clients connected to this tether-control replica";

/// One DRAINING endpoint's status.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointStatus {
    /// Its service (the EDS resource name; proxyless clusters name it).
    pub cluster: String,
    /// `IP:PORT`.
    pub address: String,
    /// Always `DRAINING` (the list holds draining endpoints only; a
    /// removed one is still DRAINING in the file or DNS).
    pub health: &'static str,
    /// `busy`, `idle` or `unknown`.
    pub verdict: &'static str,
    /// Seconds since the endpoint was last used, when `idle`.
    pub idle_for_s: Option<f64>,
    /// Seconds since it went DRAINING.
    pub draining_for_s: f64,
    /// Every client that holds its cluster.
    pub clients: Vec<ClientStatus>,
    /// Removed from EDS by its service's `drain` (then every other figure
    /// is as it was at the removal).
    pub removed: bool,
    /// Why it was removed: `idle for 30s` or `maxDrain 600s reached`.
    pub removed_because: Option<String>,
    /// Seconds since it was removed.
    pub removed_for_s: Option<f64>,
}

/// A connected client, for the status page.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ClientSummary {
    /// Its node ID.
    pub node: String,
    /// Its ADS streams.
    pub ads_streams: usize,
    /// Its LRS streams.
    pub lrs_streams: usize,
    /// The services whose endpoints its ADS streams hold.
    pub holds: BTreeSet<String>,
    /// The services it reports load for.
    pub reports: BTreeSet<String>,
}

impl ClientSummary {
    fn named(node: &str) -> Self {
        ClientSummary {
            node: node.to_owned(),
            ..ClientSummary::default()
        }
    }
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
    /// Sessions it pins there, when it reports them (shown only: they
    /// do not make the endpoint busy).
    pub sessions: Option<u64>,
    /// Whether its figures are per endpoint or per locality.
    pub granularity: Option<&'static str>,
}

impl LoadState {
    /// The DRAINING endpoints the snapshot serves now: new ones start
    /// their drain at `now`, ones no longer draining are forgotten.
    pub fn set_draining(&mut self, endpoints: BTreeSet<DrainingEndpoint>, now: Instant) {
        self.draining.retain(|e, _| endpoints.contains(e));
        // A new drain under a `drain` brings a maxDrain deadline.
        let mut changed = false;
        for e in endpoints {
            if self.draining.contains_key(&e) {
                continue;
            }
            // A new drain of a removed endpoint (it was served again in
            // between): the old removal is history.
            self.removed.remove(&(e.service.clone(), e.address));
            changed |= self.policies.contains_key(&e.service);
            self.draining.insert(
                e,
                Drain {
                    since: now,
                    idle: None,
                },
            );
        }
        self.wake |= changed;
        self.refresh_idle(now);
    }

    /// The services' `drain` (by EDS name), as the snapshot has them.
    pub fn set_policies(&mut self, policies: BTreeMap<String, DrainPolicy>, now: Instant) {
        if policies != self.policies {
            self.policies = policies;
            self.wake = true;
            self.refresh_idle(now);
        }
    }

    /// ADS stream `stream` of `node` holds `services`' endpoints.
    pub fn hold(&mut self, stream: u64, node: &str, services: BTreeSet<String>, now: Instant) {
        self.holders.insert(
            stream,
            (
                Client {
                    node: node.to_owned(),
                },
                services,
            ),
        );
        self.refresh_idle(now);
    }

    /// ADS stream `stream` ended.
    pub fn release(&mut self, stream: u64, now: Instant) {
        self.holders.remove(&stream);
        self.refresh_idle(now);
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
        self.refresh_idle(now);
    }

    /// LRS stream `stream` ended: its client no longer reports.
    pub fn stop_reporting(&mut self, stream: u64, now: Instant) {
        self.reporters.remove(&stream);
        self.log.close(stream, now);
        self.refresh_idle(now);
    }

    /// The reports as they came, by LRS stream ([`crate::reports`]).
    pub fn log(&mut self) -> &mut ReportLog {
        &mut self.log
    }

    /// Every node's recent reports at `now`, or `node`'s only (`GET
    /// /load`): copies of the handles, decoded by [`Kept::page`] once the
    /// lock is let go.
    pub fn kept_reports(&self, node: Option<&str>, now: Instant) -> Kept {
        self.log.kept(node, now)
    }

    /// Every DRAINING endpoint's verdict at `now`, then the endpoints
    /// removed in the last [`REMOVED_SHOWN`].
    pub fn status(&self, now: Instant) -> DrainStatus {
        let mut endpoints: Vec<EndpointStatus> = self
            .draining
            .iter()
            .map(|(e, d)| self.endpoint_status(e, d.since, now))
            .collect();
        endpoints.extend(
            self.removed
                .values()
                .filter(|r| now.saturating_duration_since(r.at) < REMOVED_SHOWN)
                .map(|r| EndpointStatus {
                    removed_for_s: Some(seconds(now.saturating_duration_since(r.at))),
                    ..r.status.clone()
                }),
        );
        let nodes: BTreeSet<&str> = self
            .holders
            .values()
            .map(|(c, _)| c.node.as_str())
            .chain(self.reporters.values().map(|(c, _)| c.node.as_str()))
            .collect();
        DrainStatus {
            scope: SCOPE,
            clients_connected: nodes.len(),
            endpoints,
        }
    }

    /// Every connected client (by node), the streams it has open, the
    /// services whose endpoints it holds and those it reports load for.
    pub fn clients(&self) -> Vec<ClientSummary> {
        let mut by_node: BTreeMap<&str, ClientSummary> = BTreeMap::new();
        for (client, services) in self.holders.values() {
            let c = by_node
                .entry(client.node.as_str())
                .or_insert_with(|| ClientSummary::named(&client.node));
            c.ads_streams += 1;
            c.holds.extend(services.iter().cloned());
        }
        for (client, reports) in self.reporters.values() {
            let c = by_node
                .entry(client.node.as_str())
                .or_insert_with(|| ClientSummary::named(&client.node));
            c.lrs_streams += 1;
            c.reports.extend(reports.keys().cloned());
        }
        by_node.into_values().collect()
    }

    /// Each reporting client's latest report for `service`, by node (a
    /// node with several streams: their reports added up).
    pub fn reports_of(&self, service: &str) -> BTreeMap<String, ClusterReport> {
        let mut out: BTreeMap<String, ClusterReport> = BTreeMap::new();
        for (client, reports) in self.reporters.values() {
            if let Some(r) = reports.get(service) {
                out.entry(client.node.clone())
                    .or_default()
                    .add(r.report.clone());
            }
        }
        out
    }

    /// Whether a removal may have come due sooner than
    /// [`LoadState::next_deadline`] last said (a verdict turned idle, a
    /// drain began, a `drain` changed); clears it.
    pub fn take_wake(&mut self) -> bool {
        std::mem::take(&mut self.wake)
    }

    /// The next instant a served DRAINING endpoint is due for removal if
    /// nothing changes.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.draining
            .iter()
            .filter_map(|(e, d)| {
                let policy = self.policies.get(&e.service)?;
                Some(policy.deadline(d.since, d.idle)?.0)
            })
            .min()
    }

    /// Removes the served DRAINING endpoints due at `now`: each leaves the
    /// draining ones for the removed ones (kept out of EDS, see
    /// [`LoadState::held_out`]), its status as it was.
    pub fn take_due(&mut self, now: Instant) -> Vec<Removal> {
        let due: Vec<Removal> = self
            .draining
            .iter()
            .filter_map(|(e, d)| {
                let reason = self.policies.get(&e.service)?.due(d.since, d.idle, now)?;
                Some(Removal {
                    endpoint: e.clone(),
                    reason,
                })
            })
            .collect();
        for r in &due {
            let e = &r.endpoint;
            let Some(d) = self.draining.remove(e) else {
                continue;
            };
            let mut status = self.endpoint_status(e, d.since, now);
            status.removed = true;
            status.removed_because = Some(r.reason.to_string());
            self.removed.insert(
                (e.service.clone(), e.address),
                Removed {
                    at: now,
                    status,
                    held_out: true,
                },
            );
        }
        due
    }

    /// The services whose endpoints [`LoadState::keep_removed`] reads:
    /// those with a `drain`, and those with removed endpoints.
    pub fn drain_services(&self) -> BTreeSet<String> {
        self.policies
            .keys()
            .cloned()
            .chain(self.removed.keys().map(|(s, _)| s.clone()))
            .collect()
    }

    /// Updates the removed endpoints from what is translated now
    /// (`endpoints`, with whether each is DRAINING, for
    /// [`LoadState::drain_services`]): one still DRAINING, in a service
    /// that still has a `drain`, stays out of EDS; one served otherwise
    /// (HEALTHY again, or its service's `drain` gone) is forgotten and
    /// served; one gone from the file or DNS is only shown, until
    /// [`REMOVED_SHOWN`] after its removal.
    pub fn keep_removed(&mut self, endpoints: &BTreeMap<EndpointKey, bool>, now: Instant) {
        let policies = &self.policies;
        self.removed.retain(|key, r| match endpoints.get(key) {
            Some(true) if policies.contains_key(&key.0) => true,
            Some(_) => false,
            None => {
                r.held_out = false;
                now.saturating_duration_since(r.at) < REMOVED_SHOWN
            }
        });
    }

    /// The removed endpoints kept out of EDS.
    pub fn held_out(&self) -> BTreeSet<EndpointKey> {
        self.removed
            .iter()
            .filter(|(_, r)| r.held_out)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Updates when each DRAINING endpoint of a service with a `drain`
    /// turned idle, after an event at `now`.
    fn refresh_idle(&mut self, now: Instant) {
        if self.policies.is_empty() {
            return;
        }
        let idle: Vec<Option<Instant>> = self
            .draining
            .iter()
            .map(|(e, d)| {
                if !self.policies.contains_key(&e.service) {
                    return None;
                }
                let a = self.assess(e, d.since);
                (a.verdict == "idle").then(|| d.idle.unwrap_or(now).max(a.last_use))
            })
            .collect();
        for (d, idle) in self.draining.values_mut().zip(idle) {
            if d.idle != idle {
                d.idle = idle;
                self.wake = true;
            }
        }
    }

    fn endpoint_status(
        &self,
        e: &DrainingEndpoint,
        since: Instant,
        now: Instant,
    ) -> EndpointStatus {
        let a = self.assess(e, since);
        EndpointStatus {
            cluster: e.service.clone(),
            address: e.address.to_string(),
            health: "DRAINING",
            verdict: a.verdict,
            idle_for_s: (a.verdict == "idle")
                .then(|| seconds(now.saturating_duration_since(a.last_use))),
            draining_for_s: seconds(now.saturating_duration_since(since)),
            clients: a.clients,
            removed: false,
            removed_because: None,
            removed_for_s: None,
        }
    }

    /// The verdict on `e`, DRAINING since `since`, from what its holders
    /// report.
    fn assess(&self, e: &DrainingEndpoint, since: Instant) -> Assessment {
        // One entry per node: a node with several streams counts once,
        // with the freshest report.
        let nodes: BTreeSet<&str> = self
            .holders
            .values()
            .filter(|(_, services)| services.contains(&e.service))
            .map(|(c, _)| c.node.as_str())
            .collect();
        // Each node's latest report of the service, found once: a scan of
        // every reporter per node would cost clients² per endpoint.
        let mut latest: HashMap<&str, &Reported> = HashMap::new();
        for (c, services) in self.reporters.values() {
            if let Some(r) = services.get(&e.service) {
                latest
                    .entry(c.node.as_str())
                    .and_modify(|l| {
                        if r.last > l.last {
                            *l = r;
                        }
                    })
                    .or_insert(r);
            }
        }
        let mut clients = Vec::new();
        let mut busy = false;
        let mut unknown = false;
        let mut last_use = since;
        for node in nodes {
            let reported = latest.get(node).copied();
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
            } else if load.requests > 0 {
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
        Assessment {
            verdict,
            last_use,
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
        s.hold(1, "envoy-1", BTreeSet::from(["shop".to_owned()]), t0);
        s.hold(2, "grpc-1", BTreeSet::from(["shop".to_owned()]), t0);
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
        s.hold(1, "envoy-1", BTreeSet::from(["shop".to_owned()]), t0);
        s.hold(2, "silent", BTreeSet::from(["shop".to_owned()]), t0);
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
        s.release(2, t0 + Duration::from_secs(2));
        assert_eq!(
            verdict(&s, t0 + Duration::from_secs(2)),
            ("idle", Some(2.0))
        );
        // A reporter whose LRS stream ends is not reporting any more.
        s.stop_reporting(10, t0 + Duration::from_secs(3));
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
    fn sessions_pinned_without_requests_are_shown_but_idle() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut s = LoadState::default();
        s.hold(1, "tether-1", BTreeSet::from(["shop".to_owned()]), t0);
        s.set_draining(BTreeSet::from([draining()]), at(0));
        let with_sessions = |requests: u64| {
            let mut r = per_endpoint(requests);
            if let Some(e) = r.endpoints.as_mut() {
                e.get_mut(&B.parse().unwrap()).unwrap().sessions = Some(3);
            }
            r
        };
        s.report(10, "tether-1", "shop", with_sessions(2), at(1));
        assert_eq!(verdict(&s, at(1)).0, "busy");
        // Its calls stop, its sessions stay pinned (until its idle
        // timeout): idle since the last request, the sessions shown.
        s.report(10, "tether-1", "shop", with_sessions(0), at(2));
        assert_eq!(verdict(&s, at(4)), ("idle", Some(3.0)));
        let client = &s.status(at(4)).endpoints[0].clients[0];
        assert_eq!((client.state, client.sessions), ("idle", Some(3)));
        assert_eq!(client.requests, Some(0));
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

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn policy(
        remove_when_idle: Option<u64>,
        max_drain: Option<u64>,
    ) -> BTreeMap<String, DrainPolicy> {
        BTreeMap::from([(
            "shop".to_owned(),
            DrainPolicy {
                remove_when_idle: remove_when_idle.map(secs),
                max_drain: max_drain.map(secs),
            },
        )])
    }

    fn key() -> EndpointKey {
        ("shop".to_owned(), B.parse().unwrap())
    }

    #[test]
    fn idle_removal_needs_an_unbroken_idle_spell_that_unknown_and_busy_break() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + secs(n);
        let mut s = LoadState::default();
        s.set_policies(policy(Some(10), None), at(0));
        s.hold(1, "envoy-1", BTreeSet::from(["shop".to_owned()]), at(0));
        s.set_draining(BTreeSet::from([draining()]), at(0));
        assert!(s.take_wake(), "a drain began");
        // No report since the drain: unknown, never due.
        assert_eq!(s.next_deadline(), None);
        assert!(s.take_due(at(1000)).is_empty());
        s.report(10, "envoy-1", "shop", per_endpoint(3), at(2));
        assert_eq!(s.next_deadline(), None, "busy");
        // Idle from the report that says so.
        s.report(10, "envoy-1", "shop", per_endpoint(0), at(4));
        assert!(s.take_wake(), "it turned idle");
        assert_eq!(s.next_deadline(), Some(at(14)));
        assert!(s.take_due(at(13)).is_empty());
        // Busy again, then idle: the spell starts over.
        s.report(10, "envoy-1", "shop", per_endpoint(1), at(8));
        s.report(10, "envoy-1", "shop", per_endpoint(0), at(9));
        assert_eq!(s.next_deadline(), Some(at(19)));
        // A client that holds the cluster without reporting breaks it too,
        // even if it leaves before anyone looks.
        s.hold(2, "silent", BTreeSet::from(["shop".to_owned()]), at(11));
        assert_eq!(s.status(at(11)).endpoints[0].verdict, "unknown");
        s.release(2, at(12));
        assert_eq!(s.next_deadline(), Some(at(22)));
        assert!(s.take_due(at(21)).is_empty());
        let removed = s.take_due(at(22));
        assert_eq!(
            removed,
            vec![Removal {
                endpoint: draining(),
                reason: RemovalReason::Idle(secs(10)),
            }]
        );
        assert_eq!(s.held_out(), BTreeSet::from([key()]));
        assert_eq!(s.next_deadline(), None);
        // Shown as removed, its figures as they were then (idle_for_s
        // counts from the last busy report, at 8 s).
        let st = &s.status(at(25)).endpoints[0];
        assert!(st.removed, "{st:?}");
        assert_eq!(st.removed_because.as_deref(), Some("idle for 10s"));
        assert_eq!(st.removed_for_s, Some(3.0));
        assert_eq!((st.verdict, st.idle_for_s), ("idle", Some(14.0)));
        assert_eq!(st.draining_for_s, 22.0);
    }

    #[test]
    fn max_drain_removes_whatever_the_verdict() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + secs(n);
        let mut s = LoadState::default();
        s.set_policies(policy(Some(5), Some(60)), at(0));
        s.hold(1, "silent", BTreeSet::from(["shop".to_owned()]), at(0));
        s.hold(2, "envoy-1", BTreeSet::from(["shop".to_owned()]), at(0));
        s.set_draining(BTreeSet::from([draining()]), at(0));
        s.report(10, "envoy-1", "shop", per_endpoint(2), at(30));
        assert_eq!(s.status(at(30)).endpoints[0].verdict, "busy");
        assert_eq!(s.next_deadline(), Some(at(60)));
        assert!(s.take_due(at(59)).is_empty());
        let removed = s.take_due(at(60));
        assert_eq!(removed[0].reason, RemovalReason::MaxDrain(secs(60)));
        let st = &s.status(at(60)).endpoints[0];
        assert_eq!(st.removed_because.as_deref(), Some("maxDrain 60s reached"));
        assert_eq!(st.verdict, "busy");
        // A service without a drain keeps its DRAINING endpoints.
        let mut other = LoadState::default();
        other.set_draining(BTreeSet::from([draining()]), at(0));
        assert_eq!(other.next_deadline(), None);
        assert!(other.take_due(at(1_000_000)).is_empty());
        assert!(!other.take_wake(), "nothing to remove, nothing to wake");
    }

    #[test]
    fn a_removed_endpoint_stays_out_while_draining_and_is_served_once_it_is_not() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + secs(n);
        let removed_at = |s: &mut LoadState, n: u64| {
            s.set_policies(policy(None, Some(1)), at(n));
            s.set_draining(BTreeSet::from([draining()]), at(n));
            assert_eq!(s.take_due(at(n + 1)).len(), 1);
            // What the control plane then serves: without it.
            s.set_draining(BTreeSet::new(), at(n + 1));
        };
        let mut s = LoadState::default();
        removed_at(&mut s, 0);
        // Still DRAINING in the file: kept out.
        let draining_in_file = BTreeMap::from([(key(), true)]);
        s.keep_removed(&draining_in_file, at(100));
        assert_eq!(s.held_out(), BTreeSet::from([key()]));
        // HEALTHY again: served, the removal forgotten.
        s.keep_removed(&BTreeMap::from([(key(), false)]), at(101));
        assert!(s.held_out().is_empty());
        assert!(s.status(at(101)).endpoints.is_empty());
        // The service's drain goes: served again too.
        removed_at(&mut s, 200);
        s.set_policies(BTreeMap::new(), at(202));
        s.keep_removed(&draining_in_file, at(202));
        assert!(s.held_out().is_empty());
        // Gone from the file (or DNS): nothing to keep out, shown for a
        // while, then forgotten.
        removed_at(&mut s, 300);
        s.keep_removed(&BTreeMap::new(), at(302));
        assert!(s.held_out().is_empty());
        assert!(s.status(at(302)).endpoints[0].removed);
        let later = at(301) + REMOVED_SHOWN;
        assert!(s.status(later).endpoints.is_empty());
        s.keep_removed(&BTreeMap::new(), later);
        assert!(s.drain_services().iter().all(|svc| svc == "shop"));
        // Back, and DRAINING anew: a new drain, the old removal history.
        s.set_draining(BTreeSet::from([draining()]), later);
        let st = s.status(later).endpoints;
        assert_eq!(st.len(), 1);
        assert!(!st[0].removed);
    }
}
