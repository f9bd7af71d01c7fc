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
//!
//! Two more kinds of figures ride along:
//!
//! - Backend metrics (gRFC A64 as A85 amends it): a cluster whose CDS
//!   `lrs_report_endpoint_metrics` names fields of the ORCA per-call report
//!   ([`BackendMetricPropagation`]) sums them as its calls end
//!   ([`EndpointLoad::finish_with_metrics`]): the utilizations into the
//!   locality's `cpu_utilization`, `mem_utilization` and
//!   `application_utilization`, the named metrics into `load_metric_stats`
//!   as `named_metrics.<key>` (the locality's, and the endpoint's when per
//!   endpoint). The propagation is part of a locality's key, as in C-core,
//!   so a call's end knows what to copy without looking it up; only such
//!   clusters take a lock there, and only for calls that carried a report.
//! - Sessions ([`SESSIONS_METRIC`], `tether.sessions`): a cluster's session
//!   policy registers a [`SessionCount`], read when a report is made (never
//!   on the call path): each endpoint's `load_metric_stats` carries the
//!   sessions pinned there now, its locality's the sum, and an endpoint
//!   with sessions is listed even without calls.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;

use crate::resource::endpoint::LocalityName;
pub use crate::resource::lrs_metrics::{BackendMetricPropagation, NAMED_METRICS_PREFIX};

/// The `load_metric_stats` name of the sessions pinned to an endpoint
/// (per endpoint) or to a locality's endpoints (per locality): a gauge
/// taken when the report is made, `num_requests_finished_with_metric` 1.
pub const SESSIONS_METRIC: &str = "tether.sessions";

/// One call's backend metrics: the fields of its ORCA per-call report
/// that a load report may carry.
#[derive(Debug, Clone, Copy)]
pub struct BackendMetrics<'a> {
    /// `cpu_utilization` (0 when the report leaves it out).
    pub cpu_utilization: f64,
    /// `mem_utilization` (0 when the report leaves it out).
    pub mem_utilization: f64,
    /// `application_utilization` (0 when the report leaves it out).
    pub application_utilization: f64,
    /// `named_metrics`.
    pub named_metrics: &'a HashMap<String, f64>,
}

/// A metric's calls and their values' sum since the last report.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sum {
    calls: u64,
    total: f64,
}

impl Sum {
    fn add(&mut self, value: f64) {
        self.calls += 1;
        self.total += value;
    }

    fn merge(&mut self, other: Sum) {
        self.calls += other.calls;
        self.total += other.total;
    }

    /// The locality's top-level field: none without a call, as C-core
    /// leaves it out.
    fn unnamed(self) -> Option<epb::UnnamedEndpointLoadMetricStats> {
        (self.calls > 0).then_some(epb::UnnamedEndpointLoadMetricStats {
            num_requests_finished_with_metric: self.calls,
            total_metric_value: self.total,
        })
    }
}

/// The propagated backend metrics of calls ended since the last report.
#[derive(Debug, Default)]
struct MetricSums {
    cpu: Sum,
    mem: Sum,
    application: Sum,
    /// By the key in `named_metrics` (the prefix is added in the report).
    named: HashMap<String, Sum>,
}

impl MetricSums {
    /// Adds what `p` propagates of one call's metrics. A utilization the
    /// report left out counts as 0, as in C-core (proto3 cannot tell).
    fn record(&mut self, p: &BackendMetricPropagation, m: &BackendMetrics<'_>) {
        if p.cpu_utilization {
            self.cpu.add(m.cpu_utilization);
        }
        if p.mem_utilization {
            self.mem.add(m.mem_utilization);
        }
        if p.application_utilization {
            self.application.add(m.application_utilization);
        }
        if p.all_named_metrics || !p.named_metrics.is_empty() {
            for (key, value) in m.named_metrics {
                if !p.propagates_named(key) {
                    continue;
                }
                match self.named.get_mut(key.as_str()) {
                    Some(sum) => sum.add(*value),
                    None => {
                        self.named.insert(
                            key.clone(),
                            Sum {
                                calls: 1,
                                total: *value,
                            },
                        );
                    }
                }
            }
        }
    }

