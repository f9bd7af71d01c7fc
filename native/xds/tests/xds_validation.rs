//! Resource validation as gRPC does it: every resource kind, with the
//! field-named errors a NACK carries (gRPC C-core's rules).

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::config::listener::v3 as lpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3 as sspb;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
use envoy_types::pb::envoy::extensions::http::stateful_session::header::v3::HeaderBasedSessionState;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::r#type::http::v3 as thttp;
use envoy_types::pb::google::protobuf::{self as pb, Any};
use tether_xds::lb_config::outlier_detection::{
    FailurePercentageEjection, OutlierDetectionConfig, SuccessRateEjection,
};
use tether_xds::resource::cluster::{ClusterResource, Discovery, LbPolicy};
use tether_xds::resource::endpoint::{EndpointsResource, HealthStatus};
use tether_xds::resource::listener::{
    FilterConfig, FilterOverride, ListenerResource, RouteSource, SessionOverride,
};
use tether_xds::resource::route::{
    ClusterSpecifier, HashSource, HeaderMatch, PathMatcher, RouteConfigResource,
};
use tether_xds::resource::{decode, pack, Resource, ResourceKind};

fn ads() -> core::ConfigSource {
    core::ConfigSource {
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

fn errors(kind: ResourceKind, any: &Any) -> Vec<String> {
    match decode(kind, any).result {
        Ok(r) => panic!("expected a NACK, got {r:?}"),
        Err(e) => e.errors.iter().map(ToString::to_string).collect(),
    }
}

fn ok(kind: ResourceKind, any: &Any) -> Resource {
    decode(kind, any)
        .result
        .unwrap_or_else(|e| panic!("unexpected NACK: {e}"))
}

// ---------- listeners ----------

fn filter(name: &str, any: Any) -> hcm::HttpFilter {
    hcm::HttpFilter {
        name: name.into(),
        config_type: Some(hcm::http_filter::ConfigType::TypedConfig(any)),
        ..Default::default()
    }
}

fn router() -> hcm::HttpFilter {
    filter("router", pack(&Router::default()))
}

fn session(cookie: Option<thttp::Cookie>) -> sspb::StatefulSession {
    sspb::StatefulSession {
        session_state: Some(core::TypedExtensionConfig {
            name: "envoy.http.stateful_session.cookie".into(),
            typed_config: Some(pack(&CookieBasedSessionState { cookie })),
        }),
        ..Default::default()
    }
}

fn cookie(name: &str, ttl: Option<pb::Duration>) -> thttp::Cookie {
    thttp::Cookie {
        name: name.into(),
        ttl,
        path: "/".into(),
        attributes: vec![],
    }
}

fn listener(filters: Vec<hcm::HttpFilter>) -> Any {
    let m = hcm::HttpConnectionManager {
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
            hcm::Rds {
                config_source: Some(ads()),
                route_config_name: "routes".into(),
            },
        )),
        http_filters: filters,
        ..Default::default()
    };
    pack(&lpb::Listener {
        name: "l".into(),
        api_listener: Some(lpb::ApiListener {
            api_listener: Some(pack(&m)),
        }),
        ..Default::default()
    })
}

#[test]
fn listener_with_stateful_session_cookie() {
    let l = ok(
        ResourceKind::Listener,
        &listener(vec![
            filter(
                "ssa",
                pack(&session(Some(cookie(
                    "global-session-cookie",
                    Some(pb::Duration {
                        seconds: 120,
                        nanos: 0,
                    }),
                )))),
            ),
            router(),
        ]),
    );
    let Resource::Listener(l) = l else { panic!() };
    let l: &ListenerResource = &l;
    assert_eq!(l.http.routes, RouteSource::Rds("routes".into()));
    let (name, s) = l.http.stateful_session().unwrap();
    assert_eq!(name, "ssa");
    let c = s.cookie.as_ref().unwrap();
    assert_eq!(
        (c.name(), c.path(), c.ttl()),
        ("global-session-cookie", "/", Duration::from_secs(120))
    );
    assert_eq!(l.http.http_filters[1].config, FilterConfig::Router);
}

#[test]
fn stateful_session_without_session_state_is_a_valid_no_op() {
    let Resource::Listener(l) = ok(
        ResourceKind::Listener,
        &listener(vec![
            filter("ssa", pack(&sspb::StatefulSession::default())),
            router(),
        ]),
    ) else {
        panic!()
    };
    assert_eq!(l.http.stateful_session().unwrap().1.cookie, None);
}

