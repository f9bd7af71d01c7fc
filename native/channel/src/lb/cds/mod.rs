//! `cds`: one cluster of the route table, as the resolver resolved it.
//!
//! A leaf cluster becomes (`outlier_detection` →, when CDS sets it)
//! `xds_cluster_impl` → `xds_override_host` →
//! `priority` (a child per EDS priority) → `xds_wrr_locality` → the
//! cluster's endpoint policy; or, for a RING_HASH (or opted-in MAGLEV)
//! cluster, → `ring_hash` directly under `priority`, one table over all the
//! priority's localities (splitting by locality first would break the
//! hash's affinity). An
//! aggregate cluster (gRFC A75) becomes a `priority` whose children are the
//! `cds` trees of its leaf clusters, in order, so failover between them is
//! the priority policy's. A cluster that could not be resolved reports
//! TRANSIENT_FAILURE with the reason.
//!
//! DRAINING endpoints are kept out of the endpoint policies here (the
//! session override policy will serve them to existing sessions).

use std::collections::HashMap;
use std::sync::Arc;

use super::cluster_impl;
use super::outlier_detection;
use super::override_host;
use super::pick_first;
use super::priority;
use super::ring_hash;
use super::wrr_locality::{self, EndpointPolicy, Locality};
use super::{
    Child, ConnectivityState, Ctx, CustomConfig, CustomPolicy, EndpointAddresses, Event,
    FailPicker, HealthStatus, LbConfig, LbPolicy, PolicyStats, SharedPicker,
};
use crate::subchannel::pool::Security;
use crate::xds::resource::cluster::{ClusterResource, Discovery, LbPolicy as ClusterLbPolicy};
use crate::xds::resource::endpoint::{Endpoint, EndpointsResource, Priority};

/// A leaf cluster with its endpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct LeafCluster {
    /// The cluster's name.
    pub name: Arc<str>,
    /// The validated cluster.
    pub cluster: Arc<ClusterResource>,
    /// Its endpoints (EDS, or a static list).
    pub endpoints: Arc<EndpointsResource>,
    /// Where its calls' load is counted, when the cluster reports load
    /// (`lrs_server`, gRFC A27).
    pub load: Option<cluster_impl::LoadHandle>,
}

/// `cds`'s config: the cluster as resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Config {
    /// A cluster with endpoints.
    Leaf(LeafCluster),
    /// An aggregate cluster, flattened to its leaf clusters in priority order.
    Aggregate {
        /// The aggregate's name.
        name: Arc<str>,
        /// Its leaf clusters, highest priority first.
        leaves: Vec<LeafCluster>,
    },
    /// The cluster could not be resolved: calls to it fail with this.
    Error {
        /// The cluster's name.
        name: Arc<str>,
        /// Why (names the resource and the problem).
        message: String,
    },
}

impl LeafCluster {
    /// The same cluster and endpoints: the same resources as the XdsClient
    /// cached them (a pointer compare), or equal ones.
    fn same_as(&self, other: &LeafCluster) -> bool {
        self.name == other.name
            && (Arc::ptr_eq(&self.cluster, &other.cluster) || self.cluster == other.cluster)
            && (Arc::ptr_eq(&self.endpoints, &other.endpoints) || self.endpoints == other.endpoints)
    }
}

impl Config {
    /// Whether `other` would change nothing in the cluster's subtree: an
    /// update with it can be skipped. Resources the XdsClient did not
    /// replace are the same allocations, so this is a few pointer compares
    /// for an unchanged cluster.
    pub fn same_as(&self, other: &Config) -> bool {
        match (self, other) {
            (Config::Leaf(a), Config::Leaf(b)) => a.same_as(b),
            (
                Config::Aggregate {
                    name: a,
                    leaves: la,
                },
                Config::Aggregate {
                    name: b,
                    leaves: lb,
                },
            ) => a == b && la.len() == lb.len() && la.iter().zip(lb).all(|(x, y)| x.same_as(y)),
            (a @ Config::Error { .. }, b @ Config::Error { .. }) => a == b,
            _ => false,
        }
    }

    /// The cluster's name.
    pub fn name(&self) -> &Arc<str> {
        match self {
            Config::Leaf(l) => &l.name,
            Config::Aggregate { name, .. } | Config::Error { name, .. } => name,
        }
    }
}

