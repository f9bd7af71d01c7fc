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
use tether::lb::registry::custom_policy;
use tether::lb::PolicyRegistry;
use tether::xds::resource::cluster::LbPolicy;
use tether::xds::resource::typed_struct::TypedStruct;
use tether::xds::resource::{decode_with, pack, Resource, ResourceKind, ValidationOptions};
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};

fn registry() -> PolicyRegistry {
    PolicyRegistry::new().with(policy::Builder).unwrap()
}

fn with_registry() -> ValidationOptions {
    {
        let mut validation = ValidationOptions::default();
        validation.policies = registry().parsers().clone();
        validation
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
        let channel =
            Channel::from_static(StaticConfig::new("custom", endpoints.clone()).with_policy(
                EndpointPolicy::Custom(custom_policy(builder, config).unwrap()),
            ))
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

/// A cluster's policy as its error text, or the policy.
fn nack_of(policies: Vec<Any>, options: ValidationOptions) -> String {
    match policy_of(&cluster("web", policies), options) {
        Ok(p) => panic!("accepted as {p:?}"),
        Err(e) => e,
    }
}

const VALUE: &str =
    "Cluster \"web\": load_balancing_policy.policies[0].typed_extension_config.typed_config.value";

/// A TypedStruct naming a built-in policy by its gRPC name selects the
/// same policy as the policy's own proto, its value read as the policy's
/// service-config JSON config (as C-core does).
#[test]
fn built_in_names_select_what_their_protos_select() {
    use envoy_types::pb::envoy::extensions::load_balancing_policies as lbp;
    use envoy_types::pb::google::protobuf::{
        BoolValue, Duration, FloatValue, UInt32Value, UInt64Value,
    };
    let ring_hash = lbp::ring_hash::v3::RingHash {
        minimum_ring_size: Some(UInt64Value { value: 10 }),
        maximum_ring_size: Some(UInt64Value { value: 100 }),
        ..Default::default()
    };
    let wrr = lbp::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin {
        enable_oob_load_report: Some(BoolValue { value: true }),
        oob_reporting_period: Some(Duration {
            seconds: 2,
            nanos: 500_000_000,
        }),
        blackout_period: Some(Duration::default()),
        weight_expiration_period: Some(Duration {
            seconds: 60,
            nanos: 0,
        }),
        // Below the 100 ms floor, raised to it on both paths.
        weight_update_period: Some(Duration {
            seconds: 0,
            nanos: 50_000_000,
        }),
        error_utilization_penalty: Some(FloatValue { value: 0.5 }),
        ..Default::default()
    };
    let cases = [
        (
            xds_struct("round_robin", serde_json::json!({"ignored": [1]})),
            pack(&RoundRobin::default()),
        ),
        (
            xds_struct(
                "pick_first",
                serde_json::json!({"shuffleAddressList": true}),
            ),
            pack(&lbp::pick_first::v3::PickFirst {
                shuffle_address_list: true,
            }),
        ),
        (
            xds_struct(
                "ring_hash_experimental",
                serde_json::json!({"minRingSize": 10, "maxRingSize": "100"}),
            ),
            pack(&ring_hash),
        ),
        (
            typed_struct(
                "type.googleapis.com/udpa.type.v1.TypedStruct",
                "least_request_experimental",
                serde_json::json!({"choiceCount": 3}),
            ),
            pack(&lbp::least_request::v3::LeastRequest {
                choice_count: Some(UInt32Value { value: 3 }),
                ..Default::default()
            }),
        ),
        (
            xds_struct(
                "weighted_round_robin",
                serde_json::json!({
                    "enableOobLoadReport": true,
                    "oobReportingPeriod": "2.5s",
                    "blackoutPeriod": "0s",
                    "weightExpirationPeriod": "60s",
                    "weightUpdatePeriod": "0.05s",
                    "errorUtilizationPenalty": 0.5,
                }),
            ),
            pack(&wrr),
        ),
        (
            // The child list's first known policy wins.
            xds_struct(
                "xds_wrr_locality_experimental",
                serde_json::json!({"childPolicy": [
                    {"someone.elses_policy": {}},
                    {"ring_hash_experimental": {"minRingSize": 10, "maxRingSize": 100}},
                    {"round_robin": {}},
                ]}),
            ),
            pack(&WrrLocality {
                endpoint_picking_policy: Some(list(vec![pack(&ring_hash)])),
            }),
        ),
    ];
    for (from_struct, from_proto) in cases {
        let want = policy_of(
            &cluster("web", vec![from_proto]),
            ValidationOptions::default(),
        );
        let got = policy_of(
            &cluster("web", vec![from_struct]),
            ValidationOptions::default(),
        );
        assert!(want.is_ok(), "{want:?}");
        assert_eq!(got, want);
    }
    // Not the defaults: the values were read.
    let got = policy_of(
        &cluster(
            "web",
            vec![xds_struct(
                "ring_hash_experimental",
                serde_json::json!({"minRingSize": 10, "maxRingSize": 100}),
            )],
        ),
        ValidationOptions::default(),
    );
    assert_eq!(
        got,
        Ok(LbPolicy::RingHash {
            min_ring_size: 10,
            max_ring_size: 100
        })
    );
    // A custom policy inside the child list, from the registry.
    let c = cluster(
        "web",
        vec![xds_struct(
            "xds_wrr_locality_experimental",
            serde_json::json!({"childPolicy": [{(policy::NAME): {}}]}),
        )],
    );
    let LbPolicy::WrrLocality(inner) = policy_of(&c, with_registry()).unwrap() else {
        panic!()
    };
    assert!(matches!(*inner, LbPolicy::Custom(ref p) if p.name() == policy::NAME));
}

/// An absent or empty value, unknown fields and `null`s give the
/// policies' defaults: the protos' defaults, except `maxRingSize`, which
/// is 4096 in gRPC's JSON config.
#[test]
fn built_in_names_default_what_the_value_leaves_out() {
    use envoy_types::pb::envoy::extensions::load_balancing_policies as lbp;
    use tether::xds::lb_config::weighted_round_robin::Settings;
    let absent = |name: &str| Any {
        type_url: "type.googleapis.com/xds.type.v3.TypedStruct".into(),
        value: TypedStruct {
            type_url: format!("type.googleapis.com/{name}"),
            value: None,
        }
        .encode_to_vec(),
    };
    let cases = [
        (
            "pick_first",
            pack(&lbp::pick_first::v3::PickFirst::default()),
            LbPolicy::PickFirst { shuffle: false },
        ),
        (
            "least_request_experimental",
            pack(&lbp::least_request::v3::LeastRequest::default()),
            LbPolicy::LeastRequest { choice_count: 2 },
        ),
        (
            "weighted_round_robin",
            pack(
                &lbp::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin::default(),
            ),
            LbPolicy::WeightedRoundRobin(Settings::default()),
        ),
    ];
    let options = ValidationOptions::default;
    for (name, proto, want) in cases {
        assert_eq!(
            policy_of(&cluster("web", vec![proto]), options()),
            Ok(want.clone())
        );
        for any in [
            absent(name),
            xds_struct(name, serde_json::json!({})),
            xds_struct(
                name,
                serde_json::json!({"choiceCount": null, "blackoutPeriod": null, "future": 1}),
            ),
        ] {
            assert_eq!(
                policy_of(&cluster("web", vec![any]), options()),
                Ok(want.clone()),
                "{name}"
            );
        }
    }
    for any in [
        absent("ring_hash_experimental"),
        xds_struct("ring_hash_experimental", serde_json::json!({})),
    ] {
        assert_eq!(
            policy_of(&cluster("web", vec![any]), options()),
            Ok(LbPolicy::RingHash {
                min_ring_size: 1024,
                max_ring_size: 4096
            })
        );
    }
    // The proto's default maximum is larger.
    assert_eq!(
        policy_of(
            &cluster("web", vec![pack(&lbp::ring_hash::v3::RingHash::default())]),
            options()
        ),
        Ok(LbPolicy::RingHash {
            min_ring_size: 1024,
            max_ring_size: 8_388_608
        })
    );
    // xds_wrr_locality_experimental has no default child.
    assert_eq!(
        nack_of(vec![absent("xds_wrr_locality_experimental")], options()),
        format!("{VALUE}.childPolicy: field not present")
    );
}

/// A config the built-in policy refuses NACKs the cluster, naming the JSON
/// field and its value; the next entries are not tried.
#[test]
fn a_bad_built_in_config_is_nacked_naming_the_field_and_value() {
    let cases = [
        (
            "least_request_experimental",
            serde_json::json!({"choiceCount": 1}),
            ".choiceCount: 1 must be at least 2",
        ),
        (
            "least_request_experimental",
            serde_json::json!({"choiceCount": 4294967296u64}),
            ".choiceCount: 4294967296.0 is not an integer in the range of 0 to 4294967295",
        ),
        (
            "ring_hash_experimental",
            serde_json::json!({"minRingSize": 0}),
            ".minRingSize: 0 must be in the range of 1 to 8388608",
        ),
        (
            "ring_hash_experimental",
            serde_json::json!({"minRingSize": 5000}),
            ".minRingSize: 5000 is above maxRingSize 4096",
        ),
        (
            "ring_hash_experimental",
            serde_json::json!({"maxRingSize": 1.5}),
            ".maxRingSize: 1.5 is not a non-negative integer",
        ),
        (
            "pick_first",
            serde_json::json!({"shuffleAddressList": "yes"}),
            ".shuffleAddressList: \"yes\" is not a boolean",
        ),
        (
            "weighted_round_robin",
            serde_json::json!({"blackoutPeriod": 10}),
            ".blackoutPeriod: 10.0 is not a duration string like \"1.5s\"",
        ),
        (
            "weighted_round_robin",
            serde_json::json!({"weightUpdatePeriod": "1.0000000001s"}),
            ".weightUpdatePeriod: \"1.0000000001s\" is not a duration (expected e.g. \"120s\" or \"1.5s\")",
        ),
        (
            "weighted_round_robin",
            serde_json::json!({"blackoutPeriod": "-1s"}),
            ".blackoutPeriod: \"-1s\" is negative",
        ),
        (
            "weighted_round_robin",
            serde_json::json!({"errorUtilizationPenalty": -1}),
            ".errorUtilizationPenalty: -1.0 must be non-negative",
        ),
        (
            "xds_wrr_locality_experimental",
            serde_json::json!({"childPolicy": [{"ring_hash_experimental": {"maxRingSize": 0}}]}),
            ".childPolicy[0].ring_hash_experimental.maxRingSize: 0 must be in the range of 1 to 8388608",
        ),
        (
            "xds_wrr_locality_experimental",
            serde_json::json!({"childPolicy": [{"a": {}}, {"b": {}}]}),
            ".childPolicy: no supported load balancing policy in the list (tried: a, b)",
        ),
        (
            "xds_wrr_locality_experimental",
            serde_json::json!({"childPolicy": [{}, {"round_robin": {}}]}),
            ".childPolicy[0]: {} must be an object naming one policy",
        ),
    ];
    for (name, config, problem) in cases {
        let policies = vec![xds_struct(name, config), pack(&RoundRobin::default())];
        assert_eq!(
            nack_of(policies, ValidationOptions::default()),
            format!("{VALUE}{problem}")
        );
    }
}

/// The LB tree's internal policies NACK as C-core NACKs their missing
/// configs; tether's own names that gRPC's registry lacks, and Maglev
/// (tether's only), are unknown names: skipped.
#[test]
fn internal_policies_are_refused_and_non_grpc_names_skipped() {
    for name in ["priority_experimental", "cds_experimental"] {
        assert_eq!(
            nack_of(
                vec![
                    xds_struct(name, serde_json::json!({})),
                    pack(&RoundRobin::default())
                ],
                ValidationOptions::default()
            ),
            format!(
                "{VALUE}: policy {name} is internal to the xDS LB tree and cannot be a cluster's policy"
            )
        );
    }
    let maglev_on = {
        let mut validation = ValidationOptions::default();
        validation.maglev = true;
        validation
    };
    for name in ["ring_hash", "least_request", "xds_wrr_locality", "maglev"] {
        let c = cluster(
            "web",
            vec![
                xds_struct(name, serde_json::json!({})),
                pack(&RoundRobin::default()),
            ],
        );
        assert_eq!(
            policy_of(&c, maglev_on.clone()),
            Ok(LbPolicy::RoundRobin),
            "{name}"
        );
    }
    // Custom policies cannot take gRPC's names either.
    struct Named(&'static str);
    impl tether::lb::PolicyBuilder for Named {
        fn name(&self) -> &'static str {
            self.0
        }
        fn parse_config(&self, _: &serde_json::Value) -> Result<tether::lb::ParsedConfig, String> {
            Ok(std::sync::Arc::new(()))
        }
        fn build(&self) -> Box<dyn tether::lb::LbPolicy> {
            unreachable!()
        }
    }
    for name in ["ring_hash_experimental", "priority_experimental"] {
        assert_eq!(
            PolicyRegistry::new().with(Named(name)).err(),
            Some(tether::lb::registry::RegistryError::BuiltIn(name.into()))
        );
    }
}
