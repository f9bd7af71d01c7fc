//! What the plugin does with one request, written against a small [`Host`]
//! trait so that it runs (and is tested) the same with Envoy and without it.
//!
//! Host calls cost throughput (each crosses the wasm boundary), so the hot
//! path makes as few as it can:
//!
//! | step | host calls |
//! |---|---|
//! | request, pinned by the first header read | 1 (the session's `Cookie` or session header) + 1 (set the override header, which also replaces one a client sent) |
//! | request without that header | 1 (it is absent) + 1 (is the override header there?) + 1 if a client sent one (remove it) |
//! | any other request | the above, then 1 (all request headers: other `Cookie` headers, `:path` for a cookie path) + 1 if pinned + 1 to remove a client's override header |
//! | response, pinned and served by its host | 1: `upstream.address` in wiring (a); in wiring (b) the native filter's echo header (absent) |
//! | response that sets a cookie | + `xds.cluster_name` (formats that carry it) + `response.code_details` + the header (+ removing the echo in wiring (b)) |
//!
//! The clock is not read per request: the root context refreshes it once a
//! second (cookie expiries are whole seconds).

use alloc::collections::BTreeSet;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::net::SocketAddr;
use core::str;
use tether_core::cookie::sealed::NONCE_LEN;
use tether_core::cookie::{self, SessionCookie};
use tether_core::session::{Emit, Lookup, Miss, Pin, Served, SessionRequest};
use tether_core::{AddressList, Format};

use crate::config::{OverrideEncoding, PluginConfig};
use crate::memo::Memo;
pub use crate::metrics::Counter;

/// Envoy's response code details when the response came from the upstream
/// (any other value is a local reply: no host answered).
pub const VIA_UPSTREAM: &str = "via_upstream";

/// Details Envoy records for the 503 the plugin sends in strict mode.
pub const STRICT_DETAILS: &str = "tether_session_host_unavailable";

/// The property naming the upstream host that answered (`ip:port`).
pub const UPSTREAM_ADDRESS: &str = "upstream\0address";
/// The property naming the cluster that routed the request.
pub const CLUSTER_NAME: &str = "xds\0cluster_name";
/// The property telling whether the response came from the upstream.
pub const CODE_DETAILS: &str = "response\0code_details";

/// Log levels, as proxy-wasm numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Per-request detail.
    Debug = 1,
    /// Lifecycle events.
    Info = 2,
    /// Something the operator should know and may act on.
    Warn = 3,
    /// Something the operator should fix.
    Error = 4,
}

/// What the plugin needs from the proxy. Implementations never panic: a
/// failed host call reads as "absent" and a failed write is dropped.
pub trait Host {
    /// Every request header, serialized as proxy-wasm returns them.
    fn request_headers(&mut self) -> Option<HeaderMap>;
    /// The first value of a request header (what Envoy returns for one name).
    fn request_header(&mut self, name: &str) -> Option<Vec<u8>>;
    /// Sets (replaces) a request header.
    fn set_request_header(&mut self, name: &str, value: &str);
    /// Removes every value of a request header.
    fn remove_request_header(&mut self, name: &str);
    /// A stream property, as bytes. `path` is in proxy-wasm's form, the
    /// segments joined by NUL (see [`UPSTREAM_ADDRESS`]).
    fn property(&mut self, path: &str) -> Option<Vec<u8>>;
    /// Appends a response header.
    fn add_response_header(&mut self, name: &str, value: &str);
    /// Sets (replaces) a response header.
    fn set_response_header(&mut self, name: &str, value: &str);
    /// Removes every value of a response header.
    fn remove_response_header(&mut self, name: &str);
    /// The first value of a response header.
    fn response_header(&mut self, name: &str) -> Option<Vec<u8>>;
    /// Replaces the response with a local one.
    fn local_reply(&mut self, status: u32, details: &str, body: &str);
    /// Writes a log line.
    fn log(&mut self, level: Level, message: &str);
    /// Adds one to a counter in Envoy's stats (see [`crate::metrics`]: on
    /// the request path this is VM memory, handed to Envoy by the timer).
    fn count(&mut self, counter: Counter);
    /// Fills `out` with random bytes from the host (WASI `random_get`);
    /// false when the host has none.
    fn random(&mut self, out: &mut [u8]) -> bool;
}

/// A header map in proxy-wasm's serialization: a little-endian `u32` count,
/// then a `(name length, value length)` pair of `u32` per entry, then each
/// name and value followed by a NUL byte.
#[derive(Debug, Clone, Default)]
pub struct HeaderMap(pub Vec<u8>);

impl HeaderMap {
    /// Serializes `pairs` (for tests and hosts that build maps).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> HeaderMap {
        let pairs: Vec<_> = pairs.into_iter().collect();
        let mut out = Vec::new();
        out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
        for (n, v) in &pairs {
            out.extend_from_slice(&(n.len() as u32).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        }
        for (n, v) in &pairs {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
            out.extend_from_slice(v);
            out.push(0);
        }
        HeaderMap(out)
    }

    /// The entries in order, as byte slices. A truncated or inconsistent map
    /// ends the iteration early instead of failing.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let bytes = self.0.as_slice();
        let count = read_u32(bytes, 0).unwrap_or(0);
        let mut data = (count as usize)
            .checked_mul(8)
            .and_then(|n| n.checked_add(4));
        (0..count as usize).map_while(move |i| {
            let at = data?;
            let sizes = 4usize.checked_add(i.checked_mul(8)?)?;
            let name_len = read_u32(bytes, sizes)? as usize;
            let value_len = read_u32(bytes, sizes.checked_add(4)?)? as usize;
            let name_end = at.checked_add(name_len)?;
            let value_at = name_end.checked_add(1)?;
            let value_end = value_at.checked_add(value_len)?;
            let name = bytes.get(at..name_end)?;
            let value = bytes.get(value_at..value_end)?;
            data = value_end.checked_add(1);
            Some((name, value))
        })
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// What the request side leaves for the response side.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// Shared with the memo when the value was remembered.
    lookup: Rc<Lookup>,
    now: u64,
    /// The host named in the session header set for Envoy's header-mode
    /// filter (wiring (b)), which echoes the served host only when it differs.
    asked: Option<SocketAddr>,
    /// The override header's value set in wiring (a) (the session's
    /// addresses as text, primary first), for telling without a parse
    /// that the primary answered.
    sent: Option<Rc<str>>,
}

