//! What the channel's LB tree and config selector are built from: one
//! resolved listener, from xDS ([`from_walk`]) or from a fixed list of
//! endpoints ([`StaticConfig`]).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::lb::cds::{self, LeafCluster};
use crate::lb::wrr_locality::EndpointPolicy;
use crate::xds::graph::{Resolution, Walk};
use crate::xds::resource::cluster::{
    ClusterResource, Discovery, LbPolicy as ClusterLbPolicy, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_REQUESTS,
};
use crate::xds::resource::endpoint::{
    Endpoint, EndpointsResource, HealthSet, HealthStatus, LocalityEndpoints, LocalityName, Priority,
};
use crate::xds::resource::listener::{FilterConfig, HttpFilter, SessionState};
use crate::xds::resource::route::{
    Action, ClusterSpecifier, PathMatcher, Route, RouteAction, RouteMatcher, VirtualHost,
};
use crate::xds::{Resource, XdsClient};
use tether_core::http::set_cookie::CookieSpec;

/// One resolved listener: the virtual host for the channel's authority and
/// every cluster its routes name, resolved down to endpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelConfig {
    /// The listener's HTTP filters (the router last).
    pub http_filters: Vec<HttpFilter>,
    /// The listener's `max_stream_duration`.
    pub max_stream_duration: Option<Duration>,
    /// The virtual host serving the channel's authority.
    pub virtual_host: VirtualHost,
    /// Every cluster the routes name.
    pub clusters: BTreeMap<Arc<str>, cds::Config>,
}

/// The channel's config from one walk of the xDS graph: `None` while
/// resources are still awaited, an error (the message calls fail with) when
/// the listener or its routes cannot be had.
pub fn from_walk(w: &Walk, client: &XdsClient) -> Option<Result<ChannelConfig, String>> {
    let listener = w.listener.as_ref()?;
    let Some(l) = w.listener_resource() else {
        return listener.error.as_ref().map(|e| Err(e.to_string()));
    };
    if let Some((_, rds)) = &w.route_configuration {
        if rds.resource.is_none() {
            return rds.error.as_ref().map(|e| Err(e.to_string()));
        }
    }
    if let Some(e) = &w.virtual_host_error {
        return Some(Err(e.clone()));
    }
    if !w.complete {
        return None;
    }
    let virtual_host = w.virtual_host.clone()?;
    let mut clusters = BTreeMap::new();
    for rc in &w.route_clusters {
        let name: Arc<str> = rc.name.as_str().into();
        let config = match &rc.resolution {
            Resolution::Pending => return None,
            Resolution::Error(message) => cds::Config::Error {
                name: name.clone(),
                message: message.clone(),
            },
            Resolution::Leaves(leaves) => match resolve_leaves(w, client, leaves) {
                Err(message) => cds::Config::Error {
                    name: name.clone(),
                    message,
                },
                Ok(mut resolved) => {
                    // A leaf resolves to itself; an aggregate never does.
                    if leaves.len() == 1 && leaves[0] == rc.name {
                        cds::Config::Leaf(resolved.remove(0))
                    } else {
                        cds::Config::Aggregate {
                            name: name.clone(),
                            leaves: resolved,
                        }
                    }
                }
            },
        };
        clusters.insert(name, config);
    }
    Some(Ok(ChannelConfig {
        http_filters: l.http.http_filters.clone(),
        max_stream_duration: l.http.max_stream_duration,
        virtual_host,
        clusters,
    }))
}

/// Each leaf cluster with its endpoints; a missing EDS resource gives an
/// empty list (its calls fail with the priority policy's reason). A
/// cluster with an `lrs_server` gets its load from `client`.
fn resolve_leaves(
    w: &Walk,
    client: &XdsClient,
    leaves: &[String],
) -> Result<Vec<LeafCluster>, String> {
    leaves
        .iter()
        .map(|leaf| {
            let Some(Resource::Cluster(cluster)) = w.cluster(leaf).and_then(|s| s.resource.clone())
            else {
                return Err(format!("cluster {leaf:?} has no resource"));
            };
            let endpoints = match &cluster.discovery {
                Discovery::Eds { .. } => {
                    let eds = cluster.eds_name().unwrap_or(leaf);
                    match w.endpoints(eds).and_then(|s| s.resource.as_ref()) {
                        Some(Resource::Endpoints(e)) => e.clone(),
                        _ => Arc::new(EndpointsResource {
                            cluster_name: eds.to_owned(),
                            priorities: Vec::new(),
                            drop_overloads: Vec::new(),
                        }),
                    }
                }
                Discovery::LogicalDns { target } => {
                    return Err(format!(
                        "cluster {leaf:?}: LOGICAL_DNS ({target}) is not resolved by tether's channel yet"
                    ))
                }
                Discovery::Aggregate { .. } => {
                    return Err(format!("cluster {leaf:?} is an aggregate, not a leaf"))
                }
            };
            let load = cluster.lrs_server.then(|| {
                crate::lb::cluster_impl::LoadHandle::new(
                    client.report_load(leaf, cluster.eds_name()),
                    cluster.backend_metric_propagation.clone(),
                )
            });
            Ok(LeafCluster {
                name: leaf.as_str().into(),
                cluster,
                endpoints,
                load,
            })
        })
        .collect()
}

