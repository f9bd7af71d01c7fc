//! The stateful session filter (gRFCs A55, A60, A61), whole: which session
//! configuration each route runs (the listener's filter, overridden per
//! virtual host, route and weighted-cluster entry), what the call's cookie
//! says (decoded once per cookie: [`super::memo`]), the pick attributes
//! that pin the call to the cookie's endpoint (`xds_override_host` reads
//! them), and on the response the `Set-Cookie` naming the endpoint that
//! answered when the cookie named another. Cookies stock Envoy would
//! misread are noted ([`super::notes`]).

use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use tether_core::cookie::sealed::NONCE_LEN;
use tether_core::cookie::Format;
use tether_core::session::{Emit, Lookup, Served, Session};
use tether_core::{KeyRing, SessionConfig};
use tonic::Status;

use super::memo::{epoch_seconds, Decoded, LookupMemo};
use super::notes::CookieNotes;
use super::SessionId;
use crate::filter::{Answered, Call, Filter};
use crate::xds::resource::listener::{
    FilterConfig, FilterOverride, HttpFilter, SessionOverride, SessionState,
};
use crate::xds::resource::route::VirtualHost;

/// How the channel writes session cookies (it reads every format).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionOptions {
    /// The format written: C-core's by default (byte-identical, so grpcio
    /// clients of the same control plane read it), or Envoy's (stock Envoy's
    /// stateful session filter reads it), or legacy.
    pub format: Format,
    /// Keys (the `envoy` format's MAC, the `sealed` format's AEAD): the
    /// first signs or seals, all verify or open. Rotated on a live channel
    /// with [`crate::Channel::set_session_keys`].
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

    /// Whether the format and keys go together (a `sealed` format needs
    /// keys of at least 32 bytes; only formats with a MAC take keys).
    pub(crate) fn check(&self) -> Result<(), tether_core::ConfigError> {
        let mut config = SessionConfig::header("x")?;
        config.format = self.format;
        config.keys = self.keys.clone();
        config.validate()
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

/// A call the stateful session filter applies to: its config for the call.
#[derive(Debug, Clone)]
pub(crate) struct SessionCall {
    /// The session configuration in effect for the call's route and cluster.
    pub(crate) session: Arc<Session>,
    /// What the call's cookie says, shared with the session's other calls.
    pub(crate) decoded: Arc<Decoded>,
}

impl SessionCall {
    /// What the call's cookie says.
    pub(crate) fn lookup(&self) -> &Lookup {
        &self.decoded.lookup
    }

    /// What became of the session once `answered` served the call (for
    /// the session metrics): the same decision as the `Set-Cookie`'s.
    pub(crate) fn outcome(&self, answered: &Answered<'_>) -> SessionOutcome {
        let served = served(answered);
        let call = match self.lookup() {
            Lookup::Pinned(pin) if pin.cookie.addresses.primary() == answered.address => {
                SessionCallKind::Pinned
            }
            Lookup::Pinned(_) => SessionCallKind::Moved,
            Lookup::Miss(tether_core::session::Miss::Absent) | Lookup::Bypass => {
                SessionCallKind::New
            }
            Lookup::Miss(_) => SessionCallKind::Refused,
        };
        let cookie = self
            .session
            .wants_cookie(self.lookup(), &served)
            .then_some(match call {
                SessionCallKind::Pinned => CookieWritten::Reissued,
                SessionCallKind::Moved => CookieWritten::Moved,
                SessionCallKind::New | SessionCallKind::Refused => CookieWritten::New,
            });
        let envoy_misreads = matches!(self.lookup(), Lookup::Pinned(pin) if pin.envoy_misreads);
        SessionOutcome {
            call,
            cookie,
            envoy_misreads,
        }
    }
}

/// A session call as the session metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionCallKind {
    /// Its cookie pinned it and the pinned endpoint answered.
    Pinned,
    /// Its cookie pinned it and another endpoint answered (the session
    /// moved).
    Moved,
    /// It had no cookie: a new session.
    New,
    /// Its cookie was refused (invalid, expired, not verified): load
    /// balanced as a new session.
    Refused,
}

