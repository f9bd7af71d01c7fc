//! `xds_override_host` (gRFCs A55, A60, A61, A75): keeps a session on the
//! endpoint its cookie names, across priorities, while that endpoint's
//! health is in the cluster's `override_host_status`.
//!
//! It sits above `priority`, so it sees every endpoint of the cluster, in
//! every priority, DRAINING ones included (those never reach the child).
//! Its address map holds, per address: the endpoint's health, its address
//! list with that address first, the address's subchannel (weakly: the
//! pool shares one per address, so the child's is the policy's too) and
//! when a session last used it. The map is rebuilt on an update only;
//! pickers share it, so a new picker costs nothing per endpoint. The picker
//! follows A75's pseudo-code ([`picker`]); a pick that needs a subchannel
//! "hops into the control plane" with an [`Event`].
//!
//! The policy keeps (owns) the subchannel of an endpoint a session used
//! within `idle_timeout`, so it survives the child letting go of it (a
//! priority switched off, a DRAINING endpoint). A sweep lets go of those
//! unused for `idle_timeout`. As in C-core, every update and every sweep
//! re-arms the sweep for when the oldest address used within
//! `idle_timeout` would expire (`idle_timeout` if none was), at least 5 s
//! ahead; none is armed while the map is empty.
//!
//! A cluster that reports load gets its sessions counted in the reports
//! (`tether.sessions`): the policy registers a [`SessionCount`] with the
//! cluster's load, which the LRS stream reads when it reports, counting
//! per address what [`OverrideHost::sessions`] counts. Picks pay nothing
//! for it.

pub mod picker;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};

use super::cluster_impl::LoadHandle;
use super::{
    Child, ConnectivityState, Ctx, EndpointAddresses, Event, HealthStatus, LbConfig, LbPolicy,
    PolicyStats, SharedPicker, Subchannel, Timer,
};
use crate::subchannel::WeakSubchannel;
use crate::telemetry::SessionSource;
use crate::xds::load_report::{ClusterLoad, SessionCount};
use crate::xds::resource::endpoint::HealthSet;
pub use picker::OverrideHostPicker;

/// Sweeps are at least this far apart (A75).
pub const MIN_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// `xds_override_host`'s config.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Health statuses a session may stay on (CDS
    /// `common_lb_config.override_host_status`).
    pub override_host_status: HealthSet,
    /// How long a session's endpoint keeps its subchannel unused (A75).
    pub idle_timeout: Duration,
    /// Every endpoint of the cluster, in every priority, DRAINING included.
    pub endpoints: Vec<EndpointAddresses>,
    /// The cluster's load, when it reports load: its sessions are counted
    /// in the reports.
    pub load: Option<LoadHandle>,
    /// The policy underneath (priority).
    pub child: Box<LbConfig>,
}

/// One address of the map, shared by the policy and its pickers.
#[derive(Debug)]
pub struct MapEntry {
    /// The endpoint's EDS health.
    health: HealthStatus,
    /// The endpoint's addresses, this one first.
    addresses: Arc<[SocketAddr]>,
    /// The pool's subchannel for the address, if one lives.
    subchannel: ArcSwapOption<WeakSubchannel>,
    /// When a session last used it: milliseconds since the policy's
    /// epoch, 0 for never.
    last_used_ms: AtomicU64,
    /// The policy owns the subchannel (it was told with
    /// [`Event::SessionUsed`]).
    owned: AtomicBool,
    /// `outlier_detection` above ejected its endpoint ([`Event::Ejection`]):
    /// sessions skip it as if it were failing, as through gRPC's ejected
    /// subchannel wrapper.
    ejected: AtomicBool,
    /// The sessions that used it, made when the first one does (most
    /// addresses of a large cluster never see one: 300 bytes each saved).
    /// Shared with the address's entry in the next map, so an update never
    /// copies it.
    ledger: Arc<OnceLock<Box<Ledger>>>,
}

/// The sessions that used an address.
#[derive(Debug, Default)]
struct Ledger {
    /// Session id → `last_used_ms`. Pruned by the sweep; read for drain
    /// readiness.
    sessions: Mutex<Sessions>,
    /// The sessions recorded in `sessions` lately, direct-mapped by id:
    /// (id, when). A session's next pick within [`RECORD_EVERY_MS`] of its
    /// record takes no lock.
    recent: [(AtomicU64, AtomicU64); RECENT_SLOTS],
}

