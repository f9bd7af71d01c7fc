//! Removal of DRAINING endpoints (a service's `drain`): when one is due,
//! and the ClusterLoadAssignments without the removed ones.
//!
//! A DRAINING endpoint of a service with `drain` leaves EDS once its
//! verdict ([`crate::load`]) has been `idle` without a break for
//! `removeWhenIdle`, or once it has been DRAINING for `maxDrain`, whatever
//! its verdict (`busy` and `unknown` never count as idle). The decision is
//! [`DrainPolicy::deadline`], pure: fed the drain's start, when the
//! endpoint last turned idle and the time, it says when and why. The
//! control plane ([`crate::server::ControlPlane`]) keeps the removed ones
//! out of what it serves while they stay DRAINING in the file (or in DNS),
//! and serves them again once they are not.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use prost::Message;
use tether_xds::resource::{pack, ResourceKind};

use crate::model::DrainSpec;
use crate::translate::{Resources, Translated};

/// A service's `drain`: when its DRAINING endpoints are removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainPolicy {
    /// Removed once idle without a break this long.
    pub remove_when_idle: Option<Duration>,
    /// Removed this long after the drain began, whatever the verdict.
    pub max_drain: Option<Duration>,
}

impl From<&DrainSpec> for DrainPolicy {
    fn from(spec: &DrainSpec) -> Self {
        DrainPolicy {
            remove_when_idle: spec.remove_when_idle.map(|d| d.0),
            max_drain: spec.max_drain.map(|d| d.0),
        }
    }
}

/// Why a DRAINING endpoint was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalReason {
    /// Its verdict was `idle` for `removeWhenIdle` (this long).
    Idle(Duration),
    /// It had been DRAINING for `maxDrain` (this long).
    MaxDrain(Duration),
}

impl RemovalReason {
    /// The `reason` label of `tether_control_drain_removals_total`.
    pub fn label(&self) -> &'static str {
        match self {
            RemovalReason::Idle(_) => "idle",
            RemovalReason::MaxDrain(_) => "max_drain",
        }
    }
}

impl fmt::Display for RemovalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |d: &Duration| tether_core::duration::display(*d).to_string();
        match self {
            RemovalReason::Idle(d) => write!(f, "idle for {}", shown(d)),
            RemovalReason::MaxDrain(d) => write!(f, "maxDrain {} reached", shown(d)),
        }
    }
}

impl DrainPolicy {
    /// When an endpoint DRAINING since `since`, idle without a break
    /// since `idle_since` (`None`: its verdict is not `idle`), is to be
    /// removed if nothing changes, and why; the earlier of the two rules.
    /// Due at `now` when the instant is not after `now`.
    pub fn deadline(
        &self,
        since: Instant,
        idle_since: Option<Instant>,
    ) -> Option<(Instant, RemovalReason)> {
        let idle = self
            .remove_when_idle
            .zip(idle_since)
            .and_then(|(d, at)| Some((at.checked_add(d)?, RemovalReason::Idle(d))));
        let max = self
            .max_drain
            .and_then(|d| Some((since.checked_add(d)?, RemovalReason::MaxDrain(d))));
        match (idle, max) {
            (Some(i), Some(m)) => Some(if m.0 < i.0 { m } else { i }),
            (i, m) => i.or(m),
        }
    }

    /// Why the endpoint is to be removed at `now`, if it is.
    pub fn due(
        &self,
        since: Instant,
        idle_since: Option<Instant>,
        now: Instant,
    ) -> Option<RemovalReason> {
        self.deadline(since, idle_since)
            .filter(|(at, _)| *at <= now)
            .map(|(_, why)| why)
    }
}

/// An endpoint of a service: (EDS name, address).
pub type EndpointKey = (String, SocketAddr);

