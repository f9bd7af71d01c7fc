//! The config selector (gRFCs A28, A31): for each call, the first route of
//! the virtual host that matches its path and metadata, and from the route
//! the cluster (a weighted random choice among weighted clusters), the
//! call's timeout, its hash, and its stateful session (A55, A60): the
//! session filter's config for the route (most specific wins: weighted
//! cluster entry, route, virtual host, listener), the session the call's
//! cookie names, and the cluster that cookie names when the route lists it;
//! and the fault injection configs (A33) in effect for the route and
//! cluster, resolved the same way.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use tonic::Status;

use super::cookie_notes::CookieNotes;
use super::retry::RetryPolicy;
use super::ClusterRef;
use crate::lb::random;
use crate::xds::resource::fault::FaultConfig;
use crate::xds::resource::listener::{
    FilterConfig, FilterOverride, HttpFilter, SessionOverride, SessionState,
};
use crate::xds::resource::route::{
    Action, ClusterSpecifier, ClusterWeight, HashPolicy, HashSource, HeaderMatch, HeaderMatcher,
    PathMatcher, RouteAction, RouteMatcher, VirtualHost,
};
use std::net::SocketAddr;
use tether_core::cookie::Format;
use tether_core::hash::policy::{HeaderLookup, Source};
use tether_core::hash::rewrite::Rewrite;
use tether_core::hash::{
    HashPolicies, HashPolicy as CoreHashPolicy, HashRequest, Peer, RequestHash,
};
use tether_core::http::set_cookie::CookieSpec;
use tether_core::session::{Lookup, Session, SessionRequest};
use tether_core::{KeyRing, SessionConfig};

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
    /// Index of the matched route in the virtual host.
    pub route: usize,
    /// The stateful session filter's work for this call, when it applies.
    pub session: Option<SessionCall>,
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

/// A call the stateful session filter applies to.
#[derive(Debug, Clone)]
pub struct SessionCall {
    /// The session configuration in effect for the call's route and cluster.
    pub session: Arc<Session>,
    /// What the call's cookie says, shared with the session's other calls.
    pub decoded: Arc<Decoded>,
}

impl SessionCall {
    /// What the call's cookie says.
    pub fn lookup(&self) -> &Lookup {
        &self.decoded.lookup
    }

    /// The call attribute for `xds_override_host`: the cookie's addresses,
    /// none (empty) without a session.
    pub fn override_addresses(&self) -> Arc<[SocketAddr]> {
        self.decoded.addresses.clone()
    }
}

/// A session cookie's lookup with the address list the override policy
/// takes, made once and shared by every call that sends the same cookie.
#[derive(Debug)]
pub struct Decoded {
    /// The session decision for the cookie.
    pub lookup: Lookup,
    /// The cookie's addresses (empty without a session).
    pub addresses: Arc<[SocketAddr]>,
}

impl Decoded {
    fn new(lookup: Lookup) -> Self {
        let addresses = lookup
            .addresses()
            .map_or_else(|| Arc::from([]), |a| Arc::from(a.as_slice()));
        Decoded { lookup, addresses }
    }
}

/// Shards of the lookup memo: calls of different sessions rarely share a lock.
const MEMO_SHARDS: usize = 16;
/// Cookies remembered per shard; a full shard starts over.
const MEMO_PER_SHARD: usize = 256;

/// The cookies this selector decoded recently, so that a session's calls
/// decode its cookie once instead of on every call (base64, the payload,
/// addresses, a MAC): keyed by the session configuration and the bytes of
/// the call's one `cookie` header. Only cookies that pin are kept, and only
/// until they expire; a cookie path, which makes the request path matter,
/// or several `cookie` headers bypass it.
#[derive(Debug, Default)]
struct LookupMemo {
    shards: [Mutex<MemoShard>; MEMO_SHARDS],
    hasher: foldhash::fast::RandomState,
}

