//! Shared by the channel's xDS tests: resources built from short
//! descriptions, served by the ADS fixture, and a channel reading them.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateConfig;
use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
use envoy_types::pb::envoy::r#type::v3 as tpb;
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use tether::xds::resource::pack;
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest};

use crate::xds_support::{make, Fixture};

pub const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub use crate::xds_support::{CDS, LDS};

pub const NODE: &str = "channel-test";
pub const TARGET: &str = "shop.example";

/// One locality of a ClusterLoadAssignment.
pub struct Loc {
    pub priority: u32,
    pub zone: &'static str,
    pub weight: u32,
    pub endpoints: Vec<(SocketAddr, core::HealthStatus)>,
    /// Endpoint weights in order (unset when empty).
    pub endpoint_weights: Vec<u32>,
}

impl Loc {
    /// Priority 0, zone `z`, weight 1, healthy endpoints.
    pub fn of(addrs: &[SocketAddr]) -> Loc {
        Loc {
            priority: 0,
            zone: "z",
            weight: 1,
            endpoints: addrs
                .iter()
                .map(|a| (*a, core::HealthStatus::Healthy))
                .collect(),
            endpoint_weights: Vec::new(),
        }
    }

    /// The endpoints' weights, in order.
    pub fn weights(mut self, weights: &[u32]) -> Loc {
        self.endpoint_weights = weights.to_vec();
        self
    }

    pub fn priority(mut self, p: u32) -> Loc {
        self.priority = p;
        self
    }

    pub fn zone(mut self, zone: &'static str, weight: u32) -> Loc {
        self.zone = zone;
        self.weight = weight;
        self
    }
}

