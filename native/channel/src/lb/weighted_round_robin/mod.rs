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

use super::EndpointAddresses;
// Public with `internals`; the tests use them.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use picker::SchedulerUpdate;
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use picker::{ReadyEndpoint, WeightedRoundRobinPicker};
pub use policy::WeightedRoundRobin;
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use scheduler::{StaticStrideScheduler, MAX_RATIO, MAX_WEIGHT, MIN_RATIO};
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use weight::{weight_of, EndpointWeight, Unusable};
// The settings are validated by tether-xds, as every LB config is.
pub use tether_xds::lb_config::weighted_round_robin::*;

/// `weighted_round_robin`'s config: its endpoints and settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// The endpoints, in order.
    pub endpoints: Vec<EndpointAddresses>,
    /// The knobs.
    pub settings: Settings,
}
