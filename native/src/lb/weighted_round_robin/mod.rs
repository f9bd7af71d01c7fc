//! `weighted_round_robin` (gRFC A58): round robin over the READY endpoints,
//! each weighted by the load it reports through ORCA (gRFC A51).
//!
//! Each endpoint's weight is `qps / (utilization + eps / qps *
//! error_utilization_penalty)` from its latest load report (utilization:
//! `application_utilization` when set, else `cpu_utilization`), usable
//! after `blackout_period` of reports and until `weight_expiration_period`
//! without one; endpoints without a usable weight count as the mean. Every
//! `weight_update_period` the picker's static-stride scheduler is rebuilt
//! from the weights; picks read it lock-free. Fewer than two usable weights,
//! or weights that scale to the same value, mean plain round robin order.
//!
//! The policy ([`WeightedRoundRobin`]) runs inside each locality under
//! `xds_wrr_locality` when a cluster's `load_balancing_policy` names
//! `ClientSideWeightedRoundRobin` (validated into [`Settings`]). Reports come
//! per call, from the `endpoint-load-metrics-bin` trailer the picker's
//! tracker reads, or, with `enable_oob_load_report`, from one
//! [`OobStream`](crate::orca::OobStream) per READY endpoint. A server
//! reports through [`crate::orca::LoadReportLayer`] (per call) and
//! [`crate::orca::OrcaService`] (out of band).
//!
//! Where C-core and grpc-go differ, tether follows C-core: weights are
//! capped at [`MAX_RATIO`] times the mean and raised to [`MIN_RATIO`] of it,
//! and an endpoint that comes back to READY waits out a new blackout but
//! keeps its last weight's time for expiry. One difference: equal scaled
//! weights give round robin order here, which C-core's scheduler also
//! produces (it builds a scheduler that accepts every draw).

mod picker;
mod policy;
mod scheduler;
#[cfg(test)]
mod tests;
mod weight;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::load_balancing_policies::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin;

use super::EndpointAddresses;
use crate::xds::resource::cluster::Spelling;
use crate::xds::resource::Check;
pub use picker::{ReadyEndpoint, WeightedRoundRobinPicker};
pub use policy::WeightedRoundRobin;
pub use scheduler::{StaticStrideScheduler, MAX_RATIO, MAX_WEIGHT, MIN_RATIO};
pub use weight::{weight_of, EndpointWeight};

/// `blackout_period` when unset.
pub const DEFAULT_BLACKOUT_PERIOD: Duration = Duration::from_secs(10);
/// `weight_expiration_period` when unset.
pub const DEFAULT_WEIGHT_EXPIRATION_PERIOD: Duration = Duration::from_secs(180);
/// `weight_update_period` when unset.
pub const DEFAULT_WEIGHT_UPDATE_PERIOD: Duration = Duration::from_secs(1);
/// The shortest `weight_update_period`: shorter ones are raised to it, as
/// rebuilding schedulers more often costs more than it tells.
pub const MIN_WEIGHT_UPDATE_PERIOD: Duration = Duration::from_millis(100);
/// `error_utilization_penalty` when unset.
pub const DEFAULT_ERROR_UTILIZATION_PENALTY: f32 = 1.0;
/// `oob_reporting_period` when unset.
pub const DEFAULT_OOB_REPORTING_PERIOD: Duration = Duration::from_secs(10);

