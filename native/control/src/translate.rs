//! Model → xDS. One model gives two sets of resources:
//!
//! - for Envoy: a TCP listener whose HTTP connection manager reads routes
//!   over RDS, clusters with HTTP/2 options for `h2c` services;
//! - for proxyless gRPC: one `ApiListener` per virtual host, named after the
//!   virtual host (the `xds:///<name>` target), and clusters carrying the
//!   session idle timeout in `upstream_config` (A75), which Envoy would
//!   refuse there.
//!
//! Both share the endpoints, and the route configuration unless `envoy:
//! {sessionFilter: plugin}` is set: then Envoy's copy enables the tether
//! plugin (`envoy.filters.http.wasm`, one instance per distinct session
//! setting, off by default and switched on by the `Session` routes through
//! `envoy.config.route.v3.FilterConfig`) instead of carrying
//! `StatefulSessionPerRoute`, its HTTP connection manager runs the plugin
//! instead of `stateful_session`, and its session clusters route with
//! Envoy's `envoy.load_balancing_policies.override_host` policy reading the
//! plugin's header (round robin as the fallback). Proxyless clients never
//! see the wasm filter: C-core NACKs filters it does not know. Each service has
//! one ClusterLoadAssignment named after it (its `dropOverloads` as
//! `policy.drop_overloads`, per million); each (service, strategy) pair a
//! route uses has a cluster: `<service>` for round robin, `<service>/random`,
//! `<service>/least-request`, `<service>/ring-hash` for `Cookie` and
//! `RequestHash`, `<service>/session` for `Session` (with
//! `override_host_status`), `<service>/weighted-round-robin`,
//! `<service>/pick-first` and `<service>/custom` (one custom policy per
//! service: its routes must agree on it, as on every cluster setting).
//!
//! A least request cluster is Envoy's `LEAST_REQUEST` with
//! `least_request_lb_config.choice_count` for Envoy; proxyless clients get
//! a `load_balancing_policy` of `WrrLocality` whose endpoint-picking list is
//! `[LeastRequest, RoundRobin]`: gRPC's `least_request` (A48) where the client
//! has it (grpc-go, grpc-java, tether), round robin where it does not (gRPC
//! C-core skips a policy it does not know and takes the next, where the
//! legacy `LEAST_REQUEST` enum would make it NACK the cluster).
//!
//! A weighted round robin cluster (A58) gets
//! `ClientSideWeightedRoundRobin` with every setting written out: alone for
//! Envoy (1.40 ACKs it), inside `WrrLocality` before `RoundRobin` for
//! proxyless clients, as least request. A pick first cluster is Envoy's
//! round robin (Envoy 1.40 does not know `PickFirst`) and, for proxyless
//! clients, `[PickFirst]` on its own, not under `WrrLocality`: gRPC runs
//! pick first over all of a priority's endpoints (A62). A custom cluster
//! (A52) is round robin for Envoy, which cannot run a client's policy, and
//! for proxyless clients `WrrLocality` over `[TypedStruct, RoundRobin]`: the
//! client's policy where it is registered, round robin where it is not.
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
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::config::listener::v3 as lpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateConfig;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3 as sspb;
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
use envoy_types::pb::envoy::extensions::load_balancing_policies::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin;
use envoy_types::pb::envoy::extensions::load_balancing_policies::least_request::v3::LeastRequest;
use envoy_types::pb::envoy::extensions::load_balancing_policies::override_host::v3 as ohpb;
use envoy_types::pb::envoy::extensions::load_balancing_policies::pick_first::v3::PickFirst;
use envoy_types::pb::envoy::extensions::load_balancing_policies::round_robin::v3::RoundRobin;
use envoy_types::pb::envoy::extensions::load_balancing_policies::wrr_locality::v3::WrrLocality;
use envoy_types::pb::envoy::extensions::upstreams::http::v3 as uhttp;
use envoy_types::pb::envoy::extensions::wasm::v3 as wasmpb;
use envoy_types::pb::envoy::r#type::http::v3 as thttp;
use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
use envoy_types::pb::google::protobuf as pb;
use tether_core::http::set_cookie::CookieSpec;

use super::model::{
    split_locality, Condition, Config, HeaderCondition, Protocol, RouteSpec, ServiceSpec,
    SessionClusterSettings, SessionFilter, SessionSpec, Strategy,
};
use tether_xds::lb_config::weighted_round_robin::Settings as WrrSettings;
use tether_xds::resource::endpoint::HealthStatus;
use tether_xds::resource::typed_struct::TypedStruct;
use tether_xds::resource::{pack, ResourceKind};