impl Exchange {
    /// The request-side decision.
    pub fn lookup(&self) -> &Lookup {
        &self.lookup
    }
}

/// The plugin for one configuration.
#[derive(Debug, Clone)]
pub struct Plugin {
    config: PluginConfig,
    debug: bool,
    /// Addresses already logged for a cookie stock Envoy misreads.
    misread: RefCell<BTreeSet<SocketAddr>>,
    /// Sealed values minted without the host's randomness (see
    /// [`Plugin::nonce`]).
    unrandom: Cell<u64>,
    /// Session header values read recently and what they pinned.
    memo: Memo,
    /// The lookups of requests without a session and without a clock,
    /// shared rather than allocated per request.
    absent: Rc<Lookup>,
    bypass: Rc<Lookup>,
}

impl Plugin {
    /// A plugin with `config`; `debug` turns on per-request log lines.
    pub fn new(config: PluginConfig, debug: bool) -> Self {
        Plugin {
            config,
            debug,
            misread: RefCell::new(BTreeSet::new()),
            unrandom: Cell::new(0),
            memo: Memo::default(),
            absent: Rc::new(Lookup::Miss(Miss::Absent)),
            bypass: Rc::new(Lookup::Bypass),
        }
    }

    /// The nonce of a sealed value: random bytes from the host. Should the
    /// host have none, a count of such values and the clock stand in (said
    /// once): AES-GCM-SIV stays sound with any nonce, a repeated one only
    /// shows that two values seal the same session.
    fn nonce(&self, host: &mut impl Host, now: u64) -> [u8; NONCE_LEN] {
        let mut nonce = [0; NONCE_LEN];
        if host.random(&mut nonce) {
            return nonce;
        }
        let count = self.unrandom.get();
        self.unrandom.set(count.wrapping_add(1));
        if count == 0 {
            host.log(
                Level::Warn,
                "tether: the host's random_get failed; sealed cookies take counted nonces \
                 (their sessions stay secret, equal sessions may show as equal)",
            );
        }
        nonce[..8].copy_from_slice(&count.to_le_bytes());
        nonce[8..].copy_from_slice(&(now as u32).to_le_bytes());
        nonce
    }

