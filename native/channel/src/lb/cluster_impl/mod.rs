//! `xds_cluster_impl`: a cluster's drops and circuit breaking, applied
//! before its endpoints are chosen.
//!
//! - EDS `drop_overloads`: each category drops its share of calls,
//!   UNAVAILABLE `EDS-configured drop: <category>`, checked in order.
//! - Circuit breaking: with `max_requests` calls of the cluster in flight
//!   (default 1024), new calls fail UNAVAILABLE `circuit breaker drop`.
//!   A call counts from its pick until it ends.
//!
//! Both are drops: they fail even `wait_for_ready` calls, as in C-core.
//!
//! A cluster that reports load (LRS, gRFC A27) counts here too, as
//! C-core's `xds_cluster_impl` does: each drop by its category (circuit
//! breaking uncategorized), each call picked on an endpoint as issued and
//! in progress until it ends, succeeded or failed. The picker holds each
//! endpoint's counters, so a call costs a few atomic additions; a cluster
//! that does not report pays nothing. When the cluster's
//! `lrs_report_endpoint_metrics` propagates backend metrics (gRFC A85), a
//! call's end reads the ORCA report in its trailers and sums what is
//! propagated; otherwise the trailers are not looked at.

mod picker;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::xds::load_report::{BackendMetricPropagation, ClusterLoad};
use crate::xds::resource::endpoint::LocalityName;

use super::{Child, ConnectivityState, Ctx, Event, LbConfig, LbPolicy, PolicyStats, SharedPicker};
pub use crate::xds::resource::endpoint::DropOverload;
pub use picker::ClusterImplPicker;

// Public with `internals`; unused inside the crate.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use crate::xds::resource::cluster::DEFAULT_MAX_REQUESTS;

/// `xds_cluster_impl`'s config.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The cluster (reported with each pick for session cookies, A60).
    pub cluster: Arc<str>,
    /// The EDS service name, if the cluster sets one.
    pub eds_service_name: Option<String>,
    /// Calls in flight at most.
    pub max_requests: u32,
    /// Drop categories in order.
    pub drops: Vec<DropOverload>,
    /// Where the cluster's load is counted, when it reports load.
    pub load: Option<LoadHandle>,
    /// Each endpoint's (primary address's) locality, for the load's
    /// counters (empty when the cluster does not report).
    pub localities: HashMap<SocketAddr, LocalityName>,
    /// The policy underneath (priority).
    pub child: Box<LbConfig>,
}

/// A cluster's load counters ([`ClusterLoad`]) and what its reports carry
/// of its calls' ORCA reports (gRFC A85); equal when they are the same
/// counters with an equal propagation.
#[derive(Debug, Clone)]
pub struct LoadHandle {
    /// The counters.
    pub load: Arc<ClusterLoad>,
    /// The backend metrics propagated (CDS `lrs_report_endpoint_metrics`).
    pub propagation: Arc<BackendMetricPropagation>,
}

impl LoadHandle {
    /// The handle of `load` propagating `propagation`.
    pub fn new(load: Arc<ClusterLoad>, propagation: BackendMetricPropagation) -> Self {
        LoadHandle {
            load,
            propagation: Arc::new(propagation),
        }
    }
}

impl PartialEq for LoadHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.load, &other.load) && self.propagation == other.propagation
    }
}

/// The `xds_cluster_impl` policy.
pub struct ClusterImpl {
    config: Option<Config>,
    child: Option<Child>,
    /// Calls in flight, shared by every picker this policy makes.
    in_flight: Arc<AtomicU64>,
    picker: Option<SharedPicker>,
    /// Each endpoint's call labels, while the channel records them.
    labels: Option<Arc<picker::PickLabels>>,
}

impl Default for ClusterImpl {
    fn default() -> Self {
        ClusterImpl::new()
    }
}

impl ClusterImpl {
    /// A policy with no config yet.
    pub fn new() -> Self {
        ClusterImpl {
            config: None,
            child: None,
            in_flight: Arc::new(AtomicU64::new(0)),
            picker: None,
            labels: None,
        }
    }

    /// Calls of this cluster in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn drops_all(&self) -> bool {
        self.config
            .as_ref()
            .is_some_and(|c| c.drops.iter().any(|d| d.per_million >= 1_000_000))
    }

    fn refresh(&mut self) -> bool {
        let (Some(config), Some(child)) = (&self.config, &self.child) else {
            return false;
        };
        self.picker = Some(Arc::new(
            ClusterImplPicker::new(config, self.in_flight.clone(), child.get().picker())
                .with_labels(self.labels.clone()),
        ));
        true
    }
}

impl LbPolicy for ClusterImpl {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::ClusterImpl(config) = config else {
            return false;
        };
        Child::update_in(&mut self.child, ctx, (*config.child).clone());
        self.labels = ctx
            .records_call_labels()
            .then(|| Arc::new(picker::PickLabels::new(&config)));
        self.config = Some(config);
        self.refresh()
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        let changed = self.child.as_mut().is_some_and(|c| c.event(ctx, event));
        changed && self.refresh()
    }

    fn state(&self) -> ConnectivityState {
        if self.drops_all() {
            // Every call is dropped at once: nothing to wait for.
            return ConnectivityState::Ready;
        }
        self.child
            .as_ref()
            .map_or(ConnectivityState::Connecting, |c| c.get().state())
    }

    fn picker(&self) -> SharedPicker {
        self.picker.clone().unwrap_or_else(super::queue_picker)
    }

    fn stats(&self) -> PolicyStats {
        let mut facts = vec![("in_flight".to_owned(), self.in_flight().to_string())];
        if let Some(c) = &self.config {
            facts.push(("max_requests".to_owned(), c.max_requests.to_string()));
            for d in &c.drops {
                facts.push((
                    format!("drop {}", d.category),
                    format!("{} per million", d.per_million),
                ));
            }
        }
        PolicyStats {
            policy: "xds_cluster_impl",
            name: self.config.as_ref().map(|c| c.cluster.to_string()),
            state: self.state(),
            facts,
            endpoints: Vec::new(),
            sessions: Vec::new(),
            children: self.child.iter().map(|c| c.get().stats()).collect(),
        }
    }
}