use crate::dns::Resolved;
use crate::drain::DrainPolicy;
use crate::model::AddressField;

use crate::fault::FAULT_FILTER;

/// Name of the stateful session filter in every HTTP connection manager.
pub const SESSION_FILTER: &str = "envoy.filters.http.stateful_session";
/// The route configuration every listener reads.
pub const ROUTE_CONFIG: &str = "tether-routes";
/// The cookie Contour's `Cookie` strategy hashes on.
pub const AFFINITY_COOKIE: &str = "X-Contour-Session-Affinity";
/// The custom cluster type of aggregate clusters.
pub const AGGREGATE_CLUSTER: &str = "envoy.clusters.aggregate";
/// The name of the first tether plugin instance in Envoy's HTTP filters
/// (`tether-2`, `tether-3`, ... for routes with other session settings).
pub const PLUGIN_FILTER: &str = "tether";
/// The V8 runtime Envoy runs the plugin on.
pub const WASM_RUNTIME: &str = "envoy.wasm.runtime.v8";
/// Envoy's override_host load balancing policy (the plugin's wiring).
pub const OVERRIDE_HOST_POLICY: &str = "envoy.load_balancing_policies.override_host";

/// The tether plugin for Envoy clients (`envoy.sessionFilter: plugin`): the
/// `.wasm` file, the override header and one instance per distinct plugin
/// configuration the `Session` routes need, in the order routes use them.
#[derive(Debug, Clone, PartialEq)]
struct PluginWiring {
    filename: String,
    header: String,
    /// (filter name, plugin configuration JSON).
    instances: Vec<(String, String)>,
}

impl PluginWiring {
    fn of(config: &Config) -> Option<PluginWiring> {
        if config.envoy.session_filter != SessionFilter::Plugin {
            return None;
        }
        let plugin = config.envoy.plugin.clone().unwrap_or_default();
        let header = plugin.override_header();
        let mut instances: Vec<(String, String)> = Vec::new();
        for r in config.virtualhosts.iter().flat_map(|v| &v.routes) {
            let p = &r.load_balancer_policy;
            let (Strategy::Session, Some(s)) = (p.strategy, &p.session) else {
                continue;
            };
            let json = plugin_configuration(s, &header);
            if !instances.iter().any(|(_, j)| *j == json) {
                let name = match instances.len() {
                    0 => PLUGIN_FILTER.to_owned(),
                    n => format!("{PLUGIN_FILTER}-{}", n + 1),
                };
                instances.push((name, json));
            }
        }
        Some(PluginWiring {
            filename: plugin.filename.unwrap_or_default(),
            header,
            instances,
        })
    }

    /// The instance serving a `Session` route with `session`.
    fn instance_for(&self, session: &SessionSpec) -> Option<&str> {
        let json = plugin_configuration(session, &self.header);
        self.instances
            .iter()
            .find(|(_, j)| *j == json)
            .map(|(n, _)| n.as_str())
    }
}

/// The plugin's JSON configuration for a session spec: the cookie, `strict`,
/// the format, the keys read from `keysFile` and wiring (a)
/// (`override_encoding: list`).
pub fn plugin_configuration(session: &SessionSpec, override_header: &str) -> String {
    let c = &session.cookie.0;
    let mut cookie = serde_json::Map::new();
    cookie.insert("name".into(), c.name().into());
    cookie.insert("path".into(), c.path().into());
    if !c.ttl().is_zero() {
        cookie.insert(
            "ttl".into(),
            tether_core::duration::display(c.ttl()).to_string().into(),
        );
    }
    if !c.attributes().is_empty() {
        cookie.insert(
            "attributes".into(),
            c.attributes()
                .iter()
                .map(|a| serde_json::json!({ "name": a.name(), "value": a.value() }))
                .collect::<Vec<_>>()
                .into(),
        );
    }
    let format = session.format.map(|f| f.0).unwrap_or_default();
    let mut config = serde_json::json!({
        "cookie": cookie,
        "strict": session.strict,
        "format": format.as_str(),
        "override_header": override_header,
        "override_encoding": "list",
    });
    // The keys travel to Envoy in its configuration, never into a log.
    if !session.keys.is_empty() {
        config["keys"] = session.keys.secrets().into();
    }
    config.to_string()
}

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
    /// For the Envoys `envoy.nodes` lists, by node ID, in place of `envoy`.
    pub envoy_nodes: BTreeMap<String, Resources>,
    /// The services whose clients report load (`loadReporting`), by EDS
    /// name, with the interval they report at.
    pub load_reporting: BTreeMap<String, Duration>,
    /// The services whose DRAINING endpoints are removed (`drain`), by
    /// EDS name.
    pub drain: BTreeMap<String, DrainPolicy>,
}

