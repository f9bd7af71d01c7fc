//! Cluster validation: EDS, LOGICAL_DNS and aggregate clusters, the LB
//! policy (round robin, ring hash with its ring sizes, least request, pick
//! first, wrr_locality; Maglev only when
//! [`ValidationOptions::maglev`](super::ValidationOptions::maglev) is
//! on, since gRPC rejects it), `common_lb_config.override_host_status` (A55)
//! and the session idle timeout from `upstream_config` (A75),
//! `outlier_detection` (A50), and load reporting (`lrs_server`, A27, with
//! `lrs_report_endpoint_metrics`, A85).

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateConfig;
use envoy_types::pb::envoy::extensions::load_balancing_policies as lbp;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use prost::Name;
use tether_core::hash::maglev::{MaglevConfig, DEFAULT_TABLE_SIZE, MAX_TABLE_SIZE};

pub use cpb::Cluster;

use super::endpoint::{HealthSet, HealthStatus};
use super::listener::config_source_is_ads;
use super::lrs_metrics::BackendMetricPropagation;
use super::typed_struct::{TypedStruct, UDPA_TYPED_STRUCT};
use super::{type_name, Check, Spelling};
use crate::lb_config::outlier_detection::{
    FailurePercentageEjection, OutlierDetectionConfig, SuccessRateEjection,
};
use crate::lb_config::registry::CustomPolicy;

/// Default session idle timeout (A75).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Largest ring size a ring hash policy may ask for.
pub const MAX_RING_SIZE: u64 = 8_388_608;
/// `maxRingSize` when a `ring_hash_experimental` service-config JSON config
/// (a TypedStruct's `value`) leaves it out, as in C-core and grpc-go (the
/// proto's default is [`MAX_RING_SIZE`]).
pub const DEFAULT_JSON_MAX_RING_SIZE: u64 = 4096;
/// How deep `load_balancing_policy` lists may nest (through `WrrLocality`
/// or `xds_wrr_locality_experimental`'s `childPolicy`).
const MAX_POLICY_DEPTH: usize = 16;

/// A validated cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterResource {
    /// Its name.
    pub name: String,
    /// How its endpoints are found.
    pub discovery: Discovery,
    /// Load balancing policy of its endpoints.
    pub lb_policy: LbPolicy,
    /// Endpoint health statuses a session may stay pinned to
    /// (default UNKNOWN and HEALTHY; only UNKNOWN, HEALTHY and DRAINING kept).
    pub override_host_status: HealthSet,
    /// How long an unused session keeps its connection (A75; default 1 h).
    pub idle_timeout: Duration,
    /// Circuit breaking: calls in flight at most (`circuit_breakers`, the
    /// first DEFAULT-priority threshold's `max_requests`; default 1024).
    pub max_requests: u32,
    /// Outlier detection (A50), when the cluster sets `outlier_detection`.
    pub outlier_detection: Option<OutlierDetectionConfig>,
    /// The TLS its connections must use (A29: `transport_socket`), when
    /// the cluster asks for it.
    pub security: Option<super::security::UpstreamTls>,
    /// Its calls' load is reported over LRS to the server the cluster came
    /// from (gRFC A27: `lrs_server` set to `self`; any other ConfigSource
    /// is refused, as in gRPC).
    pub lrs_server: bool,
    /// Which fields of its calls' ORCA per-call reports its load reports
    /// carry (gRFC A85: `lrs_report_endpoint_metrics`; unset propagates
    /// nothing, unknown names are ignored).
    pub backend_metric_propagation: BackendMetricPropagation,
}

/// gRPC's default `max_requests`.
pub const DEFAULT_MAX_REQUESTS: u32 = 1024;

/// Where a cluster's endpoints come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// EDS over the same stream; the ClusterLoadAssignment name is
    /// `service_name` or else the cluster's name.
    Eds {
        /// `eds_cluster_config.service_name` if set.
        service_name: Option<String>,
    },
    /// One DNS name, `host:port`.
    LogicalDns {
        /// The name and port to resolve.
        target: String,
    },
    /// An aggregate cluster: the named clusters in priority order.
    Aggregate {
        /// Underlying clusters.
        clusters: Vec<String>,
    },
}

impl ClusterResource {
    /// The EDS resource name to watch, for an EDS cluster.
    pub fn eds_name(&self) -> Option<&str> {
        match &self.discovery {
            Discovery::Eds { service_name } => {
                Some(service_name.as_deref().unwrap_or(self.name.as_str()))
            }
            _ => None,
        }
    }
}

