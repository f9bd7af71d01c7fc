//! A client cookie jar, and the tower layer that runs every call of a
//! channel through it: the cookies a server sets come back on later calls,
//! as a browser does for one site.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tether::session::{CookieJar, CookieJarLayer, Layer};
//!
//! let channel = tether::Channel::from_target("xds:///shop.example").await?;
//! let jar = CookieJar::new();
//! let channel = CookieJarLayer::new(jar.clone()).layer(channel);
//! // EchoClient::new(channel) ... any tonic client takes it unchanged; with
//! // tower: ServiceBuilder::new().layer(CookieJarLayer::new(jar)).service(ch).
//! # let _ = channel;
//! # Ok(()) }
//! ```
//!
//! What the jar does, following RFC 6265 §5.3 and §5.4 for a single origin
//! (the channel's one target):
//! - each `Set-Cookie` is parsed by the `cookie` crate; one that does not
//!   parse is logged at debug level and ignored;
//! - a cookie replaces the stored one with the same name and `Path` (keeping
//!   its creation time, which orders cookies of equal path length);
//! - `Max-Age` wins over `Expires`; `Max-Age` of zero or less, or an
//!   `Expires` in the past, deletes the cookie; an expiry in the future
//!   stops it being sent from then on (expired cookies are dropped when the
//!   jar is read); without either it lives as long as the jar;
//! - without a `Path` (or with one not starting with `/`) the path is the
//!   request path's directory (§5.1.4: `/pkg.Svc/Method` gives `/pkg.Svc`);
//! - a request carries the cookies whose path path-matches its path, longer
//!   paths first, in one `cookie` header `a=1; b=2`; values go back exactly
//!   as they were set (Envoy's quoted values keep their quotes);
//! - `Domain`, `Secure`, `HttpOnly`, `SameSite` and `Partitioned` are kept
//!   but restrict nothing: every call of a channel goes to the same origin,
//!   and there are no scripts or other sites to keep cookies from.
//!
//! The jar never interprets a value: what a session cookie means is decided
//! by `tether-core` ([`tether_core::session`]).

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use arc_swap::cache::Cache;
use arc_swap::ArcSwapOption;
use cookie::time::OffsetDateTime;
use cookie::{Cookie, ParseError};
use http::header::{Entry, HeaderMap, HeaderValue, COOKIE, SET_COOKIE};
use tether_core::http::cookie_header;
use tether_core::http::path::path_matches;

/// Why a `Set-Cookie` value was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JarError {
    /// The value is not a cookie: no `name=value` pair, or an empty name.
    Parse {
        /// The `Set-Cookie` value as received.
        value: String,
        /// What the `cookie` crate found wrong.
        reason: ParseError,
    },
    /// The header value is not UTF-8.
    NotUtf8 {
        /// The `Set-Cookie` value, invalid bytes replaced by U+FFFD.
        value: String,
    },
}

impl fmt::Display for JarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JarError::Parse { value, reason } => write!(f, "set-cookie {value:?}: {reason}"),
            JarError::NotUtf8 { value } => write!(f, "set-cookie {value:?}: not UTF-8"),
        }
    }
}

impl std::error::Error for JarError {}

/// One cookie in the jar.
struct Stored {
    cookie: Cookie<'static>,
    /// The effective path: the `Path` attribute or the default path.
    path: String,
    /// `None`: a session cookie, kept as long as the jar.
    expires: Option<OffsetDateTime>,
    /// Creation order, the tie-break between equal path lengths (§5.4).
    created: u64,
}

#[derive(Default)]
struct Store {
    cookies: Vec<Stored>,
    next_created: u64,
    /// The `cookie` header of a request without cookies of its own, kept
    /// while no cookie changes when every cookie's path is `/` (so every
    /// request path gets the same one): a session's calls then send it
    /// without rebuilding it. Written under the store's lock, read without
    /// it (a session's concurrent calls would otherwise queue on the lock).
    header: Arc<HeaderCache>,
}

/// The kept `cookie` header, read without a lock by every call of a
/// session (through a [`HeaderReader`]) and replaced when cookies change.
type HeaderCache = ArcSwapOption<CachedHeader>;

