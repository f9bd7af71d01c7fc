//! What the file says as a whole: the aggregate graph (each service's
//! closure and leaves, and its checks: references, cycles, depth), what
//! the routes reaching a service ask of the clusters they share, and who
//! reads each `Session` route's cookies.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use tether_xds::lb_config::least_request::DEFAULT_CHOICE_COUNT;
use tether_xds::lb_config::weighted_round_robin::Settings as WrrSettings;

use super::{
    Config, CustomPolicySpec, LoadBalancerPolicy, ModelError, Protocol, RouteSpec, ServiceSpec,
    SessionClusterSettings, SessionFilter, Strategy,
};

impl Config {
    /// The service named `name`.
    pub fn service(&self, name: &str) -> Option<&ServiceSpec> {
        self.services.iter().find(|s| s.name == name)
    }

    /// The service named `name` and, for an aggregate, every service below
    /// it, each once, depth first in priority order. Unknown names are
    /// skipped and a cycle is not followed twice, so this ends on any model.
    pub fn closure(&self, name: &str) -> Vec<&ServiceSpec> {
        let Some(first) = self.service(name) else {
            return Vec::new();
        };
        if !first.is_aggregate() {
            return vec![first];
        }
        let by_name: BTreeMap<&str, &ServiceSpec> =
            self.services.iter().map(|s| (s.name.as_str(), s)).collect();
        let mut out: Vec<&ServiceSpec> = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![name];
        while let Some(n) = stack.pop() {
            let Some(s) = by_name.get(n) else { continue };
            if !seen.insert(n) {
                continue;
            }
            out.push(s);
            stack.extend(s.children().iter().rev().map(String::as_str));
        }
        out
    }

    /// The services with endpoints an aggregate resolves to, in priority
    /// order, each once (the service itself when it is not an aggregate).
    pub fn leaves(&self, name: &str) -> Vec<&ServiceSpec> {
        self.closure(name)
            .into_iter()
            .filter(|s| !s.is_aggregate())
            .collect()
    }

    /// Aggregate services: each names at least one other defined service,
    /// once; none has endpoints of its own; the graph has no cycle and no
    /// chain longer than [`MAX_AGGREGATE_DEPTH`] clusters.
    pub(super) fn validate_aggregates(&self) -> Result<(), ModelError> {
        let index: BTreeMap<&str, usize> = self
            .services
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        for (i, s) in self.services.iter().enumerate() {
            let Some(children) = &s.aggregate else {
                continue;
            };
            let at = format!("services[{i}]");
            if children.is_empty() {
                return Err(ModelError::invalid(
                    format!("{at}.aggregate"),
                    "[]",
                    "must name at least one service",
                ));
            }
            if !s.endpoints.is_empty() {
                return Err(ModelError::invalid(
                    format!("{at}.endpoints"),
                    s.endpoints
                        .iter()
                        .map(|e| e.address.to_string())
                        .collect::<Vec<_>>(),
                    "must be empty in an aggregate service: endpoints belong to the services it aggregates",
                ));
            }
            if let Some(k) = s.locality_weights.keys().next() {
                return Err(ModelError::invalid(
                    format!("{at}.localityWeights.{k}"),
                    k,
                    "is not used by an aggregate service: set it on the services it aggregates",
                ));
            }
            if s.protocol != Protocol::Http1 {
                return Err(ModelError::invalid(
                    format!("{at}.protocol"),
                    "h2c",
                    "is not used by an aggregate service: set it on the services it aggregates",
                ));
            }
            for (j, c) in children.iter().enumerate() {
                let cat = format!("{at}.aggregate[{j}]");
                if *c == s.name {
                    return Err(ModelError::invalid(
                        cat,
                        c,
                        "is the aggregate service itself",
                    ));
                }
                if !index.contains_key(c.as_str()) {
                    return Err(ModelError::invalid(
                        cat,
                        c,
                        "is not a service defined in services",
                    ));
                }
                if children[..j].contains(c) {
                    return Err(ModelError::invalid(cat, c, "is listed twice"));
                }
            }
        }
        let height = self.aggregate_heights(&index)?;
        // Report the tallest chain, from its top, so the message shows it all.
        let tallest = (0..self.services.len())
            .filter(|&i| height[i] > MAX_AGGREGATE_DEPTH)
            .max_by_key(|&i| (height[i], std::cmp::Reverse(i)));
        if let Some(top) = tallest {
            let mut chain = vec![top];
            while let Some(next) = self.services[chain[chain.len() - 1]]
                .children()
                .iter()
                .filter_map(|c| index.get(c.as_str()).copied())
                .max_by_key(|&c| (height[c], std::cmp::Reverse(c)))
            {
                chain.push(next);
            }
            let first = &self.services[chain[1]].name;
            let j = self.services[top]
                .children()
                .iter()
                .position(|c| c == first)
                .unwrap_or(0);
            return Err(ModelError::invalid(
                format!("services[{top}].aggregate[{j}]"),
                first,
                format!(
                    "makes a chain of {} clusters ({}); gRPC follows at most {MAX_AGGREGATE_DEPTH}",
                    height[top],
                    abbreviate(chain.iter().map(|&k| self.services[k].name.as_str()))
                ),
            ));
        }
        Ok(())
    }

