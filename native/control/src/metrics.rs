//! tether-control's own metrics, for Prometheus: the clients connected by
//! node and kind, pushes and ACK/NACK counts per resource type, the version
//! each client ACKed, file reloads and rejected files, the DNS names'
//! figures, and the DRAINING endpoints removed by their service's `drain`.
//! Encoded in the OpenMetrics text format (which Prometheus scrapes) by
//! the admin listener's `/metrics` ([`crate::admin`]).
//!
//! Label values that come from the network are bounded: a node ID is a
//! label only while its stream is open, and at most [`MAX_NODES`] distinct
//! ones are tracked (the rest share `node="other"`); resource types are
//! xDS's four.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tether_xds::resource::ResourceKind;

use crate::dns::DnsStatus;

/// Distinct node IDs kept as label values at a time.
pub const MAX_NODES: usize = 1024;

/// The label value of nodes past [`MAX_NODES`].
const OTHER_NODE: &str = "other";

/// A connected client.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientLabels {
    node: String,
    /// The stream's protocol (`ads`).
    kind: &'static str,
    /// Which resources it gets (`envoy` or `proxyless`).
    flavor: &'static str,
}

/// A resource type (`listener`, `route`, `cluster`, `endpoint`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    resource_type: &'static str,
}

/// What one client ACKed of one type.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AckedLabels {
    node: String,
    resource_type: &'static str,
}

/// Why a DRAINING endpoint was removed (`idle`, `max_drain`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DrainRemovalLabels {
    reason: &'static str,
}

/// A DRAINING endpoint: its service (EDS resource) and address.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    service: String,
    address: String,
}

/// A drain verdict (`busy`, `idle`, `unknown`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    verdict: &'static str,
}

/// A reload's outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

