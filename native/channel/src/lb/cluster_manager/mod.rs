//! `xds_cluster_manager`: the root of the tree, a `cds` child per cluster
//! the route table names (and per cluster that calls in flight still use).
//! Its picker sends each call to the child of the cluster its route chose.
//!
//! A subchannel's state change goes only to the clusters that were handed
//! that subchannel (recorded through [`Ctx`] while they run), not to every
//! cluster: with 1,000 clusters, one connection coming up costs one
//! cluster's work, as in C-core, where a subchannel's watchers are the
//! policies holding it.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use smallvec::SmallVec;

use tonic::Status;

use super::{
    aggregate_state, queue_picker, Child, ConnectivityState, Ctx, Event, LbConfig, LbPolicy,
    PickArgs, PickResult, Picker, PolicyStats, SharedPicker,
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

/// Up to this many clusters a picker scans comparing pointers; above, it
/// searches the names (sorted) in O(log n) compares.
const SCAN_CLUSTERS: usize = 8;

impl Picker for ClusterPicker {
    fn pick(&self, args: &PickArgs<'_>) -> PickResult {
        let wanted = &args.attributes.cluster;
        let found = if self.clusters.len() <= SCAN_CLUSTERS {
            self.clusters
                .iter()
                .find(|(name, _)| Arc::ptr_eq(name, wanted))
                .or_else(|| self.clusters.iter().find(|(name, _)| name == wanted))
        } else {
            self.clusters
                .binary_search_by(|(name, _)| (**name).cmp(&**wanted))
                .ok()
                .map(|i| &self.clusters[i])
        };
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
    /// The clusters each subchannel address was handed to: where its state
    /// changes go.
    holders: Holders,
    /// The state and picker, made when asked after a change: a burst of
    /// subchannel events (the LB task handles them in batches) costs one
    /// walk of the clusters, not one per event.
    snapshot: RefCell<Option<(ConnectivityState, SharedPicker)>>,
}

/// Which clusters hold a subchannel of each address, and the reverse, so
/// a cluster that goes is forgotten without a scan of every address.
#[derive(Default)]
struct Holders {
    by_address: HashMap<SocketAddr, SmallVec<[Arc<str>; 1]>, foldhash::fast::RandomState>,
    by_cluster: HashMap<Arc<str>, Vec<SocketAddr>, foldhash::fast::RandomState>,
}

impl Holders {
    /// Notes that `cluster` was handed subchannels of `addresses`.
    fn add(&mut self, cluster: &Arc<str>, addresses: Vec<SocketAddr>) {
        if addresses.is_empty() {
            return;
        }
        let mut held = self.by_cluster.remove(cluster).unwrap_or_default();
        for address in addresses {
            let clusters = self.by_address.entry(address).or_default();
            if !clusters.iter().any(|c| c == cluster) {
                clusters.push(cluster.clone());
                held.push(address);
            }
        }
        self.by_cluster.insert(cluster.clone(), held);
    }

    /// Forgets the addresses `cluster` holds that `live` says no
    /// subchannel has any more (all of them, for a cluster that went:
    /// `|_| false`).
    fn forget(&mut self, cluster: &Arc<str>, live: impl Fn(SocketAddr) -> bool) {
        let Some(mut held) = self.by_cluster.remove(cluster) else {
            return;
        };
        held.retain(|address| {
            let keep = live(*address);
            if !keep {
                if let Some(clusters) = self.by_address.get_mut(address) {
                    clusters.retain(|c| c != cluster);
                    if clusters.is_empty() {
                        self.by_address.remove(address);
                    }
                }
            }
            keep
        });
        if !held.is_empty() {
            self.by_cluster.insert(cluster.clone(), held);
        }
    }
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
            holders: Holders::default(),
            snapshot: RefCell::new(Some((ConnectivityState::Connecting, queue_picker()))),
        }
    }

    /// Runs `f` on one cluster's child, noting the subchannels it is handed.
    fn on_child<R>(
        holders: &mut Holders,
        ctx: &mut Ctx<'_>,
        name: &Arc<str>,
        f: impl FnOnce(&mut Ctx<'_>) -> R,
    ) -> R {
        let outer = ctx.record_subchannels();
        let result = f(ctx);
        holders.add(name, ctx.recorded_subchannels(outer));
        result
    }

    /// Marks the state and picker for remaking; returns `changed`.
    fn changed(&mut self, changed: bool) -> bool {
        if changed {
            *self.snapshot.get_mut() = None;
        }
        changed
    }

    /// The state and picker of the clusters as they are now.
    fn snapshot(&self) -> (ConnectivityState, SharedPicker) {
        self.snapshot
            .borrow_mut()
            .get_or_insert_with(|| {
                let state = aggregate_state(self.children.iter().map(|(_, c, _)| c.get().state()));
                let picker: SharedPicker = Arc::new(ClusterPicker {
                    clusters: self
                        .children
                        .iter()
                        .map(|(name, c, _)| (name.clone(), c.get().picker()))
                        .collect(),
                });
                (state, picker)
            })
            .clone()
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
                if let Some((gone, ..)) = old.next() {
                    self.holders.forget(&gone, |_| false);
                }
                changed = true;
            }
            match old.next_if(|(o, ..)| Arc::ptr_eq(o, &name) || **o == *name) {
                // An unchanged cluster's subtree is left as it is: an update
                // costs what changed.
                Some(entry) if same_config(&entry.2, &child) => children.push(entry),
                Some((o, mut c, _)) => {
                    Self::on_child(&mut self.holders, ctx, &o, |ctx| {
                        c.update(ctx, child.clone())
                    });
                    // Subchannels the cluster let go of: no more events.
                    self.holders.forget(&o, |a| ctx.has_subchannel(a));
                    children.push((o, c, child));
                    changed = true;
                }
                None => {
                    log::debug!("{}: cluster {name} added", ctx.target);
                    let c = Self::on_child(&mut self.holders, ctx, &name, |ctx| {
                        Child::new(ctx, child.clone())
                    });
                    children.push((name, c, child));
                    changed = true;
                }
            }
        }
        changed |= old.peek().is_some();
        for (gone, ..) in old {
            self.holders.forget(&gone, |_| false);
        }
        self.children = children;
        self.changed(changed)
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        let changed = match event {
            // Only the clusters holding the subchannel: none when no
            // cluster was handed one for that address.
            Event::Subchannel(_, address, _) => {
                let Some(clusters) = self.holders.by_address.get(address).cloned() else {
                    return false;
                };
                let mut changed = false;
                for name in clusters {
                    let Ok(i) = self.children.binary_search_by(|(n, ..)| (**n).cmp(&*name)) else {
                        continue;
                    };
                    let child = &mut self.children[i].1;
                    changed |= Self::on_child(&mut self.holders, ctx, &name, |ctx| {
                        child.event(ctx, event)
                    });
                }
                changed
            }
            _ => {
                let mut changed = false;
                for (name, child, _) in &mut self.children {
                    changed |=
                        Self::on_child(&mut self.holders, ctx, name, |ctx| child.event(ctx, event));
                }
                changed
            }
        };
        self.changed(changed)
    }

    fn state(&self) -> ConnectivityState {
        self.snapshot().0
    }

    fn picker(&self) -> SharedPicker {
        self.snapshot().1
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "xds_cluster_manager",
            name: None,
            state: self.state(),
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
    /// A custom policy holding a subchannel per endpoint address and
    /// counting the subchannel events it is given, by address.
    struct Holding {
        held: Vec<crate::lb::Subchannel>,
        seen: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
        timers: Arc<AtomicUsize>,
    }

    impl LbPolicy for Holding {
        fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
            let LbConfig::Custom(c) = config else {
                return false;
            };
            self.held = c
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.iter().map(|a| ctx.subchannel(*a)))
                .collect();
            true
        }
        fn event(&mut self, _: &mut Ctx<'_>, event: &Event) -> bool {
            match event {
                Event::Subchannel(_, address, _) => self.seen.lock().unwrap().push(*address),
                _ => {
                    self.timers.fetch_add(1, Ordering::SeqCst);
                }
            }
            false
        }
        fn state(&self) -> ConnectivityState {
            ConnectivityState::Ready
        }
        fn picker(&self) -> SharedPicker {
            queue_picker()
        }
        fn stats(&self) -> PolicyStats {
            PolicyStats {
                policy: "test.holding",
                name: None,
                state: ConnectivityState::Ready,
                facts: Vec::new(),
                endpoints: Vec::new(),
                sessions: Vec::new(),
                children: Vec::new(),
            }
        }
    }

    struct HoldingBuilder {
        seen: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
        timers: Arc<AtomicUsize>,
    }

    impl PolicyBuilder for HoldingBuilder {
        fn name(&self) -> &'static str {
            "test.holding"
        }
        fn parse_config(&self, _: &serde_json::Value) -> Result<crate::lb::ParsedConfig, String> {
            Ok(Arc::new(()))
        }
        fn build(&self) -> Box<dyn LbPolicy> {
            Box::new(Holding {
                held: Vec::new(),
                seen: self.seen.clone(),
                timers: self.timers.clone(),
            })
        }
    }

    /// A subchannel's state change reaches only the clusters holding a
    /// subchannel of its address (both, when shared), no cluster once every
    /// holder let go of it or went; other events reach every cluster.
    #[tokio::test]
    async fn subchannel_events_reach_only_the_clusters_holding_them() {
        use crate::lb::test_harness::addr;
        let seen: Vec<Arc<std::sync::Mutex<Vec<SocketAddr>>>> =
            (0..2).map(|_| Arc::default()).collect();
        let timers: Vec<Arc<AtomicUsize>> = (0..2).map(|_| Arc::default()).collect();
        let builders: Vec<Arc<dyn PolicyBuilder>> = (0..2)
            .map(|i| {
                Arc::new(HoldingBuilder {
                    seen: seen[i].clone(),
                    timers: timers[i].clone(),
                }) as Arc<dyn PolicyBuilder>
            })
            .collect();
        let cluster = |i: usize, addresses: &[&str]| {
            LbConfig::Custom(CustomConfig {
                endpoints: addresses.iter().map(|a| endpoint(&[a])).collect(),
                policy: custom_policy(&builders[i], serde_json::json!({})).unwrap(),
            })
        };
        let config = |clusters: Vec<(&str, LbConfig)>| {
            LbConfig::ClusterManager(Config {
                clusters: clusters
                    .into_iter()
                    .map(|(n, c)| (Arc::from(n), c))
                    .collect(),
            })
        };
        let (only_a, shared, only_b, nobody) = (
            addr("10.0.0.1:80"),
            addr("10.0.0.2:80"),
            addr("10.0.0.3:80"),
            addr("10.0.0.9:80"),
        );
        let mut h = Harness::new(ClusterManager::new());
        h.with(|p, ctx| {
            p.update(
                ctx,
                config(vec![
                    ("a", cluster(0, &["10.0.0.1:80", "10.0.0.2:80"])),
                    ("b", cluster(1, &["10.0.0.2:80", "10.0.0.3:80"])),
                ]),
            )
        });
        let send = |h: &mut Harness<ClusterManager>, address| {
            h.with(|p, ctx| {
                p.event(
                    ctx,
                    &Event::Subchannel(
                        crate::subchannel::SubchannelId(0),
                        address,
                        ConnectivityState::Ready,
                    ),
                )
            });
        };
        let taken = |i: usize| std::mem::take(&mut *seen[i].lock().unwrap());
        for address in [only_a, shared, only_b, nobody] {
            send(&mut h, address);
        }
        assert_eq!(taken(0), [only_a, shared]);
        assert_eq!(taken(1), [shared, only_b]);
        // b lets go of only_b: its events reach nobody.
        h.with(|p, ctx| {
            p.update(
                ctx,
                config(vec![
                    ("a", cluster(0, &["10.0.0.1:80", "10.0.0.2:80"])),
                    ("b", cluster(1, &["10.0.0.2:80"])),
                ]),
            )
        });
        send(&mut h, only_b);
        send(&mut h, shared);
        assert_eq!((taken(0), taken(1)), (vec![shared], vec![shared]));
        // a goes: only_a's events reach nobody, the shared one b alone.
        h.with(|p, ctx| p.update(ctx, config(vec![("b", cluster(1, &["10.0.0.2:80"]))])));
        for address in [only_a, shared, only_b] {
            send(&mut h, address);
        }
        assert_eq!((taken(0), taken(1)), (vec![], vec![shared]));
        // Other events reach every cluster.
        h.with(|p, ctx| {
            p.update(
                ctx,
                config(vec![
                    ("a", cluster(0, &["10.0.0.1:80"])),
                    ("b", cluster(1, &["10.0.0.3:80"])),
                ]),
            )
        });
        h.with(|p, ctx| p.event(ctx, &Event::ExitIdle(crate::lb::PolicyId::next())));
        assert_eq!(
            (
                timers[0].load(Ordering::SeqCst),
                timers[1].load(Ordering::SeqCst)
            ),
            (1, 1)
        );
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
