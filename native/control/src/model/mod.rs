//! The control plane's YAML file: services with their endpoints, virtual
//! hosts with routes, and per-route affinity in Contour's vocabulary
//! (`loadBalancerPolicy.strategy`: `RoundRobin`, `Random`,
//! `WeightedLeastRequest` with an optional `choiceCount`, `Cookie`,
//! `RequestHash` with `requestHashPolicies`, `Session` for a stateful
//! session cookie, `WeightedRoundRobin` with optional `weightedRoundRobin`
//! settings, `PickFirst` with an optional `shuffleAddressList`, or `Custom`
//! naming a policy the client registered in `custom`), and aggregate services that fail over between other
//! services (`aggregate: [primary, fallback]`). An optional `envoy` section
//! chooses what Envoy clients get for `Session` routes: Envoy's own
//! `stateful_session` filter (`sessionFilter: native`, the default) or the
//! tether plugin (`sessionFilter: plugin`, with `plugin.filename`), which
//! writes the cookie in the route's `session.format`; `envoy.nodes` gives
//! single Envoys (by node ID) another filter or listener. See the crate README
//! for the format with an example.
//!
//! Parsing rejects unknown fields and bad values with the field's path, line
//! and column; [`Config::validate`] then checks what crosses fields (service
//! references, strategy settings, the aggregate graph) and names the field's
//! path, to which [`Config::parse`] adds the line and column.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

pub use crate::fault::FaultSpec;
pub use crate::retry::RetryPolicySpec;
use tether_core::http::set_cookie::CookieSpec;

use tether_xds::lb_config::least_request::{DEFAULT_CHOICE_COUNT, MAX_CHOICE_COUNT};
use tether_xds::lb_config::weighted_round_robin::Settings as WrrSettings;
use tether_xds::resource::endpoint::{HealthSet, HealthStatus};

/// A problem with the configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelError {
    /// Not valid YAML, or a field of the wrong type, unknown or with a bad
    /// value; the message names the field path, line and column.
    Parse(String),
    /// A field that is wrong together with others.
    Invalid {
        /// Path of the field, e.g. `virtualhosts[0].routes[1].services[0].name`.
        field: String,
        /// The value as written.
        value: String,
        /// What is wrong.
        problem: String,
        /// Where the field is in the file, when the error came from
        /// [`Config::parse`] and the field could be found in the text.
        location: Option<Location>,
    },
}

/// A position in the file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Line.
    pub line: usize,
    /// Column.
    pub column: usize,
}

impl ModelError {
    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl fmt::Debug,
        problem: impl Into<String>,
    ) -> Self {
        ModelError::Invalid {
            field: field.into(),
            value: format!("{value:?}"),
            problem: problem.into(),
            location: None,
        }
    }

    /// Where in the file the error is, if known.
    pub fn location(&self) -> Option<Location> {
        match self {
            ModelError::Parse(_) => None,
            ModelError::Invalid { location, .. } => *location,
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::Parse(m) => f.write_str(m),
            ModelError::Invalid {
                field,
                value,
                problem,
                location,
            } => {
                write!(f, "{field}: {value} {problem}")?;
                // The same suffix the parser puts on syntax and type errors.
                if let Some(l) = location {
                    write!(f, " at line {} column {}", l.line, l.column)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ModelError {}

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where Envoy listens; omit it for proxyless clients only.
    #[serde(default)]
    pub listener: Option<ListenerSpec>,
    /// Virtual hosts; each is also a proxyless target (`xds:///<name>`).
    #[serde(default)]
    pub virtualhosts: Vec<VirtualHostSpec>,
    /// Services and their endpoints.
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    /// What Envoy clients get for `Session` routes (default: Envoy's own
    /// stateful_session filter). Proxyless clients are not affected.
    #[serde(default)]
    pub envoy: EnvoySpec,
}

/// The `envoy` section: how Envoy clients keep sessions.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct EnvoySpec {
    /// Which filter pins `Session` routes in Envoy.
    #[serde(default, rename = "sessionFilter")]
    pub session_filter: SessionFilter,
    /// The tether plugin's settings, for `sessionFilter: plugin` (here or
    /// in one of `nodes`).
    #[serde(default)]
    pub plugin: Option<PluginSpec>,
    /// Envoys, by node ID, that get another session filter or listener
    /// than the rest: a fleet moving to the plugin one Envoy at a time, or
    /// Envoys sharing a host.
    #[serde(default)]
    pub nodes: Vec<EnvoyNodeSpec>,
}

impl Config {
    /// One line per `Session` route saying who reads the cookies written
    /// for it: by the plugin in Envoy (its `format`), by Envoy's own filter
    /// (always `envoy`); proxyless clients write their own format.
    pub fn session_notes(&self) -> Vec<String> {
        use tether_core::cookie::readers::explain;
        let mut notes = Vec::new();
        let native = self.envoy.session_filter == SessionFilter::Native
            || self
                .envoy
                .nodes
                .iter()
                .any(|n| n.session_filter == Some(SessionFilter::Native));
        for vh in &self.virtualhosts {
            for (i, route) in vh.routes.iter().enumerate() {
                let Some(session) = &route.load_balancer_policy.session else {
                    continue;
                };
                let at = format!("virtual host {:?} route {i}", vh.name);
                if self.envoy.uses_plugin() {
                    let format = session.format.map(|f| f.0).unwrap_or_default();
                    notes.push(format!(
                        "{at}: the plugin writes {}",
                        explain(format, false)
                    ));
                }
                if native {
                    notes.push(format!(
                        "{at}: Envoy's own filter writes {}",
                        explain(tether_core::Format::Envoy, false)
                    ));
                }
            }
        }
        notes
    }
}

impl EnvoySpec {
    /// Whether some Envoy (all of them, or one of `nodes`) runs the plugin.
    pub fn uses_plugin(&self) -> bool {
        self.session_filter == SessionFilter::Plugin
            || self
                .nodes
                .iter()
                .any(|n| n.session_filter == Some(SessionFilter::Plugin))
    }
}

/// One entry of `envoy.nodes`: what the Envoy with this node ID gets
/// instead of the file's settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EnvoyNodeSpec {
    /// The node ID in that Envoy's bootstrap (`node.id`).
    pub id: String,
    /// Its session filter (default: `envoy.sessionFilter`).
    #[serde(default, rename = "sessionFilter")]
    pub session_filter: Option<SessionFilter>,
    /// Its listener (default: the file's `listener`).
    #[serde(default)]
    pub listener: Option<ListenerSpec>,
}

/// The filter Envoy clients get for `Session` routes.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SessionFilter {
    /// Envoy's own `envoy.filters.http.stateful_session` (default).
    #[default]
    Native,
    /// The tether plugin (`envoy.filters.http.wasm` on V8) with Envoy's
    /// override_host load balancing policy on the session clusters.
    Plugin,
}

impl SessionFilter {
    /// The name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionFilter::Native => "native",
            SessionFilter::Plugin => "plugin",
        }
    }
}

/// `envoy.plugin`: where Envoy finds the tether plugin and how it hands the
/// session to Envoy's load balancer.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// The `.wasm` file as Envoy sees it (an absolute path);
    /// `tether-control --plugin FILE` overrides it.
    #[serde(default)]
    pub filename: Option<String>,
    /// The request header the plugin writes and the session clusters'
    /// override_host policy reads (default `x-tether-override-host`).
    #[serde(default, rename = "overrideHeader")]
    pub override_header: Option<String>,
}

/// The plugin's default override header.
pub const DEFAULT_OVERRIDE_HEADER: &str = "x-tether-override-host";

