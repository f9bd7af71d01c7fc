//! Custom load-balancing policies (gRFC A52): the example policy
//! (`examples/weighted_random`) registered with the validation a channel's
//! XdsClient runs, and selected, skipped or refused by clusters'
//! `load_balancing_policy` lists; then run by a static channel over real
//! tonic backends.

#[path = "../examples/weighted_random/policy.rs"]
mod policy;

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::load_balancing_policies::round_robin::v3::RoundRobin;
use envoy_types::pb::envoy::extensions::load_balancing_policies::wrr_locality::v3::WrrLocality;
use envoy_types::pb::google::protobuf::Any;
use prost::Message as _;
use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
use tether::lb::{CustomPolicy, PolicyRegistry};
use tether::xds::resource::cluster::LbPolicy;
use tether::xds::resource::typed_struct::TypedStruct;
use tether::xds::resource::{decode_with, pack, Resource, ResourceKind, ValidationOptions};
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};

fn registry() -> PolicyRegistry {
    PolicyRegistry::new().with(policy::Builder).unwrap()
}

fn with_registry() -> ValidationOptions {
    ValidationOptions {
        policies: registry(),
        ..Default::default()
    }
}

/// A TypedStruct naming `name` with `config`, as an Any of `type_url`.
fn typed_struct(type_url: &str, name: &str, config: serde_json::Value) -> Any {
    Any {
        type_url: type_url.into(),
        value: TypedStruct::new(name, &config).encode_to_vec(),
    }
}

fn xds_struct(name: &str, config: serde_json::Value) -> Any {
    typed_struct("type.googleapis.com/xds.type.v3.TypedStruct", name, config)
}

fn list(policies: Vec<Any>) -> cpb::LoadBalancingPolicy {
    cpb::LoadBalancingPolicy {
        policies: policies
            .into_iter()
            .map(|any| cpb::load_balancing_policy::Policy {
                typed_extension_config: Some(core::TypedExtensionConfig {
                    name: "p".into(),
                    typed_config: Some(any),
                }),
            })
            .collect(),
    }
}

/// An EDS cluster named `name` with the policy list `policies`.
fn cluster(name: &str, policies: Vec<Any>) -> Any {
    pack(&cpb::Cluster {
        name: name.into(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
            cpb::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
            eds_config: Some(core::ConfigSource {
                config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
                    Default::default(),
                )),
                ..Default::default()
            }),
            service_name: String::new(),
        }),
        load_balancing_policy: Some(list(policies)),
        ..Default::default()
    })
}

