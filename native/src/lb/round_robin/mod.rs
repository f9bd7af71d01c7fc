//! `round_robin`: every endpoint connected (each through a pick_first
//! [`AddressList`], gRFC A61), calls spread over the READY ones in turn.
//!
//! State: READY if any endpoint is; else CONNECTING while any endpoint is
//! connecting or idle; else TRANSIENT_FAILURE (each endpoint stays failed
//! until it connects again, so a flapping backend does not flap the policy).

mod picker;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tonic::Status;

use super::pick_first::AddressList;
use super::{
    queue_picker, ConnectivityState, Ctx, EndpointAddresses, Event, FailPicker, LbConfig, LbPolicy,
    PolicyStats, SharedPicker, Subchannel,
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
    endpoints: Vec<AddressList>,
    state: Option<ConnectivityState>,
    picker: Option<SharedPicker>,
}

impl RoundRobin {
    /// A policy with no endpoints yet.
    pub fn new() -> Self {
        RoundRobin::default()
    }

    /// Recomputes state and picker; returns whether either changed.
    fn refresh(&mut self, force: bool) -> bool {
        let ready: Vec<Subchannel> = self
            .endpoints
            .iter()
            .filter_map(|e| e.selected().cloned())
            .collect();
        let state = if !ready.is_empty() {
            ConnectivityState::Ready
        } else if self
            .endpoints
            .iter()
            .any(|e| e.state() != ConnectivityState::TransientFailure)
        {
            ConnectivityState::Connecting
        } else {
            ConnectivityState::TransientFailure
        };
        if !force && Some(state) == self.state && state != ConnectivityState::Ready {
            return false;
        }
        let picker: SharedPicker = match state {
            ConnectivityState::Ready => Arc::new(RoundRobinPicker::new(ready)),
            ConnectivityState::TransientFailure => {
                let last = self
                    .endpoints
                    .iter()
                    .rev()
                    .find_map(|e| e.last_error())
                    .map(str::to_owned);
                let message = match (self.endpoints.is_empty(), last) {
                    (true, _) => "empty address list".to_owned(),
                    (false, last) => format!(
                        "connections to all backends failing; last error: {}",
                        last.as_deref().unwrap_or("unknown")
                    ),
                };
                Arc::new(FailPicker(Status::unavailable(message)))
            }
            _ => queue_picker(),
        };
        self.state = Some(state);
        self.picker = Some(picker);
        true
    }
}

impl LbPolicy for RoundRobin {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::RoundRobin(config) = config else {
            return false;
        };
        // Keep the lists of endpoints that stay (same addresses in order).
        let mut old: HashMap<Vec<SocketAddr>, AddressList> = self
            .endpoints
            .drain(..)
            .map(|l| (l.addresses().collect(), l))
            .collect();
        self.endpoints = config
            .endpoints
            .iter()
            .map(|e| {
                old.remove(&e.addresses)
                    .unwrap_or_else(|| AddressList::new(ctx, &e.addresses))
            })
            .collect();
        self.refresh(true)
    }

    fn event(&mut self, _: &mut Ctx<'_>, event: &Event) -> bool {
        let Event::Subchannel(id, state) = *event else {
            return false;
        };
        let mut changed = false;
        for e in &mut self.endpoints {
            changed |= e.subchannel_state(id, state);
        }
        changed && self.refresh(false)
    }

    fn state(&self) -> ConnectivityState {
        self.state.unwrap_or(ConnectivityState::Connecting)
    }

    fn picker(&self) -> SharedPicker {
        self.picker.clone().unwrap_or_else(queue_picker)
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "round_robin",
            name: None,
            state: self.state(),
            facts: vec![(
                "ready".to_owned(),
                format!(
                    "{}/{}",
                    self.endpoints
                        .iter()
                        .filter(|e| e.selected().is_some())
                        .count(),
                    self.endpoints.len()
                ),
            )],
            endpoints: self
                .endpoints
                .iter()
                .flat_map(|e| e.subchannels().iter().map(Subchannel::stats))
                .collect(),
            children: Vec::new(),
        }
    }
}
