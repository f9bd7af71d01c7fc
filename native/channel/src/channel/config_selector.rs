//! The config selector (gRFCs A28, A31): for each call, the first route of
//! the virtual host that matches its path and metadata, and from the route
//! the cluster (a weighted random choice among weighted clusters), the
//! call's timeout, its hash, and its stateful session (A55, A60): the
//! session filter's config for the route (most specific wins: weighted
//! cluster entry, route, virtual host, listener), the session the call's
//! cookie names, and the cluster that cookie names when the route lists it;
//! and the fault injection configs (A33) in effect for the route and
//! cluster, resolved the same way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use tonic::Status;

use super::retry::RetryPolicy;
use super::ClusterRef;
use crate::lb::random;
use crate::session::filter::{SessionCall, Sessions};
use crate::session::notes::CookieNotes;
use crate::session::SessionOptions;
use crate::xds::resource::fault::FaultConfig;
use crate::xds::resource::listener::{FilterConfig, FilterOverride, HttpFilter};
use crate::xds::resource::route::{
    Action, ClusterSpecifier, ClusterWeight, HashPolicy, HashSource, HeaderMatch, HeaderMatcher,
    PathMatcher, RouteAction, RouteMatcher, VirtualHost,
};
use tether_core::hash::policy::{HeaderLookup, Source};
use tether_core::hash::rewrite::Rewrite;
use tether_core::hash::{
    HashPolicies, HashPolicy as CoreHashPolicy, HashRequest, Peer, RequestHash,
};
use tether_core::http::set_cookie::CookieSpec;

/// What the selector decided for one call.
#[derive(Debug, Clone)]
pub struct CallConfig {
    /// The cluster, held so that it stays in the LB tree while the call runs.
    pub cluster: Arc<ClusterRef>,
    /// The request hash of the route's hash policies (for ring hash); `None`
    /// when no policy produced one.
    pub hash: Option<u64>,
    /// The route's `max_stream_duration` (or the listener's): the call's
    /// deadline at the latest.
    pub timeout: Option<Duration>,
    /// The stateful session filter's config for this call, when it applies.
    pub(crate) session: Option<SessionCall>,
    /// The fault injection configs for this call, one per fault filter in
    /// effect, in the listener's order; `None` without any.
    pub faults: Option<Arc<[FaultConfig]>>,
    /// The route's retry policy (A44), if it retries anything.
    pub retry: Option<Arc<RetryPolicy>>,
    /// `Set-Cookie` values of cookies the route's hash policies generated
    /// (a cookie policy with a ttl, the call without that cookie: Contour's
    /// `Cookie` strategy), for the response.
    pub hash_cookies: Vec<String>,
}

/// The fault injection configs of one route, resolved once per update.
#[derive(Debug, Default)]
struct RouteFaults {
    /// The route's own (route > virtual host > listener).
    route: Option<Arc<[FaultConfig]>>,
    /// Per weighted-cluster entry, where the entry overrides a fault filter.
    entries: Vec<Option<Option<Arc<[FaultConfig]>>>>,
}

/// An immutable route table for calls, built from one resolver update.
#[derive(Debug)]
pub struct ConfigSelector {
    virtual_host: VirtualHost,
    /// Each route's hash policies in tether-core's form (empty: none).
    hash_policies: Vec<HashPolicies>,
    /// The stateful session filter's state for these routes.
    sessions: Sessions,
    /// Each route's fault injection configs.
    faults: Vec<RouteFaults>,
    /// Each route's retry policy.
    retries: Vec<Option<Arc<RetryPolicy>>>,
    /// The listener's `max_stream_duration`, for routes without their own.
    default_timeout: Option<Duration>,
    clusters: HashMap<String, Arc<ClusterRef>>,
}

