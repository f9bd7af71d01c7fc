//! `ring_hash` (gRFC A42 as gRPC C-core runs it today, with A61's endpoints):
//! consistent hashing, so that calls with the same request hash (from the
//! route's hash policies) keep going to the same endpoint while it is up.
//!
//! One policy spans every locality of a priority: hashing cannot be split
//! by locality first without losing affinity. The table is tether-core's:
//! hosts weighted as gRPC weighs them ([`hash::Locality::grpc_hosts`]: the
//! endpoint's weight times its locality's, localities in name order), each
//! hashed by its first address, and either gRPC's ring
//! ([`Table::Ring`], both sizes capped at 4096 entries as C-core caps them)
//! or, beyond gRPC and only when the cluster validation was told to accept
//! it, Envoy's Maglev table ([`Table::Maglev`]).
//!
//! Each endpoint is a lazy pick_first [`AddressList`]: it stays IDLE until a
//! pick needs it, goes back to IDLE when its connection closes, and after a
//! failed pass stays in TRANSIENT_FAILURE, retrying on its own, until it
//! connects. Endpoints that stay across updates keep their list.
//!
//! The state follows C-core's rules, made for a policy that connects only
//! where picks land, under `priority`: READY if any endpoint is READY; else
//! TRANSIENT_FAILURE if two or more are failing (enough evidence to fail
//! over without trying every endpoint); else CONNECTING if any is
//! connecting, or if exactly one is failing out of several (one bad
//! endpoint is not a failed policy); else IDLE if any is IDLE; else
//! TRANSIENT_FAILURE. While CONNECTING or TRANSIENT_FAILURE with nothing
//! connecting, the policy itself starts the first IDLE endpoint: a failed
//! priority gets no picks, so without this it would never recover, and a
//! CONNECTING one would never end its failover timer.
//!
//! The picker ([`RingHashPicker`]) is a snapshot of every endpoint's state,
//! rebuilt whenever one changes.

mod picker;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use tether_core::hash::{self, BuildError, Host, Maglev, MaglevConfig, Ring, RingConfig};

use super::pick_first::AddressList;
use super::wrr_locality::Locality;
use super::{
    fail_picker, ConnectivityState, Ctx, Event, LbConfig, LbPolicy, PolicyId, PolicyStats,
    SharedPicker, Subchannel, SubchannelId,
};
pub use picker::RingHashPicker;

/// Which table the calls' hashes are looked up in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// gRPC's ring (gRFC A42): the cluster's sizes, each capped at 4096
    /// entries as C-core caps them by default.
    Ring {
        /// `minimum_ring_size`.
        min_ring_size: u64,
        /// `maximum_ring_size`.
        max_ring_size: u64,
    },
    /// Envoy's Maglev table (tether beyond gRPC, which rejects MAGLEV
    /// clusters): picks by slot, and for a failed endpoint Envoy's retry
    /// sequence.
    Maglev {
        /// Number of slots, a prime.
        table_size: u64,
    },
}

/// `ring_hash`'s config: one priority's localities and the table to build.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The priority's localities with the endpoints calls may use
    /// (DRAINING ones left out), weights as EDS gives them.
    pub localities: Vec<Locality>,
    /// The table.
    pub table: Table,
}

/// The localities as tether-core's hashing sees them: each endpoint is a
/// host keyed by its first address, with its weight. The one conversion
/// from EDS localities to hashing localities.
pub fn core_localities(localities: &[Locality]) -> Vec<hash::Locality> {
    localities
        .iter()
        .map(|l| hash::Locality {
            name: l.name.clone(),
            weight: l.weight,
            hosts: l
                .endpoints
                .iter()
                .filter_map(|e| e.addresses.first().map(|a| Host::from_addr(*a, e.weight)))
                .collect(),
        })
        .collect()
}

/// A built table: tether-core's ring or Maglev table.
#[derive(Debug)]
pub enum HashTable {
    /// A ring.
    Ring(Ring),
    /// A Maglev table.
    Maglev(Maglev),
}