type MemoShard = HashMap<u64, MemoEntry, foldhash::fast::RandomState>;

#[derive(Debug)]
struct MemoEntry {
    session: usize,
    cookie: Box<[u8]>,
    /// The cookie's expiry (epoch seconds): usable while now is not past it.
    until: u64,
    decoded: Arc<Decoded>,
}

impl LookupMemo {
    fn key(&self, session: usize, cookie: &[u8]) -> (u64, usize) {
        let hash = self.hasher.hash_one((session, cookie));
        (hash, (hash as usize) % MEMO_SHARDS)
    }

    /// The memo of `cookie` under `session` and its expiry, unless it
    /// expired by `now()` (read only for a cookie that expires: most never
    /// do, and the clock costs more than the rest of a hit).
    fn get(
        &self,
        session: usize,
        cookie: &[u8],
        now: impl FnOnce() -> u64,
    ) -> Option<(Arc<Decoded>, u64)> {
        let (hash, shard) = self.key(session, cookie);
        let shard = self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard
            .get(&hash)
            .filter(|e| e.session == session && *e.cookie == *cookie)
            .filter(|e| e.until == u64::MAX || now() <= e.until)
            .map(|e| (e.decoded.clone(), e.until))
    }

    fn put(&self, session: usize, cookie: &[u8], until: u64, decoded: Arc<Decoded>) {
        let (hash, shard) = self.key(session, cookie);
        let mut shard = self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if shard.len() >= MEMO_PER_SHARD {
            shard.clear();
        }
        shard.insert(
            hash,
            MemoEntry {
                session,
                cookie: cookie.into(),
                until,
                decoded,
            },
        );
    }
}

/// The last cookie this thread looked up, in front of the shared memo: a
/// session's calls on one thread (the common case) find it without
/// hashing the cookie or taking a shard's lock.
struct LastLookup {
    /// Held, so that a session at the same address is this one.
    session: Arc<Session>,
    /// Held, so that a header at the same address holds the same bytes.
    cookie: HeaderValue,
    /// As in the memo (epoch seconds).
    until: u64,
    decoded: Arc<Decoded>,
}

thread_local! {
    static LAST_LOOKUP: RefCell<Option<LastLookup>> = const { RefCell::new(None) };
}

