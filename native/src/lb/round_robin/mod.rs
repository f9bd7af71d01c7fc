//! `round_robin`: every endpoint connected (each through a pick_first
//! [`AddressList`], gRFC A61), calls spread over the READY ones in turn.
//!
//! State: READY if any endpoint is; else CONNECTING while any endpoint is
//! connecting or idle; else TRANSIENT_FAILURE (each endpoint stays failed
//! until it connects again, so a flapping backend does not flap the policy).

mod picker;

use std::collections::HashMap;
use std::sync::Arc;

use tonic::Status;

use super::pick_first::AddressList;
use super::{
    queue_picker, ConnectivityState, Ctx, EndpointAddresses, Event, FailPicker, LbConfig, LbPolicy,
    PolicyStats, SharedPicker, Subchannel, SubchannelId,
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
    /// Which endpoints hold each subchannel, so that a state change costs
    /// what that subchannel's endpoints cost, not all of them.
    by_subchannel: HashMap<SubchannelId, Vec<usize>>,
    /// Endpoints READY and in TRANSIENT_FAILURE, kept as their states change.
    ready: usize,
    failing: usize,
    state: Option<ConnectivityState>,
    picker: Option<SharedPicker>,
}

impl RoundRobin {
    /// A policy with no endpoints yet.
    pub fn new() -> Self {
        RoundRobin::default()
    }

    fn count(&mut self, state: ConnectivityState, add: bool) {
        let counter = match state {
            ConnectivityState::Ready => &mut self.ready,
            ConnectivityState::TransientFailure => &mut self.failing,
            _ => return,
        };
        if add {
            *counter += 1;
        } else {
            *counter -= 1;
        }
    }

    /// Recomputes state and picker; returns whether either changed. The
    /// picker is rebuilt only when the state or the READY set changed.
    fn refresh(&mut self, ready_changed: bool) -> bool {
        let state = if self.ready > 0 {
            ConnectivityState::Ready
        } else if self.failing < self.endpoints.len() {
            ConnectivityState::Connecting
        } else {
            ConnectivityState::TransientFailure
        };
        if Some(state) == self.state && !(state == ConnectivityState::Ready && ready_changed) {
            return false;
        }
        let picker: SharedPicker = match state {
            ConnectivityState::Ready => Arc::new(RoundRobinPicker::new(
                self.endpoints
                    .iter()
                    .filter_map(|e| e.selected().cloned())
                    .collect(),
            )),
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
        let mut old = AddressList::by_addresses(std::mem::take(&mut self.endpoints));
        self.endpoints = config
            .endpoints
            .iter()
            .map(|e| {
                old.remove(&e.addresses)
                    .unwrap_or_else(|| AddressList::new(ctx, &e.addresses))
            })
            .collect();
        self.by_subchannel.clear();
        (self.ready, self.failing) = (0, 0);
        for i in 0..self.endpoints.len() {
            let state = self.endpoints[i].state();
            self.count(state, true);
            for sc in self.endpoints[i].subchannels() {
                self.by_subchannel.entry(sc.id()).or_default().push(i);
            }
        }
        self.state = None;
        self.refresh(true)
    }

    fn event(&mut self, _: &mut Ctx<'_>, event: &Event) -> bool {
        let Event::Subchannel(id, _, state) = *event else {
            return false;
        };
        let Some(indices) = self.by_subchannel.get(&id).cloned() else {
            return false;
        };
        let (mut changed, mut ready_changed) = (false, false);
        for i in indices {
            let before = self.endpoints[i].state();
            let selected = self.endpoints[i].selected().map(Subchannel::id);
            if self.endpoints[i].subchannel_state(id, state) {
                let after = self.endpoints[i].state();
                self.count(before, false);
                self.count(after, true);
                changed = true;
                ready_changed |= self.endpoints[i].selected().map(Subchannel::id) != selected;
            }
        }
        changed && self.refresh(ready_changed)
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
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}