/// One service's view of a jar's kept header: `arc_swap`'s cache, which
/// costs a pointer comparison while the header stays the same (a plain
/// load costs more than the rest of the kept path).
#[derive(Clone)]
struct HeaderReader(Cache<Arc<HeaderCache>, Option<Arc<CachedHeader>>>);

impl HeaderReader {
    fn new(cache: Arc<HeaderCache>) -> Self {
        HeaderReader(Cache::new(cache))
    }

    /// The kept header, unless a cookie in it has expired by `now()`.
    fn get(&mut self, now: impl FnOnce() -> coarsetime::Instant) -> Option<HeaderValue> {
        self.0
            .load()
            .as_ref()
            .filter(|c| c.until.is_none_or(|until| until > now()))
            .map(|c| c.value.clone())
    }
}

struct CachedHeader {
    value: HeaderValue,
    /// The first expiry among the cookies, on the coarse monotonic clock:
    /// the header is stale from then.
    until: Option<coarsetime::Instant>,
}

/// Now on the coarse monotonic clock (a few milliseconds of resolution),
/// for the cached header: cookies expire in whole seconds of `Max-Age`,
/// and the wall clock costs more than the rest of the cached path.
fn coarse_now() -> coarsetime::Instant {
    coarsetime::Instant::now_without_cache_update()
}

impl Store {
    /// The unexpired cookies that `keep` accepts, in sending order; drops
    /// the expired ones on the way.
    fn ordered(&mut self, now: OffsetDateTime, keep: impl Fn(&Stored) -> bool) -> Vec<&Stored> {
        let before = self.cookies.len();
        self.cookies
            .retain(|c| c.expires.is_none_or(|expires| expires > now));
        if self.cookies.len() != before {
            self.header.store(None);
        }
        let mut out: Vec<&Stored> = self.cookies.iter().filter(|c| keep(c)).collect();
        out.sort_by(|a, b| {
            b.path
                .len()
                .cmp(&a.path.len())
                .then(a.created.cmp(&b.created))
        });
        out
    }

    /// The `name=value` pairs for `request_path`, except those named in `skip`.
    fn pairs_for(
        &mut self,
        request_path: &str,
        now: OffsetDateTime,
        skip: &HashSet<&str>,
    ) -> Vec<String> {
        self.ordered(now, |c| {
            path_matches(&c.path, request_path) && !skip.contains(c.cookie.name())
        })
        .into_iter()
        .map(|c| format!("{}={}", c.cookie.name(), c.cookie.value()))
        .collect()
    }

    /// Keeps `value`, the header of a request without cookies of its own,
    /// when no cookie's path can make another request path's differ.
    fn cache_header(&mut self, value: &HeaderValue) {
        if self.cookies.iter().all(|c| c.path == "/") {
            let (wall, mono) = (OffsetDateTime::now_utc(), coarse_now());
            self.header.store(Some(Arc::new(CachedHeader {
                value: value.clone(),
                until: self
                    .cookies
                    .iter()
                    .filter_map(|c| c.expires)
                    .min()
                    .map(|expires| {
                        // Past expiries (a jar given earlier times) are
                        // stale at once; a far one is looked at again
                        // after a year (the coarse clock's range is less
                        // than the cookies').
                        let left = std::time::Duration::try_from(expires - wall)
                            .unwrap_or(std::time::Duration::ZERO)
                            .min(std::time::Duration::from_secs(365 * 24 * 3600));
                        mono + coarsetime::Duration::from(left)
                    }),
            })));
        }
    }
}

/// What a `Set-Cookie` says about the cookie's life.
enum Expiry {
    /// Delete it (and any stored cookie it replaces) now.
    Delete,
    /// Send it until then.
    At(OffsetDateTime),
    /// No expiry (or one past the last representable date).
    Never,
}

/// RFC 6265 §5.3 step 3: `Max-Age` first, then `Expires`.
fn expiry(cookie: &Cookie<'_>, now: OffsetDateTime) -> Expiry {
    if let Some(max_age) = cookie.max_age() {
        // The cookie crate turns a negative Max-Age into zero.
        if !max_age.is_positive() {
            return Expiry::Delete;
        }
        return now.checked_add(max_age).map_or(Expiry::Never, Expiry::At);
    }
    match cookie.expires_datetime() {
        Some(at) if at <= now => Expiry::Delete,
        Some(at) => Expiry::At(at),
        None => Expiry::Never,
    }
}