/// The control plane's metrics; cheap to clone (shared).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    clients: Family<ClientLabels, Gauge>,
    pushes: Family<TypeLabels, Counter>,
    acks: Family<TypeLabels, Counter>,
    nacks: Family<TypeLabels, Counter>,
    acked_version: Family<AckedLabels, Gauge>,
    snapshot_version: Gauge,
    reloads: Family<ReloadLabels, Counter>,
    dns_names: Gauge,
    dns_addresses: Gauge,
    dns_draining: Gauge,
    dns_in_outage: Gauge,
    dns_failures: Gauge,
    drain_removals: Family<DrainRemovalLabels, Counter>,
    draining_sessions: Family<EndpointLabels, Gauge>,
    draining_endpoints: Family<VerdictLabels, Gauge>,
    /// Node IDs in use as label values, with their open streams.
    nodes: Arc<Mutex<NodeLabels>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct NodeLabels {
    /// Per node ID kept as a label value: its open streams, and the types
    /// whose ACKed version it reported.
    open: std::collections::HashMap<String, (usize, HashSet<&'static str>)>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// A client stream's place in the metrics; its gauges go when it is dropped.
#[derive(Debug)]
pub struct ClientGuard {
    metrics: Metrics,
    labels: ClientLabels,
}

impl ClientGuard {
    /// The node's label value (its ID, or `other` past [`MAX_NODES`]).
    pub fn node(&self) -> &str {
        &self.labels.node
    }

    /// The client ACKed `version` of `kind`.
    pub fn ack(&self, kind: ResourceKind, version: &str) {
        let resource_type = type_label(kind);
        self.metrics
            .acks
            .get_or_create(&TypeLabels { resource_type })
            .inc();
        if let Ok(v) = version.parse::<i64>() {
            self.metrics
                .acked_version
                .get_or_create(&AckedLabels {
                    node: self.labels.node.clone(),
                    resource_type,
                })
                .set(v);
            let mut nodes = self.metrics.nodes();
            if let Some((_, acked)) = nodes.open.get_mut(&self.labels.node) {
                acked.insert(resource_type);
            }
        }
    }

    /// The client NACKed a response of `kind`.
    pub fn nack(&self, kind: ResourceKind) {
        self.metrics
            .nacks
            .get_or_create(&TypeLabels {
                resource_type: type_label(kind),
            })
            .inc();
    }

    /// A response of `kind` was pushed to the client.
    pub fn pushed(&self, kind: ResourceKind) {
        self.metrics
            .pushes
            .get_or_create(&TypeLabels {
                resource_type: type_label(kind),
            })
            .inc();
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.metrics.clients.get_or_create(&self.labels).dec();
        let mut nodes = self.metrics.nodes();
        let last = match nodes.open.get_mut(&self.labels.node) {
            Some((n, _)) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if let Some((_, acked)) = last.then(|| nodes.open.remove(&self.labels.node)).flatten() {
            self.metrics.clients.remove(&self.labels);
            for resource_type in acked {
                self.metrics.acked_version.remove(&AckedLabels {
                    node: self.labels.node.clone(),
                    resource_type,
                });
            }
        }
    }
}

impl Metrics {
    /// Every metric registered, at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tether_control");
        let clients = Family::<ClientLabels, Gauge>::default();
        registry.register(
            "clients",
            "Client streams open, by node ID, protocol and flavor",
            clients.clone(),
        );
        let pushes = Family::<TypeLabels, Counter>::default();
        registry.register(
            "pushes",
            "Discovery responses sent, by resource type",
            pushes.clone(),
        );
        let acks = Family::<TypeLabels, Counter>::default();
        registry.register(
            "acks",
            "Responses clients ACKed, by resource type",
            acks.clone(),
        );
        let nacks = Family::<TypeLabels, Counter>::default();
        registry.register(
            "nacks",
            "Responses clients NACKed, by resource type",
            nacks.clone(),
        );
        let acked_version = Family::<AckedLabels, Gauge>::default();
        registry.register(
            "acked_version",
            "The snapshot version each connected node last ACKed, by resource type",
            acked_version.clone(),
        );
        let snapshot_version = Gauge::default();
        registry.register(
            "snapshot_version",
            "The snapshot version served",
            snapshot_version.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "reloads",
            "Changed configuration files read, by result (published, rejected)",
            reloads.clone(),
        );
        let dns_names = Gauge::default();
        registry.register("dns_names", "DNS names in use", dns_names.clone());
        let dns_addresses = Gauge::default();
        registry.register(
            "dns_addresses",
            "Addresses served for DNS names, draining ones included",
            dns_addresses.clone(),
        );
        let dns_draining = Gauge::default();
        registry.register(
            "dns_draining_addresses",
            "Addresses that left their name's answer, served DRAINING until drainOnRemoval ends",
            dns_draining.clone(),
        );
        let dns_in_outage = Gauge::default();
        registry.register(
            "dns_names_in_outage",
            "DNS names whose latest resolution failed (their last good addresses are served)",
            dns_in_outage.clone(),
        );
        let dns_failures = Gauge::default();
        registry.register(
            "dns_resolution_failures",
            "Failed resolutions of the names in use, summed over the names",
            dns_failures.clone(),
        );
        let drain_removals = Family::<DrainRemovalLabels, Counter>::default();
        registry.register(
            "drain_removals",
            "DRAINING endpoints removed from EDS by their service's drain, by reason (idle, max_drain)",
            drain_removals.clone(),
        );
        // Both series exist from the start, at zero.
        for reason in ["idle", "max_drain"] {
            let _ = drain_removals.get_or_create(&DrainRemovalLabels { reason });
        }
        let draining_sessions = Family::<EndpointLabels, Gauge>::default();
        registry.register(
            "draining_sessions",
            "Sessions the reporting clients pin to each DRAINING endpoint still served, summed over clients",
            draining_sessions.clone(),
        );
        let draining_endpoints = Family::<VerdictLabels, Gauge>::default();
        registry.register(
            "draining_endpoints",
            "DRAINING endpoints still served, by drain verdict (busy, idle, unknown)",
            draining_endpoints.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            clients,
            pushes,
            acks,
            nacks,
            acked_version,
            snapshot_version,
            reloads,
            dns_names,
            dns_addresses,
            dns_draining,
            dns_in_outage,
            dns_failures,
            drain_removals,
            draining_sessions,
            draining_endpoints,
            nodes: Arc::default(),
        }
    }

    /// A client stream from `node_id` opened (`envoy`: it gets Envoy's
    /// resources); it counts until the guard is dropped.
    pub fn client(&self, node_id: &str, envoy: bool) -> ClientGuard {
        let node = {
            let mut nodes = self.nodes();
            let node = if nodes.open.contains_key(node_id) || nodes.open.len() < MAX_NODES {
                node_id.to_owned()
            } else {
                OTHER_NODE.to_owned()
            };
            nodes.open.entry(node.clone()).or_default().0 += 1;
            node
        };
        let labels = ClientLabels {
            node,
            kind: "ads",
            flavor: if envoy { "envoy" } else { "proxyless" },
        };
        self.clients.get_or_create(&labels).inc();
        ClientGuard {
            metrics: self.clone(),
            labels,
        }
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, NodeLabels> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The version now served.
    pub fn serving(&self, version: u64) {
        self.snapshot_version
            .set(i64::try_from(version).unwrap_or(i64::MAX));
    }

    /// A changed file was read: `published` or rejected.
    pub fn reloaded(&self, published: bool) {
        let result = if published { "published" } else { "rejected" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// A DRAINING endpoint was removed from EDS, for `reason` (`idle`,
    /// `max_drain`).
    pub fn drain_removed(&self, reason: &'static str) {
        self.drain_removals
            .get_or_create(&DrainRemovalLabels { reason })
            .inc();
    }

    /// Where the DNS names stand now.
    pub fn dns(&self, status: &DnsStatus) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.dns_names.set(gauge(status.len()));
        self.dns_addresses
            .set(gauge(status.values().map(|n| n.addresses.len()).sum()));
        self.dns_draining.set(gauge(
            status
                .values()
                .flat_map(|n| &n.addresses)
                .filter(|a| a.draining)
                .count(),
        ));
        self.dns_in_outage
            .set(gauge(status.values().filter(|n| n.in_outage).count()));
        self.dns_failures.set(
            status
                .values()
                .map(|n| i64::try_from(n.failures).unwrap_or(i64::MAX))
                .fold(0i64, i64::saturating_add),
        );
    }

    /// The drains as `status` has them: sessions per DRAINING endpoint
    /// still served (the series of one that left goes), endpoints per
    /// verdict (each verdict's series always there).
    pub fn draining(&self, status: &crate::load::DrainStatus) {
        self.draining_sessions.clear();
        let mut verdicts = [("busy", 0), ("idle", 0), ("unknown", 0)];
        for e in status.endpoints.iter().filter(|e| !e.removed) {
            let sessions: u64 = e.clients.iter().filter_map(|c| c.sessions).sum();
            self.draining_sessions
                .get_or_create(&EndpointLabels {
                    service: e.cluster.clone(),
                    address: e.address.clone(),
                })
                .set(i64::try_from(sessions).unwrap_or(i64::MAX));
            if let Some(v) = verdicts.iter_mut().find(|(v, _)| *v == e.verdict) {
                v.1 += 1;
            }
        }
        for (verdict, n) in verdicts {
            self.draining_endpoints
                .get_or_create(&VerdictLabels { verdict })
                .set(n);
        }
    }

    /// Every metric in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The label value of a resource type.
fn type_label(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::Listener => "listener",
        ResourceKind::RouteConfiguration => "route",
        ResourceKind::Cluster => "cluster",
        ResourceKind::Endpoints => "endpoint",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn a_clients_gauges_go_with_its_last_stream() {
        let m = Metrics::new();
        let a = m.client("node-a", true);
        let b = m.client("node-a", true);
        a.ack(ResourceKind::Cluster, "7");
        a.pushed(ResourceKind::Cluster);
        b.nack(ResourceKind::Endpoints);
        let text = m.encode();
        assert!(
            line(
                &text,
                r#"tether_control_clients{node="node-a",kind="ads",flavor="envoy"} 2"#
            )
            .is_some(),
            "{text}"
        );
        assert!(line(
            &text,
            r#"tether_control_acked_version{node="node-a",resource_type="cluster"} 7"#
        )
        .is_some());
        assert!(line(
            &text,
            r#"tether_control_pushes_total{resource_type="cluster"} 1"#
        )
        .is_some());
        assert!(line(
            &text,
            r#"tether_control_nacks_total{resource_type="endpoint"} 1"#
        )
        .is_some());
        drop(a);
        let text = m.encode();
        assert!(line(&text, r#"tether_control_clients{node="node-a""#)
            .is_some_and(|l| l.ends_with(" 1")));
        drop(b);
        let text = m.encode();
        assert!(
            line(&text, r#"tether_control_clients{"#).is_none(),
            "{text}"
        );
        assert!(
            line(&text, r#"tether_control_acked_version{"#).is_none(),
            "{text}"
        );
        // Counters stay.
        assert!(line(
            &text,
            r#"tether_control_acks_total{resource_type="cluster"} 1"#
        )
        .is_some());
    }

    #[test]
    fn node_ids_past_the_bound_share_one_label_value() {
        let m = Metrics::new();
        let guards: Vec<ClientGuard> = (0..MAX_NODES)
            .map(|i| m.client(&format!("n{i}"), false))
            .collect();
        let extra = m.client("one-too-many", false);
        assert_eq!(extra.node(), OTHER_NODE);
        let again = m.client("n3", false);
        assert_eq!(again.node(), "n3", "a node in use keeps its label");
        drop(guards);
        let fresh = m.client("fresh", false);
        assert_eq!(fresh.node(), "fresh", "places free up as streams end");
    }
}
