//! Virtual hosts, their routes, match conditions and load balancer
//! policies with each strategy's settings.

use std::time::Duration;

use serde::Deserialize;

use tether_xds::lb_config::weighted_round_robin::Settings as WrrSettings;
use tether_xds::resource::endpoint::HealthSet;

use super::field::{CookieField, DurationField, FormatField, HealthField};
use super::one;
use crate::fault::FaultSpec;
use crate::retry::RetryPolicySpec;

/// A virtual host.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VirtualHostSpec {
    /// Its name; proxyless clients dial `xds:///<name>`.
    pub name: String,
    /// Host names it serves (default: the name). `*` matches any.
    #[serde(default)]
    pub domains: Vec<String>,
    /// Routes, first match wins.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    /// Fault injection for every route of the host without its own.
    #[serde(default)]
    pub fault: Option<FaultSpec>,
}

/// A route.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Match conditions, all of which must hold (default: prefix `/`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Services to send to, by weight.
    pub services: Vec<RouteService>,
    /// How to pick an endpoint and keep sessions.
    #[serde(default, rename = "loadBalancerPolicy")]
    pub load_balancer_policy: LoadBalancerPolicy,
    /// Fault injection for this route (replacing the virtual host's).
    #[serde(default)]
    pub fault: Option<FaultSpec>,
    /// Retries of this route's calls.
    #[serde(default, rename = "retryPolicy")]
    pub retry_policy: Option<RetryPolicySpec>,
}

/// A match condition (Contour's `conditions` entries).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Path prefix.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Exact path.
    #[serde(default)]
    pub path: Option<String>,
    /// A header condition.
    #[serde(default)]
    pub header: Option<HeaderCondition>,
}

/// A header condition; exactly one of the tests is set.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeaderCondition {
    /// Header name.
    pub name: String,
    /// Value equals.
    #[serde(default)]
    pub exact: Option<String>,
    /// Value does not equal.
    #[serde(default, rename = "notexact")]
    pub not_exact: Option<String>,
    /// Value contains.
    #[serde(default)]
    pub contains: Option<String>,
    /// Value does not contain.
    #[serde(default, rename = "notcontains")]
    pub not_contains: Option<String>,
    /// Header is present.
    #[serde(default)]
    pub present: Option<bool>,
    /// Header is absent.
    #[serde(default, rename = "notpresent")]
    pub not_present: Option<bool>,
}

/// A weighted service of a route.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteService {
    /// A service name from `services`.
    pub name: String,
    /// Relative weight (default 1).
    #[serde(default = "one")]
    pub weight: u32,
}

/// Contour's load balancer strategies plus `Session`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// Round robin (default).
    #[default]
    RoundRobin,
    /// Random (proxyless clients get round robin).
    Random,
    /// Least request (Envoy's LEAST_REQUEST, gRPC's `least_request`, gRFC
    /// A48) with `choiceCount` draws; Contour's name, `LeastRequest`
    /// accepted too.
    #[serde(rename = "WeightedLeastRequest", alias = "LeastRequest")]
    LeastRequest,
    /// Ring hash on a generated cookie (`X-Contour-Session-Affinity`).
    Cookie,
    /// Ring hash on request attributes (`requestHashPolicies`).
    RequestHash,
    /// Stateful session: a cookie naming the endpoint (A55), with
    /// `session` settings.
    Session,
    /// Client-side weighted round robin on the endpoints' ORCA load reports
    /// (gRFC A58), with `weightedRoundRobin` settings.
    WeightedRoundRobin,
    /// Pick first (gRFC A62): one endpoint while it works, with
    /// `shuffleAddressList`.
    PickFirst,
    /// A policy the client registered itself (gRFC A52), named in `custom`.
    Custom,
}

impl Strategy {
    /// The name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::RoundRobin => "RoundRobin",
            Strategy::Random => "Random",
            Strategy::LeastRequest => "WeightedLeastRequest",
            Strategy::Cookie => "Cookie",
            Strategy::RequestHash => "RequestHash",
            Strategy::Session => "Session",
            Strategy::WeightedRoundRobin => "WeightedRoundRobin",
            Strategy::PickFirst => "PickFirst",
            Strategy::Custom => "Custom",
        }
    }
}

/// `loadBalancerPolicy`.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct LoadBalancerPolicy {
    /// The strategy.
    #[serde(default)]
    pub strategy: Strategy,
    /// For `RequestHash`: what to hash, in order.
    #[serde(default, rename = "requestHashPolicies")]
    pub request_hash_policies: Vec<RequestHashPolicy>,
    /// For `Session`: the cookie and the cluster's session settings.
    #[serde(default)]
    pub session: Option<SessionSpec>,
    /// For `WeightedLeastRequest`: endpoints drawn per pick, 2 to 10
    /// (default 2).
    #[serde(default, rename = "choiceCount")]
    pub choice_count: Option<u32>,
    /// For `WeightedRoundRobin`: A58's settings, each defaulting as in gRPC.
    #[serde(default, rename = "weightedRoundRobin")]
    pub weighted_round_robin: Option<WeightedRoundRobinSpec>,
    /// For `PickFirst`: shuffle the endpoints before picking (A62; default
    /// false), so clients spread over them.
    #[serde(default, rename = "shuffleAddressList")]
    pub shuffle_address_list: Option<bool>,
    /// For `Custom`: the client's policy and its config.
    #[serde(default)]
    pub custom: Option<CustomPolicySpec>,
}