impl Translated {
    /// The resources for one flavor.
    pub fn for_flavor(&self, f: Flavor) -> &Resources {
        match f {
            Flavor::Envoy => &self.envoy,
            Flavor::Proxyless => &self.proxyless,
        }
    }

    /// The resources for the client of `flavor` whose node ID is `node_id`:
    /// an Envoy listed in `envoy.nodes` gets its own.
    pub fn for_node(&self, f: Flavor, node_id: &str) -> &Resources {
        match (f, self.envoy_nodes.get(node_id)) {
            (Flavor::Envoy, Some(r)) => r,
            _ => self.for_flavor(f),
        }
    }
}

/// The cluster a route's strategy sends a service's traffic to.
pub fn cluster_name(service: &str, strategy: Strategy) -> String {
    match strategy {
        Strategy::RoundRobin => service.to_owned(),
        Strategy::Random => format!("{service}/random"),
        Strategy::LeastRequest => format!("{service}/least-request"),
        Strategy::Cookie | Strategy::RequestHash => format!("{service}/ring-hash"),
        Strategy::Session => format!("{service}/session"),
        Strategy::WeightedRoundRobin => format!("{service}/weighted-round-robin"),
        Strategy::PickFirst => format!("{service}/pick-first"),
        Strategy::Custom => format!("{service}/custom"),
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

/// Translates a validated model. Endpoints written as `NAME:PORT` give
/// none: [`translate_with`] takes their addresses.
pub fn translate(config: &Config) -> Translated {
    translate_with(config, &Resolved::default())
}

/// Translates a validated model whose names resolve to `resolved`: each
/// address of an endpoint's name is an endpoint with the entry's weight,
/// health, priority and locality, DRAINING while it drains.
pub fn translate_with(config: &Config, resolved: &Resolved) -> Translated {
    let mut out = translate_for(config, resolved);
    for node in &config.envoy.nodes {
        let own = translate_for(&config.for_envoy_node(node), resolved);
        out.envoy_nodes.insert(node.id.clone(), own.envoy);
    }
    out
}

/// Translates a model for every client but the Envoys of `envoy.nodes`.
fn translate_for(config: &Config, resolved: &Resolved) -> Translated {
    let mut out = Translated {
        load_reporting: config
            .services
            .iter()
            .filter_map(|s| Some((s.name.clone(), s.load_reporting.as_ref()?.interval.0)))
            .collect(),
        drain: config
            .services
            .iter()
            .filter_map(|s| Some((s.name.clone(), DrainPolicy::from(s.drain.as_ref()?))))
            .collect(),
        ..Translated::default()
    };
    let uses_session = config
        .virtualhosts
        .iter()
        .flat_map(|v| &v.routes)
        .any(|r| r.load_balancer_policy.strategy == Strategy::Session);
    let uses_fault = config
        .virtualhosts
        .iter()
        .any(|v| v.fault.is_some() || v.routes.iter().any(|r| r.fault.is_some()));

    let plugin = PluginWiring::of(config);

    // Routes: shared, unless Envoy runs the plugin.
    let routes = pack(&route_configuration(config, None));
    let envoy_routes = match &plugin {
        Some(p) => pack(&route_configuration(config, Some(p))),
        None => routes.clone(),
    };
    for (r, routes) in [(&mut out.envoy, envoy_routes), (&mut out.proxyless, routes)] {
        r.entry(ResourceKind::RouteConfiguration)
            .or_default()
            .insert(ROUTE_CONFIG.to_owned(), routes);
    }

    // Listeners.
    let manager = |stat: &str, flavor: Flavor| hcm::HttpConnectionManager {
        stat_prefix: stat.to_owned(),
        codec_type: hcm::http_connection_manager::CodecType::Auto as i32,
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
            hcm::Rds {
                config_source: Some(ads()),
                route_config_name: ROUTE_CONFIG.to_owned(),
            },
        )),
        http_filters: match (&plugin, flavor) {
            (Some(p), Flavor::Envoy) => plugin_filters(p, uses_fault),
            _ => http_filters(uses_session, uses_fault),
        },
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
                        Flavor::Envoy,
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
                    api_listener: Some(pack(&manager(&name, Flavor::Proxyless))),
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
            let mut c = cluster(config, spec, *strategy, settings.as_ref(), flavor);
            if let (Some(p), Flavor::Envoy, Strategy::Session) = (&plugin, flavor, *strategy) {
                if !spec.is_aggregate() {
                    override_host(&mut c, &p.header);
                    c.outlier_detection = Some(connect_failure_ejection());
                }
            }
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
        let cla = pack(&load_assignment(s, resolved));
        for r in [&mut out.envoy, &mut out.proxyless] {
            r.entry(ResourceKind::Endpoints)
                .or_default()
                .insert(s.name.clone(), cla.clone());
        }
    }
    out
}