fn policy_of(any: &Any, options: ValidationOptions) -> Result<LbPolicy, String> {
    match decode_with(ResourceKind::Cluster, any, options).result {
        Ok(Resource::Cluster(c)) => Ok(c.lb_policy.clone()),
        Ok(other) => panic!("not a cluster: {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn a_registered_policy_is_selected_with_its_parsed_config() {
    let c = cluster(
        "web",
        vec![xds_struct(
            policy::NAME,
            serde_json::json!({"ignoreEndpointWeights": true}),
        )],
    );
    let LbPolicy::Custom(p) = policy_of(&c, with_registry()).unwrap() else {
        panic!()
    };
    assert_eq!(p.name(), policy::NAME);
    assert_eq!(
        p.parsed.downcast_ref::<policy::Config>(),
        Some(&policy::Config {
            ignore_endpoint_weights: true
        })
    );
    // udpa.type.v1.TypedStruct is read the same way, inside wrr_locality too.
    let udpa = typed_struct(
        "type.googleapis.com/udpa.type.v1.TypedStruct",
        policy::NAME,
        serde_json::json!({}),
    );
    let c = cluster(
        "web",
        vec![pack(&WrrLocality {
            endpoint_picking_policy: Some(list(vec![udpa])),
        })],
    );
    let LbPolicy::WrrLocality(inner) = policy_of(&c, with_registry()).unwrap() else {
        panic!()
    };
    assert!(matches!(*inner, LbPolicy::Custom(ref p) if p.name() == policy::NAME));
}

#[test]
fn the_first_known_policy_wins_and_unknown_ones_are_skipped() {
    let c = cluster(
        "web",
        vec![
            xds_struct("someone.elses_policy", serde_json::json!({})),
            xds_struct(policy::NAME, serde_json::json!({})),
            pack(&RoundRobin::default()),
        ],
    );
    assert!(matches!(
        policy_of(&c, with_registry()),
        Ok(LbPolicy::Custom(_))
    ));
    // Without the registry the example policy is unknown too: round robin.
    assert_eq!(
        policy_of(&c, ValidationOptions::default()),
        Ok(LbPolicy::RoundRobin)
    );
}

#[test]
fn an_unsupported_only_list_is_nacked_naming_the_cluster() {
    let c = cluster(
        "checkout",
        vec![xds_struct("someone.elses_policy", serde_json::json!({}))],
    );
    assert_eq!(
        policy_of(&c, with_registry()).unwrap_err(),
        "Cluster \"checkout\": load_balancing_policy: no supported load balancing policy in the list"
    );
    // The example policy without its registry: the same.
    let c = cluster(
        "checkout",
        vec![xds_struct(policy::NAME, serde_json::json!({}))],
    );
    assert_eq!(
        policy_of(&c, ValidationOptions::default()).unwrap_err(),
        "Cluster \"checkout\": load_balancing_policy: no supported load balancing policy in the list"
    );
}

#[test]
fn a_config_the_policy_refuses_is_nacked_with_its_message() {
    let c = cluster(
        "web",
        vec![
            xds_struct(
                policy::NAME,
                serde_json::json!({"ignoreEndpointWeights": "yes"}),
            ),
            pack(&RoundRobin::default()),
        ],
    );
    assert_eq!(
        policy_of(&c, with_registry()).unwrap_err(),
        "Cluster \"web\": load_balancing_policy.policies[0].typed_extension_config.typed_config.value: \
         policy example.weighted_random refused its config: ignoreEndpointWeights: \"yes\" is not a bool"
    );
    let c = cluster(
        "web",
        vec![Any {
            type_url: "type.googleapis.com/xds.type.v3.TypedStruct".into(),
            value: TypedStruct {
                type_url: "type.googleapis.com/".into(),
                value: None,
            }
            .encode_to_vec(),
        }],
    );
    assert_eq!(
        policy_of(&c, with_registry()).unwrap_err(),
        "Cluster \"web\": load_balancing_policy.policies[0].typed_extension_config.typed_config.type_url: \
         \"type.googleapis.com/\" names no policy"
    );
}

/// The policy over real backends weighted 1 and 3: about a quarter and
/// three quarters of the calls; uniform when its config says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_policy_runs_in_a_channel() {
    let light = GrpcBackend::start("light").await;
    let heavy = GrpcBackend::start("heavy").await;
    let mut endpoints = vec![
        StaticEndpoint::new(light.addr()),
        StaticEndpoint::new(heavy.addr()),
    ];
    endpoints[1].weight = 3;
    let registry = registry();
    let builder = registry.get(policy::NAME).unwrap();
    for (config, heavy_share) in [
        (serde_json::json!({}), 0.75),
        (serde_json::json!({"ignoreEndpointWeights": true}), 0.5),
    ] {
        let channel = Channel::from_static(StaticConfig {
            cluster: "custom".into(),
            endpoints: endpoints.clone(),
            policy: EndpointPolicy::Custom(CustomPolicy::parse(builder, config).unwrap()),
            session: None,
        })
        .unwrap();
        let mut client = EchoClient::new(channel.clone());
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..2000 {
            let reply = client
                .echo(EchoRequest {
                    message: "x".into(),
                })
                .await
                .unwrap()
                .into_inner();
            *counts.entry(reply.backend).or_default() += 1;
        }
        let share = counts["heavy"] as f64 / 2000.0;
        assert!((share - heavy_share).abs() < 0.05, "{counts:?}");
        let stats = channel.stats().await.unwrap();
        assert!(
            serde_json::to_string(&stats.tree)
                .unwrap()
                .contains(policy::NAME),
            "{stats:?}"
        );
    }
}