/// One endpoint of a [`StaticConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StaticEndpoint {
    /// Its addresses (the first is the primary).
    pub addresses: Vec<SocketAddr>,
    /// Its priority (0 is the most preferred; priorities must not skip).
    pub priority: u32,
    /// Its locality's name (endpoints with the same name share a locality).
    pub locality: String,
    /// Its locality's weight (the largest given for that locality wins).
    pub locality_weight: u32,
    /// Its weight within the locality.
    pub weight: u32,
}

impl StaticEndpoint {
    /// An endpoint at `address`, priority 0, the default locality, weight 1.
    pub fn new(address: SocketAddr) -> Self {
        StaticEndpoint {
            addresses: vec![address],
            priority: 0,
            locality: String::new(),
            locality_weight: 1,
            weight: 1,
        }
    }
}

/// Why a [`StaticConfig`] cannot run, naming the field and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StaticConfigError {
    /// `endpoints` is empty.
    NoEndpoints,
    /// `endpoints[i]` lists no address.
    NoAddress {
        /// Its index.
        endpoint: usize,
    },
    /// `endpoints[i]` has a `weight` or `locality_weight` of 0.
    ZeroWeight {
        /// Its index.
        endpoint: usize,
    },
    /// The priorities used leave a level out (they must be 0..n).
    SkippedPriority {
        /// The priorities the endpoints use, in order.
        present: Vec<u32>,
    },
    /// `least_request`'s `choice_count` is below 2.
    ChoiceCount {
        /// The value given.
        choice_count: u32,
    },
}

impl fmt::Display for StaticConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("static channel: ")?;
        match self {
            StaticConfigError::NoEndpoints => f.write_str("no endpoints"),
            StaticConfigError::NoAddress { endpoint } => {
                write!(f, "endpoints[{endpoint}] has no address")
            }
            StaticConfigError::ZeroWeight { endpoint } => {
                write!(f, "endpoints[{endpoint}] has a weight of 0")
            }
            StaticConfigError::SkippedPriority { present } => {
                write!(f, "priorities {present:?} skip a level")
            }
            StaticConfigError::ChoiceCount { choice_count } => write!(
                f,
                "policy least_request choice_count {choice_count} must be at least 2"
            ),
        }
    }
}

impl std::error::Error for StaticConfigError {}

/// A channel without a control plane: one cluster of fixed endpoints run by
/// the same tree as an xDS cluster. Made by [`StaticConfig::new`]; the
/// fields can be set afterwards.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StaticConfig {
    /// The cluster's name (in logs, stats and session cookies).
    pub cluster: String,
    /// The endpoints.
    pub endpoints: Vec<StaticEndpoint>,
    /// The endpoint policy within each locality.
    pub policy: EndpointPolicy,
    /// A stateful session cookie (gRFC A55) for every call, as an xDS
    /// listener's `stateful_session` filter would set it; `None`: no
    /// sessions. Sessions stay on an endpoint while it is in the config.
    pub session: Option<CookieSpec>,
}

impl StaticConfig {
    /// Cluster `cluster` over `endpoints`, round robin, without sessions.
    pub fn new(cluster: impl Into<String>, endpoints: Vec<StaticEndpoint>) -> Self {
        StaticConfig {
            cluster: cluster.into(),
            endpoints,
            policy: EndpointPolicy::RoundRobin,
            session: None,
        }
    }