#[test]
fn stateful_session_errors_name_the_field() {
    let cases: Vec<(sspb::StatefulSession, &str)> = vec![
        (session(None), "http_filters[0].typed_config.session_state.typed_config.cookie: field not present"),
        (session(Some(cookie("", None))), "http_filters[0].typed_config.session_state.typed_config.cookie.name: field not present"),
        (
            session(Some(cookie("s", Some(pb::Duration { seconds: -1, nanos: 0 })))),
            "http_filters[0].typed_config.session_state.typed_config.cookie.ttl.seconds: -1 is outside [0, 315576000000]",
        ),
        (
            session(Some(cookie("s", Some(pb::Duration { seconds: 1, nanos: 1_000_000_000 })))),
            "http_filters[0].typed_config.session_state.typed_config.cookie.ttl.nanos: 1000000000 is outside [0, 999999999]",
        ),
        (
            session(Some(cookie("s", Some(pb::Duration { seconds: 315_576_000_001, nanos: 0 })))),
            "http_filters[0].typed_config.session_state.typed_config.cookie.ttl.seconds: 315576000001 is outside [0, 315576000000]",
        ),
        (
            sspb::StatefulSession {
                session_state: Some(core::TypedExtensionConfig {
                    name: "header".into(),
                    typed_config: Some(pack(&HeaderBasedSessionState { name: "x-s".into() })),
                }),
                ..Default::default()
            },
            "http_filters[0].typed_config.session_state.typed_config.type_url: \"type.googleapis.com/envoy.extensions.http.stateful_session.header.v3.HeaderBasedSessionState\" unsupported session state type",
        ),
    ];
    for (s, want) in cases {
        let e = errors(
            ResourceKind::Listener,
            &listener(vec![filter("ssa", pack(&s)), router()]),
        );
        assert_eq!(e, vec![format!("api_listener.api_listener.{want}")]);
    }
    // tether-core's cookie rules apply to the name.
    let e = errors(
        ResourceKind::Listener,
        &listener(vec![
            filter("ssa", pack(&session(Some(cookie("a;b", None))))),
            router(),
        ]),
    );
    assert!(
        e[0].starts_with("api_listener.api_listener.http_filters[0].typed_config.session_state.typed_config.cookie.name: \"a;b\""),
        "{e:?}"
    );
}

#[test]
fn http_filter_chain_rules() {
    let e = errors(ResourceKind::Listener, &listener(vec![]));
    assert_eq!(
        e,
        ["api_listener.api_listener.http_filters: expected at least one HTTP filter"]
    );
    let e = errors(
        ResourceKind::Listener,
        &listener(vec![filter("ssa", pack(&sspb::StatefulSession::default()))]),
    );
    assert_eq!(
        e,
        ["api_listener.api_listener.http_filters[0]: the last HTTP filter must be the router"]
    );
    let e = errors(ResourceKind::Listener, &listener(vec![router(), router()]));
    assert!(e.contains(&"api_listener.api_listener.http_filters[1].name: \"router\" is a duplicate filter name".to_owned()), "{e:?}");
    let unknown = filter("x", pack(&HttpProtocolOptions::default()));
    let e = errors(
        ResourceKind::Listener,
        &listener(vec![unknown.clone(), router()]),
    );
    assert!(e[0].ends_with("is an unsupported filter type"), "{e:?}");
    // The same filter marked optional is skipped.
    let mut optional = unknown;
    optional.is_optional = true;
    let Resource::Listener(l) = ok(ResourceKind::Listener, &listener(vec![optional, router()]))
    else {
        panic!()
    };
    assert_eq!(l.http.http_filters.len(), 1);
    // Not an API listener.
    let e = errors(
        ResourceKind::Listener,
        &pack(&lpb::Listener {
            name: "tcp".into(),
            ..Default::default()
        }),
    );
    assert_eq!(
        e,
        ["api_listener: field not present (tether's client takes API listeners only)"]
    );
}

#[test]
fn rds_must_come_from_ads() {
    let m = hcm::HttpConnectionManager {
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
            hcm::Rds {
                config_source: Some(core::ConfigSource {
                    config_source_specifier: Some(
                        core::config_source::ConfigSourceSpecifier::ApiConfigSource(
                            Default::default(),
                        ),
                    ),
                    ..Default::default()
                }),
                route_config_name: "r".into(),
            },
        )),
        http_filters: vec![router()],
        ..Default::default()
    };
    let any = pack(&lpb::Listener {
        name: "l".into(),
        api_listener: Some(lpb::ApiListener {
            api_listener: Some(pack(&m)),
        }),
        ..Default::default()
    });
    assert_eq!(
        errors(ResourceKind::Listener, &any),
        ["api_listener.api_listener.rds.config_source: ConfigSource is not ADS or SELF"]
    );
}

// ---------- routes ----------

fn per_route(
    o: sspb::stateful_session_per_route::Override,
) -> std::collections::HashMap<String, Any> {
    [(
        "ssa".to_owned(),
        pack(&sspb::StatefulSessionPerRoute {
            r#override: Some(o),
        }),
    )]
    .into()
}

fn route_config(routes: Vec<rpb::Route>) -> Any {
    pack(&rpb::RouteConfiguration {
        name: "routes".into(),
        virtual_hosts: vec![rpb::VirtualHost {
            name: "vh".into(),
            domains: vec!["*".into()],
            routes,
            ..Default::default()
        }],
        ..Default::default()
    })
}