fn address(a: SocketAddr) -> core::Address {
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

/// A ClusterLoadAssignment for `cluster` with drop categories (per million).
pub fn eds(cluster: &str, localities: Vec<Loc>, drops: &[(&str, u32)]) -> Any {
    pack(&epb::ClusterLoadAssignment {
        cluster_name: cluster.to_owned(),
        endpoints: localities
            .into_iter()
            .map(|l| epb::LocalityLbEndpoints {
                locality: Some(core::Locality {
                    region: "r".into(),
                    zone: l.zone.into(),
                    sub_zone: String::new(),
                }),
                load_balancing_weight: Some(UInt32Value { value: l.weight }),
                priority: l.priority,
                lb_endpoints: l
                    .endpoints
                    .into_iter()
                    .enumerate()
                    .map(|(i, (a, h))| epb::LbEndpoint {
                        host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(
                            epb::Endpoint {
                                address: Some(address(a)),
                                ..Default::default()
                            },
                        )),
                        health_status: h as i32,
                        load_balancing_weight: l
                            .endpoint_weights
                            .get(i)
                            .map(|w| UInt32Value { value: *w }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        policy: (!drops.is_empty()).then(|| epb::cluster_load_assignment::Policy {
            drop_overloads: drops
                .iter()
                .map(
                    |(c, n)| epb::cluster_load_assignment::policy::DropOverload {
                        category: (*c).to_owned(),
                        drop_percentage: Some(tpb::FractionalPercent {
                            numerator: *n,
                            denominator: tpb::fractional_percent::DenominatorType::Million as i32,
                        }),
                    },
                )
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// A round-robin EDS cluster.
pub fn cluster(name: &str) -> Any {
    pack(&make::cluster(name))
}

/// An EDS cluster with circuit breaking at `max_requests`.
pub fn cluster_max_requests(name: &str, max_requests: u32) -> Any {
    let mut c = make::cluster(name);
    c.circuit_breakers = Some(cpb::CircuitBreakers {
        thresholds: vec![cpb::circuit_breakers::Thresholds {
            priority: core::RoutingPriority::Default as i32,
            max_requests: Some(UInt32Value {
                value: max_requests,
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    pack(&c)
}

/// An aggregate cluster over `children`, in priority order.
pub fn aggregate(name: &str, children: &[&str]) -> Any {
    pack(&cpb::Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::ClusterType(
            cpb::cluster::CustomClusterType {
                name: "envoy.clusters.aggregate".into(),
                typed_config: Some(pack(&AggregateConfig {
                    clusters: children.iter().map(|c| (*c).to_owned()).collect(),
                })),
            },
        )),
        ..Default::default()
    })
}

/// A route on path prefix `prefix` to `cluster`.
pub fn route(prefix: &str, cluster: &str) -> rpb::Route {
    route_action(
        prefix,
        rpb::route_action::ClusterSpecifier::Cluster(cluster.to_owned()),
    )
}

/// A route on path prefix `prefix` to weighted clusters.
pub fn route_weighted(prefix: &str, clusters: &[(&str, u32)]) -> rpb::Route {
    route_action(
        prefix,
        rpb::route_action::ClusterSpecifier::WeightedClusters(rpb::WeightedCluster {
            clusters: clusters
                .iter()
                .map(|(n, w)| rpb::weighted_cluster::ClusterWeight {
                    name: (*n).to_owned(),
                    weight: Some(UInt32Value { value: *w }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
    )
}

fn route_action(prefix: &str, clusters: rpb::route_action::ClusterSpecifier) -> rpb::Route {
    rpb::Route {
        r#match: Some(rpb::RouteMatch {
            path_specifier: Some(rpb::route_match::PathSpecifier::Prefix(prefix.to_owned())),
            ..Default::default()
        }),
        action: Some(rpb::route::Action::Route(rpb::RouteAction {
            cluster_specifier: Some(clusters),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// `route` only for calls whose header `name` is exactly `value`.
pub fn with_header(mut route: rpb::Route, name: &str, value: &str) -> rpb::Route {
    if let Some(m) = route.r#match.as_mut() {
        m.headers.push(rpb::HeaderMatcher {
            name: name.to_owned(),
            header_match_specifier: Some(rpb::header_matcher::HeaderMatchSpecifier::StringMatch(
                mpb::StringMatcher {
                    match_pattern: Some(mpb::string_matcher::MatchPattern::Exact(value.to_owned())),
                    ..Default::default()
                },
            )),
            ..Default::default()
        });
    }
    route
}

/// A route configuration `routes` with one virtual host for every domain.
pub fn route_config(routes: Vec<rpb::Route>) -> Any {
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

/// Puts every type's resources in the fixture and pushes them.
pub fn serve(f: &Fixture, routes: Vec<rpb::Route>, clusters: Vec<Any>, endpoints: Vec<Any>) {
    f.set_resources(LDS, vec![make::listener(TARGET, "routes")]);
    f.set_resources(RDS, vec![route_config(routes)]);
    f.set_resources(CDS, clusters);
    f.set_resources(EDS, endpoints);
    for t in [LDS, RDS, CDS, EDS] {
        f.push(t);
    }
}

/// One route to round-robin cluster `c` over `addrs`, in one locality.
pub fn serve_one(f: &Fixture, addrs: &[SocketAddr]) {
    serve(
        f,
        vec![route("/", "c")],
        vec![cluster("c")],
        vec![eds("c", vec![Loc::of(addrs)], &[])],
    );
}

/// A channel for `xds:///shop.example` through the fixture.
pub fn channel(f: &Fixture) -> Channel {
    Channel::builder()
        .bootstrap(crate::xds_support::bootstrap(f.addr, NODE))
        .connect(&format!("xds:///{TARGET}"))
        .unwrap()
}

/// One Echo call with `metadata`; the backend that answered.
pub async fn echo_with(
    channel: &Channel,
    message: &str,
    metadata: &[(&'static str, &str)],
) -> Result<String, tonic::Status> {
    let mut client = EchoClient::new(channel.clone());
    let mut request = tonic::Request::new(EchoRequest {
        message: message.into(),
    });
    for (k, v) in metadata {
        request.metadata_mut().insert(*k, v.parse().unwrap());
    }
    request.set_timeout(Duration::from_secs(20));
    Ok(client.echo(request).await?.into_inner().backend)
}

/// One Echo call; the backend that answered.
pub async fn echo(channel: &Channel) -> Result<String, tonic::Status> {
    echo_with(channel, "x", &[]).await
}

/// Calls until `want` answers (bounded: 10 s).
pub async fn until_backend(channel: &Channel, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if echo(channel).await.is_ok_and(|b| b == want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{want} never answered");
}

/// How many of `n` calls each backend answered (errors under their code).
pub async fn spread(channel: &Channel, n: usize) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n {
        let key = match echo(channel).await {
            Ok(b) => b,
            Err(s) => format!("{:?}: {}", s.code(), s.message()),
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

/// `route` with `max_stream_duration` set.
pub fn with_max_stream_duration(mut route: rpb::Route, d: Duration) -> rpb::Route {
    if let Some(rpb::route::Action::Route(a)) = route.action.as_mut() {
        a.max_stream_duration = Some(rpb::route_action::MaxStreamDuration {
            max_stream_duration: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            }),
            ..Default::default()
        });
    }
    route
}

/// A route on path prefix `prefix` that redirects (a non-forwarding action).
pub fn redirect(prefix: &str) -> rpb::Route {
    rpb::Route {
        r#match: Some(rpb::RouteMatch {
            path_specifier: Some(rpb::route_match::PathSpecifier::Prefix(prefix.to_owned())),
            ..Default::default()
        }),
        action: Some(rpb::route::Action::Redirect(rpb::RedirectAction::default())),
        ..Default::default()
    }
}

/// An API listener reading routes `route` over RDS, with gRPC's stateful
/// session filter (cookie `name`, path `/`, `ttl_secs`) before the router.
pub fn session_listener(name: &str, route: &str, cookie: &str, ttl_secs: i64) -> Any {
    use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::StatefulSession;
    use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
    use envoy_types::pb::envoy::r#type::http::v3::Cookie;
    let session = StatefulSession {
        session_state: Some(core::TypedExtensionConfig {
            name: "envoy.http.stateful_session.cookie".into(),
            typed_config: Some(pack(&CookieBasedSessionState {
                cookie: Some(Cookie {
                    name: cookie.to_owned(),
                    path: "/".into(),
                    ttl: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: ttl_secs,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
            })),
        }),
        ..Default::default()
    };
    make::listener_with(name, route, vec![("session", pack(&session))])
}

/// A round-robin EDS cluster whose sessions may stay on `statuses`.
pub fn cluster_override_status(name: &str, statuses: &[core::HealthStatus]) -> Any {
    let mut c = make::cluster(name);
    c.common_lb_config = Some(cpb::cluster::CommonLbConfig {
        override_host_status: Some(core::HealthStatusSet {
            statuses: statuses.iter().map(|s| *s as i32).collect(),
        }),
        ..Default::default()
    });
    pack(&c)
}

/// One Echo call with an optional `cookie`: the backend and the response's
/// Set-Cookie values.
pub async fn echo_cookie(
    channel: &Channel,
    cookie: Option<&str>,
) -> Result<(String, Vec<String>), tonic::Status> {
    echo_cookie_routed(channel, cookie, None).await
}

/// [`echo_cookie`] with an optional `x-route` header (for routes matching
/// on it).
pub async fn echo_cookie_routed(
    channel: &Channel,
    cookie: Option<&str>,
    x_route: Option<&str>,
) -> Result<(String, Vec<String>), tonic::Status> {
    let mut client = EchoClient::new(channel.clone());
    let mut request = tonic::Request::new(EchoRequest {
        message: "x".into(),
    });
    if let Some(c) = cookie {
        request.metadata_mut().insert("cookie", c.parse().unwrap());
    }
    if let Some(r) = x_route {
        request.metadata_mut().insert("x-route", r.parse().unwrap());
    }
    request.set_timeout(Duration::from_secs(20));
    let response = client.echo(request).await?;
    let set_cookie = response
        .metadata()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    Ok((response.into_inner().backend, set_cookie))
}

/// The `name=value` part of a Set-Cookie.
pub fn pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_owned()
}

/// `route` with the stateful session filter `filter` disabled on it
/// (`StatefulSessionPerRoute { disabled: true }`).
pub fn session_disabled(mut route: rpb::Route, filter: &str) -> rpb::Route {
    use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::{
        stateful_session_per_route::Override, StatefulSessionPerRoute,
    };
    route.typed_per_filter_config.insert(
        filter.to_owned(),
        pack(&StatefulSessionPerRoute {
            r#override: Some(Override::Disabled(true)),
        }),
    );
    route
}

/// A ClusterLoadAssignment of one locality whose endpoints have several
/// addresses each (gRFC A61: the first is the primary, the rest
/// `additional_addresses`).
pub fn eds_multi(cluster: &str, endpoints: &[&[SocketAddr]]) -> Any {
    pack(&epb::ClusterLoadAssignment {
        cluster_name: cluster.to_owned(),
        endpoints: vec![epb::LocalityLbEndpoints {
            locality: Some(core::Locality {
                region: "r".into(),
                zone: "z".into(),
                sub_zone: String::new(),
            }),
            load_balancing_weight: Some(UInt32Value { value: 1 }),
            lb_endpoints: endpoints
                .iter()
                .map(|addrs| epb::LbEndpoint {
                    host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(
                        epb::Endpoint {
                            address: Some(address(addrs[0])),
                            additional_addresses: addrs[1..]
                                .iter()
                                .map(|a| epb::endpoint::AdditionalAddress {
                                    address: Some(address(*a)),
                                })
                                .collect(),
                            ..Default::default()
                        },
                    )),
                    health_status: core::HealthStatus::Healthy as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    })
}
