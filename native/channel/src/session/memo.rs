//! Session cookies decoded once: a session's calls send the same cookie
//! over and over, and decoding it (base64, the payload, addresses, a MAC)
//! on every call would cost more than the rest of the session filter. A
//! thread's last lookup sits in front of a sharded memo of recent ones.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use http::{HeaderMap, HeaderValue};
use tether_core::session::{Lookup, Session, SessionRequest};

/// Seconds since the Unix epoch (cookie expiry), from the coarse clock:
/// cookie expiries are whole seconds, and the precise clock costs about as
/// much as the rest of a pinned call's session work.
pub(crate) fn epoch_seconds() -> u64 {
    coarsetime::Clock::now_since_epoch().as_secs()
}

/// A session cookie's lookup with the address list the override policy
/// takes, made once and shared by every call that sends the same cookie.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The session decision for the cookie.
    pub(crate) lookup: Lookup,
    /// The cookie's addresses (empty without a session).
    pub(crate) addresses: Arc<[SocketAddr]>,
}

impl Decoded {
    fn new(lookup: Lookup) -> Self {
        let addresses = lookup
            .addresses()
            .map_or_else(|| Arc::from([]), |a| Arc::from(a.as_slice()));
        Decoded { lookup, addresses }
    }
}

/// Shards of the memo: calls of different sessions rarely share a lock.
const MEMO_SHARDS: usize = 16;
/// Cookies remembered per shard; a full shard starts over.
const MEMO_PER_SHARD: usize = 256;

/// The cookies one route table's calls decoded recently, keyed by the
/// session configuration and the bytes of the call's one `cookie` header.
/// Only cookies that pin are kept, and only until they expire; a cookie
/// path, which makes the request path matter, or several `cookie` headers
/// bypass it.
#[derive(Debug, Default)]
pub(crate) struct LookupMemo {
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
    /// What the call's cookie says under `session`, from this thread's last
    /// lookup or the memo when an earlier call sent the same cookie.
    pub(crate) fn lookup(
        &self,
        session: &Arc<Session>,
        path: &str,
        headers: &HeaderMap,
    ) -> Arc<Decoded> {
        let mut values = headers.get_all(http::header::COOKIE).iter();
        let header = match (values.next(), values.next()) {
            (Some(v), None) if !session.reads_path() => Some(v),
            _ => None,
        };
        if let Some(decoded) = header.and_then(|v| last_lookup(session, v)) {
            return decoded;
        }
        let one = header.map(HeaderValue::as_bytes);
        let id = Arc::as_ptr(session) as usize;
        if let Some((decoded, until)) = one.and_then(|c| self.get(id, c, epoch_seconds)) {
            remember_lookup(session, header, until, &decoded);
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
            self.put(id, cookie, until, decoded.clone());
            remember_lookup(session, header, until, &decoded);
        }
        decoded
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tether_core::http::set_cookie::CookieSpec;
    use tether_core::SessionConfig;

    /// A C-core cookie for 127.0.0.1:443 in cluster_1: it pins.
    const PINNED: &str = "s=MTI3LjAuMC4xOjQ0MztjbHVzdGVyXzE=";

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
        let memo = LookupMemo::default();
        let s = session("/");
        let pinned = cookie_headers(&["a=1; s=MTI3LjAuMC4xOjQ0MztjbHVzdGVyXzE="]);
        let first = memo.lookup(&s, "/svc/M", &pinned);
        assert!(matches!(first.lookup, Lookup::Pinned(_)), "{first:?}");
        assert_eq!(first.addresses[..], ["127.0.0.1:443".parse().unwrap()]);
        let again = memo.lookup(&s, "/svc/Other", &pinned);
        assert!(Arc::ptr_eq(&first, &again), "decoded once");
        // Another session configuration decodes for itself.
        let other = session("/");
        assert!(!Arc::ptr_eq(
            &first,
            &memo.lookup(&other, "/svc/M", &pinned)
        ));
        // Another cookie, or the same one in two headers: decoded anew.
        let moved = cookie_headers(&["s=MTI3LjAuMC4xOjQ0NDtjbHVzdGVyXzE="]);
        let d = memo.lookup(&s, "/svc/M", &moved);
        assert_eq!(d.addresses[..], ["127.0.0.1:444".parse().unwrap()]);
        let split = cookie_headers(&["a=1", "s=MTI3LjAuMC4xOjQ0MztjbHVzdGVyXzE="]);
        let d = memo.lookup(&s, "/svc/M", &split);
        assert!(!Arc::ptr_eq(&first, &d));
        assert_eq!(d.lookup, first.lookup);
        // Misses are not kept: garbage is decoded (and refused) each time.
        let garbage = cookie_headers(&["s=!!"]);
        let d = memo.lookup(&s, "/svc/M", &garbage);
        assert!(matches!(d.lookup, Lookup::Miss(_)));
        assert!(!Arc::ptr_eq(&d, &memo.lookup(&s, "/svc/M", &garbage)));
    }

    #[test]
    fn a_cookie_path_or_an_expiry_bypasses_the_memo() {
        let memo = LookupMemo::default();
        // With a cookie path the request path decides: never from the memo.
        let gated = session("/svc");
        let pinned = cookie_headers(&[PINNED]);
        let inside = memo.lookup(&gated, "/svc/M", &pinned);
        assert!(matches!(inside.lookup, Lookup::Pinned(_)));
        assert_eq!(
            memo.lookup(&gated, "/other/M", &pinned).lookup,
            Lookup::Bypass
        );
        // An expired cookie kept in the memo is not served from it.
        let s = session("/");
        let expired = Arc::new(Decoded::new(memo.lookup(&s, "/", &pinned).lookup.clone()));
        let id = Arc::as_ptr(&s) as usize;
        let bytes = pinned.get(http::header::COOKIE).unwrap().as_bytes();
        memo.put(id, bytes, epoch_seconds() - 10, expired.clone());
        assert!(memo.get(id, bytes, epoch_seconds).is_none());
        LAST_LOOKUP.set(None);
        assert!(!Arc::ptr_eq(&expired, &memo.lookup(&s, "/", &pinned)));
    }

    #[test]
    fn a_threads_last_lookup_serves_the_same_session_and_cookie_only() {
        let memo = LookupMemo::default();
        let s = session("/");
        let pinned = cookie_headers(&[PINNED]);
        let first = memo.lookup(&s, "/", &pinned);
        assert!(matches!(first.lookup, Lookup::Pinned(_)));
        // The same bytes in another buffer, and the same buffer: both hit.
        let copy = cookie_headers(&[PINNED]);
        assert!(Arc::ptr_eq(&first, &memo.lookup(&s, "/", &copy)));
        assert!(Arc::ptr_eq(&first, &memo.lookup(&s, "/", &pinned)));
        // Another cookie, or the same cookie under another session: not it.
        let other = cookie_headers(&["s=MTI3LjAuMC4yOjQ0MztjbHVzdGVyXzE="]);
        let second = memo.lookup(&s, "/", &other);
        assert_ne!(second.addresses, first.addresses);
        let s2 = session("/");
        let under_s2 = memo.lookup(&s2, "/", &pinned);
        assert!(!Arc::ptr_eq(&first, &under_s2));
        // A remembered lookup past its expiry is not served.
        let value = pinned.get(http::header::COOKIE).unwrap();
        remember_lookup(&s, Some(value), epoch_seconds() - 10, &first);
        assert!(last_lookup(&s, value).is_none());
        remember_lookup(&s, Some(value), epoch_seconds() + 60, &first);
        assert!(last_lookup(&s, value).is_some());
    }
}