/// The endpoints the ClusterLoadAssignments of `services` list in
/// `resources` (the proxyless ones: both flavors share them), each with
/// whether it is DRAINING.
pub fn endpoints_of(
    resources: &Translated,
    services: &BTreeSet<&str>,
) -> BTreeMap<EndpointKey, bool> {
    let mut out = BTreeMap::new();
    let Some(assignments) = resources.proxyless.get(&ResourceKind::Endpoints) else {
        return out;
    };
    for service in services {
        let Some(any) = assignments.get(*service) else {
            continue;
        };
        let Ok(cla) = epb::ClusterLoadAssignment::decode(any.value.as_slice()) else {
            continue;
        };
        for e in cla.endpoints.iter().flat_map(|g| &g.lb_endpoints) {
            if let Some(address) = address_of(e) {
                let draining = e.health_status == core::HealthStatus::Draining as i32;
                out.insert(((*service).to_owned(), address), draining);
            }
        }
    }
    out
}

/// `resources` without the DRAINING endpoints `removed` lists, in every
/// flavor's ClusterLoadAssignments (Envoy's of `envoy.nodes` too). A
/// locality left without endpoints goes, and the priorities left are
/// numbered again from 0 (gRPC refuses a gap).
pub fn leave_out(mut resources: Translated, removed: &BTreeSet<EndpointKey>) -> Translated {
    if removed.is_empty() {
        return resources;
    }
    let services: BTreeSet<&str> = removed.iter().map(|(s, _)| s.as_str()).collect();
    let sets = std::iter::once(&mut resources.envoy)
        .chain(std::iter::once(&mut resources.proxyless))
        .chain(resources.envoy_nodes.values_mut());
    for set in sets {
        leave_out_of(set, &services, removed);
    }
    resources
}

fn leave_out_of(set: &mut Resources, services: &BTreeSet<&str>, removed: &BTreeSet<EndpointKey>) {
    let Some(assignments) = set.get_mut(&ResourceKind::Endpoints) else {
        return;
    };
    for service in services {
        let Some(any) = assignments.get_mut(*service) else {
            continue;
        };
        let Ok(mut cla) = epb::ClusterLoadAssignment::decode(any.value.as_slice()) else {
            continue;
        };
        let mut changed = false;
        for group in &mut cla.endpoints {
            group.lb_endpoints.retain(|e| {
                let gone = e.health_status == core::HealthStatus::Draining as i32
                    && address_of(e).is_some_and(|a| removed.contains(&((*service).to_owned(), a)));
                changed |= gone;
                !gone
            });
        }
        if !changed {
            continue;
        }
        cla.endpoints.retain(|g| !g.lb_endpoints.is_empty());
        let priorities: BTreeSet<u32> = cla.endpoints.iter().map(|g| g.priority).collect();
        let renumbered: BTreeMap<u32, u32> = priorities.into_iter().zip(0..).collect();
        for group in &mut cla.endpoints {
            group.priority = renumbered[&group.priority];
        }
        *any = pack(&cla);
    }
}