/// Slots of [`Ledger::recent`].
const RECENT_SLOTS: usize = 16;

/// How stale a session's time in the ledger may get: drain readiness is
/// about `idle_timeout` (an hour by default, sweeps at least 5 s apart).
pub const RECORD_EVERY_MS: u64 = 250;

/// Session id → when it last used an address.
type Sessions = HashMap<u64, u64, foldhash::fast::RandomState>;

impl MapEntry {
    fn subchannel(&self) -> Option<Subchannel> {
        self.subchannel.load().as_ref().and_then(|w| w.upgrade())
    }

    fn set_subchannel(&self, sc: Option<&Subchannel>) {
        self.subchannel.store(sc.map(|s| Arc::new(s.downgrade())));
    }

    /// Notes that session `id` used this address at `now`.
    fn record_session(&self, id: u64, now: u64) {
        let ledger = self.ledger.get_or_init(Box::default);
        let (slot_id, slot_at) = &ledger.recent[(id % RECENT_SLOTS as u64) as usize];
        if slot_id.load(Ordering::Relaxed) == id
            && now.saturating_sub(slot_at.load(Ordering::Relaxed)) < RECORD_EVERY_MS
        {
            return;
        }
        ledger.sessions().insert(id, now);
        // Two sessions sharing a slot may mix their id and time here; each
        // was just recorded, so a skip stays within the bound.
        slot_id.store(id, Ordering::Relaxed);
        slot_at.store(now, Ordering::Relaxed);
    }

    /// The sessions that used it, if any ever did.
    fn sessions(&self) -> Option<MutexGuard<'_, Sessions>> {
        self.ledger.get().map(|l| l.sessions())
    }

    /// Forgets sessions unused for `idle_ms`; how many remain and when the
    /// latest used it.
    fn prune_sessions(&self, now: u64, idle_ms: u64) -> (usize, Option<u64>) {
        let Some(mut sessions) = self.sessions() else {
            return (0, None);
        };
        sessions.retain(|_, last| now.saturating_sub(*last) < idle_ms);
        (sessions.len(), sessions.values().max().copied())
    }
}

impl Ledger {
    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        // Inserts and retains cannot leave the map half-changed.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Drain readiness of one address of a cluster: the sessions that used it
/// within `idle_timeout`, and its health. A DRAINING endpoint whose count
/// reached 0 can be removed without moving a live session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AddressSessions {
    /// The address.
    pub address: SocketAddr,
    /// Its endpoint's EDS health.
    pub health: HealthStatus,
    /// Sessions (jars, or distinct cookies) that used it within
    /// `idle_timeout`.
    pub sessions: usize,
    /// Milliseconds since a session last used it, if one did within
    /// `idle_timeout`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used_ms_ago: Option<u64>,
}

/// The address map pickers read.
pub type AddressMap = HashMap<SocketAddr, Arc<MapEntry>, foldhash::fast::RandomState>;

/// The policy's sessions as its cluster's load reports and the channel's
/// `tether.client.sessions` count them: the current map, read when a
/// report is made or the meter collects.
struct SessionGauge {
    map: ArcSwap<AddressMap>,
    idle_ms: AtomicU64,
    clock: Clock,
}

impl SessionGauge {
    /// Each address with sessions pinned to it, with its entry and count.
    fn each_pinned(&self, mut f: impl FnMut(SocketAddr, &MapEntry, u64)) {
        let now = self.clock.now_ms();
        let idle_ms = self.idle_ms.load(Ordering::Relaxed);
        for (addr, e) in self.map.load().iter() {
            let (sessions, _) = e.prune_sessions(now, idle_ms);
            if sessions > 0 {
                f(*addr, e, sessions as u64);
            }
        }
    }
}

impl SessionCount for SessionGauge {
    fn pinned(&self) -> Vec<(SocketAddr, u64)> {
        let mut out = Vec::new();
        self.each_pinned(|addr, _, n| out.push((addr, n)));
        out
    }
}

impl SessionSource for SessionGauge {
    fn pinned(&self) -> Vec<(SocketAddr, &'static str, u64)> {
        let mut out = Vec::new();
        self.each_pinned(|addr, e, n| out.push((addr, e.health.as_str(), n)));
        out
    }
}

/// The gauge of a policy's sessions and who reads it: the cluster's load
/// (LRS) and whether the channel's telemetry does.
struct Gauged {
    gauge: Arc<SessionGauge>,
    load: Option<Arc<ClusterLoad>>,
    recorded: bool,
}