/// `weightedRoundRobin` of a `WeightedRoundRobin` strategy: the fields of
/// `ClientSideWeightedRoundRobin` gRPC reads.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct WeightedRoundRobinSpec {
    /// Weights from out-of-band ORCA streams instead of per-call trailers
    /// (default false).
    #[serde(default, rename = "enableOobLoadReport")]
    pub enable_oob_load_report: Option<bool>,
    /// The interval asked of out-of-band streams (default 10 s).
    #[serde(default, rename = "oobReportingPeriod")]
    pub oob_reporting_period: Option<DurationField>,
    /// How long an endpoint reports before its weight counts (default 10 s).
    #[serde(default, rename = "blackoutPeriod")]
    pub blackout_period: Option<DurationField>,
    /// How long a weight lasts without a new report (default 180 s).
    #[serde(default, rename = "weightExpirationPeriod")]
    pub weight_expiration_period: Option<DurationField>,
    /// How often clients recompute the weights (default 1 s; clients raise
    /// anything below 0.1 s to it).
    #[serde(default, rename = "weightUpdatePeriod")]
    pub weight_update_period: Option<DurationField>,
    /// How much errors per query add to utilization (default 1, at least 0).
    #[serde(default, rename = "errorUtilizationPenalty")]
    pub error_utilization_penalty: Option<f64>,
}

impl WeightedRoundRobinSpec {
    /// The settings, gRPC's defaults filled in (the cluster carries them
    /// all, so routes writing the same settings differently agree).
    pub fn settings(&self) -> WrrSettings {
        let mut s = WrrSettings::default();
        if let Some(v) = self.enable_oob_load_report {
            s.enable_oob_load_report = v;
        }
        if let Some(v) = self.oob_reporting_period {
            s.oob_reporting_period = v.0;
        }
        if let Some(v) = self.blackout_period {
            s.blackout_period = v.0;
        }
        if let Some(v) = self.weight_expiration_period {
            s.weight_expiration_period = v.0;
        }
        if let Some(v) = self.weight_update_period {
            s.weight_update_period = v.0;
        }
        // Checked finite as an f32 by `validate`.
        if let Some(v) = self.error_utilization_penalty {
            s.error_utilization_penalty = v as f32;
        }
        s
    }
}

/// `custom` of a `Custom` strategy: a load balancing policy the client
/// registered (gRFC A52), sent as an `xds.type.v3.TypedStruct`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CustomPolicySpec {
    /// The name the client registered the policy under.
    pub policy: String,
    /// The policy's config, a map (default `{}`).
    #[serde(default = "empty_map")]
    pub config: serde_json::Value,
}

fn empty_map() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// One of Contour's `requestHashPolicies`; exactly one source is set.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RequestHashPolicy {
    /// Stop here when this entry produced a hash.
    #[serde(default)]
    pub terminal: bool,
    /// Hash a header.
    #[serde(default, rename = "headerHashOptions")]
    pub header_hash_options: Option<HeaderHashOptions>,
    /// Hash a query parameter (Envoy only; gRPC ignores it).
    #[serde(default, rename = "queryParameterHashOptions")]
    pub query_parameter_hash_options: Option<QueryParameterHashOptions>,
    /// Hash the client's IP (Envoy only; gRPC ignores it).
    #[serde(default, rename = "hashSourceIP")]
    pub hash_source_ip: bool,
}

/// `headerHashOptions`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeaderHashOptions {
    /// The header to hash.
    #[serde(rename = "headerName")]
    pub header_name: String,
}

/// `queryParameterHashOptions`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QueryParameterHashOptions {
    /// The parameter to hash.
    #[serde(rename = "parameterName")]
    pub parameter_name: String,
}

/// `session` of a `Session` strategy.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// The session cookie: `{name, path, ttl, attributes}`, validated by
    /// tether-core's session configuration rules.
    pub cookie: CookieField,
    /// Envoy's `strict`: a cookie naming an unusable endpoint gets 503.
    #[serde(default)]
    pub strict: bool,
    /// Endpoint health statuses a session stays on (default UNKNOWN, HEALTHY).
    #[serde(default, rename = "overrideHostStatus")]
    pub override_host_status: Option<Vec<HealthField>>,
    /// How long an unused session keeps its connection (proxyless; default 1 h).
    #[serde(default, rename = "idleTimeout")]
    pub idle_timeout: Option<DurationField>,
    /// The cookie format the tether plugin writes in Envoy (`envoy`,
    /// `grpc` for C-core's, `legacy`, `sealed` (with `keysFile`); default
    /// `envoy`). Only when some
    /// Envoy runs the plugin (`sessionFilter: plugin`): Envoy's own filter
    /// writes only its own format, and proxyless clients choose theirs.
    #[serde(default)]
    pub format: Option<FormatField>,
    /// A file of base64 secrets, one a line, the first signs (`envoy`) or
    /// seals (`sealed`, which needs it), all verify or open; read at start
    /// and on every change (rotation without a restart), never logged.
    /// Relative to the configuration file's directory.
    #[serde(default, rename = "keysFile")]
    pub keys_file: Option<String>,
    /// The secrets read from `keysFile` (filled in when the file is loaded).
    #[serde(skip)]
    pub keys: crate::session_keys::SessionKeys,
}

/// The cluster-level settings a `Session` route asks of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionClusterSettings {
    /// `override_host_status`.
    pub override_host_status: HealthSet,
    /// `idle_timeout`, if given.
    pub idle_timeout: Option<Duration>,
}

impl SessionSpec {
    /// The settings the service's session cluster gets.
    pub fn cluster_settings(&self) -> SessionClusterSettings {
        SessionClusterSettings {
            override_host_status: match &self.override_host_status {
                None => HealthSet::default_override(),
                Some(list) => list.iter().map(|h| h.0).collect(),
            },
            idle_timeout: self.idle_timeout.map(|d| d.0),
        }
    }
}
