//! One name's addresses over time, without I/O: [`NameState`] is fed
//! answers and instants and says what changed.
//!
//! - An address in the answer is served with the entry's health; one that
//!   leaves it is served DRAINING for `drainOnRemoval`, then removed; one
//!   that comes back while draining is served as before.
//! - DNS trouble (a timeout, SERVFAIL, an unreachable server) changes
//!   nothing: the last good addresses stay, and only the first failure of
//!   an outage is an event (so it is logged once).
//! - An answer with no address (NXDOMAIN, or no A or AAAA record) for a
//!   name that has addresses counts only when the next answer says the
//!   same: one stray answer does not empty a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::{Answer, DnsSettings};

/// What changed for a name, to log and count.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A new address is served.
    Added(IpAddr),
    /// An address left the answer: served DRAINING for this long.
    Draining(IpAddr, Duration),
    /// A draining address's window ended (or `drainOnRemoval` is 0): it is
    /// no longer served.
    Removed(IpAddr),
    /// A draining address is in the answer again: served as before.
    Back(IpAddr),
    /// An answer without addresses, not yet believed: the addresses stay
    /// until the next answer confirms it.
    Unconfirmed(Answer),
    /// A second answer without addresses: every address drains.
    Confirmed(Answer),
    /// The answer before this one had no address, this one has: the
    /// empty one is forgotten.
    NotConfirmed,
    /// The first failed resolution of an outage: the addresses stay.
    OutageStarted {
        /// What went wrong.
        reason: String,
        /// How many addresses are kept.
        kept: usize,
    },
    /// The first answer after an outage.
    OutageEnded {
        /// How many resolutions failed in the outage.
        failures: u64,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |d: &Duration| tether_core::duration::display(*d).to_string();
        match self {
            Event::Added(ip) => write!(f, "{ip} added"),
            Event::Draining(ip, d) => {
                write!(f, "{ip} left the answer: DRAINING for {}", secs(d))
            }
            Event::Removed(ip) => write!(f, "{ip} removed"),
            Event::Back(ip) => write!(f, "{ip} is in the answer again: no longer draining"),
            Event::Unconfirmed(a) => write!(
                f,
                "answered {a}; its addresses stay until a second answer confirms it"
            ),
            Event::Confirmed(a) => write!(f, "answered {a} twice: its addresses drain"),
            Event::NotConfirmed => f.write_str("has addresses again (the empty answer was not confirmed)"),
            Event::OutageStarted { reason, kept } => write!(
                f,
                "cannot be resolved ({reason}); keeping its {kept} last good addresses until DNS answers"
            ),
            Event::OutageEnded { failures } => write!(
                f,
                "answers again after {failures} failed resolution{}",
                if *failures == 1 { "" } else { "s" }
            ),
        }
    }
}

/// One name's addresses, its draining ones and its DNS trouble.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameState {
    live: BTreeSet<IpAddr>,
    /// Addresses that left the answer, and when each is removed.
    draining: BTreeMap<IpAddr, Instant>,
    /// The first of two answers without addresses.
    unconfirmed: Option<Answer>,
    /// Failed resolutions in the current outage, if in one.
    outage: Option<u64>,
    /// Failed resolutions since the name was first resolved.
    failures: u64,
    /// The latest failure's reason.
    last_error: Option<String>,
    next_refresh: Instant,
}

impl NameState {
    /// The state of a name first resolved at `now`, or the answer when it
    /// gave no address (a name that never resolved cannot be served).
    pub fn first(answer: &Answer, now: Instant, settings: &DnsSettings) -> Result<Self, Answer> {
        match answer {
            Answer::Addresses { ips, ttl } if !ips.is_empty() => Ok(NameState {
                live: ips.clone(),
                draining: BTreeMap::new(),
                unconfirmed: None,
                outage: None,
                failures: 0,
                last_error: None,
                next_refresh: now + settings.refresh_after(*ttl),
            }),
            Answer::Addresses { .. } => Err(Answer::NoAddresses {
                nxdomain: false,
                negative_ttl: None,
            }),
            other => Err(other.clone()),
        }
    }