/// The `xds_override_host` policy.
pub struct OverrideHost {
    config: Option<Config>,
    map: Arc<AddressMap>,
    /// Subchannels kept for sessions.
    owned: HashMap<SocketAddr, Subchannel>,
    child: Option<Child>,
    clock: Clock,
    sweep: Option<Timer>,
    picker: Option<SharedPicker>,
    /// The sessions' gauge, while the cluster reports load or the channel
    /// records sessions.
    gauge: Option<Gauged>,
}

impl Default for OverrideHost {
    fn default() -> Self {
        OverrideHost::new()
    }
}

impl OverrideHost {
    /// A policy with no endpoints yet.
    pub fn new() -> Self {
        OverrideHost {
            config: None,
            map: Arc::default(),
            owned: HashMap::new(),
            child: None,
            clock: Clock::start(),
            sweep: None,
            picker: None,
            gauge: None,
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn idle_timeout(&self) -> Duration {
        self.config
            .as_ref()
            .map_or(crate::xds::resource::cluster::DEFAULT_IDLE_TIMEOUT, |c| {
                c.idle_timeout
            })
    }

    /// The address map for `endpoints`, keeping the use of addresses that
    /// stay; owned subchannels of addresses that left are let go.
    fn rebuild_map(&mut self, ctx: &Ctx<'_>, endpoints: &[EndpointAddresses]) {
        let mut map = AddressMap::with_capacity_and_hasher(endpoints.len(), Default::default());
        for e in endpoints {
            for (i, addr) in e.addresses.iter().enumerate() {
                // This address first, then the endpoint's others in order.
                let mut list = Vec::with_capacity(e.addresses.len());
                list.push(*addr);
                list.extend(
                    e.addresses
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, a)| *a),
                );
                let old = self.map.get(addr);
                // An address whose endpoint did not change keeps its entry:
                // an update costs what changed, not what the sessions hold.
                if let Some(old) = old.filter(|o| o.health == e.health && *o.addresses == *list) {
                    old.owned
                        .store(self.owned.contains_key(addr), Ordering::Relaxed);
                    old.set_subchannel(
                        self.owned
                            .get(addr)
                            .cloned()
                            .or_else(|| ctx.existing_subchannel(*addr))
                            .as_ref(),
                    );
                    map.insert(*addr, old.clone());
                    continue;
                }
                let entry = MapEntry {
                    health: e.health,
                    addresses: list.into(),
                    subchannel: ArcSwapOption::empty(),
                    last_used_ms: AtomicU64::new(
                        old.map_or(NEVER, |o| o.last_used_ms.load(Ordering::Relaxed)),
                    ),
                    owned: AtomicBool::new(self.owned.contains_key(addr)),
                    ejected: AtomicBool::new(
                        old.is_some_and(|o| o.ejected.load(Ordering::Relaxed)),
                    ),
                    ledger: old.map_or_else(Arc::default, |o| o.ledger.clone()),
                };
                entry.set_subchannel(
                    self.owned
                        .get(addr)
                        .cloned()
                        .or_else(|| ctx.existing_subchannel(*addr))
                        .as_ref(),
                );
                map.insert(*addr, Arc::new(entry));
            }
        }
        self.owned.retain(|addr, _| map.contains_key(addr));
        self.map = Arc::new(map);
    }

    fn refresh(&mut self, ctx: &Ctx<'_>) -> bool {
        let (Some(config), Some(child)) = (&self.config, &self.child) else {
            return false;
        };
        self.picker = Some(Arc::new(OverrideHostPicker::new(
            config.override_host_status,
            self.map.clone(),
            child.get().picker(),
            ctx.events(),
            self.clock,
        )));
        true
    }

    /// How long until the next sweep: `idle_timeout`, or less when an
    /// address used within it expires sooner. C-core computes this over
    /// the whole map on every update and after every sweep.
    fn next_sweep(&self) -> Duration {
        let idle = self.idle_timeout();
        let idle_ms = idle.as_millis() as u64;
        let now = self.now_ms();
        self.map
            .values()
            .map(|e| e.last_used_ms.load(Ordering::Relaxed))
            .filter(|&last| last != NEVER && now.saturating_sub(last) < idle_ms)
            .map(|last| Duration::from_millis(last + idle_ms - now))
            .min()
            .map_or(idle, |d| d.min(idle))
    }