/// What runs under each priority of a leaf cluster.
#[derive(Debug, Clone, PartialEq)]
enum PriorityPolicy {
    /// `xds_wrr_locality` with this policy in each locality.
    Localities(EndpointPolicy),
    /// `ring_hash` over all the localities, with this table.
    Hash(ring_hash::Table),
    /// A custom policy (gRFC A52) at the top of the cluster's list: one
    /// instance over all the localities' endpoints, as gRPC runs any
    /// policy not under `xds_wrr_locality`.
    Whole(CustomPolicy),
    /// `pick_first` at the top of the cluster's list: one over all the
    /// localities' endpoints, right under `priority`, as gRPC runs it (so
    /// its IDLE picker gets the calls that make it connect again).
    PickFirst {
        /// `shuffle_address_list`.
        shuffle: bool,
    },
}

/// The policy under each priority for a cluster's `lb_policy`, or why the
/// channel cannot run it yet.
fn priority_policy(policy: &ClusterLbPolicy) -> Result<PriorityPolicy, String> {
    match policy {
        ClusterLbPolicy::RoundRobin => Ok(PriorityPolicy::Localities(EndpointPolicy::RoundRobin)),
        ClusterLbPolicy::PickFirst { shuffle } => {
            Ok(PriorityPolicy::PickFirst { shuffle: *shuffle })
        }
        ClusterLbPolicy::WrrLocality(inner) => match priority_policy(inner)? {
            PriorityPolicy::Localities(p) => Ok(PriorityPolicy::Localities(p)),
            // gRPC would build one ring per locality, under weighted_target.
            PriorityPolicy::Hash(_) => Err("ring_hash under wrr_locality".to_owned()),
            PriorityPolicy::Whole(p) => Ok(PriorityPolicy::Localities(EndpointPolicy::Custom(p))),
            PriorityPolicy::PickFirst { shuffle } => {
                Ok(PriorityPolicy::Localities(EndpointPolicy::PickFirst {
                    shuffle,
                }))
            }
        },
        ClusterLbPolicy::RingHash {
            min_ring_size,
            max_ring_size,
        } => Ok(PriorityPolicy::Hash(ring_hash::Table::Ring {
            min_ring_size: *min_ring_size,
            max_ring_size: *max_ring_size,
        })),
        ClusterLbPolicy::Maglev { table_size } => {
            Ok(PriorityPolicy::Hash(ring_hash::Table::Maglev {
                table_size: *table_size,
            }))
        }
        // A48: weighted_target over the localities, least_request in each.
        ClusterLbPolicy::LeastRequest { choice_count } => {
            Ok(PriorityPolicy::Localities(EndpointPolicy::LeastRequest {
                choice_count: *choice_count,
            }))
        }
        // A58: weighted_target over the localities, WRR in each.
        ClusterLbPolicy::WeightedRoundRobin(settings) => Ok(PriorityPolicy::Localities(
            EndpointPolicy::WeightedRoundRobin(*settings),
        )),
        ClusterLbPolicy::Custom(p) => match super::registry::builder_of(p) {
            Some(_) => Ok(PriorityPolicy::Whole(p.clone())),
            None => Err(format!(
                "{} (no builder in the channel's registry)",
                p.name()
            )),
        },
    }
}

/// The policies the channel builds under `cds` for `cluster`, top down
/// (gRFC A75's tree), as `tether xds dump` shows them: for an aggregate,
/// `priority` over each child cluster's own `cds`; an error when the
/// channel cannot run the cluster's policy.
pub fn policy_chain(cluster: &ClusterResource) -> Result<Vec<&'static str>, String> {
    let mut chain = vec!["cds"];
    if let Discovery::Aggregate { .. } = cluster.discovery {
        chain.extend(["priority", "cds"]);
        return Ok(chain);
    }
    if cluster.outlier_detection.is_some() {
        chain.push("outlier_detection");
    }
    chain.extend(["xds_cluster_impl", "xds_override_host", "priority"]);
    match priority_policy(&cluster.lb_policy)? {
        PriorityPolicy::Localities(p) => {
            chain.extend(["xds_wrr_locality", "weighted_target", p.name()]);
        }
        PriorityPolicy::Hash(_) => chain.push("ring_hash"),
        PriorityPolicy::Whole(p) => chain.push(p.name()),
        PriorityPolicy::PickFirst { .. } => chain.push("pick_first"),
    }
    Ok(chain)
}

