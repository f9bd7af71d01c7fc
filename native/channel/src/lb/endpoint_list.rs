//! The endpoint bookkeeping `round_robin` and `least_request` share: every
//! endpoint connected through its own pick_first [`AddressList`] (gRFC A61),
//! the READY / TRANSIENT_FAILURE tallies kept as subchannels change state,
//! and the state both policies aggregate from them (A48 reuses
//! round_robin's): READY if any endpoint is; else CONNECTING while any
//! endpoint is connecting or idle; else TRANSIENT_FAILURE, each endpoint
//! staying failed until it connects again.
//!
//! What differs between the policies stays with them: which endpoints the
//! config yields, what each keeps beside an endpoint's list (`T`), and the
//! READY picker. Custom policies (gRFC A52, [`super::registry`]) build on
//! it the same way.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use smallvec::SmallVec;
use tonic::Status;

use super::pick_first::AddressList;
use super::{queue_picker, ConnectivityState, Ctx, Event, FailPicker, SharedPicker, SubchannelId};
use crate::subchannel::{Subchannel, SubchannelStats};

/// One endpoint: its address list and what the policy keeps beside it.
#[derive(Debug)]
pub struct Endpoint<T> {
    /// The endpoint's addresses, connected pick_first.
    pub list: AddressList,
    /// The policy's own per-endpoint data, kept while the endpoint stays.
    pub data: T,
}

/// A policy's endpoints, their tallies, its state and its current picker.
#[derive(Debug)]
pub struct EndpointList<T> {
    endpoints: Vec<Endpoint<T>>,
    /// Which endpoints hold each subchannel, so that a state change costs
    /// what that subchannel's endpoints cost, not all of them.
    by_subchannel: HashMap<SubchannelId, SmallVec<[usize; 1]>>,
    /// Endpoints READY and in TRANSIENT_FAILURE, kept as their states change.
    tally: Tally,
    state: Option<ConnectivityState>,
    picker: Option<SharedPicker>,
}

impl<T> Default for EndpointList<T> {
    fn default() -> Self {
        EndpointList {
            endpoints: Vec::new(),
            by_subchannel: HashMap::new(),
            tally: Tally::default(),
            state: None,
            picker: None,
        }
    }
}

/// Endpoints READY and in TRANSIENT_FAILURE.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    ready: usize,
    failing: usize,
}

impl Tally {
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
}

impl<T> EndpointList<T> {
    /// The endpoints, in config order.
    pub fn endpoints(&self) -> &[Endpoint<T>] {
        &self.endpoints
    }