/// The decoded `cookie` under `session` if this thread's last lookup was it.
fn last_lookup(session: &Arc<Session>, cookie: &HeaderValue) -> Option<Arc<Decoded>> {
    LAST_LOOKUP.with_borrow(|last| {
        let last = last.as_ref()?;
        let (a, b) = (last.cookie.as_bytes(), cookie.as_bytes());
        // The same buffer (a cookie jar sends one header value over and
        // over) is the same bytes without comparing them.
        let same = (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b;
        (Arc::ptr_eq(&last.session, session)
            && same
            && (last.until == u64::MAX || epoch_seconds() <= last.until))
            .then(|| last.decoded.clone())
    })
}

fn remember_lookup(
    session: &Arc<Session>,
    cookie: Option<&HeaderValue>,
    until: u64,
    decoded: &Arc<Decoded>,
) {
    if let Some(cookie) = cookie {
        LAST_LOOKUP.set(Some(LastLookup {
            session: session.clone(),
            cookie: cookie.clone(),
            until,
            decoded: decoded.clone(),
        }));
    }
}

/// The session configurations of one route, resolved once per update.
#[derive(Debug, Default)]
struct RouteSessions {
    /// The route's own (route > virtual host > listener).
    route: Option<Arc<Session>>,
    /// Per weighted-cluster entry, where the entry overrides it.
    entries: Vec<Option<Option<Arc<Session>>>>,
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
    /// Each route's stateful session configurations.
    sessions: Vec<RouteSessions>,
    /// Each route's fault injection configs.
    faults: Vec<RouteFaults>,
    /// Each route's retry policy.
    retries: Vec<Option<Arc<RetryPolicy>>>,
    /// The listener's `max_stream_duration`, for routes without their own.
    default_timeout: Option<Duration>,
    clusters: HashMap<String, Arc<ClusterRef>>,
    /// Session cookies decoded by earlier calls.
    memo: LookupMemo,
    /// The channel's target and its cookie notes.
    notes: (String, Arc<CookieNotes>),
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
        let sessions = route_sessions(&virtual_host, http_filters, options);
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
            memo: LookupMemo::default(),
            notes: Default::default(),
        })
    }

    /// The selector noting cookies in the channel `target`'s `notes`.
    pub(crate) fn with_notes(mut self, target: String, notes: Arc<CookieNotes>) -> Self {
        self.notes = (target, notes);
        self
    }

    /// What the call's cookie says under `session`, from the memo when an
    /// earlier call sent the same cookie.
    fn lookup(&self, session: &Arc<Session>, path: &str, headers: &HeaderMap) -> Arc<Decoded> {
        let mut values = headers.get_all(http::header::COOKIE).iter();
        let header = match (values.next(), values.next()) {
            (Some(v), None) if !session.reads_path() => Some(v),
            _ => None,
        };
        if let Some(decoded) = header.and_then(|v| last_lookup(session, v)) {
            self.note(&decoded);
            return decoded;
        }
        let one = header.map(HeaderValue::as_bytes);
        let id = Arc::as_ptr(session) as usize;
        if let Some((decoded, until)) = one.and_then(|c| self.memo.get(id, c, epoch_seconds)) {
            remember_lookup(session, header, until, &decoded);
            self.note(&decoded);
            return decoded;
        }
        let cookies: Vec<&str> = headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let request = SessionRequest {
            path,
            cookies: &cookies,
            header: None,
        };
        let decoded = Arc::new(Decoded::new(session.lookup(&request, epoch_seconds())));
        if let (Some(cookie), Lookup::Pinned(pin)) = (one, &decoded.lookup) {
            let until = pin.cookie.expires.unwrap_or(u64::MAX);
            self.memo.put(id, cookie, until, decoded.clone());
            remember_lookup(session, header, until, &decoded);
        }
        self.note(&decoded);
        decoded
    }

    fn note(&self, decoded: &Decoded) {
        if let Lookup::Pinned(pin) = &decoded.lookup {
            self.notes.1.pinned(&self.notes.0, pin);
        }
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
        let sessions = &self.sessions[index];
        let lookup = sessions
            .route
            .as_ref()
            .map(|s| self.lookup(s, path, headers));
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
        let session = match entry.and_then(|i| sessions.entries.get(i).cloned().flatten()) {
            Some(overridden) => overridden,
            None => sessions.route.clone(),
        };
        let session = session
            .zip(lookup)
            .filter(|(_, d)| d.lookup != Lookup::Bypass)
            .map(|(session, decoded)| SessionCall { session, decoded });
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
            route: index,
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

/// Seconds since the Unix epoch (cookie expiry), from the coarse clock:
/// cookie expiries are whole seconds, and the precise clock costs about as
/// much as the rest of a pinned call's session work.
pub(crate) fn epoch_seconds() -> u64 {
    coarsetime::Clock::now_since_epoch().as_secs()
}

/// How the channel writes session cookies (it reads every format).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionOptions {
    /// The format written: C-core's by default (byte-identical, so grpcio
    /// clients of the same control plane read it), or Envoy's (stock Envoy's
    /// stateful session filter reads it), or legacy.
    pub format: Format,
    /// Signing keys (Envoy format only): the first signs, all verify.
    pub keys: KeyRing,
    /// With keys, still honour unsigned cookies (and upgrade them).
    pub accept_unsigned: bool,
}

impl SessionOptions {
    /// Cookies written in `format`, unsigned.
    pub fn new(format: Format) -> Self {
        SessionOptions {
            format,
            ..SessionOptions::default()
        }
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            format: Format::Grpc,
            keys: KeyRing::empty(),
            accept_unsigned: false,
        }
    }
}