    /// For each service, the number of clusters on its longest chain down
    /// to a service with endpoints (1 for one with endpoints), found
    /// without recursion; a cycle is an error at the entry that closes it.
    fn aggregate_heights(&self, index: &BTreeMap<&str, usize>) -> Result<Vec<usize>, ModelError> {
        const NEW: usize = 0;
        const OPEN: usize = usize::MAX;
        // NEW, OPEN (on the current path) or the height once known.
        let mut height = vec![NEW; self.services.len()];
        for root in 0..self.services.len() {
            if height[root] != NEW {
                continue;
            }
            // (service, index of the next child to look at)
            let mut path: Vec<(usize, usize)> = vec![(root, 0)];
            height[root] = OPEN;
            while let Some(&mut (node, ref mut next)) = path.last_mut() {
                let children = self.services[node].children();
                let Some(child) = children.get(*next) else {
                    let below = children
                        .iter()
                        .filter_map(|c| index.get(c.as_str()))
                        .map(|&c| height[c])
                        .max()
                        .unwrap_or(0);
                    height[node] = below.saturating_add(1);
                    path.pop();
                    continue;
                };
                let j = *next;
                *next += 1;
                let Some(&c) = index.get(child.as_str()) else {
                    continue;
                };
                match height[c] {
                    NEW => {
                        height[c] = OPEN;
                        path.push((c, 0));
                    }
                    OPEN => {
                        let from = path.iter().position(|&(p, _)| p == c).unwrap_or(0);
                        let cycle = path[from..]
                            .iter()
                            .map(|&(p, _)| self.services[p].name.as_str())
                            .chain(std::iter::once(child.as_str()))
                            .collect::<Vec<_>>()
                            .join(" -> ");
                        return Err(ModelError::invalid(
                            format!("services[{node}].aggregate[{j}]"),
                            child,
                            format!("closes a cycle: {cycle}"),
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(height)
    }

    /// Records `value` as what the route at `pat` asks of the cluster of
    /// each service it reaches (aggregates' services included); returns the
    /// first service another route asked otherwise, with that value and
    /// route.
    pub(super) fn conflict<'a, T: Clone + PartialEq>(
        &'a self,
        r: &'a RouteSpec,
        pat: &str,
        value: T,
        seen: &mut BTreeMap<&'a str, (T, String)>,
    ) -> Option<(&'a str, T, String)> {
        for svc in r.services.iter().flat_map(|s| self.closure(&s.name)) {
            match seen.get(svc.name.as_str()) {
                Some((other, at_other)) if *other != value => {
                    return Some((svc.name.as_str(), other.clone(), at_other.clone()))
                }
                Some(_) => {}
                None => {
                    seen.insert(svc.name.as_str(), (value.clone(), pat.to_owned()));
                }
            }
        }
        None
    }

    /// The `loadBalancerPolicy` of the first route with `strategy` that
    /// reaches `service`, directly or through an aggregate: validation makes
    /// all of them agree on what the service's cluster for the strategy gets.
    pub fn policy_for(&self, service: &str, strategy: Strategy) -> Option<&LoadBalancerPolicy> {
        self.virtualhosts
            .iter()
            .flat_map(|v| &v.routes)
            .filter(|r| r.load_balancer_policy.strategy == strategy)
            .find(|r| {
                r.services
                    .iter()
                    .flat_map(|s| self.closure(&s.name))
                    .any(|s| s.name == service)
            })
            .map(|r| &r.load_balancer_policy)
    }

    /// The choice count of `service`'s least request cluster: the one its
    /// `WeightedLeastRequest` routes give (validation makes them agree),
    /// else the default.
    pub fn least_request_choice_count(&self, service: &str) -> u32 {
        self.policy_for(service, Strategy::LeastRequest)
            .and_then(|p| p.choice_count)
            .unwrap_or(DEFAULT_CHOICE_COUNT)
    }

    /// The settings of `service`'s weighted round robin cluster, gRPC's
    /// defaults filled in.
    pub fn weighted_round_robin_settings(&self, service: &str) -> WrrSettings {
        self.policy_for(service, Strategy::WeightedRoundRobin)
            .and_then(|p| p.weighted_round_robin)
            .unwrap_or_default()
            .settings()
    }

    /// Whether `service`'s pick first cluster shuffles its endpoints.
    pub fn pick_first_shuffle(&self, service: &str) -> bool {
        self.policy_for(service, Strategy::PickFirst)
            .and_then(|p| p.shuffle_address_list)
            .unwrap_or(false)
    }

    /// The policy of `service`'s custom cluster.
    pub fn custom_policy(&self, service: &str) -> Option<&CustomPolicySpec> {
        self.policy_for(service, Strategy::Custom)
            .and_then(|p| p.custom.as_ref())
    }

    /// One line per `Session` route saying who reads the cookies written
    /// for it: by the plugin in Envoy (its `format`), by Envoy's own filter
    /// (always `envoy`); proxyless clients write their own format.
    pub fn session_notes(&self) -> Vec<String> {
        use tether_core::cookie::readers::explain;
        let mut notes = Vec::new();
        let native = self.envoy.session_filter == SessionFilter::Native
            || self
                .envoy
                .nodes
                .iter()
                .any(|n| n.session_filter == Some(SessionFilter::Native));
        for vh in &self.virtualhosts {
            for (i, route) in vh.routes.iter().enumerate() {
                let Some(session) = &route.load_balancer_policy.session else {
                    continue;
                };
                let at = format!("virtual host {:?} route {i}", vh.name);
                if self.envoy.uses_plugin() {
                    let format = session.format.map(|f| f.0).unwrap_or_default();
                    notes.push(format!(
                        "{at}: the plugin writes {}",
                        explain(format, false)
                    ));
                }
                if native {
                    notes.push(format!(
                        "{at}: Envoy's own filter writes {}",
                        explain(tether_core::Format::Envoy, false)
                    ));
                }
            }
        }
        notes
    }
}

impl Config {
    /// One warning per `Session` route whose plugin writes `sealed` cookies
    /// that other peers of the route cannot read: Envoys running their own
    /// filter, and proxyless clients (gRPC C-core never, `tether::Channel`
    /// only with the same keys). A client moving between them loses its
    /// session.
    pub fn session_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if !self.envoy.uses_plugin() {
            return warnings;
        }
        let mut native: Vec<String> = self
            .envoy
            .nodes
            .iter()
            .filter(|n| n.session_filter == Some(SessionFilter::Native))
            .map(|n| format!("node {:?}", n.id))
            .collect();
        if self.envoy.session_filter == SessionFilter::Native {
            native.insert(0, "the Envoys envoy.nodes does not list".to_owned());
        }
        for vh in &self.virtualhosts {
            for (i, route) in vh.routes.iter().enumerate() {
                let Some(session) = &route.load_balancer_policy.session else {
                    continue;
                };
                if !session.format.is_some_and(|f| f.0.is_sealed()) {
                    continue;
                }
                let at = format!("virtual host {:?} route {i}", vh.name);
                if !native.is_empty() {
                    warnings.push(format!(
                        "{at}: the plugin writes sealed cookies, which Envoy's own filter on {} \
                         cannot read: a session moving between them starts over",
                        native.join(", ")
                    ));
                }
                warnings.push(format!(
                    "{at}: the plugin writes sealed cookies, which proxyless clients of this route \
                     cannot read (gRPC C-core never, tether::Channel only with the same keys): a \
                     session moving between Envoy and them starts over"
                ));
            }
        }
        warnings
    }
}

/// The problem of a route asking a service's cluster for another `what`
/// than the route at `at_other` did.
pub(super) fn shared_cluster_conflict(
    at_other: &str,
    what: &str,
    other: &dyn fmt::Display,
    svc: &str,
) -> String {
    format!("differs from {at_other}'s {what} {other} for service {svc:?} (its routes share one cluster)")
}

/// What the routes validated so far ask of each service's session,
/// `WeightedLeastRequest`, `WeightedRoundRobin`, `PickFirst` and `Custom`
/// clusters, with the route that asked first.
#[derive(Default)]
pub(super) struct Shared<'a> {
    pub(super) session: BTreeMap<&'a str, (SessionClusterSettings, String)>,
    pub(super) choice_count: BTreeMap<&'a str, (u32, String)>,
    pub(super) wrr: BTreeMap<&'a str, (WrrSettings, String)>,
    pub(super) shuffle: BTreeMap<&'a str, (bool, String)>,
    pub(super) custom: BTreeMap<&'a str, (&'a CustomPolicySpec, String)>,
}

/// How many clusters deep gRPC follows an aggregate graph: the route's
/// cluster and 15 levels below it (`tether xds dump` uses the same limit).
pub const MAX_AGGREGATE_DEPTH: usize = 16;

/// `a -> b -> c`, with the middle left out of a long chain.
fn abbreviate<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.len() <= 6 {
        return names.join(" -> ");
    }
    format!(
        "{} -> {} -> ... -> {} -> {}",
        names[0],
        names[1],
        names[names.len() - 2],
        names[names.len() - 1]
    )
}