    /// (Re)arms the sweep timer `delay` from now, at least
    /// [`MIN_SWEEP_INTERVAL`]; none while the map is empty.
    fn arm_sweep(&mut self, ctx: &mut Ctx<'_>, delay: Duration) {
        self.sweep = (!self.map.is_empty()).then(|| ctx.timer(delay.max(MIN_SWEEP_INTERVAL)));
    }

    /// Lets go of subchannels no session used within `idle_timeout`, and
    /// plans the next sweep for when the oldest used address would expire.
    fn run_sweep(&mut self, ctx: &mut Ctx<'_>) {
        self.sweep = None;
        let now = self.now_ms();
        let idle_ms = self.idle_timeout().as_millis() as u64;
        let map = self.map.clone();
        self.owned.retain(|addr, _| {
            let Some(e) = map.get(addr) else {
                return false;
            };
            let last = e.last_used_ms.load(Ordering::Relaxed);
            if last == NEVER || now.saturating_sub(last) >= idle_ms {
                log::debug!(
                    "{}: session endpoint {addr} idle, subchannel released",
                    ctx.target
                );
                e.owned.store(false, Ordering::Relaxed);
                false
            } else {
                true
            }
        });
        for (addr, e) in map.iter() {
            let had = e.sessions().is_some_and(|s| !s.is_empty());
            let (left, _) = e.prune_sessions(now, idle_ms);
            if had && left == 0 && e.health == HealthStatus::Draining {
                log::info!(
                    "{}: DRAINING endpoint {addr} has no sessions left: it can be removed",
                    ctx.target
                );
            }
        }
        let next = self.next_sweep();
        self.arm_sweep(ctx, next);
    }

    /// Drain readiness: each address's sessions within `idle_timeout` and
    /// its health, in address order.
    pub fn sessions(&self) -> Vec<AddressSessions> {
        let now = self.now_ms();
        let idle_ms = self.idle_timeout().as_millis() as u64;
        let mut out: Vec<AddressSessions> = self
            .map
            .iter()
            .map(|(addr, e)| {
                let (sessions, last) = e.prune_sessions(now, idle_ms);
                AddressSessions {
                    address: *addr,
                    health: e.health,
                    sessions,
                    last_used_ms_ago: last.map(|l| now.saturating_sub(l)),
                }
            })
            .collect();
        out.sort_by_key(|a| a.address);
        out
    }

    /// Registers the sessions with the cluster's load (once per load) and
    /// the channel's telemetry (once), and shows them the current map; none
    /// without either.
    fn gauge_sessions(&mut self, ctx: &Ctx<'_>, load: Option<&LoadHandle>, idle_timeout: Duration) {
        let load = load.map(|h| h.load.clone());
        let recorded = ctx.records();
        if load.is_none() && !recorded {
            self.gauge = None;
            return;
        }
        let same = self.gauge.as_ref().is_some_and(|g| {
            g.recorded == recorded
                && match (&g.load, &load) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    (None, None) => true,
                    _ => false,
                }
        });
        if !same {
            // A new gauge, so that a reader let go of stops counting.
            let gauge = Arc::new(SessionGauge {
                map: ArcSwap::new(self.map.clone()),
                idle_ms: AtomicU64::new(0),
                clock: self.clock,
            });
            if let Some(l) = &load {
                let source: Arc<dyn SessionCount> = gauge.clone();
                l.count_sessions(Arc::downgrade(&source));
            }
            if recorded {
                let source: Arc<dyn SessionSource> = gauge.clone();
                ctx.watch_sessions(Arc::downgrade(&source));
            }
            self.gauge = Some(Gauged {
                gauge,
                load,
                recorded,
            });
        }
        if let Some(g) = &self.gauge {
            g.gauge.map.store(self.map.clone());
            g.gauge
                .idle_ms
                .store(idle_timeout.as_millis() as u64, Ordering::Relaxed);
        }
    }

    /// Keeps the subchannel of `addr` for sessions.
    fn own(&mut self, ctx: &mut Ctx<'_>, addr: SocketAddr, create: bool) -> bool {
        let Some(e) = self.map.get(&addr).cloned() else {
            return false;
        };
        let sc = match self.owned.get(&addr).cloned().or_else(|| e.subchannel()) {
            Some(sc) => sc,
            None if create => ctx.subchannel(addr),
            None => return false,
        };
        if create {
            sc.request_connection();
        }
        e.set_subchannel(Some(&sc));
        e.owned.store(true, Ordering::Relaxed);
        self.owned.insert(addr, sc);
        if self.sweep.is_none() {
            self.arm_sweep(ctx, self.idle_timeout());
        }
        true
    }
}