/// A load balancing policy.
#[derive(Debug, Clone, PartialEq)]
pub enum LbPolicy {
    /// Round robin (inside weighted localities).
    RoundRobin,
    /// Ring hash (A42).
    RingHash {
        /// `minimum_ring_size` (default 1024).
        min_ring_size: u64,
        /// `maximum_ring_size` (default 8388608).
        max_ring_size: u64,
    },
    /// Maglev (tether beyond gRPC: accepted only with
    /// [`ValidationOptions::maglev`](super::ValidationOptions::maglev)).
    Maglev {
        /// `table_size`: a prime, at most 5000011 (default 65537).
        table_size: u64,
    },
    /// Least request with `choice_count` random choices.
    LeastRequest {
        /// Choices per pick (default 2).
        choice_count: u32,
    },
    /// Pick first.
    PickFirst {
        /// Shuffle the address list first.
        shuffle: bool,
    },
    /// Weighted round robin by the endpoints' load reports (A58).
    WeightedRoundRobin(crate::lb_config::weighted_round_robin::Settings),
    /// A custom policy from the channel's registry (gRFC A52), selected by
    /// a TypedStruct naming it. A TypedStruct naming a built-in policy by
    /// its gRPC name (`round_robin`, `ring_hash_experimental`, ...) gives
    /// that policy's own variant instead, its `value` read as the policy's
    /// service-config JSON config, as C-core does.
    Custom(CustomPolicy),
    /// Weighted localities, each running the child policy.
    WrrLocality(Box<LbPolicy>),
}

pub(crate) fn validate(c: &mut Check, cl: &Cluster) -> ClusterResource {
    use cpb::cluster::ClusterDiscoveryType as T;
    use cpb::cluster::DiscoveryType as D;
    let discovery = match &cl.cluster_discovery_type {
        Some(T::Type(t)) => match D::try_from(*t) {
            Ok(D::Eds) => c.at("eds_cluster_config", |c| {
                let Some(eds) = &cl.eds_cluster_config else {
                    c.fail("field not present");
                    return None;
                };
                c.at("eds_config", |c| {
                    config_source_is_ads(c, eds.eds_config.as_ref())
                });
                if eds.service_name.is_empty() && cl.name.starts_with("xdstp:") {
                    c.fail_at("service_name", "must be set for an xdstp: cluster name");
                }
                Some(Discovery::Eds {
                    service_name: (!eds.service_name.is_empty()).then(|| eds.service_name.clone()),
                })
            }),
            Ok(D::LogicalDns) => c.at("load_assignment", |c| logical_dns(c, cl)),
            _ => {
                c.at("type", |c| c.fail_value(*t, "DiscoveryType is not valid"));
                None
            }
        },
        Some(T::ClusterType(ct)) => c.at("cluster_type", |c| {
            let any = ct.typed_config.as_ref();
            match any {
                Some(any) if type_name(&any.type_url) == AggregateConfig::full_name() => {
                    let agg = c.at("typed_config", |c| c.unpack::<AggregateConfig>(any))?;
                    if agg.clusters.is_empty() {
                        c.fail_at("typed_config.clusters", "must be non-empty");
                    }
                    Some(Discovery::Aggregate {
                        clusters: agg.clusters,
                    })
                }
                Some(any) => {
                    c.at("typed_config.type_url", |c| {
                        c.fail_value(&any.type_url, "is an unsupported custom cluster type")
                    });
                    None
                }
                None => {
                    c.fail_at("typed_config", "field not present");
                    None
                }
            }
        }),
        None => {
            c.fail("cluster_discovery_type: field not present");
            None
        }
    };
    let lb_policy = match &cl.load_balancing_policy {
        Some(p) if !p.policies.is_empty() => {
            c.at("load_balancing_policy", |c| typed_policy(c, p, 0))
        }
        _ => legacy_policy(c, cl),
    };
    let override_host_status = match cl
        .common_lb_config
        .as_ref()
        .and_then(|l| l.override_host_status.as_ref())
    {
        None => HealthSet::default_override(),
        // gRPC keeps UNKNOWN, HEALTHY and DRAINING and ignores the rest
        // without a NACK.
        Some(set) => set
            .statuses
            .iter()
            .filter_map(|s| HealthStatus::from_i32(*s))
            .filter(|h| {
                matches!(
                    h,
                    HealthStatus::Unknown | HealthStatus::Healthy | HealthStatus::Draining
                )
            })
            .collect(),
    };
    let idle_timeout = c.at("upstream_config", |c| {
        let Some(ext) = &cl.upstream_config else {
            return DEFAULT_IDLE_TIMEOUT;
        };
        let Some(any) = &ext.typed_config else {
            c.fail_at("typed_config", "field not present");
            return DEFAULT_IDLE_TIMEOUT;
        };
        if type_name(&any.type_url) != HttpProtocolOptions::full_name() {
            c.at("typed_config.type_url", |c| {
                c.fail_value(&any.type_url, "unsupported upstream config type")
            });
            return DEFAULT_IDLE_TIMEOUT;
        }
        let Some(opts) = c.at("typed_config", |c| c.unpack::<HttpProtocolOptions>(any)) else {
            return DEFAULT_IDLE_TIMEOUT;
        };
        match opts
            .common_http_protocol_options
            .as_ref()
            .and_then(|o| o.idle_timeout.as_ref())
        {
            None => DEFAULT_IDLE_TIMEOUT,
            Some(d) => c
                .at(
                    "typed_config.common_http_protocol_options.idle_timeout",
                    |c| c.duration(d),
                )
                .unwrap_or(DEFAULT_IDLE_TIMEOUT),
        }
    });
    ClusterResource {
        name: cl.name.clone(),
        discovery: discovery.unwrap_or(Discovery::Eds { service_name: None }),
        lb_policy: lb_policy.unwrap_or(LbPolicy::RoundRobin),
        override_host_status,
        idle_timeout,
        max_requests: max_requests(cl),
        outlier_detection: cl
            .outlier_detection
            .as_ref()
            .and_then(|od| c.at("outlier_detection", |c| outlier_detection(c, od))),
        security: super::security::upstream_tls(c, cl),
        lrs_server: c.at("lrs_server", |c| lrs_server(c, cl.lrs_server.as_ref())),
        backend_metric_propagation: BackendMetricPropagation::from_names(
            &cl.lrs_report_endpoint_metrics,
        ),
    }
}