impl ConfigSelector {
    /// A selector over `virtual_host`, with a handle for every cluster its
    /// routes name (`clusters` must hold them all); an error when a route's
    /// retry policy cannot run (C-core then has no route table at all).
    pub fn new(
        virtual_host: VirtualHost,
        default_timeout: Option<Duration>,
        clusters: HashMap<String, Arc<ClusterRef>>,
        http_filters: &[HttpFilter],
        options: &SessionOptions,
    ) -> Result<Self, String> {
        let retries = virtual_host
            .routes
            .iter()
            .enumerate()
            .map(|(i, r)| match &r.action {
                Action::Route(RouteAction {
                    retry_policy: Some(p),
                    ..
                }) => RetryPolicy::from_xds(p)
                    .map(|p| p.map(Arc::new))
                    .map_err(|e| format!("could not create ConfigSelector: route {i}: {}", e.0)),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>, String>>()?;
        let sessions = Sessions::new(&virtual_host, http_filters, options);
        let faults = route_faults(&virtual_host, http_filters);
        let hash_policies = virtual_host
            .routes
            .iter()
            .map(|r| match &r.action {
                Action::Route(a) => route_hash_policies(&a.hash_policies),
                Action::NonForwarding => HashPolicies::default(),
            })
            .collect();
        Ok(ConfigSelector {
            hash_policies,
            sessions,
            faults,
            retries,
            virtual_host,
            default_timeout,
            clusters,
        })
    }

    /// The selector noting cookies in the channel `target`'s `notes`.
    pub(crate) fn with_notes(mut self, target: String, notes: Arc<CookieNotes>) -> Self {
        self.sessions = self.sessions.with_notes(target, notes);
        self
    }

    /// The virtual host in use.
    pub fn virtual_host(&self) -> &VirtualHost {
        &self.virtual_host
    }

    /// The config of a call to `path` with `headers` on the channel
    /// `channel_id` (gRPC's `io.grpc.channel_id` filter state), or the
    /// UNAVAILABLE status C-core gives when no route matches or the route
    /// does not forward.
    pub fn select(
        &self,
        path: &str,
        headers: &HeaderMap,
        channel_id: &str,
    ) -> Result<CallConfig, Status> {
        let (index, route) = self
            .virtual_host
            .routes
            .iter()
            .enumerate()
            .find(|(_, r)| route_matches(&r.matcher, path, headers))
            .ok_or_else(|| Status::unavailable("No matching route found in xDS route config"))?;
        let Action::Route(action) = &route.action else {
            return Err(Status::unavailable(
                "Matching route has inappropriate action",
            ));
        };
        let lookup = self.sessions.lookup(index, path, headers);
        // A60: the cluster a session names, when the route lists it.
        let named = lookup.as_ref().and_then(|d| d.lookup.cluster());
        let (name, entry) = match &action.clusters {
            ClusterSpecifier::Cluster(name) => (name, None),
            ClusterSpecifier::Weighted(entries) => {
                let i = named
                    .and_then(|n| entries.iter().position(|e| e.name == n))
                    .unwrap_or_else(|| weighted_choice(entries));
                (&entries[i].name, Some(i))
            }
        };
        let faults = &self.faults[index];
        let faults = match entry.and_then(|i| faults.entries.get(i).cloned().flatten()) {
            Some(overridden) => overridden,
            None => faults.route.clone(),
        };
        let session = self.sessions.call(index, entry, lookup);
        let cluster = self.clusters.get(name).cloned().ok_or_else(|| {
            Status::internal(format!(
                "route {index} names cluster {name:?}, which has no handle"
            ))
        })?;
        let policies = &self.hash_policies[index];
        let (hash, hash_cookies) = if policies.policies().is_empty() {
            (None, Vec::new())
        } else {
            let lookup = MetadataLookup(headers);
            let filter_state = [(CHANNEL_ID_KEY, channel_id)];
            // A client has no downstream connection for Envoy's generated
            // value: each call without the cookie starts a new one at random
            // (a jar then keeps it, as a browser keeps Envoy's).
            let generated = policies
                .policies()
                .iter()
                .any(|p| {
                    matches!(
                        p.source(),
                        Source::Cookie {
                            generate: Some(_),
                            ..
                        }
                    )
                })
                .then(|| format!("{:016x}", random::next_u64()));
            let request = HashRequest {
                path,
                filter_state: &filter_state,
                generated: generated.as_deref(),
                ..HashRequest::new(&lookup as &dyn HeaderLookup)
            };
            let evaluation = policies.evaluate(&request);
            let hash = match evaluation.hash {
                RequestHash::Hash(h) => Some(h),
                RequestHash::NoHash => None,
            };
            (hash, evaluation.set_cookies)
        };
        Ok(CallConfig {
            cluster,
            session,
            faults,
            retry: self.retries[index].clone(),
            hash,
            // Zero is no timeout (C-core; istiod sends 0s on every route).
            timeout: action
                .max_stream_duration
                .or(self.default_timeout)
                .filter(|d| !d.is_zero()),
            hash_cookies,
        })
    }
}

/// The filter-state key gRPC's hash policies may name.
const CHANNEL_ID_KEY: &str = "io.grpc.channel_id";

/// A call's metadata as tether-core's hash policies read headers.
struct MetadataLookup<'a>(&'a HeaderMap);

impl HeaderLookup for MetadataLookup<'_> {
    fn for_each_value(&self, name: &str, f: &mut dyn FnMut(&str)) {
        for v in self.0.get_all(name) {
            if let Ok(v) = v.to_str() {
                f(v);
            }
        }
    }
}

