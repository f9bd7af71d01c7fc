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
//! single Envoys (by node ID) another filter or listener. Endpoints may be
//! written `NAME:PORT`; the optional `dns` section says which servers
//! resolve the names, how often, and how long a vanished address drains.
//! See the crate README
//! for the format with an example.
//!
//! Parsing rejects unknown fields and bad values with the field's path, line
//! and column; [`Config::validate`] then checks what crosses fields (service
//! references, strategy settings, the aggregate graph) and names the field's
//! path, to which [`Config::parse`] adds the line and column.

// By concern: the error type, the serde schema, parsing with line and
// column, per-field validation, and the analysis of the file as a whole
// (the aggregate graph, shared clusters). Everything public is re-exported
// below, at the paths it always had.
mod analysis;
mod error;
mod locate;
mod schema;
mod validate;

pub use crate::fault::FaultSpec;
pub use crate::retry::RetryPolicySpec;

pub use analysis::MAX_AGGREGATE_DEPTH;
pub use error::{Location, ModelError};
pub use schema::dns::{DnsSpec, NameUse};
pub use schema::envoy::{
    EnvoyNodeSpec, EnvoySpec, ListenerSpec, PluginSpec, SessionFilter, DEFAULT_OVERRIDE_HEADER,
};
pub use schema::field::{
    AddressField, CookieField, DnsServerField, DurationField, FormatField, HealthField,
};
pub use schema::route::{
    Condition, CustomPolicySpec, HeaderCondition, HeaderHashOptions, LoadBalancerPolicy,
    QueryParameterHashOptions, RequestHashPolicy, RouteService, RouteSpec, SessionClusterSettings,
    SessionSpec, Strategy, VirtualHostSpec, WeightedRoundRobinSpec,
};
pub use schema::service::{
    split_locality, DrainSpec, DropOverloadSpec, EndpointSpec, EnvoyTlsFiles,
    FailurePercentageSpec, KeepaliveSpec, LoadReportingSpec, OutlierDetectionSpec, Protocol,
    SanMatcherSpec, ServiceSpec, ServiceTlsSpec, SuccessRateSpec,
};
pub use schema::{Config, Overrides};