/// Whether the cluster reports load: `lrs_server` must be `self` when set.
fn lrs_server(
    c: &mut Check,
    source: Option<&envoy_types::pb::envoy::config::core::v3::ConfigSource>,
) -> bool {
    use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier as S;
    match source {
        None => false,
        Some(s) => match &s.config_source_specifier {
            Some(S::Self_(_)) => true,
            _ => {
                c.fail("ConfigSource is not self");
                false
            }
        },
    }
}

/// CDS `outlier_detection` as gRFC A50 maps it: gRPC's defaults for unset
/// fields; success rate on unless `enforcing_success_rate` is 0;
/// failure percentage on only when `enforcing_failure_percentage` is set
/// and not 0; the other algorithms (consecutive 5xx, ...) ignored. Bad
/// durations and percentages above 100 NACK the cluster.
fn outlier_detection(c: &mut Check, od: &cpb::OutlierDetection) -> Option<OutlierDetectionConfig> {
    let defaults = OutlierDetectionConfig::default();
    let mut ok = true;
    let mut duration = |c: &mut Check,
                        field: &str,
                        d: Option<&envoy_types::pb::google::protobuf::Duration>,
                        default| {
        match d {
            None => default,
            Some(d) => c.at(field, |c| c.duration(d)).unwrap_or_else(|| {
                ok = false;
                default
            }),
        }
    };
    let interval = duration(c, "interval", od.interval.as_ref(), defaults.interval);
    let base_ejection_time = duration(
        c,
        "base_ejection_time",
        od.base_ejection_time.as_ref(),
        defaults.base_ejection_time,
    );
    let max_ejection_time = duration(
        c,
        "max_ejection_time",
        od.max_ejection_time.as_ref(),
        defaults.max_ejection_time,
    );
    let value = |v: &Option<u32>, default: u32| v.unwrap_or(default);
    let success_defaults = SuccessRateEjection::default();
    let failure_defaults = FailurePercentageEjection::default();
    let enforcing_success_rate = value(
        &od.enforcing_success_rate.as_ref().map(|v| v.value),
        success_defaults.enforcement_percentage,
    );
    let enforcing_failure_percentage = od
        .enforcing_failure_percentage
        .as_ref()
        .map_or(0, |v| v.value);
    let config = OutlierDetectionConfig {
        interval,
        base_ejection_time,
        max_ejection_time,
        max_ejection_percent: value(
            &od.max_ejection_percent.as_ref().map(|v| v.value),
            defaults.max_ejection_percent,
        ),
        success_rate: (enforcing_success_rate != 0).then(|| SuccessRateEjection {
            stdev_factor: value(
                &od.success_rate_stdev_factor.as_ref().map(|v| v.value),
                success_defaults.stdev_factor,
            ),
            enforcement_percentage: enforcing_success_rate,
            minimum_hosts: value(
                &od.success_rate_minimum_hosts.as_ref().map(|v| v.value),
                success_defaults.minimum_hosts,
            ),
            request_volume: value(
                &od.success_rate_request_volume.as_ref().map(|v| v.value),
                success_defaults.request_volume,
            ),
        }),
        failure_percentage: (enforcing_failure_percentage != 0).then(|| {
            FailurePercentageEjection {
                threshold: value(
                    &od.failure_percentage_threshold.as_ref().map(|v| v.value),
                    failure_defaults.threshold,
                ),
                enforcement_percentage: enforcing_failure_percentage,
                minimum_hosts: value(
                    &od.failure_percentage_minimum_hosts
                        .as_ref()
                        .map(|v| v.value),
                    failure_defaults.minimum_hosts,
                ),
                request_volume: value(
                    &od.failure_percentage_request_volume
                        .as_ref()
                        .map(|v| v.value),
                    failure_defaults.request_volume,
                ),
            }
        }),
    };
    // A50 checks these whether or not their algorithm is on.
    for (field, v) in [
        ("max_ejection_percent", config.max_ejection_percent),
        ("enforcing_success_rate", enforcing_success_rate),
        (
            "failure_percentage_threshold",
            od.failure_percentage_threshold
                .as_ref()
                .map_or(0, |v| v.value),
        ),
        ("enforcing_failure_percentage", enforcing_failure_percentage),
    ] {
        if v > 100 {
            c.at(field, |c| c.fail_value(v, "must be at most 100"));
            ok = false;
        }
    }
    ok.then_some(config)
}

