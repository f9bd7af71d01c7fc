//! Model → xDS. One model gives two sets of resources:
//!
//! - for Envoy: a TCP listener whose HTTP connection manager reads routes
//!   over RDS, clusters with HTTP/2 options for `h2c` services;
//! - for proxyless gRPC: one `ApiListener` per virtual host, named after the
//!   virtual host (the `xds:///<name>` target), and clusters carrying the
//!   session idle timeout in `upstream_config` (A75), which Envoy would
//!   refuse there.
//!
//! Both share the route configuration and the endpoints. Each service has
//! one ClusterLoadAssignment named after it; each (service, strategy) pair a
//! route uses has a cluster: `<service>` for round robin, `<service>/random`,
//! `<service>/ring-hash` for `Cookie` and `RequestHash`, `<service>/session`
//! for `Session` (with `override_host_status`).
//!
//! An aggregate service has no endpoints; its cluster for a strategy is an
//! `envoy.clusters.aggregate` cluster over its services' clusters for the
//! same strategy (`agg/session` → `primary/session`, `fallback/session`), so
//! each underlying cluster keeps the policy and session settings the route
//! asked for: both Envoy and gRPC (A75) balance inside the underlying
//! cluster with its own policy. Proxyless clients get the aggregates as
//! written, nested ones included (gRPC flattens them itself); Envoy gets
//! each aggregate flattened to its leaf clusters in the same order, because
//! Envoy 1.40 sees an aggregate child as a cluster without hosts and skips it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::config::listener::v3 as lpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateConfig;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3 as sspb;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
use envoy_types::pb::envoy::extensions::upstreams::http::v3 as uhttp;
use envoy_types::pb::envoy::r#type::http::v3 as thttp;
use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
use envoy_types::pb::google::protobuf as pb;
use tether_core::http::set_cookie::CookieSpec;

use super::model::{
    split_locality, Condition, Config, HeaderCondition, Protocol, RouteSpec, ServiceSpec,
    SessionClusterSettings, Strategy,
};
use crate::xds::resource::{pack, ResourceKind};

/// Name of the stateful session filter in every HTTP connection manager.
pub const SESSION_FILTER: &str = "envoy.filters.http.stateful_session";
/// The route configuration every listener reads.
pub const ROUTE_CONFIG: &str = "tether-routes";
/// The cookie Contour's `Cookie` strategy hashes on.
pub const AFFINITY_COOKIE: &str = "X-Contour-Session-Affinity";
/// The custom cluster type of aggregate clusters.
pub const AGGREGATE_CLUSTER: &str = "envoy.clusters.aggregate";

/// Which kind of client a set of resources is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flavor {
    /// Envoy (node `user_agent_name` is `envoy`).
    Envoy,
    /// Proxyless gRPC and tether's own client.
    Proxyless,
}

/// Resources by kind and name.
pub type Resources = BTreeMap<ResourceKind, BTreeMap<String, pb::Any>>;

/// The translated resources for both flavors.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translated {
    /// For Envoy.
    pub envoy: Resources,
    /// For proxyless clients.
    pub proxyless: Resources,
}

impl Translated {
    /// The resources for one flavor.
    pub fn for_flavor(&self, f: Flavor) -> &Resources {
        match f {
            Flavor::Envoy => &self.envoy,
            Flavor::Proxyless => &self.proxyless,
        }
    }
}

/// The cluster a route's strategy sends a service's traffic to.
pub fn cluster_name(service: &str, strategy: Strategy) -> String {
    match strategy {
        Strategy::RoundRobin => service.to_owned(),
        Strategy::Random => format!("{service}/random"),
        Strategy::Cookie | Strategy::RequestHash => format!("{service}/ring-hash"),
        Strategy::Session => format!("{service}/session"),
    }
}