impl SessionCallKind {
    /// The `tether.session.call` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            SessionCallKind::Pinned => "pinned",
            SessionCallKind::Moved => "moved",
            SessionCallKind::New => "new",
            SessionCallKind::Refused => "refused",
        }
    }
}

/// Why a call's response set a session cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CookieWritten {
    /// For a new session (or one whose cookie was refused).
    New,
    /// The session moved to the endpoint that answered.
    Moved,
    /// The session stayed and its cookie was re-issued (the cluster added,
    /// a format or key upgrade, a value stock Envoy misreads respelled).
    Reissued,
}

impl CookieWritten {
    /// The `tether.session.cookie` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            CookieWritten::New => "new",
            CookieWritten::Moved => "moved",
            CookieWritten::Reissued => "reissued",
        }
    }
}

/// What the session metrics count of one session call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionOutcome {
    pub(crate) call: SessionCallKind,
    pub(crate) cookie: Option<CookieWritten>,
    /// Its cookie is in a form stock Envoy's cookie session state misreads.
    pub(crate) envoy_misreads: bool,
}

/// The session configurations of one route, resolved once per update.
#[derive(Debug, Default)]
struct RouteSessions {
    /// The route's own (route > virtual host > listener).
    route: Option<Arc<Session>>,
    /// Per weighted-cluster entry, where the entry overrides it.
    entries: Vec<Option<Option<Arc<Session>>>>,
}

/// The filter's state for one route table: each route's sessions, the
/// cookies its calls decoded, and where misread cookies are noted.
#[derive(Debug)]
pub(crate) struct Sessions {
    routes: Vec<RouteSessions>,
    memo: LookupMemo,
    /// The channel's target and its cookie notes.
    notes: (String, Arc<CookieNotes>),
}

impl Sessions {
    /// The sessions of `vh`'s routes under the listener's `filters`,
    /// writing cookies as `options` says.
    pub(crate) fn new(vh: &VirtualHost, filters: &[HttpFilter], options: &SessionOptions) -> Self {
        Sessions {
            routes: route_sessions(vh, filters, options),
            memo: LookupMemo::default(),
            notes: Default::default(),
        }
    }

    /// The sessions noting cookies in the channel `target`'s `notes`.
    pub(crate) fn with_notes(mut self, target: String, notes: Arc<CookieNotes>) -> Self {
        self.notes = (target, notes);
        self
    }

    /// What the cookie of a call to route `index` says under the route's
    /// session, if the route has one: read before the cluster is chosen,
    /// since the cookie may name it (A60).
    pub(crate) fn lookup(
        &self,
        index: usize,
        path: &str,
        headers: &HeaderMap,
    ) -> Option<Arc<Decoded>> {
        let session = self.routes[index].route.as_ref()?;
        let decoded = self.memo.lookup(session, path, headers);
        if let Lookup::Pinned(pin) = &decoded.lookup {
            self.notes.1.pinned(&self.notes.0, pin);
        }
        Some(decoded)
    }

    /// The filter's config for a call to route `index` and its weighted
    /// entry `entry` (the entry's session overrides the route's), or
    /// `None` when the filter does not apply (no session, or the cookie
    /// path leaves the call out).
    pub(crate) fn call(
        &self,
        index: usize,
        entry: Option<usize>,
        decoded: Option<Arc<Decoded>>,
    ) -> Option<SessionCall> {
        let sessions = &self.routes[index];
        let session = match entry.and_then(|i| sessions.entries.get(i).cloned().flatten()) {
            Some(overridden) => overridden,
            None => sessions.route.clone(),
        };
        session
            .zip(decoded)
            .filter(|(_, d)| d.lookup != Lookup::Bypass)
            .map(|(session, decoded)| SessionCall { session, decoded })
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
            let entries = r
                .weighted_clusters()
                .iter()
                .map(|w| w.filter_overrides.get(name).map(|o| resolve(o, &route)))
                .collect();
            RouteSessions { route, entries }
        })
        .collect()
}

