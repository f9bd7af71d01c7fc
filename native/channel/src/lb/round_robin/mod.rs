//! `round_robin`: every endpoint connected (each through a pick_first
//! [`AddressList`](super::pick_first::AddressList), gRFC A61), calls spread
//! over the READY ones in turn.
//!
//! State: READY if any endpoint is; else CONNECTING while any endpoint is
//! connecting or idle; else TRANSIENT_FAILURE (each endpoint stays failed
//! until it connects again, so a flapping backend does not flap the policy).

mod picker;

use std::sync::Arc;

use super::endpoint_list::EndpointList;
use super::{
    ConnectivityState, Ctx, EndpointAddresses, Event, LbConfig, LbPolicy, PolicyStats, SharedPicker,
};
pub use picker::RoundRobinPicker;

/// `round_robin`'s config: its endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// The endpoints, in order.
    pub endpoints: Vec<EndpointAddresses>,
}

/// The `round_robin` policy.
#[derive(Debug, Default)]
pub struct RoundRobin {
    /// Every endpoint, including empty and repeated ones (each its own
    /// endpoint, as the config lists them); nothing kept beside them.
    endpoints: EndpointList<()>,
}

impl RoundRobin {
    /// A policy with no endpoints yet.
    pub fn new() -> Self {
        RoundRobin::default()
    }

    /// Recomputes state and picker; returns whether either changed.
    fn refresh(&mut self, ready_changed: bool) -> bool {
        self.endpoints.refresh(ready_changed, |endpoints| {
            Arc::new(RoundRobinPicker::new(
                endpoints
                    .iter()
                    .filter_map(|e| e.list.selected().cloned())
                    .collect(),
            ))
        })
    }
}

impl LbPolicy for RoundRobin {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::RoundRobin(config) = config else {
            return false;
        };
        self.endpoints.update(
            ctx,
            config.endpoints.iter().map(|e| e.addresses.as_slice()),
            || (),
        );
        self.refresh(true)
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        self.endpoints
            .event(ctx, event)
            .is_some_and(|ready_changed| self.refresh(ready_changed))
    }

    fn state(&self) -> ConnectivityState {
        self.endpoints.state()
    }

    fn picker(&self) -> SharedPicker {
        self.endpoints.picker()
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "round_robin",
            name: None,
            state: self.state(),
            facts: vec![("ready".to_owned(), self.endpoints.ready_fact())],
            endpoints: self.endpoints.subchannel_stats(),
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}