    /// Takes the answer of a resolution made at `now`.
    pub fn apply(&mut self, answer: &Answer, now: Instant, settings: &DnsSettings) -> Vec<Event> {
        let mut events = Vec::new();
        if let Answer::Failed { reason } = answer {
            self.failures += 1;
            self.last_error = Some(reason.clone());
            match &mut self.outage {
                Some(n) => *n += 1,
                None => {
                    self.outage = Some(1);
                    events.push(Event::OutageStarted {
                        reason: reason.clone(),
                        kept: self.live.len() + self.draining.len(),
                    });
                }
            }
            self.next_refresh = now + settings.min_refresh;
            return events;
        }
        if let Some(failures) = self.outage.take() {
            events.push(Event::OutageEnded { failures });
        }
        match answer {
            Answer::Addresses { ips, ttl } if !ips.is_empty() => {
                if self.unconfirmed.take().is_some() {
                    events.push(Event::NotConfirmed);
                }
                for ip in ips {
                    if self.draining.remove(ip).is_some() {
                        self.live.insert(*ip);
                        events.push(Event::Back(*ip));
                    } else if self.live.insert(*ip) {
                        events.push(Event::Added(*ip));
                    }
                }
                let gone: Vec<IpAddr> = self.live.difference(ips).copied().collect();
                for ip in gone {
                    self.drain(ip, now, settings, &mut events);
                }
                self.next_refresh = now + settings.refresh_after(*ttl);
            }
            _ => {
                let negative_ttl = match answer {
                    Answer::NoAddresses { negative_ttl, .. } => *negative_ttl,
                    _ => None,
                };
                let settled = now + settings.refresh_after(negative_ttl.unwrap_or_default());
                if self.live.is_empty() {
                    self.unconfirmed = None;
                    self.next_refresh = settled;
                } else if self.unconfirmed.is_none() {
                    self.unconfirmed = Some(answer.clone());
                    events.push(Event::Unconfirmed(answer.clone()));
                    // Confirm (or forget) it soon.
                    self.next_refresh = now + settings.min_refresh;
                } else {
                    self.unconfirmed = None;
                    events.push(Event::Confirmed(answer.clone()));
                    let gone: Vec<IpAddr> = self.live.iter().copied().collect();
                    for ip in gone {
                        self.drain(ip, now, settings, &mut events);
                    }
                    self.next_refresh = settled;
                }
            }
        }
        events
    }

    /// Removes the addresses whose draining window ended by `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<Event> {
        let done: Vec<IpAddr> = self
            .draining
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(ip, _)| *ip)
            .collect();
        done.into_iter()
            .map(|ip| {
                self.draining.remove(&ip);
                Event::Removed(ip)
            })
            .collect()
    }

    fn drain(&mut self, ip: IpAddr, now: Instant, settings: &DnsSettings, events: &mut Vec<Event>) {
        self.live.remove(&ip);
        if settings.drain_on_removal.is_zero() {
            events.push(Event::Removed(ip));
        } else {
            self.draining.insert(ip, now + settings.drain_on_removal);
            events.push(Event::Draining(ip, settings.drain_on_removal));
        }
    }

    /// Whether the name is due for a resolution at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.next_refresh <= now
    }

    /// The next instant something happens: a resolution or a draining
    /// window's end.
    pub fn next_deadline(&self) -> Instant {
        self.draining
            .values()
            .copied()
            .chain([self.next_refresh])
            .min()
            .unwrap_or(self.next_refresh)
    }

    /// The addresses served, each with whether it is draining, by address.
    pub fn addresses(&self) -> Vec<(IpAddr, bool)> {
        let mut out: Vec<(IpAddr, bool)> = self
            .live
            .iter()
            .map(|ip| (*ip, false))
            .chain(self.draining.keys().map(|ip| (*ip, true)))
            .collect();
        out.sort();
        out
    }

    /// Failed resolutions since the name was first resolved.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Whether the latest resolution failed.
    pub fn in_outage(&self) -> bool {
        self.outage.is_some()
    }

    /// The latest failure's reason, if any resolution failed.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// Whether an answer without addresses waits for its confirmation.
    pub fn awaits_confirmation(&self) -> bool {
        self.unconfirmed.is_some()
    }
}

#[cfg(test)]
mod tests {
    //! The state fed answers and instants, no I/O.

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn settings() -> DnsSettings {
        DnsSettings {
            min_refresh: Duration::from_secs(5),
            max_refresh: Duration::from_secs(60),
            drain_on_removal: Duration::from_secs(30),
            ..DnsSettings::default()
        }
    }

    fn answer(ips: &[&str]) -> Answer {
        Answer::addresses(ips.iter().map(|s| ip(s)), Duration::from_secs(10))
    }

    fn nxdomain() -> Answer {
        Answer::NoAddresses {
            nxdomain: true,
            negative_ttl: None,
        }
    }

    fn timeout() -> Answer {
        Answer::Failed {
            reason: "request timed out".into(),
        }
    }

