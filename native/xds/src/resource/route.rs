//! RouteConfiguration validation: virtual hosts, routes with path and header
//! matchers, single or weighted clusters, hash policies, and per-filter
//! overrides (the stateful session filter's `StatefulSessionPerRoute`).

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
use envoy_types::pb::google::protobuf as pb;

pub use rpb::RouteConfiguration;

use super::http_filter::{filter_override, FilterOverride};
use super::retry::{self, RetryPolicy};
use super::Check;

/// A validated route configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfigResource {
    /// Its name.
    pub name: String,
    /// Virtual hosts in order.
    pub virtual_hosts: Vec<VirtualHost>,
}

/// Per-filter overrides, keyed by HTTP filter instance name.
pub type FilterOverrides = BTreeMap<String, FilterOverride>;

/// A virtual host.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualHost {
    /// Its name.
    pub name: String,
    /// Domains it serves (`*` wildcards as Envoy matches them).
    pub domains: Vec<String>,
    /// Routes in order; the first match wins.
    pub routes: Vec<Route>,
    /// Filter overrides for the whole virtual host.
    pub filter_overrides: FilterOverrides,
    /// The virtual host's `retry_policy`, for routes without their own.
    pub retry_policy: Option<RetryPolicy>,
}

/// A route.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Its name (may be empty).
    pub name: String,
    /// What requests it matches.
    pub matcher: RouteMatcher,
    /// What to do with them.
    pub action: Action,
    /// Filter overrides for this route.
    pub filter_overrides: FilterOverrides,
}

impl Route {
    /// The route's weighted-cluster entries (none when it names one
    /// cluster or does not forward).
    pub fn weighted_clusters(&self) -> &[ClusterWeight] {
        match &self.action {
            Action::Route(RouteAction {
                clusters: ClusterSpecifier::Weighted(entries),
                ..
            }) => entries,
            _ => &[],
        }
    }
}

/// A compiled regular expression that remembers its source.
#[derive(Debug, Clone)]
pub struct Pattern {
    /// The expression as written.
    pub source: String,
    /// Compiled, anchored to the whole input.
    pub regex: regex_lite::Regex,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Pattern {
    /// `m`'s regex, which must match the whole input (RE2's `FullMatch`).
    pub(crate) fn new(c: &mut Check, m: &mpb::RegexMatcher) -> Option<Pattern> {
        Pattern::compile(c, m, full_match)
    }

    /// `m`'s regex as written, matching anywhere (for rewrites).
    fn unanchored(c: &mut Check, m: &mpb::RegexMatcher) -> Option<Pattern> {
        Pattern::compile(c, m, regex_lite::Regex::new)
    }

    /// Compiles `m.regex` with `build`; an error names `m.regex`.
    fn compile(
        c: &mut Check,
        m: &mpb::RegexMatcher,
        build: fn(&str) -> Result<regex_lite::Regex, regex_lite::Error>,
    ) -> Option<Pattern> {
        c.at("regex", |c| match build(&m.regex) {
            Ok(regex) => Some(Pattern {
                source: m.regex.clone(),
                regex,
            }),
            Err(e) => {
                c.fail_value(&m.regex, format!("is not a valid regex: {e}"));
                None
            }
        })
    }
}

/// `regex` compiled to match whole inputs only, as RE2's `FullMatch`.
///
/// The pattern is compiled alone first, as RE2 would: wrapped unchecked,
/// `x)|(.*` would close the wrapper's group and match everything. Once it is
/// a well-formed expression on its own, the anchors around it cannot be
/// escaped. (A span check on a search is no full match either: the leftmost
/// match of `a|ab` in `ab` is `a`.)
pub fn full_match(regex: &str) -> Result<regex_lite::Regex, regex_lite::Error> {
    regex_lite::Regex::new(regex)?;
    regex_lite::Regex::new(&format!("^(?:{regex})$"))
}

/// Path part of a route match.
#[derive(Debug, Clone, PartialEq)]
pub enum PathMatcher {
    /// The path starts with this.
    Prefix(String),
    /// The path equals this.
    Path(String),
    /// The path matches this regex in full.
    Regex(Pattern),
}

/// A route's match conditions.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteMatcher {
    /// The path condition.
    pub path: PathMatcher,
    /// Whether prefix and path compare case-sensitively (default true).
    pub case_sensitive: bool,
    /// Header conditions; all must hold.
    pub headers: Vec<HeaderMatcher>,
    /// `runtime_fraction` as parts per million, if set.
    pub fraction_per_million: Option<u32>,
}

