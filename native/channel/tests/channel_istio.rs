//! The resources istiod's proxyless generator (`pilot/pkg/networking/grpcgen`)
//! sends, written here as it builds them, served over a Unix socket (as
//! Istio's agent serves its pod) to the channel and over TCP to gRPC C-core
//! (grpcio), with a bootstrap carrying Istio's node metadata: a listener per
//! `host:port` with the fault filter (an empty `HTTPFault`, not optional)
//! before the router; RDS named after the cluster, every route with Istio's
//! default retry policy (`connect-failure,refused-stream,unavailable,
//! cancelled,retriable-status-codes`, 2 retries, the previous-hosts
//! predicate), `timeout: 0s` and `max_stream_duration` 0s; a route a
//! VirtualService gives a fault; EDS clusters named `outbound|PORT|SUBSET|HOST`
//! with round robin, least request with circuit breakers, and a ring hash
//! subset. Both clients must work against it and agree.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;

use std::collections::BTreeMap;
use std::time::Duration;

use control_support::TempDir;
use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::config::listener::v3 as lpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3 as fpb;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
use envoy_types::pb::google::protobuf as pb;
use tether::Channel;
use tether_control::{ControlPlane, Translated};
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio;
use tether_xds::resource::{pack, ResourceKind};

const HOST: &str = "echo.default.svc.cluster.local";
const PORT: u16 = 8080;

fn cluster_name(subset: &str) -> String {
    format!("outbound|{PORT}|{subset}|{HOST}")
}

fn ads() -> core::ConfigSource {
    core::ConfigSource {
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

fn seconds(s: i64) -> pb::Duration {
    pb::Duration {
        seconds: s,
        nanos: 0,
    }
}

/// grpcgen's outbound listener: `host:port`, the fault filter, the router.
fn listener() -> pb::Any {
    let manager = hcm::HttpConnectionManager {
        http_filters: vec![
            hcm::HttpFilter {
                name: "envoy.filters.http.fault".into(),
                config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack(
                    &fpb::HttpFault::default(),
                ))),
                ..Default::default()
            },
            hcm::HttpFilter {
                name: "envoy.filters.http.router".into(),
                config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack(
                    &Router::default(),
                ))),
                ..Default::default()
            },
        ],
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
            hcm::Rds {
                config_source: Some(ads()),
                route_config_name: cluster_name(""),
            },
        )),
        ..Default::default()
    };
    pack(&lpb::Listener {
        name: format!("{HOST}:{PORT}"),
        address: Some(core::Address {
            address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                address: "10.96.0.10".into(),
                port_specifier: Some(core::socket_address::PortSpecifier::PortValue(PORT.into())),
                ..Default::default()
            })),
        }),
        api_listener: Some(lpb::ApiListener {
            api_listener: Some(pack(&manager)),
        }),
        ..Default::default()
    })
}

/// Istio's default retry policy for HTTP routes.
fn istio_retries() -> rpb::RetryPolicy {
    use rpb::retry_policy::retry_host_predicate::ConfigType;
    rpb::RetryPolicy {
        retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
            .into(),
        num_retries: Some(pb::UInt32Value { value: 2 }),
        retry_host_predicate: vec![rpb::retry_policy::RetryHostPredicate {
            name: "envoy.retry_host_predicates.previous_hosts".into(),
            config_type: Some(ConfigType::TypedConfig(pack(
                &PreviousHostsPredicate::default(),
            ))),
        }],
        host_selection_retry_max_attempts: 5,
        ..Default::default()
    }
}