/// `max_requests` of the first DEFAULT-priority threshold, as gRPC reads it.
fn max_requests(cl: &Cluster) -> u32 {
    use envoy_types::pb::envoy::config::core::v3::RoutingPriority;
    cl.circuit_breakers
        .as_ref()
        .and_then(|cb| {
            cb.thresholds
                .iter()
                .find(|t| t.priority == RoutingPriority::Default as i32)
        })
        .and_then(|t| t.max_requests.as_ref())
        .map_or(DEFAULT_MAX_REQUESTS, |m| m.value)
}

fn logical_dns(c: &mut Check, cl: &Cluster) -> Option<Discovery> {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier};
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    let Some(la) = &cl.load_assignment else {
        c.fail("field not present");
        return None;
    };
    let eps: Vec<_> = la
        .endpoints
        .iter()
        .flat_map(|l| l.lb_endpoints.iter())
        .collect();
    if la.endpoints.len() != 1 || eps.len() != 1 {
        c.fail("must have exactly one locality with exactly one endpoint");
        return None;
    }
    let sa = match &eps[0].host_identifier {
        Some(HostIdentifier::Endpoint(e)) => {
            match e.address.as_ref().and_then(|a| a.address.as_ref()) {
                Some(address::Address::SocketAddress(sa)) => sa,
                _ => {
                    c.fail("endpoint address is not a socket address");
                    return None;
                }
            }
        }
        _ => {
            c.fail("endpoint field not present");
            return None;
        }
    };
    match sa.port_specifier {
        Some(PortSpecifier::PortValue(p)) if sa.address.is_empty() => {
            c.fail_value(p, "has no host name");
            None
        }
        Some(PortSpecifier::PortValue(p)) => Some(Discovery::LogicalDns {
            target: format!("{}:{p}", sa.address),
        }),
        _ => {
            c.fail("endpoint port_value field not present");
            None
        }
    }
}

