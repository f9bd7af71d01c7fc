//! `xds_wrr_locality`: turns one priority's localities into a
//! `weighted_target` config, each locality running the cluster's endpoint
//! policy over its endpoints, weighted by the locality's weight.

use super::weighted_target::{self, Target, WeightedTarget};
use super::{
    least_request, pick_first, round_robin, weighted_round_robin, ConnectivityState, Ctx,
    CustomConfig, CustomPolicy, EndpointAddresses, Event, LbConfig, LbPolicy, PolicyStats,
    SharedPicker,
};
use crate::xds::resource::endpoint::LocalityName;

/// The policy each locality runs over its endpoints.
#[derive(Debug, Clone, PartialEq)]
pub enum EndpointPolicy {
    /// `round_robin`.
    RoundRobin,
    /// `pick_first`, shuffling its addresses or not.
    PickFirst {
        /// `shuffle_address_list`.
        shuffle: bool,
    },
    /// `least_request` (gRFC A48).
    LeastRequest {
        /// Endpoints drawn per pick (at least 2; more than 10 is used as 10).
        choice_count: u32,
    },
    /// `weighted_round_robin` (gRFC A58), weighted by the endpoints' load
    /// reports (gRFC A51).
    WeightedRoundRobin(weighted_round_robin::Settings),
    /// A policy from the channel's registry (gRFC A52).
    Custom(CustomPolicy),
}

impl EndpointPolicy {
    /// The policy's name as gRPC spells it (a custom policy's own name).
    pub fn name(&self) -> &'static str {
        match self {
            EndpointPolicy::RoundRobin => "round_robin",
            EndpointPolicy::PickFirst { .. } => "pick_first",
            EndpointPolicy::LeastRequest { .. } => "least_request",
            EndpointPolicy::WeightedRoundRobin(_) => "weighted_round_robin",
            EndpointPolicy::Custom(p) => p.name(),
        }
    }
}

/// One locality of a priority.
#[derive(Debug, Clone, PartialEq)]
pub struct Locality {
    /// Its name.
    pub name: LocalityName,
    /// Its weight (above zero).
    pub weight: u32,
    /// Its endpoints that the child policy may use.
    pub endpoints: Vec<EndpointAddresses>,
}

/// `xds_wrr_locality`'s config.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The priority's localities.
    pub localities: Vec<Locality>,
    /// What runs inside each locality.
    pub child_policy: EndpointPolicy,
}

impl Config {
    fn weighted_target(&self) -> weighted_target::Config {
        let targets = self
            .localities
            .iter()
            .map(|l| {
                let child = match &self.child_policy {
                    EndpointPolicy::RoundRobin => LbConfig::RoundRobin(round_robin::Config {
                        endpoints: l.endpoints.clone(),
                    }),
                    EndpointPolicy::PickFirst { shuffle } => {
                        LbConfig::PickFirst(pick_first::Config {
                            endpoints: l.endpoints.clone(),
                            shuffle: *shuffle,
                        })
                    }
                    EndpointPolicy::LeastRequest { choice_count } => {
                        LbConfig::LeastRequest(least_request::Config {
                            endpoints: l.endpoints.clone(),
                            choice_count: *choice_count,
                        })
                    }
                    EndpointPolicy::WeightedRoundRobin(settings) => {
                        LbConfig::WeightedRoundRobin(weighted_round_robin::Config {
                            endpoints: l.endpoints.clone(),
                            settings: *settings,
                        })
                    }
                    EndpointPolicy::Custom(policy) => LbConfig::Custom(CustomConfig {
                        endpoints: l.endpoints.clone(),
                        policy: policy.clone(),
                    }),
                };
                (
                    l.name.to_string(),
                    Target {
                        weight: l.weight,
                        child,
                    },
                )
            })
            .collect();
        weighted_target::Config { targets }
    }
}

/// The `xds_wrr_locality` policy: a `weighted_target` underneath.
pub struct WrrLocality {
    inner: WeightedTarget,
}

impl Default for WrrLocality {
    fn default() -> Self {
        WrrLocality::new()
    }
}

impl WrrLocality {
    /// A policy with no localities yet.
    pub fn new() -> Self {
        WrrLocality {
            inner: WeightedTarget::new(),
        }
    }
}

impl LbPolicy for WrrLocality {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::WrrLocality(config) = config else {
            return false;
        };
        self.inner
            .update(ctx, LbConfig::WeightedTarget(config.weighted_target()))
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        self.inner.event(ctx, event)
    }

    fn state(&self) -> ConnectivityState {
        self.inner.state()
    }

    fn picker(&self) -> SharedPicker {
        self.inner.picker()
    }

    fn stats(&self) -> PolicyStats {
        let mut s = self.inner.stats();
        s.policy = "xds_wrr_locality";
        s
    }
}