/// A route as the sidecar generator builds it, to `cluster`.
fn route(name: &str, m: rpb::RouteMatch, cluster: &str, hash_header: Option<&str>) -> rpb::Route {
    rpb::Route {
        name: name.into(),
        r#match: Some(m),
        action: Some(rpb::route::Action::Route(rpb::RouteAction {
            cluster_specifier: Some(rpb::route_action::ClusterSpecifier::Cluster(cluster.into())),
            timeout: Some(seconds(0)),
            retry_policy: Some(istio_retries()),
            max_stream_duration: Some(rpb::route_action::MaxStreamDuration {
                max_stream_duration: Some(seconds(0)),
                grpc_timeout_header_max: Some(seconds(0)),
                ..Default::default()
            }),
            hash_policy: hash_header
                .map(|h| rpb::route_action::HashPolicy {
                    policy_specifier: Some(
                        rpb::route_action::hash_policy::PolicySpecifier::Header(
                            rpb::route_action::hash_policy::Header {
                                header_name: h.into(),
                                regex_rewrite: None,
                            },
                        ),
                    ),
                    terminal: false,
                })
                .into_iter()
                .collect(),
            ..Default::default()
        })),
        decorator: Some(rpb::Decorator {
            operation: format!("{HOST}:{PORT}/*"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn header_match(name: &str, value: &str) -> rpb::RouteMatch {
    use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
    rpb::RouteMatch {
        path_specifier: Some(rpb::route_match::PathSpecifier::Prefix("/".into())),
        headers: vec![rpb::HeaderMatcher {
            name: name.into(),
            header_match_specifier: Some(rpb::header_matcher::HeaderMatchSpecifier::StringMatch(
                mpb::StringMatcher {
                    match_pattern: Some(mpb::string_matcher::MatchPattern::Exact(value.into())),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn route_configuration() -> pb::Any {
    let prefix = rpb::RouteMatch {
        path_specifier: Some(rpb::route_match::PathSpecifier::Prefix("/".into())),
        ..Default::default()
    };
    // A VirtualService's fault on one route: abort 100 % with UNAVAILABLE.
    let mut faulty = route(
        "fault",
        header_match("x-route", "fault"),
        &cluster_name(""),
        None,
    );
    faulty.typed_per_filter_config.insert(
        "envoy.filters.http.fault".into(),
        pack(&fpb::HttpFault {
            abort: Some(fpb::FaultAbort {
                error_type: Some(fpb::fault_abort::ErrorType::GrpcStatus(14)),
                percentage: Some(FractionalPercent {
                    numerator: 1_000_000,
                    denominator: 2,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    );
    pack(&rpb::RouteConfiguration {
        name: cluster_name(""),
        virtual_hosts: vec![rpb::VirtualHost {
            name: format!("{HOST}:{PORT}"),
            domains: vec![
                HOST.into(),
                format!("{HOST}:{PORT}"),
                "echo".into(),
                format!("echo:{PORT}"),
                "echo.default.svc".into(),
                "10.96.0.10".into(),
                format!("10.96.0.10:{PORT}"),
            ],
            routes: vec![
                faulty,
                route(
                    "least-request",
                    header_match("x-route", "lr"),
                    &cluster_name("lr"),
                    None,
                ),
                route(
                    "ring",
                    header_match("x-route", "ring"),
                    &cluster_name("ring"),
                    Some("x-user"),
                ),
                route("default", prefix, &cluster_name(""), None),
            ],
            include_request_attempt_count: true,
            ..Default::default()
        }],
        validate_clusters: Some(pb::BoolValue { value: false }),
        ..Default::default()
    })
}

fn eds_cluster(name: &str) -> cpb::Cluster {
    cpb::Cluster {
        name: name.into(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
            cpb::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
            service_name: name.into(),
            eds_config: Some(ads()),
        }),
        ..Default::default()
    }
}

fn clusters() -> Vec<pb::Any> {
    let plain = eds_cluster(&cluster_name(""));
    // Least request as a typed policy list with round robin after it: C-core
    // (which has no least_request and NACKs the legacy LEAST_REQUEST enum)
    // skips to round robin; the channel runs least request.
    let mut lr = eds_cluster(&cluster_name("lr"));
    let policy = |name: &str, config: pb::Any| cpb::load_balancing_policy::Policy {
        typed_extension_config: Some(core::TypedExtensionConfig {
            name: name.into(),
            typed_config: Some(config),
        }),
    };
    lr.load_balancing_policy = Some(cpb::LoadBalancingPolicy {
        policies: vec![
            policy(
                "envoy.load_balancing_policies.least_request",
                pack(&envoy_types::pb::envoy::extensions::load_balancing_policies::least_request::v3::LeastRequest::default()),
            ),
            policy(
                "envoy.load_balancing_policies.round_robin",
                pack(&envoy_types::pb::envoy::extensions::load_balancing_policies::round_robin::v3::RoundRobin::default()),
            ),
        ],
    });
    lr.circuit_breakers = Some(cpb::CircuitBreakers {
        thresholds: vec![cpb::circuit_breakers::Thresholds {
            max_requests: Some(pb::UInt32Value { value: 100 }),
            ..Default::default()
        }],
        ..Default::default()
    });
    let mut ring = eds_cluster(&cluster_name("ring"));
    ring.lb_policy = cpb::cluster::LbPolicy::RingHash as i32;
    ring.lb_config = Some(cpb::cluster::LbConfig::RingHashLbConfig(
        cpb::cluster::RingHashLbConfig {
            minimum_ring_size: Some(pb::UInt64Value { value: 1024 }),
            ..Default::default()
        },
    ));
    vec![pack(&plain), pack(&lr), pack(&ring)]
}

fn endpoints(name: &str, backends: &[&GrpcBackend]) -> pb::Any {
    let lb_endpoints = backends
        .iter()
        .map(|b| epb::LbEndpoint {
            host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(epb::Endpoint {
                address: Some(core::Address {
                    address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                        address: b.addr().ip().to_string(),
                        port_specifier: Some(core::socket_address::PortSpecifier::PortValue(
                            b.addr().port().into(),
                        )),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            health_status: core::HealthStatus::Healthy as i32,
            load_balancing_weight: Some(pb::UInt32Value { value: 1 }),
            ..Default::default()
        })
        .collect();
    pack(&epb::ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints: vec![epb::LocalityLbEndpoints {
            locality: Some(core::Locality {
                region: "us-central1".into(),
                zone: "us-central1-a".into(),
                sub_zone: String::new(),
            }),
            lb_endpoints,
            load_balancing_weight: Some(pb::UInt32Value { value: 2 }),
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// Istio's bootstrap for a proxyless pod, `server_uri` its agent's socket
/// (the channel) or a TCP address (C-core).
fn bootstrap(server_uri: &str) -> String {
    serde_json::json!({
        "xds_servers": [{
            "server_uri": server_uri,
            "channel_creds": [{ "type": "insecure" }],
            "server_features": ["xds_v3"],
        }],
        "node": {
            "id": "sidecar~10.244.0.7~echo-client-7d9c.default~default.svc.cluster.local",
            "metadata": {
                "GENERATOR": "grpc",
                "INSTANCE_IPS": "10.244.0.7",
                "ISTIO_VERSION": "1.24.0",
                "NAMESPACE": "default",
                "LABELS": { "app": "echo-client" },
            },
            "locality": { "region": "us-central1", "zone": "us-central1-a" },
        },
        "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s",
    })
    .to_string()
}

async fn echo(channel: &Channel, route: Option<&str>, user: &str) -> Result<String, tonic::Status> {
    let mut r = tonic::Request::new(EchoRequest {
        message: "hi".into(),
    });
    r.set_timeout(Duration::from_secs(10));
    if let Some(route) = route {
        r.metadata_mut().insert("x-route", route.parse().unwrap());
    }
    r.metadata_mut().insert("x-user", user.parse().unwrap());
    Ok(EchoClient::new(channel.clone())
        .echo(r)
        .await?
        .into_inner()
        .backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiods_proxyless_resources_work_for_the_channel_and_c_core() {
    let Ok(python) = grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let mut resources: BTreeMap<ResourceKind, BTreeMap<String, pb::Any>> = BTreeMap::new();
    let mut put = |kind, name: String, any| {
        resources.entry(kind).or_default().insert(name, any);
    };
    put(ResourceKind::Listener, format!("{HOST}:{PORT}"), listener());
    put(
        ResourceKind::RouteConfiguration,
        cluster_name(""),
        route_configuration(),
    );
    for (c, name) in clusters().into_iter().zip(["", "lr", "ring"]) {
        put(ResourceKind::Cluster, cluster_name(name), c);
        put(
            ResourceKind::Endpoints,
            cluster_name(name),
            endpoints(&cluster_name(name), &[&a, &b]),
        );
    }
    let plane = ControlPlane::new(Translated {
        envoy: resources.clone(),
        proxyless: resources,
        ..Translated::default()
    });
    // The agent's Unix socket for the channel, TCP for C-core (which sends
    // a socket path as :authority that HTTP/2 servers refuse).
    let dir = TempDir::new("istio");
    let socket = dir.0.join("XDS");
    let uds = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(plane.service())
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(uds)),
    );
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp_addr = tcp.local_addr().unwrap();
    {
        let plane = plane.clone();
        tokio::spawn(async move { plane.serve(tcp, std::future::pending()).await });
    }
    let ours = dir.bootstrap(&bootstrap(&format!("unix://{}", socket.display())));
    let theirs = dir.0.join("bootstrap-ccore.json");
    std::fs::write(&theirs, bootstrap(&tcp_addr.to_string())).unwrap();

    let target = format!("xds:///{HOST}:{PORT}");
    let channel = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&ours).unwrap())
        .connect(&target)
        .unwrap();
    // Round robin over both, through Istio's zero timeouts and retries.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        seen.insert(echo(&channel, None, "u").await.unwrap());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["a", "b"]);
    // The VirtualService's fault.
    let status = echo(&channel, Some("fault"), "u").await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Unavailable, "Fault injected")
    );
    // Least request with circuit breakers, and ring hash: a user sticks.
    assert!(echo(&channel, Some("lr"), "u").await.is_ok());
    let first = echo(&channel, Some("ring"), "alice").await.unwrap();
    for _ in 0..5 {
        assert_eq!(echo(&channel, Some("ring"), "alice").await.unwrap(), first);
    }
    assert!(plane.nacks().is_empty(), "{:?}", plane.nacks());

    // C-core on the same resources.
    let ccore = grpcio::Client::new(&python, &theirs);
    let run = |extra: Vec<String>| {
        let ccore = ccore.clone();
        let target = target.clone();
        async move {
            let mut args = vec!["--failures-ok".to_owned()];
            args.extend(extra);
            args.extend(["--timeout".to_owned(), "5".to_owned()]);
            args.push(target);
            args.push("4".into());
            ccore.run(&args, None).await.unwrap()
        }
    };
    let plain = run(vec![]).await;
    assert!(
        plain.iter().all(|c| c.ok()),
        "{plain:?}\nNACKs {:?}",
        plane.nacks()
    );
    let fault = run(vec!["--metadata".into(), "x-route:fault".into()]).await;
    assert!(
        fault
            .iter()
            .all(|c| c.code == "UNAVAILABLE" && c.message == "Fault injected"),
        "{fault:?}"
    );
    let lr = run(vec!["--metadata".into(), "x-route:lr".into()]).await;
    assert!(
        lr.iter().all(|c| c.ok()),
        "{lr:?}\nNACKs {:?}",
        plane.nacks()
    );
    let ring = run(vec![
        "--metadata".into(),
        "x-route:ring".into(),
        "--metadata".into(),
        "x-user:alice".into(),
    ])
    .await;
    assert!(ring.iter().all(|c| c.ok()), "{ring:?}");
    let backends: std::collections::BTreeSet<&str> =
        ring.iter().map(|c| c.backend.as_str()).collect();
    assert_eq!(backends.len(), 1, "C-core's ring hash sticks too: {ring:?}");
    assert!(plane.nacks().is_empty(), "{:?}", plane.nacks());
}