/// `last_used_ms` of an address no session used.
const NEVER: u64 = 0;

/// The clock of last-used times: milliseconds since the policy started,
/// plus one so that no use reads as 0, "never" (the offset cancels out of every
/// difference). Every session pick reads it, so it is the coarse monotonic
/// clock (a few ns a read, a few ms of resolution, against an idle timeout
/// of seconds to hours); unit tests read tokio's, which they pause.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    #[cfg(not(test))]
    start: coarsetime::Instant,
    #[cfg(test)]
    start: tokio::time::Instant,
}

impl Clock {
    fn start() -> Clock {
        Clock {
            #[cfg(not(test))]
            start: coarsetime::Instant::now(),
            #[cfg(test)]
            start: tokio::time::Instant::now(),
        }
    }

    /// Milliseconds since the start, plus one.
    fn now_ms(&self) -> u64 {
        #[cfg(not(test))]
        let ms = self.start.elapsed().as_millis();
        #[cfg(test)]
        let ms = self.start.elapsed().as_millis() as u64;
        ms + 1
    }
}

impl LbPolicy for OverrideHost {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::OverrideHost(config) = config else {
            return false;
        };
        // Before the child lets go of anything, keep what sessions use.
        let idle_ms = config.idle_timeout.as_millis() as u64;
        let now = self.now_ms();
        let used: Vec<SocketAddr> = self
            .map
            .iter()
            .filter(|(_, e)| {
                let last = e.last_used_ms.load(Ordering::Relaxed);
                last != NEVER && now.saturating_sub(last) < idle_ms
            })
            .map(|(a, _)| *a)
            .collect();
        for addr in used {
            self.own(ctx, addr, false);
        }
        self.rebuild_map(ctx, &config.endpoints);
        self.gauge_sessions(ctx, config.load.as_ref(), config.idle_timeout);
        Child::update_in(&mut self.child, ctx, (*config.child).clone());
        self.config = Some(config);
        // Every update re-arms the sweep, as C-core does.
        let next = self.next_sweep();
        self.arm_sweep(ctx, next);
        self.refresh(ctx)
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        match *event {
            Event::Timer(token) if self.sweep.as_ref().is_some_and(|t| t.token() == token) => {
                self.run_sweep(ctx);
                return false;
            }
            Event::SessionConnect(addr) => return self.own(ctx, addr, true) && self.refresh(ctx),
            Event::SessionUsed(addr) => {
                self.own(ctx, addr, false);
                return false;
            }
            Event::Ejection(addr, ejected) => {
                if let Some(e) = self.map.get(&addr) {
                    e.ejected.store(ejected, Ordering::Relaxed);
                }
            }
            _ => {}
        }
        // A subchannel of the map: note it (the child may have just made
        // it), and wake queued session picks even if the child's picker
        // stays the same.
        let ours = match *event {
            Event::Subchannel(id, addr, _) => match self.map.get(&addr) {
                Some(e) => {
                    if e.subchannel().is_none_or(|s| s.id() != id) {
                        e.set_subchannel(ctx.existing_subchannel(addr).as_ref());
                    }
                    true
                }
                None => false,
            },
            _ => false,
        };
        let child_changed = self.child.as_mut().is_some_and(|c| c.event(ctx, event));
        (child_changed || ours) && self.refresh(ctx)
    }

    fn state(&self) -> ConnectivityState {
        self.child
            .as_ref()
            .map_or(ConnectivityState::Connecting, |c| c.get().state())
    }

    fn picker(&self) -> SharedPicker {
        self.picker.clone().unwrap_or_else(super::queue_picker)
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "xds_override_host",
            name: None,
            state: self.state(),
            facts: vec![
                ("addresses".to_owned(), self.map.len().to_string()),
                ("owned_subchannels".to_owned(), self.owned.len().to_string()),
                (
                    "idle_timeout_s".to_owned(),
                    self.idle_timeout().as_secs().to_string(),
                ),
            ],
            sessions: self.sessions(),
            endpoints: Vec::new(),
            children: self.child.iter().map(|c| c.get().stats()).collect(),
        }
    }
}

#[cfg(test)]
mod tests;
