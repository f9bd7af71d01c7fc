//! `xds_cluster_manager`: the root of the tree, a `cds` child per cluster
//! the route table names (and per cluster that calls in flight still use).
//! Its picker sends each call to the child of the cluster its route chose.

use std::collections::BTreeMap;
use std::sync::Arc;

use tonic::Status;

use super::{
    aggregate_state, event_to_all, queue_picker, Child, ConnectivityState, Ctx, Event, LbConfig,
    LbPolicy, PickArgs, PickResult, Picker, PolicyStats, SharedPicker,
};

/// `xds_cluster_manager`'s config: a child config per cluster name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// Clusters by name.
    pub clusters: BTreeMap<Arc<str>, LbConfig>,
}

/// Sends each call to its cluster's picker. A channel has a few clusters:
/// a scan that compares the name's pointer first (the config selector hands
/// out the very `Arc` this picker holds) beats hashing the name.
pub struct ClusterPicker {
    clusters: Vec<(Arc<str>, SharedPicker)>,
}

impl std::fmt::Debug for ClusterPicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterPicker")
            .field(
                "clusters",
                &self.clusters.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Picker for ClusterPicker {
    fn pick(&self, args: &PickArgs<'_>) -> PickResult {
        let wanted = &args.attributes.cluster;
        let found = self
            .clusters
            .iter()
            .find(|(name, _)| Arc::ptr_eq(name, wanted))
            .or_else(|| self.clusters.iter().find(|(name, _)| name == wanted));
        match found {
            Some((_, p)) => p.pick(args),
            // C-core's answer; a Fail, so wait_for_ready calls wait.
            None => PickResult::Fail(Status::internal(format!(
                "xds cluster manager picker: unknown cluster \"{}\"",
                args.attributes.cluster
            ))),
        }
    }
}

/// The `xds_cluster_manager` policy.
pub struct ClusterManager {
    /// Each cluster's policy and the config it was last given.
    children: BTreeMap<Arc<str>, (Child, LbConfig)>,
    state: ConnectivityState,
    picker: SharedPicker,
}

impl Default for ClusterManager {
    fn default() -> Self {
        ClusterManager::new()
    }
}

impl ClusterManager {
    /// A policy with no clusters yet.
    pub fn new() -> Self {
        ClusterManager {
            children: BTreeMap::new(),
            state: ConnectivityState::Connecting,
            picker: queue_picker(),
        }
    }

    fn refresh(&mut self) -> bool {
        self.state = aggregate_state(self.children.values().map(|(c, _)| c.get().state()));
        self.picker = Arc::new(ClusterPicker {
            clusters: self
                .children
                .iter()
                .map(|(name, (c, _))| (name.clone(), c.get().picker()))
                .collect(),
        });
        true
    }
}

/// Whether `new` would change nothing under a cluster last given `last`.
fn same_config(last: &LbConfig, new: &LbConfig) -> bool {
    match (last, new) {
        (LbConfig::Cds(a), LbConfig::Cds(b)) => a.same_as(b),
        (a, b) => a == b,
    }
}

impl LbPolicy for ClusterManager {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::ClusterManager(config) = config else {
            return false;
        };
        let before = self.children.len();
        self.children
            .retain(|name, _| config.clusters.contains_key(name));
        // The picker lists the clusters: rebuilt when one goes too.
        let mut changed = self.children.len() != before;
        for (name, child) in config.clusters {
            match self.children.get_mut(&name) {
                // An unchanged cluster's subtree is left as it is: an update
                // costs what changed.
                Some((_, last)) if same_config(last, &child) => {}
                Some((c, last)) => {
                    *last = child.clone();
                    c.update(ctx, child);
                    changed = true;
                }
                None => {
                    log::debug!("{}: cluster {name} added", ctx.target);
                    let c = Child::new(ctx, child.clone());
                    self.children.insert(name, (c, child));
                    changed = true;
                }
            }
        }
        changed && self.refresh()
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        event_to_all(ctx, event, self.children.values_mut().map(|(c, _)| c)) && self.refresh()
    }

    fn state(&self) -> ConnectivityState {
        self.state
    }

    fn picker(&self) -> SharedPicker {
        self.picker.clone()
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "xds_cluster_manager",
            name: None,
            state: self.state,
            facts: Vec::new(),
            endpoints: Vec::new(),
            sessions: Vec::new(),
            children: self
                .children
                .values()
                .map(|(c, _)| c.get().stats())
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::lb::registry::{custom_policy, PolicyBuilder};
    use crate::lb::test_harness::{endpoint, CountingBuilder, Harness};
    use crate::lb::CustomConfig;

    /// An update costs what changed: clusters whose config did not change
    /// are not updated, and nothing changes when nothing did.
    #[tokio::test]
    async fn only_changed_clusters_are_updated() {
        let (a_updates, b_updates) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let a: Arc<dyn PolicyBuilder> = Arc::new(CountingBuilder(a_updates.clone()));
        let b: Arc<dyn PolicyBuilder> = Arc::new(CountingBuilder(b_updates.clone()));
        let cluster = |builder: &Arc<dyn PolicyBuilder>, address: &str| {
            LbConfig::Custom(CustomConfig {
                endpoints: vec![endpoint(&[address])],
                policy: custom_policy(builder, serde_json::json!({})).unwrap(),
            })
        };
        let config = |b_address: &str| {
            LbConfig::ClusterManager(Config {
                clusters: [
                    (Arc::from("a"), cluster(&a, "10.0.0.1:80")),
                    (Arc::from("b"), cluster(&b, b_address)),
                ]
                .into(),
            })
        };
        let mut h = Harness::new(ClusterManager::new());
        assert!(h.with(|p, ctx| p.update(ctx, config("10.0.0.2:80"))));
        assert_eq!(
            (
                a_updates.load(Ordering::SeqCst),
                b_updates.load(Ordering::SeqCst)
            ),
            (1, 1)
        );
        // b's endpoint changes: only b is updated.
        assert!(h.with(|p, ctx| p.update(ctx, config("10.0.0.3:80"))));
        assert_eq!(
            (
                a_updates.load(Ordering::SeqCst),
                b_updates.load(Ordering::SeqCst)
            ),
            (1, 2)
        );
        // The same config again: nothing is updated, nothing changed.
        assert!(!h.with(|p, ctx| p.update(ctx, config("10.0.0.3:80"))));
        assert_eq!(
            (
                a_updates.load(Ordering::SeqCst),
                b_updates.load(Ordering::SeqCst)
            ),
            (1, 2)
        );
        // A cluster that goes changes the picker, the other is left alone.
        let only_a = LbConfig::ClusterManager(Config {
            clusters: [(Arc::from("a"), cluster(&a, "10.0.0.1:80"))].into(),
        });
        assert!(h.with(|p, ctx| p.update(ctx, only_a)));
        assert_eq!(a_updates.load(Ordering::SeqCst), 1);
        assert_eq!(h.policy.stats().children.len(), 1);
    }
}