impl PluginSpec {
    /// The override header, lowercase, or the default.
    pub fn override_header(&self) -> String {
        self.override_header
            .as_deref()
            .unwrap_or(DEFAULT_OVERRIDE_HEADER)
            .to_ascii_lowercase()
    }
}

/// Settings given outside the file (on tether-control's command line);
/// they win over the file's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `envoy.plugin.filename` (`--plugin FILE`).
    pub plugin_filename: Option<String>,
}

impl Overrides {
    fn apply(&self, config: &mut Config) {
        if let Some(f) = &self.plugin_filename {
            config
                .envoy
                .plugin
                .get_or_insert_with(PluginSpec::default)
                .filename = Some(f.clone());
        }
    }
}

/// Envoy's listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerSpec {
    /// Listener name (default `tether-ingress`).
    #[serde(default = "default_listener_name")]
    pub name: String,
    /// IP address to bind (default `127.0.0.1`).
    #[serde(default = "default_listener_address")]
    pub address: std::net::IpAddr,
    /// Port to bind.
    pub port: u16,
}

fn default_listener_name() -> String {
    "tether-ingress".to_owned()
}

fn default_listener_address() -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
}

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

fn one() -> u32 {
    1
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

    /// A penalty that is negative, NaN or too large for the proto's float
    /// (gRPC NACKs a negative one).
    fn validate(&self, at: &str) -> Result<(), ModelError> {
        if let Some(p) = self.error_utilization_penalty {
            if !(p >= 0.0 && (p as f32).is_finite()) {
                return Err(ModelError::invalid(
                    format!("{at}.errorUtilizationPenalty"),
                    p,
                    "must be a finite number of at least 0",
                ));
            }
        }
        Ok(())
    }
}

/// The settings as the YAML names and writes them, in the file's order,
/// to say which one two routes disagree on.
fn wrr_fields(s: &WrrSettings) -> [(&'static str, String); 6] {
    let d = |d: Duration| tether_core::duration::display(d).to_string();
    [
        ("enableOobLoadReport", s.enable_oob_load_report.to_string()),
        ("oobReportingPeriod", d(s.oob_reporting_period)),
        ("blackoutPeriod", d(s.blackout_period)),
        ("weightExpirationPeriod", d(s.weight_expiration_period)),
        ("weightUpdatePeriod", d(s.weight_update_period)),
        (
            "errorUtilizationPenalty",
            s.error_utilization_penalty.to_string(),
        ),
    ]
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

impl CustomPolicySpec {
    /// A policy name of the characters gRPC allows in one, and a map.
    fn validate(&self, at: &str) -> Result<(), ModelError> {
        if !tether_xds::lb_config::registry::is_valid_name(&self.policy) {
            return Err(ModelError::invalid(
                format!("{at}.policy"),
                &self.policy,
                "must be a non-empty name of letters, digits, '_', '.' and '-' (as gRPC's policy names are)",
            ));
        }
        if !self.config.is_object() {
            return Err(ModelError::invalid(
                format!("{at}.config"),
                Raw(self.config.to_string()),
                "must be a map",
            ));
        }
        Ok(())
    }
}

/// A value shown as it is, unquoted, in an error.
struct Raw(String);

impl fmt::Debug for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
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
    /// `grpc` for C-core's, `legacy`; default `envoy`). Only when some
    /// Envoy runs the plugin (`sessionFilter: plugin`): Envoy's own filter
    /// writes only its own format, and proxyless clients choose theirs.
    #[serde(default)]
    pub format: Option<FormatField>,
}

/// A cookie format name (`envoy`, `grpc`, `legacy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatField(pub tether_core::cookie::Format);

impl TryFrom<String> for FormatField {
    type Error = String;
    fn try_from(v: String) -> Result<Self, String> {
        v.parse().map(FormatField).map_err(|e| e.to_string())
    }
}

/// A cookie specification (`{name, path, ttl, attributes}`) checked by
/// `tether_core::config::cookie_spec`, the same rules as every other
/// session configuration in tether.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieField(pub CookieSpec);

impl<'de> Deserialize<'de> for CookieField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = CookieField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a cookie: {name, path, ttl, attributes}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<CookieField, A::Error> {
                let mut fields = serde_json::Map::new();
                while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                    fields.insert(k, v);
                }
                // Failing here, inside the mapping, keeps the cookie's path and line.
                tether_core::config::cookie_spec(&serde_json::Value::Object(fields))
                    .map(CookieField)
                    .map_err(|e| serde::de::Error::custom(e.to_string()))
            }
        }
        d.deserialize_map(V)
    }
}

/// A duration as protobuf JSON writes it (`"60s"`, `"1.5s"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationField(pub Duration);

impl TryFrom<String> for DurationField {
    type Error = String;
    fn try_from(v: String) -> Result<Self, String> {
        tether_core::duration::parse(&v)
            .map(DurationField)
            .map_err(|e| format!("{v:?} {e}"))
    }
}

/// An EDS health status name (`HEALTHY`, `DRAINING`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HealthField(pub HealthStatus);

/// Deserializes a scalar through `TryFrom<String>`, failing inside the
/// scalar so the error carries the field's own path, line and column.
macro_rules! scalar_via_try_from {
    ($t:ty, $what:literal) => {
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$t, E> {
                        <$t>::try_from(v.to_owned()).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

scalar_via_try_from!(DurationField, "a duration such as \"60s\"");
scalar_via_try_from!(HealthField, "a health status such as HEALTHY");
scalar_via_try_from!(FormatField, "a cookie format: envoy, grpc or legacy");

impl TryFrom<String> for HealthField {
    type Error = String;
    fn try_from(v: String) -> Result<Self, String> {
        v.parse().map(HealthField).map_err(|()| {
            format!("{v:?} is not one of UNKNOWN, HEALTHY, UNHEALTHY, DRAINING, TIMEOUT, DEGRADED")
        })
    }
}

impl Default for HealthField {
    fn default() -> Self {
        HealthField(HealthStatus::Healthy)
    }
}

/// How Envoy talks to a service's endpoints.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 (default).
    #[default]
    Http1,
    /// HTTP/2 without TLS (gRPC backends).
    H2c,
}

/// A service.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Its name: the EDS resource name and the base of its cluster names.
    pub name: String,
    /// Protocol Envoy uses towards the endpoints.
    #[serde(default)]
    pub protocol: Protocol,
    /// Weights of localities (`region/zone/subzone` or a prefix of it); 1 when absent.
    #[serde(default, rename = "localityWeights")]
    pub locality_weights: BTreeMap<String, u32>,
    /// Endpoints.
    #[serde(default)]
    pub endpoints: Vec<EndpointSpec>,
    /// Makes this an aggregate service (gRFC A75, Envoy's
    /// `envoy.clusters.aggregate`): the services it fails over between, the
    /// first preferred while it has healthy endpoints. An aggregate service
    /// has no endpoints, locality weights or protocol of its own.
    #[serde(default)]
    pub aggregate: Option<Vec<String>>,
    /// Outlier detection for the service's clusters (gRFC A50; CDS
    /// `outlier_detection`).
    #[serde(default, rename = "outlierDetection")]
    pub outlier_detection: Option<OutlierDetectionSpec>,
    /// HTTP/2 keepalive on Envoy's connections to the endpoints (`h2c`
    /// services only). Proxyless clients set their own keepalive (gRPC
    /// takes it from the channel, not from xDS).
    #[serde(default)]
    pub keepalive: Option<KeepaliveSpec>,
    /// TLS to the endpoints for proxyless clients (gRFC A29): a CDS
    /// `transport_socket` naming the clients' bootstrap certificate
    /// provider instances.
    #[serde(default)]
    pub tls: Option<ServiceTlsSpec>,
}

/// `tls` of a service: what proxyless clients get as the cluster's
/// `UpstreamTlsContext`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServiceTlsSpec {
    /// The clients' certificate provider instance holding the roots.
    #[serde(default, rename = "caInstance")]
    pub ca_instance: String,
    /// Verify servers against the clients' system roots instead of a
    /// provider instance (gRFC A82's `system_root_certs`).
    #[serde(default, rename = "systemRootCerts")]
    pub system_root_certs: bool,
    /// The instance holding the client certificate (mTLS), if any.
    #[serde(default, rename = "identityInstance")]
    pub identity_instance: Option<String>,
    /// A server's certificate must have a SAN matching one of these (any
    /// certificate that chains when empty).
    #[serde(default, rename = "subjectAltNames")]
    pub subject_alt_names: Vec<SanMatcherSpec>,
    /// The same TLS for Envoy's clusters, from files on the Envoy hosts
    /// (Envoy has no certificate provider instances). A file that serves
    /// Envoy needs it, or `envoyPlaintext: true`.
    #[serde(default)]
    pub envoy: Option<EnvoyTlsFiles>,
    /// Envoy speaks plaintext to this service on purpose (the proxyless
    /// clients still use TLS): without it, a file that serves Envoy and
    /// gives a `tls` service no `tls.envoy` is refused.
    #[serde(default, rename = "envoyPlaintext")]
    pub envoy_plaintext: bool,
}

