//! `least_request` (gRFC A48): every endpoint connected, as `round_robin`
//! connects them (each through a pick_first [`AddressList`], gRFC A61); each
//! call goes to the endpoint with the fewest calls outstanding among
//! `choice_count` drawn at random from the READY ones.
//!
//! - `choice_count`: 2 by default; xDS validation NACKs less than 2, and
//!   more than 10 is used as 10 ([`MAX_CHOICE_COUNT`]), as A48 caps it.
//! - One counter per endpoint, this policy's own: it is kept across pickers
//!   and across the endpoint's connectivity changes while the endpoint stays
//!   in the config (a call that started on it still ends on the same
//!   counter), and a fresh counter at zero is made for a new endpoint.
//! - Endpoints listing the same addresses are one endpoint (A48 ignores the
//!   extra weight a duplicate gives).
//! - State as `round_robin`'s (A48 reuses it): READY if any endpoint is;
//!   else CONNECTING while any is connecting or idle; else
//!   TRANSIENT_FAILURE, an endpoint staying failed until it connects again.

mod picker;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use tonic::Status;

use super::pick_first::AddressList;
use super::{
    queue_picker, ConnectivityState, Ctx, EndpointAddresses, Event, FailPicker, LbConfig, LbPolicy,
    PolicyStats, SharedPicker, Subchannel, SubchannelId,
};
pub use picker::{LeastRequestPicker, Outstanding, ReadyEndpoint};

/// `choice_count` when the cluster does not set it.
pub const DEFAULT_CHOICE_COUNT: u32 = 2;
/// The most draws per pick (gRFC A48): larger values are used as this.
pub const MAX_CHOICE_COUNT: u32 = 10;

/// `least_request`'s config: its endpoints and draws per pick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The endpoints, in order.
    pub endpoints: Vec<EndpointAddresses>,
    /// Endpoints drawn per pick, as configured (see
    /// [`Config::effective_choice_count`]).
    pub choice_count: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            endpoints: Vec::new(),
            choice_count: DEFAULT_CHOICE_COUNT,
        }
    }
}

impl Config {
    /// The draws the picker makes: `choice_count` capped at
    /// [`MAX_CHOICE_COUNT`], and never below 2 (configs with less are
    /// refused before they get here).
    pub fn effective_choice_count(&self) -> u32 {
        self.choice_count.clamp(2, MAX_CHOICE_COUNT)
    }
}

/// One endpoint: its address list and its outstanding-call counter.
#[derive(Debug)]
struct Endpoint {
    list: AddressList,
    outstanding: Arc<Outstanding>,
}

/// The `least_request` policy.
#[derive(Debug)]
pub struct LeastRequest {
    endpoints: Vec<Endpoint>,
    choice_count: u32,
    /// Which endpoints hold each subchannel, so that a state change costs
    /// what that subchannel's endpoints cost.
    by_subchannel: HashMap<SubchannelId, Vec<usize>>,
    /// Endpoints READY and in TRANSIENT_FAILURE, kept as their states change.
    ready: usize,
    failing: usize,
    state: Option<ConnectivityState>,
    picker: Option<SharedPicker>,
}

impl Default for LeastRequest {
    fn default() -> Self {
        LeastRequest::new()
    }
}

impl LeastRequest {
    /// A policy with no endpoints yet.
    pub fn new() -> Self {
        LeastRequest {
            endpoints: Vec::new(),
            choice_count: DEFAULT_CHOICE_COUNT,
            by_subchannel: HashMap::new(),
            ready: 0,
            failing: 0,
            state: None,
            picker: None,
        }
    }

    fn tally(&mut self, state: ConnectivityState, add: bool) {
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

    /// The aggregate state: READY, else CONNECTING while an endpoint is not
    /// failing, else TRANSIENT_FAILURE.
    fn aggregate(&self) -> ConnectivityState {
        if self.ready > 0 {
            ConnectivityState::Ready
        } else if self.failing < self.endpoints.len() {
            ConnectivityState::Connecting
        } else {
            ConnectivityState::TransientFailure
        }
    }

    /// Recomputes state and picker; returns whether either changed. A READY
    /// picker is rebuilt only when the READY set changed.
    fn refresh(&mut self, ready_changed: bool) -> bool {
        let state = self.aggregate();
        if Some(state) == self.state && !(state == ConnectivityState::Ready && ready_changed) {
            return false;
        }
        let picker: SharedPicker = match state {
            ConnectivityState::Ready => Arc::new(LeastRequestPicker::new(
                self.endpoints
                    .iter()
                    .filter_map(|e| {
                        e.list.selected().map(|sc| ReadyEndpoint {
                            subchannel: sc.clone(),
                            outstanding: e.outstanding.clone(),
                        })
                    })
                    .collect(),
                self.choice_count,
            )),
            ConnectivityState::TransientFailure => {
                let message = if self.endpoints.is_empty() {
                    "empty address list".to_owned()
                } else {
                    let last = self
                        .endpoints
                        .iter()
                        .rev()
                        .find_map(|e| e.list.last_error());
                    format!(
                        "connections to all backends failing; last error: {}",
                        last.unwrap_or("unknown")
                    )
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

impl LbPolicy for LeastRequest {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::LeastRequest(config) = config else {
            return false;
        };
        self.choice_count = config.effective_choice_count();
        // Endpoints that stay keep their lists and counters.
        let mut old: HashMap<Vec<SocketAddr>, Endpoint> = std::mem::take(&mut self.endpoints)
            .into_iter()
            .map(|e| (e.list.addresses().collect(), e))
            .collect();
        let mut seen: HashSet<&[SocketAddr]> = HashSet::new();
        for e in &config.endpoints {
            if e.addresses.is_empty() || !seen.insert(&e.addresses) {
                continue;
            }
            let endpoint = old.remove(&e.addresses).unwrap_or_else(|| Endpoint {
                list: AddressList::new(ctx, &e.addresses),
                outstanding: Arc::new(Outstanding::new()),
            });
            self.endpoints.push(endpoint);
        }
        self.by_subchannel.clear();
        (self.ready, self.failing) = (0, 0);
        for i in 0..self.endpoints.len() {
            let state = self.endpoints[i].list.state();
            self.tally(state, true);
            for sc in self.endpoints[i].list.subchannels() {
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
            let list = &mut self.endpoints[i].list;
            let before = list.state();
            let selected = list.selected().map(Subchannel::id);
            if list.subchannel_state(id, state) {
                let after = list.state();
                ready_changed |= list.selected().map(Subchannel::id) != selected;
                self.tally(before, false);
                self.tally(after, true);
                changed = true;
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
        let ready = self
            .endpoints
            .iter()
            .filter(|e| e.list.selected().is_some())
            .count();
        let outstanding: Vec<String> = self
            .endpoints
            .iter()
            .map(|e| {
                let first = e
                    .list
                    .addresses()
                    .next()
                    .map_or_else(String::new, |a| a.to_string());
                format!("{first}={}", e.outstanding.get())
            })
            .collect();
        PolicyStats {
            policy: "least_request",
            name: None,
            state: self.state(),
            facts: vec![
                (
                    "ready".to_owned(),
                    format!("{ready}/{}", self.endpoints.len()),
                ),
                ("choice_count".to_owned(), self.choice_count.to_string()),
                ("outstanding".to_owned(), outstanding.join(" ")),
            ],
            endpoints: self
                .endpoints
                .iter()
                .flat_map(|e| e.list.subchannels().iter().map(Subchannel::stats))
                .collect(),
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}