    /// This config with `policy` within each locality.
    pub fn with_policy(mut self, policy: EndpointPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// This config with a session cookie for every call (`None`: no
    /// sessions).
    pub fn with_session(mut self, session: impl Into<Option<CookieSpec>>) -> Self {
        self.session = session.into();
        self
    }

    /// The same shape an xDS update gives: a cluster with an EDS-like
    /// assignment, a virtual host with one catch-all route to it.
    pub fn channel_config(&self) -> Result<ChannelConfig, StaticConfigError> {
        if self.endpoints.is_empty() {
            return Err(StaticConfigError::NoEndpoints);
        }
        let mut priorities: BTreeMap<u32, BTreeMap<String, LocalityEndpoints>> = BTreeMap::new();
        for (i, e) in self.endpoints.iter().enumerate() {
            if e.addresses.is_empty() {
                return Err(StaticConfigError::NoAddress { endpoint: i });
            }
            if e.weight == 0 || e.locality_weight == 0 {
                return Err(StaticConfigError::ZeroWeight { endpoint: i });
            }
            let loc = priorities
                .entry(e.priority)
                .or_default()
                .entry(e.locality.clone())
                .or_insert_with(|| LocalityEndpoints {
                    locality: LocalityName {
                        region: String::new(),
                        zone: e.locality.clone(),
                        sub_zone: String::new(),
                    },
                    weight: e.locality_weight,
                    endpoints: Vec::new(),
                });
            loc.weight = loc.weight.max(e.locality_weight);
            loc.endpoints.push(Endpoint {
                addresses: e.addresses.clone(),
                health: HealthStatus::Unknown,
                weight: e.weight,
                hostname: String::new(),
            });
        }
        if let Some((&last, _)) = priorities.iter().next_back() {
            if last as usize + 1 != priorities.len() {
                let present: Vec<u32> = priorities.keys().copied().collect();
                return Err(StaticConfigError::SkippedPriority { present });
            }
        }
        let name: Arc<str> = self.cluster.as_str().into();
        let lb_policy = match &self.policy {
            EndpointPolicy::RoundRobin => ClusterLbPolicy::RoundRobin,
            EndpointPolicy::PickFirst { shuffle } => {
                ClusterLbPolicy::PickFirst { shuffle: *shuffle }
            }
            EndpointPolicy::LeastRequest { choice_count } if *choice_count < 2 => {
                return Err(StaticConfigError::ChoiceCount {
                    choice_count: *choice_count,
                });
            }
            EndpointPolicy::LeastRequest { choice_count } => ClusterLbPolicy::LeastRequest {
                choice_count: *choice_count,
            },
            EndpointPolicy::WeightedRoundRobin(settings) => {
                ClusterLbPolicy::WeightedRoundRobin(*settings)
            }
            // Inside the locality, as an xDS cluster's wrr_locality runs it.
            EndpointPolicy::Custom(p) => {
                ClusterLbPolicy::WrrLocality(Box::new(ClusterLbPolicy::Custom(p.clone())))
            }
        };
        let leaf = LeafCluster {
            name: name.clone(),
            cluster: Arc::new(ClusterResource {
                name: self.cluster.clone(),
                discovery: Discovery::Eds { service_name: None },
                lb_policy,
                override_host_status: HealthSet::default_override(),
                idle_timeout: DEFAULT_IDLE_TIMEOUT,
                max_requests: DEFAULT_MAX_REQUESTS,
                outlier_detection: None,
                security: None,
                lrs_server: false,
                backend_metric_propagation: Default::default(),
            }),
            endpoints: Arc::new(EndpointsResource {
                cluster_name: self.cluster.clone(),
                priorities: priorities
                    .into_values()
                    .map(|l| Priority {
                        localities: l.into_values().collect(),
                    })
                    .collect(),
                drop_overloads: Vec::new(),
            }),
            load: None,
        };
        let route = Route {
            name: String::new(),
            matcher: RouteMatcher {
                path: PathMatcher::Prefix(String::new()),
                case_sensitive: true,
                headers: Vec::new(),
                fraction_per_million: None,
            },
            action: Action::Route(RouteAction {
                clusters: ClusterSpecifier::Cluster(self.cluster.clone()),
                hash_policies: Vec::new(),
                max_stream_duration: None,
                retry_policy: None,
            }),
            filter_overrides: Default::default(),
        };
        let http_filters = self
            .session
            .iter()
            .map(|cookie| HttpFilter {
                name: "static.stateful_session".to_owned(),
                config: FilterConfig::StatefulSession(SessionState {
                    cookie: Some(cookie.clone()),
                    strict: false,
                }),
            })
            .collect();
        Ok(ChannelConfig {
            http_filters,
            max_stream_duration: None,
            virtual_host: VirtualHost {
                name: "static".to_owned(),
                domains: vec!["*".to_owned()],
                routes: vec![route],
                filter_overrides: Default::default(),
                retry_policy: None,
            },
            clusters: BTreeMap::from([(name, cds::Config::Leaf(leaf))]),
        })
    }
}