/// A ring hash policy with the ring sizes given (default 1024, and
/// [`MAX_RING_SIZE`] in the proto or [`DEFAULT_JSON_MAX_RING_SIZE`] in
/// JSON), each in 1..=8388608 and the minimum not above the maximum.
fn ring_sizes(
    c: &mut Check,
    min: Option<u64>,
    max: Option<u64>,
    spelling: Spelling,
) -> Option<LbPolicy> {
    let default_max = match spelling {
        Spelling::Proto => MAX_RING_SIZE,
        Spelling::Json => DEFAULT_JSON_MAX_RING_SIZE,
    };
    let min_ring_size = min.unwrap_or(1024);
    let max_ring_size = max.unwrap_or(default_max);
    let min_field = spelling.name("minimum_ring_size", "minRingSize");
    let max_field = spelling.name("maximum_ring_size", "maxRingSize");
    let mut ok = true;
    for (field, v) in [(min_field, min_ring_size), (max_field, max_ring_size)] {
        if v == 0 || v > MAX_RING_SIZE {
            c.at(field, |c| {
                c.fail_value(v, "must be in the range of 1 to 8388608")
            });
            ok = false;
        }
    }
    if ok && min_ring_size > max_ring_size {
        c.at(min_field, |c| {
            c.fail_value(
                min_ring_size,
                format!("is above {max_field} {max_ring_size}"),
            )
        });
        ok = false;
    }
    ok.then_some(LbPolicy::RingHash {
        min_ring_size,
        max_ring_size,
    })
}

/// A Maglev policy with `table_size` (default 65537), which must be a prime
/// up to 5000011 as Envoy requires.
fn maglev(c: &mut Check, table_size: Option<u64>) -> Option<LbPolicy> {
    let table_size = table_size.unwrap_or(DEFAULT_TABLE_SIZE);
    if (MaglevConfig { table_size }).validate().is_err() {
        c.at("table_size", |c| {
            c.fail_value(
                table_size,
                format!("must be a prime number up to {MAX_TABLE_SIZE}"),
            )
        });
        return None;
    }
    Some(LbPolicy::Maglev { table_size })
}

/// A least request policy choosing among `choice_count` endpoints (default
/// 2); fewer than 2 is refused at `field`. (More than 10 is kept here and
/// capped by the policy.)
fn least_request(c: &mut Check, field: &str, choice_count: Option<u32>) -> LbPolicy {
    let choice_count = choice_count.unwrap_or(2);
    if choice_count < 2 {
        c.at(field, |c| c.fail_value(choice_count, "must be at least 2"));
    }
    LbPolicy::LeastRequest { choice_count }
}

/// Records that a policy list nests deeper than [`MAX_POLICY_DEPTH`].
fn too_deep(c: &mut Check, depth: usize) -> bool {
    if depth > MAX_POLICY_DEPTH {
        c.fail("is nested too deeply");
    }
    depth > MAX_POLICY_DEPTH
}

fn legacy_policy(c: &mut Check, cl: &Cluster) -> Option<LbPolicy> {
    use cpb::cluster::ring_hash_lb_config::HashFunction;
    use cpb::cluster::LbConfig;
    use cpb::cluster::LbPolicy as P;
    match P::try_from(cl.lb_policy) {
        Ok(P::RoundRobin) => Some(LbPolicy::RoundRobin),
        Ok(P::RingHash) => {
            let cfg = match &cl.lb_config {
                Some(LbConfig::RingHashLbConfig(r)) => Some(r),
                _ => None,
            };
            c.at("ring_hash_lb_config", |c| {
                let Some(r) = cfg else {
                    return ring_sizes(c, None, None, Spelling::Proto);
                };
                if r.hash_function != HashFunction::XxHash as i32 {
                    c.at("hash_function", |c| {
                        c.fail_value(r.hash_function, "invalid hash function (only XX_HASH)")
                    });
                }
                ring_sizes(
                    c,
                    r.minimum_ring_size.as_ref().map(|v| v.value),
                    r.maximum_ring_size.as_ref().map(|v| v.value),
                    Spelling::Proto,
                )
            })
        }
        Ok(P::Maglev) if c.options().maglev => {
            let size = match &cl.lb_config {
                Some(LbConfig::MaglevLbConfig(m)) => m.table_size.as_ref().map(|v| v.value),
                _ => None,
            };
            c.at("maglev_lb_config", |c| maglev(c, size))
        }
        Ok(P::LeastRequest) => {
            let choice_count = match &cl.lb_config {
                Some(LbConfig::LeastRequestLbConfig(l)) => l.choice_count.as_ref().map(|v| v.value),
                _ => None,
            };
            Some(least_request(
                c,
                "least_request_lb_config.choice_count",
                choice_count,
            ))
        }
        _ => {
            c.at("lb_policy", |c| {
                c.fail_value(cl.lb_policy, "LB policy is not supported")
            });
            None
        }
    }
}