/// A session configuration as the channel runs it, with `options`.
fn session_for(state: &SessionState, options: &SessionOptions) -> Option<Arc<Session>> {
    let spec = state.cookie.clone()?;
    let mut config = SessionConfig::cookie(spec);
    config.format = options.format;
    config.keys = options.keys.clone();
    config.accept_unsigned = options.accept_unsigned;
    match Session::new(config) {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            log::warn!("stateful session config left out: {e}");
            None
        }
    }
}

/// Each route's session configurations: the listener's first stateful
/// session filter, overridden per virtual host, route and weighted-cluster
/// entry (most specific wins; `disabled` turns it off).
fn route_sessions(
    vh: &VirtualHost,
    filters: &[HttpFilter],
    options: &SessionOptions,
) -> Vec<RouteSessions> {
    let Some((name, base)) = filters.iter().find_map(|f| match &f.config {
        FilterConfig::StatefulSession(s) => Some((f.name.as_str(), s)),
        _ => None,
    }) else {
        return vh.routes.iter().map(|_| RouteSessions::default()).collect();
    };
    // An override of another filter's type under this name is left out:
    // the scope above stays in effect.
    let resolve = |o: &FilterOverride, above: &Option<Arc<Session>>| match o {
        FilterOverride::Disabled | FilterOverride::Session(SessionOverride::Disabled) => None,
        FilterOverride::Session(SessionOverride::Enabled(s)) => session_for(s, options),
        _ => above.clone(),
    };
    let base = session_for(base, options);
    let vh_level = match vh.filter_overrides.get(name) {
        Some(o) => resolve(o, &base),
        None => base,
    };
    vh.routes
        .iter()
        .map(|r| {
            let route = match r.filter_overrides.get(name) {
                Some(o) => resolve(o, &vh_level),
                None => vh_level.clone(),
            };
            let entries = weighted_entries(r)
                .iter()
                .map(|w| w.filter_overrides.get(name).map(|o| resolve(o, &route)))
                .collect();
            RouteSessions { route, entries }
        })
        .collect()
}