    fn merge(&mut self, other: MetricSums) {
        self.cpu.merge(other.cpu);
        self.mem.merge(other.mem);
        self.application.merge(other.application);
        for (key, sum) in other.named {
            self.named.entry(key).or_default().merge(sum);
        }
    }

    /// The named metrics as `load_metric_stats`, by name.
    fn named_stats(&self) -> Vec<epb::EndpointLoadMetricStats> {
        let mut out: Vec<epb::EndpointLoadMetricStats> = self
            .named
            .iter()
            .map(|(key, sum)| epb::EndpointLoadMetricStats {
                metric_name: format!("{NAMED_METRICS_PREFIX}{key}"),
                num_requests_finished_with_metric: sum.calls,
                total_metric_value: sum.total,
            })
            .collect();
        out.sort_by(|a, b| a.metric_name.cmp(&b.metric_name));
        out
    }
}

/// The [`SESSIONS_METRIC`] entry for `sessions` sessions.
fn sessions_stat(sessions: u64) -> epb::EndpointLoadMetricStats {
    epb::EndpointLoadMetricStats {
        metric_name: SESSIONS_METRIC.to_owned(),
        num_requests_finished_with_metric: 1,
        total_metric_value: sessions as f64,
    }
}

/// Counts a cluster's sessions for its load reports ([`SESSIONS_METRIC`]):
/// the channel's session policy (`xds_override_host`) implements it and
/// registers with [`ClusterLoad::count_sessions`].
pub trait SessionCount: Send + Sync {
    /// Each address with sessions pinned to it now, and how many.
    fn pinned(&self) -> Vec<(SocketAddr, u64)>;
}

/// Calls counted since the last report, and those in progress.
#[derive(Debug, Default)]
struct Counters {
    issued: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    in_progress: AtomicU64,
}

/// What [`Counters::take`] read.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    issued: u64,
    succeeded: u64,
    failed: u64,
    in_progress: u64,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.issued += other.issued;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.in_progress += other.in_progress;
    }

    fn is_zero(&self) -> bool {
        self.issued + self.succeeded + self.failed + self.in_progress == 0
    }
}

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
    fn take(&self) -> Totals {
        Totals {
            issued: self.issued.swap(0, Ordering::Relaxed),
            succeeded: self.succeeded.swap(0, Ordering::Relaxed),
            failed: self.failed.swap(0, Ordering::Relaxed),
            in_progress: self.in_progress.load(Ordering::Relaxed),
        }
    }
}

/// One locality's calls in one cluster, under one propagation (a cluster
/// whose propagation changed has both while old pickers live; a report
/// adds them up).
#[derive(Debug)]
struct LocalityLoad {
    propagation: Arc<BackendMetricPropagation>,
    calls: Counters,
    metrics: Mutex<MetricSums>,
    endpoints: Mutex<HashMap<SocketAddr, Weak<EndpointLoad>>>,
}

impl LocalityLoad {
    fn live_endpoints(&self) -> Vec<Arc<EndpointLoad>> {
        let mut all = lock(&self.endpoints);
        all.retain(|_, e| e.strong_count() > 0);
        all.values().filter_map(Weak::upgrade).collect()
    }
}

/// One endpoint's calls; counting them counts its locality's too.
#[derive(Debug)]
pub struct EndpointLoad {
    address: SocketAddr,
    calls: Counters,
    metrics: Mutex<MetricSums>,
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

