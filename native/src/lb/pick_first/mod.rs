//! `pick_first` (gRFC A62): try an address list in order and stay on the
//! first address that connects.
//!
//! [`AddressList`] is the state machine, shared with `round_robin`, which
//! runs one per endpoint (gRFC A61: an endpoint with several addresses
//! connects to the first that answers). After a full pass in which every
//! address failed, the list reports TRANSIENT_FAILURE and stays there until
//! one connects ("sticky"), each address retrying when its backoff ends.
//!
//! Unlike gRPC's standalone pick_first, a list whose connection closes
//! reconnects at once instead of waiting IDLE for the next call. A lazy list
//! ([`AddressList::idle`], ring_hash's endpoints) is the exception: it
//! starts IDLE, connects only when asked, and goes back to IDLE when its
//! connection closes, as gRPC's pick_first does.

mod picker;

use std::collections::HashMap;
use std::net::SocketAddr;

use super::{
    ConnectivityState, Ctx, EndpointAddresses, Event, LbConfig, LbPolicy, PolicyStats,
    SharedPicker, Subchannel, SubchannelId,
};
pub use picker::PickFirstPicker;

/// `pick_first`'s config: the endpoints (their addresses tried in order)
/// and whether to shuffle the endpoints first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// Endpoints; their addresses are flattened in order.
    pub endpoints: Vec<EndpointAddresses>,
    /// `shuffle_address_list`.
    pub shuffle: bool,
}

/// One address list being connected: the subchannels, which one is being
/// tried, and which one was chosen.
#[derive(Debug)]
pub struct AddressList {
    subchannels: Vec<Subchannel>,
    states: Vec<ConnectivityState>,
    /// Index being tried in the current pass; `len` once a pass failed.
    attempting: usize,
    selected: Option<usize>,
    state: ConnectivityState,
    last_error: Option<String>,
    /// Starts IDLE and returns to IDLE when its connection closes, instead
    /// of connecting on its own.
    lazy: bool,
}

impl AddressList {
    /// Subchannels for `addresses` (shared through the pool) and a first
    /// connection attempt, unless one is READY already.
    pub fn new(ctx: &Ctx<'_>, addresses: &[SocketAddr]) -> Self {
        let subchannels: Vec<Subchannel> = addresses.iter().map(|a| ctx.subchannel(*a)).collect();
        let states = subchannels.iter().map(Subchannel::state).collect();
        let mut list = AddressList {
            subchannels,
            states,
            attempting: 0,
            selected: None,
            state: ConnectivityState::Connecting,
            last_error: None,
            lazy: false,
        };
        list.start();
        list
    }

    /// A lazy list for `addresses`: IDLE, with no connection attempt until
    /// [`AddressList::exit_idle`], and IDLE again when its connection
    /// closes (ring_hash connects endpoints only when picks need them).
    /// While IDLE it only notes its subchannels' states.
    pub fn idle(ctx: &Ctx<'_>, addresses: &[SocketAddr]) -> Self {
        let subchannels: Vec<Subchannel> = addresses.iter().map(|a| ctx.subchannel(*a)).collect();
        let states = subchannels.iter().map(Subchannel::state).collect();
        AddressList {
            subchannels,
            states,
            attempting: 0,
            selected: None,
            state: ConnectivityState::Idle,
            last_error: None,
            lazy: true,
        }
    }

    /// Starts connecting an IDLE list; returns whether it was IDLE.
    pub fn exit_idle(&mut self) -> bool {
        if self.state != ConnectivityState::Idle {
            return false;
        }
        self.state = ConnectivityState::Connecting;
        self.start();
        true
    }

    /// Takes a READY subchannel if there is one (shared subchannels may be
    /// connected already), else starts a pass.
    fn start(&mut self) {
        if let Some(i) = self
            .states
            .iter()
            .position(|s| *s == ConnectivityState::Ready)
        {
            self.select(i);
        } else {
            self.start_pass();
        }
    }

    /// `lists` by their addresses, for a policy's update to keep the
    /// lists of endpoints that stay (same addresses in order).
    pub fn by_addresses(lists: Vec<AddressList>) -> HashMap<Vec<SocketAddr>, AddressList> {
        lists
            .into_iter()
            .map(|l| (l.addresses().collect(), l))
            .collect()
    }

    /// The addresses, in order.
    pub fn addresses(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.subchannels.iter().map(Subchannel::address)
    }

    /// The list's state: READY once an address is chosen, CONNECTING during
    /// a pass, TRANSIENT_FAILURE after a failed pass until one connects;
    /// IDLE for a lazy list not asked to connect.
    pub fn state(&self) -> ConnectivityState {
        self.state
    }

    /// The chosen subchannel, when READY.
    pub fn selected(&self) -> Option<&Subchannel> {
        self.selected.map(|i| &self.subchannels[i])
    }

    /// Why the last attempt failed, if one did.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// The subchannels.
    pub fn subchannels(&self) -> &[Subchannel] {
        &self.subchannels
    }

    fn select(&mut self, i: usize) {
        self.selected = Some(i);
        self.attempting = self.subchannels.len();
        self.state = ConnectivityState::Ready;
    }