impl HashTable {
    /// Builds `table` over `hosts` (gRPC-weighted, in gRPC's order).
    pub fn build(hosts: Vec<Host>, table: Table) -> Result<HashTable, BuildError> {
        match table {
            Table::Ring {
                min_ring_size,
                max_ring_size,
            } => Ring::build(
                hosts,
                &RingConfig {
                    minimum_ring_size: min_ring_size,
                    maximum_ring_size: max_ring_size,
                    ..RingConfig::grpc()
                },
            )
            .map(HashTable::Ring),
            Table::Maglev { table_size } => {
                Maglev::build(hosts, &MaglevConfig { table_size }).map(HashTable::Maglev)
            }
        }
    }

    /// `ring` or `maglev`.
    pub fn kind(&self) -> &'static str {
        match self {
            HashTable::Ring(_) => "ring",
            HashTable::Maglev(_) => "maglev",
        }
    }

    /// Entries of the ring, or slots of the Maglev table.
    pub fn len(&self) -> usize {
        match self {
            HashTable::Ring(r) => r.len(),
            HashTable::Maglev(m) => m.len(),
        }
    }

    /// Whether it has no entries (never: a table has at least one host).
    // Public with `internals`; used by the tests.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hosts, indexed as picks index them.
    pub fn hosts(&self) -> &[Host] {
        match self {
            HashTable::Ring(r) => r.hosts(),
            HashTable::Maglev(m) => m.hosts(),
        }
    }

    /// The host index for `hash`.
    // Public with `internals`; used by the tests.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn pick(&self, hash: u64) -> usize {
        match self {
            HashTable::Ring(r) => r.pick(hash),
            HashTable::Maglev(m) => m.pick(hash),
        }
    }

    /// The hosts to try for `hash`, in order, repeats included: the ring
    /// from the hash's entry on (the walk C-core does), or Maglev's retry
    /// sequence over its slots. Every host comes up at least once: the
    /// Maglev sequence is followed by the hosts in order, in case it missed
    /// one.
    pub fn walk(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let attempts = u32::try_from(self.len()).unwrap_or(u32::MAX);
        let tail = match self {
            HashTable::Ring(_) => 0,
            HashTable::Maglev(_) => self.hosts().len(),
        };
        (0..attempts)
            .map(move |a| match self {
                HashTable::Ring(r) => r.pick_attempt(hash, a),
                HashTable::Maglev(m) => m.pick_attempt(hash, a),
            })
            .chain(0..tail)
    }
}

/// Endpoints by state, for the aggregation rules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    ready: usize,
    connecting: usize,
    idle: usize,
    failing: usize,
}

impl Counts {
    fn of(states: impl IntoIterator<Item = ConnectivityState>) -> Counts {
        let mut c = Counts::default();
        for s in states {
            match s {
                ConnectivityState::Ready => c.ready += 1,
                ConnectivityState::Connecting => c.connecting += 1,
                ConnectivityState::Idle => c.idle += 1,
                ConnectivityState::TransientFailure => c.failing += 1,
            }
        }
        c
    }

    /// C-core's aggregation rules, in order.
    fn state(self) -> ConnectivityState {
        let total = self.ready + self.connecting + self.idle + self.failing;
        if self.ready > 0 {
            ConnectivityState::Ready
        } else if self.failing >= 2 {
            ConnectivityState::TransientFailure
        } else if self.connecting > 0 || (self.failing == 1 && total > 1) {
            ConnectivityState::Connecting
        } else if self.idle > 0 {
            ConnectivityState::Idle
        } else {
            ConnectivityState::TransientFailure
        }
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ready {}, connecting {}, idle {}, failing {}",
            self.ready, self.connecting, self.idle, self.failing
        )
    }
}