/// An EDS endpoint as the policies see it.
fn endpoint_addresses(e: &Endpoint) -> EndpointAddresses {
    EndpointAddresses {
        addresses: e.addresses.clone(),
        weight: e.weight.max(1),
        health: e.health,
    }
}

/// A priority's localities with the endpoints the endpoint policies may
/// use (DRAINING ones left out).
fn localities(p: &Priority) -> Vec<Locality> {
    p.localities
        .iter()
        .map(|l| Locality {
            name: l.locality.clone(),
            weight: l.weight,
            endpoints: l
                .endpoints
                .iter()
                .filter(|e| e.health != HealthStatus::Draining)
                .map(endpoint_addresses)
                .collect(),
        })
        .collect()
}

/// The `xds_cluster_impl` subtree of a leaf cluster.
/// `with_localities`: the cluster_impl config maps each endpoint to its
/// locality even when the cluster reports no load (for the attempts'
/// `grpc.lb.locality`).
fn leaf_config(leaf: &LeafCluster, with_localities: bool) -> Result<LbConfig, String> {
    let policy = priority_policy(&leaf.cluster.lb_policy).map_err(|p| {
        format!(
            "cluster {}: lb policy {p} is not supported by tether's channel yet",
            leaf.name
        )
    })?;
    let children = leaf
        .endpoints
        .priorities
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let localities = localities(p);
            let child = match &policy {
                PriorityPolicy::Localities(child_policy) => {
                    LbConfig::WrrLocality(wrr_locality::Config {
                        localities,
                        child_policy: child_policy.clone(),
                    })
                }
                PriorityPolicy::Hash(table) => LbConfig::RingHash(ring_hash::Config {
                    localities,
                    table: *table,
                }),
                PriorityPolicy::PickFirst { shuffle } => LbConfig::PickFirst(pick_first::Config {
                    endpoints: localities.into_iter().flat_map(|l| l.endpoints).collect(),
                    shuffle: *shuffle,
                }),
                PriorityPolicy::Whole(custom) => LbConfig::Custom(CustomConfig {
                    endpoints: localities.into_iter().flat_map(|l| l.endpoints).collect(),
                    policy: custom.clone(),
                }),
            };
            (format!("{}[priority-{i}]", leaf.name), child)
        })
        .collect();
    // Every endpoint, DRAINING included, for sessions (A55).
    let all: Vec<EndpointAddresses> = leaf
        .endpoints
        .endpoints()
        .map(|(_, _, e)| endpoint_addresses(e))
        .collect();
    let cluster_impl = LbConfig::ClusterImpl(cluster_impl::Config {
        cluster: leaf.name.clone(),
        eds_service_name: leaf.cluster.eds_name().map(str::to_owned),
        max_requests: leaf.cluster.max_requests,
        drops: leaf.endpoints.drop_overloads.clone(),
        load: leaf.load.clone(),
        localities: if leaf.load.is_some() || with_localities {
            leaf.endpoints
                .endpoints()
                .flat_map(|(_, l, e)| e.addresses.first().map(|a| (*a, l.locality.clone())))
                .collect()
        } else {
            HashMap::new()
        },
        child: Box::new(LbConfig::OverrideHost(override_host::Config {
            override_host_status: leaf.cluster.override_host_status,
            idle_timeout: leaf.cluster.idle_timeout,
            endpoints: all.clone(),
            load: leaf.load.clone(),
            child: Box::new(LbConfig::Priority(priority::Config { children })),
        })),
    });
    // A75 puts outlier_detection above xds_cluster_impl. Only clusters that
    // set it get one: gRPC's no-op instance would only cost picks.
    Ok(match leaf.cluster.outlier_detection {
        Some(settings) => LbConfig::OutlierDetection(outlier_detection::Config {
            settings,
            endpoints: all,
            child: Box::new(cluster_impl),
        }),
        None => cluster_impl,
    })
}

/// The `cds` policy.
pub struct Cds {
    name: Option<Arc<str>>,
    child: Option<Child>,
    error: Option<SharedPicker>,
    /// The cluster's xDS-managed TLS (A29), which every subchannel of its
    /// subtree uses.
    security: Security,
    /// Said once while the cluster's TLS trusts any public certificate.
    warned_any_certificate: bool,
}