/// A header condition.
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderMatcher {
    /// Header name, lowercase.
    pub name: String,
    /// The condition on its value.
    pub kind: HeaderMatch,
    /// Negates the result.
    pub invert: bool,
}

/// A condition on a header's value.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderMatch {
    /// Equals (optionally ignoring ASCII case).
    Exact(String, bool),
    /// Starts with.
    Prefix(String, bool),
    /// Ends with.
    Suffix(String, bool),
    /// Contains.
    Contains(String, bool),
    /// Matches in full.
    Regex(Pattern),
    /// An integer in `[start, end)`.
    Range(i64, i64),
    /// Present (true) or absent (false).
    Present(bool),
}

/// What a route does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Forward to a cluster.
    Route(RouteAction),
    /// Redirect, direct response or non-forwarding: RPCs on it fail.
    NonForwarding,
}

/// A forwarding action.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteAction {
    /// Where to send requests.
    pub clusters: ClusterSpecifier,
    /// Hash policies for ring hash, in order.
    pub hash_policies: Vec<HashPolicy>,
    /// `max_stream_duration.grpc_timeout_header_max` or `max_stream_duration`, if set.
    pub max_stream_duration: Option<Duration>,
    /// The route's `retry_policy`, else its virtual host's (gRFC A44).
    pub retry_policy: Option<RetryPolicy>,
}

/// One cluster or a weighted choice among several.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterSpecifier {
    /// A single cluster.
    Cluster(String),
    /// Weighted clusters (weights sum to more than zero).
    Weighted(Vec<ClusterWeight>),
}

/// A weighted cluster entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterWeight {
    /// Cluster name.
    pub name: String,
    /// Relative weight.
    pub weight: u32,
    /// Filter overrides for this entry.
    pub filter_overrides: FilterOverrides,
}

/// A hash policy entry.
#[derive(Debug, Clone, PartialEq)]
pub struct HashPolicy {
    /// What to hash.
    pub source: HashSource,
    /// Stop after this entry if it produced a hash.
    pub terminal: bool,
}

/// The request attribute a hash policy reads.
#[derive(Debug, Clone, PartialEq)]
pub enum HashSource {
    /// A header (lowercase name) with an optional regex rewrite of its value.
    Header {
        /// Header name.
        name: String,
        /// `(pattern, substitution)` applied to the value first.
        rewrite: Option<(Pattern, String)>,
    },
    /// A cookie (Envoy generates it when `ttl` is set); gRPC ignores this.
    Cookie {
        /// Cookie name.
        name: String,
        /// Present ttl (generation on), or none.
        ttl: Option<Duration>,
        /// Cookie path.
        path: String,
    },
    /// The source IP; gRPC ignores this.
    SourceIp,
    /// A query parameter; gRPC ignores this.
    QueryParameter(String),
    /// Filter state under a key; gRPC honours `io.grpc.channel_id`.
    FilterState(String),
}

pub(crate) fn validate(c: &mut Check, rc: &RouteConfiguration) -> RouteConfigResource {
    if !rc.cluster_specifier_plugins.is_empty() {
        c.fail_at("cluster_specifier_plugins", "are not supported");
    }
    let virtual_hosts = c.each("virtual_hosts", &rc.virtual_hosts, |c, vh| {
        Some(virtual_host(c, vh))
    });
    RouteConfigResource {
        name: rc.name.clone(),
        virtual_hosts,
    }
}

fn overrides(c: &mut Check, map: &std::collections::HashMap<String, pb::Any>) -> FilterOverrides {
    let mut out = FilterOverrides::new();
    c.at("typed_per_filter_config", |c| {
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        for k in keys {
            c.at(&format!("[{k:?}]"), |c| {
                if let Some(o) = filter_override(c, &map[k]) {
                    out.insert(k.clone(), o);
                }
            });
        }
    });
    out
}