/// The `ring_hash` policy.
pub struct RingHash {
    id: PolicyId,
    config: Option<Config>,
    /// The table, shared with the pickers; `None` when it could not be built.
    table: Option<Arc<HashTable>>,
    /// Endpoints in the table's host order (a pick's host index is an
    /// index here).
    endpoints: Vec<AddressList>,
    /// Which endpoints hold each subchannel.
    by_subchannel: HashMap<SubchannelId, Vec<usize>>,
    /// Endpoints by first address, for [`Event::ConnectEndpoint`].
    by_address: HashMap<SocketAddr, usize>,
    /// Why there is no table (no endpoints, or the build failed).
    error: Option<String>,
    state: ConnectivityState,
    /// The last endpoint failure, while TRANSIENT_FAILURE.
    last_failure: Option<String>,
    picker: Option<SharedPicker>,
}

impl Default for RingHash {
    fn default() -> Self {
        RingHash::new()
    }
}

impl fmt::Debug for RingHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingHash")
            .field("id", &self.id)
            .field("state", &self.state)
            .field("endpoints", &self.endpoints.len())
            .field("error", &self.error)
            .finish()
    }
}

impl RingHash {
    /// A policy with no endpoints yet.
    pub fn new() -> Self {
        RingHash {
            id: PolicyId::next(),
            config: None,
            table: None,
            endpoints: Vec::new(),
            by_subchannel: HashMap::new(),
            by_address: HashMap::new(),
            error: None,
            state: ConnectivityState::Idle,
            last_failure: None,
            picker: None,
        }
    }

    /// The table over `config`'s endpoints, or why there is none.
    fn build_table(config: &Config) -> Result<HashTable, String> {
        let hosts = hash::Locality::grpc_hosts(&core_localities(&config.localities))
            .map_err(|e| format!("ring_hash: cannot weigh the endpoints: {e}"))?;
        if hosts.is_empty() {
            return Err("ring_hash: empty address list (no endpoint in any locality)".to_owned());
        }
        let kind = match config.table {
            Table::Ring { .. } => "ring",
            Table::Maglev { .. } => "Maglev table",
        };
        HashTable::build(hosts, config.table)
            .map_err(|e| format!("ring_hash: cannot build the {kind}: {e}"))
    }

    /// Recomputes the state, keeps one connection attempt going while
    /// CONNECTING or TRANSIENT_FAILURE, and publishes a new picker.
    fn refresh(&mut self, ctx: &mut Ctx<'_>) {
        let before = self.state;
        let Some(table) = &self.table else {
            let message = self.error.as_deref().unwrap_or("ring_hash: no endpoints");
            self.state = ConnectivityState::TransientFailure;
            self.picker = Some(fail_picker(message));
            return;
        };
        let counts = loop {
            let counts = Counts::of(self.endpoints.iter().map(AddressList::state));
            let state = counts.state();
            // Picks do not come to a failed (or, past the failover timer,
            // connecting) priority, so the policy connects one endpoint
            // itself, one at a time.
            let starving = matches!(
                state,
                ConnectivityState::Connecting | ConnectivityState::TransientFailure
            ) && counts.connecting == 0;
            let idle = self
                .endpoints
                .iter()
                .position(|e| e.state() == ConnectivityState::Idle);
            match idle {
                Some(i) if starving => {
                    let e = &mut self.endpoints[i];
                    if let Some(address) = e.addresses().next() {
                        log::info!(
                            "{}: ring_hash: {state} with nothing connecting ({counts}): \
                             connecting {address}",
                            ctx.target
                        );
                    }
                    e.exit_idle(ctx);
                }
                _ => break counts,
            }
        };
        self.state = counts.state();
        if self.state != ConnectivityState::TransientFailure {
            self.last_failure = None;
        }
        if self.state != before {
            log::info!(
                "{}: ring_hash: {before} -> {} ({counts} of {})",
                ctx.target,
                self.state,
                self.endpoints.len()
            );
        } else {
            log::debug!(
                "{}: ring_hash: new picker, {} ({counts})",
                ctx.target,
                self.state
            );
        }
        self.picker = Some(Arc::new(RingHashPicker::new(
            table.clone(),
            &self.endpoints,
            self.id,
            ctx.events(),
        )));
    }
}