fn weighted(entries: &[(&str, Option<u32>)]) -> rpb::route::Action {
    rpb::route::Action::Route(rpb::RouteAction {
        cluster_specifier: Some(rpb::route_action::ClusterSpecifier::WeightedClusters(
            rpb::WeightedCluster {
                clusters: entries
                    .iter()
                    .map(|(n, w)| rpb::weighted_cluster::ClusterWeight {
                        name: (*n).into(),
                        weight: w.map(|value| pb::UInt32Value { value }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        )),
        ..Default::default()
    })
}

fn prefix(p: &str) -> Option<rpb::RouteMatch> {
    Some(rpb::RouteMatch {
        path_specifier: Some(rpb::route_match::PathSpecifier::Prefix(p.into())),
        ..Default::default()
    })
}

#[test]
fn routes_with_matchers_weighted_clusters_hash_policies_and_session_overrides() {
    use rpb::route_action::hash_policy as hp;
    let header_route = rpb::Route {
        r#match: Some(rpb::RouteMatch {
            path_specifier: Some(rpb::route_match::PathSpecifier::SafeRegex(
                envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher {
                    regex: "/svc/[a-z]+".into(),
                    ..Default::default()
                },
            )),
            headers: vec![rpb::HeaderMatcher {
                name: "X-Canary".into(),
                header_match_specifier: Some(
                    rpb::header_matcher::HeaderMatchSpecifier::PresentMatch(true),
                ),
                invert_match: true,
                ..Default::default()
            }],
            ..Default::default()
        }),
        action: Some(rpb::route::Action::Route(rpb::RouteAction {
            cluster_specifier: Some(rpb::route_action::ClusterSpecifier::Cluster("c1".into())),
            hash_policy: vec![
                rpb::route_action::HashPolicy {
                    policy_specifier: Some(hp::PolicySpecifier::Header(hp::Header {
                        header_name: "X-User".into(),
                        regex_rewrite: None,
                    })),
                    terminal: true,
                },
                rpb::route_action::HashPolicy {
                    policy_specifier: Some(hp::PolicySpecifier::FilterState(hp::FilterState {
                        key: "io.grpc.channel_id".into(),
                    })),
                    terminal: false,
                },
            ],
            ..Default::default()
        })),
        typed_per_filter_config: per_route(sspb::stateful_session_per_route::Override::Disabled(
            true,
        )),
        ..Default::default()
    };
    let weighted_route = rpb::Route {
        r#match: prefix("/"),
        action: Some(weighted(&[("a", Some(1)), ("b", Some(3))])),
        typed_per_filter_config: per_route(
            sspb::stateful_session_per_route::Override::StatefulSession(session(Some(cookie(
                "s", None,
            )))),
        ),
        ..Default::default()
    };
    let Resource::RouteConfiguration(rc) = ok(
        ResourceKind::RouteConfiguration,
        &route_config(vec![header_route, weighted_route]),
    ) else {
        panic!()
    };
    let rc: &RouteConfigResource = &rc;
    let vh = rc.virtual_host_for("anything.example").unwrap();
    let r0 = &vh.routes[0];
    assert!(
        matches!(&r0.matcher.path, PathMatcher::Regex(p) if p.regex.is_match("/svc/abc") && !p.regex.is_match("/svc/abc/x"))
    );
    assert_eq!(r0.matcher.headers[0].name, "x-canary");
    assert_eq!(r0.matcher.headers[0].kind, HeaderMatch::Present(true));
    assert!(r0.matcher.headers[0].invert);
    let tether_xds::resource::route::Action::Route(a0) = &r0.action else {
        panic!()
    };
    assert_eq!(
        a0.hash_policies[0].source,
        HashSource::Header {
            name: "x-user".into(),
            rewrite: None
        }
    );
    assert!(a0.hash_policies[0].terminal);
    assert_eq!(
        a0.hash_policies[1].source,
        HashSource::FilterState("io.grpc.channel_id".into())
    );
    assert_eq!(
        r0.filter_overrides["ssa"],
        FilterOverride::Session(SessionOverride::Disabled)
    );
    let r1 = &vh.routes[1];
    let tether_xds::resource::route::Action::Route(a1) = &r1.action else {
        panic!()
    };
    let ClusterSpecifier::Weighted(w) = &a1.clusters else {
        panic!()
    };
    assert_eq!(
        w.iter()
            .map(|c| (c.name.as_str(), c.weight))
            .collect::<Vec<_>>(),
        [("a", 1), ("b", 3)]
    );
    let FilterOverride::Session(SessionOverride::Enabled(s)) = &r1.filter_overrides["ssa"] else {
        panic!()
    };
    assert_eq!(s.cookie.as_ref().unwrap().name(), "s");
}

#[test]
fn route_errors_name_the_field() {
    let zero = rpb::Route {
        r#match: prefix("/"),
        action: Some(weighted(&[("a", Some(0)), ("b", Some(0))])),
        ..Default::default()
    };
    assert_eq!(
        errors(ResourceKind::RouteConfiguration, &route_config(vec![zero])),
        ["virtual_hosts[0].routes[0].route.weighted_clusters: sum of cluster weights is zero"]
    );
    let missing = rpb::Route {
        r#match: prefix("/"),
        action: Some(weighted(&[("a", None)])),
        ..Default::default()
    };
    assert_eq!(
        errors(ResourceKind::RouteConfiguration, &route_config(vec![missing])),
        ["virtual_hosts[0].routes[0].route.weighted_clusters.clusters[0].weight: field not present", "virtual_hosts[0].routes[0].route.weighted_clusters: sum of cluster weights is zero"]
    );
    let bad_regex = rpb::Route {
        r#match: Some(rpb::RouteMatch {
            path_specifier: Some(rpb::route_match::PathSpecifier::SafeRegex(
                envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher {
                    regex: "(".into(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        action: Some(weighted(&[("a", Some(1))])),
        ..Default::default()
    };
    let e = errors(
        ResourceKind::RouteConfiguration,
        &route_config(vec![bad_regex]),
    );
    assert!(
        e[0].starts_with(
            "virtual_hosts[0].routes[0].match.safe_regex.regex: \"(\" is not a valid regex"
        ),
        "{e:?}"
    );
    let bad_override = rpb::Route {
        r#match: prefix("/"),
        action: Some(weighted(&[("a", Some(1))])),
        typed_per_filter_config: [("ssa".to_owned(), pack(&Router::default()))].into(),
        ..Default::default()
    };
    let e = errors(
        ResourceKind::RouteConfiguration,
        &route_config(vec![bad_override]),
    );
    assert_eq!(e, ["virtual_hosts[0].routes[0].typed_per_filter_config[\"ssa\"].type_url: \"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\" is an unsupported filter override type"]);
}

// ---------- clusters ----------

fn eds_cluster() -> cpb::Cluster {
    cpb::Cluster {
        name: "c".into(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
            cpb::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: "svc".into(),
        }),
        ..Default::default()
    }
}

fn cluster_ok(c: &cpb::Cluster) -> ClusterResource {
    let Resource::Cluster(c) = ok(ResourceKind::Cluster, &pack(c)) else {
        panic!()
    };
    (*c).clone()
}

/// gRFC A27: `lrs_server` must be `self` (the server the cluster came
/// from), as C-core requires; unset, the cluster reports nothing.
#[test]
fn cluster_lrs_server_must_be_self() {
    assert!(!cluster_ok(&eds_cluster()).lrs_server);
    let mut c = eds_cluster();
    c.lrs_server = Some(core::ConfigSource {
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Self_(
            core::SelfConfigSource::default(),
        )),
        ..Default::default()
    });
    assert!(cluster_ok(&c).lrs_server);
    c.lrs_server = Some(ads());
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&c)),
        ["lrs_server: ConfigSource is not self"]
    );
}

/// gRFC A85: `lrs_report_endpoint_metrics` says which ORCA fields the
/// load reports carry; unset carries none, `named_metrics.*` every named
/// metric, and names gRPC does not propagate are ignored, not refused.
#[test]
fn cluster_lrs_report_endpoint_metrics_is_parsed_leniently() {
    assert!(cluster_ok(&eds_cluster())
        .backend_metric_propagation
        .is_empty());
    let mut c = eds_cluster();
    c.lrs_report_endpoint_metrics = [
        "mem_utilization",
        "named_metrics.queue",
        "rps_fractional",
        "named_metrics.",
        "not_an_orca_field",
    ]
    .map(String::from)
    .to_vec();
    let p = cluster_ok(&c).backend_metric_propagation;
    assert!(p.mem_utilization, "{p:?}");
    assert!(!p.cpu_utilization && !p.application_utilization && !p.all_named_metrics);
    assert_eq!(p.named_metrics.iter().collect::<Vec<_>>(), ["queue"]);
    c.lrs_report_endpoint_metrics = vec!["named_metrics.*".into(), "cpu_utilization".into()];
    let p = cluster_ok(&c).backend_metric_propagation;
    assert!(p.all_named_metrics && p.cpu_utilization, "{p:?}");
    assert!(p.propagates_named("anything"));
}

#[test]
fn eds_cluster_defaults() {
    let c = cluster_ok(&eds_cluster());
    assert_eq!(
        c.discovery,
        Discovery::Eds {
            service_name: Some("svc".into())
        }
    );
    assert_eq!(c.eds_name(), Some("svc"));
    assert_eq!(c.lb_policy, LbPolicy::RoundRobin);
    assert_eq!(
        c.override_host_status.iter().collect::<Vec<_>>(),
        [HealthStatus::Unknown, HealthStatus::Healthy]
    );
    assert_eq!(c.idle_timeout, Duration::from_secs(3600));
}

#[test]
fn override_host_status_keeps_unknown_healthy_draining() {
    let mut c = eds_cluster();
    c.common_lb_config = Some(cpb::cluster::CommonLbConfig {
        override_host_status: Some(core::HealthStatusSet {
            statuses: vec![3, 5, 2, 1],
        }),
        ..Default::default()
    });
    let v = cluster_ok(&c);
    assert_eq!(
        v.override_host_status.iter().collect::<Vec<_>>(),
        [HealthStatus::Healthy, HealthStatus::Draining]
    );
    // Explicitly empty: no override is ever honoured.
    c.common_lb_config = Some(cpb::cluster::CommonLbConfig {
        override_host_status: Some(core::HealthStatusSet { statuses: vec![] }),
        ..Default::default()
    });
    assert_eq!(cluster_ok(&c).override_host_status.iter().count(), 0);
}

#[test]
fn idle_timeout_comes_from_upstream_config() {
    let mut c = eds_cluster();
    let opts = |d: pb::Duration| HttpProtocolOptions {
        common_http_protocol_options: Some(core::HttpProtocolOptions {
            idle_timeout: Some(d),
            ..Default::default()
        }),
        ..Default::default()
    };
    c.upstream_config = Some(core::TypedExtensionConfig {
        name: "u".into(),
        typed_config: Some(pack(&opts(pb::Duration {
            seconds: 90,
            nanos: 0,
        }))),
    });
    assert_eq!(cluster_ok(&c).idle_timeout, Duration::from_secs(90));
    c.upstream_config = Some(core::TypedExtensionConfig {
        name: "u".into(),
        typed_config: Some(pack(&opts(pb::Duration {
            seconds: -3,
            nanos: 0,
        }))),
    });
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&c)),
        ["upstream_config.typed_config.common_http_protocol_options.idle_timeout.seconds: -3 is outside [0, 315576000000]"]
    );
    c.upstream_config = Some(core::TypedExtensionConfig {
        name: "u".into(),
        typed_config: Some(pack(&Router::default())),
    });
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&c)),
        ["upstream_config.typed_config.type_url: \"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\" unsupported upstream config type"]
    );
}

