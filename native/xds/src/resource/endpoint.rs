//! ClusterLoadAssignment validation: priorities (contiguous from 0),
//! weighted localities, endpoint weights, health status (UNHEALTHY, TIMEOUT
//! and DEGRADED dropped; DRAINING kept for sessions, A55) and several
//! addresses per endpoint (A61).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;

pub use epb::ClusterLoadAssignment;

use super::Check;

/// An endpoint's health status as EDS reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HealthStatus {
    /// Not known (treated as healthy).
    Unknown,
    /// Healthy.
    Healthy,
    /// Unhealthy.
    Unhealthy,
    /// Draining: existing sessions only.
    Draining,
    /// Health check timed out.
    Timeout,
    /// Degraded.
    Degraded,
}

impl HealthStatus {
    /// From the wire enum.
    pub fn from_i32(v: i32) -> Option<Self> {
        Some(match v {
            0 => HealthStatus::Unknown,
            1 => HealthStatus::Healthy,
            2 => HealthStatus::Unhealthy,
            3 => HealthStatus::Draining,
            4 => HealthStatus::Timeout,
            5 => HealthStatus::Degraded,
            _ => return None,
        })
    }

    /// The wire enum value.
    pub fn as_i32(self) -> i32 {
        match self {
            HealthStatus::Unknown => 0,
            HealthStatus::Healthy => 1,
            HealthStatus::Unhealthy => 2,
            HealthStatus::Draining => 3,
            HealthStatus::Timeout => 4,
            HealthStatus::Degraded => 5,
        }
    }

    /// The name as Envoy writes it (`HEALTHY`).
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Unknown => "UNKNOWN",
            HealthStatus::Healthy => "HEALTHY",
            HealthStatus::Unhealthy => "UNHEALTHY",
            HealthStatus::Draining => "DRAINING",
            HealthStatus::Timeout => "TIMEOUT",
            HealthStatus::Degraded => "DEGRADED",
        }
    }

    /// All statuses.
    pub const ALL: [HealthStatus; 6] = [
        HealthStatus::Unknown,
        HealthStatus::Healthy,
        HealthStatus::Unhealthy,
        HealthStatus::Draining,
        HealthStatus::Timeout,
        HealthStatus::Degraded,
    ];
}

impl fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for HealthStatus {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        HealthStatus::ALL
            .into_iter()
            .find(|h| h.as_str().eq_ignore_ascii_case(s))
            .ok_or(())
    }
}

/// A set of health statuses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HealthSet(u8);

impl HealthSet {
    /// No status.
    pub const EMPTY: HealthSet = HealthSet(0);

    /// gRPC's default for `override_host_status`: UNKNOWN and HEALTHY.
    pub fn default_override() -> Self {
        let mut s = HealthSet::EMPTY;
        s.insert(HealthStatus::Unknown);
        s.insert(HealthStatus::Healthy);
        s
    }

    /// Adds a status.
    pub fn insert(&mut self, h: HealthStatus) {
        self.0 |= 1 << h.as_i32();
    }

    /// Whether it holds `h`.
    pub fn contains(self, h: HealthStatus) -> bool {
        self.0 & (1 << h.as_i32()) != 0
    }

    /// The statuses in wire order.
    pub fn iter(self) -> impl Iterator<Item = HealthStatus> {
        HealthStatus::ALL
            .into_iter()
            .filter(move |h| self.contains(*h))
    }
}

impl fmt::Debug for HealthSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<HealthStatus> for HealthSet {
    fn from_iter<I: IntoIterator<Item = HealthStatus>>(iter: I) -> Self {
        let mut s = HealthSet::EMPTY;
        for h in iter {
            s.insert(h);
        }
        s
    }
}

/// A validated ClusterLoadAssignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointsResource {
    /// The resource name (the cluster's EDS service name).
    pub cluster_name: String,
    /// Priorities from 0 (most preferred) on; never sparse.
    pub priorities: Vec<Priority>,
    /// `policy.drop_overloads`: the share of calls to drop, per category.
    pub drop_overloads: Vec<DropOverload>,
}

/// One drop category of `policy.drop_overloads`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropOverload {
    /// The category's name (never empty).
    pub category: String,
    /// Calls to drop per million, capped at 1,000,000 as gRPC caps it.
    pub per_million: u32,
}