/// `tls.envoy`: the files an Envoy reads for a service's TLS.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EnvoyTlsFiles {
    /// The roots (PEM).
    #[serde(rename = "caFile")]
    pub ca_file: String,
    /// The client certificate chain (PEM), for mTLS.
    #[serde(default, rename = "certificateFile")]
    pub certificate_file: Option<String>,
    /// Its private key (PEM).
    #[serde(default, rename = "privateKeyFile")]
    pub private_key_file: Option<String>,
}

/// One SAN matcher: exactly one of `exact`, `prefix`, `suffix`,
/// `contains`, `regex`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct SanMatcherSpec {
    /// Equal (DNS rules: case-insensitive, wildcards in the SAN).
    #[serde(default)]
    pub exact: Option<String>,
    /// Starts with.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Ends with.
    #[serde(default)]
    pub suffix: Option<String>,
    /// Contains.
    #[serde(default)]
    pub contains: Option<String>,
    /// Matches the whole SAN (RE2 syntax).
    #[serde(default)]
    pub regex: Option<String>,
    /// Compare case-insensitively (not with `regex`).
    #[serde(default, rename = "ignoreCase")]
    pub ignore_case: bool,
}

impl SanMatcherSpec {
    /// The matcher's value: not empty (it would match every SAN, and
    /// Envoy's proto validation refuses it), a regex valid on its own.
    fn validate_values(&self, at: &str) -> Result<(), ModelError> {
        for (field, value) in [
            ("exact", &self.exact),
            ("prefix", &self.prefix),
            ("suffix", &self.suffix),
            ("contains", &self.contains),
            ("regex", &self.regex),
        ] {
            match value {
                Some(v) if v.is_empty() => {
                    return Err(ModelError::invalid(
                        format!("{at}.{field}"),
                        v,
                        "is empty (it would match every SAN)",
                    ))
                }
                Some(v) if field == "regex" => {
                    if let Err(e) = tether_xds::resource::route::full_match(v) {
                        return Err(ModelError::invalid(
                            format!("{at}.regex"),
                            v,
                            format!("is not a valid regex: {e}"),
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// `keepalive` of a service: Envoy's HTTP/2 `connection_keepalive`. A
/// connection whose PING is not answered within `timeout` is closed, so a
/// backend that stops answering without closing (a partition, a hung host)
/// is left within `interval` + `timeout` instead of when TCP gives up.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeepaliveSpec {
    /// How often a PING is sent on a connection.
    pub interval: DurationField,
    /// How long a PING may go unanswered.
    pub timeout: DurationField,
}

/// `outlierDetection` of a service: gRPC's settings (gRFC A50), each
/// defaulting as in gRPC. An algorithm runs when its block is present.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutlierDetectionSpec {
    /// How often ejections are decided (default 10 s).
    #[serde(default)]
    pub interval: Option<DurationField>,
    /// An ejection lasts this times the endpoint's ejection count (default 30 s).
    #[serde(default, rename = "baseEjectionTime")]
    pub base_ejection_time: Option<DurationField>,
    /// Longest ejection, unless `baseEjectionTime` is longer (default 300 s).
    #[serde(default, rename = "maxEjectionTime")]
    pub max_ejection_time: Option<DurationField>,
    /// Endpoints ejected at most, in percent (default 10; one always may be).
    #[serde(default, rename = "maxEjectionPercent")]
    pub max_ejection_percent: Option<u32>,
    /// The success-rate algorithm.
    #[serde(default, rename = "successRate")]
    pub success_rate: Option<SuccessRateSpec>,
    /// The failure-percentage algorithm.
    #[serde(default, rename = "failurePercentage")]
    pub failure_percentage: Option<FailurePercentageSpec>,
}

/// `outlierDetection.successRate`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct SuccessRateSpec {
    /// Threshold: mean − stdev × stdevFactor / 1000 (default 1900).
    #[serde(default, rename = "stdevFactor")]
    pub stdev_factor: Option<u32>,
    /// Chance in percent that an outlier is ejected (default 100).
    #[serde(default, rename = "enforcementPercentage")]
    pub enforcement_percentage: Option<u32>,
    /// Endpoints with enough calls needed to run (default 5).
    #[serde(default, rename = "minimumHosts")]
    pub minimum_hosts: Option<u32>,
    /// Calls in an interval for an endpoint to count (default 100).
    #[serde(default, rename = "requestVolume")]
    pub request_volume: Option<u32>,
}

/// `outlierDetection.failurePercentage`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct FailurePercentageSpec {
    /// Failure percentage above which an endpoint is ejected (default 85).
    #[serde(default)]
    pub threshold: Option<u32>,
    /// Chance in percent that an outlier is ejected (default 100).
    #[serde(default, rename = "enforcementPercentage")]
    pub enforcement_percentage: Option<u32>,
    /// Endpoints with enough calls needed to run (default 5).
    #[serde(default, rename = "minimumHosts")]
    pub minimum_hosts: Option<u32>,
    /// Calls in an interval for an endpoint to count (default 50).
    #[serde(default, rename = "requestVolume")]
    pub request_volume: Option<u32>,
}

impl OutlierDetectionSpec {
    /// The settings, gRPC's defaults filled in.
    pub fn settings(&self) -> tether_xds::lb_config::outlier_detection::OutlierDetectionConfig {
        use tether_xds::lb_config::outlier_detection as od;
        let mut c = od::OutlierDetectionConfig::default();
        if let Some(v) = self.interval {
            c.interval = v.0;
        }
        if let Some(v) = self.base_ejection_time {
            c.base_ejection_time = v.0;
        }
        if let Some(v) = self.max_ejection_time {
            c.max_ejection_time = v.0;
        }
        if let Some(v) = self.max_ejection_percent {
            c.max_ejection_percent = v;
        }
        c.success_rate = self.success_rate.map(|s| {
            let mut sr = od::SuccessRateEjection::default();
            sr.stdev_factor = s.stdev_factor.unwrap_or(sr.stdev_factor);
            sr.enforcement_percentage = s
                .enforcement_percentage
                .unwrap_or(sr.enforcement_percentage);
            sr.minimum_hosts = s.minimum_hosts.unwrap_or(sr.minimum_hosts);
            sr.request_volume = s.request_volume.unwrap_or(sr.request_volume);
            sr
        });
        c.failure_percentage = self.failure_percentage.map(|f| {
            let mut fp = od::FailurePercentageEjection::default();
            fp.threshold = f.threshold.unwrap_or(fp.threshold);
            fp.enforcement_percentage = f
                .enforcement_percentage
                .unwrap_or(fp.enforcement_percentage);
            fp.minimum_hosts = f.minimum_hosts.unwrap_or(fp.minimum_hosts);
            fp.request_volume = f.request_volume.unwrap_or(fp.request_volume);
            fp
        });
        c
    }

    /// Percentages above 100, named by their path under `at`.
    fn validate(&self, at: &str) -> Result<(), ModelError> {
        let mut checks = vec![("maxEjectionPercent", self.max_ejection_percent)];
        if let Some(s) = &self.success_rate {
            checks.push((
                "successRate.enforcementPercentage",
                s.enforcement_percentage,
            ));
        }
        if let Some(f) = &self.failure_percentage {
            checks.push(("failurePercentage.threshold", f.threshold));
            checks.push((
                "failurePercentage.enforcementPercentage",
                f.enforcement_percentage,
            ));
        }
        for (field, value) in checks {
            if let Some(v) = value.filter(|v| *v > 100) {
                return Err(ModelError::invalid(
                    format!("{at}.outlierDetection.{field}"),
                    v.to_string(),
                    "must be at most 100",
                ));
            }
        }
        Ok(())
    }
}

impl ServiceSpec {
    /// Whether this is an aggregate service.
    pub fn is_aggregate(&self) -> bool {
        self.aggregate.is_some()
    }

    /// The services an aggregate service names, in priority order (none for
    /// a service with endpoints).
    pub fn children(&self) -> &[String] {
        self.aggregate.as_deref().unwrap_or(&[])
    }
}

/// An endpoint.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// `ip:port` (`[v6]:port` for IPv6).
    pub address: SocketAddr,
    /// The endpoint's other addresses (A61).
    #[serde(default, rename = "additionalAddresses")]
    pub additional_addresses: Vec<SocketAddr>,
    /// Relative weight within its locality (default 1).
    #[serde(default = "one")]
    pub weight: u32,
    /// EDS health status (default HEALTHY).
    #[serde(default)]
    pub health: HealthField,
    /// Priority, 0 the most preferred (default 0).
    #[serde(default)]
    pub priority: u32,
    /// Locality as `region/zone/subzone` (default empty).
    #[serde(default)]
    pub locality: String,
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

impl Config {
    /// Whether Envoys get a listener from this file (the file's own, or a
    /// node's), and so route to its services.
    pub fn serves_envoy(&self) -> bool {
        self.listener.is_some() || self.envoy.nodes.iter().any(|n| n.listener.is_some())
    }

    /// Parses and validates a configuration file's text.
    pub fn parse(text: &str) -> Result<Config, ModelError> {
        Config::parse_with(text, &Overrides::default())
    }

    /// Parses a configuration file's text, applies `overrides` (settings
    /// given on the command line) and validates the result.
    pub fn parse_with(text: &str, overrides: &Overrides) -> Result<Config, ModelError> {
        let mut config: Config =
            serde_yaml_ng::from_str(text).map_err(|e| ModelError::Parse(e.to_string()))?;
        overrides.apply(&mut config);
        config.validate().map_err(|mut e| {
            if let ModelError::Invalid {
                field, location, ..
            } = &mut e
            {
                *location = locate(text, field);
            }
            e
        })?;
        Ok(config)
    }

    /// Checks what single fields cannot: unique names, references, and the
    /// settings each strategy needs.
    pub fn validate(&self) -> Result<(), ModelError> {
        let mut services = HashSet::new();
        for (i, s) in self.services.iter().enumerate() {
            let at = format!("services[{i}]");
            if s.name.is_empty()
                || s.name.contains([';', ',', '/'])
                || s.name.contains(char::is_whitespace)
            {
                return Err(ModelError::invalid(
                    format!("{at}.name"),
                    &s.name,
                    "must be non-empty without ';', ',', '/' or spaces",
                ));
            }
            if !services.insert(s.name.as_str()) {
                return Err(ModelError::invalid(
                    format!("{at}.name"),
                    &s.name,
                    "is defined twice",
                ));
            }
            if let Some(od) = &s.outlier_detection {
                if s.is_aggregate() {
                    return Err(ModelError::invalid(
                        format!("{at}.outlierDetection"),
                        &s.name,
                        "belongs on the services an aggregate service names (gRPC applies it per underlying cluster)",
                    ));
                }
                od.validate(&at)?;
            }
            if let Some(t) = &s.tls {
                if s.is_aggregate() {
                    return Err(ModelError::invalid(
                        format!("{at}.tls"),
                        &s.name,
                        "belongs on the services an aggregate service names",
                    ));
                }
                if t.ca_instance.is_empty() && !t.system_root_certs {
                    return Err(ModelError::invalid(
                        format!("{at}.tls.caInstance"),
                        "",
                        "must name a certificate provider instance of the clients' bootstrap \
                         (or set systemRootCerts: true)",
                    ));
                }
                if t.envoy.is_some() && t.envoy_plaintext {
                    return Err(ModelError::invalid(
                        format!("{at}.tls.envoyPlaintext"),
                        true,
                        "cannot be set with tls.envoy (Envoy gets TLS from one or plaintext by the other)",
                    ));
                }
                if t.envoy.is_none() && !t.envoy_plaintext && self.serves_envoy() {
                    return Err(ModelError::invalid(
                        format!("{at}.tls.envoy"),
                        &s.name,
                        "is missing: Envoy would speak plaintext to a service whose proxyless clients \
                         use TLS (give tls.envoy the files on the Envoy hosts, or set \
                         envoyPlaintext: true if plaintext from Envoy is meant)",
                    ));
                }
                if let Some(e) = &t.envoy {
                    if e.ca_file.is_empty() {
                        return Err(ModelError::invalid(
                            format!("{at}.tls.envoy.caFile"),
                            "",
                            "must name the roots' file on the Envoy hosts",
                        ));
                    }
                    let (missing, with) = match (&e.certificate_file, &e.private_key_file) {
                        (Some(_), None) => ("privateKeyFile", "certificateFile"),
                        (None, Some(_)) => ("certificateFile", "privateKeyFile"),
                        _ => ("", ""),
                    };
                    if !missing.is_empty() {
                        return Err(ModelError::invalid(
                            format!("{at}.tls.envoy.{missing}"),
                            "",
                            format!("must be set with {with} (or neither, for TLS without a client certificate)"),
                        ));
                    }
                }
                if !t.ca_instance.is_empty() && t.system_root_certs {
                    return Err(ModelError::invalid(
                        format!("{at}.tls.systemRootCerts"),
                        "true",
                        "cannot be set with caInstance (the roots come from one or the other)",
                    ));
                }
                for (k, m) in t.subject_alt_names.iter().enumerate() {
                    let set: Vec<&str> = [
                        ("exact", &m.exact),
                        ("prefix", &m.prefix),
                        ("suffix", &m.suffix),
                        ("contains", &m.contains),
                        ("regex", &m.regex),
                    ]
                    .iter()
                    .filter(|(_, v)| v.is_some())
                    .map(|(k, _)| *k)
                    .collect();
                    if set.len() != 1 {
                        return Err(ModelError::invalid(
                            format!("{at}.tls.subjectAltNames[{k}]"),
                            set.join(", "),
                            "needs exactly one of exact, prefix, suffix, contains, regex",
                        ));
                    }
                    if m.regex.is_some() && m.ignore_case {
                        return Err(ModelError::invalid(
                            format!("{at}.tls.subjectAltNames[{k}].ignoreCase"),
                            true,
                            "cannot be combined with regex",
                        ));
                    }
                    m.validate_values(&format!("{at}.tls.subjectAltNames[{k}]"))?;
                }
                // A82 lets an empty list accept any certificate the system
                // trusts, which is almost never meant: any public CA could
                // then vouch for any endpoint of the service.
                if t.system_root_certs && t.subject_alt_names.is_empty() {
                    return Err(ModelError::invalid(
                        format!("{at}.tls.subjectAltNames"),
                        &s.name,
                        "must name the servers' SANs with systemRootCerts: true (without them any \
                         certificate from any publicly trusted CA is accepted)",
                    ));
                }
            }
            if let Some(k) = &s.keepalive {
                if s.protocol != Protocol::H2c {
                    return Err(ModelError::invalid(
                        format!("{at}.keepalive"),
                        &s.name,
                        "needs protocol: h2c (HTTP/2 PINGs keep the connection alive)",
                    ));
                }
                for (field, d) in [("interval", k.interval), ("timeout", k.timeout)] {
                    if d.0 < Duration::from_millis(1) {
                        return Err(ModelError::invalid(
                            format!("{at}.keepalive.{field}"),
                            format!("{}s", d.0.as_secs_f64()),
                            "must be at least 1ms (Envoy's bound)",
                        ));
                    }
                }
            }
            let mut addresses = HashSet::new();
            let mut priorities = std::collections::BTreeSet::new();
            for (j, e) in s.endpoints.iter().enumerate() {
                let eat = format!("{at}.endpoints[{j}]");
                if e.weight == 0 {
                    return Err(ModelError::invalid(
                        format!("{eat}.weight"),
                        0,
                        "must be greater than 0",
                    ));
                }
                for a in std::iter::once(&e.address).chain(&e.additional_addresses) {
                    if !addresses.insert(*a) {
                        return Err(ModelError::invalid(
                            format!("{eat}.address"),
                            a.to_string(),
                            "is listed twice in this service",
                        ));
                    }
                }
                if e.locality.split('/').count() > 3 {
                    return Err(ModelError::invalid(
                        format!("{eat}.locality"),
                        &e.locality,
                        "has more than region/zone/subzone",
                    ));
                }
                priorities.insert(e.priority);
            }
            if let Some(max) = priorities.iter().next_back() {
                if *max as usize + 1 != priorities.len() {
                    return Err(ModelError::invalid(
                        format!("{at}.endpoints"),
                        priorities.iter().collect::<Vec<_>>(),
                        "priorities must be contiguous from 0",
                    ));
                }
            }
            for (k, w) in &s.locality_weights {
                if *w == 0 {
                    return Err(ModelError::invalid(
                        format!("{at}.localityWeights.{k}"),
                        0,
                        "must be greater than 0",
                    ));
                }
            }
        }
        self.validate_aggregates()?;
        self.validate_envoy()?;
        let mut vhosts = HashSet::new();
        // Per service: the session settings and the route that set them.
        let mut session_settings: BTreeMap<&str, (SessionClusterSettings, String)> =
            BTreeMap::new();
        // Per service: the least request choice count and the route that set it.
        let mut choice_counts: BTreeMap<&str, (u32, String)> = BTreeMap::new();
        let mut shared = Shared::default();
        for (i, vh) in self.virtualhosts.iter().enumerate() {
            let at = format!("virtualhosts[{i}]");
            if vh.name.is_empty() {
                return Err(ModelError::invalid(
                    format!("{at}.name"),
                    "",
                    "must be non-empty",
                ));
            }
            if !vhosts.insert(vh.name.as_str()) {
                return Err(ModelError::invalid(
                    format!("{at}.name"),
                    &vh.name,
                    "is defined twice",
                ));
            }
            if let Some(f) = &vh.fault {
                f.validate(&format!("{at}.fault"))?;
            }
            for (j, r) in vh.routes.iter().enumerate() {
                let rat = format!("{at}.routes[{j}]");
                if let Some(f) = &r.fault {
                    f.validate(&format!("{rat}.fault"))?;
                }
                if let Some(p) = &r.retry_policy {
                    p.validate(&format!("{rat}.retryPolicy"))?;
                    if self.envoy.uses_plugin()
                        && r.load_balancer_policy.strategy == Strategy::Session
                    {
                        return Err(ModelError::invalid(
                            format!("{rat}.retryPolicy"),
                            "Session",
                            "cannot be set on a Session route while Envoy runs the tether plugin (its wiring sets the route's retry policy)",
                        ));
                    }
                }
                for (k, c) in r.conditions.iter().enumerate() {
                    condition(c, &format!("{rat}.conditions[{k}]"))?;
                }
                if r.services.is_empty() {
                    return Err(ModelError::invalid(
                        format!("{rat}.services"),
                        "[]",
                        "must name at least one service",
                    ));
                }
                for (k, s) in r.services.iter().enumerate() {
                    if !services.contains(s.name.as_str()) {
                        return Err(ModelError::invalid(
                            format!("{rat}.services[{k}].name"),
                            &s.name,
                            "is not a service defined in services",
                        ));
                    }
                    if s.weight == 0 && r.services.len() == 1 {
                        return Err(ModelError::invalid(
                            format!("{rat}.services[{k}].weight"),
                            0,
                            "must be greater than 0",
                        ));
                    }
                }
                if r.services.iter().all(|s| s.weight == 0) {
                    return Err(ModelError::invalid(
                        format!("{rat}.services"),
                        "all weights 0",
                        "need a weight above 0",
                    ));
                }
                let p = &r.load_balancer_policy;
                let pat = format!("{rat}.loadBalancerPolicy");
                match p.strategy {
                    Strategy::RequestHash if p.request_hash_policies.is_empty() => {
                        return Err(ModelError::invalid(
                            format!("{pat}.requestHashPolicies"),
                            "[]",
                            "must not be empty with strategy RequestHash",
                        ))
                    }
                    Strategy::RequestHash => {}
                    _ if !p.request_hash_policies.is_empty() => {
                        return Err(ModelError::invalid(
                            format!("{pat}.requestHashPolicies"),
                            p.strategy.as_str(),
                            "are only used with strategy RequestHash",
                        ))
                    }
                    _ => {}
                }
                for (k, h) in p.request_hash_policies.iter().enumerate() {
                    let set = usize::from(h.header_hash_options.is_some())
                        + usize::from(h.query_parameter_hash_options.is_some())
                        + usize::from(h.hash_source_ip);
                    if set != 1 {
                        return Err(ModelError::invalid(
                            format!("{pat}.requestHashPolicies[{k}]"),
                            set,
                            "sources set; exactly one of headerHashOptions, queryParameterHashOptions, hashSourceIP is needed",
                        ));
                    }
                    if let Some(hh) = &h.header_hash_options {
                        if !tether_core::http::syntax::is_token(&hh.header_name) {
                            return Err(ModelError::invalid(
                                format!(
                                    "{pat}.requestHashPolicies[{k}].headerHashOptions.headerName"
                                ),
                                &hh.header_name,
                                "is not a valid header name",
                            ));
                        }
                    }
                }
                match (p.strategy, &p.session) {
                    (Strategy::Session, None) => {
                        return Err(ModelError::invalid(
                            format!("{pat}.session"),
                            "",
                            "is required with strategy Session",
                        ))
                    }
                    (Strategy::Session, Some(s)) => {
                        if let (Some(f), false) = (s.format, self.envoy.uses_plugin()) {
                            return Err(ModelError::invalid(
                                format!("{pat}.session.format"),
                                f.0.as_str(),
                                "needs envoy.sessionFilter: plugin (Envoy's own filter writes only its own format; proxyless clients choose theirs)",
                            ));
                        }
                        let settings = s.cluster_settings();
                        // An aggregate's services get the settings too: their
                        // `<service>/session` clusters are the ones that pin.
                        for svc in r.services.iter().flat_map(|s| self.closure(&s.name)) {
                            match session_settings.get(svc.name.as_str()) {
                                Some((other, at_other)) if *other != settings => {
                                    return Err(ModelError::invalid(
                                        format!("{pat}.session"),
                                        &svc.name,
                                        format!(
                                            "asks for other overrideHostStatus/idleTimeout on this service than {at_other}.session"
                                        ),
                                    ));
                                }
                                Some(_) => {}
                                None => {
                                    session_settings
                                        .insert(svc.name.as_str(), (settings, pat.clone()));
                                }
                            }
                        }
                    }
                    (other, Some(_)) => {
                        return Err(ModelError::invalid(
                            format!("{pat}.session"),
                            other.as_str(),
                            "is only used with strategy Session",
                        ))
                    }
                    (_, None) => {}
                }
                self.validate_choice_count(p, &pat, r, &mut choice_counts)?;
                self.validate_strategy_settings(p, &pat, r, &mut shared)?;
            }
        }
        Ok(())
    }

    /// `choiceCount`: only with `WeightedLeastRequest`, from 2 (gRPC refuses
    /// fewer) to 10 (gRPC uses no more), and one value per service: the
    /// routes that reach a service share its `<service>/least-request`
    /// cluster, aggregates' services included.
    fn validate_choice_count<'a>(
        &'a self,
        p: &LoadBalancerPolicy,
        pat: &str,
        r: &'a RouteSpec,
        counts: &mut BTreeMap<&'a str, (u32, String)>,
    ) -> Result<(), ModelError> {
        if p.strategy != Strategy::LeastRequest {
            return match p.choice_count {
                Some(_) => Err(ModelError::invalid(
                    format!("{pat}.choiceCount"),
                    p.strategy.as_str(),
                    "is only used with strategy WeightedLeastRequest",
                )),
                None => Ok(()),
            };
        }
        let n = p.choice_count.unwrap_or(DEFAULT_CHOICE_COUNT);
        if !(2..=MAX_CHOICE_COUNT).contains(&n) {
            return Err(ModelError::invalid(
                format!("{pat}.choiceCount"),
                n,
                format!(
                    "must be from 2 to {MAX_CHOICE_COUNT} (gRPC refuses fewer than 2 and draws at most {MAX_CHOICE_COUNT})"
                ),
            ));
        }
        match self.conflict(r, pat, n, counts) {
            Some((svc, other, at_other)) => Err(ModelError::invalid(
                format!("{pat}.choiceCount"),
                n,
                shared_cluster_conflict(&at_other, "choiceCount", &other, svc),
            )),
            None => Ok(()),
        }
    }

    /// `weightedRoundRobin`, `shuffleAddressList` and `custom`: each only
    /// with its strategy, valid, and one value per service: the routes that
    /// reach a service share its cluster for the strategy, aggregates'
    /// services included.
    fn validate_strategy_settings<'a>(
        &'a self,
        p: &'a LoadBalancerPolicy,
        pat: &str,
        r: &'a RouteSpec,
        shared: &mut Shared<'a>,
    ) -> Result<(), ModelError> {
        let only = |field: &str, strategy: Strategy| {
            Err(ModelError::invalid(
                format!("{pat}.{field}"),
                p.strategy.as_str(),
                format!("is only used with strategy {}", strategy.as_str()),
            ))
        };
        if p.weighted_round_robin.is_some() && p.strategy != Strategy::WeightedRoundRobin {
            return only("weightedRoundRobin", Strategy::WeightedRoundRobin);
        }
        if p.shuffle_address_list.is_some() && p.strategy != Strategy::PickFirst {
            return only("shuffleAddressList", Strategy::PickFirst);
        }
        if p.custom.is_some() && p.strategy != Strategy::Custom {
            return only("custom", Strategy::Custom);
        }
        match p.strategy {
            Strategy::WeightedRoundRobin => {
                let wat = format!("{pat}.weightedRoundRobin");
                let spec = p.weighted_round_robin.unwrap_or_default();
                spec.validate(&wat)?;
                let mine = spec.settings();
                if let Some((svc, other, at_other)) = self.conflict(r, pat, mine, &mut shared.wrr) {
                    let differing = wrr_fields(&mine)
                        .into_iter()
                        .zip(wrr_fields(&other))
                        .find(|(a, b)| a.1 != b.1);
                    let ((field, value), (_, theirs)) = differing.unwrap_or_default();
                    return Err(ModelError::invalid(
                        format!("{wat}.{field}"),
                        Raw(value),
                        shared_cluster_conflict(
                            &at_other,
                            &format!("weightedRoundRobin.{field}"),
                            &theirs,
                            svc,
                        ),
                    ));
                }
            }
            Strategy::PickFirst => {
                let mine = p.shuffle_address_list.unwrap_or(false);
                if let Some((svc, other, at_other)) =
                    self.conflict(r, pat, mine, &mut shared.shuffle)
                {
                    return Err(ModelError::invalid(
                        format!("{pat}.shuffleAddressList"),
                        mine,
                        shared_cluster_conflict(&at_other, "shuffleAddressList", &other, svc),
                    ));
                }
            }
            Strategy::Custom => {
                let cat = format!("{pat}.custom");
                let Some(mine) = &p.custom else {
                    return Err(ModelError::invalid(
                        cat,
                        "",
                        "is required with strategy Custom",
                    ));
                };
                mine.validate(&cat)?;
                if let Some((svc, other, at_other)) =
                    self.conflict(r, pat, mine, &mut shared.custom)
                {
                    return Err(if other.policy != mine.policy {
                        ModelError::invalid(
                            format!("{cat}.policy"),
                            &mine.policy,
                            shared_cluster_conflict(
                                &at_other,
                                "custom.policy",
                                &format_args!("{:?}", other.policy),
                                svc,
                            ),
                        )
                    } else {
                        ModelError::invalid(
                            format!("{cat}.config"),
                            Raw(mine.config.to_string()),
                            shared_cluster_conflict(&at_other, "custom.config", &other.config, svc),
                        )
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Records `value` as what the route at `pat` asks of the cluster of
    /// each service it reaches (aggregates' services included); returns the
    /// first service another route asked otherwise, with that value and
    /// route.
    fn conflict<'a, T: Clone + PartialEq>(
        &'a self,
        r: &'a RouteSpec,
        pat: &str,
        value: T,
        seen: &mut BTreeMap<&'a str, (T, String)>,
    ) -> Option<(&'a str, T, String)> {
        for svc in r.services.iter().flat_map(|s| self.closure(&s.name)) {
            match seen.get(svc.name.as_str()) {
                Some((other, at_other)) if *other != value => {
                    return Some((svc.name.as_str(), other.clone(), at_other.clone()))
                }
                Some(_) => {}
                None => {
                    seen.insert(svc.name.as_str(), (value.clone(), pat.to_owned()));
                }
            }
        }
        None
    }

    /// The `loadBalancerPolicy` of the first route with `strategy` that
    /// reaches `service`, directly or through an aggregate: validation makes
    /// all of them agree on what the service's cluster for the strategy gets.
    pub fn policy_for(&self, service: &str, strategy: Strategy) -> Option<&LoadBalancerPolicy> {
        self.virtualhosts
            .iter()
            .flat_map(|v| &v.routes)
            .filter(|r| r.load_balancer_policy.strategy == strategy)
            .find(|r| {
                r.services
                    .iter()
                    .flat_map(|s| self.closure(&s.name))
                    .any(|s| s.name == service)
            })
            .map(|r| &r.load_balancer_policy)
    }

    /// The choice count of `service`'s least request cluster: the one its
    /// `WeightedLeastRequest` routes give (validation makes them agree),
    /// else the default.
    pub fn least_request_choice_count(&self, service: &str) -> u32 {
        self.policy_for(service, Strategy::LeastRequest)
            .and_then(|p| p.choice_count)
            .unwrap_or(DEFAULT_CHOICE_COUNT)
    }

    /// The settings of `service`'s weighted round robin cluster, gRPC's
    /// defaults filled in.
    pub fn weighted_round_robin_settings(&self, service: &str) -> WrrSettings {
        self.policy_for(service, Strategy::WeightedRoundRobin)
            .and_then(|p| p.weighted_round_robin)
            .unwrap_or_default()
            .settings()
    }

    /// Whether `service`'s pick first cluster shuffles its endpoints.
    pub fn pick_first_shuffle(&self, service: &str) -> bool {
        self.policy_for(service, Strategy::PickFirst)
            .and_then(|p| p.shuffle_address_list)
            .unwrap_or(false)
    }

    /// The policy of `service`'s custom cluster.
    pub fn custom_policy(&self, service: &str) -> Option<&CustomPolicySpec> {
        self.policy_for(service, Strategy::Custom)
            .and_then(|p| p.custom.as_ref())
    }

    /// The `envoy` section: a plugin needs its file (an absolute path) and
    /// a valid override header; plugin settings need the plugin; each node
    /// is listed once.
    fn validate_envoy(&self) -> Result<(), ModelError> {
        let e = &self.envoy;
        let mut ids = HashSet::new();
        for (i, n) in e.nodes.iter().enumerate() {
            if n.id.is_empty() {
                return Err(ModelError::invalid(
                    format!("envoy.nodes[{i}].id"),
                    "",
                    "must be non-empty",
                ));
            }
            if !ids.insert(n.id.as_str()) {
                return Err(ModelError::invalid(
                    format!("envoy.nodes[{i}].id"),
                    &n.id,
                    "is listed twice",
                ));
            }
        }
        match (e.uses_plugin(), &e.plugin) {
            (false, Some(_)) => Err(ModelError::invalid(
                "envoy.plugin",
                "native",
                "is only used with envoy.sessionFilter: plugin (envoy.sessionFilter is native)",
            )),
            (false, None) => Ok(()),
            (true, plugin) => {
                let plugin = plugin.clone().unwrap_or_default();
                match plugin.filename.as_deref() {
                    None => {
                        return Err(ModelError::invalid(
                            "envoy.plugin.filename",
                            "",
                            "is required with envoy.sessionFilter: plugin (or tether-control --plugin FILE)",
                        ))
                    }
                    Some(f) if !std::path::Path::new(f).is_absolute() => {
                        return Err(ModelError::invalid(
                            "envoy.plugin.filename",
                            f,
                            "must be an absolute path (Envoy opens it from its own working directory)",
                        ))
                    }
                    Some(_) => {}
                }
                if let Some(h) = &plugin.override_header {
                    if !tether_core::http::syntax::is_token(h) {
                        return Err(ModelError::invalid(
                            "envoy.plugin.overrideHeader",
                            h,
                            "is not a valid header name",
                        ));
                    }
                }
                Ok(())
            }
        }
    }

    /// The configuration as the Envoy of `node` sees it: its session filter
    /// and listener in place of the file's, and no other node's.
    pub fn for_envoy_node(&self, node: &EnvoyNodeSpec) -> Config {
        let mut c = self.clone();
        if let Some(f) = node.session_filter {
            c.envoy.session_filter = f;
        }
        if let Some(l) = &node.listener {
            c.listener = Some(l.clone());
        }
        c.envoy.nodes.clear();
        c
    }

    /// The service named `name`.
    pub fn service(&self, name: &str) -> Option<&ServiceSpec> {
        self.services.iter().find(|s| s.name == name)
    }

    /// The service named `name` and, for an aggregate, every service below
    /// it, each once, depth first in priority order. Unknown names are
    /// skipped and a cycle is not followed twice, so this ends on any model.
    pub fn closure(&self, name: &str) -> Vec<&ServiceSpec> {
        let Some(first) = self.service(name) else {
            return Vec::new();
        };
        if !first.is_aggregate() {
            return vec![first];
        }
        let by_name: BTreeMap<&str, &ServiceSpec> =
            self.services.iter().map(|s| (s.name.as_str(), s)).collect();
        let mut out: Vec<&ServiceSpec> = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![name];
        while let Some(n) = stack.pop() {
            let Some(s) = by_name.get(n) else { continue };
            if !seen.insert(n) {
                continue;
            }
            out.push(s);
            stack.extend(s.children().iter().rev().map(String::as_str));
        }
        out
    }

    /// The services with endpoints an aggregate resolves to, in priority
    /// order, each once (the service itself when it is not an aggregate).
    pub fn leaves(&self, name: &str) -> Vec<&ServiceSpec> {
        self.closure(name)
            .into_iter()
            .filter(|s| !s.is_aggregate())
            .collect()
    }

    /// Aggregate services: each names at least one other defined service,
    /// once; none has endpoints of its own; the graph has no cycle and no
    /// chain longer than [`MAX_AGGREGATE_DEPTH`] clusters.
    fn validate_aggregates(&self) -> Result<(), ModelError> {
        let index: BTreeMap<&str, usize> = self
            .services
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        for (i, s) in self.services.iter().enumerate() {
            let Some(children) = &s.aggregate else {
                continue;
            };
            let at = format!("services[{i}]");
            if children.is_empty() {
                return Err(ModelError::invalid(
                    format!("{at}.aggregate"),
                    "[]",
                    "must name at least one service",
                ));
            }
            if !s.endpoints.is_empty() {
                return Err(ModelError::invalid(
                    format!("{at}.endpoints"),
                    s.endpoints
                        .iter()
                        .map(|e| e.address.to_string())
                        .collect::<Vec<_>>(),
                    "must be empty in an aggregate service: endpoints belong to the services it aggregates",
                ));
            }
            if let Some(k) = s.locality_weights.keys().next() {
                return Err(ModelError::invalid(
                    format!("{at}.localityWeights.{k}"),
                    k,
                    "is not used by an aggregate service: set it on the services it aggregates",
                ));
            }
            if s.protocol != Protocol::Http1 {
                return Err(ModelError::invalid(
                    format!("{at}.protocol"),
                    "h2c",
                    "is not used by an aggregate service: set it on the services it aggregates",
                ));
            }
            for (j, c) in children.iter().enumerate() {
                let cat = format!("{at}.aggregate[{j}]");
                if *c == s.name {
                    return Err(ModelError::invalid(
                        cat,
                        c,
                        "is the aggregate service itself",
                    ));
                }
                if !index.contains_key(c.as_str()) {
                    return Err(ModelError::invalid(
                        cat,
                        c,
                        "is not a service defined in services",
                    ));
                }
                if children[..j].contains(c) {
                    return Err(ModelError::invalid(cat, c, "is listed twice"));
                }
            }
        }
        let height = self.aggregate_heights(&index)?;
        // Report the tallest chain, from its top, so the message shows it all.
        let tallest = (0..self.services.len())
            .filter(|&i| height[i] > MAX_AGGREGATE_DEPTH)
            .max_by_key(|&i| (height[i], std::cmp::Reverse(i)));
        if let Some(top) = tallest {
            let mut chain = vec![top];
            while let Some(next) = self.services[chain[chain.len() - 1]]
                .children()
                .iter()
                .filter_map(|c| index.get(c.as_str()).copied())
                .max_by_key(|&c| (height[c], std::cmp::Reverse(c)))
            {
                chain.push(next);
            }
            let first = &self.services[chain[1]].name;
            let j = self.services[top]
                .children()
                .iter()
                .position(|c| c == first)
                .unwrap_or(0);
            return Err(ModelError::invalid(
                format!("services[{top}].aggregate[{j}]"),
                first,
                format!(
                    "makes a chain of {} clusters ({}); gRPC follows at most {MAX_AGGREGATE_DEPTH}",
                    height[top],
                    abbreviate(chain.iter().map(|&k| self.services[k].name.as_str()))
                ),
            ));
        }
        Ok(())
    }

    /// For each service, the number of clusters on its longest chain down
    /// to a service with endpoints (1 for one with endpoints), found
    /// without recursion; a cycle is an error at the entry that closes it.
    fn aggregate_heights(&self, index: &BTreeMap<&str, usize>) -> Result<Vec<usize>, ModelError> {
        const NEW: usize = 0;
        const OPEN: usize = usize::MAX;
        // NEW, OPEN (on the current path) or the height once known.
        let mut height = vec![NEW; self.services.len()];
        for root in 0..self.services.len() {
            if height[root] != NEW {
                continue;
            }
            // (service, index of the next child to look at)
            let mut path: Vec<(usize, usize)> = vec![(root, 0)];
            height[root] = OPEN;
            while let Some(&mut (node, ref mut next)) = path.last_mut() {
                let children = self.services[node].children();
                let Some(child) = children.get(*next) else {
                    let below = children
                        .iter()
                        .filter_map(|c| index.get(c.as_str()))
                        .map(|&c| height[c])
                        .max()
                        .unwrap_or(0);
                    height[node] = below.saturating_add(1);
                    path.pop();
                    continue;
                };
                let j = *next;
                *next += 1;
                let Some(&c) = index.get(child.as_str()) else {
                    continue;
                };
                match height[c] {
                    NEW => {
                        height[c] = OPEN;
                        path.push((c, 0));
                    }
                    OPEN => {
                        let from = path.iter().position(|&(p, _)| p == c).unwrap_or(0);
                        let cycle = path[from..]
                            .iter()
                            .map(|&(p, _)| self.services[p].name.as_str())
                            .chain(std::iter::once(child.as_str()))
                            .collect::<Vec<_>>()
                            .join(" -> ");
                        return Err(ModelError::invalid(
                            format!("services[{node}].aggregate[{j}]"),
                            child,
                            format!("closes a cycle: {cycle}"),
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(height)
    }
}

/// The problem of a route asking a service's cluster for another `what`
/// than the route at `at_other` did.
fn shared_cluster_conflict(
    at_other: &str,
    what: &str,
    other: &dyn fmt::Display,
    svc: &str,
) -> String {
    format!("differs from {at_other}'s {what} {other} for service {svc:?} (its routes share one cluster)")
}

/// What the routes validated so far ask of each service's
/// `WeightedRoundRobin`, `PickFirst` and `Custom` clusters, with the route
/// that asked first.
#[derive(Default)]
struct Shared<'a> {
    wrr: BTreeMap<&'a str, (WrrSettings, String)>,
    shuffle: BTreeMap<&'a str, (bool, String)>,
    custom: BTreeMap<&'a str, (&'a CustomPolicySpec, String)>,
}

/// How many clusters deep gRPC follows an aggregate graph: the route's
/// cluster and 15 levels below it (`tether xds dump` uses the same limit).
pub const MAX_AGGREGATE_DEPTH: usize = 16;

/// `a -> b -> c`, with the middle left out of a long chain.
fn abbreviate<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.len() <= 6 {
        return names.join(" -> ");
    }
    format!(
        "{} -> {} -> ... -> {} -> {}",
        names[0],
        names[1],
        names[names.len() - 2],
        names[names.len() - 1]
    )
}

/// Finds `field` (a path such as `services[2].aggregate[1]`, as the
/// validation errors name fields) in the YAML text: a second walk over the
/// text that stops with an error at that node, whose mark the parser
/// gives. `None` when the path is not in the text.
fn locate(text: &str, field: &str) -> Option<Location> {
    let path = field_path(field)?;
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let e = serde::de::DeserializeSeed::deserialize(Walk(&path), de).err()?;
    if !e.to_string().contains(FOUND) {
        return None;
    }
    e.location().map(|l| Location {
        line: l.line(),
        column: l.column(),
    })
}

/// One step of a field path.
#[derive(Debug, PartialEq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn field_path(field: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Step::Key(key));
        }
        while !rest.is_empty() {
            let (n, after) = rest.split_once(']')?;
            out.push(Step::Index(n.parse().ok()?));
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    Some(out)
}

/// Marks the error [`Walk`] raises at the node it looks for.
const FOUND: &str = "the field looked for";

/// Walks a YAML document along a path; fails at its end.
struct Walk<'p, 'a>(&'p [Step<'a>]);

impl<'de> serde::de::DeserializeSeed<'de> for Walk<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.0.is_empty() {
            // Every visit fails (`expecting` is FOUND), at this node's mark.
            d.deserialize_any(Found)
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> serde::de::Visitor<'de> for Walk<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<serde_yaml_ng::Value>()? {
            match self.0.first() {
                Some(Step::Key(k)) if key.as_str() == Some(k) => {
                    map.next_value_seed(Walk(&self.0[1..]))?
                }
                _ => map.next_value::<serde::de::IgnoredAny>().map(drop)?,
            }
        }
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            let more = match self.0.first() {
                Some(Step::Index(n)) if *n == i => seq.next_element_seed(Walk(&self.0[1..]))?,
                _ => seq.next_element::<serde::de::IgnoredAny>()?.map(drop),
            };
            if more.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
    // A scalar where the path goes on: the path is not in this file.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Rejects whatever node it is given.
struct Found;

impl serde::de::Visitor<'_> for Found {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(FOUND)
    }
}

fn condition(c: &Condition, at: &str) -> Result<(), ModelError> {
    let set = usize::from(c.prefix.is_some())
        + usize::from(c.path.is_some())
        + usize::from(c.header.is_some());
    if set != 1 {
        return Err(ModelError::invalid(
            at,
            set,
            "conditions set; each entry needs exactly one of prefix, path, header",
        ));
    }
    for (field, v) in [("prefix", &c.prefix), ("path", &c.path)] {
        if let Some(p) = v {
            if !p.starts_with('/') {
                return Err(ModelError::invalid(
                    format!("{at}.{field}"),
                    p,
                    "must start with '/'",
                ));
            }
        }
    }
    if let Some(h) = &c.header {
        if !tether_core::http::syntax::is_token(&h.name) {
            return Err(ModelError::invalid(
                format!("{at}.header.name"),
                &h.name,
                "is not a valid header name",
            ));
        }
        let tests = usize::from(h.exact.is_some())
            + usize::from(h.not_exact.is_some())
            + usize::from(h.contains.is_some())
            + usize::from(h.not_contains.is_some())
            + usize::from(h.present.is_some())
            + usize::from(h.not_present.is_some());
        if tests != 1 {
            return Err(ModelError::invalid(
                format!("{at}.header"),
                tests,
                "tests set; exactly one of exact, notexact, contains, notcontains, present, notpresent is needed",
            ));
        }
    }
    Ok(())
}

/// Splits `region/zone/subzone` (missing parts empty).
pub fn split_locality(s: &str) -> (String, String, String) {
    let mut it = s.splitn(3, '/');
    let region = it.next().unwrap_or("").to_owned();
    let zone = it.next().unwrap_or("").to_owned();
    let sub = it.next().unwrap_or("").to_owned();
    (region, zone, sub)
}
