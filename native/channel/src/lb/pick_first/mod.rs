//! `pick_first` (gRFC A62): try an address list in order and stay on the
//! first address that connects. The endpoints are shuffled first when
//! `shuffle_address_list` is set, then flattened, and the first pass is
//! gRFC A61's happy eyeballs (families interleaved, a new attempt every
//! [`CONNECTION_ATTEMPT_DELAY`] while earlier ones go on).
//!
//! [`AddressList`] is the state machine, shared with `round_robin`, which
//! runs one per endpoint (gRFC A61: an endpoint with several addresses
//! connects to the first that answers). After a full pass in which every
//! address failed, the list reports TRANSIENT_FAILURE and stays there until
//! one connects ("sticky"), each address retrying when its backoff ends.
//!
//! The [`PickFirst`] policy connects as soon as it gets its first
//! addresses. When its chosen connection closes it goes IDLE, as gRPC's
//! pick_first does: nothing reconnects until a call comes. Its IDLE picker
//! queues the call and sends [`Event::ExitIdle`] (once per picker); the
//! policy then starts a new pass from the start of its list, with the
//! addresses of its latest update (one that comes while IDLE is kept for
//! that pass and connects nothing). `round_robin`'s lists reconnect at once
//! instead (gRFC A61: its endpoints' pick_first goes IDLE and is told to
//! leave it at once), and a lazy list ([`AddressList::idle`], ring_hash's
//! endpoints) starts IDLE, connects only when asked, and goes back to IDLE
//! when its connection closes.

mod picker;
#[cfg(test)]
mod tests;

use smallvec::SmallVec;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::{
    ConnectivityState, Ctx, EndpointAddresses, Event, LbConfig, LbPolicy, PolicyId, PolicyStats,
    SharedPicker, Subchannel, SubchannelId, Timer, TimerToken,
};
// Public with `internals` (for the benchmark); unused inside the crate.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
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

/// gRFC A61's Connection Attempt Delay (RFC 8305's default): how long one
/// attempt of the first pass runs alone before the next address starts
/// beside it.
pub const CONNECTION_ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// Indices of an endpoint's addresses (one, nearly always: kept inline).
pub type Indices = SmallVec<[usize; 1]>;

/// The order of a first pass over `addresses` (RFC 8305 section 4, as gRFC
/// A61 asks): the two families alternate, starting with the first
/// address's, each keeping its own order.
pub fn interleave_families(addresses: &[SocketAddr]) -> Indices {
    if addresses.len() <= 1 {
        return (0..addresses.len()).collect();
    }
    let first_v6 = addresses.first().is_some_and(SocketAddr::is_ipv6);
    let (mut same, mut other): (Vec<usize>, Vec<usize>) =
        (0..addresses.len()).partition(|&i| addresses[i].is_ipv6() == first_v6);
    same.reverse();
    other.reverse();
    let mut order = Indices::with_capacity(addresses.len());
    // Each round takes at least one index, so `len` rounds take them all.
    for _ in 0..addresses.len() {
        order.extend(same.pop());
        order.extend(other.pop());
    }
    order
}

/// One address list being connected: the subchannels, the first pass's
/// progress, and which one was chosen.
///
/// The first pass is gRFC A61's happy eyeballs: an attempt starts on the
/// first address (in [`interleave_families`] order); when it fails, or has
/// not finished after [`CONNECTION_ATTEMPT_DELAY`], the next starts while
/// the earlier ones go on. The first to be READY is chosen, and the others'
/// outcomes are ignored (a subchannel is shared through the pool, so its
/// attempt runs to its end, as C-core's shared subchannels do). Once every
/// address has failed, the list is TRANSIENT_FAILURE (sticky, gRFC A62) and
/// every address reconnects as its backoff ends.
///
/// Its lists hold one address inline: most endpoints have one, and a
/// cluster of 100,000 endpoints would otherwise make 400,000 allocations.
#[derive(Debug)]
pub struct AddressList {
    subchannels: SmallVec<[Subchannel; 1]>,
    states: SmallVec<[ConnectivityState; 1]>,
    /// Indices into `subchannels` in the order the first pass tries them.
    order: Indices,
    /// The position in `order` of the next address the pass starts.
    next: usize,
    /// Which subchannels failed during the current pass.
    failed: SmallVec<[bool; 1]>,
    /// The first pass failed: every address reconnects when IDLE.
    retrying: bool,
    /// The Connection Attempt Delay of the latest attempt.
    timer: Option<Timer>,
    selected: Option<usize>,
    state: ConnectivityState,
    last_error: Option<String>,
    /// Returns to IDLE when its connection closes, instead of starting a
    /// new pass on its own.
    lazy: bool,
}