/// The localities of one priority.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Priority {
    /// Localities with a weight above zero, in order.
    pub localities: Vec<LocalityEndpoints>,
}

/// Region, zone and sub-zone (core's, which also orders localities for
/// gRPC's ring hash).
pub use tether_core::hash::LocalityName;

/// A weighted locality and its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalityEndpoints {
    /// Which locality.
    pub locality: LocalityName,
    /// Its weight (above zero).
    pub weight: u32,
    /// Its usable endpoints (UNKNOWN, HEALTHY or DRAINING).
    pub endpoints: Vec<Endpoint>,
}

/// An endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Its addresses: the primary first, then `additional_addresses`.
    pub addresses: Vec<SocketAddr>,
    /// EDS health status.
    pub health: HealthStatus,
    /// Weight (default 1).
    pub weight: u32,
    /// `hostname`, if set.
    pub hostname: String,
}

pub(crate) fn validate(c: &mut Check, la: &ClusterLoadAssignment) -> EndpointsResource {
    let mut by_priority: BTreeMap<u32, Priority> = BTreeMap::new();
    let mut seen_addresses = HashSet::new();
    let mut seen_localities = HashSet::new();
    c.at("endpoints", |c| {
        for (i, loc) in la.endpoints.iter().enumerate() {
            c.index(i, |c| {
                let weight = loc.load_balancing_weight.as_ref().map_or(0, |w| w.value);
                // gRPC ignores localities without a weight.
                if weight == 0 {
                    return;
                }
                // C-core requires the locality (an empty one is fine).
                let Some(l) = &loc.locality else {
                    c.fail_at("locality", "field not present");
                    return;
                };
                let name = LocalityName {
                    region: l.region.clone(),
                    zone: l.zone.clone(),
                    sub_zone: l.sub_zone.clone(),
                };
                if !seen_localities.insert((loc.priority, name.clone())) {
                    c.at("locality", |c| {
                        c.fail(format!(
                            "duplicate locality {name} in priority {}",
                            loc.priority
                        ))
                    });
                }
                let mut endpoints = Vec::new();
                let mut sum: u64 = 0;
                c.at("lb_endpoints", |c| {
                    for (j, ep) in loc.lb_endpoints.iter().enumerate() {
                        c.index(j, |c| {
                            if let Some(e) = endpoint(c, ep, &mut seen_addresses) {
                                sum += u64::from(e.weight);
                                endpoints.push(e);
                            }
                        });
                    }
                });
                if sum > u64::from(u32::MAX) {
                    c.at("lb_endpoints", |c| {
                        c.fail_value(sum, "sum of endpoint weights is above 4294967295")
                    });
                }
                by_priority
                    .entry(loc.priority)
                    .or_default()
                    .localities
                    .push(LocalityEndpoints {
                        locality: name,
                        weight,
                        endpoints,
                    });
            });
        }
        for (p, prio) in &by_priority {
            let total: u64 = prio.localities.iter().map(|l| u64::from(l.weight)).sum();
            if total > u64::from(u32::MAX) {
                c.fail(format!(
                    "sum of locality weights in priority {p} is {total}, above 4294967295"
                ));
            }
        }
        if let Some((&last, _)) = by_priority.iter().next_back() {
            if last as usize + 1 != by_priority.len() {
                let present: Vec<u32> = by_priority.keys().copied().collect();
                c.fail_value(present, "sparse priority list");
            }
        }
    });
    let drops = la
        .policy
        .as_ref()
        .map_or(&[][..], |p| &p.drop_overloads[..]);
    let drop_overloads = c.each("policy.drop_overloads", drops, drop_overload);
    EndpointsResource {
        cluster_name: la.cluster_name.clone(),
        priorities: by_priority.into_values().collect(),
        drop_overloads,
    }
}