/// A `ring_hash_lb_config` with these minimum and maximum ring sizes.
fn ring_hash(min: Option<u64>, max: Option<u64>) -> Option<cpb::cluster::LbConfig> {
    Some(cpb::cluster::LbConfig::RingHashLbConfig(
        cpb::cluster::RingHashLbConfig {
            minimum_ring_size: min.map(|value| pb::UInt64Value { value }),
            maximum_ring_size: max.map(|value| pb::UInt64Value { value }),
            ..Default::default()
        },
    ))
}

#[test]
fn ring_hash_sizes_and_other_cluster_errors() {
    let mut c = eds_cluster();
    c.lb_policy = cpb::cluster::LbPolicy::RingHash as i32;
    c.lb_config = ring_hash(Some(2048), Some(4096));
    assert_eq!(
        cluster_ok(&c).lb_policy,
        LbPolicy::RingHash {
            min_ring_size: 2048,
            max_ring_size: 4096
        }
    );
    c.lb_config = ring_hash(Some(9_000_000), None);
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&c)),
        ["ring_hash_lb_config.minimum_ring_size: 9000000 must be in the range of 1 to 8388608"]
    );
    c.lb_config = ring_hash(Some(100), Some(10));
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&c)),
        ["ring_hash_lb_config.minimum_ring_size: 100 is above maximum_ring_size 10"]
    );
    let mut m = eds_cluster();
    m.lb_policy = cpb::cluster::LbPolicy::Maglev as i32;
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&m)),
        ["lb_policy: 5 LB policy is not supported"]
    );
    let mut s = eds_cluster();
    s.cluster_discovery_type = Some(cpb::cluster::ClusterDiscoveryType::Type(
        cpb::cluster::DiscoveryType::Static as i32,
    ));
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&s)),
        ["type: 0 DiscoveryType is not valid"]
    );
    let mut e = eds_cluster();
    e.eds_cluster_config = Some(cpb::cluster::EdsClusterConfig {
        eds_config: None,
        service_name: String::new(),
    });
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&e)),
        ["eds_cluster_config.eds_config: field not present"]
    );
}