fn http_filters(uses_session: bool, uses_fault: bool) -> Vec<hcm::HttpFilter> {
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
    if uses_fault {
        // Present but empty, as istiod sends it: routes and virtual hosts
        // with a `fault` override it.
        filters.push(hcm::HttpFilter {
            name: FAULT_FILTER.to_owned(),
            config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack(
                &HttpFault::default(),
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

/// Envoy's HTTP filters with the plugin: every instance, off unless a
/// route switches it on, then the router.
fn plugin_filters(p: &PluginWiring, uses_fault: bool) -> Vec<hcm::HttpFilter> {
    let mut filters: Vec<hcm::HttpFilter> = p
        .instances
        .iter()
        .map(|(name, json)| {
            let wasm = Wasm {
                config: Some(wasmpb::PluginConfig {
                    name: name.clone(),
                    root_id: name.clone(),
                    configuration: Some(pack(&pb::StringValue {
                        value: json.clone(),
                    })),
                    vm: Some(wasmpb::plugin_config::Vm::VmConfig(wasmpb::VmConfig {
                        runtime: WASM_RUNTIME.to_owned(),
                        code: Some(core::AsyncDataSource {
                            specifier: Some(core::async_data_source::Specifier::Local(
                                core::DataSource {
                                    specifier: Some(core::data_source::Specifier::Filename(
                                        p.filename.clone(),
                                    )),
                                    ..Default::default()
                                },
                            )),
                        }),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
            };
            hcm::HttpFilter {
                name: name.clone(),
                config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack(&wasm))),
                disabled: true,
                ..Default::default()
            }
        })
        .collect();
    filters.extend(http_filters(false, uses_fault));
    filters
}

/// Envoy's name of the round robin policy.
pub const ROUND_ROBIN_POLICY: &str = "envoy.load_balancing_policies.round_robin";
/// Envoy's (and gRPC's) name of the weighted round robin policy (A58).
pub const WEIGHTED_ROUND_ROBIN_POLICY: &str =
    "envoy.load_balancing_policies.client_side_weighted_round_robin";
/// The name of the pick first policy (A62).
pub const PICK_FIRST_POLICY: &str = "envoy.load_balancing_policies.pick_first";
/// The name of the policy that weights localities around another (A52).
pub const WRR_LOCALITY_POLICY: &str = "envoy.load_balancing_policies.wrr_locality";

/// One entry of a `load_balancing_policy` list.
fn policy(name: &str, typed: pb::Any) -> cpb::load_balancing_policy::Policy {
    cpb::load_balancing_policy::Policy {
        typed_extension_config: Some(core::TypedExtensionConfig {
            name: name.to_owned(),
            typed_config: Some(typed),
        }),
    }
}

/// Round robin, the fallback of every endpoint-picking list.
fn round_robin() -> cpb::load_balancing_policy::Policy {
    policy(ROUND_ROBIN_POLICY, pack(&RoundRobin::default()))
}

/// `WrrLocality` whose endpoint-picking policy is the first of
/// `endpoint_picking` the client has.
fn wrr_locality(
    endpoint_picking: Vec<cpb::load_balancing_policy::Policy>,
) -> cpb::LoadBalancingPolicy {
    cpb::LoadBalancingPolicy {
        policies: vec![policy(
            WRR_LOCALITY_POLICY,
            pack(&WrrLocality {
                endpoint_picking_policy: Some(cpb::LoadBalancingPolicy {
                    policies: endpoint_picking,
                }),
            }),
        )],
    }
}

/// A weighted round robin cluster: `ClientSideWeightedRoundRobin` with
/// every setting written out, alone for Envoy, for proxyless clients in
/// `WrrLocality` before round robin (see the module's documentation).
fn weighted_round_robin(c: &mut cpb::Cluster, s: &WrrSettings, flavor: Flavor) {
    let wrr = ClientSideWeightedRoundRobin {
        enable_oob_load_report: Some(pb::BoolValue {
            value: s.enable_oob_load_report,
        }),
        oob_reporting_period: Some(duration(s.oob_reporting_period)),
        blackout_period: Some(duration(s.blackout_period)),
        weight_expiration_period: Some(duration(s.weight_expiration_period)),
        weight_update_period: Some(duration(s.weight_update_period)),
        error_utilization_penalty: Some(pb::FloatValue {
            value: s.error_utilization_penalty,
        }),
        ..Default::default()
    };
    let wrr = policy(WEIGHTED_ROUND_ROBIN_POLICY, pack(&wrr));
    c.load_balancing_policy = Some(match flavor {
        Flavor::Envoy => cpb::LoadBalancingPolicy {
            policies: vec![wrr],
        },
        Flavor::Proxyless => wrr_locality(vec![wrr, round_robin()]),
    });
}

/// Makes an Envoy session cluster route with the override_host policy on
/// the plugin's header, round robin as the fallback.
fn override_host(c: &mut cpb::Cluster, header: &str) {
    let oh = ohpb::OverrideHost {
        override_host_sources: vec![ohpb::override_host::OverrideHostSource {
            header: header.to_owned(),
            ..Default::default()
        }],
        fallback_policy: Some(cpb::LoadBalancingPolicy {
            policies: vec![round_robin()],
        }),
        ..Default::default()
    };
    c.load_balancing_policy = Some(cpb::LoadBalancingPolicy {
        policies: vec![policy(OVERRIDE_HOST_POLICY, pack(&oh))],
    });
}

/// A least request cluster: Envoy's `LEAST_REQUEST`, or for proxyless
/// clients `WrrLocality` over `[LeastRequest, RoundRobin]` (see the module's
/// documentation).
fn least_request(c: &mut cpb::Cluster, choice_count: u32, flavor: Flavor) {
    use cpb::cluster::LbPolicy;
    let count = Some(pb::UInt32Value {
        value: choice_count,
    });
    if flavor == Flavor::Envoy {
        c.lb_policy = LbPolicy::LeastRequest as i32;
        c.lb_config = Some(cpb::cluster::LbConfig::LeastRequestLbConfig(
            cpb::cluster::LeastRequestLbConfig {
                choice_count: count,
                ..Default::default()
            },
        ));
        return;
    }
    c.load_balancing_policy = Some(wrr_locality(vec![
        policy(
            "envoy.load_balancing_policies.least_request",
            pack(&LeastRequest {
                choice_count: count,
                ..Default::default()
            }),
        ),
        round_robin(),
    ]));
}

/// The retry policy of a `Session` route when Envoy runs the plugin: a
/// pinned host that cannot be connected to (refused, or gone and timing
/// out) is retried elsewhere, and the plugin re-pins the session there. A
/// retry never goes back to a host this request already tried: the
/// fallback's round robin would otherwise pick a vanished host again.
fn session_retry_policy() -> rpb::RetryPolicy {
    use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
    use rpb::retry_policy::retry_host_predicate::ConfigType;
    rpb::RetryPolicy {
        retry_on: "connect-failure".to_owned(),
        num_retries: Some(pb::UInt32Value { value: 2 }),
        retry_host_predicate: vec![rpb::retry_policy::RetryHostPredicate {
            name: PREVIOUS_HOSTS.to_owned(),
            config_type: Some(ConfigType::TypedConfig(pack(
                &PreviousHostsPredicate::default(),
            ))),
        }],
        host_selection_retry_max_attempts: 3,
        ..Default::default()
    }
}

/// Envoy's retry host predicate that skips hosts a request already tried.
pub const PREVIOUS_HOSTS: &str = "envoy.retry_host_predicates.previous_hosts";

/// Outlier detection for an Envoy session cluster with the plugin: a host
/// that fails a connection is ejected (30 s, longer each time it fails
/// again, at most 300 s), so new sessions stop paying the connect timeout for a backend
/// that is gone until the control plane removes it. Sessions pinned to it
/// still try it once (the override_host policy ignores ejection), then move.
/// Only connection failures eject: answers, 5xx included, never do.
fn connect_failure_ejection() -> cpb::OutlierDetection {
    let n = |value| Some(pb::UInt32Value { value });
    cpb::OutlierDetection {
        split_external_local_origin_errors: true,
        consecutive_local_origin_failure: n(1),
        // Percentages: always eject on that, never on the other detectors.
        enforcing_consecutive_local_origin_failure: n(100),
        enforcing_consecutive_5xx: n(0),
        enforcing_success_rate: n(0),
        enforcing_local_origin_success_rate: n(0),
        // At most half of a cluster: one host of two or three.
        max_ejection_percent: n(50),
        ..Default::default()
    }
}

fn route_configuration(config: &Config, plugin: Option<&PluginWiring>) -> rpb::RouteConfiguration {
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
                routes: vh.routes.iter().map(|r| route(r, plugin)).collect(),
                typed_per_filter_config: vh
                    .fault
                    .iter()
                    .map(|f| (FAULT_FILTER.to_owned(), pack(&f.to_proto())))
                    .collect(),
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

fn route(r: &RouteSpec, plugin: Option<&PluginWiring>) -> rpb::Route {
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
    if let Some(f) = &r.fault {
        typed_per_filter_config.insert(FAULT_FILTER.to_owned(), pack(&f.to_proto()));
    }
    let mut retry_policy = None;
    if let (Strategy::Session, Some(s), Some(plugin)) = (p.strategy, &p.session, plugin) {
        // Switch this route's plugin instance on. A pinned host that refuses
        // connections: the retry walks the override list, then the fallback
        // policy picks a live host and the plugin re-pins the session there.
        if let Some(name) = plugin.instance_for(s) {
            let on = rpb::FilterConfig {
                config: Some(pb::Any::default()),
                ..Default::default()
            };
            typed_per_filter_config.insert(name.to_owned(), pack(&on));
        }
        retry_policy = Some(session_retry_policy());
    } else if let (Strategy::Session, Some(s)) = (p.strategy, &p.session) {
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
    if let Some(p) = &r.retry_policy {
        retry_policy = Some(p.to_proto());
    }
    rpb::Route {
        r#match: Some(route_match(&r.conditions)),
        action: Some(rpb::route::Action::Route(rpb::RouteAction {
            cluster_specifier: Some(cluster_specifier),
            hash_policy,
            retry_policy,
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
        Strategy::WeightedRoundRobin => weighted_round_robin(
            &mut c,
            &config.weighted_round_robin_settings(&spec.name),
            flavor,
        ),
        Strategy::PickFirst | Strategy::Custom if flavor == Flavor::Envoy => {
            c.lb_policy = LbPolicy::RoundRobin as i32
        }
        Strategy::PickFirst => {
            let pick_first = PickFirst {
                shuffle_address_list: config.pick_first_shuffle(&spec.name),
            };
            c.load_balancing_policy = Some(cpb::LoadBalancingPolicy {
                policies: vec![policy(PICK_FIRST_POLICY, pack(&pick_first))],
            });
        }
        Strategy::Custom => match config.custom_policy(&spec.name) {
            Some(custom) => {
                let typed = TypedStruct::new(&custom.policy, &custom.config);
                c.load_balancing_policy = Some(wrr_locality(vec![
                    policy(&custom.policy, pack(&typed)),
                    round_robin(),
                ]));
            }
            // Validation requires `custom`; round robin should it be absent.
            None => c.lb_policy = LbPolicy::RoundRobin as i32,
        },
        // gRPC has no random policy; proxyless clients get round robin.
        Strategy::Random if flavor == Flavor::Envoy => c.lb_policy = LbPolicy::Random as i32,
        Strategy::Random => c.lb_policy = LbPolicy::RoundRobin as i32,
        Strategy::LeastRequest => {
            least_request(
                &mut c,
                config.least_request_choice_count(&spec.name),
                flavor,
            );
        }
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
    if let Some(od) = &spec.outlier_detection {
        c.outlier_detection = Some(outlier_detection(&od.settings()));
    }
    // Load reports to the server the cluster came from (gRFC A27's `self`);
    // Envoy reports through its bootstrap's load stats config instead.
    if spec.load_reporting.is_some() && flavor == Flavor::Proxyless {
        c.lrs_server = Some(core::ConfigSource {
            config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Self_(
                core::SelfConfigSource::default(),
            )),
            ..Default::default()
        });
    }
    // The backends' ORCA metrics the reports carry (gRFC A85): Envoy adds
    // them to its reports too.
    if let Some(l) = &spec.load_reporting {
        c.lrs_report_endpoint_metrics = l.endpoint_metrics.clone();
    }
    match (&spec.tls, flavor) {
        (Some(t), Flavor::Proxyless) => c.transport_socket = Some(upstream_tls(t)),
        (Some(t), Flavor::Envoy) => c.transport_socket = envoy_upstream_tls(t),
        _ => {}
    }
    if flavor == Flavor::Envoy && spec.protocol == Protocol::H2c {
        let opts = uhttp::HttpProtocolOptions {
            upstream_protocol_options: Some(
                uhttp::http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    uhttp::http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(
                            uhttp::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                                core::Http2ProtocolOptions {
                                    connection_keepalive: spec.keepalive.map(|k| core::KeepaliveSettings {
                                        interval: Some(duration(k.interval.0)),
                                        timeout: Some(duration(k.timeout.0)),
                                        ..Default::default()
                                    }),
                                    ..Default::default()
                                },
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

/// A cluster's `transport_socket` for a service's `tls` (gRFC A29): the
/// provider instances by name, the SAN matchers.
// gRPC reads `match_subject_alt_names` (Envoy deprecated it for typed ones).
#[allow(deprecated)]
fn upstream_tls(t: &crate::model::ServiceTlsSpec) -> core::TransportSocket {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
    let instance = |name: &str| tls::CertificateProviderPluginInstance {
        instance_name: name.to_owned(),
        certificate_name: String::new(),
    };
    let matchers = san_matchers(t);
    let context = tls::UpstreamTlsContext {
        common_tls_context: Some(tls::CommonTlsContext {
            tls_certificate_provider_instance: t.identity_instance.as_deref().map(instance),
            validation_context_type: Some(
                tls::common_tls_context::ValidationContextType::ValidationContext(
                    tls::CertificateValidationContext {
                        ca_certificate_provider_instance: (!t.system_root_certs)
                            .then(|| instance(&t.ca_instance)),
                        system_root_certs: t
                            .system_root_certs
                            .then_some(tls::certificate_validation_context::SystemRootCerts {}),
                        match_subject_alt_names: matchers,
                        ..Default::default()
                    },
                ),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    core::TransportSocket {
        name: "envoy.transport_sockets.tls".to_owned(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(pack(
            &context,
        ))),
    }
}

/// A service's `subjectAltNames` as xDS string matchers.
fn san_matchers(
    t: &crate::model::ServiceTlsSpec,
) -> Vec<envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher> {
    use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
    use mpb::string_matcher::MatchPattern as M;
    t.subject_alt_names
        .iter()
        .filter_map(|m| {
            let pattern = if let Some(v) = &m.exact {
                M::Exact(v.clone())
            } else if let Some(v) = &m.prefix {
                M::Prefix(v.clone())
            } else if let Some(v) = &m.suffix {
                M::Suffix(v.clone())
            } else if let Some(v) = &m.contains {
                M::Contains(v.clone())
            } else {
                M::SafeRegex(mpb::RegexMatcher {
                    regex: m.regex.clone()?,
                    ..Default::default()
                })
            };
            Some(mpb::StringMatcher {
                match_pattern: Some(pattern),
                ignore_case: m.ignore_case,
            })
        })
        .collect()
}

/// An Envoy cluster's `transport_socket` for a service's `tls.envoy`: the
/// same SAN matchers (typed, for the SAN types a proxyless client reads:
/// DNS, URI and IP, as C-core; not e-mail), the roots and identity from
/// files, ALPN `h2`. `None` without `tls.envoy`.
fn envoy_upstream_tls(t: &crate::model::ServiceTlsSpec) -> Option<core::TransportSocket> {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
    let files = t.envoy.as_ref()?;
    let file = |path: &str| core::DataSource {
        specifier: Some(core::data_source::Specifier::Filename(path.to_owned())),
        ..Default::default()
    };
    let untyped = san_matchers(t);
    use tls::subject_alt_name_matcher::SanType;
    let typed = untyped
        .iter()
        .flat_map(|m| {
            [SanType::Dns, SanType::Uri, SanType::IpAddress]
                .into_iter()
                .map(move |san_type| tls::SubjectAltNameMatcher {
                    san_type: san_type as i32,
                    matcher: Some(m.clone()),
                    ..Default::default()
                })
        })
        .collect();
    let identity = match (&files.certificate_file, &files.private_key_file) {
        (Some(cert), Some(key)) => vec![tls::TlsCertificate {
            certificate_chain: Some(file(cert)),
            private_key: Some(file(key)),
            ..Default::default()
        }],
        _ => Vec::new(),
    };
    let context = tls::UpstreamTlsContext {
        common_tls_context: Some(tls::CommonTlsContext {
            tls_certificates: identity,
            validation_context_type: Some(
                tls::common_tls_context::ValidationContextType::ValidationContext(
                    tls::CertificateValidationContext {
                        trusted_ca: Some(file(&files.ca_file)),
                        match_typed_subject_alt_names: typed,
                        ..Default::default()
                    },
                ),
            ),
            alpn_protocols: vec!["h2".to_owned()],
            ..Default::default()
        }),
        ..Default::default()
    };
    Some(core::TransportSocket {
        name: "envoy.transport_sockets.tls".to_owned(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(pack(
            &context,
        ))),
    })
}

/// CDS `outlier_detection` for gRPC's settings (gRFC A50's mapping):
/// success rate off is `enforcing_success_rate: 0`; failure percentage on
/// is a non-zero `enforcing_failure_percentage`. Envoy's consecutive-5xx
/// ejection, on by default in Envoy and unknown to gRPC, is switched off so
/// both kinds of client eject alike.
fn outlier_detection(
    s: &tether_xds::lb_config::outlier_detection::OutlierDetectionConfig,
) -> cpb::OutlierDetection {
    let u32v = |value| Some(pb::UInt32Value { value });
    let mut od = cpb::OutlierDetection {
        interval: Some(duration(s.interval)),
        base_ejection_time: Some(duration(s.base_ejection_time)),
        max_ejection_time: Some(duration(s.max_ejection_time)),
        max_ejection_percent: u32v(s.max_ejection_percent),
        enforcing_consecutive_5xx: u32v(0),
        enforcing_success_rate: u32v(0),
        ..Default::default()
    };
    if let Some(sr) = &s.success_rate {
        od.enforcing_success_rate = u32v(sr.enforcement_percentage);
        od.success_rate_stdev_factor = u32v(sr.stdev_factor);
        od.success_rate_minimum_hosts = u32v(sr.minimum_hosts);
        od.success_rate_request_volume = u32v(sr.request_volume);
    }
    if let Some(fp) = &s.failure_percentage {
        od.enforcing_failure_percentage = u32v(fp.enforcement_percentage);
        od.failure_percentage_threshold = u32v(fp.threshold);
        od.failure_percentage_minimum_hosts = u32v(fp.minimum_hosts);
        od.failure_percentage_request_volume = u32v(fp.request_volume);
    }
    od
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

fn load_assignment(spec: &ServiceSpec, resolved: &Resolved) -> epb::ClusterLoadAssignment {
    // (priority, locality) → endpoints, in first-seen order per key.
    let mut groups: BTreeMap<(u32, String), Vec<epb::LbEndpoint>> = BTreeMap::new();
    // An address served once per service: two names (or a name and an IP)
    // may resolve to the same one, and gRPC refuses an EDS resource that
    // lists an address twice (A61). The first entry keeps it.
    let mut seen: BTreeSet<SocketAddr> = BTreeSet::new();
    for e in &spec.endpoints {
        // (address, draining) for each endpoint the entry makes.
        let primaries: Vec<(SocketAddr, bool)> = match &e.address {
            AddressField::Name { host, port } => resolved
                .addresses(host)
                .iter()
                .map(|r| (SocketAddr::new(r.ip, *port), r.draining))
                .collect(),
            other => other.ip().map(|a| (a, false)).into_iter().collect(),
        };
        let additional: Vec<SocketAddr> = e
            .additional_addresses
            .iter()
            .flat_map(|a| match a {
                AddressField::Name { host, port } => resolved
                    .addresses(host)
                    .iter()
                    .map(|r| SocketAddr::new(r.ip, *port))
                    .collect(),
                other => other.ip().into_iter().collect::<Vec<_>>(),
            })
            .collect();
        for (address, draining) in primaries {
            if !seen.insert(address) {
                log::warn!(
                    "service {:?}: {address} (from {}) is already an endpoint of the service; served once",
                    spec.name,
                    e.address
                );
                continue;
            }
            let additional: Vec<SocketAddr> = additional
                .iter()
                .copied()
                .filter(|a| seen.insert(*a))
                .collect();
            let health = if draining {
                HealthStatus::Draining
            } else {
                e.health.0
            };
            let lb = epb::LbEndpoint {
                health_status: health.as_i32(),
                load_balancing_weight: Some(pb::UInt32Value { value: e.weight }),
                host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(epb::Endpoint {
                    address: Some(socket(address)),
                    additional_addresses: additional
                        .into_iter()
                        .map(|a| epb::endpoint::AdditionalAddress {
                            address: Some(socket(a)),
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
        policy: drop_policy(spec),
        ..Default::default()
    }
}

/// The service's `dropOverloads` as EDS `policy.drop_overloads`, in the
/// file's order (clients apply them one after the other), each per
/// million: the finest denominator, which gRPC, tether and Envoy all read.
/// None without drops.
fn drop_policy(spec: &ServiceSpec) -> Option<epb::cluster_load_assignment::Policy> {
    use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
    use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
    if spec.drop_overloads.is_empty() {
        return None;
    }
    Some(epb::cluster_load_assignment::Policy {
        drop_overloads: spec
            .drop_overloads
            .iter()
            .map(|d| epb::cluster_load_assignment::policy::DropOverload {
                category: d.category.clone(),
                drop_percentage: Some(FractionalPercent {
                    numerator: d.per_million(),
                    denominator: DenominatorType::Million as i32,
                }),
            })
            .collect(),
        ..Default::default()
    })
}