    /// A call [`EndpointLoad::start`] counted has ended, `ok` or not, with
    /// its backend's per-call metrics: counted as [`EndpointLoad::finish`]
    /// does, and what the cluster propagates of them is summed for the
    /// endpoint and its locality.
    pub fn finish_with_metrics(&self, ok: bool, metrics: &BackendMetrics<'_>) {
        self.finish(ok);
        let p = &self.locality.propagation;
        if p.is_empty() {
            return;
        }
        lock(&self.metrics).record(p, metrics);
        lock(&self.locality.metrics).record(p, metrics);
    }

    /// Whether the cluster propagates any backend metric: when not, a
    /// call's metrics need not be read.
    pub fn propagates(&self) -> bool {
        !self.locality.propagation.is_empty()
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
    /// Per locality, one load per propagation in use (nearly always one).
    localities: Mutex<HashMap<LocalityName, Vec<Weak<LocalityLoad>>>>,
    /// Drops by category (EDS `drop_overloads`), and without one (circuit
    /// breaking), since the last report.
    drops: Mutex<BTreeMap<String, u64>>,
    uncategorized_drops: AtomicU64,
    /// Where its sessions are counted (one per channel that uses it).
    sessions: Mutex<Vec<Weak<dyn SessionCount>>>,
    last_report: Mutex<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ClusterLoad {
    /// The counters of `address` in `locality` under `propagation`, made
    /// once and shared while a picker holds them.
    pub fn endpoint(
        &self,
        locality: &LocalityName,
        address: SocketAddr,
        propagation: &Arc<BackendMetricPropagation>,
    ) -> Arc<EndpointLoad> {
        let locality = {
            let mut all = lock(&self.localities);
            let found = all.get_mut(locality).and_then(|loads| {
                loads.retain(|l| l.strong_count() > 0);
                loads
                    .iter()
                    .filter_map(Weak::upgrade)
                    .find(|l| l.propagation == *propagation)
            });
            match found {
                Some(l) => l,
                None => {
                    let l = Arc::new(LocalityLoad {
                        propagation: propagation.clone(),
                        calls: Counters::default(),
                        metrics: Mutex::default(),
                        endpoints: Mutex::new(HashMap::new()),
                    });
                    // The name is cloned only for a new locality.
                    all.entry(locality.clone())
                        .or_default()
                        .push(Arc::downgrade(&l));
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
            metrics: Mutex::default(),
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

    /// Counts `source`'s sessions in the reports ([`SESSIONS_METRIC`])
    /// while it lives.
    pub fn count_sessions(&self, source: Weak<dyn SessionCount>) {
        let mut all = lock(&self.sessions);
        all.retain(|s| s.strong_count() > 0);
        all.push(source);
    }

    /// The cluster's name.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// This interval's report of the cluster, its figures reset, as the
    /// LRS stream would send it (per endpoint or not), for tools and tests
    /// that read a cluster's load without a server. What is taken here is
    /// not sent.
    pub fn take_report(&self, per_endpoint: bool) -> epb::ClusterStats {
        self.report(per_endpoint, Instant::now(), true).0
    }

    /// The sessions pinned per address, summed over the sources; none
    /// when no source lives.
    fn pinned_sessions(&self) -> Option<HashMap<SocketAddr, u64>> {
        let sources: Vec<Arc<dyn SessionCount>> = {
            let mut all = lock(&self.sessions);
            all.retain(|s| s.strong_count() > 0);
            all.iter().filter_map(Weak::upgrade).collect()
        };
        if sources.is_empty() {
            return None;
        }
        let mut out = HashMap::new();
        for s in sources {
            for (address, n) in s.pinned() {
                *out.entry(address).or_default() += n;
            }
        }
        Some(out)
    }

    /// This interval's report, the counters reset (localities without a
    /// call or a session left out), and whether it is all zero. Sessions
    /// are counted when `sessions` is set.
    fn report(
        &self,
        per_endpoint: bool,
        now: Instant,
        sessions: bool,
    ) -> (epb::ClusterStats, bool) {
        let interval = {
            let mut last = lock(&self.last_report);
            let d = now.saturating_duration_since(*last);
            *last = now;
            d
        };
        let localities: BTreeMap<LocalityName, Vec<Arc<LocalityLoad>>> = {
            let mut all = lock(&self.localities);
            all.retain(|_, loads| {
                loads.retain(|l| l.strong_count() > 0);
                !loads.is_empty()
            });
            all.iter()
                .map(|(name, loads)| {
                    (
                        name.clone(),
                        loads.iter().filter_map(Weak::upgrade).collect(),
                    )
                })
                .collect()
        };
        let mut pinned = if sessions {
            self.pinned_sessions()
        } else {
            None
        };
        let gauged = pinned.is_some();
        let mut stats = Vec::new();
        for (name, loads) in localities {
            let mut calls = Totals::default();
            let mut metrics = MetricSums::default();
            let mut endpoints: BTreeMap<SocketAddr, (Totals, MetricSums)> = BTreeMap::new();
            for l in &loads {
                calls.add(l.calls.take());
                metrics.merge(std::mem::take(&mut *lock(&l.metrics)));
                for e in l.live_endpoints() {
                    let (c, m) = endpoints.entry(e.address).or_default();
                    c.add(e.calls.take());
                    m.merge(std::mem::take(&mut *lock(&e.metrics)));
                }
            }
            let mut locality_sessions = 0;
            let mut endpoint_stats = Vec::new();
            for (address, (calls, metrics)) in endpoints {
                // Taken out so that an address in two localities counts once.
                let sessions = pinned
                    .as_mut()
                    .and_then(|p| p.remove(&address))
                    .unwrap_or(0);
                locality_sessions += sessions;
                if per_endpoint && (!calls.is_zero() || sessions > 0) {
                    let mut load_metric_stats = metrics.named_stats();
                    if gauged {
                        load_metric_stats.push(sessions_stat(sessions));
                    }
                    endpoint_stats.push(epb::UpstreamEndpointStats {
                        address: Some(socket_address(address)),
                        total_successful_requests: calls.succeeded,
                        total_requests_in_progress: calls.in_progress,
                        total_error_requests: calls.failed,
                        total_issued_requests: calls.issued,
                        load_metric_stats,
                        ..Default::default()
                    });
                }
            }
            if calls.is_zero() && locality_sessions == 0 {
                continue;
            }
            let mut load_metric_stats = metrics.named_stats();
            if gauged {
                load_metric_stats.push(sessions_stat(locality_sessions));
            }
            stats.push(epb::UpstreamLocalityStats {
                locality: Some(core::Locality {
                    region: name.region.clone(),
                    zone: name.zone.clone(),
                    sub_zone: name.sub_zone.clone(),
                }),
                total_successful_requests: calls.succeeded,
                total_requests_in_progress: calls.in_progress,
                total_error_requests: calls.failed,
                total_issued_requests: calls.issued,
                cpu_utilization: metrics.cpu.unnamed(),
                mem_utilization: metrics.mem.unnamed(),
                application_utilization: metrics.application.unnamed(),
                load_metric_stats,
                upstream_endpoint_stats: endpoint_stats,
                ..Default::default()
            });
        }
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
            sessions: Mutex::new(Vec::new()),
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
                let (stats, z) = c.report(plan.per_endpoint, now, true);
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
            let _ = c.report(true, now, false);
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

    fn none() -> Arc<BackendMetricPropagation> {
        Arc::new(BackendMetricPropagation::default())
    }

    fn per_endpoint() -> ReportPlan {
        ReportPlan {
            all: true,
            clusters: Vec::new(),
            per_endpoint: true,
        }
    }

    /// A call's metrics: utilizations and named metrics.
    fn call(e: &EndpointLoad, cpu: f64, app: f64, named: &[(&str, f64)]) {
        let named: HashMap<String, f64> = named.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        e.start();
        e.finish_with_metrics(
            true,
            &BackendMetrics {
                cpu_utilization: cpu,
                mem_utilization: 0.0,
                application_utilization: app,
                named_metrics: &named,
            },
        );
    }

    /// `load_metric_stats` as (name, calls, total).
    fn named(stats: &[epb::EndpointLoadMetricStats]) -> Vec<(String, u64, f64)> {
        stats
            .iter()
            .map(|m| {
                (
                    m.metric_name.clone(),
                    m.num_requests_finished_with_metric,
                    m.total_metric_value,
                )
            })
            .collect()
    }

    fn unnamed(m: Option<epb::UnnamedEndpointLoadMetricStats>) -> Option<(u64, f64)> {
        m.map(|m| (m.num_requests_finished_with_metric, m.total_metric_value))
    }

    #[test]
    fn lrs_report_endpoint_metrics_parse_ignoring_unknown_names() {
        let p = BackendMetricPropagation::from_names([
            "cpu_utilization",
            "application_utilization",
            "named_metrics.foo",
            "named_metrics.bar",
            // Not propagated by gRPC (yet): ignored, not refused.
            "eps",
            "utilization.x",
            "request_cost.y",
            "named_metrics.",
            "something_new",
        ]);
        assert!(p.cpu_utilization && p.application_utilization);
        assert!(!p.mem_utilization && !p.all_named_metrics);
        assert_eq!(
            p.named_metrics.iter().collect::<Vec<_>>(),
            ["bar", "foo"],
            "{p:?}"
        );
        assert!(p.propagates_named("foo") && !p.propagates_named("baz"));

        let all = BackendMetricPropagation::from_names(["named_metrics.foo", "named_metrics.*"]);
        assert!(
            all.all_named_metrics && all.named_metrics.is_empty(),
            "{all:?}"
        );
        assert!(all.propagates_named("anything"));
        assert_eq!(
            all,
            BackendMetricPropagation::from_names(["named_metrics.*"])
        );

        assert!(BackendMetricPropagation::from_names(Vec::<String>::new()).is_empty());
        assert!(BackendMetricPropagation::from_names(["eps", "named_metrics."]).is_empty());
        assert!(!BackendMetricPropagation::from_names(["mem_utilization"]).is_empty());
    }

    #[test]
    fn propagated_metrics_are_summed_per_locality_and_endpoint_then_reset() {
        let store = LoadStore::new();
        let load = store.cluster("echo", None);
        let p = Arc::new(BackendMetricPropagation::from_names([
            "cpu_utilization",
            "application_utilization",
            "named_metrics.foo",
        ]));
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let c: SocketAddr = "127.0.0.1:3".parse().unwrap();
        let ea = load.endpoint(&locality("a"), a, &p);
        let eb = load.endpoint(&locality("a"), b, &p);
        let ec = load.endpoint(&locality("b"), c, &p);
        assert!(ea.propagates());
        call(&ea, 0.5, 0.2, &[("foo", 1.0), ("bar", 9.0)]);
        // A utilization left out (0) still counts a call, as in C-core.
        call(&ea, 0.0, 0.0, &[("foo", 2.0)]);
        call(&eb, 0.25, 0.0, &[]);
        // A call without a report counts no metric.
        eb.start();
        eb.finish(true);
        call(&ec, 1.0, 0.0, &[("foo", 4.0)]);

        let (report, zero) = store.report(&per_endpoint(), Instant::now());
        assert!(!zero);
        let l = &report[0].upstream_locality_stats;
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].total_successful_requests, 4);
        assert_eq!(unnamed(l[0].cpu_utilization), Some((3, 0.75)));
        assert_eq!(unnamed(l[0].mem_utilization), None, "not propagated");
        assert_eq!(unnamed(l[0].application_utilization), Some((3, 0.2)));
        assert_eq!(
            named(&l[0].load_metric_stats),
            [("named_metrics.foo".to_owned(), 2, 3.0)]
        );
        let endpoints = &l[0].upstream_endpoint_stats;
        assert_eq!(endpoints.len(), 2);
        assert_eq!(
            named(&endpoints[0].load_metric_stats),
            [("named_metrics.foo".to_owned(), 2, 3.0)]
        );
        assert!(endpoints[1].load_metric_stats.is_empty());
        assert_eq!(unnamed(l[1].cpu_utilization), Some((1, 1.0)));
        assert_eq!(
            named(&l[1].load_metric_stats),
            [("named_metrics.foo".to_owned(), 1, 4.0)]
        );

        // Reset with the other counters.
        call(&ea, 0.1, 0.0, &[]);
        let (again, _) = store.report(&per_endpoint(), Instant::now());
        let l = &again[0].upstream_locality_stats;
        assert_eq!(l.len(), 1);
        assert_eq!(unnamed(l[0].cpu_utilization), Some((1, 0.1)));
        assert!(l[0].load_metric_stats.is_empty());
        let (quiet, zero) = store.report(&per_endpoint(), Instant::now());
        assert!(zero);
        assert!(quiet[0].upstream_locality_stats.is_empty());
    }

    #[test]
    fn without_propagation_nothing_is_summed() {
        let store = LoadStore::new();
        let load = store.cluster("echo", None);
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = load.endpoint(&locality("a"), a, &none());
        assert!(!e.propagates());
        call(&e, 0.5, 0.5, &[("foo", 1.0)]);
        let (report, _) = store.report(&per_endpoint(), Instant::now());
        let l = &report[0].upstream_locality_stats[0];
        assert_eq!(l.total_successful_requests, 1);
        assert_eq!(l.cpu_utilization, None);
        assert_eq!(l.application_utilization, None);
        assert!(l.load_metric_stats.is_empty());
        assert!(l.upstream_endpoint_stats[0].load_metric_stats.is_empty());
    }

    #[test]
    fn a_locality_under_two_propagations_is_reported_once() {
        let store = LoadStore::new();
        let load = store.cluster("echo", None);
        let cpu = Arc::new(BackendMetricPropagation::from_names(["cpu_utilization"]));
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        // An old picker's counters and a new one's, after a CDS update.
        let old = load.endpoint(&locality("a"), a, &none());
        let new = load.endpoint(&locality("a"), a, &cpu);
        assert!(!Arc::ptr_eq(&old, &new));
        call(&old, 0.9, 0.0, &[]);
        call(&new, 0.5, 0.0, &[]);
        let (report, _) = store.report(&per_endpoint(), Instant::now());
        let l = &report[0].upstream_locality_stats;
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].total_successful_requests, 2);
        assert_eq!(unnamed(l[0].cpu_utilization), Some((1, 0.5)));
        assert_eq!(l[0].upstream_endpoint_stats.len(), 1);
        assert_eq!(l[0].upstream_endpoint_stats[0].total_issued_requests, 2);
    }

    /// Sessions a test sets.
    #[derive(Default)]
    struct Pinned(Mutex<Vec<(SocketAddr, u64)>>);

    impl SessionCount for Pinned {
        fn pinned(&self) -> Vec<(SocketAddr, u64)> {
            lock(&self.0).clone()
        }
    }

    #[test]
    fn sessions_are_a_gauge_per_endpoint_summed_per_locality() {
        let store = LoadStore::new();
        let load = store.cluster("echo", None);
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let c: SocketAddr = "127.0.0.1:3".parse().unwrap();
        let unknown: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let ea = load.endpoint(&locality("a"), a, &none());
        let _eb = load.endpoint(&locality("a"), b, &none());
        let _ec = load.endpoint(&locality("b"), c, &none());
        let pinned = Arc::new(Pinned::default());
        let source: Arc<dyn SessionCount> = pinned.clone();
        load.count_sessions(Arc::downgrade(&source));
        *lock(&pinned.0) = vec![(a, 2), (b, 3), (unknown, 7)];
        ea.start();
        ea.finish(true);

        let sessions = |stats: &[epb::EndpointLoadMetricStats]| {
            named(stats)
                .into_iter()
                .find(|(n, _, _)| n == SESSIONS_METRIC)
                .map(|(_, calls, total)| (calls, total))
        };
        let (report, zero) = store.report(&per_endpoint(), Instant::now());
        assert!(!zero);
        let l = &report[0].upstream_locality_stats;
        assert_eq!(l.len(), 1, "locality b has neither calls nor sessions");
        assert_eq!(sessions(&l[0].load_metric_stats), Some((1, 5.0)));
        let e = &l[0].upstream_endpoint_stats;
        assert_eq!(e.len(), 2, "b is listed for its sessions: {e:?}");
        assert_eq!(e[0].total_issued_requests, 1);
        assert_eq!(sessions(&e[0].load_metric_stats), Some((1, 2.0)));
        assert_eq!(e[1].total_issued_requests, 0);
        assert_eq!(sessions(&e[1].load_metric_stats), Some((1, 3.0)));

        // Only sessions, no call: still reported, not all zero.
        *lock(&pinned.0) = vec![(c, 1)];
        let (report, zero) = store.report(&per_endpoint(), Instant::now());
        assert!(!zero, "{report:?}");
        let l = &report[0].upstream_locality_stats;
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].locality.as_ref().unwrap().zone, "b");
        assert_eq!(l[0].total_issued_requests, 0);
        assert_eq!(sessions(&l[0].load_metric_stats), Some((1, 1.0)));
        assert_eq!(
            sessions(&l[0].upstream_endpoint_stats[0].load_metric_stats),
            Some((1, 1.0))
        );

        // Per locality only: the sum, no endpoints.
        let per_locality = ReportPlan {
            per_endpoint: false,
            ..per_endpoint()
        };
        let (report, _) = store.report(&per_locality, Instant::now());
        let l = &report[0].upstream_locality_stats[0];
        assert_eq!(sessions(&l.load_metric_stats), Some((1, 1.0)));
        assert!(l.upstream_endpoint_stats.is_empty());

        // A call's endpoint says 0 sessions while a source counts.
        lock(&pinned.0).clear();
        ea.start();
        ea.finish(true);
        let (report, _) = store.report(&per_endpoint(), Instant::now());
        let l = &report[0].upstream_locality_stats[0];
        assert_eq!(sessions(&l.load_metric_stats), Some((1, 0.0)));
        assert_eq!(
            sessions(&l.upstream_endpoint_stats[0].load_metric_stats),
            Some((1, 0.0))
        );
        let (_, zero) = store.report(&per_endpoint(), Instant::now());
        assert!(zero, "no sessions and no calls");

        // The source gone: no gauge at all.
        drop((source, pinned));
        ea.start();
        ea.finish(true);
        let (report, _) = store.report(&per_endpoint(), Instant::now());
        let l = &report[0].upstream_locality_stats[0];
        assert_eq!(sessions(&l.load_metric_stats), None);
        assert_eq!(
            sessions(&l.upstream_endpoint_stats[0].load_metric_stats),
            None
        );
    }

    #[test]
    fn a_report_counts_calls_per_locality_and_endpoint_then_resets() {
        let store = LoadStore::new();
        let load = store.cluster("echo", Some("echo-eds"));
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let ea = load.endpoint(&locality("a"), a, &none());
        let eb = load.endpoint(&locality("b"), b, &none());
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
        let e1 = load.endpoint(&locality("a"), a, &none());
        let e2 = load.endpoint(&locality("a"), a, &none());
        assert!(Arc::ptr_eq(&e1, &e2));
        assert!(Arc::ptr_eq(&load, &store.cluster("echo", None)));
        drop((e1, e2, load));
        assert!(store.is_empty());
    }
}