impl Default for Cds {
    fn default() -> Self {
        Cds::new()
    }
}

impl Cds {
    /// A policy with no cluster yet.
    pub fn new() -> Self {
        Cds {
            name: None,
            child: None,
            error: None,
            security: None,
            warned_any_certificate: false,
        }
    }

    /// Sets the cluster's TLS and backend service (gRFC A89: the cluster's
    /// name; an aggregate's leaves set their own) for its subtree; returns
    /// what they were.
    fn enter(&self, ctx: &mut Ctx<'_>) -> (Security, Option<Arc<str>>) {
        let security = std::mem::replace(&mut ctx.security, self.security.clone());
        let service = match &self.name {
            Some(name) => ctx.labels.backend_service.replace(name.clone()),
            None => ctx.labels.backend_service.clone(),
        };
        (security, service)
    }

    /// Puts back what [`Cds::enter`] replaced.
    fn leave(ctx: &mut Ctx<'_>, (security, service): (Security, Option<Arc<str>>)) {
        ctx.security = security;
        ctx.labels.backend_service = service;
    }

    fn fail(&mut self, message: String) -> bool {
        log::warn!("{message}");
        self.error = Some(Arc::new(FailPicker(tonic::Status::unavailable(message))));
        true
    }
}

impl LbPolicy for Cds {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::Cds(config) = config else {
            return false;
        };
        self.name = Some(config.name().clone());
        if let Config::Leaf(leaf) = &config {
            // Accepted as C-core accepts it, but said: a cluster verified
            // against the system's roots with no SAN matcher trusts every
            // public CA for every endpoint.
            let any = leaf
                .cluster
                .security
                .as_ref()
                .is_some_and(|t| t.trusts_any_public_certificate());
            if any && !self.warned_any_certificate {
                log::warn!(
                    "cluster {}: TLS verified against the system's roots with no \
                     match_subject_alt_names: any certificate from any publicly trusted CA is \
                     accepted for its endpoints (gRFC A82 allows it, C-core accepts it); give the \
                     cluster SAN matchers",
                    leaf.name
                );
            }
            self.warned_any_certificate = any;
            match ctx.security_for(leaf.cluster.security.as_ref()) {
                Ok(security) => self.security = security,
                Err(message) => {
                    self.child = None;
                    return self.fail(format!("cluster {}: {message}", leaf.name));
                }
            }
        }
        let child = match &config {
            Config::Leaf(leaf) => leaf_config(leaf, ctx.records_call_labels()),
            Config::Aggregate { leaves, .. } => Ok(LbConfig::Priority(priority::Config {
                children: leaves
                    .iter()
                    .map(|l| (l.name.to_string(), LbConfig::Cds(Config::Leaf(l.clone()))))
                    .collect(),
            })),
            Config::Error { message, .. } => Err(message.clone()),
        };
        match child {
            // A cluster that stops resolving keeps serving with what it had
            // only for ambient errors, which never reach here.
            Err(message) => {
                self.child = None;
                self.fail(message)
            }
            Ok(child) => {
                self.error = None;
                let outer = self.enter(ctx);
                Child::update_in(&mut self.child, ctx, child);
                Self::leave(ctx, outer);
                true
            }
        }
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        let outer = self.enter(ctx);
        let changed = self.child.as_mut().is_some_and(|c| c.event(ctx, event));
        Self::leave(ctx, outer);
        changed
    }

    fn state(&self) -> ConnectivityState {
        match (&self.error, &self.child) {
            (Some(_), _) | (None, None) => ConnectivityState::TransientFailure,
            (None, Some(c)) => c.get().state(),
        }
    }

    fn picker(&self) -> SharedPicker {
        match (&self.error, &self.child) {
            (Some(p), _) => p.clone(),
            (None, Some(c)) => c.get().picker(),
            (None, None) => super::queue_picker(),
        }
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "cds",
            name: self.name.as_ref().map(|n| n.to_string()),
            state: self.state(),
            facts: Vec::new(),
            endpoints: Vec::new(),
            sessions: Vec::new(),
            children: self.child.iter().map(|c| c.get().stats()).collect(),
        }
    }
}