    /// Counts a pinned request, and one whose cookie stock Envoy would not
    /// read, which it says once per address.
    fn note(&self, host: &mut impl Host, pin: &Pin) {
        host.count(Counter::Pinned);
        if !pin.envoy_misreads || self.config.session.cookie_name().is_none() {
            return;
        }
        host.count(Counter::EnvoyMisreads);
        let address = pin.cookie.addresses.primary();
        if self.misread.borrow_mut().insert(address) {
            host.log(
                Level::Warn,
                &alloc::format!(
                    "tether: a session cookie names {address} in a form stock Envoy's cookie \
                     session state does not read ({}); its response re-issues it in one that Envoy, \
                     gRPC C-core and tether read",
                    if pin.format == Format::Legacy {
                        "plain legacy text that Envoy parses as a protobuf without an address"
                    } else {
                        "base64 without padding"
                    }
                ),
            );
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PluginConfig {
        &self.config
    }

    /// Request headers: strip a client's override header, decide, and tell
    /// Envoy where a pinned request goes. `now` is the clock in epoch seconds
    /// (`None` when it could not be read: the request is then left alone,
    /// because neither expiry nor a new cookie can be judged without it).
    pub fn on_request(&self, host: &mut impl Host, now: Option<u64>) -> Exchange {
        match self.on_request_quick(host, now) {
            Some(exchange) => exchange,
            None => self.on_request_full(host, now),
        }
    }

    /// The common cases with one header read instead of the whole map: the
    /// session's header pins the request (the override header is then set,
    /// replacing any value a client sent), or the request has no such header
    /// at all. Everything else (a cookie path to check, a session cookie in
    /// a later `Cookie` header, a miss to log, no clock) returns `None` for
    /// the full read.
    fn on_request_quick(&self, host: &mut impl Host, now: Option<u64>) -> Option<Exchange> {
        let cfg = &self.config;
        let session = &cfg.session;
        let now = now?;
        if session.reads_path() {
            return None;
        }
        let cookie_mode = session.cookie_name().is_some();
        let name = if cookie_mode {
            "cookie"
        } else {
            session.header_name()?
        };
        let Some(bytes) = host.request_header(name) else {
            // No session at all: only a client's override header must go.
            if host.request_header(&cfg.override_header).is_some() {
                host.remove_request_header(&cfg.override_header);
            }
            return Some(Exchange {
                lookup: self.absent.clone(),
                now,
                asked: None,
                sent: None,
            });
        };
        // The same value as a recent request, not expired since: pinned as
        // it was, without decoding it again.
        let remembered = self.memo.get(&bytes).filter(
            |(lookup, _)| matches!(&**lookup, Lookup::Pinned(pin) if !pin.cookie.is_expired(now)),
        );
        let (lookup, value) = match remembered {
            Some(hit) => hit,
            None => {
                let text = str::from_utf8(&bytes).ok()?;
                let cookies = [text];
                let req = SessionRequest {
                    path: "",
                    cookies: if cookie_mode { &cookies[..] } else { &[] },
                    header: if cookie_mode { None } else { Some(text) },
                };
                let lookup = session.lookup(&req, now);
                let Lookup::Pinned(pin) = &lookup else {
                    return None;
                };
                let value: Rc<str> = override_value(&pin.cookie.addresses, cfg.encoding)?.into();
                let lookup = Rc::new(lookup);
                self.memo.put(&bytes, lookup.clone(), value.clone());
                (lookup, value)
            }
        };
        let Lookup::Pinned(pin) = &*lookup else {
            return None;
        };
        self.note(host, pin);
        host.set_request_header(&cfg.override_header, &value);
        let (asked, sent) = match cfg.encoding {
            OverrideEncoding::SessionHeader => (Some(pin.cookie.addresses.primary()), None),
            OverrideEncoding::List => (None, Some(value)),
        };
        Some(Exchange {
            lookup,
            now,
            asked,
            sent,
        })
    }

    /// The request read whole: every `Cookie` header, `:path`, the session
    /// header and a client's override header, from one map. Out of line:
    /// inlined into the request callback, it made every request dearer in
    /// the in-process interpreter, the quick ones too (370 units of
    /// `plugin_cost.rs`'s fuel each; V8 in Envoy shows no difference).
    #[inline(never)]
    fn on_request_full(&self, host: &mut impl Host, now: Option<u64>) -> Exchange {
        let cfg = &self.config;
        let session = &cfg.session;
        let headers = host.request_headers().unwrap_or_default();
        let session_header = session.header_name().map(str::as_bytes);
        let mut path = "";
        // Requests rarely carry more than a few `Cookie` headers: no
        // allocation for those.
        let mut few = [""; 4];
        let mut found = 0;
        let mut more: Vec<&str> = Vec::new();
        let mut header = None;
        let mut client_override = false;
        for (name, value) in headers.iter() {
            if name == b":path" {
                path = str::from_utf8(value).unwrap_or("");
            } else if name == b"cookie" {
                // A value that is not UTF-8 holds no RFC 6265 cookie we could read.
                let Ok(v) = str::from_utf8(value) else {
                    continue;
                };
                if let Some(slot) = few.get_mut(found) {
                    *slot = v;
                    found += 1;
                } else {
                    if more.is_empty() {
                        more.extend_from_slice(&few);
                    }
                    more.push(v);
                }
            } else if name == cfg.override_header.as_bytes() {
                client_override = true;
            } else if Some(name) == session_header && header.is_none() {
                header = str::from_utf8(value).ok();
            }
        }
        // A client must never choose its backend: drop what it sent before
        // anything else reads it.
        if client_override {
            host.remove_request_header(&cfg.override_header);
        }
        let Some(now) = now else {
            return Exchange {
                lookup: self.bypass.clone(),
                now: 0,
                asked: None,
                sent: None,
            };
        };
        let req = SessionRequest {
            path,
            cookies: if more.is_empty() {
                &few[..found]
            } else {
                &more
            },
            header,
        };
        let lookup = session.lookup(&req, now);
        let mut asked = None;
        match &lookup {
            Lookup::Pinned(pin) => {
                self.note(host, pin);
                if let Some(value) = override_value(&pin.cookie.addresses, cfg.encoding) {
                    host.set_request_header(&cfg.override_header, &value);
                    if cfg.encoding == OverrideEncoding::SessionHeader {
                        asked = Some(pin.cookie.addresses.primary());
                    }
                }
            }
            Lookup::Miss(miss) => {
                if let Some(counter) = refused(miss) {
                    host.count(counter);
                }
                if self.debug && *miss != Miss::Absent {
                    host.log(
                        Level::Debug,
                        &alloc::format!("tether: session ignored, load balancing: {miss:?}"),
                    );
                }
            }
            Lookup::Bypass => host.count(Counter::PathGateBypassed),
        }
        Exchange {
            lookup: Rc::new(lookup),
            now,
            asked,
            sent: None,
        }
    }

    /// Response headers: set a cookie (or the session header) when the host
    /// that answered is not the session's, never for a host that did not
    /// answer, and enforce `strict`. Returns true when the response was
    /// replaced by a local reply (the caller stops the original one).
    pub fn on_response(&self, host: &mut impl Host, exchange: Option<&Exchange>) -> bool {
        let cfg = &self.config;
        let session = &cfg.session;
        // Wiring (b): Envoy's header-mode filter echoes the served host in the
        // override header, but only when it is not the host it was asked for.
        // No echo therefore tells, for one header read, that the asked host
        // answered. An echo (or a header a backend sent) is never shown to the
        // client, and the served host is then read from Envoy itself.
        let mut served_asked = None;
        if cfg.encoding == OverrideEncoding::SessionHeader {
            match exchange.and_then(|ex| ex.asked) {
                Some(asked)
                    if host
                        .response_header(&cfg.override_header)
                        .is_none_or(|v| v.is_empty()) =>
                {
                    served_asked = Some(asked);
                }
                _ => host.remove_response_header(&cfg.override_header),
            }
        }
        let Some(ex) = exchange else { return false };
        if matches!(*ex.lookup, Lookup::Bypass) {
            return false;
        }
        let Some(address) = served_asked.or_else(|| {
            let bytes = host.property(UPSTREAM_ADDRESS)?;
            // The session's primary answered (the common case): known
            // without parsing, as Envoy spells it as the override value does.
            let primary = ex.sent.as_deref().map(|v| v.split(',').next().unwrap_or(v));
            match (primary, ex.lookup.addresses()) {
                (Some(text), Some(pinned)) if text.as_bytes() == bytes.as_slice() => {
                    Some(pinned.primary())
                }
                _ => parse_address(&bytes),
            }
        }) else {
            // Never routed (e.g. no healthy host): nothing to pin to.
            return false;
        };
        let mut served = Served {
            address: Some(address),
            ..Served::default()
        };
        // Each step below only decides; the value is written once, at the end.
        let mut wants = session.wants_cookie(&ex.lookup, &served);

        // The cluster is read only where it can change the answer: for the
        // cookie about to be minted, or to add it once to a session cookie
        // that lacks it (gRFC A60). A cookie naming another cluster but the
        // host that answered is left as it is: telling would cost a property
        // read on every pinned response.
        let wants_cluster = session.config().format.carries_cluster()
            && (wants || (ex.lookup.addresses().is_some() && ex.lookup.cluster().is_none()));
        let cluster = if wants_cluster {
            host.property(CLUSTER_NAME)
        } else {
            None
        };
        if wants_cluster {
            served.cluster = cluster.as_deref().and_then(|b| str::from_utf8(b).ok());
            wants = session.wants_cookie(&ex.lookup, &served);
        }

        // Whether a host really answered is asked only before acting on it.
        if wants || session.strict_refuses(&ex.lookup, &served) {
            let details = host.property(CODE_DETAILS);
            served.connect_failed = details.as_deref() != Some(VIA_UPSTREAM.as_bytes());
            if session.strict_refuses(&ex.lookup, &served) {
                host.local_reply(503, STRICT_DETAILS, "no healthy upstream");
                return true;
            }
        }
        if wants {
            self.write(host, ex, &served);
        }
        false
    }

    /// Writes the cookie (or the session header) due after `served`
    /// answered, and counts why. Out of line: a pinned response served by
    /// its host (the common case) does not pay for its larger frame in the
    /// in-process interpreter (about 800 units of `plugin_cost.rs`'s fuel
    /// per response; V8 in Envoy shows no difference).
    #[inline(never)]
    fn write(&self, host: &mut impl Host, ex: &Exchange, served: &Served<'_>) {
        let session = &self.config.session;
        // Randomness is drawn only for a sealed value about to be written.
        let nonce = if session.config().format.is_sealed() {
            self.nonce(host, ex.now)
        } else {
            [0; NONCE_LEN]
        };
        match session.respond_with(&ex.lookup, served, ex.now, &nonce) {
            Some(Emit::SetCookie(value)) => host.add_response_header("set-cookie", &value),
            Some(Emit::Header { name, value }) => host.set_response_header(&name, &value),
            None => return,
        }
        host.count(written(&ex.lookup, served));
    }
}

/// The counter of a request whose session was refused (none for a request
/// without one).
pub fn refused(miss: &Miss) -> Option<Counter> {
    match miss {
        Miss::Absent => None,
        Miss::Invalid(cookie::DecodeError::Sealed)
        | Miss::BadMac
        | Miss::Unsigned
        | Miss::Unsealed => Some(Counter::RefusedUnverified),
        Miss::Invalid(_) => Some(Counter::RefusedInvalid),
        Miss::Expired(_) => Some(Counter::RefusedExpired),
    }
}

/// The counter of a cookie written for `lookup` after the host of `served`
/// answered, following the core's reasons to write one: no usable session
/// (new), another host than the session's primary (moved), or the session's
/// host with the value to re-issue (cluster, signature, seal, spelling).
pub fn written(lookup: &Lookup, served: &Served<'_>) -> Counter {
    match lookup.addresses() {
        None => Counter::WrittenNew,
        Some(pinned) if Some(pinned.primary()) != served.address => Counter::WrittenMoved,
        Some(_) => Counter::WrittenReissued,
    }
}

/// The override header's value for the pinned `addresses`.
pub fn override_value(addresses: &AddressList, encoding: OverrideEncoding) -> Option<String> {
    match encoding {
        OverrideEncoding::List => Some(addresses.to_text()),
        // Envoy's header-mode session state: base64 of one `ip:port`, which is
        // exactly tether's legacy cookie value.
        OverrideEncoding::SessionHeader => {
            let one = SessionCookie::new(AddressList::one(addresses.primary()));
            cookie::encode_header(&one, Format::Legacy, None).ok()
        }
    }
}

/// Parses Envoy's `upstream.address` property (`ip:port`).
pub fn parse_address(bytes: &[u8]) -> Option<SocketAddr> {
    tether_core::address::parse(str::from_utf8(bytes).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::borrow::ToOwned;
    use alloc::string::ToString;
    use alloc::vec;
    use std::collections::HashMap;
    use tether_core::cookie::KeyRing;
    use tether_core::http::set_cookie;

    const NOW: u64 = 1_800_000_000;

    /// A scripted proxy: request headers and properties in, every call out.
    #[derive(Default)]
    struct FakeHost {
        request: Vec<(String, Vec<u8>)>,
        properties: HashMap<String, Vec<u8>>,
        calls: Vec<String>,
        set_request: Vec<(String, String)>,
        response: Vec<(String, String)>,
        reply: Option<u32>,
        random_byte: u8,
        random_works: bool,
        counts: Vec<Counter>,
    }

    impl FakeHost {
        fn new(request: &[(&str, &str)]) -> Self {
            FakeHost {
                request: request
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                    .collect(),
                ..FakeHost::default()
            }
        }

        fn served_by(mut self, address: &str) -> Self {
            self.random_works = true;
            self.properties
                .insert("upstream.address".into(), address.as_bytes().to_vec());
            self.properties
                .insert("response.code_details".into(), b"via_upstream".to_vec());
            self.properties
                .insert("xds.cluster_name".into(), b"backends".to_vec());
            self
        }

        fn set_cookies(&self) -> Vec<&str> {
            self.response
                .iter()
                .filter(|(n, _)| n == "set-cookie")
                .map(|(_, v)| v.as_str())
                .collect()
        }
    }

    impl Host for FakeHost {
        fn request_header(&mut self, name: &str) -> Option<Vec<u8>> {
            self.calls.push(alloc::format!("request_header {name}"));
            self.request
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        }
        fn request_headers(&mut self) -> Option<HeaderMap> {
            self.calls.push("request_headers".into());
            Some(HeaderMap::from_pairs(
                self.request.iter().map(|(n, v)| (n.as_str(), v.as_slice())),
            ))
        }
        fn set_request_header(&mut self, name: &str, value: &str) {
            self.calls.push(alloc::format!("set_request_header {name}"));
            self.set_request.push((name.into(), value.into()));
        }
        fn remove_request_header(&mut self, name: &str) {
            self.calls
                .push(alloc::format!("remove_request_header {name}"));
            self.request.retain(|(n, _)| n != name);
        }
        fn property(&mut self, path: &str) -> Option<Vec<u8>> {
            let key = path.replace('\0', ".");
            self.calls.push(alloc::format!("property {key}"));
            self.properties.get(&key).cloned()
        }
        fn response_header(&mut self, name: &str) -> Option<Vec<u8>> {
            self.calls.push(alloc::format!("response_header {name}"));
            self.response
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_bytes().to_vec())
        }
        fn add_response_header(&mut self, name: &str, value: &str) {
            self.calls
                .push(alloc::format!("add_response_header {name}"));
            self.response.push((name.into(), value.into()));
        }
        fn set_response_header(&mut self, name: &str, value: &str) {
            self.calls
                .push(alloc::format!("set_response_header {name}"));
            self.response.retain(|(n, _)| n != name);
            self.response.push((name.into(), value.into()));
        }
        fn remove_response_header(&mut self, name: &str) {
            self.calls
                .push(alloc::format!("remove_response_header {name}"));
            self.response.retain(|(n, _)| n != name);
        }
        fn local_reply(&mut self, status: u32, _details: &str, _body: &str) {
            self.calls.push(alloc::format!("local_reply {status}"));
            self.reply = Some(status);
        }
        fn log(&mut self, _level: Level, _message: &str) {}
        fn count(&mut self, counter: Counter) {
            self.counts.push(counter);
        }
        fn random(&mut self, out: &mut [u8]) -> bool {
            self.calls.push("random".into());
            for (i, b) in out.iter_mut().enumerate() {
                *b = self.random_byte.wrapping_add(i as u8);
            }
            self.random_byte = self.random_byte.wrapping_add(1);
            self.random_works
        }
    }

    fn plugin(json: &str) -> Plugin {
        Plugin::new(PluginConfig::from_json(json).unwrap(), false)
    }

    const COOKIE: &str = r#"{"cookie":{"name":"s","path":"/","ttl":"120s"}}"#;

    /// One request through the plugin: the request host, then the response host.
    fn exchange(p: &Plugin, request: &[(&str, &str)], served: &str) -> (FakeHost, FakeHost) {
        let mut req = FakeHost::new(request);
        let ex = p.on_request(&mut req, Some(NOW));
        let mut resp = FakeHost::default().served_by(served);
        p.on_response(&mut resp, Some(&ex));
        (req, resp)
    }

    fn envoy_cookie(addr: &str) -> String {
        let c = SessionCookie::new(AddressList::parse(addr).unwrap());
        cookie::encode(&c, Format::Envoy, None).unwrap()
    }

    fn decoded(set_cookie_header: &str) -> SessionCookie {
        let got = set_cookie::parse(set_cookie_header).unwrap();
        cookie::decode(got.value, &KeyRing::empty()).unwrap().cookie
    }

    #[test]
    fn header_map_parses_what_it_serializes_and_survives_garbage() {
        let m = HeaderMap::from_pairs([(":path", &b"/a"[..]), ("cookie", &b"\xff"[..])]);
        let got: Vec<_> = m.iter().collect();
        assert_eq!(
            got,
            vec![(&b":path"[..], &b"/a"[..]), (&b"cookie"[..], &b"\xff"[..])]
        );
        for len in 0..m.0.len() {
            let cut = HeaderMap(m.0[..len].to_vec());
            assert!(cut.iter().count() <= 2);
        }
        let huge = HeaderMap(vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
        assert_eq!(huge.iter().count(), 0);
        assert_eq!(HeaderMap::default().iter().count(), 0);
    }

    /// The memo: a replayed value pins as its first reading did, values of
    /// other sessions pin to their own hosts, and a remembered value still
    /// expires (then it is a miss and gets a fresh cookie).
    #[test]
    fn a_remembered_cookie_pins_as_decoded_and_still_expires() {
        let p = plugin(COOKIE);
        let value = |addr: &str, expires: u64| {
            let mut c = SessionCookie::new(AddressList::parse(addr).unwrap());
            c.cluster = Some("backends".into());
            c.expires = Some(expires);
            alloc::format!("s=\"{}\"", cookie::encode(&c, Format::Envoy, None).unwrap())
        };
        let (a, b) = (
            value("127.0.0.1:8001", NOW + 5),
            value("127.0.0.1:8002", NOW + 500),
        );
        let pinned_at = |header: &str, now: u64| {
            let mut host = FakeHost::new(&[(":path", "/"), ("cookie", header)]);
            let ex = p.on_request(&mut host, Some(now));
            (host.set_request, ex.lookup().addresses().is_some())
        };
        for _ in 0..3 {
            for (header, addr) in [(&a, "127.0.0.1:8001"), (&b, "127.0.0.1:8002")] {
                let (set, pinned) = pinned_at(header, NOW);
                assert!(pinned);
                assert_eq!(
                    set,
                    vec![("x-tether-override-host".to_string(), addr.to_string())]
                );
            }
        }
        // Past a's expiry: no override, a miss; b still pins from the memo.
        let (set, pinned) = pinned_at(&a, NOW + 6);
        assert!(set.is_empty() && !pinned, "{set:?}");
        assert!(pinned_at(&b, NOW + 6).1);
    }

    #[test]
    fn first_request_is_routed_normally_and_gets_a_cookie() {
        let p = plugin(COOKIE);
        let (req, resp) = exchange(&p, &[(":path", "/")], "127.0.0.1:8001");
        assert!(req.set_request.is_empty());
        let cookies = resp.set_cookies();
        assert_eq!(cookies.len(), 1);
        let c = decoded(cookies[0]);
        assert_eq!(c.addresses.primary().to_string(), "127.0.0.1:8001");
        assert_eq!(c.expires, Some(NOW + 120));
        assert_eq!(c.cluster.as_deref(), Some("backends"));
        assert!(cookies[0].contains("Max-Age=120"), "{}", cookies[0]);
    }

    #[test]
    fn pinned_replay_sets_the_override_and_costs_two_calls_when_served_there() {
        let p = plugin(COOKIE);
        let mut c = SessionCookie::new(AddressList::parse("127.0.0.1:8001").unwrap());
        c.cluster = Some("backends".into());
        let value = cookie::encode(&c, Format::Envoy, None).unwrap();
        let header = alloc::format!("a=b; s=\"{value}\"");
        let (req, resp) = exchange(
            &p,
            &[(":path", "/x"), ("cookie", &header)],
            "127.0.0.1:8001",
        );
        assert_eq!(
            req.set_request,
            vec![(
                "x-tether-override-host".to_string(),
                "127.0.0.1:8001".to_string()
            )]
        );
        assert_eq!(req.calls.len(), 2, "{:?}", req.calls);
        assert!(resp.set_cookies().is_empty());
        assert_eq!(resp.calls, vec!["property upstream.address"]);
    }

    #[test]
    fn cookie_is_found_in_any_of_several_cookie_headers() {
        let p = plugin(COOKIE);
        let value = envoy_cookie("127.0.0.1:8002");
        let second = alloc::format!("s={value}");
        let (req, _) = exchange(
            &p,
            &[(":path", "/"), ("cookie", "a=1"), ("cookie", &second)],
            "127.0.0.1:8002",
        );
        assert_eq!(req.set_request[0].1, "127.0.0.1:8002");
    }

    #[test]
    fn cookie_is_found_after_many_cookie_headers() {
        let p = plugin(COOKIE);
        let value = envoy_cookie("127.0.0.1:8003");
        let session = alloc::format!("s={value}");
        let mut request = vec![(":path", "/")];
        for other in ["a=1", "b=2", "c=3", "d=4", "e=5"] {
            request.push(("cookie", other));
        }
        request.push(("cookie", &session));
        request.push(("cookie", "s=second-is-ignored"));
        let (req, _) = exchange(&p, &request, "127.0.0.1:8003");
        assert_eq!(req.set_request[0].1, "127.0.0.1:8003");
    }

    #[test]
    fn a_cookie_without_a_cluster_gains_one_once() {
        let p = plugin(COOKIE);
        let header = alloc::format!("s={}", envoy_cookie("127.0.0.1:8001"));
        let (_, resp) = exchange(&p, &[(":path", "/"), ("cookie", &header)], "127.0.0.1:8001");
        let cookies = resp.set_cookies();
        assert_eq!(cookies.len(), 1);
        assert_eq!(decoded(cookies[0]).cluster.as_deref(), Some("backends"));
    }

    #[test]
    fn client_override_header_is_removed_before_deciding() {
        let p = plugin(COOKIE);
        let (req, _) = exchange(
            &p,
            &[(":path", "/"), ("x-tether-override-host", "127.0.0.1:9")],
            "127.0.0.1:8001",
        );
        assert_eq!(
            req.calls,
            [
                "request_header cookie",
                "request_header x-tether-override-host",
                "remove_request_header x-tether-override-host"
            ]
        );
        assert!(req
            .request
            .iter()
            .all(|(n, _)| n != "x-tether-override-host"));
        assert!(req.set_request.is_empty());
        // Other cookies but no session: the whole map is read, and the
        // client's override header still goes.
        let (req, _) = exchange(
            &p,
            &[
                (":path", "/"),
                ("cookie", "a=1"),
                ("x-tether-override-host", "127.0.0.1:9"),
            ],
            "127.0.0.1:8001",
        );
        assert!(req
            .calls
            .contains(&"remove_request_header x-tether-override-host".into()));
        assert!(req.set_request.is_empty());
    }

    #[test]
    fn a_pinned_request_replaces_a_client_override_header_in_one_call() {
        let p = plugin(COOKIE);
        let header = alloc::format!("s={}", envoy_cookie("127.0.0.1:8001"));
        let (req, _) = exchange(
            &p,
            &[
                (":path", "/"),
                ("x-tether-override-host", "127.0.0.1:9"),
                ("cookie", &header),
            ],
            "127.0.0.1:8001",
        );
        assert_eq!(
            req.calls,
            [
                "request_header cookie",
                "set_request_header x-tether-override-host"
            ]
        );
        assert_eq!(
            req.set_request,
            [("x-tether-override-host".into(), "127.0.0.1:8001".into())]
        );
    }

    #[test]
    fn a_session_cookie_in_a_later_cookie_header_still_pins() {
        let p = plugin(COOKIE);
        let header = alloc::format!("s={}", envoy_cookie("127.0.0.1:8001"));
        let (req, _) = exchange(
            &p,
            &[(":path", "/"), ("cookie", "a=1; b=2"), ("cookie", &header)],
            "127.0.0.1:8001",
        );
        assert!(
            req.calls.contains(&"request_headers".into()),
            "{:?}",
            req.calls
        );
        assert_eq!(
            req.set_request,
            [("x-tether-override-host".into(), "127.0.0.1:8001".into())]
        );
    }

    #[test]
    fn no_cookie_for_a_host_that_did_not_answer() {
        let p = plugin(COOKIE);
        let mut req = FakeHost::new(&[(":path", "/")]);
        let ex = p.on_request(&mut req, Some(NOW));
        let mut resp = FakeHost::default().served_by("127.0.0.1:8001");
        resp.properties.insert(
            "response.code_details".into(),
            b"upstream_reset_before_response_started{remote_connection_failure}".to_vec(),
        );
        p.on_response(&mut resp, Some(&ex));
        assert!(resp.set_cookies().is_empty());
        let mut none = FakeHost::default();
        p.on_response(&mut none, Some(&ex));
        assert!(none.response.is_empty());
    }

    #[test]
    fn path_gate_leaves_request_and_response_alone() {
        let p = plugin(r#"{"cookie":{"name":"s","path":"/app"}}"#);
        let mut c = SessionCookie::new(AddressList::parse("127.0.0.1:8001").unwrap());
        c.cluster = Some("backends".into());
        let header = alloc::format!("s={}", cookie::encode(&c, Format::Envoy, None).unwrap());
        let (req, resp) = exchange(
            &p,
            &[(":path", "/other"), ("cookie", &header)],
            "127.0.0.1:8002",
        );
        assert!(req.set_request.is_empty());
        assert!(resp.calls.is_empty());
        let (req, resp) = exchange(
            &p,
            &[(":path", "/app/x"), ("cookie", &header)],
            "127.0.0.1:8001",
        );
        assert_eq!(req.set_request.len(), 1);
        assert!(resp.set_cookies().is_empty());
    }

    #[test]
    fn session_header_encoding_writes_base64_and_hides_the_native_echo() {
        let p = plugin(
            r#"{"cookie":{"name":"s"},"override_encoding":"session_header","override_header":"x-pin"}"#,
        );
        let header = alloc::format!("s={}", envoy_cookie("127.0.0.1:8001"));
        let mut req = FakeHost::new(&[(":path", "/"), ("cookie", &header)]);
        let ex = p.on_request(&mut req, Some(NOW));
        assert_eq!(
            req.set_request[0],
            ("x-pin".into(), "MTI3LjAuMC4xOjgwMDE=".into())
        );
        let mut resp = FakeHost::default().served_by("127.0.0.1:8001");
        resp.response
            .push(("x-pin".into(), "MTI3LjAuMC4xOjgwMDE=".into()));
        p.on_response(&mut resp, Some(&ex));
        assert!(resp.response.iter().all(|(n, _)| n != "x-pin"));
    }

    #[test]
    fn session_header_encoding_trusts_the_missing_echo_and_reads_envoy_on_one() {
        let p = plugin(
            r#"{"cookie":{"name":"s"},"override_encoding":"session_header","override_header":"x-pin"}"#,
        );
        let mut c = SessionCookie::new(AddressList::parse("127.0.0.1:8001").unwrap());
        c.cluster = Some("backends".into());
        let header = alloc::format!("s={}", cookie::encode(&c, Format::Envoy, None).unwrap());
        let request = [(":path", "/"), ("cookie", header.as_str())];

        // No echo: the asked host answered; one header read, nothing else
        // (not even `upstream.address`, which here names another host).
        let mut req = FakeHost::new(&request);
        let ex = p.on_request(&mut req, Some(NOW));
        let mut resp = FakeHost::default().served_by("127.0.0.1:8002");
        p.on_response(&mut resp, Some(&ex));
        assert_eq!(resp.calls, vec!["response_header x-pin"]);
        assert!(resp.response.is_empty());

        // An echo: another host answered; the echo is removed and the cookie
        // names the host Envoy reports, not the echoed value.
        let mut resp = FakeHost::default().served_by("127.0.0.1:8002");
        resp.response
            .push(("x-pin".into(), "MTI3LjAuMC4xOjgwMDM=".into()));
        p.on_response(&mut resp, Some(&ex));
        assert!(resp.response.iter().all(|(n, _)| n != "x-pin"));
        let cookies = resp.set_cookies();
        assert_eq!(cookies.len(), 1, "{:?}", resp.calls);
        assert_eq!(
            decoded(cookies[0]).addresses.primary().to_string(),
            "127.0.0.1:8002"
        );

        // Without a pinned request the echo is removed without being read.
        let mut req = FakeHost::new(&[(":path", "/")]);
        let ex = p.on_request(&mut req, Some(NOW));
        let mut resp = FakeHost::default().served_by("127.0.0.1:8002");
        resp.response
            .push(("x-pin".into(), "MTI3LjAuMC4xOjgwMDI=".into()));
        p.on_response(&mut resp, Some(&ex));
        assert_eq!(resp.calls[0], "remove_response_header x-pin");
        assert_eq!(resp.set_cookies().len(), 1);
    }

    #[test]
    fn header_mode_reads_and_writes_the_session_header() {
        let p = plugin(r#"{"header":{"name":"x-session"}}"#);
        let (req, resp) = exchange(&p, &[(":path", "/")], "127.0.0.1:8003");
        assert!(req.set_request.is_empty());
        assert_eq!(
            resp.response,
            vec![("x-session".to_owned(), "MTI3LjAuMC4xOjgwMDM=".to_owned())]
        );
        let (req, resp) = exchange(
            &p,
            &[(":path", "/"), ("x-session", "MTI3LjAuMC4xOjgwMDM=")],
            "127.0.0.1:8003",
        );
        assert_eq!(req.set_request[0].1, "127.0.0.1:8003");
        assert!(resp.response.is_empty());
    }

    #[test]
    fn strict_replaces_a_fallback_answer_with_503() {
        let p = plugin(r#"{"cookie":{"name":"s"},"strict":true}"#);
        let header = alloc::format!("s={}", envoy_cookie("127.0.0.1:8001"));
        let (_, resp) = exchange(&p, &[(":path", "/"), ("cookie", &header)], "127.0.0.1:8002");
        assert_eq!(resp.reply, Some(503));
        assert!(resp.set_cookies().is_empty());
        let (_, resp) = exchange(&p, &[(":path", "/"), ("cookie", &header)], "127.0.0.1:8001");
        assert_eq!(resp.reply, None);
    }

    #[test]
    fn without_a_clock_the_request_is_left_alone() {
        let p = plugin(COOKIE);
        let header = alloc::format!("s={}", envoy_cookie("127.0.0.1:8001"));
        let mut req = FakeHost::new(&[(":path", "/"), ("cookie", &header)]);
        let ex = p.on_request(&mut req, None);
        assert!(req.set_request.is_empty());
        let mut resp = FakeHost::default().served_by("127.0.0.1:8002");
        p.on_response(&mut resp, Some(&ex));
        assert!(resp.response.is_empty());
    }

    #[test]
    fn garbage_never_panics() {
        let p = plugin(COOKIE);
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let len = (next() % 60) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let header = alloc::format!("s={text}; s=\"{text}");
            let mut req = FakeHost::new(&[(":path", &text), ("cookie", &header)]);
            req.request.push(("cookie".into(), bytes.clone()));
            let ex = p.on_request(&mut req, Some(next()));
            let mut resp = FakeHost::default();
            resp.properties
                .insert("upstream.address".into(), bytes.clone());
            p.on_response(&mut resp, Some(&ex));
            let _ = HeaderMap(bytes).iter().count();
        }
    }

    const SEALED: &str = r#"{"cookie":{"name":"s","path":"/","ttl":"120s"},"format":"sealed",
        "keys":["bmV3LXNlYWxpbmctc2VjcmV0LTAxMjM0NTY3ODlhYmM="]}"#;

    fn cookie_value(set_cookie: &str) -> String {
        set_cookie::parse(set_cookie).unwrap().value.to_owned()
    }

    #[test]
    fn a_sealed_cookie_pins_and_a_tampered_one_gets_a_fresh_pick() {
        let p = plugin(SEALED);
        let (_, resp) = exchange(&p, &[], "10.0.0.1:80");
        assert!(
            resp.calls.contains(&"random".to_owned()),
            "{:?}",
            resp.calls
        );
        let first = cookie_value(resp.set_cookies()[0]);
        let ring = &p.config().session.config().keys;
        let d = cookie::decode(&first, ring).unwrap();
        assert_eq!(d.format, Format::Sealed);
        assert_eq!(d.cookie.cluster.as_deref(), Some("backends"));
        assert_eq!(d.cookie.expires, Some(NOW + 120));
        // Nothing of the session shows.
        assert!(cookie::decode(&first, &KeyRing::empty()).is_err());

        // Replayed: pinned, served there, nothing sent back, no randomness.
        let header = alloc::format!("s={first}");
        let (req, resp) = exchange(&p, &[("cookie", &header)], "10.0.0.1:80");
        assert_eq!(req.set_request.len(), 1);
        assert_eq!(req.set_request[0].1, "10.0.0.1:80");
        assert!(resp.set_cookies().is_empty());
        assert!(!resp.calls.contains(&"random".to_owned()));

        // Other random bytes, another value for the same session.
        let ex = p.on_request(&mut FakeHost::new(&[]), Some(NOW));
        let mut resp = FakeHost::default().served_by("10.0.0.1:80");
        resp.random_byte = 7;
        p.on_response(&mut resp, Some(&ex));
        let second = cookie_value(resp.set_cookies()[0]);
        assert_ne!(second, first);
        assert_eq!(cookie::decode(&second, ring).unwrap().cookie, d.cookie);

        // Tampered: not pinned, a fresh pick, a new cookie that opens.
        let mut bytes = first.clone().into_bytes();
        bytes[20] = if bytes[20] == b'A' { b'B' } else { b'A' };
        let tampered = alloc::format!("s={}", String::from_utf8(bytes).unwrap());
        let (req, resp) = exchange(&p, &[("cookie", &tampered)], "10.0.0.2:80");
        assert!(req.set_request.is_empty());
        let fresh = cookie_value(resp.set_cookies()[0]);
        let d = cookie::decode(&fresh, ring).unwrap();
        assert_eq!(d.cookie.addresses.primary(), "10.0.0.2:80".parse().unwrap());
    }

    #[test]
    fn without_host_randomness_sealed_nonces_are_counted() {
        let p = plugin(SEALED);
        let mut values = Vec::new();
        for _ in 0..3 {
            let ex = p.on_request(&mut FakeHost::new(&[]), Some(NOW));
            let mut resp = FakeHost::default().served_by("10.0.0.1:80");
            resp.random_works = false;
            p.on_response(&mut resp, Some(&ex));
            values.push(cookie_value(resp.set_cookies()[0]));
        }
        values.dedup();
        assert_eq!(values.len(), 3, "{values:?}");
        let ring = &p.config().session.config().keys;
        for v in &values {
            assert!(cookie::decode(v, ring).is_ok());
        }
    }

    /// What one exchange counted, request side then response side.
    fn counted(p: &Plugin, request: &[(&str, &str)], served: &str) -> (Vec<Counter>, Vec<Counter>) {
        let (req, resp) = exchange(p, request, served);
        (req.counts, resp.counts)
    }

    /// The counters follow the core's decisions: each request counts at most
    /// one of pinned, refused (why) and bypassed, plus a misread pin; each
    /// response at most one cookie written (why).
    #[test]
    fn each_decision_counts_its_counter_once() {
        use Counter::*;
        let p = plugin(COOKIE);
        let mut c = SessionCookie::new(AddressList::parse("127.0.0.1:8001").unwrap());
        c.cluster = Some("backends".into());
        let full = alloc::format!("s={}", cookie::encode(&c, Format::Envoy, None).unwrap());
        let bare = alloc::format!("s={}", envoy_cookie("127.0.0.1:8001"));

        // A new session; then its cookie pins, each time (the memo's too).
        assert_eq!(
            counted(&p, &[(":path", "/")], "127.0.0.1:8001"),
            (vec![], vec![WrittenNew])
        );
        for _ in 0..2 {
            assert_eq!(
                counted(&p, &[(":path", "/"), ("cookie", &full)], "127.0.0.1:8001"),
                (vec![Pinned], vec![])
            );
        }
        // Another host answered: the session moved.
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", &full)], "127.0.0.1:8002"),
            (vec![Pinned], vec![WrittenMoved])
        );
        // The session's host answered, its cookie lacked the cluster.
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", &bare)], "127.0.0.1:8001"),
            (vec![Pinned], vec![WrittenReissued])
        );
        // Refused: not a cookie, expired; each gets a new session.
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", "s=%%%")], "127.0.0.1:8001"),
            (vec![RefusedInvalid], vec![WrittenNew])
        );
        c.expires = Some(NOW - 1);
        let expired = alloc::format!("s={}", cookie::encode(&c, Format::Envoy, None).unwrap());
        assert_eq!(
            counted(
                &p,
                &[(":path", "/"), ("cookie", &expired)],
                "127.0.0.1:8001"
            ),
            (vec![RefusedExpired], vec![WrittenNew])
        );
        // Another cookie only: no session, nothing refused.
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", "a=1")], "127.0.0.1:8001"),
            (vec![], vec![WrittenNew])
        );
        // No host really answered: no cookie, nothing written.
        let mut req = FakeHost::new(&[(":path", "/")]);
        let ex = p.on_request(&mut req, Some(NOW));
        let mut resp = FakeHost::default().served_by("127.0.0.1:8001");
        resp.properties.insert(
            "response.code_details".into(),
            b"upstream_reset_before_response_started{remote_connection_failure}".to_vec(),
        );
        p.on_response(&mut resp, Some(&ex));
        assert_eq!((req.counts, resp.counts), (vec![], vec![]));

        // A plain legacy text stock Envoy misreads: pinned, counted, respelled.
        let plain = "s=MTAuMC4wLjE6ODA4MA==";
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", plain)], "10.0.0.1:8080"),
            (vec![Pinned, EnvoyMisreads], vec![WrittenReissued])
        );