impl AddressList {
    fn with_state(
        ctx: &Ctx<'_>,
        addresses: &[SocketAddr],
        state: ConnectivityState,
        lazy: bool,
    ) -> Self {
        let subchannels: SmallVec<[Subchannel; 1]> =
            addresses.iter().map(|a| ctx.subchannel(*a)).collect();
        let states = subchannels.iter().map(Subchannel::state).collect();
        AddressList {
            order: interleave_families(addresses),
            failed: smallvec::smallvec![false; subchannels.len()],
            next: 0,
            retrying: false,
            timer: None,
            subchannels,
            states,
            selected: None,
            state,
            last_error: None,
            lazy,
        }
    }

    /// Subchannels for `addresses` (shared through the pool) and a first
    /// connection attempt, unless one is READY already.
    pub fn new(ctx: &mut Ctx<'_>, addresses: &[SocketAddr]) -> Self {
        let mut list = Self::with_state(ctx, addresses, ConnectivityState::Connecting, false);
        list.start(ctx);
        list
    }

    /// The [`PickFirst`] policy's list: connecting at once unless `idle`,
    /// and IDLE again when its connection closes.
    fn for_policy(ctx: &mut Ctx<'_>, addresses: &[SocketAddr], idle: bool) -> Self {
        let mut list = Self::with_state(ctx, addresses, ConnectivityState::Idle, true);
        if !idle {
            list.exit_idle(ctx);
        }
        list
    }

    /// A lazy list for `addresses`: IDLE, with no connection attempt until
    /// [`AddressList::exit_idle`], and IDLE again when its connection
    /// closes (ring_hash connects endpoints only when picks need them).
    /// While IDLE it only notes its subchannels' states.
    pub fn idle(ctx: &Ctx<'_>, addresses: &[SocketAddr]) -> Self {
        Self::with_state(ctx, addresses, ConnectivityState::Idle, true)
    }

    /// Starts connecting an IDLE list; returns whether it was IDLE.
    pub fn exit_idle(&mut self, ctx: &mut Ctx<'_>) -> bool {
        if self.state != ConnectivityState::Idle {
            return false;
        }
        self.state = ConnectivityState::Connecting;
        self.start(ctx);
        true
    }