/// A route's hash policies in tether-core's form, with gRPC's rules for
/// headers. Beyond C-core, which ignores them, cookie policies (generating
/// the cookie when they have a ttl) and query parameter policies work; a
/// client has no source IP to hash. The route was validated, so a policy
/// core refuses is only logged and left out.
fn route_hash_policies(list: &[HashPolicy]) -> HashPolicies {
    let policies = list
        .iter()
        .filter_map(|p| {
            let converted = match &p.source {
                HashSource::Header {
                    name,
                    rewrite: None,
                } => CoreHashPolicy::header(name),
                HashSource::Header {
                    name,
                    rewrite: Some((pattern, substitution)),
                } => match Rewrite::new(&pattern.source, substitution) {
                    Ok(r) => CoreHashPolicy::header_rewritten(name, r),
                    Err(e) => {
                        log::warn!("hash policy on header {name:?} left out: {e}");
                        return None;
                    }
                },
                HashSource::Cookie {
                    name,
                    ttl: Some(ttl),
                    path,
                } => match CookieSpec::new(name, path, *ttl, Vec::new()) {
                    Ok(spec) => Ok(CoreHashPolicy::cookie_generated(spec)),
                    Err(e) => {
                        log::warn!("hash policy on cookie {name:?} left out: {e}");
                        return None;
                    }
                },
                HashSource::Cookie {
                    name, ttl: None, ..
                } => CoreHashPolicy::cookie(name),
                HashSource::SourceIp => Ok(CoreHashPolicy::source_ip()),
                HashSource::QueryParameter(name) => CoreHashPolicy::query_parameter(name),
                HashSource::FilterState(key) => CoreHashPolicy::filter_state(key),
            };
            match converted {
                Ok(c) => Some(c.terminal(p.terminal)),
                Err(e) => {
                    log::warn!("hash policy {:?} left out: {e}", p.source);
                    None
                }
            }
        })
        .collect();
    HashPolicies::new(policies, Peer::GrpcExtended)
}

/// The index of a cluster at random by weight (gRFC A28).
fn weighted_choice(entries: &[ClusterWeight]) -> usize {
    let total: u64 = entries.iter().map(|e| u64::from(e.weight)).sum();
    let mut r = random::below(total.max(1));
    for (i, e) in entries.iter().enumerate() {
        let w = u64::from(e.weight);
        if r < w {
            return i;
        }
        r -= w;
    }
    // Unreachable with weights summing above zero (validation ensures it).
    entries.len() - 1
}