fn ads() -> core::ConfigSource {
    core::ConfigSource {
        resource_api_version: core::ApiVersion::V3 as i32,
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

fn duration(d: Duration) -> pb::Duration {
    pb::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn socket(addr: std::net::SocketAddr) -> core::Address {
    core::Address {
        address: Some(core::address::Address::SocketAddress(core::SocketAddress {
            address: addr.ip().to_string(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(u32::from(
                addr.port(),
            ))),
            ..Default::default()
        })),
    }
}

/// Translates a validated model.
pub fn translate(config: &Config) -> Translated {
    let mut out = Translated::default();
    let uses_session = config
        .virtualhosts
        .iter()
        .flat_map(|v| &v.routes)
        .any(|r| r.load_balancer_policy.strategy == Strategy::Session);

    // Routes: shared.
    let routes = pack(&route_configuration(config));
    for r in [&mut out.envoy, &mut out.proxyless] {
        r.entry(ResourceKind::RouteConfiguration)
            .or_default()
            .insert(ROUTE_CONFIG.to_owned(), routes.clone());
    }

    // Listeners.
    let manager = |stat: &str| hcm::HttpConnectionManager {
        stat_prefix: stat.to_owned(),
        codec_type: hcm::http_connection_manager::CodecType::Auto as i32,
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
            hcm::Rds {
                config_source: Some(ads()),
                route_config_name: ROUTE_CONFIG.to_owned(),
            },
        )),
        http_filters: http_filters(uses_session),
        ..Default::default()
    };
    if let Some(l) = &config.listener {
        let listener = lpb::Listener {
            name: l.name.clone(),
            address: Some(socket(std::net::SocketAddr::new(l.address, l.port))),
            filter_chains: vec![lpb::FilterChain {
                filters: vec![lpb::Filter {
                    name: "envoy.filters.network.http_connection_manager".to_owned(),
                    config_type: Some(lpb::filter::ConfigType::TypedConfig(pack(&manager(
                        "tether",
                    )))),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        out.envoy
            .entry(ResourceKind::Listener)
            .or_default()
            .insert(l.name.clone(), pack(&listener));
    }
    for vh in &config.virtualhosts {
        let mut names = vec![vh.name.clone()];
        names.extend(vh.domains.iter().filter(|d| !d.contains('*')).cloned());
        let names: BTreeSet<String> = names.into_iter().collect();
        for name in names {
            let listener = lpb::Listener {
                name: name.clone(),
                api_listener: Some(lpb::ApiListener {
                    api_listener: Some(pack(&manager(&name))),
                }),
                ..Default::default()
            };
            out.proxyless
                .entry(ResourceKind::Listener)
                .or_default()
                .insert(name, pack(&listener));
        }
    }

    // Clusters: every service's round robin cluster, plus the variants routes use.
    let mut wanted: BTreeMap<(String, Strategy), Option<SessionClusterSettings>> = BTreeMap::new();
    for s in &config.services {
        wanted.insert((s.name.clone(), Strategy::RoundRobin), None);
    }
    for r in config.virtualhosts.iter().flat_map(|v| &v.routes) {
        let p = &r.load_balancer_policy;
        // An aggregate's cluster needs its services' clusters for the same
        // strategy, all the way down.
        for s in r.services.iter().flat_map(|s| config.closure(&s.name)) {
            let settings = p.session.as_ref().map(|s| s.cluster_settings());
            wanted.insert((s.name.clone(), p.strategy), settings);
        }
    }
    for ((service, strategy), settings) in &wanted {
        let Some(spec) = config.service(service) else {
            continue;
        };
        for flavor in [Flavor::Envoy, Flavor::Proxyless] {
            let c = cluster(config, spec, *strategy, settings.as_ref(), flavor);
            let target = match flavor {
                Flavor::Envoy => &mut out.envoy,
                Flavor::Proxyless => &mut out.proxyless,
            };
            target
                .entry(ResourceKind::Cluster)
                .or_default()
                .insert(c.name.clone(), pack(&c));
        }
    }

    // Endpoints: shared; an aggregate has none.
    for s in config.services.iter().filter(|s| !s.is_aggregate()) {
        let cla = pack(&load_assignment(s));
        for r in [&mut out.envoy, &mut out.proxyless] {
            r.entry(ResourceKind::Endpoints)
                .or_default()
                .insert(s.name.clone(), cla.clone());
        }
    }
    out
}

fn http_filters(uses_session: bool) -> Vec<hcm::HttpFilter> {
    let mut filters = Vec::new();
    if uses_session {
        // Present but empty: routes with strategy Session override it.
        filters.push(hcm::HttpFilter {
            name: SESSION_FILTER.to_owned(),
            config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack(
                &sspb::StatefulSession::default(),
            ))),
            ..Default::default()
        });
    }
    filters.push(hcm::HttpFilter {
        name: "envoy.filters.http.router".to_owned(),
        config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack(
            &Router::default(),
        ))),
        ..Default::default()
    });
    filters
}

fn route_configuration(config: &Config) -> rpb::RouteConfiguration {
    rpb::RouteConfiguration {
        name: ROUTE_CONFIG.to_owned(),
        virtual_hosts: config
            .virtualhosts
            .iter()
            .map(|vh| rpb::VirtualHost {
                name: vh.name.clone(),
                domains: if vh.domains.is_empty() {
                    vec![vh.name.clone()]
                } else {
                    vh.domains.clone()
                },
                routes: vh.routes.iter().map(route).collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn string_matcher(pattern: mpb::string_matcher::MatchPattern) -> mpb::StringMatcher {
    mpb::StringMatcher {
        match_pattern: Some(pattern),
        ignore_case: false,
    }
}

fn header_matcher(h: &HeaderCondition) -> rpb::HeaderMatcher {
    use mpb::string_matcher::MatchPattern as M;
    use rpb::header_matcher::HeaderMatchSpecifier as H;
    let (spec, invert) = if let Some(v) = &h.exact {
        (H::StringMatch(string_matcher(M::Exact(v.clone()))), false)
    } else if let Some(v) = &h.not_exact {
        (H::StringMatch(string_matcher(M::Exact(v.clone()))), true)
    } else if let Some(v) = &h.contains {
        (
            H::StringMatch(string_matcher(M::Contains(v.clone()))),
            false,
        )
    } else if let Some(v) = &h.not_contains {
        (H::StringMatch(string_matcher(M::Contains(v.clone()))), true)
    } else if let Some(p) = h.present {
        (H::PresentMatch(true), !p)
    } else {
        (H::PresentMatch(true), h.not_present.unwrap_or(false))
    };
    rpb::HeaderMatcher {
        name: h.name.to_ascii_lowercase(),
        header_match_specifier: Some(spec),
        invert_match: invert,
        ..Default::default()
    }
}

fn route_match(conditions: &[Condition]) -> rpb::RouteMatch {
    use rpb::route_match::PathSpecifier as P;
    let mut m = rpb::RouteMatch {
        path_specifier: Some(P::Prefix("/".to_owned())),
        ..Default::default()
    };
    for c in conditions {
        if let Some(p) = &c.prefix {
            m.path_specifier = Some(P::Prefix(p.clone()));
        }
        if let Some(p) = &c.path {
            m.path_specifier = Some(P::Path(p.clone()));
        }
        if let Some(h) = &c.header {
            m.headers.push(header_matcher(h));
        }
    }
    m
}

/// The `envoy.type.http.v3.Cookie` for a cookie spec.
fn cookie(spec: &CookieSpec) -> thttp::Cookie {
    thttp::Cookie {
        name: spec.name().to_owned(),
        ttl: (!spec.ttl().is_zero()).then(|| duration(spec.ttl())),
        path: spec.path().to_owned(),
        attributes: spec
            .attributes()
            .iter()
            .map(|a| thttp::CookieAttribute {
                name: a.name().to_owned(),
                value: a.value().to_owned(),
            })
            .collect(),
    }
}

fn route(r: &RouteSpec) -> rpb::Route {
    use rpb::route_action::hash_policy as hp;
    let p = &r.load_balancer_policy;
    let cluster_specifier = if r.services.len() == 1 {
        rpb::route_action::ClusterSpecifier::Cluster(cluster_name(&r.services[0].name, p.strategy))
    } else {
        rpb::route_action::ClusterSpecifier::WeightedClusters(rpb::WeightedCluster {
            clusters: r
                .services
                .iter()
                .map(|s| rpb::weighted_cluster::ClusterWeight {
                    name: cluster_name(&s.name, p.strategy),
                    weight: Some(pb::UInt32Value { value: s.weight }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    };
    let hash_policy = match p.strategy {
        Strategy::Cookie => vec![rpb::route_action::HashPolicy {
            policy_specifier: Some(hp::PolicySpecifier::Cookie(hp::Cookie {
                name: AFFINITY_COOKIE.to_owned(),
                // A present ttl (even 0s) makes Envoy generate the cookie.
                ttl: Some(pb::Duration::default()),
                path: "/".to_owned(),
                attributes: Vec::new(),
            })),
            terminal: false,
        }],
        Strategy::RequestHash => p
            .request_hash_policies
            .iter()
            .map(|h| {
                let spec = if let Some(hh) = &h.header_hash_options {
                    hp::PolicySpecifier::Header(hp::Header {
                        header_name: hh.header_name.to_ascii_lowercase(),
                        regex_rewrite: None,
                    })
                } else if let Some(q) = &h.query_parameter_hash_options {
                    hp::PolicySpecifier::QueryParameter(hp::QueryParameter {
                        name: q.parameter_name.clone(),
                    })
                } else {
                    hp::PolicySpecifier::ConnectionProperties(hp::ConnectionProperties {
                        source_ip: true,
                    })
                };
                rpb::route_action::HashPolicy {
                    policy_specifier: Some(spec),
                    terminal: h.terminal,
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut typed_per_filter_config = std::collections::HashMap::new();
    if let (Strategy::Session, Some(s)) = (p.strategy, &p.session) {
        let state = CookieBasedSessionState {
            cookie: Some(cookie(&s.cookie.0)),
        };
        let per_route = sspb::StatefulSessionPerRoute {
            r#override: Some(sspb::stateful_session_per_route::Override::StatefulSession(
                sspb::StatefulSession {
                    session_state: Some(core::TypedExtensionConfig {
                        name: "envoy.http.stateful_session.cookie".to_owned(),
                        typed_config: Some(pack(&state)),
                    }),
                    strict: s.strict,
                    ..Default::default()
                },
            )),
        };
        typed_per_filter_config.insert(SESSION_FILTER.to_owned(), pack(&per_route));
    }
    rpb::Route {
        r#match: Some(route_match(&r.conditions)),
        action: Some(rpb::route::Action::Route(rpb::RouteAction {
            cluster_specifier: Some(cluster_specifier),
            hash_policy,
            ..Default::default()
        })),
        typed_per_filter_config,
        ..Default::default()
    }
}

fn cluster(
    config: &Config,
    spec: &ServiceSpec,
    strategy: Strategy,
    session: Option<&SessionClusterSettings>,
    flavor: Flavor,
) -> cpb::Cluster {
    use cpb::cluster::LbPolicy;
    if spec.is_aggregate() {
        return aggregate_cluster(config, spec, strategy, flavor);
    }
    let mut c = cpb::Cluster {
        name: cluster_name(&spec.name, strategy),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
            cpb::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: spec.name.clone(),
        }),
        connect_timeout: Some(duration(Duration::from_secs(1))),
        ..Default::default()
    };
    match strategy {
        Strategy::RoundRobin | Strategy::Session => c.lb_policy = LbPolicy::RoundRobin as i32,
        // gRPC has no random policy; proxyless clients get round robin.
        Strategy::Random if flavor == Flavor::Envoy => c.lb_policy = LbPolicy::Random as i32,
        Strategy::Random => c.lb_policy = LbPolicy::RoundRobin as i32,
        Strategy::Cookie | Strategy::RequestHash => {
            c.lb_policy = LbPolicy::RingHash as i32;
            c.lb_config = Some(cpb::cluster::LbConfig::RingHashLbConfig(
                cpb::cluster::RingHashLbConfig {
                    minimum_ring_size: Some(pb::UInt64Value { value: 1024 }),
                    ..Default::default()
                },
            ));
        }
    }
    if let Some(s) = session {
        c.common_lb_config = Some(cpb::cluster::CommonLbConfig {
            override_host_status: Some(core::HealthStatusSet {
                statuses: s.override_host_status.iter().map(|h| h.as_i32()).collect(),
            }),
            ..Default::default()
        });
        if let (Some(idle), Flavor::Proxyless) = (s.idle_timeout, flavor) {
            let opts = uhttp::HttpProtocolOptions {
                common_http_protocol_options: Some(core::HttpProtocolOptions {
                    idle_timeout: Some(duration(idle)),
                    ..Default::default()
                }),
                ..Default::default()
            };
            c.upstream_config = Some(core::TypedExtensionConfig {
                name: "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_owned(),
                typed_config: Some(pack(&opts)),
            });
        }
    }
    if flavor == Flavor::Envoy && spec.protocol == Protocol::H2c {
        let opts = uhttp::HttpProtocolOptions {
            upstream_protocol_options: Some(
                uhttp::http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    uhttp::http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(
                            uhttp::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                                core::Http2ProtocolOptions::default(),
                            ),
                        ),
                    },
                ),
            ),
            ..Default::default()
        };
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_owned(),
            pack(&opts),
        );
    }
    c
}

/// An aggregate cluster over the service's services' clusters for
/// `strategy` (for Envoy: its leaf services' clusters). Session settings
/// stay on those clusters: that is where both Envoy and gRPC (A75) apply
/// them.
fn aggregate_cluster(
    config: &Config,
    spec: &ServiceSpec,
    strategy: Strategy,
    flavor: Flavor,
) -> cpb::Cluster {
    use cpb::cluster::LbPolicy;
    let clusters = match flavor {
        Flavor::Proxyless => spec
            .children()
            .iter()
            .map(|c| cluster_name(c, strategy))
            .collect(),
        Flavor::Envoy => config
            .leaves(&spec.name)
            .iter()
            .map(|c| cluster_name(&c.name, strategy))
            .collect(),
    };
    let typed = AggregateConfig { clusters };
    cpb::Cluster {
        name: cluster_name(&spec.name, strategy),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::ClusterType(
            cpb::cluster::CustomClusterType {
                name: AGGREGATE_CLUSTER.to_owned(),
                typed_config: Some(pack(&typed)),
            },
        )),
        // Envoy requires CLUSTER_PROVIDED here. gRPC ignores an aggregate's
        // policy (A75) and tether's XdsClient NACKs CLUSTER_PROVIDED, so
        // proxyless clients get the default.
        lb_policy: match flavor {
            Flavor::Envoy => LbPolicy::ClusterProvided as i32,
            Flavor::Proxyless => LbPolicy::RoundRobin as i32,
        },
        ..Default::default()
    }
}

fn load_assignment(spec: &ServiceSpec) -> epb::ClusterLoadAssignment {
    // (priority, locality) → endpoints, in first-seen order per key.
    let mut groups: BTreeMap<(u32, String), Vec<epb::LbEndpoint>> = BTreeMap::new();
    for e in &spec.endpoints {
        let lb = epb::LbEndpoint {
            health_status: e.health.0.as_i32(),
            load_balancing_weight: Some(pb::UInt32Value { value: e.weight }),
            host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(epb::Endpoint {
                address: Some(socket(e.address)),
                additional_addresses: e
                    .additional_addresses
                    .iter()
                    .map(|a| epb::endpoint::AdditionalAddress {
                        address: Some(socket(*a)),
                    })
                    .collect(),
                ..Default::default()
            })),
            ..Default::default()
        };
        groups
            .entry((e.priority, e.locality.clone()))
            .or_default()
            .push(lb);
    }
    epb::ClusterLoadAssignment {
        cluster_name: spec.name.clone(),
        endpoints: groups
            .into_iter()
            .map(|((priority, locality), lb_endpoints)| {
                let (region, zone, sub_zone) = split_locality(&locality);
                let weight = spec.locality_weights.get(&locality).copied().unwrap_or(1);
                epb::LocalityLbEndpoints {
                    locality: Some(core::Locality {
                        region,
                        zone,
                        sub_zone,
                    }),
                    lb_endpoints,
                    load_balancing_weight: Some(pb::UInt32Value { value: weight }),
                    priority,
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}