#[test]
fn aggregate_clusters() {
    use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
    let agg = |clusters: Vec<String>| cpb::Cluster {
        name: "agg".into(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::ClusterType(
            cpb::cluster::CustomClusterType {
                name: "envoy.clusters.aggregate".into(),
                typed_config: Some(pack(&ClusterConfig { clusters })),
            },
        )),
        ..Default::default()
    };
    assert_eq!(
        cluster_ok(&agg(vec!["a".into(), "b".into()])).discovery,
        Discovery::Aggregate {
            clusters: vec!["a".into(), "b".into()]
        }
    );
    assert_eq!(
        errors(ResourceKind::Cluster, &pack(&agg(vec![]))),
        ["cluster_type.typed_config.clusters: must be non-empty"]
    );
}

/// A cluster with this `outlier_detection`.
/// A cluster whose `load_balancing_policy` lists `policies` (typed
/// configs, in order).
fn with_policies(policies: Vec<Any>) -> cpb::Cluster {
    cpb::Cluster {
        load_balancing_policy: Some(cpb::LoadBalancingPolicy {
            policies: policies
                .into_iter()
                .map(|any| cpb::load_balancing_policy::Policy {
                    typed_extension_config: Some(core::TypedExtensionConfig {
                        name: "p".into(),
                        typed_config: Some(any),
                    }),
                })
                .collect(),
        }),
        ..eds_cluster()
    }
}