/// A TypedStruct entry of a policy list: the policy its type URL names,
/// its `value` (`{}` when absent) read as that policy's service-config JSON
/// config (see [`named_policy`]); an error (`Some(None)`) when the type URL
/// names nothing, or `None` (try the next entry) when the name is unknown.
fn struct_policy(
    c: &mut Check,
    any: &envoy_types::pb::google::protobuf::Any,
    depth: usize,
) -> Option<Option<LbPolicy>> {
    let t = match <TypedStruct as prost::Message>::decode(any.value.as_slice()) {
        Ok(t) => t,
        Err(e) => {
            c.fail(format!(
                "cannot be decoded as {}: {e}",
                type_name(&any.type_url)
            ));
            return Some(None);
        }
    };
    let Some(name) = t.name() else {
        c.at("type_url", |c| c.fail_value(&t.type_url, "names no policy"));
        return Some(None);
    };
    let config = t.config();
    c.at("value", |c| named_policy(c, name, &config, depth))
}

/// The policy gRPC's LB policy registry knows as `name`, with `config` (a
/// JSON object) as its service-config JSON config, the way C-core reads a
/// TypedStruct: the built-ins tether runs (`round_robin`, `pick_first`,
/// `ring_hash_experimental`, `weighted_round_robin`,
/// `xds_wrr_locality_experimental`, and grpc-go's
/// `least_request_experimental`) become their own [`LbPolicy`] with the
/// proto path's rules; the xDS tree's internal policies
/// ([`TREE_INTERNAL`](crate::lb_config::registry::TREE_INTERNAL)) are refused; any
/// other name is a custom policy of the channel's registry (gRFC A52).
/// As in C-core, unknown fields are ignored and `null` counts as absent.
/// `Some(None)` is an error (recorded on `c`), `None` an unknown name.
fn named_policy(
    c: &mut Check,
    name: &str,
    config: &serde_json::Value,
    depth: usize,
) -> Option<Option<LbPolicy>> {
    use crate::lb_config::registry::TREE_INTERNAL;
    use envoy_types::pb::google::protobuf::{BoolValue, FloatValue};
    use lbp::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin;
    let mut fields = JsonFields { config, ok: true };
    let policy = match name {
        // Its config is ignored, as C-core ignores it.
        "round_robin" => Some(LbPolicy::RoundRobin),
        "pick_first" => {
            let shuffle = fields.bool(c, "shuffleAddressList");
            Some(LbPolicy::PickFirst {
                shuffle: shuffle.unwrap_or(false),
            })
        }
        "ring_hash_experimental" => {
            let min = fields.uint(c, "minRingSize", u64::MAX);
            let max = fields.uint(c, "maxRingSize", u64::MAX);
            if !fields.ok {
                return Some(None);
            }
            ring_sizes(c, min, max, Spelling::Json)
        }
        "least_request_experimental" => {
            let choice_count = fields.uint(c, "choiceCount", u32::MAX.into());
            Some(least_request(
                c,
                "choiceCount",
                choice_count.map(|n| n as u32),
            ))
        }
        "weighted_round_robin" => {
            let w = ClientSideWeightedRoundRobin {
                enable_oob_load_report: fields
                    .bool(c, "enableOobLoadReport")
                    .map(|value| BoolValue { value }),
                oob_reporting_period: fields.duration(c, "oobReportingPeriod"),
                blackout_period: fields.duration(c, "blackoutPeriod"),
                weight_expiration_period: fields.duration(c, "weightExpirationPeriod"),
                weight_update_period: fields.duration(c, "weightUpdatePeriod"),
                error_utilization_penalty: fields
                    .float(c, "errorUtilizationPenalty")
                    .map(|value| FloatValue { value }),
                ..Default::default()
            };
            if !fields.ok {
                return Some(None);
            }
            super::weighted_round_robin::parse_as(c, &w, Spelling::Json)
                .map(LbPolicy::WeightedRoundRobin)
        }
        "xds_wrr_locality_experimental" => {
            let child = c.at("childPolicy", |c| match config.get("childPolicy") {
                None | Some(serde_json::Value::Null) => {
                    c.fail("field not present");
                    None
                }
                Some(list) => policy_list(c, list, depth + 1),
            });
            child.map(|ch| LbPolicy::WrrLocality(Box::new(ch)))
        }
        _ if TREE_INTERNAL.contains(&name) => {
            c.fail(format!(
                "policy {name} is internal to the xDS LB tree and cannot be a cluster's policy"
            ));
            None
        }
        _ => {
            let builder = c.options().policies.get(name)?.clone();
            match CustomPolicy::parse(&builder, config.clone()) {
                Ok(p) => Some(LbPolicy::Custom(p)),
                Err(e) => {
                    c.fail(format!("policy {name} refused its config: {e}"));
                    None
                }
            }
        }
    };
    Some(policy.filter(|_| fields.ok))
}