fn virtual_host(c: &mut Check, vh: &rpb::VirtualHost) -> VirtualHost {
    if vh.domains.is_empty() {
        c.fail_at("domains", "must be non-empty");
    }
    let filter_overrides = overrides(c, &vh.typed_per_filter_config);
    let retry_policy = vh
        .retry_policy
        .as_ref()
        .map(|p| c.at("retry_policy", |c| retry::validate(c, p)));
    let routes = c.each("routes", &vh.routes, |c, r| {
        route(c, r, retry_policy.as_ref())
    });
    VirtualHost {
        name: vh.name.clone(),
        domains: vh.domains.clone(),
        routes,
        filter_overrides,
        retry_policy,
    }
}

fn route(c: &mut Check, r: &rpb::Route, vh_retry: Option<&RetryPolicy>) -> Option<Route> {
    let matcher = c.at("match", |c| match &r.r#match {
        None => {
            c.fail("field not present");
            None
        }
        Some(m) => route_match(c, m),
    });
    let action = match &r.action {
        Some(rpb::route::Action::Route(a)) => c
            .at("route", |c| route_action(c, a, vh_retry))
            .map(Action::Route),
        Some(_) => Some(Action::NonForwarding),
        None => {
            c.fail_at("action", "field not present");
            None
        }
    };
    let filter_overrides = overrides(c, &r.typed_per_filter_config);
    Some(Route {
        name: r.name.clone(),
        matcher: matcher?,
        action: action?,
        filter_overrides,
    })
}

fn route_match(c: &mut Check, m: &rpb::RouteMatch) -> Option<RouteMatcher> {
    use rpb::route_match::PathSpecifier as P;
    let path = match &m.path_specifier {
        Some(P::Prefix(p)) => Some(PathMatcher::Prefix(p.clone())),
        Some(P::Path(p)) => Some(PathMatcher::Path(p.clone())),
        Some(P::SafeRegex(r)) => c
            .at("safe_regex", |c| Pattern::new(c, r))
            .map(PathMatcher::Regex),
        Some(P::PathSeparatedPrefix(_)) => c.unsupported("path_separated_prefix"),
        Some(P::ConnectMatcher(_)) => c.unsupported("connect_matcher"),
        Some(P::PathMatchPolicy(_)) => c.unsupported("path_match_policy"),
        None => {
            c.fail("path_specifier: none of prefix, path or safe_regex is set");
            None
        }
    };
    let headers = c.each("headers", &m.headers, header_matcher);
    let fraction_per_million = m.runtime_fraction.as_ref().and_then(|f| {
        f.default_value.as_ref().map(|p| {
            use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType as D;
            let per_million = match D::try_from(p.denominator).unwrap_or(D::Hundred) {
                D::Hundred => u64::from(p.numerator) * 10_000,
                D::TenThousand => u64::from(p.numerator) * 100,
                D::Million => u64::from(p.numerator),
            };
            per_million.min(1_000_000) as u32
        })
    });
    Some(RouteMatcher {
        path: path?,
        case_sensitive: m.case_sensitive.as_ref().is_none_or(|b| b.value),
        headers,
        fraction_per_million,
    })
}

// The deprecated direct matchers are still sent by control planes; read them.
#[allow(deprecated)]
fn header_matcher(c: &mut Check, h: &rpb::HeaderMatcher) -> Option<HeaderMatcher> {
    use rpb::header_matcher::HeaderMatchSpecifier as H;
    if h.name.is_empty() {
        c.fail_at("name", "field not present");
        return None;
    }
    let kind = match &h.header_match_specifier {
        Some(H::ExactMatch(s)) => HeaderMatch::Exact(s.clone(), false),
        Some(H::PrefixMatch(s)) => HeaderMatch::Prefix(s.clone(), false),
        Some(H::SuffixMatch(s)) => HeaderMatch::Suffix(s.clone(), false),
        Some(H::ContainsMatch(s)) => HeaderMatch::Contains(s.clone(), false),
        Some(H::PresentMatch(b)) => HeaderMatch::Present(*b),
        Some(H::RangeMatch(r)) => {
            if r.end < r.start {
                c.at("range_match", |c| {
                    c.fail_value((r.start, r.end), "has end before start")
                });
                return None;
            }
            HeaderMatch::Range(r.start, r.end)
        }
        Some(H::SafeRegexMatch(r)) => {
            HeaderMatch::Regex(c.at("safe_regex_match", |c| Pattern::new(c, r))?)
        }
        Some(H::StringMatch(s)) => c.at("string_match", |c| string_match(c, s))?,
        None => {
            c.fail("header_match_specifier: field not present");
            return None;
        }
    };
    Some(HeaderMatcher {
        name: h.name.to_ascii_lowercase(),
        kind,
        invert: h.invert_match,
    })
}