    fn start_pass(&mut self) {
        self.selected = None;
        self.attempting = 0;
        if self.state != ConnectivityState::TransientFailure {
            self.state = ConnectivityState::Connecting;
        }
        self.try_current();
    }

    /// Asks the address being tried to connect; a failed one (still backing
    /// off) is skipped.
    fn try_current(&mut self) {
        while self.attempting < self.subchannels.len() {
            match self.states[self.attempting] {
                ConnectivityState::Idle => {
                    self.subchannels[self.attempting].request_connection();
                    return;
                }
                ConnectivityState::Connecting => return,
                ConnectivityState::Ready => {
                    self.select(self.attempting);
                    return;
                }
                ConnectivityState::TransientFailure => self.attempting += 1,
            }
        }
        // A whole pass failed: sticky TRANSIENT_FAILURE, and each address
        // retries as its backoff ends (it reports IDLE).
        self.state = ConnectivityState::TransientFailure;
    }

    /// A subchannel changed state; returns whether the list's state or
    /// chosen subchannel changed.
    pub fn subchannel_state(&mut self, id: SubchannelId, state: ConnectivityState) -> bool {
        let Some(i) = self.subchannels.iter().position(|s| s.id() == id) else {
            return false;
        };
        if self.states[i] == state {
            return false;
        }
        self.states[i] = state;
        let before = (self.state, self.selected);
        if state == ConnectivityState::TransientFailure {
            self.last_error = self.subchannels[i].last_error();
        }
        if self.state == ConnectivityState::Idle {
            // A lazy list waits to be asked.
            return false;
        }
        match self.selected {
            Some(sel) if sel == i && state != ConnectivityState::Ready && self.lazy => {
                // The chosen connection went away: IDLE until asked again.
                self.selected = None;
                self.attempting = 0;
                self.state = ConnectivityState::Idle;
            }
            Some(sel) if sel == i && state != ConnectivityState::Ready => {
                // The chosen connection went away: a new pass.
                self.state = ConnectivityState::Connecting;
                self.start_pass();
            }
            Some(_) => {}
            None => match state {
                ConnectivityState::Ready => self.select(i),
                ConnectivityState::TransientFailure if i == self.attempting => {
                    self.attempting += 1;
                    self.try_current();
                }
                ConnectivityState::Idle => {
                    if self.attempting >= self.subchannels.len() {
                        // After a failed pass every address retries on its own.
                        self.subchannels[i].request_connection();
                    } else if i == self.attempting {
                        self.try_current();
                    }
                }
                _ => {}
            },
        }
        before != (self.state, self.selected)
    }
}

/// The `pick_first` policy over a flattened address list.
#[derive(Debug, Default)]
pub struct PickFirst {
    config: Config,
    list: Option<AddressList>,
    picker: Option<SharedPicker>,
}

impl PickFirst {
    /// A policy with no addresses yet.
    pub fn new() -> Self {
        PickFirst::default()
    }

    fn rebuild_picker(&mut self) {
        self.picker = Some(picker::for_list(self.list.as_ref()));
    }
}

impl LbPolicy for PickFirst {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::PickFirst(config) = config else {
            return false;
        };
        if self.list.is_some() && config == self.config {
            return false;
        }
        let mut endpoints = config.endpoints.clone();
        if config.shuffle {
            for i in (1..endpoints.len()).rev() {
                let j = super::random::below(i as u64 + 1) as usize;
                endpoints.swap(i, j);
            }
        }
        let addresses: Vec<SocketAddr> = endpoints
            .iter()
            .flat_map(|e| e.addresses.iter().copied())
            .collect();
        let unchanged = self
            .list
            .as_ref()
            .is_some_and(|l| l.addresses().eq(addresses.iter().copied()));
        self.config = config;
        if unchanged {
            return false;
        }
        self.list = (!addresses.is_empty()).then(|| AddressList::new(ctx, &addresses));
        self.rebuild_picker();
        true
    }

    fn event(&mut self, _: &mut Ctx<'_>, event: &Event) -> bool {
        let Event::Subchannel(id, _, state) = *event else {
            return false;
        };
        let changed = self
            .list
            .as_mut()
            .is_some_and(|l| l.subchannel_state(id, state));
        if changed {
            self.rebuild_picker();
        }
        changed
    }

    fn state(&self) -> ConnectivityState {
        self.list
            .as_ref()
            .map_or(ConnectivityState::TransientFailure, AddressList::state)
    }

    fn picker(&self) -> SharedPicker {
        self.picker
            .clone()
            .unwrap_or_else(|| picker::for_list(self.list.as_ref()))
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "pick_first",
            name: None,
            state: self.state(),
            facts: self
                .list
                .as_ref()
                .and_then(|l| l.selected())
                .map(|s| vec![("selected".to_owned(), s.address().to_string())])
                .unwrap_or_default(),
            endpoints: self
                .list
                .iter()
                .flat_map(|l| l.subchannels().iter().map(Subchannel::stats))
                .collect(),
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}