/// RFC 6265 §5.1.4's default-path of a request path (query and fragment,
/// if any, are not part of it).
fn default_path(request_path: &str) -> &str {
    let path = request_path.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return "/";
    }
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(last) => &path[..last],
    }
}

/// A thread-safe client cookie jar for one origin. Clones share the same
/// cookies, so a caller can keep one to look at what its calls stored.
///
/// Paths are matched with `tether-core`'s [`path_matches`]: on a request
/// path without query or fragment (the layer passes the URI's path) it is
/// exactly RFC 6265 §5.1.4 path-match, and stored paths are never empty.
#[derive(Clone)]
pub struct CookieJar {
    store: Arc<Mutex<Store>>,
    /// The store's cached `cookie` header, read without the lock.
    header: Arc<HeaderCache>,
    id: SessionId,
}

/// Identifies one session (one [`CookieJar`] and its clones) to the
/// channel, which counts the sessions on each endpoint for drain
/// readiness. [`CookieJarService`](super::CookieJarService) puts it in every request's extensions;
/// a caller with its own jar can do the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId(pub u64);

impl SessionId {
    /// A new identity, distinct from every other made in this process.
    pub fn unique() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        SessionId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Default for CookieJar {
    fn default() -> Self {
        let store = Store::default();
        let header = store.header.clone();
        CookieJar {
            store: Arc::new(Mutex::new(store)),
            header,
            id: SessionId::unique(),
        }
    }
}

impl fmt::Debug for CookieJar {
    // Names only: values are often credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let store = self.lock();
        f.debug_struct("CookieJar")
            .field(
                "cookies",
                &store
                    .cookies
                    .iter()
                    .map(|c| (c.cookie.name(), c.path.as_str()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl CookieJar {
    /// An empty jar.
    pub fn new() -> Self {
        Self::default()
    }

    /// The session this jar is.
    pub fn session_id(&self) -> SessionId {
        self.id
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        // Nothing panics while the lock is held, so a poisoned store is
        // still consistent.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores one `Set-Cookie` header value received in answer to a request
    /// for `request_path` (which gives the cookie its default path).
    pub fn insert_raw(&self, set_cookie: &str, request_path: &str) -> Result<(), JarError> {
        self.insert_raw_at(set_cookie, request_path, OffsetDateTime::now_utc())
    }

    /// [`CookieJar::insert_raw`] with the time of reception given, so that
    /// `Max-Age` counts from `now`.
    pub fn insert_raw_at(
        &self,
        set_cookie: &str,
        request_path: &str,
        now: OffsetDateTime,
    ) -> Result<(), JarError> {
        let cookie = Cookie::parse(set_cookie.to_owned()).map_err(|reason| JarError::Parse {
            value: set_cookie.to_owned(),
            reason,
        })?;
        let path = match cookie.path() {
            Some(path) if path.starts_with('/') => path.to_owned(),
            // RFC 6265 §5.2.4: an empty or relative Path is ignored.
            _ => default_path(request_path).to_owned(),
        };
        let expiry = expiry(&cookie, now);
        let mut store = self.lock();
        store.header.store(None);
        let old = store
            .cookies
            .iter()
            .position(|c| c.cookie.name() == cookie.name() && c.path == path);
        let created = match old {
            Some(at) => store.cookies.remove(at).created,
            None => {
                store.next_created += 1;
                store.next_created
            }
        };
        let expires = match expiry {
            Expiry::Delete => {
                log::trace!("cookie jar: deleted {:?} (path {path})", cookie.name());
                return Ok(());
            }
            Expiry::At(at) => Some(at),
            Expiry::Never => None,
        };
        log::trace!("cookie jar: stored {:?} (path {path})", cookie.name());
        store.cookies.push(Stored {
            cookie,
            path,
            expires,
            created,
        });
        Ok(())
    }

    /// The `cookie` header value a request for `request_path` carries now:
    /// `None` when no cookie applies.
    pub fn cookie_header(&self, request_path: &str) -> Option<String> {
        self.cookie_header_at(request_path, OffsetDateTime::now_utc())
    }

    /// [`CookieJar::cookie_header`] at time `now`.
    pub fn cookie_header_at(&self, request_path: &str, now: OffsetDateTime) -> Option<String> {
        let pairs = self.pairs_for(request_path, now, &HashSet::new());
        (!pairs.is_empty()).then(|| pairs.join("; "))
    }

    /// The `name=value` pairs for `request_path`, except those named in `skip`.
    fn pairs_for(
        &self,
        request_path: &str,
        now: OffsetDateTime,
        skip: &HashSet<&str>,
    ) -> Vec<String> {
        self.lock().pairs_for(request_path, now, skip)
    }

    /// Every unexpired cookie as `(name, value)`, in sending order (longer
    /// paths first); values as they were set.
    pub fn cookies(&self) -> Vec<(String, String)> {
        let mut store = self.lock();
        store
            .ordered(OffsetDateTime::now_utc(), |_| true)
            .into_iter()
            .map(|c| (c.cookie.name().to_owned(), c.cookie.value().to_owned()))
            .collect()
    }

    /// The value of the unexpired cookie called `name` (the one with the
    /// longest path when several paths have one), as it was set.
    pub fn get(&self, name: &str) -> Option<String> {
        let mut store = self.lock();
        store
            .ordered(OffsetDateTime::now_utc(), |c| c.cookie.name() == name)
            .first()
            .map(|c| c.cookie.value().to_owned())
    }

    /// Forgets every cookie.
    pub fn clear(&self) {
        let mut store = self.lock();
        store.cookies.clear();
        store.header.store(None);
    }

    /// Adds the jar's cookies for `path` to a request's `cookie` header:
    /// cookies the request already carries stay first and win over the
    /// jar's of the same name. `reader` reads the kept header.
    fn apply_to_request(&self, headers: &mut HeaderMap, path: &str, reader: &mut HeaderReader) {
        if let Entry::Vacant(slot) = headers.entry(COOKIE) {
            // The common case: the jar's cookies alone, often the header
            // the previous call sent.
            if let Some(value) = reader.get(coarse_now) {
                slot.insert(value);
                return;
            }
            let mut store = self.lock();
            let pairs = store.pairs_for(path, OffsetDateTime::now_utc(), &HashSet::new());
            if pairs.is_empty() {
                return;
            }
            match HeaderValue::from_str(&pairs.join("; ")) {
                Ok(value) => {
                    store.cache_header(&value);
                    slot.insert(value);
                }
                Err(e) => log::debug!("cookie jar: cookie header for {path}: {e}"),
            }
            return;
        }
        let existing: Vec<HeaderValue> = headers.get_all(COOKIE).iter().cloned().collect();
        let texts: Vec<String> = existing
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        let present: HashSet<&str> = texts
            .iter()
            .flat_map(|t| cookie_header::pairs(t).map(|(name, _)| name))
            .collect();
        let pairs = self.pairs_for(path, OffsetDateTime::now_utc(), &present);
        if pairs.is_empty() {
            return;
        }
        // One header (RFC 6265 §5.4): the request's own cookies, then the jar's.
        let mut value: Vec<u8> = Vec::new();
        for part in existing
            .iter()
            .map(HeaderValue::as_bytes)
            .chain(pairs.iter().map(String::as_bytes))
        {
            if !value.is_empty() {
                value.extend_from_slice(b"; ");
            }
            value.extend_from_slice(part);
        }
        match HeaderValue::from_bytes(&value) {
            Ok(value) => {
                headers.insert(COOKIE, value);
            }
            // Stored values come from header values, so this cannot happen;
            // the call still goes out, without the jar's cookies.
            Err(e) => log::debug!("cookie jar: cookie header for {path}: {e}"),
        }
    }

    /// Stores every `set-cookie` of a response to a request for `path`
    /// (gRPC initial metadata, or a trailers-only response's trailers).
    pub(crate) fn store_response(&self, headers: &HeaderMap, path: &str) {
        for value in headers.get_all(SET_COOKIE) {
            let stored = match std::str::from_utf8(value.as_bytes()) {
                Ok(text) => self.insert_raw(text, path),
                Err(_) => Err(JarError::NotUtf8 {
                    value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
                }),
            };
            if let Err(e) = stored {
                log::debug!("cookie jar: ignored {e}");
            }
        }
    }
}

/// A [`CookieJar`] with its reader of the kept header: what applies the
/// jar to a call, in a [`CookieJarService`](super::CookieJarService) or inside a channel handle
/// ([`crate::Channel::with_cookie_jar`]).
#[derive(Clone)]
pub(crate) struct JarHandle {
    jar: CookieJar,
    header: HeaderReader,
}

impl JarHandle {
    pub(crate) fn new(jar: CookieJar) -> Self {
        let header = HeaderReader::new(jar.header.clone());
        JarHandle { jar, header }
    }

    /// The jar.
    pub(crate) fn jar(&self) -> &CookieJar {
        &self.jar
    }

    /// Adds the jar's cookies to `request`; the call, whose answer goes to
    /// [`JarCall::store`].
    pub(crate) fn apply<B>(&mut self, request: &mut http::Request<B>) -> JarCall {
        // A shared buffer: the clone copies no path.
        let path = request.uri().path_and_query().cloned();
        let path_str = path.as_ref().map_or("/", |p| p.path());
        self.jar
            .apply_to_request(request.headers_mut(), path_str, &mut self.header);
        JarCall {
            jar: self.jar.clone(),
            path,
        }
    }
}

/// One call of a [`JarHandle`]: its jar and the request's path (the default
/// path of cookies set without one).
pub(crate) struct JarCall {
    jar: CookieJar,
    path: Option<http::uri::PathAndQuery>,
}

impl JarCall {
    /// The call's session.
    pub(crate) fn session_id(&self) -> SessionId {
        self.jar.id
    }

    /// The request's path.
    pub(crate) fn path(&self) -> &str {
        self.path.as_ref().map_or("/", |p| p.path())
    }

    /// Stores the cookies of the call's answer (its initial metadata, or a
    /// trailers-only answer's trailers).
    pub(crate) fn store(&self, headers: &HeaderMap) {
        self.jar.store_response(headers, self.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{CookieJarLayer, CookieJarService, Layer};
    use cookie::time::Duration;
    use std::convert::Infallible;
    use std::future::{ready, Ready};
    use std::task::{Context, Poll};
    use tower_service::Service;

    fn t0() -> OffsetDateTime {
        // A fixed instant: 2023-11-14T22:13:20Z.
        OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap()
    }

    fn jar_with(set_cookies: &[&str], request_path: &str) -> CookieJar {
        let jar = CookieJar::new();
        for s in set_cookies {
            jar.insert_raw_at(s, request_path, t0()).unwrap();
        }
        jar
    }

    fn header(jar: &CookieJar, path: &str) -> Option<String> {
        jar.cookie_header_at(path, t0())
    }

    #[test]
    fn parses_replaces_and_deletes() {
        let jar = jar_with(&["s=1; Path=/", "t=x; Path=/"], "/svc/M");
        assert_eq!(header(&jar, "/svc/M").as_deref(), Some("s=1; t=x"));
        // Same name and path: replaced, keeping its place (creation time).
        jar.insert_raw_at("s=2; Path=/; HttpOnly", "/svc/M", t0())
            .unwrap();
        assert_eq!(header(&jar, "/svc/M").as_deref(), Some("s=2; t=x"));
        jar.insert_raw_at("s=; Max-Age=0; Path=/", "/svc/M", t0())
            .unwrap();
        assert_eq!(header(&jar, "/svc/M").as_deref(), Some("t=x"));
        jar.insert_raw_at("t=gone; Max-Age=-5; Path=/", "/svc/M", t0())
            .unwrap();
        assert_eq!(header(&jar, "/svc/M"), None);
    }

    /// What the layer puts in a request for `path` that has no cookie.
    fn applied(jar: &CookieJar, path: &str) -> Option<String> {
        let mut headers = HeaderMap::new();
        jar.apply_to_request(
            &mut headers,
            path,
            &mut HeaderReader::new(jar.header.clone()),
        );
        headers.get(COOKIE).map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn the_header_kept_between_calls_follows_every_change() {
        let jar = CookieJar::new();
        jar.insert_raw("s=1; Path=/", "/svc/M").unwrap();
        assert_eq!(applied(&jar, "/svc/M").as_deref(), Some("s=1"));
        assert!(jar.header.load().is_some(), "kept for the next call");
        assert_eq!(applied(&jar, "/other/N").as_deref(), Some("s=1"));
        // A replaced value, a new cookie, a deletion: each is sent at once.
        jar.insert_raw("s=2; Path=/", "/svc/M").unwrap();
        assert_eq!(applied(&jar, "/svc/M").as_deref(), Some("s=2"));
        jar.insert_raw("t=x; Path=/", "/svc/M").unwrap();
        assert_eq!(applied(&jar, "/svc/M").as_deref(), Some("s=2; t=x"));
        jar.insert_raw("t=; Max-Age=0; Path=/", "/svc/M").unwrap();
        assert_eq!(applied(&jar, "/svc/M").as_deref(), Some("s=2"));
        // A cookie of one path only: nothing is kept, each path gets its own.
        jar.insert_raw("p=1; Path=/svc", "/svc/M").unwrap();
        assert_eq!(applied(&jar, "/svc/M").as_deref(), Some("p=1; s=2"));
        assert!(jar.header.load().is_none());
        assert_eq!(applied(&jar, "/other/N").as_deref(), Some("s=2"));
        jar.clear();
        assert_eq!(applied(&jar, "/svc/M"), None);
    }

    #[test]
    fn the_header_kept_between_calls_expires_with_its_first_cookie() {
        let jar = CookieJar::new();
        jar.insert_raw("s=1; Path=/; Max-Age=1", "/").unwrap();
        jar.insert_raw("t=2; Path=/", "/").unwrap();
        assert_eq!(applied(&jar, "/svc/M").as_deref(), Some("s=1; t=2"));
        let kept = jar.header.load().as_ref().and_then(|c| c.until);
        assert!(kept.is_some(), "the header is stale when s expires");
        // Just before the expiry the cached header is used, past it not.
        let soon = coarse_now() + coarsetime::Duration::from_millis(900);
        let mut reader = HeaderReader::new(jar.header.clone());
        assert!(reader.get(|| soon).is_some());
        let after = coarse_now() + coarsetime::Duration::from_millis(1100);
        assert_eq!(reader.get(|| after), None);
        let later = OffsetDateTime::now_utc() + Duration::seconds(2);
        assert_eq!(header_at(&jar, "/svc/M", later).as_deref(), Some("t=2"));
    }

    fn header_at(jar: &CookieJar, path: &str, now: OffsetDateTime) -> Option<String> {
        jar.cookie_header_at(path, now)
    }

    #[test]
    fn same_name_other_path_is_another_cookie() {
        let jar = jar_with(&["s=root; Path=/", "s=svc; Path=/svc"], "/");
        assert_eq!(header(&jar, "/svc/M").as_deref(), Some("s=svc; s=root"));
        assert_eq!(header(&jar, "/other/M").as_deref(), Some("s=root"));
        jar.insert_raw_at("s=; Max-Age=0; Path=/svc", "/", t0())
            .unwrap();
        assert_eq!(header(&jar, "/svc/M").as_deref(), Some("s=root"));
    }

    #[test]
    fn expires_in_the_past_deletes() {
        let jar = jar_with(&["s=1; Path=/"], "/");
        jar.insert_raw_at(
            "s=1; Path=/; Expires=Thu, 01 Jan 1970 00:00:00 GMT",
            "/",
            t0(),
        )
        .unwrap();
        assert_eq!(header(&jar, "/a"), None);
    }

    #[test]
    fn max_age_and_expires_expire_with_the_clock() {
        let jar = jar_with(
            &[
                "m=1; Path=/; Max-Age=60",
                // 2023-11-14T22:15:00Z is t0 + 100 s.
                "e=1; Path=/; Expires=Tue, 14 Nov 2023 22:15:00 GMT",
                "s=1; Path=/",
            ],
            "/",
        );
        let at = |secs| jar.cookie_header_at("/x", t0() + Duration::seconds(secs));
        assert_eq!(at(59).as_deref(), Some("m=1; e=1; s=1"));
        assert_eq!(at(60).as_deref(), Some("e=1; s=1"));
        assert_eq!(at(99).as_deref(), Some("e=1; s=1"));
        assert_eq!(at(100).as_deref(), Some("s=1"));
        // Expired cookies were dropped, not just hidden.
        assert_eq!(jar.lock().cookies.len(), 1);
    }

    #[test]
    fn max_age_wins_over_expires() {
        let jar = jar_with(
            &["m=1; Path=/; Expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=10"],
            "/",
        );
        assert_eq!(header(&jar, "/").as_deref(), Some("m=1"));
        let jar = jar_with(&["m=1; Path=/; Max-Age=99999999999999999999"], "/");
        assert_eq!(header(&jar, "/").as_deref(), Some("m=1"));
    }

    #[test]
    fn default_path_is_the_request_directory() {
        for (request, want) in [
            ("/a.B/C", "/a.B"),
            ("/a/b/", "/a/b"),
            ("/a/b/c?q=/x", "/a/b"),
            ("/x", "/"),
            ("/", "/"),
            ("", "/"),
            ("rel/x", "/"),
        ] {
            assert_eq!(default_path(request), want, "{request:?}");
        }
        let jar = jar_with(&["d=1", "r=1; Path=rel", "e=1; Path="], "/pkg.Svc/Method");
        assert_eq!(
            header(&jar, "/pkg.Svc/Other").as_deref(),
            Some("d=1; r=1; e=1")
        );
        assert_eq!(header(&jar, "/pkg.Other/Method"), None);
    }

    #[test]
    fn path_match_follows_rfc_6265() {
        for (cookie_path, request, matches) in [
            ("/a.B", "/a.B/C", true),
            ("/a.B/", "/a.B/C", true),
            ("/a.B", "/a.B", true),
            ("/a.Bx", "/a.B/C", false),
            ("/a.B/C/", "/a.B/C", false),
            ("/a.B", "/a.BC", false),
            ("/", "/anything", true),
        ] {
            let jar = jar_with(&[&format!("c=1; Path={cookie_path}")], "/");
            assert_eq!(
                header(&jar, request).is_some(),
                matches,
                "{cookie_path} on {request}"
            );
        }
    }

    #[test]
    fn longer_paths_first_then_creation_order() {
        let jar = jar_with(
            &[
                "root=1; Path=/",
                "a=1; Path=/a",
                "deep=1; Path=/a/b",
                "b=1; Path=/b",
                "also=1; Path=/a",
            ],
            "/",
        );
        assert_eq!(
            header(&jar, "/a/b/c").as_deref(),
            Some("deep=1; a=1; also=1; root=1")
        );
    }

    #[test]
    fn values_go_back_as_set() {
        let envoy = "GCLB=\"MTI3LjAuMC4xOjgwODA=\"; Max-Age=3600; Path=/; HttpOnly";
        let jar = CookieJar::new();
        for s in [envoy, "g=Y2x1c3Rlcg==; HttpOnly; Path=/"] {
            jar.insert_raw(s, "/").unwrap();
        }
        assert_eq!(
            jar.cookie_header("/x").as_deref(),
            Some("GCLB=\"MTI3LjAuMC4xOjgwODA=\"; g=Y2x1c3Rlcg==")
        );
        assert_eq!(jar.get("GCLB").as_deref(), Some("\"MTI3LjAuMC4xOjgwODA=\""));
    }

    #[test]
    fn attributes_do_not_restrict() {
        let jar = jar_with(
            &["s=1; Domain=elsewhere.example; Secure; HttpOnly; SameSite=Strict; Path=/"],
            "/",
        );
        assert_eq!(header(&jar, "/x").as_deref(), Some("s=1"));
    }

    #[test]
    fn unparsable_set_cookie_is_an_error_naming_it() {
        let jar = CookieJar::new();
        for bad in ["no-pair", "=v; Path=/", ""] {
            let err = jar.insert_raw_at(bad, "/", t0()).unwrap_err();
            assert!(matches!(&err, JarError::Parse { value, .. } if value == bad));
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert!(jar.cookies().is_empty());
    }

    #[test]
    fn accessors_and_clear() {
        let jar = CookieJar::new();
        let shared = jar.clone();
        jar.insert_raw("a=1; Path=/", "/").unwrap();
        jar.insert_raw("b=2; Path=/x", "/").unwrap();
        assert_eq!(
            shared.cookies(),
            [("b".into(), "2".into()), ("a".into(), "1".into())]
        );
        assert_eq!(shared.get("a").as_deref(), Some("1"));
        assert_eq!(shared.get("z"), None);
        assert_eq!(jar.cookie_header("/").as_deref(), Some("a=1"));
        assert!(format!("{jar:?}").contains("\"b\""));
        shared.clear();
        assert!(jar.cookies().is_empty());
    }

    /// A service that records the request's `cookie` header and answers
    /// with the given `set-cookie` headers.
    #[derive(Clone)]
    struct Recorder {
        seen: Arc<Mutex<Vec<Option<String>>>>,
        set: Vec<HeaderValue>,
    }

    impl Service<http::Request<()>> for Recorder {
        type Response = http::Response<()>;
        type Error = Infallible;
        type Future = Ready<Result<http::Response<()>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<()>) -> Self::Future {
            let cookies: Vec<_> = request.headers().get_all(COOKIE).iter().collect();
            assert!(cookies.len() <= 1, "one cookie header: {cookies:?}");
            let seen = cookies.first().map(|v| v.to_str().unwrap().to_owned());
            self.seen.lock().unwrap().push(seen);
            let mut response = http::Response::new(());
            for v in &self.set {
                response.headers_mut().append(SET_COOKIE, v.clone());
            }
            ready(Ok(response))
        }
    }

    fn request(path: &str, cookies: &[&str]) -> http::Request<()> {
        let mut builder = http::Request::builder().uri(path);
        for c in cookies {
            builder = builder.header(COOKIE, *c);
        }
        builder.body(()).unwrap()
    }

    #[tokio::test]
    async fn layer_merges_and_stores() {
        let jar = CookieJar::new();
        jar.insert_raw("s=jar; Path=/", "/").unwrap();
        jar.insert_raw("t=jar; Path=/", "/").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            seen: seen.clone(),
            set: vec![
                HeaderValue::from_static("n=1"),
                HeaderValue::from_static("junk"),
                HeaderValue::from_bytes(b"u=\xff").unwrap(),
            ],
        };
        let mut service = CookieJarLayer::new(jar.clone()).layer(recorder);
        // The request's own cookies stay and win over the jar's.
        let response = service
            .call(request("/pkg.Svc/M", &["s=mine", "x=1,y=2"]))
            .await
            .unwrap();
        assert!(response.headers().contains_key(SET_COOKIE));
        // Stored with the default path of the request; the bad ones ignored.
        assert_eq!(jar.get("n").as_deref(), Some("1"));
        assert_eq!(jar.get("u"), None);
        service.call(request("/pkg.Svc/M", &[])).await.unwrap();
        service.call(request("/other/M", &[])).await.unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [
                Some("s=mine; x=1,y=2; t=jar".to_owned()),
                Some("n=1; s=jar; t=jar".to_owned()),
                Some("s=jar; t=jar".to_owned()),
            ]
        );
        assert_eq!(service.jar().get("n").as_deref(), Some("1"));
    }

    #[tokio::test]
    async fn layer_leaves_requests_alone_without_cookies() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            seen: seen.clone(),
            set: Vec::new(),
        };
        let mut service = CookieJarService::new(recorder, CookieJar::new());
        service.call(request("/a/b", &[])).await.unwrap();
        service.call(request("/a/b", &["k=v"])).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [None, Some("k=v".to_owned())]);
        assert_eq!(service.get_ref().set.len(), 0);
        let _ = service.into_inner();
    }
}