/// An LbEndpoint's primary address as `IP:PORT`.
pub(crate) fn address_of(e: &epb::LbEndpoint) -> Option<SocketAddr> {
    let Some(epb::lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
        return None;
    };
    match ep.address.as_ref()?.address.as_ref()? {
        core::address::Address::SocketAddress(s) => {
            let ip = s.address.parse().ok()?;
            match s.port_specifier.as_ref()? {
                core::socket_address::PortSpecifier::PortValue(p) => {
                    Some(SocketAddr::new(ip, u16::try_from(*p).ok()?))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn idle_removal_counts_from_the_idle_start_and_max_drain_from_the_drain_start() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + secs(s);
        let both = DrainPolicy {
            remove_when_idle: Some(secs(30)),
            max_drain: Some(secs(300)),
        };
        // Not idle: only maxDrain can remove it.
        assert_eq!(
            both.deadline(at(0), None),
            Some((at(300), RemovalReason::MaxDrain(secs(300))))
        );
        assert_eq!(both.due(at(0), None, at(299)), None);
        assert_eq!(
            both.due(at(0), None, at(300)),
            Some(RemovalReason::MaxDrain(secs(300)))
        );
        // Idle since 100 s: removed at 130 s, not a moment before.
        assert_eq!(both.due(at(0), Some(at(100)), at(129)), None);
        assert_eq!(
            both.due(at(0), Some(at(100)), at(130)),
            Some(RemovalReason::Idle(secs(30)))
        );
        // Idle late: maxDrain comes first.
        assert_eq!(
            both.deadline(at(0), Some(at(290))),
            Some((at(300), RemovalReason::MaxDrain(secs(300))))
        );
        // removeWhenIdle alone never removes a busy or unknown endpoint.
        let idle_only = DrainPolicy {
            remove_when_idle: Some(secs(30)),
            max_drain: None,
        };
        assert_eq!(idle_only.deadline(at(0), None), None);
        assert_eq!(
            RemovalReason::Idle(Duration::from_millis(1500)).to_string(),
            "idle for 1.500s"
        );
        assert_eq!(
            RemovalReason::MaxDrain(secs(600)).to_string(),
            "maxDrain 600s reached"
        );
    }

    /// The (priority, address, health) of every endpoint of `service`'s
    /// ClusterLoadAssignment in `set`.
    fn served(set: &Resources, service: &str) -> Vec<(u32, String, i32)> {
        let any = &set[&ResourceKind::Endpoints][service];
        let cla = epb::ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
        cla.endpoints
            .iter()
            .flat_map(|g| {
                g.lb_endpoints.iter().map(|e| {
                    (
                        g.priority,
                        address_of(e).unwrap().to_string(),
                        e.health_status,
                    )
                })
            })
            .collect()
    }

    #[test]
    fn removed_draining_endpoints_leave_every_flavors_assignment_priorities_stay_contiguous() {
        let config = crate::model::Config::parse(
            r#"envoy:
  nodes:
    - id: edge-1
services:
  - name: shop
    drain: { maxDrain: 60s }
    endpoints:
      - address: 10.0.0.1:80
      - address: 10.0.0.2:80
        health: DRAINING
        priority: 1
        locality: us/b
      - address: 10.0.0.3:80
        priority: 2
  - name: other
    endpoints:
      - address: 10.0.0.2:80
        health: DRAINING
"#,
        )
        .unwrap();
        let full = crate::translate::translate(&config);
        assert_eq!(
            full.drain["shop"],
            DrainPolicy {
                remove_when_idle: None,
                max_drain: Some(secs(60)),
            }
        );
        let b: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert_eq!(
            endpoints_of(&full, &BTreeSet::from(["shop"])),
            BTreeMap::from([
                (("shop".to_owned(), a), false),
                (("shop".to_owned(), b), true),
                (("shop".to_owned(), "10.0.0.3:80".parse().unwrap()), false),
            ])
        );
        // A HEALTHY endpoint is never left out, whatever the set says.
        let removed = BTreeSet::from([("shop".to_owned(), b), ("shop".to_owned(), a)]);
        let served_now = leave_out(full.clone(), &removed);
        let healthy = core::HealthStatus::Healthy as i32;
        let want = vec![
            (0, "10.0.0.1:80".to_owned(), healthy),
            (1, "10.0.0.3:80".to_owned(), healthy),
        ];
        assert_eq!(served(&served_now.proxyless, "shop"), want);
        assert_eq!(served(&served_now.envoy, "shop"), want);
        assert_eq!(served(&served_now.envoy_nodes["edge-1"], "shop"), want);
        // Another service's endpoint at the same address stays, and so
        // does every other resource.
        assert_eq!(
            served(&served_now.proxyless, "other"),
            served(&full.proxyless, "other")
        );
        assert_eq!(
            served_now.proxyless[&ResourceKind::Cluster],
            full.proxyless[&ResourceKind::Cluster]
        );
        assert_eq!(leave_out(full.clone(), &BTreeSet::new()), full);
    }
}