/// The stateful session filter on the call path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatefulSession;

impl Filter for StatefulSession {
    type Config = SessionCall;

    /// Pins the call: the cookie's addresses for `xds_override_host` (none
    /// when the call has no session yet) and the session it belongs to.
    async fn on_request(
        &self,
        config: &SessionCall,
        call: &mut Call,
        request: &http::request::Parts,
    ) -> Result<(), Status> {
        call.attributes.override_addresses = Some(config.decoded.addresses.clone());
        call.attributes.session_id = session_id(call.jar_session, &request.extensions, config);
        Ok(())
    }

    /// A `Set-Cookie` in the initial metadata when the endpoint that
    /// answered, its address list or the cluster differs from what the
    /// cookie named (A55/A61).
    fn on_response(
        &self,
        config: &SessionCall,
        _call: &Call,
        answered: &Answered<'_>,
        response: &mut http::response::Parts,
    ) {
        set_cookie(config, &mut response.headers, answered);
    }
}

/// The call's session for drain readiness: the channel handle's jar's
/// (`jar`), else the caller's [`SessionId`] (a jar layer's), else the
/// addresses its cookie names (cookies naming the same addresses count as
/// one session); none for a call with neither.
fn session_id(jar: Option<u64>, extensions: &http::Extensions, call: &SessionCall) -> Option<u64> {
    if let Some(id) = jar.or_else(|| extensions.get::<SessionId>().map(|id| id.0)) {
        return Some(id);
    }
    let addresses = call.lookup().addresses()?;
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(addresses.as_slice(), &mut h);
    // The top bit keeps digests apart from jar ids (small counters).
    Some(std::hash::Hasher::finish(&h) | 1 << 63)
}

/// The exchange as the session's decisions read it.
fn served<'a>(answered: &Answered<'a>) -> Served<'a> {
    Served {
        address: Some(answered.address),
        other_addresses: answered
            .endpoint
            .map_or(&[][..], |e| e.get(1..).unwrap_or(&[])),
        cluster: Some(answered.cluster),
        connect_failed: false,
    }
}

fn set_cookie(s: &SessionCall, headers: &mut HeaderMap, answered: &Answered<'_>) {
    let served = served(answered);
    // Most answers keep the session where it is: decide before reading
    // the clock, which only a new cookie needs.
    if !s.session.wants_cookie(s.lookup(), &served) {
        return;
    }
    // A sealed value's nonce is random; other formats ignore it.
    let mut nonce = [0; NONCE_LEN];
    if s.session.config().format.is_sealed() {
        fill_random(&mut nonce);
    }
    let emit = s
        .session
        .respond_with(s.lookup(), &served, epoch_seconds(), &nonce);
    if let Some(Emit::SetCookie(value)) = emit {
        match HeaderValue::from_str(&value) {
            Ok(v) => {
                headers.append(http::header::SET_COOKIE, v);
            }
            Err(e) => log::warn!("session cookie {value:?} is not a header value: {e}"),
        }
    }
}

/// Random bytes from the TLS provider's source (ring's, the system's
/// CSPRNG). Should it fail, the nonce stays all-zero: AES-GCM-SIV then
/// only shows that two values sealed the same session.
fn fill_random(bytes: &mut [u8]) {
    static SOURCE: std::sync::OnceLock<&'static dyn rustls::crypto::SecureRandom> =
        std::sync::OnceLock::new();
    let source = SOURCE.get_or_init(|| rustls::crypto::ring::default_provider().secure_random);
    if source.fill(bytes).is_err() {
        log::warn!("no random bytes for a sealed cookie's nonce: the all-zero nonce is used");
    }
}