fn string_match(c: &mut Check, s: &mpb::StringMatcher) -> Option<HeaderMatch> {
    use mpb::string_matcher::MatchPattern as M;
    let ic = s.ignore_case;
    Some(match &s.match_pattern {
        Some(M::Exact(v)) => HeaderMatch::Exact(v.clone(), ic),
        Some(M::Prefix(v)) => HeaderMatch::Prefix(v.clone(), ic),
        Some(M::Suffix(v)) => HeaderMatch::Suffix(v.clone(), ic),
        Some(M::Contains(v)) => HeaderMatch::Contains(v.clone(), ic),
        Some(M::SafeRegex(r)) => {
            if ic {
                c.fail_at("ignore_case", "cannot be combined with safe_regex");
                return None;
            }
            HeaderMatch::Regex(c.at("safe_regex", |c| Pattern::new(c, r))?)
        }
        Some(M::Custom(_)) => return c.unsupported("custom"),
        None => {
            c.fail("match_pattern: field not present");
            return None;
        }
    })
}

fn route_action(
    c: &mut Check,
    a: &rpb::RouteAction,
    vh_retry: Option<&RetryPolicy>,
) -> Option<RouteAction> {
    use rpb::route_action::ClusterSpecifier as S;
    let clusters = match &a.cluster_specifier {
        Some(S::Cluster(name)) => {
            if name.is_empty() {
                c.fail_at("cluster", "field not present");
                None
            } else {
                Some(ClusterSpecifier::Cluster(name.clone()))
            }
        }
        Some(S::WeightedClusters(w)) => c.at("weighted_clusters", |c| weighted(c, w)),
        Some(S::ClusterHeader(_)) => c.unsupported("cluster_header"),
        Some(S::ClusterSpecifierPlugin(_)) | Some(S::InlineClusterSpecifierPlugin(_)) => {
            c.fail("cluster specifier plugins are not supported");
            None
        }
        None => {
            c.fail("cluster_specifier: none of cluster or weighted_clusters is set");
            None
        }
    };
    let hash_policies = c.each("hash_policy", &a.hash_policy, hash_policy);
    let max_stream_duration = a.max_stream_duration.as_ref().and_then(|m| {
        c.at("max_stream_duration", |c| {
            let d = m
                .grpc_timeout_header_max
                .as_ref()
                .map(|d| ("grpc_timeout_header_max", d))
                .or(m
                    .max_stream_duration
                    .as_ref()
                    .map(|d| ("max_stream_duration", d)))?;
            c.at(d.0, |c| c.duration(d.1))
        })
    });
    let retry_policy = match &a.retry_policy {
        Some(p) => Some(c.at("retry_policy", |c| retry::validate(c, p))),
        None => vh_retry.cloned(),
    };
    Some(RouteAction {
        clusters: clusters?,
        hash_policies,
        max_stream_duration,
        retry_policy,
    })
}

fn weighted(c: &mut Check, w: &rpb::WeightedCluster) -> Option<ClusterSpecifier> {
    let mut total: u64 = 0;
    if w.clusters.is_empty() {
        c.fail_at("clusters", "must be non-empty");
    }
    let out = c.each("clusters", &w.clusters, |c, cw| {
        if cw.name.is_empty() {
            c.fail_at("name", "field not present");
        }
        let weight = match &cw.weight {
            Some(v) => v.value,
            None => {
                c.fail_at("weight", "field not present");
                0
            }
        };
        total += u64::from(weight);
        let filter_overrides = overrides(c, &cw.typed_per_filter_config);
        Some(ClusterWeight {
            name: cw.name.clone(),
            weight,
            filter_overrides,
        })
    });
    if total == 0 && !w.clusters.is_empty() {
        c.fail("sum of cluster weights is zero");
    } else if total > u64::from(u32::MAX) {
        c.fail_value(total, "sum of cluster weights is above 4294967295");
    }
    Some(ClusterSpecifier::Weighted(out))
}