/// Each route's fault injection configs: for each fault filter of the
/// listener, its config overridden per virtual host, route and
/// weighted-cluster entry (most specific wins; `disabled` turns it off;
/// an override replaces the config whole, as in C-core).
fn route_faults(vh: &VirtualHost, filters: &[HttpFilter]) -> Vec<RouteFaults> {
    let names: Vec<(&str, &FaultConfig)> = filters
        .iter()
        .filter_map(|f| match &f.config {
            FilterConfig::Fault(c) => Some((f.name.as_str(), c)),
            _ => None,
        })
        .collect();
    if names.is_empty() {
        return vh.routes.iter().map(|_| RouteFaults::default()).collect();
    }
    // One config (or none, when disabled) per filter, through the scopes.
    type Scope = Vec<Option<FaultConfig>>;
    let apply =
        |above: &Scope, overrides: &crate::xds::resource::route::FilterOverrides| -> Scope {
            names
                .iter()
                .zip(above)
                .map(|((name, _), above)| match overrides.get(*name) {
                    Some(FilterOverride::Fault(c)) => Some(c.clone()),
                    Some(FilterOverride::Disabled) => None,
                    Some(_) => above.clone(),
                    None => above.clone(),
                })
                .collect()
        };
    let list = |scope: &Scope| -> Option<Arc<[FaultConfig]>> {
        let on: Vec<FaultConfig> = scope.iter().flatten().cloned().collect();
        (!on.is_empty()).then(|| on.into())
    };
    let base: Scope = names.iter().map(|(_, c)| Some((*c).clone())).collect();
    let vh_level = apply(&base, &vh.filter_overrides);
    vh.routes
        .iter()
        .map(|r| {
            let route_scope = apply(&vh_level, &r.filter_overrides);
            let route = list(&route_scope);
            let entries = r
                .weighted_clusters()
                .iter()
                .map(|w| {
                    let overrides_one = names
                        .iter()
                        .any(|(n, _)| w.filter_overrides.contains_key(*n));
                    overrides_one.then(|| list(&apply(&route_scope, &w.filter_overrides)))
                })
                .collect();
            RouteFaults { route, entries }
        })
        .collect()
}

/// Whether a call matches a route's conditions.
pub fn route_matches(m: &RouteMatcher, path: &str, headers: &HeaderMap) -> bool {
    let path_ok = match &m.path {
        PathMatcher::Prefix(p) if m.case_sensitive => path.starts_with(p.as_str()),
        PathMatcher::Prefix(p) => path
            .get(..p.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(p)),
        PathMatcher::Path(p) if m.case_sensitive => path == p,
        PathMatcher::Path(p) => path.eq_ignore_ascii_case(p),
        PathMatcher::Regex(r) => r.regex.is_match(path),
    };
    path_ok
        && m.headers.iter().all(|h| header_matches(h, headers))
        && m.fraction_per_million
            .is_none_or(|f| random::below(1_000_000) < u64::from(f))
}

/// A header's value as gRPC matches it: repeated values joined with `,`;
/// binary (`-bin`) headers are never seen.
pub(crate) fn header_value(headers: &HeaderMap, name: &str) -> Option<String> {
    if name.ends_with("-bin") {
        return None;
    }
    let mut values = headers.get_all(name).iter().filter_map(|v| v.to_str().ok());
    let first = values.next()?;
    let mut out = first.to_owned();
    for v in values {
        out.push(',');
        out.push_str(v);
    }
    Some(out)
}

/// One header condition, C-core's way: an absent header fails every
/// condition but `present` (inverted or not).
pub fn header_matches(h: &HeaderMatcher, headers: &HeaderMap) -> bool {
    let value = header_value(headers, &h.name);
    let matched = match (&h.kind, value.as_deref()) {
        (HeaderMatch::Present(want), v) => v.is_some() == *want,
        (_, None) => return false,
        (HeaderMatch::Exact(s, ic), Some(v)) => fold(v, *ic) == fold(s, *ic),
        (HeaderMatch::Prefix(s, ic), Some(v)) => fold(v, *ic).starts_with(&*fold(s, *ic)),
        (HeaderMatch::Suffix(s, ic), Some(v)) => fold(v, *ic).ends_with(&*fold(s, *ic)),
        (HeaderMatch::Contains(s, ic), Some(v)) => fold(v, *ic).contains(&*fold(s, *ic)),
        (HeaderMatch::Regex(r), Some(v)) => r.regex.is_match(v),
        (HeaderMatch::Range(start, end), Some(v)) => {
            v.parse::<i64>().is_ok_and(|n| *start <= n && n < *end)
        }
    };
    matched != h.invert
}

