//! xds_cluster_impl's picker: drop categories, then the circuit breaker,
//! then the child's pick, counted until the call ends (with the backend
//! metrics of its trailers, when the cluster propagates them).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tonic::Status;

use super::{Config, DropOverload};
use crate::lb::{random, CallLabels, CallTracker, PickArgs, PickResult, Picker, SharedPicker};
use crate::orca;
use crate::xds::load_report::{BackendMetrics, ClusterLoad, EndpointLoad};
use crate::xds::resource::endpoint::LocalityName;

/// Decrements the cluster's in-flight count when a call ends.
#[derive(Debug)]
struct InFlight(Arc<AtomicU64>);

impl CallTracker for InFlight {
    fn finished(&self, _ok: bool) {
        // Each pick that counted a call is finished or released exactly once.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    fn released(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ends a picked call's count in its endpoint's (and locality's) load.
#[derive(Debug)]
struct Counted {
    load: Arc<EndpointLoad>,
    /// The cluster propagates backend metrics (read once, when the picker
    /// is made).
    propagates: bool,
}

impl CallTracker for Counted {
    fn finished(&self, ok: bool) {
        self.load.finish(ok);
    }

    fn finished_with_trailers(&self, ok: bool, trailers: Option<&http::HeaderMap>) {
        // A cluster that propagates nothing never parses the trailers.
        if self.propagates {
            if let Some(report) = trailers.and_then(orca::report_from_trailers) {
                self.load.finish_with_metrics(
                    ok,
                    &BackendMetrics {
                        cpu_utilization: report.cpu_utilization,
                        mem_utilization: report.mem_utilization,
                        application_utilization: report.application_utilization,
                        named_metrics: &report.named_metrics,
                    },
                );
                return;
            }
        }
        self.load.finish(ok);
    }

    fn released(&self) {
        // Picked but never sent: gRPC counts nothing for it.
        self.load.cancel();
    }
}

/// A reporting cluster's counters, made when the picker is: each
/// endpoint's tracker made once, so a call clones an `Arc` and allocates
/// nothing.
#[derive(Debug)]
struct Load {
    cluster: Arc<ClusterLoad>,
    endpoints: HashMap<SocketAddr, Arc<Counted>, foldhash::fast::RandomState>,
}

/// The call labels of a cluster's picks: each endpoint's (primary
/// address's), one `Arc` per locality, and the cluster's alone for an
/// endpoint it does not place.
#[derive(Debug)]
pub(crate) struct PickLabels {
    by_address: HashMap<SocketAddr, Arc<CallLabels>, foldhash::fast::RandomState>,
    cluster: Arc<CallLabels>,
}

impl PickLabels {
    /// The labels of `config`'s endpoints.
    pub(crate) fn new(config: &Config) -> Self {
        let mut by_locality: HashMap<&LocalityName, Arc<CallLabels>> = HashMap::new();
        let by_address = config
            .localities
            .iter()
            .map(|(address, locality)| {
                let labels = by_locality.entry(locality).or_insert_with(|| {
                    Arc::new(CallLabels::new(
                        config.cluster.clone(),
                        Arc::from(locality.to_string()),
                    ))
                });
                (*address, labels.clone())
            })
            .collect();
        PickLabels {
            by_address,
            cluster: Arc::new(CallLabels::new(config.cluster.clone(), Arc::from(""))),
        }
    }

    fn of(&self, address: &SocketAddr) -> Arc<CallLabels> {
        self.by_address
            .get(address)
            .unwrap_or(&self.cluster)
            .clone()
    }
}

/// The picker of one cluster.
#[derive(Debug)]
pub struct ClusterImplPicker {
    drops: Vec<DropOverload>,
    max_requests: u64,
    in_flight: Arc<InFlight>,
    load: Option<Load>,
    child: SharedPicker,
    /// The picks' call labels, when the channel records them.
    labels: Option<Arc<PickLabels>>,
}

impl ClusterImplPicker {
    /// A picker for `config` over the child's picker.
    pub fn new(config: &Config, in_flight: Arc<AtomicU64>, child: SharedPicker) -> Self {
        let load = config.load.as_ref().map(|handle| Load {
            endpoints: config
                .localities
                .iter()
                .map(|(address, locality)| {
                    let load = handle
                        .load
                        .endpoint(locality, *address, &handle.propagation);
                    let propagates = load.propagates();
                    (*address, Arc::new(Counted { load, propagates }))
                })
                .collect(),
            cluster: handle.load.clone(),
        });
        ClusterImplPicker {
            drops: config.drops.clone(),
            max_requests: u64::from(config.max_requests),
            in_flight: Arc::new(InFlight(in_flight)),
            load,
            child,
            labels: None,
        }
    }

    /// The picker, its picks carrying `labels` (when the channel records
    /// them).
    pub(crate) fn with_labels(mut self, labels: Option<Arc<PickLabels>>) -> Self {
        self.labels = labels;
        self
    }
}

impl Picker for ClusterImplPicker {
    fn pick(&self, args: &PickArgs<'_>) -> PickResult {
        for d in &self.drops {
            if random::below(1_000_000) < u64::from(d.per_million) {
                if let Some(load) = &self.load {
                    load.cluster.dropped(Some(&d.category));
                }
                return PickResult::Drop(Status::unavailable(format!(
                    "EDS-configured drop: {}",
                    d.category
                )));
            }
        }
        if self.in_flight.0.load(Ordering::Relaxed) >= self.max_requests {
            if let Some(load) = &self.load {
                load.cluster.dropped(None);
            }
            return PickResult::Drop(Status::unavailable("circuit breaker drop"));
        }
        match self.child.pick(args) {
            PickResult::Complete(mut pick) => {
                self.in_flight.0.fetch_add(1, Ordering::Relaxed);
                pick.trackers.push(self.in_flight.clone());
                if let Some(load) = &self.load {
                    if let Some(counted) = load.endpoints.get(&pick.subchannel.address()) {
                        counted.load.start();
                        pick.trackers.push(counted.clone());
                    }
                }
                if let Some(labels) = &self.labels {
                    pick.labels = Some(labels.of(&pick.subchannel.address()));
                }
                PickResult::Complete(pick)
            }
            other => other,
        }
    }
}