        // The path gate.
        let gated = plugin(r#"{"cookie":{"name":"s","path":"/app"}}"#);
        assert_eq!(
            counted(
                &gated,
                &[(":path", "/other"), ("cookie", &full)],
                "127.0.0.1:8002"
            ),
            (vec![PathGateBypassed], vec![])
        );
        assert_eq!(
            counted(
                &gated,
                &[(":path", "/app/x"), ("cookie", &full)],
                "127.0.0.1:8001"
            ),
            (vec![Pinned], vec![])
        );
    }

    #[test]
    fn cookies_the_keys_do_not_verify_are_refused_and_rotated_ones_reissued() {
        use Counter::*;
        const NEW: &str = "bmV3LXNpZ25pbmcta2V5LTAx";
        const OLD: &str = "b2xkLXNpZ25pbmcta2V5LTAx";
        const OTHER: &str = "b3RoZXItc2lnbmluZy1rZXk=";
        let p = plugin(&alloc::format!(
            r#"{{"cookie":{{"name":"s","path":"/","ttl":"120s"}},"keys":["{NEW}","{OLD}"]}}"#
        ));
        let mut c = SessionCookie::new(AddressList::parse("127.0.0.1:8001").unwrap());
        c.cluster = Some("backends".into());
        let signed = |secret: &str| {
            let ring = KeyRing::from_base64([secret]).unwrap();
            alloc::format!(
                "s={}",
                cookie::encode(&c, Format::Envoy, ring.signer()).unwrap()
            )
        };
        let served = "127.0.0.1:8001";
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", &signed(NEW))], served),
            (vec![Pinned], vec![])
        );
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", &signed(OLD))], served),
            (vec![Pinned], vec![WrittenReissued])
        );
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", &signed(OTHER))], served),
            (vec![RefusedUnverified], vec![WrittenNew])
        );
        let unsigned = alloc::format!("s={}", cookie::encode(&c, Format::Envoy, None).unwrap());
        assert_eq!(
            counted(&p, &[(":path", "/"), ("cookie", &unsigned)], served),
            (vec![RefusedUnverified], vec![WrittenNew])
        );
        // A sealed value no key opens.
        let sealed = plugin(SEALED);
        let (_, resp) = exchange(&sealed, &[], "10.0.0.1:80");
        let value = cookie_value(resp.set_cookies()[0]);
        let mut bytes = value.into_bytes();
        bytes[20] = if bytes[20] == b'A' { b'B' } else { b'A' };
        let tampered = alloc::format!("s={}", String::from_utf8(bytes).unwrap());
        assert_eq!(
            counted(&sealed, &[("cookie", &tampered)], "10.0.0.1:80"),
            (vec![RefusedUnverified], vec![WrittenNew])
        );
    }
}