    fn served(s: &NameState) -> Vec<(String, bool)> {
        s.addresses()
            .into_iter()
            .map(|(ip, d)| (ip.to_string(), d))
            .collect()
    }

    fn live(ips: &[&str]) -> Vec<(String, bool)> {
        ips.iter().map(|s| (s.to_string(), false)).collect()
    }

    #[test]
    fn a_name_that_never_resolved_is_its_answer() {
        let t0 = Instant::now();
        assert_eq!(
            NameState::first(&nxdomain(), t0, &settings()),
            Err(nxdomain())
        );
        assert_eq!(
            NameState::first(&timeout(), t0, &settings()),
            Err(timeout())
        );
        assert_eq!(
            NameState::first(&answer(&[]), t0, &settings()),
            Err(Answer::NoAddresses {
                nxdomain: false,
                negative_ttl: None
            })
        );
        let s = NameState::first(&answer(&["127.0.0.2", "::1"]), t0, &settings()).unwrap();
        assert_eq!(served(&s), live(&["127.0.0.2", "::1"]));
    }

    #[test]
    fn dns_trouble_keeps_the_last_good_addresses_and_is_one_event() {
        let t0 = Instant::now();
        let cfg = settings();
        let mut s = NameState::first(&answer(&["127.0.0.2", "127.0.0.3"]), t0, &cfg).unwrap();
        let mut events = Vec::new();
        for k in 1..=4 {
            events.extend(s.apply(&timeout(), t0 + Duration::from_secs(5 * k), &cfg));
            assert_eq!(served(&s), live(&["127.0.0.2", "127.0.0.3"]));
            assert!(s.in_outage());
        }
        assert_eq!(
            events,
            [Event::OutageStarted {
                reason: "request timed out".into(),
                kept: 2
            }]
        );
        assert_eq!(s.failures(), 4);
        // Retried at the minimum refresh while failing.
        assert_eq!(s.next_deadline(), t0 + Duration::from_secs(25));
        let events = s.apply(
            &answer(&["127.0.0.2", "127.0.0.3"]),
            t0 + Duration::from_secs(25),
            &cfg,
        );
        assert_eq!(events, [Event::OutageEnded { failures: 4 }]);
        assert!(!s.in_outage());
        // A second outage is an event again.
        let events = s.apply(&timeout(), t0 + Duration::from_secs(40), &cfg);
        assert!(matches!(events[..], [Event::OutageStarted { kept: 2, .. }]));
    }

    #[test]
    fn an_empty_answer_counts_once_confirmed() {
        let t0 = Instant::now();
        let cfg = settings();
        let mut s = NameState::first(&answer(&["127.0.0.2"]), t0, &cfg).unwrap();
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(
            s.apply(&nxdomain(), t1, &cfg),
            [Event::Unconfirmed(nxdomain())]
        );
        assert_eq!(
            served(&s),
            live(&["127.0.0.2"]),
            "one NXDOMAIN changes nothing"
        );
        assert!(s.awaits_confirmation());
        assert_eq!(s.next_deadline(), t1 + cfg.min_refresh, "confirmed soon");
        // The addresses again: the NXDOMAIN is forgotten, and the next one
        // needs its own confirmation.
        let t2 = t1 + Duration::from_secs(5);
        assert_eq!(
            s.apply(&answer(&["127.0.0.2"]), t2, &cfg),
            [Event::NotConfirmed]
        );
        let t3 = t2 + Duration::from_secs(10);
        assert_eq!(
            s.apply(&nxdomain(), t3, &cfg),
            [Event::Unconfirmed(nxdomain())]
        );
        // A failure in between neither confirms nor forgets it.
        let t4 = t3 + Duration::from_secs(5);
        assert_eq!(s.apply(&timeout(), t4, &cfg).len(), 1);
        assert_eq!(served(&s), live(&["127.0.0.2"]));
        let t5 = t4 + Duration::from_secs(5);
        let events = s.apply(&nxdomain(), t5, &cfg);
        assert_eq!(
            events,
            [
                Event::OutageEnded { failures: 1 },
                Event::Confirmed(nxdomain()),
                Event::Draining(ip("127.0.0.2"), Duration::from_secs(30)),
            ]
        );
        assert_eq!(served(&s), [("127.0.0.2".to_string(), true)]);
        assert_eq!(
            s.expire(t5 + Duration::from_secs(30)),
            [Event::Removed(ip("127.0.0.2"))]
        );
        assert!(s.addresses().is_empty());
        // With nothing left, further empty answers are no events.
        assert!(s
            .apply(&nxdomain(), t5 + Duration::from_secs(40), &cfg)
            .is_empty());
    }

