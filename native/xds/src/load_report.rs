//! Load reporting (LRS, gRFC A27): the counters a cluster's calls feed and
//! the reports made of them.
//!
//! A cluster whose CDS resource names an `lrs_server` gets a
//! [`ClusterLoad`] from its client's [`LoadStore`]; the channel's
//! `xds_cluster_impl` takes an [`EndpointLoad`] for each endpoint when it
//! builds a picker (never on the call path), counts each call it picks on
//! it ([`EndpointLoad::start`], then [`EndpointLoad::finish`]) and each call
//! it drops ([`ClusterLoad::dropped`]). Counting is a few atomic additions;
//! nothing locks on the call path. The client's LRS stream takes
//! the store's report every interval the server asks for: per cluster,
//! per locality (and per endpoint when the server sets
//! `report_endpoint_granularity`) the calls issued, succeeded and failed
//! since the last report and those in progress, and the drops by category.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;

use crate::resource::endpoint::LocalityName;

/// Calls counted since the last report, and those in progress.
#[derive(Debug, Default)]
struct Counters {
    issued: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    in_progress: AtomicU64,
}

/// What [`Counters::take`] read: issued, succeeded, failed, in progress.
type Taken = (u64, u64, u64, u64);

impl Counters {
    fn start(&self) {
        self.issued.fetch_add(1, Ordering::Relaxed);
        self.in_progress.fetch_add(1, Ordering::Relaxed);
    }

    fn finish(&self, ok: bool) {
        let done = if ok { &self.succeeded } else { &self.failed };
        done.fetch_add(1, Ordering::Relaxed);
        self.in_progress.fetch_sub(1, Ordering::Relaxed);
    }

    fn cancel(&self) {
        // A report may have taken the issued count since: never below 0.
        let _ = self
            .issued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        self.in_progress.fetch_sub(1, Ordering::Relaxed);
    }

    /// The interval's figures, reset; calls in progress stay counted.
    fn take(&self) -> Taken {
        (
            self.issued.swap(0, Ordering::Relaxed),
            self.succeeded.swap(0, Ordering::Relaxed),
            self.failed.swap(0, Ordering::Relaxed),
            self.in_progress.load(Ordering::Relaxed),
        )
    }
}

/// One locality's calls in one cluster.
#[derive(Debug)]
struct LocalityLoad {
    name: LocalityName,
    calls: Counters,
    endpoints: Mutex<HashMap<SocketAddr, Weak<EndpointLoad>>>,
}

/// One endpoint's calls; counting them counts its locality's too.
#[derive(Debug)]
pub struct EndpointLoad {
    address: SocketAddr,
    calls: Counters,
    locality: Arc<LocalityLoad>,
}

impl EndpointLoad {
    /// A call picked on this endpoint: issued and in progress.
    pub fn start(&self) {
        self.calls.start();
        self.locality.calls.start();
    }

    /// A call [`EndpointLoad::start`] counted has ended, `ok` or not.
    pub fn finish(&self, ok: bool) {
        self.calls.finish(ok);
        self.locality.calls.finish(ok);
    }

    /// A call [`EndpointLoad::start`] counted was never sent (its pick was
    /// given up): as if it had not been counted.
    pub fn cancel(&self) {
        self.calls.cancel();
        self.locality.calls.cancel();
    }