impl LbPolicy for RingHash {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::RingHash(config) = config else {
            return false;
        };
        if self.config.as_ref() == Some(&config) {
            return false;
        }
        let mut old = AddressList::by_addresses(std::mem::take(&mut self.endpoints));
        self.by_subchannel.clear();
        self.by_address.clear();
        match Self::build_table(&config) {
            Err(message) => {
                log::warn!("{}: {message}", ctx.target);
                self.table = None;
                self.error = Some(message);
            }
            Ok(table) => {
                // The table's hosts are the endpoints keyed by first address.
                let mut by_key: HashMap<String, &[SocketAddr]> = config
                    .localities
                    .iter()
                    .flat_map(|l| &l.endpoints)
                    .filter_map(|e| {
                        let first = e.addresses.first()?;
                        Some((first.to_string(), e.addresses.as_slice()))
                    })
                    .collect();
                for host in table.hosts() {
                    let addresses = by_key.remove(host.key()).unwrap_or_default();
                    let list = old
                        .remove(addresses)
                        .unwrap_or_else(|| AddressList::idle(ctx, addresses));
                    self.endpoints.push(list);
                }
                for (i, e) in self.endpoints.iter().enumerate() {
                    for sc in e.subchannels() {
                        self.by_subchannel.entry(sc.id()).or_default().push(i);
                    }
                    if let Some(first) = e.subchannels().first() {
                        self.by_address.insert(first.address(), i);
                    }
                }
                self.table = Some(Arc::new(table));
                self.error = None;
            }
        }
        self.config = Some(config);
        self.refresh(ctx);
        true
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        match *event {
            Event::Subchannel(id, _, state) => {
                let Some(indices) = self.by_subchannel.get(&id) else {
                    return false;
                };
                let mut changed = false;
                for &i in indices {
                    let e = &mut self.endpoints[i];
                    if e.subchannel_state(ctx, id, state) {
                        changed = true;
                        if e.state() == ConnectivityState::TransientFailure {
                            self.last_failure = Some(format!(
                                "no reachable endpoints; last error: {}",
                                e.last_error().unwrap_or("unknown")
                            ));
                        }
                    }
                }
                if changed {
                    self.refresh(ctx);
                }
                changed
            }
            Event::ConnectEndpoint(policy, address) if policy == self.id => {
                let Some(&i) = self.by_address.get(&address) else {
                    return false;
                };
                if !self.endpoints[i].exit_idle(ctx) {
                    return false;
                }
                log::debug!("{}: ring_hash: a pick connects {address}", ctx.target);
                self.refresh(ctx);
                true
            }
            Event::Timer(token) => {
                // An endpoint's Connection Attempt Delay: few are running.
                let mut changed = false;
                for e in &mut self.endpoints {
                    changed |= e.timer(ctx, token);
                }
                if changed {
                    self.refresh(ctx);
                }
                changed
            }
            _ => false,
        }
    }

    fn state(&self) -> ConnectivityState {
        self.state
    }

    fn picker(&self) -> SharedPicker {
        match &self.picker {
            Some(p) => p.clone(),
            None => fail_picker("ring_hash: no endpoints yet"),
        }
    }

    fn stats(&self) -> PolicyStats {
        let mut facts = Vec::new();
        if let Some(t) = &self.table {
            let size = match **t {
                HashTable::Ring(_) => "ring_size",
                HashTable::Maglev(_) => "table_size",
            };
            facts.push(("table".to_owned(), t.kind().to_owned()));
            facts.push((size.to_owned(), t.len().to_string()));
        }
        let counts = Counts::of(self.endpoints.iter().map(AddressList::state));
        facts.push((
            "ready".to_owned(),
            format!("{}/{}", counts.ready, self.endpoints.len()),
        ));
        if let Some(e) = self.error.as_ref().or(self.last_failure.as_ref()) {
            facts.push(("error".to_owned(), e.clone()));
        }
        PolicyStats {
            policy: "ring_hash",
            name: None,
            state: self.state(),
            facts,
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
