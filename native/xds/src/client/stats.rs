//! The XdsClient's own figures, as gRFC A78 defines its metrics: whether
//! the ADS stream to the server works, how often the server went from
//! healthy to unhealthy (A57: a connectivity failure, or a stream that
//! ended without a response), and the resources each response carried,
//! valid and invalid, by type. The ADS state counts them (a few atomic
//! additions per response); [`XdsClientMetrics`] reads them with the
//! watched resources' cache states, for a metrics exporter to poll.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use crate::resource::ResourceKind;

/// The counters of one client.
#[derive(Debug)]
pub(crate) struct ClientStats {
    valid: [AtomicU64; 4],
    invalid: [AtomicU64; 4],
    server_failures: AtomicU64,
    connected: AtomicBool,
    /// The server has not failed since its last response (a new client
    /// starts healthy, so its first failure counts).
    healthy: AtomicBool,
}

impl Default for ClientStats {
    fn default() -> Self {
        ClientStats {
            valid: Default::default(),
            invalid: Default::default(),
            server_failures: AtomicU64::new(0),
            connected: AtomicBool::new(false),
            healthy: AtomicBool::new(true),
        }
    }
}

fn index(kind: ResourceKind) -> usize {
    ResourceKind::ALL
        .iter()
        .position(|k| *k == kind)
        .unwrap_or_default()
}

impl ClientStats {
    /// A response of `kind` carried `valid` and `invalid` resources.
    pub(crate) fn updates(&self, kind: ResourceKind, valid: usize, invalid: usize) {
        self.valid[index(kind)].fetch_add(valid as u64, Ordering::Relaxed);
        self.invalid[index(kind)].fetch_add(invalid as u64, Ordering::Relaxed);
    }

    /// The first response on a stream: the server works.
    pub(crate) fn responded(&self) {
        self.connected.store(true, Ordering::Relaxed);
        self.healthy.store(true, Ordering::Relaxed);
    }

    /// The stream failed before any response (A57): the server is not
    /// working; counted once per healthy spell.
    pub(crate) fn failed(&self) {
        self.connected.store(false, Ordering::Relaxed);
        if self.healthy.swap(false, Ordering::Relaxed) {
            self.server_failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A resource's cache state as A78's `grpc.xds.cache_state` names it
/// (with A88's states): `requested`, `does_not_exist`, `acked`, `nacked`,
/// `received_error`, `timeout`, and `_but_cached` after the failed ones
/// when a previous version is still in use.
pub fn cache_state(state: &crate::client::ResourceState) -> &'static str {
    use crate::client::ResourceStatus as S;
    let cached = state.resource.is_some();
    match (&state.status, cached) {
        (S::Requested, _) => "requested",
        (S::Acked { .. }, _) => "acked",
        (S::Nacked { .. }, true) => "nacked_but_cached",
        (S::Nacked { .. }, false) => "nacked",
        (S::DoesNotExist, true) => "does_not_exist_but_cached",
        (S::DoesNotExist, false) => "does_not_exist",
        (S::Timeout, _) => "timeout",
        (S::ReceivedError { .. }, true) => "received_error_but_cached",
        (S::ReceivedError { .. }, false) => "received_error",
    }
}

/// A resource type as A78's `grpc.xds.resource_type` names it: its type
/// URL without `type.googleapis.com/`.
pub fn resource_type(kind: ResourceKind) -> &'static str {
    let url = kind.type_url();
    url.strip_prefix("type.googleapis.com/").unwrap_or(url)
}

/// A resource name's authority as A78's `grpc.xds.authority` names it:
/// `#old` for a name that is not `xdstp:`.
pub fn authority(name: &str) -> &str {
    match name.strip_prefix("xdstp://") {
        Some(rest) => rest.split('/').next().unwrap_or_default(),
        None => "#old",
    }
}

/// One client's figures at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct XdsClientFigures {
    /// The server's URI (`grpc.xds.server`).
    pub server: String,
    /// The ADS stream works: a response came on it.
    pub connected: bool,
    /// How often the server went from healthy to unhealthy.
    pub server_failures: u64,
    /// Per resource type: resources received valid, and invalid.
    pub updates: Vec<(&'static str, u64, u64)>,
    /// Watched resources by authority, cache state and type, with their
    /// count.
    pub resources: Vec<(String, &'static str, &'static str, u64)>,
}

/// What a metrics exporter polls of one client, without keeping it alive:
/// [`XdsClientMetrics::read`] answers `None` once the client is gone.
#[derive(Debug, Clone)]
pub struct XdsClientMetrics {
    client: Weak<super::Shared>,
    stats: Arc<ClientStats>,
    server: Arc<str>,
}

impl XdsClientMetrics {
    pub(super) fn new(
        client: Weak<super::Shared>,
        stats: Arc<ClientStats>,
        server: Arc<str>,
    ) -> Self {
        XdsClientMetrics {
            client,
            stats,
            server,
        }
    }

    /// The figures now, if the client still runs.
    pub fn read(&self) -> Option<XdsClientFigures> {
        let shared = self.client.upgrade()?;
        let s = &self.stats;
        let updates = ResourceKind::ALL
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                (
                    resource_type(*kind),
                    s.valid[i].load(Ordering::Relaxed),
                    s.invalid[i].load(Ordering::Relaxed),
                )
            })
            .collect();
        let mut counts: std::collections::BTreeMap<(String, &'static str, &'static str), u64> =
            Default::default();
        {
            let reg = shared.lock();
            for ((kind, name), entry) in reg.entries.iter().filter(|(_, e)| e.watchers > 0) {
                let state = cache_state(&entry.tx.borrow());
                *counts
                    .entry((authority(name).to_owned(), state, resource_type(*kind)))
                    .or_default() += 1;
            }
        }
        Some(XdsClientFigures {
            server: self.server.to_string(),
            connected: s.connected.load(Ordering::Relaxed),
            server_failures: s.server_failures.load(Ordering::Relaxed),
            updates,
            resources: counts
                .into_iter()
                .map(|((a, c, t), n)| (a, c, t, n))
                .collect(),
        })
    }

    /// Whether both read the same client.
    pub fn same(&self, other: &XdsClientMetrics) -> bool {
        Arc::ptr_eq(&self.stats, &other.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_counts_once_per_healthy_spell() {
        let s = ClientStats::default();
        s.failed();
        s.failed();
        assert_eq!(s.server_failures.load(Ordering::Relaxed), 1);
        s.responded();
        assert!(s.connected.load(Ordering::Relaxed));
        s.failed();
        assert_eq!(s.server_failures.load(Ordering::Relaxed), 2);
        assert!(!s.connected.load(Ordering::Relaxed));
    }

    #[test]
    fn labels_are_a78s() {
        assert_eq!(
            resource_type(ResourceKind::Endpoints),
            "envoy.config.endpoint.v3.ClusterLoadAssignment"
        );
        assert_eq!(authority("shop"), "#old");
        assert_eq!(
            authority("xdstp://td.example/envoy.config.listener.v3.Listener/shop"),
            "td.example"
        );
    }
}
