//! Every name the file uses: when each is due, what each resolves to, and
//! the addresses translation reads ([`Resolved`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

use super::{Answer, DnsSettings, Event, NameState};

/// One address a name resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResolvedAddress {
    /// The address.
    pub ip: IpAddr,
    /// It left the name's answer and drains until it is removed.
    pub draining: bool,
}

/// What each name resolves to, as translation reads it. Names it does not
/// hold give no endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved(BTreeMap<String, Vec<ResolvedAddress>>);

impl Resolved {
    /// The addresses of `host` (lower case), by address; none for a name
    /// not resolved.
    pub fn addresses(&self, host: &str) -> &[ResolvedAddress] {
        self.0.get(host).map_or(&[], Vec::as_slice)
    }

    /// Sets the addresses of `host` (for tests and callers that resolve
    /// on their own).
    pub fn insert(&mut self, host: impl Into<String>, addresses: Vec<ResolvedAddress>) {
        self.0.insert(host.into(), addresses);
    }
}

/// Where one name stands, for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NameReport {
    /// The addresses served.
    pub addresses: Vec<ResolvedAddress>,
    /// Failed resolutions since it was first resolved.
    pub failures: u64,
    /// The latest resolution failed (the addresses are the last good ones).
    pub in_outage: bool,
    /// The latest failure's reason.
    pub last_error: Option<String>,
    /// An answer without addresses waits for a second to confirm it.
    pub awaits_confirmation: bool,
}

/// Where every name stands, by name.
pub type DnsStatus = BTreeMap<String, NameReport>;

/// The names in use and their states.
#[derive(Debug, Clone, Default)]
pub struct Names {
    names: BTreeMap<String, NameState>,
}

impl Names {
    /// No names.
    pub fn new() -> Self {
        Names::default()
    }

    /// Whether `host` has been resolved.
    pub fn contains(&self, host: &str) -> bool {
        self.names.contains_key(host)
    }

    /// Adds a name resolved for the first time.
    pub fn insert(&mut self, host: impl Into<String>, state: NameState) {
        self.names.insert(host.into(), state);
    }

    /// Forgets the names not in `hosts` (the file no longer uses them).
    pub fn retain(&mut self, hosts: &BTreeSet<String>) {
        self.names.retain(|h, _| hosts.contains(h));
    }

    /// The names due for a resolution at `now`.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.names
            .iter()
            .filter(|(_, s)| s.due(now))
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// Takes `host`'s answer at `now`, logging what changed.
    pub fn apply(
        &mut self,
        host: &str,
        answer: &Answer,
        now: Instant,
        settings: &DnsSettings,
    ) -> Vec<Event> {
        let Some(state) = self.names.get_mut(host) else {
            return Vec::new();
        };
        let events = state.apply(answer, now, settings);
        for e in &events {
            log_event(host, e);
        }
        events
    }

    /// Removes the draining addresses whose window ended by `now`,
    /// logging each.
    pub fn expire(&mut self, now: Instant) -> Vec<(String, Event)> {
        let mut out = Vec::new();
        for (host, state) in &mut self.names {
            for e in state.expire(now) {
                log_event(host, &e);
                out.push((host.clone(), e));
            }
        }
        out
    }

    /// The next instant a name is due or a draining window ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.names.values().map(NameState::next_deadline).min()
    }

    /// The addresses of every name.
    pub fn resolved(&self) -> Resolved {
        Resolved(
            self.names
                .iter()
                .map(|(h, s)| (h.clone(), addresses(s)))
                .collect(),
        )
    }

    /// Where each name stands.
    pub fn report(&self) -> BTreeMap<String, NameReport> {
        self.names
            .iter()
            .map(|(h, s)| {
                (
                    h.clone(),
                    NameReport {
                        addresses: addresses(s),
                        failures: s.failures(),
                        in_outage: s.in_outage(),
                        last_error: s.last_error().map(str::to_owned),
                        awaits_confirmation: s.awaits_confirmation(),
                    },
                )
            })
            .collect()
    }
}

fn addresses(s: &NameState) -> Vec<ResolvedAddress> {
    s.addresses()
        .into_iter()
        .map(|(ip, draining)| ResolvedAddress { ip, draining })
        .collect()
}

/// Trouble at warn level (once per outage), changes at info.
fn log_event(host: &str, e: &Event) {
    match e {
        Event::OutageStarted { .. } | Event::Confirmed(_) => {
            log::warn!("DNS name {host:?}: {e}")
        }
        _ => log::info!("DNS name {host:?}: {e}"),
    }
}