fn fold(s: &str, ignore_case: bool) -> std::borrow::Cow<'_, str> {
    if ignore_case {
        std::borrow::Cow::Owned(s.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resource::listener::SessionOverride;
    use crate::xds::resource::route::Pattern;

    fn matcher(
        path: PathMatcher,
        case_sensitive: bool,
        headers: Vec<HeaderMatcher>,
    ) -> RouteMatcher {
        RouteMatcher {
            path,
            case_sensitive,
            headers,
            fraction_per_million: None,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn hm(name: &str, kind: HeaderMatch, invert: bool) -> HeaderMatcher {
        HeaderMatcher {
            name: name.into(),
            kind,
            invert,
        }
    }

    #[test]
    fn prefix_and_path_respect_case_sensitivity() {
        let none = HeaderMap::new();
        let p = |s: &str| PathMatcher::Prefix(s.into());
        assert!(route_matches(
            &matcher(p("/shop."), true, vec![]),
            "/shop.Cart/Add",
            &none
        ));
        assert!(!route_matches(
            &matcher(p("/SHOP."), true, vec![]),
            "/shop.Cart/Add",
            &none
        ));
        assert!(route_matches(
            &matcher(p("/SHOP."), false, vec![]),
            "/shop.Cart/Add",
            &none
        ));
        assert!(route_matches(&matcher(p(""), true, vec![]), "/x/y", &none));
        let exact = |s: &str| PathMatcher::Path(s.into());
        assert!(route_matches(
            &matcher(exact("/a.B/C"), true, vec![]),
            "/a.B/C",
            &none
        ));
        assert!(!route_matches(
            &matcher(exact("/a.B/C"), true, vec![]),
            "/a.B/Cx",
            &none
        ));
        assert!(route_matches(
            &matcher(exact("/A.b/c"), false, vec![]),
            "/a.B/C",
            &none
        ));
    }

    #[test]
    fn regex_paths_match_in_full() {
        let re = regex_lite::Regex::new("^(?:/a\\..*/Get)$").unwrap();
        let m = matcher(
            PathMatcher::Regex(Pattern {
                source: "/a\\..*/Get".into(),
                regex: re,
            }),
            true,
            vec![],
        );
        assert!(route_matches(&m, "/a.Svc/Get", &HeaderMap::new()));
        assert!(!route_matches(&m, "/a.Svc/GetMore", &HeaderMap::new()));
    }

    #[test]
    fn header_conditions_as_c_core_evaluates_them() {
        let h = headers(&[
            ("x-user", "alice"),
            ("x-n", "42"),
            ("x-multi", "a"),
            ("x-multi", "b"),
        ]);
        let exact = |v: &str, ic| HeaderMatch::Exact(v.into(), ic);
        assert!(header_matches(
            &hm("x-user", exact("alice", false), false),
            &h
        ));
        assert!(!header_matches(
            &hm("x-user", exact("ALICE", false), false),
            &h
        ));
        assert!(header_matches(
            &hm("x-user", exact("ALICE", true), false),
            &h
        ));
        assert!(header_matches(&hm("x-user", exact("bob", false), true), &h));
        assert!(header_matches(
            &hm("x-multi", exact("a,b", false), false),
            &h
        ));
        assert!(header_matches(
            &hm("x-n", HeaderMatch::Range(40, 43), false),
            &h
        ));
        assert!(!header_matches(
            &hm("x-n", HeaderMatch::Range(43, 50), false),
            &h
        ));
        assert!(header_matches(
            &hm("x-user", HeaderMatch::Prefix("al".into(), false), false),
            &h
        ));
        assert!(header_matches(
            &hm("x-user", HeaderMatch::Suffix("ce".into(), false), false),
            &h
        ));
        assert!(header_matches(
            &hm("x-user", HeaderMatch::Contains("lic".into(), false), false),
            &h
        ));
        // Absent: only `present` can match, inverted or not.
        assert!(!header_matches(&hm("x-none", exact("a", false), false), &h));
        assert!(!header_matches(&hm("x-none", exact("a", false), true), &h));
        assert!(header_matches(
            &hm("x-none", HeaderMatch::Present(false), false),
            &h
        ));
        assert!(header_matches(
            &hm("x-none", HeaderMatch::Present(true), true),
            &h
        ));
        assert!(header_matches(
            &hm("x-user", HeaderMatch::Present(true), false),
            &h
        ));
    }

    fn selector_with(policies: Vec<HashPolicy>) -> ConfigSelector {
        use crate::xds::resource::route::{Route, RouteAction};
        let (tx, _) = tokio::sync::mpsc::unbounded_channel();
        let cluster = Arc::new(ClusterRef {
            name: "c".into(),
            control: tx.downgrade(),
        });
        let route = Route {
            name: String::new(),
            matcher: matcher(PathMatcher::Prefix(String::new()), true, vec![]),
            action: Action::Route(RouteAction {
                clusters: ClusterSpecifier::Cluster("c".into()),
                hash_policies: policies,
                max_stream_duration: None,
                retry_policy: None,
            }),
            filter_overrides: Default::default(),
        };
        let vh = VirtualHost {
            name: "vh".into(),
            domains: vec!["*".into()],
            routes: vec![route],
            filter_overrides: Default::default(),
            retry_policy: None,
        };
        ConfigSelector::new(
            vh,
            None,
            HashMap::from([("c".to_owned(), cluster)]),
            &[],
            &SessionOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn fault_configs_resolve_most_specific_first_per_filter() {
        use crate::xds::resource::fault::{AbortSource, FaultAbort, Fraction};
        use crate::xds::resource::route::{Route, RouteAction};
        use tonic::Code;
        let abort = |code: Code| {
            let mut c = FaultConfig::default();
            c.abort = Some(FaultAbort {
                source: AbortSource::Status(Some(code)),
                percentage: Fraction::NONE,
            });
            c
        };
        let filter = |name: &str, code: Code| HttpFilter {
            name: name.into(),
            config: FilterConfig::Fault(abort(code)),
        };
        let filters = [
            filter("f1", Code::Unavailable),
            filter("f2", Code::Aborted),
            HttpFilter {
                name: "router".into(),
                config: FilterConfig::Router,
            },
        ];
        let overrides = |pairs: Vec<(&str, FilterOverride)>| {
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<crate::xds::resource::route::FilterOverrides>()
        };
        let route = |clusters: ClusterSpecifier, o| Route {
            name: String::new(),
            matcher: matcher(PathMatcher::Prefix(String::new()), true, vec![]),
            action: Action::Route(RouteAction {
                clusters,
                hash_policies: vec![],
                max_stream_duration: None,
                retry_policy: None,
            }),
            filter_overrides: o,
        };
        let one = || ClusterSpecifier::Cluster("c".into());
        let weighted = ClusterSpecifier::Weighted(vec![
            ClusterWeight {
                name: "a".into(),
                weight: 1,
                filter_overrides: overrides(vec![("f1", FilterOverride::Disabled)]),
            },
            ClusterWeight {
                name: "b".into(),
                weight: 1,
                filter_overrides: overrides(vec![]),
            },
        ]);
        let vh = VirtualHost {
            name: "vh".into(),
            domains: vec!["*".into()],
            routes: vec![
                route(one(), overrides(vec![])),
                route(
                    one(),
                    overrides(vec![("f1", FilterOverride::Fault(abort(Code::Internal)))]),
                ),
                route(weighted, overrides(vec![])),
                route(
                    one(),
                    overrides(vec![("f2", FilterOverride::Fault(abort(Code::DataLoss)))]),
                ),
                // Another filter's override type under a fault filter's
                // name leaves the scope above in effect.
                route(
                    one(),
                    overrides(vec![(
                        "f1",
                        FilterOverride::Session(SessionOverride::Disabled),
                    )]),
                ),
            ],
            // The virtual host turns the second filter off.
            filter_overrides: overrides(vec![("f2", FilterOverride::Disabled)]),
            retry_policy: None,
        };
        let codes = |list: &Option<Arc<[FaultConfig]>>| -> Vec<Code> {
            list.iter()
                .flat_map(|l| l.iter())
                .map(|c| match c.abort.unwrap().source {
                    AbortSource::Status(Some(code)) => code,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        let resolved = route_faults(&vh, &filters);
        assert_eq!(codes(&resolved[0].route), [Code::Unavailable]);
        assert_eq!(codes(&resolved[1].route), [Code::Internal]);
        assert_eq!(codes(&resolved[2].route), [Code::Unavailable]);
        // Entry a turns f1 off: no fault filter left; entry b keeps the route's.
        assert_eq!(resolved[2].entries.len(), 2);
        assert_eq!(resolved[2].entries[0], Some(None));
        assert!(resolved[2].entries[1].is_none());
        assert_eq!(
            codes(&resolved[3].route),
            [Code::Unavailable, Code::DataLoss]
        );
        assert_eq!(codes(&resolved[4].route), [Code::Unavailable]);
        // Without a fault filter, nothing to run on any route.
        assert!(route_faults(&vh, &filters[2..])
            .iter()
            .all(|r| r.route.is_none() && r.entries.is_empty()));
    }

    fn header_policy(name: &str, terminal: bool) -> HashPolicy {
        HashPolicy {
            source: HashSource::Header {
                name: name.into(),
                rewrite: None,
            },
            terminal,
        }
    }

    #[test]
    fn route_hash_policies_hash_headers_with_grpc_rules_and_cookies_as_envoy() {
        let hash = |sel: &ConfigSelector, h: &[(&str, &str)]| {
            sel.select("/a.B/C", &headers(h), "ch-1").unwrap().hash
        };
        // INTEROP section 7's vectors.
        let one = selector_with(vec![header_policy("x-a", false)]);
        assert_eq!(hash(&one, &[("x-a", "foo")]), Some(0x33bf_00a8_59c4_ba3f));
        assert_eq!(hash(&one, &[]), None);
        let two = selector_with(vec![
            header_policy("x-a", false),
            header_policy("x-b", false),
        ]);
        assert_eq!(
            hash(&two, &[("x-a", "foo"), ("x-b", "bar")]),
            Some(0x2fdd_7dc0_1eae_d227)
        );
        let terminal = selector_with(vec![
            header_policy("x-a", true),
            header_policy("x-b", false),
        ]);
        assert_eq!(
            hash(&terminal, &[("x-a", "foo"), ("x-b", "bar")]),
            Some(0x33bf_00a8_59c4_ba3f)
        );
        // Beyond C-core (which ignores them), cookie policies hash as
        // Envoy's: the value's XXH64; with a ttl, a missing cookie is
        // generated (a random value) and set on the response.
        let cookie = |ttl| {
            selector_with(vec![HashPolicy {
                source: HashSource::Cookie {
                    name: "s".into(),
                    ttl,
                    path: "/".into(),
                },
                terminal: false,
            }])
        };
        let plain = cookie(None);
        assert_eq!(
            hash(&plain, &[("cookie", "s=foo")]),
            Some(tether_core::hash::xxh64(b"foo", 0))
        );
        assert_eq!(hash(&plain, &[]), None, "no ttl: nothing generated");
        let generating = cookie(Some(Duration::ZERO));
        let a = generating.select("/a.B/C", &headers(&[]), "ch-1").unwrap();
        let b = generating.select("/a.B/C", &headers(&[]), "ch-1").unwrap();
        assert!(a.hash.is_some() && a.hash != b.hash, "a new value per call");
        assert_eq!(a.hash_cookies.len(), 1);
        let value = a.hash_cookies[0]
            .strip_prefix("s=\"")
            .and_then(|v| v.split('"').next())
            .unwrap();
        assert_eq!(a.hash, Some(tether_core::hash::xxh64(value.as_bytes(), 0)));
        let sent = format!("s={value}");
        let again = generating
            .select("/a.B/C", &headers(&[("cookie", &sent)]), "ch-1")
            .unwrap();
        assert_eq!(again.hash, a.hash, "the cookie sent back keeps the hash");
        assert!(again.hash_cookies.is_empty());
        // A route without policies computes nothing.
        assert_eq!(hash(&selector_with(vec![]), &[("x-a", "foo")]), None);
    }

    #[test]
    fn binary_headers_are_never_matched() {
        let h = headers(&[("x-token-bin", "AAEC")]);
        assert!(!header_matches(
            &hm("x-token-bin", HeaderMatch::Present(true), false),
            &h
        ));
    }
}