    /// The endpoint's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

/// One cluster's load: its localities' and endpoints' calls and its drops.
#[derive(Debug)]
pub struct ClusterLoad {
    cluster: String,
    eds_service_name: Option<String>,
    localities: Mutex<HashMap<LocalityName, Weak<LocalityLoad>>>,
    /// Drops by category (EDS `drop_overloads`), and without one (circuit
    /// breaking), since the last report.
    drops: Mutex<BTreeMap<String, u64>>,
    uncategorized_drops: AtomicU64,
    last_report: Mutex<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ClusterLoad {
    /// The counters of `address` in `locality`, made once and shared while
    /// a picker holds them.
    pub fn endpoint(&self, locality: &LocalityName, address: SocketAddr) -> Arc<EndpointLoad> {
        let locality = {
            let mut all = lock(&self.localities);
            match all.get(locality).and_then(Weak::upgrade) {
                Some(l) => l,
                None => {
                    let l = Arc::new(LocalityLoad {
                        name: locality.clone(),
                        calls: Counters::default(),
                        endpoints: Mutex::new(HashMap::new()),
                    });
                    all.insert(locality.clone(), Arc::downgrade(&l));
                    l
                }
            }
        };
        let mut endpoints = lock(&locality.endpoints);
        if let Some(e) = endpoints.get(&address).and_then(Weak::upgrade) {
            return e;
        }
        let e = Arc::new(EndpointLoad {
            address,
            calls: Counters::default(),
            locality: locality.clone(),
        });
        endpoints.insert(address, Arc::downgrade(&e));
        e
    }

    /// A call dropped: by an EDS drop category, or (`None`) by the circuit
    /// breaker, which gRPC reports as an uncategorized drop.
    pub fn dropped(&self, category: Option<&str>) {
        match category {
            Some(c) => *lock(&self.drops).entry(c.to_owned()).or_default() += 1,
            None => {
                self.uncategorized_drops.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The cluster's name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// This interval's report, the counters reset (localities without a
    /// call left out), and whether it is all zero.
    fn report(&self, per_endpoint: bool, now: Instant) -> (epb::ClusterStats, bool) {
        let interval = {
            let mut last = lock(&self.last_report);
            let d = now.saturating_duration_since(*last);
            *last = now;
            d
        };
        let localities: Vec<Arc<LocalityLoad>> = {
            let mut all = lock(&self.localities);
            all.retain(|_, l| l.strong_count() > 0);
            all.values().filter_map(Weak::upgrade).collect()
        };
        let mut stats = Vec::new();
        for l in localities {
            let (issued, succeeded, failed, in_progress) = l.calls.take();
            let endpoints: Vec<Arc<EndpointLoad>> = {
                let mut all = lock(&l.endpoints);
                all.retain(|_, e| e.strong_count() > 0);
                all.values().filter_map(Weak::upgrade).collect()
            };
            let mut endpoint_stats = Vec::new();
            for e in endpoints {
                let (issued, succeeded, failed, in_progress) = e.calls.take();
                if per_endpoint && issued + succeeded + failed + in_progress > 0 {
                    endpoint_stats.push(epb::UpstreamEndpointStats {
                        address: Some(socket_address(e.address)),
                        total_successful_requests: succeeded,
                        total_requests_in_progress: in_progress,
                        total_error_requests: failed,
                        total_issued_requests: issued,
                        ..Default::default()
                    });
                }
            }
            if issued + succeeded + failed + in_progress == 0 {
                continue;
            }
            endpoint_stats.sort_by_key(|e| format!("{:?}", e.address));
            stats.push(epb::UpstreamLocalityStats {
                locality: Some(core::Locality {
                    region: l.name.region.clone(),
                    zone: l.name.zone.clone(),
                    sub_zone: l.name.sub_zone.clone(),
                }),
                total_successful_requests: succeeded,
                total_requests_in_progress: in_progress,
                total_error_requests: failed,
                total_issued_requests: issued,
                upstream_endpoint_stats: endpoint_stats,
                ..Default::default()
            });
        }
        stats.sort_by(|a, b| format!("{:?}", a.locality).cmp(&format!("{:?}", b.locality)));
        let drops: Vec<(String, u64)> = std::mem::take(&mut *lock(&self.drops))
            .into_iter()
            .collect();
        let uncategorized = self.uncategorized_drops.swap(0, Ordering::Relaxed);
        let total_dropped = uncategorized + drops.iter().map(|(_, n)| n).sum::<u64>();
        let zero = stats.is_empty() && total_dropped == 0;
        let stats = epb::ClusterStats {
            cluster_name: self.cluster.clone(),
            cluster_service_name: self.eds_service_name.clone().unwrap_or_default(),
            upstream_locality_stats: stats,
            total_dropped_requests: total_dropped,
            dropped_requests: drops
                .into_iter()
                .map(
                    |(category, dropped_count)| epb::cluster_stats::DroppedRequests {
                        category,
                        dropped_count,
                    },
                )
                .collect(),
            load_report_interval: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: interval.as_secs() as i64,
                nanos: interval.subsec_nanos() as i32,
            }),
        };
        (stats, zero)
    }
}

fn socket_address(a: SocketAddr) -> core::Address {
    core::Address {
        address: Some(core::address::Address::SocketAddress(core::SocketAddress {
            address: a.ip().to_string(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(u32::from(
                a.port(),
            ))),
            ..Default::default()
        })),
    }
}

/// Which clusters a server asked for, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReportPlan {
    /// Every cluster (`send_all_clusters`).
    pub all: bool,
    /// Else these cluster names.
    pub clusters: Vec<String>,
    /// Per endpoint too (`report_endpoint_granularity`).
    pub per_endpoint: bool,
}

/// A cluster's name and EDS service name.
type ClusterKey = (String, Option<String>);

/// A client's clusters' load, by cluster and EDS service name. Cheap to
/// clone; a cluster is forgotten once no picker holds its [`ClusterLoad`].
#[derive(Debug, Clone, Default)]
pub struct LoadStore {
    clusters: Arc<Mutex<HashMap<ClusterKey, Weak<ClusterLoad>>>>,
}

impl LoadStore {
    /// An empty store.
    pub fn new() -> Self {
        LoadStore::default()
    }

    /// The load of `cluster` (with its EDS service name), shared by every
    /// holder.
    pub fn cluster(&self, cluster: &str, eds_service_name: Option<&str>) -> Arc<ClusterLoad> {
        let key = (cluster.to_owned(), eds_service_name.map(str::to_owned));
        let mut all = lock(&self.clusters);
        if let Some(c) = all.get(&key).and_then(Weak::upgrade) {
            return c;
        }
        let c = Arc::new(ClusterLoad {
            cluster: key.0.clone(),
            eds_service_name: key.1.clone(),
            localities: Mutex::new(HashMap::new()),
            drops: Mutex::new(BTreeMap::new()),
            uncategorized_drops: AtomicU64::new(0),
            last_report: Mutex::new(Instant::now()),
        });
        all.insert(key, Arc::downgrade(&c));
        c
    }

    /// Whether any cluster is held.
    pub fn is_empty(&self) -> bool {
        let mut all = lock(&self.clusters);
        all.retain(|_, c| c.strong_count() > 0);
        all.is_empty()
    }

    /// The report of the clusters `plan` asks for at `now`, each one's
    /// counters reset (the others' are kept for a later plan): every such
    /// cluster, its figures zero when it had no call, so that a server
    /// learns a cluster went quiet, and whether every figure is zero.
    pub(crate) fn report(&self, plan: &ReportPlan, now: Instant) -> (Vec<epb::ClusterStats>, bool) {
        let clusters: Vec<Arc<ClusterLoad>> = {
            let mut all = lock(&self.clusters);
            all.retain(|_, c| c.strong_count() > 0);
            all.values().filter_map(Weak::upgrade).collect()
        };
        let mut zero = true;
        let mut out: Vec<epb::ClusterStats> = clusters
            .iter()
            .filter(|c| plan.all || plan.clusters.iter().any(|n| *n == c.cluster))
            .map(|c| {
                let (stats, z) = c.report(plan.per_endpoint, now);
                zero &= z;
                stats
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.cluster_name, &a.cluster_service_name)
                .cmp(&(&b.cluster_name, &b.cluster_service_name))
        });
        (out, zero)
    }

    /// Resets every cluster's interval to start at `now` (a new stream's
    /// first report covers from its start), keeping calls in progress.
    pub(crate) fn restart(&self, now: Instant) {
        let all = lock(&self.clusters);
        for c in all.values().filter_map(Weak::upgrade) {
            let _ = c.report(true, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locality(zone: &str) -> LocalityName {
        LocalityName {
            region: "us".into(),
            zone: zone.into(),
            sub_zone: String::new(),
        }
    }

    #[test]
    fn a_report_counts_calls_per_locality_and_endpoint_then_resets() {
        let store = LoadStore::new();
        let load = store.cluster("echo", Some("echo-eds"));
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let ea = load.endpoint(&locality("a"), a);
        let eb = load.endpoint(&locality("b"), b);
        for _ in 0..3 {
            ea.start();
            ea.finish(true);
        }
        eb.start();
        eb.finish(false);
        eb.start(); // in progress
        load.dropped(Some("lb"));
        load.dropped(None);
        let plan = ReportPlan {
            all: false,
            clusters: vec!["echo".into()],
            per_endpoint: true,
        };
        let (report, zero) = store.report(&plan, Instant::now());
        assert!(!zero);
        assert_eq!(report.len(), 1);
        let c = &report[0];
        assert_eq!(c.cluster_service_name, "echo-eds");
        assert_eq!(c.total_dropped_requests, 2);
        assert_eq!(c.dropped_requests[0].category, "lb");
        let zones: Vec<(String, u64, u64, u64, u64)> = c
            .upstream_locality_stats
            .iter()
            .map(|l| {
                (
                    l.locality.clone().unwrap().zone,
                    l.total_issued_requests,
                    l.total_successful_requests,
                    l.total_error_requests,
                    l.total_requests_in_progress,
                )
            })
            .collect();
        assert_eq!(zones, [("a".into(), 3, 3, 0, 0), ("b".into(), 2, 0, 1, 1)]);
        assert_eq!(
            c.upstream_locality_stats[1].upstream_endpoint_stats.len(),
            1
        );

        // Reset, except what is in progress; a cluster not asked for is kept.
        let (again, _) = store.report(&plan, Instant::now());
        let l = &again[0].upstream_locality_stats;
        assert_eq!(l.len(), 1);
        assert_eq!(
            (l[0].total_issued_requests, l[0].total_requests_in_progress),
            (0, 1)
        );
        eb.finish(true);
        let other = ReportPlan::default();
        assert!(store.report(&other, Instant::now()).0.is_empty());
        let (last, _) = store.report(&plan, Instant::now());
        assert_eq!(
            last[0].upstream_locality_stats[0].total_successful_requests,
            1
        );
        // Quiet now: the cluster is still reported, all zero.
        let (quiet, zero) = store.report(&plan, Instant::now());
        assert!(zero);
        assert_eq!(quiet.len(), 1);
        assert_eq!(quiet[0].cluster_name, "echo");
        assert!(quiet[0].upstream_locality_stats.is_empty());
    }

    #[test]
    fn counters_are_shared_while_held_and_forgotten_after() {
        let store = LoadStore::new();
        let load = store.cluster("echo", None);
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e1 = load.endpoint(&locality("a"), a);
        let e2 = load.endpoint(&locality("a"), a);
        assert!(Arc::ptr_eq(&e1, &e2));
        assert!(Arc::ptr_eq(&load, &store.cluster("echo", None)));
        drop((e1, e2, load));
        assert!(store.is_empty());
    }
}