/// A drop category with its share normalised to per million (gRPC's rules:
/// HUNDRED, TEN_THOUSAND or MILLION; a share above the whole is capped).
fn drop_overload(
    c: &mut Check,
    d: &epb::cluster_load_assignment::policy::DropOverload,
) -> Option<DropOverload> {
    use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
    if d.category.is_empty() {
        c.fail_at("category", "empty drop category name");
    }
    let Some(p) = &d.drop_percentage else {
        c.fail_at("drop_percentage", "field not present");
        return None;
    };
    let scale = match DenominatorType::try_from(p.denominator) {
        Ok(DenominatorType::Hundred) => 10_000,
        Ok(DenominatorType::TenThousand) => 100,
        Ok(DenominatorType::Million) => 1,
        Err(_) => {
            c.at("drop_percentage.denominator", |c| {
                c.fail_value(p.denominator, "unknown denominator type")
            });
            return None;
        }
    };
    if d.category.is_empty() {
        return None;
    }
    Some(DropOverload {
        category: d.category.clone(),
        per_million: u64::from(p.numerator).saturating_mul(scale).min(1_000_000) as u32,
    })
}

fn endpoint(
    c: &mut Check,
    ep: &epb::LbEndpoint,
    seen: &mut HashSet<SocketAddr>,
) -> Option<Endpoint> {
    let Some(health) = HealthStatus::from_i32(ep.health_status) else {
        c.at("health_status", |c| {
            c.fail_value(ep.health_status, "is not a health status")
        });
        return None;
    };
    let weight = match &ep.load_balancing_weight {
        None => 1,
        Some(w) if w.value == 0 => {
            c.at("load_balancing_weight", |c| {
                c.fail_value(0, "must be greater than 0")
            });
            return None;
        }
        Some(w) => w.value,
    };
    let e = match &ep.host_identifier {
        Some(epb::lb_endpoint::HostIdentifier::Endpoint(e)) => e,
        _ => {
            c.fail_at("endpoint", "field not present");
            return None;
        }
    };
    let mut addresses = Vec::with_capacity(1 + e.additional_addresses.len());
    let primary = c.at("endpoint.address", |c| address(c, e.address.as_ref()));
    addresses.extend(primary);
    c.at("endpoint.additional_addresses", |c| {
        for (k, a) in e.additional_addresses.iter().enumerate() {
            c.index(k, |c| {
                addresses.extend(c.at("address", |c| address(c, a.address.as_ref())))
            });
        }
    });
    if addresses.len() != 1 + e.additional_addresses.len() {
        return None;
    }
    // Unusable statuses are dropped after validation, as gRPC does.
    if !matches!(
        health,
        HealthStatus::Unknown | HealthStatus::Healthy | HealthStatus::Draining
    ) {
        return None;
    }
    for a in &addresses {
        if !seen.insert(*a) {
            c.at("endpoint", |c| {
                c.fail_value(a.to_string(), "is a duplicate endpoint address")
            });
        }
    }
    Some(Endpoint {
        addresses,
        health,
        weight,
        hostname: e.hostname.clone(),
    })
}

fn address(c: &mut Check, a: Option<&core::Address>) -> Option<SocketAddr> {
    use core::socket_address::PortSpecifier;
    let sa = match a.and_then(|a| a.address.as_ref()) {
        Some(core::address::Address::SocketAddress(sa)) => sa,
        Some(_) => {
            c.fail("is not a socket address");
            return None;
        }
        None => {
            c.fail("field not present");
            return None;
        }
    };
    let port = match sa.port_specifier {
        Some(PortSpecifier::PortValue(p)) if p <= 65535 => p as u16,
        Some(PortSpecifier::PortValue(p)) => {
            c.at("socket_address.port_value", |c| {
                c.fail_value(p, "is not a port")
            });
            return None;
        }
        _ => {
            c.fail_at("socket_address.port_value", "field not present");
            return None;
        }
    };
    match sa.address.parse::<IpAddr>() {
        Ok(ip) => Some(SocketAddr::new(ip, port)),
        Err(_) => {
            c.at("socket_address.address", |c| {
                c.fail_value(&sa.address, "is not an IP address")
            });
            None
        }
    }
}

impl EndpointsResource {
    /// Every endpoint with its priority and locality, in order.
    pub fn endpoints(&self) -> impl Iterator<Item = (usize, &LocalityEndpoints, &Endpoint)> {
        self.priorities.iter().enumerate().flat_map(|(p, prio)| {
            prio.localities
                .iter()
                .flat_map(move |l| l.endpoints.iter().map(move |e| (p, l, e)))
        })
    }
}
