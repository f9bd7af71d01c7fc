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
    /// Each cluster's name, policy and the config it was last given, sorted
    /// by name as a config's clusters are: an update walks both lists side
    /// by side, one comparison a cluster (a pointer compare when the names
    /// are the same allocations), where a lookup per cluster cost a few
    /// dozen string compares and most of an update of 1,000 clusters.
    children: Vec<(Arc<str>, Child, LbConfig)>,
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
            children: Vec::new(),
            state: ConnectivityState::Connecting,
            picker: queue_picker(),
        }
    }

    fn refresh(&mut self) -> bool {
        self.state = aggregate_state(self.children.iter().map(|(_, c, _)| c.get().state()));
        self.picker = Arc::new(ClusterPicker {
            clusters: self
                .children
                .iter()
                .map(|(name, c, _)| (name.clone(), c.get().picker()))
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
        let mut old = std::mem::take(&mut self.children).into_iter().peekable();
        let mut children = Vec::with_capacity(config.clusters.len());
        // The picker lists the clusters: rebuilt when one goes too.
        let mut changed = false;
        for (name, child) in config.clusters {
            // Clusters sorted before this one are gone.
            while old
                .peek()
                .is_some_and(|(o, ..)| !Arc::ptr_eq(o, &name) && **o < *name)
            {
                old.next();
                changed = true;
            }
            match old.next_if(|(o, ..)| Arc::ptr_eq(o, &name) || **o == *name) {
                // An unchanged cluster's subtree is left as it is: an update
                // costs what changed.
                Some(entry) if same_config(&entry.2, &child) => children.push(entry),
                Some((o, mut c, _)) => {
                    c.update(ctx, child.clone());
                    children.push((o, c, child));
                    changed = true;
                }
                None => {
                    log::debug!("{}: cluster {name} added", ctx.target);
                    let c = Child::new(ctx, child.clone());
                    children.push((name, c, child));
                    changed = true;
                }
            }
        }
        changed |= old.next().is_some();
        drop(old);
        self.children = children;
        changed && self.refresh()
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        event_to_all(ctx, event, self.children.iter_mut().map(|(_, c, _)| c)) && self.refresh()
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
                .iter()
                .map(|(_, c, _)| c.get().stats())
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
    /// Clusters that go, come and stay across an update, names given as
    /// new allocations or as the same ones: each staying cluster keeps its
    /// policy (updated only when its config changed), the picker lists
    /// exactly the new clusters in order.
    #[tokio::test]
    async fn clusters_come_go_and_stay_across_updates() {
        let counters: Vec<Arc<AtomicUsize>> =
            (0..5).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let builders: Vec<Arc<dyn PolicyBuilder>> = counters
            .iter()
            .map(|c| Arc::new(CountingBuilder(c.clone())) as Arc<dyn PolicyBuilder>)
            .collect();
        let cluster = |i: usize, address: &str| {
            LbConfig::Custom(CustomConfig {
                endpoints: vec![endpoint(&[address])],
                policy: custom_policy(&builders[i], serde_json::json!({})).unwrap(),
            })
        };
        let names = ["a", "b", "c", "d", "e"];
        let config = |which: &[(usize, &str)]| {
            LbConfig::ClusterManager(Config {
                clusters: which
                    .iter()
                    .map(|(i, address)| (Arc::from(names[*i]), cluster(*i, address)))
                    .collect(),
            })
        };
        let updates = || {
            counters
                .iter()
                .map(|c| c.load(Ordering::SeqCst))
                .collect::<Vec<_>>()
        };
        let listed = |h: &Harness<ClusterManager>| {
            let text = format!("{:?}", h.policy.picker());
            names
                .iter()
                .filter(|n| text.contains(&format!("\"{n}\"")))
                .copied()
                .collect::<Vec<_>>()
        };
        let mut h = Harness::new(ClusterManager::new());
        assert!(h.with(|p, ctx| p.update(ctx, config(&[(1, "10.0.0.2:80"), (3, "10.0.0.4:80")]))));
        assert_eq!(updates(), [0, 1, 0, 1, 0]);
        assert_eq!(listed(&h), ["b", "d"]);
        // a and c come before and between; b changes; d stays (its name a
        // new allocation); e comes after.
        assert!(h.with(|p, ctx| p.update(
            ctx,
            config(&[
                (0, "10.0.0.1:80"),
                (1, "10.0.0.9:80"),
                (2, "10.0.0.3:80"),
                (3, "10.0.0.4:80"),
                (4, "10.0.0.5:80"),
            ])
        )));
        assert_eq!(updates(), [1, 2, 1, 1, 1]);
        assert_eq!(listed(&h), ["a", "b", "c", "d", "e"]);
        // The first, a middle and the last go; the others stay unchanged.
        assert!(h.with(|p, ctx| p.update(ctx, config(&[(1, "10.0.0.9:80"), (3, "10.0.0.4:80")]))));
        assert_eq!(updates(), [1, 2, 1, 1, 1]);
        assert_eq!(listed(&h), ["b", "d"]);
        assert_eq!(h.policy.stats().children.len(), 2);
        // All go.
        assert!(h.with(|p, ctx| p.update(ctx, config(&[]))));
        assert_eq!(listed(&h), Vec::<&str>::new());
    }
}
