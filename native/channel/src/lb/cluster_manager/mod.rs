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
    children: BTreeMap<Arc<str>, Child>,
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
        self.state = aggregate_state(self.children.values().map(|c| c.get().state()));
        self.picker = Arc::new(ClusterPicker {
            clusters: self
                .children
                .iter()
                .map(|(name, c)| (name.clone(), c.get().picker()))
                .collect(),
        });
        true
    }
}

impl LbPolicy for ClusterManager {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::ClusterManager(config) = config else {
            return false;
        };
        self.children
            .retain(|name, _| config.clusters.contains_key(name));
        for (name, child) in config.clusters {
            match self.children.get_mut(&name) {
                Some(c) => {
                    c.update(ctx, child);
                }
                None => {
                    log::debug!("{}: cluster {name} added", ctx.target);
                    self.children.insert(name, Child::new(ctx, child));
                }
            }
        }
        self.refresh()
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        event_to_all(ctx, event, self.children.values_mut()) && self.refresh()
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
            children: self.children.values().map(|c| c.get().stats()).collect(),
        }
    }
}
