//! The resource graph of one listener, as a proxyless channel for
//! `xds:///NAME` follows it (C-core's "dependency manager"): Listener →
//! RouteConfiguration (RDS or inline) → the virtual host serving NAME →
//! every cluster its routes name → aggregate clusters down to their leaves
//! (depth at most 16, cycles are errors) → ClusterLoadAssignment.
//!
//! [`Graph::walk`] subscribes to what the resources reference, drops what
//! they no longer do, and returns a [`Walk`]: every resource's state and
//! what each route cluster resolves to. `tether xds dump` prints it; the
//! channel builds its LB config from it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::client::{ResourceState, ResourceStatus, Watcher, XdsClient};
use super::resource::cluster::Discovery;
use super::resource::listener::{ListenerResource, RouteSource};
use super::resource::route::{Action, ClusterSpecifier, RouteConfigResource, VirtualHost};
use super::{Resource, ResourceKind};

/// The deepest aggregate cluster graph followed, as in gRPC: the cluster a
/// route names is at depth 0 and a cluster at depth 16 is an error.
pub const MAX_AGGREGATE_DEPTH: usize = 16;

type Key = (ResourceKind, String);

/// The watchers of one listener's graph, kept in step with what the
/// resources reference.
pub struct Graph {
    client: XdsClient,
    target: String,
    watchers: HashMap<Key, Watcher>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("target", &self.target)
            .field("watched", &self.watchers.len())
            .finish()
    }
}

/// What a cluster named by a route resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Some cluster of its graph has not arrived yet.
    Pending,
    /// Its leaf clusters, in priority order (itself, for a leaf).
    Leaves(Vec<String>),
    /// It cannot be resolved: a cycle, the depth limit, no leaves, or the
    /// cluster's own error.
    Error(String),
}

/// One cluster a route names.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteCluster {
    /// The cluster's name.
    pub name: String,
    /// What it resolves to.
    pub resolution: Resolution,
}

/// One walk of the graph: what was found, and whether it is complete.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// Every resource of the graph has an answer (a resource, an error, or
    /// does-not-exist).
    pub complete: bool,
    /// Every error met, once each, in the order met.
    pub errors: Vec<String>,
    /// The listener's state.
    pub listener: Option<ResourceState>,
    /// The RDS name and state, when the routes come from RDS.
    pub route_configuration: Option<(String, ResourceState)>,
    /// The routes in use (inline or from RDS), if any.
    pub routes: Option<Arc<RouteConfigResource>>,
    /// The virtual host serving the target, if any.
    pub virtual_host: Option<VirtualHost>,
    /// Why there is no virtual host although routes are known.
    pub virtual_host_error: Option<String>,
    /// The clusters routes name, in order, once each.
    pub route_clusters: Vec<RouteCluster>,
    /// Every cluster visited, in order, with its state.
    pub clusters: Vec<(String, ResourceState)>,
    /// Every ClusterLoadAssignment visited, in order, with its state.
    pub endpoints: Vec<(String, ResourceState)>,
    used: HashSet<Key>,
    cluster_depth: HashMap<String, usize>,
}

impl Walk {
    fn error(&mut self, text: String) {
        if !self.errors.contains(&text) {
            self.errors.push(text);
        }
    }

    /// The listener resource, if one is cached.
    pub fn listener_resource(&self) -> Option<&Arc<ListenerResource>> {
        match self.listener.as_ref().and_then(|s| s.resource.as_ref()) {
            Some(Resource::Listener(l)) => Some(l),
            _ => None,
        }
    }

    /// The state of a visited cluster.
    pub fn cluster(&self, name: &str) -> Option<&ResourceState> {
        self.clusters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s)
    }

    /// The state of a visited ClusterLoadAssignment.
    pub fn endpoints(&self, name: &str) -> Option<&ResourceState> {
        self.endpoints
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s)
    }
}

impl Graph {
    /// A graph for the listener `target`, watched through `client`.
    pub fn new(client: XdsClient, target: String) -> Self {
        Graph {
            client,
            target,
            watchers: HashMap::new(),
        }
    }

    /// The client the graph watches through.
    pub fn client(&self) -> &XdsClient {
        &self.client
    }

    /// The listener's name.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The state of a resource, watching it first if needed, and whether
    /// this walk visits it for the first time.
    fn visit(&mut self, w: &mut Walk, kind: ResourceKind, name: &str) -> (ResourceState, bool) {
        let key = (kind, name.to_owned());
        let first = w.used.insert(key.clone());
        let client = &self.client;
        let state = self
            .watchers
            .entry(key)
            .or_insert_with(|| client.watch(kind, name))
            .current();
        if first {
            if state.status == ResourceStatus::Requested {
                w.complete = false;
            }
            if let Some(e) = &state.error {
                w.error(e.to_string());
            }
        }
        (state, first)
    }

    fn state(&self, kind: ResourceKind, name: &str) -> Option<ResourceState> {
        self.watchers
            .get(&(kind, name.to_owned()))
            .map(Watcher::current)
    }