/// A route's weighted-cluster entries (none for a single cluster).
fn weighted_entries(r: &crate::xds::resource::route::Route) -> &[ClusterWeight] {
    match &r.action {
        Action::Route(RouteAction {
            clusters: ClusterSpecifier::Weighted(ws),
            ..
        }) => ws,
        _ => &[],
    }
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
            let entries = weighted_entries(r)
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
    use crate::xds::resource::route::Pattern;

    /// A C-core cookie for 127.0.0.1:443 in cluster_1: it pins.
    const PINNED: &str = "s=MTI3LjAuMC4xOjQ0MztjbHVzdGVyXzE=";

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

    fn session(path: &str) -> Arc<Session> {
        let spec = CookieSpec::new("s", path, Duration::from_secs(60), vec![]).unwrap();
        Arc::new(Session::new(SessionConfig::cookie(spec)).unwrap())
    }

    fn cookie_headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(http::header::COOKIE, v.parse().unwrap());
        }
        headers
    }

    #[test]
    fn a_sessions_calls_share_one_decoded_cookie() {
        let sel = selector_with(vec![]);
        let s = session("/");
        let pinned = cookie_headers(&["a=1; s=MTI3LjAuMC4xOjQ0MztjbHVzdGVyXzE="]);
        let first = sel.lookup(&s, "/svc/M", &pinned);
        assert!(matches!(first.lookup, Lookup::Pinned(_)), "{first:?}");
        assert_eq!(first.addresses[..], ["127.0.0.1:443".parse().unwrap()]);
        let again = sel.lookup(&s, "/svc/Other", &pinned);
        assert!(Arc::ptr_eq(&first, &again), "decoded once");
        // Another session configuration decodes for itself.
        let other = session("/");
        assert!(!Arc::ptr_eq(&first, &sel.lookup(&other, "/svc/M", &pinned)));
        // Another cookie, or the same one in two headers: decoded anew.
        let moved = cookie_headers(&["s=MTI3LjAuMC4xOjQ0NDtjbHVzdGVyXzE="]);
        let d = sel.lookup(&s, "/svc/M", &moved);
        assert_eq!(d.addresses[..], ["127.0.0.1:444".parse().unwrap()]);
        let split = cookie_headers(&["a=1", "s=MTI3LjAuMC4xOjQ0MztjbHVzdGVyXzE="]);
        let d = sel.lookup(&s, "/svc/M", &split);
        assert!(!Arc::ptr_eq(&first, &d));
        assert_eq!(d.lookup, first.lookup);
        // Misses are not kept: garbage is decoded (and refused) each time.
        let garbage = cookie_headers(&["s=!!"]);
        let d = sel.lookup(&s, "/svc/M", &garbage);
        assert!(matches!(d.lookup, Lookup::Miss(_)));
        assert!(!Arc::ptr_eq(&d, &sel.lookup(&s, "/svc/M", &garbage)));
    }

    #[test]
    fn a_cookie_path_or_an_expiry_bypasses_the_memo() {
        let sel = selector_with(vec![]);
        // With a cookie path the request path decides: never from the memo.
        let gated = session("/svc");
        let pinned = cookie_headers(&[PINNED]);
        let inside = sel.lookup(&gated, "/svc/M", &pinned);
        assert!(matches!(inside.lookup, Lookup::Pinned(_)));
        assert_eq!(
            sel.lookup(&gated, "/other/M", &pinned).lookup,
            Lookup::Bypass
        );
        // An expired cookie kept in the memo is not served from it.
        let s = session("/");
        let expired = Arc::new(Decoded::new(sel.lookup(&s, "/", &pinned).lookup.clone()));
        let id = Arc::as_ptr(&s) as usize;
        let bytes = pinned.get(http::header::COOKIE).unwrap().as_bytes();
        sel.memo
            .put(id, bytes, epoch_seconds() - 10, expired.clone());
        assert!(sel.memo.get(id, bytes, epoch_seconds).is_none());
        LAST_LOOKUP.set(None);
        assert!(!Arc::ptr_eq(&expired, &sel.lookup(&s, "/", &pinned)));
    }

    #[test]
    fn a_threads_last_lookup_serves_the_same_session_and_cookie_only() {
        let sel = selector_with(vec![]);
        let s = session("/");
        let pinned = cookie_headers(&[PINNED]);
        let first = sel.lookup(&s, "/", &pinned);
        assert!(matches!(first.lookup, Lookup::Pinned(_)));
        // The same bytes in another buffer, and the same buffer: both hit.
        let copy = cookie_headers(&[PINNED]);
        assert!(Arc::ptr_eq(&first, &sel.lookup(&s, "/", &copy)));
        assert!(Arc::ptr_eq(&first, &sel.lookup(&s, "/", &pinned)));
        // Another cookie, or the same cookie under another session: not it.
        let other = cookie_headers(&["s=MTI3LjAuMC4yOjQ0MztjbHVzdGVyXzE="]);
        let second = sel.lookup(&s, "/", &other);
        assert_ne!(second.addresses, first.addresses);
        let s2 = session("/");
        let under_s2 = sel.lookup(&s2, "/", &pinned);
        assert!(!Arc::ptr_eq(&first, &under_s2));
        // A remembered lookup past its expiry is not served.
        let value = pinned.get(http::header::COOKIE).unwrap();
        remember_lookup(&s, Some(value), epoch_seconds() - 10, &first);
        assert!(last_lookup(&s, value).is_none());
        remember_lookup(&s, Some(value), epoch_seconds() + 60, &first);
        assert!(last_lookup(&s, value).is_some());
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