    /// Replaces the endpoints with one per entry of `addresses`, in order.
    /// An endpoint listing the same addresses as one already here keeps its
    /// list and data (a subchannel's connection and a call's counter
    /// outlive the update); `new` makes the data of the others. The state is
    /// forgotten: [`EndpointList::refresh`] must follow.
    pub fn update<'a>(
        &mut self,
        ctx: &mut Ctx<'_>,
        addresses: impl IntoIterator<Item = &'a [SocketAddr]>,
        mut new: impl FnMut() -> T,
    ) {
        // Keyed inline: an endpoint has one address nearly always.
        let mut old: HashMap<SmallVec<[SocketAddr; 1]>, Endpoint<T>> =
            std::mem::take(&mut self.endpoints)
                .into_iter()
                .map(|e| (e.list.addresses().collect(), e))
                .collect();
        let addresses = addresses.into_iter();
        self.endpoints.reserve(addresses.size_hint().0);
        for addresses in addresses {
            let endpoint = old.remove(addresses).unwrap_or_else(|| Endpoint {
                list: AddressList::new(ctx, addresses),
                data: new(),
            });
            self.endpoints.push(endpoint);
        }
        self.by_subchannel.clear();
        self.by_subchannel.reserve(self.endpoints.len());
        self.tally = Tally::default();
        for (i, e) in self.endpoints.iter().enumerate() {
            self.tally.count(e.list.state(), true);
            for sc in e.list.subchannels() {
                self.by_subchannel.entry(sc.id()).or_default().push(i);
            }
        }
        self.state = None;
    }

    /// Takes a subchannel's new state to the endpoints that hold it, or a
    /// timer to the endpoint whose Connection Attempt Delay it is: `None`
    /// if no endpoint's state or chosen subchannel changed, else whether a
    /// chosen subchannel did (the READY set a picker holds), for
    /// [`EndpointList::refresh`].
    pub fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> Option<bool> {
        let (mut changed, mut ready_changed) = (false, false);
        let mut apply = |list: &mut AddressList,
                         tally: &mut Tally,
                         f: &mut dyn FnMut(&mut AddressList) -> bool| {
            let before = list.state();
            let selected = list.selected().map(Subchannel::id);
            if f(list) {
                tally.count(before, false);
                tally.count(list.state(), true);
                changed = true;
                ready_changed |= list.selected().map(Subchannel::id) != selected;
            }
        };
        match *event {
            Event::Subchannel(id, _, state) => {
                let indices = self.by_subchannel.get(&id)?;
                for &i in indices {
                    apply(&mut self.endpoints[i].list, &mut self.tally, &mut |l| {
                        l.subchannel_state(ctx, id, state)
                    });
                }
            }
            Event::Timer(token) => {
                // Timers are few; each endpoint checks its own token.
                for e in &mut self.endpoints {
                    apply(&mut e.list, &mut self.tally, &mut |l| l.timer(ctx, token));
                }
            }
            _ => return None,
        }
        changed.then_some(ready_changed)
    }

    /// The aggregated state from the tallies.
    fn aggregate(&self) -> ConnectivityState {
        if self.tally.ready > 0 {
            ConnectivityState::Ready
        } else if self.tally.failing < self.endpoints.len() {
            ConnectivityState::Connecting
        } else {
            ConnectivityState::TransientFailure
        }
    }

    /// Recomputes state and picker; returns whether either changed. The
    /// picker is rebuilt only when the state or, while READY, the READY set
    /// changed: `ready_picker` builds it over the endpoints when READY; a
    /// failing list fails calls with the last endpoint error, and otherwise
    /// calls wait.
    pub fn refresh(
        &mut self,
        ready_changed: bool,
        ready_picker: impl FnOnce(&[Endpoint<T>]) -> SharedPicker,
    ) -> bool {
        let state = self.aggregate();
        if Some(state) == self.state && !(state == ConnectivityState::Ready && ready_changed) {
            return false;
        }
        let picker = match state {
            ConnectivityState::Ready => ready_picker(&self.endpoints),
            ConnectivityState::TransientFailure => self.fail_picker(),
            _ => queue_picker(),
        };
        self.state = Some(state);
        self.picker = Some(picker);
        true
    }

    /// Fails calls with the last error any endpoint saw, the latest
    /// endpoint's first, as the error stays until the endpoint connects.
    fn fail_picker(&self) -> SharedPicker {
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

    /// The aggregated state; CONNECTING before the first config.
    pub fn state(&self) -> ConnectivityState {
        self.state.unwrap_or(ConnectivityState::Connecting)
    }

    /// The current picker; calls wait before the first config.
    pub fn picker(&self) -> SharedPicker {
        self.picker.clone().unwrap_or_else(queue_picker)
    }

    /// `ready/total`, ready meaning a chosen subchannel, for the stats.
    pub fn ready_fact(&self) -> String {
        let ready = self
            .endpoints
            .iter()
            .filter(|e| e.list.selected().is_some())
            .count();
        format!("{ready}/{}", self.endpoints.len())
    }

    /// Every endpoint's subchannels' stats, in order.
    pub fn subchannel_stats(&self) -> Vec<SubchannelStats> {
        self.endpoints
            .iter()
            .flat_map(|e| e.list.subchannels().iter().map(Subchannel::stats))
            .collect()
    }
}