    /// Walks the graph from the listener, subscribing to what it references
    /// and dropping what it no longer does.
    pub fn walk(&mut self) -> Walk {
        let mut w = Walk {
            complete: true,
            ..Walk::default()
        };
        let target = self.target.clone();
        let (listener, _) = self.visit(&mut w, ResourceKind::Listener, &target);
        w.listener = Some(listener);
        let listener_res = w.listener_resource().cloned();
        if let Some(l) = &listener_res {
            w.routes = match &l.http.routes {
                RouteSource::Inline(rc) => Some(Arc::new((**rc).clone())),
                RouteSource::Rds(name) => {
                    let (s, _) = self.visit(&mut w, ResourceKind::RouteConfiguration, name);
                    let rc = match &s.resource {
                        Some(Resource::RouteConfiguration(rc)) => Some(rc.clone()),
                        _ => None,
                    };
                    w.route_configuration = Some((name.clone(), s));
                    rc
                }
            };
        }
        if let Some(rc) = w.routes.clone() {
            w.virtual_host = rc.virtual_host_for(&target).cloned();
            if w.virtual_host.is_none() {
                let e = format!(
                    "could not find VirtualHost for {target:?} in RouteConfiguration {:?}",
                    rc.name
                );
                w.error(e.clone());
                w.virtual_host_error = Some(e);
            }
        }
        let roots = w
            .virtual_host
            .as_ref()
            .map(route_clusters)
            .unwrap_or_default();
        for root in &roots {
            self.walk_cluster(&mut w, root, 0);
        }
        w.route_clusters = roots
            .iter()
            .map(|root| {
                let resolution = self.resolve_root(root);
                if let Resolution::Error(e) = &resolution {
                    w.error(e.clone());
                }
                RouteCluster {
                    name: root.clone(),
                    resolution,
                }
            })
            .collect();
        // Unsubscribe what the graph no longer references; but a listener
        // that stopped existing keeps what it referenced watched, as C-core
        // does, so that it comes back whole.
        let listener_gone = listener_res.is_none()
            && w.listener
                .as_ref()
                .is_some_and(|s| s.status == ResourceStatus::DoesNotExist);
        if !listener_gone {
            self.watchers.retain(|k, _| w.used.contains(k));
        }
        w
    }

    fn walk_cluster(&mut self, w: &mut Walk, name: &str, depth: usize) {
        if depth >= MAX_AGGREGATE_DEPTH {
            return;
        }
        // A cluster reached again at the same depth or deeper adds nothing;
        // reached shallower, its children may now fit under the depth limit.
        match w.cluster_depth.get(name) {
            Some(&d) if d <= depth => return,
            _ => {}
        }
        w.cluster_depth.insert(name.to_owned(), depth);
        let (state, first) = self.visit(w, ResourceKind::Cluster, name);
        let resource = state.resource.clone();
        if first {
            w.clusters.push((name.to_owned(), state));
        }
        let Some(Resource::Cluster(c)) = &resource else {
            return;
        };
        match &c.discovery {
            Discovery::Aggregate { clusters } => {
                for child in clusters {
                    self.walk_cluster(w, child, depth + 1);
                }
            }
            Discovery::Eds { .. } => {
                let eds = c.eds_name().unwrap_or(&c.name).to_owned();
                let (s, first) = self.visit(w, ResourceKind::Endpoints, &eds);
                if first {
                    w.endpoints.push((eds, s));
                }
            }
            Discovery::LogicalDns { .. } => {}
        }
    }

    /// What a cluster named by a route resolves to.
    fn resolve_root(&self, root: &str) -> Resolution {
        let mut leaves = Vec::new();
        let mut path = Vec::new();
        match self.resolve(root, root, 0, &mut path, &mut leaves) {
            Err(e) => Resolution::Error(e),
            Ok(false) => Resolution::Pending,
            Ok(true) if !leaves.is_empty() => Resolution::Leaves(leaves),
            Ok(true) => {
                let own = self
                    .state(ResourceKind::Cluster, root)
                    .filter(|s| s.resource.is_none())
                    .and_then(|s| s.error.map(|e| e.to_string()));
                Resolution::Error(own.unwrap_or_else(|| {
                    format!("aggregate cluster dependency graph for {root:?} has no leaf clusters")
                }))
            }
        }
    }

    /// Depth-first, children in priority order; a leaf reached twice (a
    /// diamond) counts once. `Ok(false)`: some cluster is still awaited.
    fn resolve(
        &self,
        root: &str,
        name: &str,
        depth: usize,
        path: &mut Vec<String>,
        leaves: &mut Vec<String>,
    ) -> Result<bool, String> {
        if path.iter().any(|p| p == name) {
            let mut cycle = path.clone();
            cycle.push(name.to_owned());
            return Err(format!(
                "aggregate cluster graph of {root:?} has a cycle: {}",
                cycle.join(" -> ")
            ));
        }
        if depth >= MAX_AGGREGATE_DEPTH {
            return Err(format!(
                "aggregate cluster graph of {root:?} exceeds max depth {MAX_AGGREGATE_DEPTH} \
                 (at {name:?})"
            ));
        }
        let Some(state) = self.state(ResourceKind::Cluster, name) else {
            return Ok(false);
        };
        let cluster = match &state.resource {
            Some(Resource::Cluster(c)) => c.clone(),
            // Missing or rejected: it contributes no leaf; its own entry
            // says why.
            _ => return Ok(state.status != ResourceStatus::Requested),
        };
        match &cluster.discovery {
            Discovery::Aggregate { clusters } => {
                path.push(name.to_owned());
                let mut known = true;
                for child in clusters {
                    known &= self.resolve(root, child, depth + 1, path, leaves)?;
                }
                path.pop();
                Ok(known)
            }
            _ => {
                if !leaves.iter().any(|l| l == name) {
                    leaves.push(name.to_owned());
                }
                Ok(true)
            }
        }
    }
}

/// The clusters a virtual host's routes name, in order, once each.
pub fn route_clusters(vh: &VirtualHost) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |n: &str| {
        if !out.iter().any(|o| o == n) {
            out.push(n.to_owned());
        }
    };
    for r in &vh.routes {
        if let Action::Route(a) = &r.action {
            match &a.clusters {
                ClusterSpecifier::Cluster(n) => add(n),
                ClusterSpecifier::Weighted(ws) => ws.iter().for_each(|cw| add(&cw.name)),
            }
        }
    }
    out
}