    /// Takes a READY subchannel if there is one (shared subchannels may be
    /// connected already), else starts a pass.
    fn start(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(i) = self
            .states
            .iter()
            .position(|s| *s == ConnectivityState::Ready)
        {
            self.select(i);
        } else {
            self.start_pass(ctx);
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
    /// IDLE for a lazy list not asked to connect, or whose connection
    /// closed.
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
        self.next = self.order.len();
        self.retrying = false;
        self.timer = None;
        self.state = ConnectivityState::Ready;
    }

    fn start_pass(&mut self, ctx: &mut Ctx<'_>) {
        self.selected = None;
        self.next = 0;
        self.retrying = false;
        self.failed.fill(false);
        if self.state != ConnectivityState::TransientFailure {
            self.state = ConnectivityState::Connecting;
        }
        self.advance(ctx);
    }

    /// Starts the pass's next address, with a Connection Attempt Delay
    /// unless it is the last; one still backing off counts as failed.
    fn advance(&mut self, ctx: &mut Ctx<'_>) {
        self.timer = None;
        while self.next < self.order.len() {
            let i = self.order[self.next];
            self.next += 1;
            match self.states[i] {
                ConnectivityState::Ready => {
                    self.select(i);
                    return;
                }
                ConnectivityState::TransientFailure => {
                    self.failed[i] = true;
                    continue;
                }
                ConnectivityState::Idle => self.subchannels[i].request_connection(),
                // Another user's attempt: waited for as if it were ours.
                ConnectivityState::Connecting => {}
            }
            if self.next < self.order.len() {
                self.timer = Some(ctx.timer(CONNECTION_ATTEMPT_DELAY));
            }
            return;
        }
        self.end_pass_if_failed();
    }

    /// Once every address started and failed: sticky TRANSIENT_FAILURE,
    /// and each address retries as its backoff ends (it reports IDLE).
    fn end_pass_if_failed(&mut self) {
        if self.retrying || self.next < self.order.len() || self.failed.contains(&false) {
            return;
        }
        self.retrying = true;
        self.state = ConnectivityState::TransientFailure;
        for (sc, state) in self.subchannels.iter().zip(&self.states) {
            if *state == ConnectivityState::Idle {
                sc.request_connection();
            }
        }
    }

    /// The latest attempt of the pass: where a failure moves on from.
    fn latest(&self) -> Option<usize> {
        self.next.checked_sub(1).map(|p| self.order[p])
    }

    /// A timer fired: if it is this list's Connection Attempt Delay, the
    /// next address starts. Returns whether the list's state or chosen
    /// subchannel changed.
    pub fn timer(&mut self, ctx: &mut Ctx<'_>, token: TimerToken) -> bool {
        if self.timer.as_ref().is_none_or(|t| t.token() != token) {
            return false;
        }
        let before = (self.state, self.selected);
        self.advance(ctx);
        before != (self.state, self.selected)
    }

    /// A subchannel changed state; returns whether the list's state or
    /// chosen subchannel changed.
    pub fn subchannel_state(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: SubchannelId,
        state: ConnectivityState,
    ) -> bool {
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
                self.next = 0;
                self.state = ConnectivityState::Idle;
            }
            Some(sel) if sel == i && state != ConnectivityState::Ready => {
                // The chosen connection went away: a new pass.
                self.state = ConnectivityState::Connecting;
                self.start_pass(ctx);
            }
            Some(_) => {}
            None => match state {
                ConnectivityState::Ready => self.select(i),
                ConnectivityState::TransientFailure if !self.retrying => {
                    self.failed[i] = true;
                    if self.latest() == Some(i) {
                        // No need to wait out the delay.
                        self.advance(ctx);
                    } else {
                        self.end_pass_if_failed();
                    }
                }
                ConnectivityState::Idle => {
                    let started = self.order[..self.next].contains(&i);
                    if self.retrying || (started && !self.failed[i]) {
                        // Retrying, or an attempt of this pass lost its
                        // connection; failed ones wait for the pass's end.
                        self.subchannels[i].request_connection();
                    }
                }
                _ => {}
            },
        }
        before != (self.state, self.selected)
    }
}

/// The `pick_first` policy over a flattened address list.
#[derive(Debug)]
pub struct PickFirst {
    /// Names the policy in [`Event::ExitIdle`].
    id: PolicyId,
    config: Config,
    list: Option<AddressList>,
    picker: Option<SharedPicker>,
}

impl Default for PickFirst {
    fn default() -> Self {
        PickFirst::new()
    }
}

impl PickFirst {
    /// A policy with no addresses yet.
    pub fn new() -> Self {
        PickFirst {
            id: PolicyId::next(),
            config: Config::default(),
            list: None,
            picker: None,
        }
    }

    fn rebuild_picker(&mut self, ctx: &Ctx<'_>) {
        self.picker = Some(picker::for_list(self.list.as_ref(), self.id, ctx.events()));
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
        // The first addresses connect at once; new ones that come while
        // IDLE wait for a call, as the old ones did.
        let idle = self.state() == ConnectivityState::Idle;
        self.list = (!addresses.is_empty()).then(|| AddressList::for_policy(ctx, &addresses, idle));
        self.rebuild_picker(ctx);
        true
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        let Some(list) = self.list.as_mut() else {
            return false;
        };
        let changed = match *event {
            Event::Subchannel(id, _, state) => {
                let changed = list.subchannel_state(ctx, id, state);
                if changed && list.state() == ConnectivityState::Idle {
                    log::info!(
                        "{}: pick_first: the chosen connection closed: IDLE until a call comes",
                        ctx.target
                    );
                }
                changed
            }
            Event::Timer(token) => list.timer(ctx, token),
            Event::ExitIdle(policy) if policy == self.id => return self.exit_idle(ctx),
            _ => false,
        };
        if changed {
            self.rebuild_picker(ctx);
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
            .unwrap_or_else(|| super::fail_picker("empty address list"))
    }

    fn exit_idle(&mut self, ctx: &mut Ctx<'_>) -> bool {
        let Some(list) = self.list.as_mut() else {
            return false;
        };
        if !list.exit_idle(ctx) {
            return false;
        }
        log::info!("{}: pick_first: leaving IDLE: connecting", ctx.target);
        self.rebuild_picker(ctx);
        true
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