    #[test]
    fn a_vanished_address_drains_for_the_window_then_goes() {
        let t0 = Instant::now();
        let cfg = settings();
        let mut s = NameState::first(&answer(&["127.0.0.2", "127.0.0.3"]), t0, &cfg).unwrap();
        let t1 = t0 + Duration::from_secs(10);
        let events = s.apply(&answer(&["127.0.0.2", "127.0.0.4"]), t1, &cfg);
        assert_eq!(
            events,
            [
                Event::Added(ip("127.0.0.4")),
                Event::Draining(ip("127.0.0.3"), Duration::from_secs(30)),
            ]
        );
        assert_eq!(
            served(&s),
            [
                ("127.0.0.2".to_string(), false),
                ("127.0.0.3".to_string(), true),
                ("127.0.0.4".to_string(), false),
            ]
        );
        assert_eq!(
            s.next_deadline(),
            t1 + Duration::from_secs(10),
            "the TTL's refresh first"
        );
        // A refresh inside the window keeps it draining.
        let t2 = t1 + Duration::from_secs(10);
        let long = Answer::addresses([ip("127.0.0.2"), ip("127.0.0.4")], Duration::from_secs(60));
        assert!(s.apply(&long, t2, &cfg).is_empty());
        assert!(s.expire(t1 + Duration::from_secs(29)).is_empty());
        assert_eq!(
            s.next_deadline(),
            t1 + Duration::from_secs(30),
            "the window's end"
        );
        assert_eq!(
            s.expire(t1 + Duration::from_secs(30)),
            [Event::Removed(ip("127.0.0.3"))]
        );
        assert_eq!(served(&s), live(&["127.0.0.2", "127.0.0.4"]));
    }

    #[test]
    fn an_address_back_within_the_window_is_served_as_before() {
        let t0 = Instant::now();
        let cfg = settings();
        let mut s = NameState::first(&answer(&["127.0.0.2", "127.0.0.3"]), t0, &cfg).unwrap();
        s.apply(&answer(&["127.0.0.2"]), t0 + Duration::from_secs(10), &cfg);
        let events = s.apply(
            &answer(&["127.0.0.2", "127.0.0.3"]),
            t0 + Duration::from_secs(20),
            &cfg,
        );
        assert_eq!(events, [Event::Back(ip("127.0.0.3"))]);
        assert_eq!(served(&s), live(&["127.0.0.2", "127.0.0.3"]));
        // Its old window is gone with it.
        assert!(s.expire(t0 + Duration::from_secs(40)).is_empty());
        // Back after the window: a new address.
        s.apply(&answer(&["127.0.0.2"]), t0 + Duration::from_secs(50), &cfg);
        assert_eq!(
            s.expire(t0 + Duration::from_secs(80)),
            [Event::Removed(ip("127.0.0.3"))]
        );
        let events = s.apply(
            &answer(&["127.0.0.2", "127.0.0.3"]),
            t0 + Duration::from_secs(90),
            &cfg,
        );
        assert_eq!(events, [Event::Added(ip("127.0.0.3"))]);
    }

    #[test]
    fn drain_on_removal_zero_removes_at_once() {
        let t0 = Instant::now();
        let cfg = DnsSettings {
            drain_on_removal: Duration::ZERO,
            ..settings()
        };
        let mut s = NameState::first(&answer(&["127.0.0.2", "127.0.0.3"]), t0, &cfg).unwrap();
        let events = s.apply(&answer(&["127.0.0.2"]), t0 + Duration::from_secs(10), &cfg);
        assert_eq!(events, [Event::Removed(ip("127.0.0.3"))]);
        assert_eq!(served(&s), live(&["127.0.0.2"]));
    }

    #[test]
    fn the_ttl_sets_the_refresh_within_its_bounds() {
        let t0 = Instant::now();
        let cfg = settings();
        for (ttl, after) in [(0, 5), (1, 5), (12, 12), (3600, 60)] {
            let a = Answer::addresses([ip("127.0.0.2")], Duration::from_secs(ttl));
            let s = NameState::first(&a, t0, &cfg).unwrap();
            assert_eq!(
                s.next_deadline(),
                t0 + Duration::from_secs(after),
                "ttl {ttl}"
            );
            assert!(!s.due(t0 + Duration::from_secs(after) - Duration::from_millis(1)));
            assert!(s.due(t0 + Duration::from_secs(after)));
        }
    }
}