#[test]
fn weighted_round_robin_inside_wrr_locality() {
    use envoy_types::pb::envoy::extensions::load_balancing_policies::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin;
    use envoy_types::pb::envoy::extensions::load_balancing_policies::wrr_locality::v3::WrrLocality;
    use tether_xds::lb_config::weighted_round_robin::Settings;
    let wrr = |w: ClientSideWeightedRoundRobin| {
        with_policies(vec![pack(&WrrLocality {
            endpoint_picking_policy: Some(cpb::LoadBalancingPolicy {
                policies: with_policies(vec![pack(&w)])
                    .load_balancing_policy
                    .unwrap()
                    .policies,
            }),
        })])
    };
    let c = cluster_ok(&wrr(ClientSideWeightedRoundRobin::default()));
    assert_eq!(
        c.lb_policy,
        LbPolicy::WrrLocality(Box::new(LbPolicy::WeightedRoundRobin(Settings::default())))
    );
    let c = cluster_ok(&wrr(ClientSideWeightedRoundRobin {
        enable_oob_load_report: Some(pb::BoolValue { value: true }),
        oob_reporting_period: Some(pb::Duration {
            seconds: 0,
            nanos: 500_000_000,
        }),
        blackout_period: Some(pb::Duration::default()),
        weight_update_period: Some(pb::Duration {
            seconds: 0,
            nanos: 1_000_000,
        }),
        error_utilization_penalty: Some(pb::FloatValue { value: 0.5 }),
        ..Default::default()
    }));
    let LbPolicy::WrrLocality(inner) = c.lb_policy else {
        panic!("{:?}", c.lb_policy)
    };
    let LbPolicy::WeightedRoundRobin(s) = *inner else {
        panic!("{inner:?}")
    };
    assert!(s.enable_oob_load_report);
    assert_eq!(s.oob_reporting_period, Duration::from_millis(500));
    assert_eq!(s.blackout_period, Duration::ZERO);
    // Raised to the 100 ms floor.
    assert_eq!(s.weight_update_period, Duration::from_millis(100));
    assert_eq!(s.error_utilization_penalty, 0.5);
    let nack = errors(
        ResourceKind::Cluster,
        &pack(&wrr(ClientSideWeightedRoundRobin {
            error_utilization_penalty: Some(pb::FloatValue { value: -1.0 }),
            ..Default::default()
        })),
    );
    assert_eq!(nack.len(), 1, "{nack:?}");
    assert!(
        nack[0].contains("error_utilization_penalty") && nack[0].contains("-1"),
        "{nack:?}"
    );
}

fn with_outlier_detection(od: cpb::OutlierDetection) -> cpb::Cluster {
    cpb::Cluster {
        outlier_detection: Some(od),
        ..eds_cluster()
    }
}

#[test]
fn outlier_detection_defaults_and_algorithm_switches() {
    // No outlier_detection: none at all.
    assert_eq!(cluster_ok(&eds_cluster()).outlier_detection, None);
    // Present with no fields: A50's defaults, success rate on with its
    // defaults, failure percentage off.
    let od = cluster_ok(&with_outlier_detection(Default::default()))
        .outlier_detection
        .expect("outlier_detection present");
    assert_eq!(od, {
        let mut od_config = OutlierDetectionConfig::default();
        od_config.interval = Duration::from_secs(10);
        od_config.base_ejection_time = Duration::from_secs(30);
        od_config.max_ejection_time = Duration::from_secs(300);
        od_config.max_ejection_percent = 10;
        od_config.success_rate = Some({
            let mut success_rate = SuccessRateEjection::default();
            success_rate.stdev_factor = 1900;
            success_rate.enforcement_percentage = 100;
            success_rate.minimum_hosts = 5;
            success_rate.request_volume = 100;
            success_rate
        });
        od_config.failure_percentage = None;
        od_config
    });
    // enforcing_success_rate 0 turns success rate off; the rest stays.
    let od = cluster_ok(&with_outlier_detection(cpb::OutlierDetection {
        enforcing_success_rate: Some(pb::UInt32Value { value: 0 }),
        ..Default::default()
    }))
    .outlier_detection
    .unwrap();
    assert_eq!(od.success_rate, None);
    assert_eq!(od.failure_percentage, None);
    assert_eq!(od.interval, Duration::from_secs(10));
    // enforcing_failure_percentage set and not 0 turns failure percentage
    // on, with the defaults for its other fields.
    let od = cluster_ok(&with_outlier_detection(cpb::OutlierDetection {
        enforcing_failure_percentage: Some(pb::UInt32Value { value: 40 }),
        ..Default::default()
    }))
    .outlier_detection
    .unwrap();
    assert_eq!(
        od.failure_percentage,
        Some({
            let mut failure_percentage = FailurePercentageEjection::default();
            failure_percentage.threshold = 85;
            failure_percentage.enforcement_percentage = 40;
            failure_percentage.minimum_hosts = 5;
            failure_percentage.request_volume = 50;
            failure_percentage
        })
    );
    assert!(od.success_rate.is_some());
    // Set to 0 it stays off.
    let od = cluster_ok(&with_outlier_detection(cpb::OutlierDetection {
        enforcing_failure_percentage: Some(pb::UInt32Value { value: 0 }),
        ..Default::default()
    }))
    .outlier_detection
    .unwrap();
    assert_eq!(od.failure_percentage, None);
}