fn hash_policy(c: &mut Check, h: &rpb::route_action::HashPolicy) -> Option<HashPolicy> {
    use rpb::route_action::hash_policy::PolicySpecifier as P;
    let source = match &h.policy_specifier {
        Some(P::Header(hd)) => c.at("header", |c| {
            if hd.header_name.is_empty() {
                c.fail_at("header_name", "field not present");
                return None;
            }
            let rewrite = match &hd.regex_rewrite {
                None => None,
                Some(rw) => c.at("regex_rewrite", |c| {
                    let Some(p) = &rw.pattern else {
                        c.fail_at("pattern", "field not present");
                        return None;
                    };
                    let pat = c.at("pattern", |c| Pattern::unanchored(c, p))?;
                    Some((pat, rw.substitution.clone()))
                }),
            };
            if hd.regex_rewrite.is_some() && rewrite.is_none() {
                return None;
            }
            Some(HashSource::Header {
                name: hd.header_name.to_ascii_lowercase(),
                rewrite,
            })
        })?,
        Some(P::Cookie(ck)) => c.at("cookie", |c| {
            if ck.name.is_empty() {
                c.fail_at("name", "field not present");
                return None;
            }
            let ttl = match &ck.ttl {
                None => None,
                Some(d) => Some(c.at("ttl", |c| c.duration(d))?),
            };
            Some(HashSource::Cookie {
                name: ck.name.clone(),
                ttl,
                path: ck.path.clone(),
            })
        })?,
        Some(P::ConnectionProperties(p)) => {
            if !p.source_ip {
                return None;
            }
            HashSource::SourceIp
        }
        Some(P::QueryParameter(q)) => HashSource::QueryParameter(q.name.clone()),
        Some(P::FilterState(f)) => HashSource::FilterState(f.key.clone()),
        None => {
            c.fail("policy_specifier: field not present");
            return None;
        }
    };
    Some(HashPolicy {
        source,
        terminal: h.terminal,
    })
}

impl VirtualHost {
    /// Whether this virtual host serves `host`, with Envoy's wildcard rules
    /// (`*`, `*.suffix`, `prefix.*`).
    pub fn serves(&self, host: &str) -> bool {
        self.domains.iter().any(|d| domain_matches(d, host))
    }
}

/// Envoy's domain match for one pattern.
pub fn domain_matches(pattern: &str, host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    let p = pattern.to_ascii_lowercase();
    if p == "*" {
        true
    } else if let Some(suffix) = p.strip_prefix('*') {
        host.len() > suffix.len() && host.ends_with(suffix)
    } else if let Some(prefix) = p.strip_suffix('*') {
        host.len() > prefix.len() && host.starts_with(prefix)
    } else {
        p == host
    }
}

impl RouteConfigResource {
    /// The virtual host for `host`: exact domains first, then suffix and
    /// prefix wildcards (longest first), then `*`, as Envoy and gRPC choose.
    pub fn virtual_host_for(&self, host: &str) -> Option<&VirtualHost> {
        let host_l = host.to_ascii_lowercase();
        let mut best: Option<(u8, usize, &VirtualHost)> = None;
        for vh in &self.virtual_hosts {
            for d in &vh.domains {
                if !domain_matches(d, &host_l) {
                    continue;
                }
                let rank = if d == "*" {
                    0
                } else if d.starts_with('*') {
                    2
                } else if d.ends_with('*') {
                    1
                } else {
                    3
                };
                let better = match best {
                    None => true,
                    Some((r, len, _)) => rank > r || (rank == r && d.len() > len),
                };
                if better {
                    best = Some((rank, d.len(), vh));
                }
            }
        }
        best.map(|b| b.2)
    }
}
