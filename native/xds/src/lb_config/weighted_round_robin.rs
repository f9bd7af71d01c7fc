//! `weighted_round_robin`'s settings (gRFC A58) and gRPC's defaults, as
//! plain values (validated from a cluster by `resource::weighted_round_robin`;
//! the policy runs in the channel).

use std::time::Duration;

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
#[non_exhaustive]
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