/// The policy's knobs (A58's config, from the cluster's
/// `ClientSideWeightedRoundRobin`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Weights from out-of-band reporting streams instead of per-call
    /// trailers.
    pub enable_oob_load_report: bool,
    /// The interval asked of out-of-band streams.
    pub oob_reporting_period: Duration,
    /// How long an endpoint must report before its weight is used (zero:
    /// at once).
    pub blackout_period: Duration,
    /// How long a weight stays usable without a new report.
    pub weight_expiration_period: Duration,
    /// How often the picker's scheduler is rebuilt from the weights (at
    /// least [`MIN_WEIGHT_UPDATE_PERIOD`]).
    pub weight_update_period: Duration,
    /// How much errors per query add to utilization (at least 0).
    pub error_utilization_penalty: f32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enable_oob_load_report: false,
            oob_reporting_period: DEFAULT_OOB_REPORTING_PERIOD,
            blackout_period: DEFAULT_BLACKOUT_PERIOD,
            weight_expiration_period: DEFAULT_WEIGHT_EXPIRATION_PERIOD,
            weight_update_period: DEFAULT_WEIGHT_UPDATE_PERIOD,
            error_utilization_penalty: DEFAULT_ERROR_UTILIZATION_PENALTY,
        }
    }
}

/// `weighted_round_robin`'s config: its endpoints and settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// The endpoints, in order.
    pub endpoints: Vec<EndpointAddresses>,
    /// The knobs.
    pub settings: Settings,
}

/// Validates a cluster's `ClientSideWeightedRoundRobin` into [`Settings`]:
/// A58's defaults for unset fields, `weight_update_period` raised to
/// [`MIN_WEIGHT_UPDATE_PERIOD`], and a negative (or NaN)
/// `error_utilization_penalty` or a malformed duration refused (recorded
/// on `c`, naming the field and value). Fields gRPC ignores
/// (`metric_names_for_computing_utilization`, `slow_start_config`,
/// `oob_reporting_config`) are ignored here too.
pub(crate) fn parse(c: &mut Check, p: &ClientSideWeightedRoundRobin) -> Option<Settings> {
    parse_as(c, p, Spelling::Proto)
}

/// [`parse`], with errors naming the fields as `spelling` does: as the
/// proto, or as the service-config JSON when the message was read from a
/// TypedStruct's `weighted_round_robin` config.
pub(crate) fn parse_as(
    c: &mut Check,
    p: &ClientSideWeightedRoundRobin,
    spelling: Spelling,
) -> Option<Settings> {
    let mut ok = true;
    let mut duration = |c: &mut Check,
                        field: &str,
                        d: &Option<envoy_types::pb::google::protobuf::Duration>,
                        default: Duration| {
        match d {
            None => default,
            Some(d) => c.at(field, |c| c.duration(d)).unwrap_or_else(|| {
                ok = false;
                default
            }),
        }
    };
    let oob_reporting_period = duration(
        c,
        spelling.name("oob_reporting_period", "oobReportingPeriod"),
        &p.oob_reporting_period,
        DEFAULT_OOB_REPORTING_PERIOD,
    );
    let blackout_period = duration(
        c,
        spelling.name("blackout_period", "blackoutPeriod"),
        &p.blackout_period,
        DEFAULT_BLACKOUT_PERIOD,
    );
    let weight_expiration_period = duration(
        c,
        spelling.name("weight_expiration_period", "weightExpirationPeriod"),
        &p.weight_expiration_period,
        DEFAULT_WEIGHT_EXPIRATION_PERIOD,
    );
    let weight_update_period = duration(
        c,
        spelling.name("weight_update_period", "weightUpdatePeriod"),
        &p.weight_update_period,
        DEFAULT_WEIGHT_UPDATE_PERIOD,
    )
    .max(MIN_WEIGHT_UPDATE_PERIOD);
    let error_utilization_penalty = p
        .error_utilization_penalty
        .as_ref()
        .map_or(DEFAULT_ERROR_UTILIZATION_PENALTY, |v| v.value);
    if error_utilization_penalty.is_nan() || error_utilization_penalty < 0.0 {
        let field = spelling.name("error_utilization_penalty", "errorUtilizationPenalty");
        c.at(field, |c| {
            c.fail_value(error_utilization_penalty, "must be non-negative")
        });
        ok = false;
    }
    ok.then_some(Settings {
        enable_oob_load_report: p.enable_oob_load_report.as_ref().is_some_and(|v| v.value),
        oob_reporting_period,
        blackout_period,
        weight_expiration_period,
        weight_update_period,
        error_utilization_penalty,
    })
}