/// A service-config `childPolicy` list (of `{"<name>": {config}}`
/// objects): the first policy [`named_policy`] knows, as C-core's LB
/// policy registry picks it; a malformed entry before it, or none known,
/// is an error.
fn policy_list(c: &mut Check, list: &serde_json::Value, depth: usize) -> Option<LbPolicy> {
    if too_deep(c, depth) {
        return None;
    }
    let Some(entries) = list.as_array() else {
        c.fail_value(JsonText(list), "is not an array");
        return None;
    };
    let mut tried = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let only = entry
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next());
        let Some((name, config)) = only else {
            c.index(i, |c| {
                c.fail_value(JsonText(entry), "must be an object naming one policy")
            });
            return None;
        };
        let found = c.index(i, |c| {
            c.at(name, |c| {
                if !config.is_object() {
                    c.fail_value(JsonText(config), "is not an object");
                    return Some(None);
                }
                named_policy(c, name, config, depth)
            })
        });
        match found {
            Some(policy) => return policy,
            None => tried.push(name.as_str()),
        }
    }
    c.fail(format!(
        "no supported load balancing policy in the list (tried: {})",
        tried.join(", ")
    ));
    None
}

/// A service config's `loadBalancingConfig` list (gRPC's
/// `[{"<name>": {config}}, ...]`) as a channel without xDS reads it: the
/// first policy gRPC's registry and `options`' custom policies know, with
/// its config checked by the same rules a TypedStruct's `value` meets.
/// An error names the field and the value
/// (`loadBalancingConfig[0].pick_first.shuffleAddressList: "yes" is not a
/// boolean`), or lists the policies tried when none is known.
pub fn parse_load_balancing_config(
    list: &serde_json::Value,
    options: &super::ValidationOptions,
) -> Result<LbPolicy, Vec<super::FieldError>> {
    let mut c = Check::with_options(options.clone());
    let policy = c.at("loadBalancingConfig", |c| policy_list(c, list, 0));
    match policy {
        Some(p) if c.errors.is_empty() => Ok(p),
        _ => Err(std::mem::take(&mut c.errors)),
    }
}

/// A JSON value shown as JSON in errors.
struct JsonText<'a>(&'a serde_json::Value);

impl std::fmt::Debug for JsonText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Reads the fields of a service-config JSON config object the way C-core's
/// JSON loader does: a field absent or `null` is unset, numbers may also
/// be written as strings, durations only as protobuf-JSON strings
/// (`"1.5s"`). A field of the wrong type is recorded at its name, with its
/// value, and clears `ok`.
struct JsonFields<'a> {
    config: &'a serde_json::Value,
    ok: bool,
}

impl JsonFields<'_> {
    /// Field `key` as `read` makes it, or `problem` when it cannot.
    fn get<T>(
        &mut self,
        c: &mut Check,
        key: &str,
        problem: &str,
        read: impl FnOnce(&serde_json::Value) -> Option<T>,
    ) -> Option<T> {
        let v = self.config.get(key).filter(|v| !v.is_null())?;
        let value = read(v);
        if value.is_none() {
            c.at(key, |c| c.fail_value(JsonText(v), problem));
            self.ok = false;
        }
        value
    }

    fn bool(&mut self, c: &mut Check, key: &str) -> Option<bool> {
        self.get(c, key, "is not a boolean", serde_json::Value::as_bool)
    }

    /// A whole number up to `max` (a TypedStruct's numbers are doubles).
    fn uint(&mut self, c: &mut Check, key: &str, max: u64) -> Option<u64> {
        let problem = match max {
            u64::MAX => "is not a non-negative integer".to_owned(),
            _ => format!("is not an integer in the range of 0 to {max}"),
        };
        self.get(c, key, &problem, |v| {
            let whole =
                |f: f64| (f >= 0.0 && f.fract() == 0.0 && f < 2f64.powi(64)).then_some(f as u64);
            match v {
                serde_json::Value::Number(n) => n.as_u64().or_else(|| n.as_f64().and_then(whole)),
                serde_json::Value::String(s) => s.trim().parse::<u64>().ok(),
                _ => None,
            }
            .filter(|n| *n <= max)
        })
    }

    fn float(&mut self, c: &mut Check, key: &str) -> Option<f32> {
        self.get(c, key, "is not a number", |v| match v {
            serde_json::Value::Number(n) => n.as_f64().map(|f| f as f32),
            serde_json::Value::String(s) => s.trim().parse::<f32>().ok(),
            _ => None,
        })
    }

    /// A protobuf-JSON duration string (`"10s"`, `"0.25s"`), read by
    /// the same parser as tether-control's files.
    fn duration(
        &mut self,
        c: &mut Check,
        key: &str,
    ) -> Option<envoy_types::pb::google::protobuf::Duration> {
        let v = self.config.get(key).filter(|v| !v.is_null())?;
        let parsed = match v.as_str() {
            Some(text) => tether_core::duration::parse(text).map_err(|e| e.to_string()),
            None => Err("is not a duration string like \"1.5s\"".to_owned()),
        };
        match parsed {
            Ok(d) => Some(envoy_types::pb::google::protobuf::Duration {
                // Both fit: parse refuses more than 315576000000 s.
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            }),
            Err(problem) => {
                c.at(key, |c| c.fail_value(JsonText(v), problem));
                self.ok = false;
                None
            }
        }
    }
}

