//! `least_request` (gRFC A48): every endpoint connected, as `round_robin`
//! connects them (each through a pick_first
//! [`AddressList`](super::pick_first::AddressList), gRFC A61); each
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

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

use super::endpoint_list::EndpointList;
use super::{
    ConnectivityState, Ctx, EndpointAddresses, Event, LbConfig, LbPolicy, PolicyStats, SharedPicker,
};
pub use picker::{LeastRequestPicker, Outstanding, ReadyEndpoint};

pub use tether_xds::lb_config::least_request::{DEFAULT_CHOICE_COUNT, MAX_CHOICE_COUNT};

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

/// The `least_request` policy.
#[derive(Debug)]
pub struct LeastRequest {
    /// The endpoints, each with its outstanding-call counter.
    endpoints: EndpointList<Arc<Outstanding>>,
    choice_count: u32,
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
            endpoints: EndpointList::default(),
            choice_count: DEFAULT_CHOICE_COUNT,
        }
    }

    /// Recomputes state and picker; returns whether either changed.
    fn refresh(&mut self, ready_changed: bool) -> bool {
        let choice_count = self.choice_count;
        self.endpoints.refresh(ready_changed, |endpoints| {
            Arc::new(LeastRequestPicker::new(
                endpoints
                    .iter()
                    .filter_map(|e| {
                        e.list.selected().map(|sc| ReadyEndpoint {
                            subchannel: sc.clone(),
                            outstanding: e.data.clone(),
                        })
                    })
                    .collect(),
                choice_count,
            ))
        })
    }
}

impl LbPolicy for LeastRequest {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::LeastRequest(config) = config else {
            return false;
        };
        self.choice_count = config.effective_choice_count();
        // Endpoints that stay keep their lists and counters; a repeated
        // endpoint is the first one, and an empty one is no endpoint.
        let mut seen: HashSet<&[SocketAddr]> = HashSet::new();
        self.endpoints.update(
            ctx,
            config
                .endpoints
                .iter()
                .map(|e| e.addresses.as_slice())
                .filter(|a| !a.is_empty() && seen.insert(*a)),
            || Arc::new(Outstanding::new()),
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
        let outstanding: Vec<String> = self
            .endpoints
            .endpoints()
            .iter()
            .map(|e| {
                let first = e
                    .list
                    .addresses()
                    .next()
                    .map_or_else(String::new, |a| a.to_string());
                format!("{first}={}", e.data.get())
            })
            .collect();
        PolicyStats {
            policy: "least_request",
            name: None,
            state: self.state(),
            facts: vec![
                ("ready".to_owned(), self.endpoints.ready_fact()),
                ("choice_count".to_owned(), self.choice_count.to_string()),
                ("outstanding".to_owned(), outstanding.join(" ")),
            ],
            endpoints: self.endpoints.subchannel_stats(),
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}