#[test]
fn outlier_detection_errors_name_the_field_and_value() {
    let nack = |od: cpb::OutlierDetection| {
        errors(ResourceKind::Cluster, &pack(&with_outlier_detection(od)))
    };
    assert_eq!(
        nack(cpb::OutlierDetection {
            max_ejection_percent: Some(pb::UInt32Value { value: 150 }),
            ..Default::default()
        }),
        ["outlier_detection.max_ejection_percent: 150 must be at most 100"]
    );
    // Checked even when its algorithm is off.
    assert_eq!(
        nack(cpb::OutlierDetection {
            failure_percentage_threshold: Some(pb::UInt32Value { value: 101 }),
            ..Default::default()
        }),
        ["outlier_detection.failure_percentage_threshold: 101 must be at most 100"]
    );
    assert_eq!(
        nack(cpb::OutlierDetection {
            enforcing_success_rate: Some(pb::UInt32Value { value: 200 }),
            enforcing_failure_percentage: Some(pb::UInt32Value { value: 101 }),
            ..Default::default()
        }),
        [
            "outlier_detection.enforcing_success_rate: 200 must be at most 100",
            "outlier_detection.enforcing_failure_percentage: 101 must be at most 100",
        ]
    );
    assert_eq!(
        nack(cpb::OutlierDetection {
            interval: Some(pb::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        }),
        ["outlier_detection.interval.seconds: -1 is outside [0, 315576000000]"]
    );
    assert_eq!(
        nack(cpb::OutlierDetection {
            base_ejection_time: Some(pb::Duration {
                seconds: 1,
                nanos: 1_000_000_000,
            }),
            max_ejection_time: Some(pb::Duration {
                seconds: 315_576_000_001,
                nanos: 0,
            }),
            ..Default::default()
        }),
        [
            "outlier_detection.base_ejection_time.nanos: 1000000000 is outside [0, 999999999]",
            "outlier_detection.max_ejection_time.seconds: 315576000001 is outside [0, 315576000000]",
        ]
    );
}

// ---------- endpoints ----------

fn lb_endpoint(
    addr: &str,
    port: u32,
    health: i32,
    weight: Option<u32>,
    extra: &[(&str, u32)],
) -> epb::LbEndpoint {
    let sa = |a: &str, p: u32| core::Address {
        address: Some(core::address::Address::SocketAddress(core::SocketAddress {
            address: a.into(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(p)),
            ..Default::default()
        })),
    };
    epb::LbEndpoint {
        health_status: health,
        load_balancing_weight: weight.map(|value| pb::UInt32Value { value }),
        host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(epb::Endpoint {
            address: Some(sa(addr, port)),
            additional_addresses: extra
                .iter()
                .map(|(a, p)| epb::endpoint::AdditionalAddress {
                    address: Some(sa(a, *p)),
                })
                .collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn locality(
    zone: &str,
    priority: u32,
    weight: Option<u32>,
    eps: Vec<epb::LbEndpoint>,
) -> epb::LocalityLbEndpoints {
    epb::LocalityLbEndpoints {
        locality: Some(core::Locality {
            region: "r".into(),
            zone: zone.into(),
            sub_zone: String::new(),
        }),
        lb_endpoints: eps,
        load_balancing_weight: weight.map(|value| pb::UInt32Value { value }),
        priority,
        ..Default::default()
    }
}

fn cla(localities: Vec<epb::LocalityLbEndpoints>) -> Any {
    pack(&epb::ClusterLoadAssignment {
        cluster_name: "svc".into(),
        endpoints: localities,
        ..Default::default()
    })
}

/// What is wrong with a `ClusterLoadAssignment` of `localities`.
fn cla_errors(localities: Vec<epb::LocalityLbEndpoints>) -> Vec<String> {
    errors(ResourceKind::Endpoints, &cla(localities))
}

#[test]
fn a_weighted_locality_without_its_locality_is_an_error_as_in_c_core() {
    let mut l = locality("a", 0, Some(1), vec![]);
    l.locality = None;
    assert_eq!(
        cla_errors(vec![l.clone()]),
        ["endpoints[0].locality: field not present"]
    );
    // Without a weight the entry is ignored before its locality is read.
    l.load_balancing_weight = None;
    assert!(decode(ResourceKind::Endpoints, &cla(vec![l]))
        .result
        .is_ok());
}

#[test]
fn endpoints_priorities_localities_health_and_addresses() {
    let any = cla(vec![
        locality(
            "a",
            0,
            Some(2),
            vec![
                lb_endpoint("10.0.0.1", 80, 1, Some(3), &[("::1", 80)]),
                lb_endpoint("10.0.0.2", 80, 3, None, &[]), // DRAINING: kept
                lb_endpoint("10.0.0.3", 80, 2, None, &[]), // UNHEALTHY: dropped
                lb_endpoint("10.0.0.4", 80, 5, None, &[]), // DEGRADED: dropped
            ],
        ),
        locality(
            "b",
            1,
            Some(1),
            vec![lb_endpoint("10.0.1.1", 80, 0, None, &[])],
        ),
        locality(
            "no-weight",
            0,
            None,
            vec![lb_endpoint("10.0.9.9", 80, 1, None, &[])],
        ),
    ]);
    let Resource::Endpoints(e) = ok(ResourceKind::Endpoints, &any) else {
        panic!()
    };
    let e: &EndpointsResource = &e;
    assert_eq!(e.priorities.len(), 2);
    assert_eq!(
        e.priorities[0].localities.len(),
        1,
        "a locality without weight is ignored"
    );
    let l = &e.priorities[0].localities[0];
    assert_eq!((l.locality.zone.as_str(), l.weight), ("a", 2));
    let eps: Vec<_> = l
        .endpoints
        .iter()
        .map(|e| {
            (
                e.addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
                e.health,
                e.weight,
            )
        })
        .collect();
    assert_eq!(
        eps,
        [
            (
                vec!["10.0.0.1:80".to_owned(), "[::1]:80".to_owned()],
                HealthStatus::Healthy,
                3
            ),
            (vec!["10.0.0.2:80".to_owned()], HealthStatus::Draining, 1),
        ]
    );
    assert_eq!(
        e.priorities[1].localities[0].endpoints[0].health,
        HealthStatus::Unknown
    );
}

#[test]
fn endpoint_errors_name_the_field() {
    assert_eq!(
        cla_errors(vec![locality(
            "a",
            1,
            Some(1),
            vec![lb_endpoint("10.0.0.1", 80, 1, None, &[])]
        )]),
        ["endpoints: [1] sparse priority list"]
    );
    assert_eq!(
        cla_errors(vec![locality(
            "a",
            0,
            Some(1),
            vec![lb_endpoint("10.0.0.1", 80, 1, Some(0), &[])]
        )]),
        ["endpoints[0].lb_endpoints[0].load_balancing_weight: 0 must be greater than 0"]
    );
    assert_eq!(
        cla_errors(vec![locality("a", 0, Some(1), vec![lb_endpoint("host.example", 80, 1, None, &[])])]),
        ["endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address: \"host.example\" is not an IP address"]
    );
    assert_eq!(
        cla_errors(vec![locality("a", 0, Some(1), vec![lb_endpoint("10.0.0.1", 80, 1, None, &[]), lb_endpoint("10.0.0.1", 80, 1, None, &[])])]),
        ["endpoints[0].lb_endpoints[1].endpoint: \"10.0.0.1:80\" is a duplicate endpoint address"]
    );
    assert_eq!(
        cla_errors(vec![locality("a", 0, Some(1), vec![]), locality("a", 0, Some(2), vec![])]),
        ["endpoints[1].locality: duplicate locality {region=\"r\", zone=\"a\", sub_zone=\"\"} in priority 0"]
    );
}

#[test]
fn wrong_type_and_undecodable_resources_are_errors() {
    let e = errors(
        ResourceKind::Cluster,
        &pack(&eds_cluster())
            .clone_with_type("type.googleapis.com/envoy.config.listener.v3.Listener"),
    );
    assert!(e[0].starts_with("type_url: "), "{e:?}");
    let garbage = Any {
        type_url: ResourceKind::Cluster.type_url().into(),
        value: vec![0xff, 0xff, 0xff],
    };
    let e = errors(ResourceKind::Cluster, &garbage);
    assert!(e[0].starts_with("(resource): cannot be decoded"), "{e:?}");
}

trait WithType {
    fn clone_with_type(&self, t: &str) -> Any;
}

impl WithType for Any {
    fn clone_with_type(&self, t: &str) -> Any {
        Any {
            type_url: t.into(),
            value: self.value.clone(),
        }
    }
}

/// A path or header regex that would close the anchoring group
/// (`x)|(.*`) is refused by field, as RE2 refuses it, instead of matching
/// every path or header value.
#[test]
fn route_regexes_cannot_escape_their_anchors() {
    use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
    let regex = |r: &str| mpb::RegexMatcher {
        regex: r.into(),
        ..Default::default()
    };
    let by_path = rpb::Route {
        r#match: Some(rpb::RouteMatch {
            path_specifier: Some(rpb::route_match::PathSpecifier::SafeRegex(regex(
                "/svc/x)|(.*",
            ))),
            ..Default::default()
        }),
        action: Some(weighted(&[("a", Some(1))])),
        ..Default::default()
    };
    let e = errors(
        ResourceKind::RouteConfiguration,
        &route_config(vec![by_path]),
    );
    assert!(
        e[0].starts_with(
            "virtual_hosts[0].routes[0].match.safe_regex.regex: \"/svc/x)|(.*\" is not a valid regex"
        ),
        "{e:?}"
    );
    let by_header = rpb::Route {
        r#match: Some(rpb::RouteMatch {
            path_specifier: Some(rpb::route_match::PathSpecifier::Prefix("/".into())),
            headers: vec![rpb::HeaderMatcher {
                name: "x-user".into(),
                header_match_specifier: Some(
                    rpb::header_matcher::HeaderMatchSpecifier::StringMatch(mpb::StringMatcher {
                        match_pattern: Some(mpb::string_matcher::MatchPattern::SafeRegex(regex(
                            "admin)|(.*",
                        ))),
                        ignore_case: false,
                    }),
                ),
                ..Default::default()
            }],
            ..Default::default()
        }),
        action: Some(weighted(&[("a", Some(1))])),
        ..Default::default()
    };
    let e = errors(
        ResourceKind::RouteConfiguration,
        &route_config(vec![by_header]),
    );
    assert!(
        e[0].starts_with(
            "virtual_hosts[0].routes[0].match.headers[0].string_match.safe_regex.regex: \
             \"admin)|(.*\" is not a valid regex"
        ),
        "{e:?}"
    );
}