/// The first supported policy of a `load_balancing_policy` list.
fn typed_policy(c: &mut Check, p: &cpb::LoadBalancingPolicy, depth: usize) -> Option<LbPolicy> {
    if too_deep(c, depth) {
        return None;
    }
    for (i, pol) in p.policies.iter().enumerate() {
        let Some(any) = pol
            .typed_extension_config
            .as_ref()
            .and_then(|e| e.typed_config.as_ref())
        else {
            continue;
        };
        let name = type_name(&any.type_url);
        let found = c.at("policies", |c| {
            c.index(i, |c| {
                c.at("typed_extension_config.typed_config", |c| {
                    if name == lbp::round_robin::v3::RoundRobin::full_name() {
                        Some(Some(LbPolicy::RoundRobin))
                    } else if name == lbp::ring_hash::v3::RingHash::full_name() {
                        let r = c.unpack::<lbp::ring_hash::v3::RingHash>(any)?;
                        if r.hash_function
                            != lbp::ring_hash::v3::ring_hash::HashFunction::XxHash as i32
                            && r.hash_function
                                != lbp::ring_hash::v3::ring_hash::HashFunction::DefaultHash as i32
                        {
                            c.at("hash_function", |c| {
                                c.fail_value(r.hash_function, "invalid hash function")
                            });
                        }
                        Some(ring_sizes(
                            c,
                            r.minimum_ring_size.as_ref().map(|v| v.value),
                            r.maximum_ring_size.as_ref().map(|v| v.value),
                            Spelling::Proto,
                        ))
                    } else if c.options().maglev && name == lbp::maglev::v3::Maglev::full_name() {
                        let m = c.unpack::<lbp::maglev::v3::Maglev>(any)?;
                        Some(maglev(c, m.table_size.as_ref().map(|v| v.value)))
                    } else if name == lbp::least_request::v3::LeastRequest::full_name() {
                        let l = c.unpack::<lbp::least_request::v3::LeastRequest>(any)?;
                        let choice_count = l.choice_count.as_ref().map(|v| v.value);
                        Some(Some(least_request(c, "choice_count", choice_count)))
                    } else if name == lbp::pick_first::v3::PickFirst::full_name() {
                        let f = c.unpack::<lbp::pick_first::v3::PickFirst>(any)?;
                        Some(Some(LbPolicy::PickFirst {
                            shuffle: f.shuffle_address_list,
                        }))
                    } else if name
                        == lbp::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin::full_name()
                    {
                        let w = c.unpack::<
                            lbp::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin,
                        >(any)?;
                        Some(
                            super::weighted_round_robin::parse(c, &w)
                                .map(LbPolicy::WeightedRoundRobin),
                        )
                    } else if name == TypedStruct::full_name() || name == UDPA_TYPED_STRUCT {
                        struct_policy(c, any, depth)
                    } else if name == lbp::wrr_locality::v3::WrrLocality::full_name() {
                        let w = c.unpack::<lbp::wrr_locality::v3::WrrLocality>(any)?;
                        let child = c.at("endpoint_picking_policy", |c| {
                            match &w.endpoint_picking_policy {
                                Some(p) => typed_policy(c, p, depth + 1),
                                None => {
                                    c.fail("field not present");
                                    None
                                }
                            }
                        });
                        Some(child.map(|ch| LbPolicy::WrrLocality(Box::new(ch))))
                    } else {
                        // Not supported: try the next entry.
                        None
                    }
                })
            })
        });
        if let Some(policy) = found {
            return policy;
        }
    }
    c.fail("no supported load balancing policy in the list");
    None
}
