//! The session decisions every adapter (proxy-wasm plugin, native client,
//! JavaScript) makes, as pure functions.
//!
//! 1. [`Session::lookup`]: from the request's path and `Cookie` headers (or
//!    the session header), which hosts the request is pinned to, if any.
//! 2. [`Session::respond`]: once the request was served, what to send back:
//!    a `Set-Cookie` (or the session header), or nothing.
//!
//! Rules, following Envoy and gRPC C-core where they agree:
//! - cookie mode applies only where the cookie path matches the request path
//!   ([`Lookup::Bypass`] otherwise: the response is left alone too);
//! - a missing, malformed, expired or wrongly signed cookie is no session: the
//!   load balancer picks and the response carries a new cookie;
//! - a cookie is (re)issued when the host that served differs from the one the
//!   session named, when the endpoint's address list or the cluster changed
//!   (gRFC A60/A61; a cookie without a cluster gains one once), or when an
//!   unsigned cookie was accepted and keys are configured, or a value that
//!   is not sealed was accepted under format `sealed` (it is upgraded);
//! - no cookie is ever minted for a host that failed to connect, or when the
//!   adapter does not know which host served (Envoy does the former: it pins
//!   clients to a dead host; tether does not).

use alloc::string::String;
use alloc::vec::Vec;
use core::net::SocketAddr;

use crate::address::AddressList;
use crate::config::{ConfigError, SessionConfig, SessionMode};
use crate::cookie::sealed::{seal, NONCE_LEN};
use crate::cookie::{self, DecodeError, Format, SessionCookie, Signature};
use crate::http::cookie_header;
use crate::http::path::{matches_every_path, path_matches};
use crate::http::set_cookie::Style;

/// What an adapter knows about the request, as plain values.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionRequest<'a> {
    /// The request path (`:path`, may include the query).
    pub path: &'a str,
    /// Every `Cookie` header value, in the order received (cookie mode).
    pub cookies: &'a [&'a str],
    /// The session header's value (header mode; see [`Session::header_name`]).
    pub header: Option<&'a str>,
}

/// Why a request has no usable session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// No session cookie (or header) in the request.
    Absent,
    /// The value names no session.
    Invalid(DecodeError),
    /// The cookie expired at this epoch second.
    Expired(u64),
    /// The cookie's MAC matches no configured key.
    BadMac,
    /// Keys are configured and the cookie carries no MAC.
    Unsigned,
    /// The format is `sealed` and the value is not sealed (`accept_unsigned`
    /// not set).
    Unsealed,
}

/// A session found in the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The session as decoded.
    pub cookie: SessionCookie,
    /// The format it was written in.
    pub format: Format,
    /// Its MAC state.
    pub signature: Signature,
    /// Stock Envoy's cookie session state would not read the value as this
    /// session ([`crate::cookie::Decoded::envoy_misreads`]).
    pub envoy_misreads: bool,
}

/// The request-side decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The cookie path does not apply to this request: route it normally and
    /// leave its response alone.
    Bypass,
    /// No usable session: load balance, and the response will carry one.
    Miss(Miss),
    /// The request is pinned.
    Pinned(Pin),
}

impl Lookup {
    /// The addresses to route to, in order, when pinned.
    pub fn addresses(&self) -> Option<&AddressList> {
        match self {
            Lookup::Pinned(p) => Some(&p.cookie.addresses),
            _ => None,
        }
    }

    /// The cluster the session names (gRFC A60), when pinned and known.
    pub fn cluster(&self) -> Option<&str> {
        match self {
            Lookup::Pinned(p) => p.cookie.cluster.as_deref(),
            _ => None,
        }
    }

    /// The value for Envoy's `override_host` header: `ip:port[,ip:port...]`.
    pub fn override_header_value(&self) -> Option<String> {
        self.addresses().map(AddressList::to_text)
    }
}

/// What an adapter knows about how the request was served.
#[derive(Debug, Clone, Copy, Default)]
pub struct Served<'a> {
    /// The upstream address that answered, if known.
    pub address: Option<SocketAddr>,
    /// That endpoint's other addresses (gRFC A61), if known.
    pub other_addresses: &'a [SocketAddr],
    /// The cluster that served, if known.
    pub cluster: Option<&'a str>,
    /// The connection to the upstream failed (no host really served).
    pub connect_failed: bool,
}

/// What to add to the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Emit {
    /// A `Set-Cookie` header with this value.
    SetCookie(String),
    /// The session header (header mode).
    Header {
        /// Header name (lowercase).
        name: String,
        /// Header value.
        value: String,
    },
}

/// A validated session configuration and the decisions made with it.
#[derive(Debug, Clone)]
pub struct Session {
    config: SessionConfig,
}

impl Session {
    /// Validates `config`.
    pub fn new(config: SessionConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Session { config })
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// The session header to read and write, in header mode.
    pub fn header_name(&self) -> Option<&str> {
        match &self.config.mode {
            SessionMode::Header { name } => Some(name),
            SessionMode::Cookie(_) => None,
        }
    }

    /// Whether [`Session::lookup`] needs the request path: only in cookie mode
    /// with a cookie path that does not match every request. Adapters that
    /// pay for each header they read skip `:path` otherwise.
    pub fn reads_path(&self) -> bool {
        match &self.config.mode {
            SessionMode::Cookie(spec) => !matches_every_path(spec.path()),
            SessionMode::Header { .. } => false,
        }
    }

    /// The session cookie's name, in cookie mode.
    pub fn cookie_name(&self) -> Option<&str> {
        match &self.config.mode {
            SessionMode::Cookie(spec) => Some(spec.name()),
            SessionMode::Header { .. } => None,
        }
    }

    /// Envoy's `strict`: when pinned to a host that cannot be used, the
    /// adapter answers 503 instead of load balancing.
    pub fn strict(&self) -> bool {
        self.config.strict
    }

    /// Envoy's `strict` judged after the fact, for adapters that cannot check
    /// a host before the request is routed (the proxy-wasm plugin behind
    /// Envoy's `override_host` policy): true when strict mode is on, the
    /// request was pinned, and a host outside the session's addresses
    /// answered, i.e. the load balancer fell back. The adapter then replaces
    /// the answer with a 503 and sets no cookie. A failed connection is not
    /// refused here: that answer is an error already.
    pub fn strict_refuses(&self, lookup: &Lookup, served: &Served<'_>) -> bool {
        let (Some(pinned), Some(address)) = (lookup.addresses(), served.address) else {
            return false;
        };
        self.config.strict && !served.connect_failed && !pinned.as_slice().contains(&address)
    }

    /// The request-side decision at `now` (epoch seconds).
    pub fn lookup(&self, req: &SessionRequest<'_>, now: u64) -> Lookup {
        let raw = match &self.config.mode {
            SessionMode::Cookie(spec) => {
                if !path_matches(spec.path(), req.path) {
                    return Lookup::Bypass;
                }
                cookie_header::find(req.cookies.iter().copied(), spec.name())
            }
            SessionMode::Header { .. } => req.header,
        };
        let Some(raw) = raw else {
            return Lookup::Miss(Miss::Absent);
        };
        let decoded = match cookie::decode(raw, &self.config.keys) {
            Ok(d) => d,
            Err(e) => return Lookup::Miss(Miss::Invalid(e)),
        };
        match decoded.signature {
            Signature::Invalid => return Lookup::Miss(Miss::BadMac),
            Signature::Unsigned if !self.config.keys.is_empty() && !self.config.accept_unsigned => {
                return Lookup::Miss(Miss::Unsigned)
            }
            _ => {}
        }
        // A signed `envoy` value shows its session to whoever holds it.
        if self.config.format.is_sealed()
            && !decoded.format.is_sealed()
            && !self.config.accept_unsigned
        {
            return Lookup::Miss(Miss::Unsealed);
        }
        if let Some(expires) = decoded
            .cookie
            .expires
            .filter(|_| decoded.cookie.is_expired(now))
        {
            return Lookup::Miss(Miss::Expired(expires));
        }
        Lookup::Pinned(Pin {
            cookie: decoded.cookie,
            format: decoded.format,
            signature: decoded.signature,
            envoy_misreads: decoded.envoy_misreads,
        })
    }

    /// The response-side decision at `now` (epoch seconds). A `sealed`
    /// value gets the all-zero nonce (deterministic: see
    /// [`cookie::sealed`]); adapters with randomness call
    /// [`Session::respond_with`].
    pub fn respond(&self, lookup: &Lookup, served: &Served<'_>, now: u64) -> Option<Emit> {
        self.respond_with(lookup, served, now, &[0; NONCE_LEN])
    }

    /// [`Session::respond`] with the nonce a `sealed` value is sealed with
    /// (other formats ignore it): random bytes from the caller's source.
    pub fn respond_with(
        &self,
        lookup: &Lookup,
        served: &Served<'_>,
        now: u64,
        nonce: &[u8; NONCE_LEN],
    ) -> Option<Emit> {
        let (address, cluster) = self.decide(lookup, served)?;
        self.mint_with(address, served.other_addresses, cluster, now, nonce)
    }

    /// Whether [`Session::respond`] sends a cookie (or the session header)
    /// for this exchange: the decision alone, without writing the value, for
    /// adapters that learn how the request was served step by step and write
    /// the value once, at the end.
    pub fn wants_cookie(&self, lookup: &Lookup, served: &Served<'_>) -> bool {
        self.decide(lookup, served).is_some()
    }

    /// The address and cluster to mint a cookie for, if one is due.
    fn decide<'s>(
        &self,
        lookup: &Lookup,
        served: &Served<'s>,
    ) -> Option<(SocketAddr, Option<&'s str>)> {
        let address = served.address.filter(|_| !served.connect_failed)?;
        let format = self.config.format;
        // A cluster name a cookie cannot carry is left out of it.
        let writable = |c: &&str| !c.is_empty() && !cookie::has_control(c);
        match lookup {
            Lookup::Bypass => return None,
            Lookup::Miss(_) => {}
            Lookup::Pinned(pin) => {
                let c = &pin.cookie;
                let moved = c.addresses.primary() != address
                    || (format.carries_address_list()
                        && !served.other_addresses.is_empty()
                        && c.addresses.others() != served.other_addresses);
                // The same name needs no scan: the cookie carried it.
                let recluster = format.carries_cluster()
                    && served
                        .cluster
                        .is_some_and(|s| c.cluster.as_deref() != Some(s) && writable(&s));
                // Verified by a key that no longer writes: re-issued under
                // the writing one, so the old key can be withdrawn without
                // losing the session.
                let rotated = matches!(pin.signature, Signature::Valid { key } if key > 0);
                let upgrade = (pin.signature == Signature::Unsigned
                    && !self.config.keys.is_empty())
                    || (format.is_sealed() && !pin.format.is_sealed())
                    || rotated;
                // A cookie stock Envoys in the fleet would not read is
                // re-issued in a form they read (`grpc` is never theirs).
                let respell = pin.envoy_misreads
                    && !matches!(format, Format::Grpc | Format::Sealed)
                    && matches!(self.config.mode, SessionMode::Cookie(_));
                if !(moved || recluster || upgrade || respell) {
                    return None;
                }
            }
        }
        Some((address, served.cluster.filter(writable)))
    }

    /// The header that pins a client to `address` (and the endpoint's other
    /// addresses and cluster, where the format carries them); a `sealed`
    /// value gets the all-zero nonce, as in [`Session::respond`].
    pub fn mint(
        &self,
        address: SocketAddr,
        others: &[SocketAddr],
        cluster: Option<&str>,
        now: u64,
    ) -> Option<Emit> {
        self.mint_with(address, others, cluster, now, &[0; NONCE_LEN])
    }

    /// [`Session::mint`] with the nonce a `sealed` value is sealed with.
    pub fn mint_with(
        &self,
        address: SocketAddr,
        others: &[SocketAddr],
        cluster: Option<&str>,
        now: u64,
        nonce: &[u8; NONCE_LEN],
    ) -> Option<Emit> {
        let format = self.config.format;
        let mut list = Vec::with_capacity(1 + others.len());
        list.push(address);
        if format.carries_address_list() {
            list.extend_from_slice(others);
        }
        let mut cookie = SessionCookie::new(AddressList::new(list)?);
        if format.carries_cluster() {
            cookie.cluster = cluster.map(String::from);
        }
        let signer = self.config.keys.signer();
        let sealed = |cookie: &SessionCookie| seal(cookie, signer?, nonce).ok();
        match &self.config.mode {
            SessionMode::Cookie(spec) => {
                cookie.expires = format.expiry_after(spec.ttl(), now);
                let value = if format.is_sealed() {
                    sealed(&cookie)?
                } else {
                    cookie::encode(&cookie, format, signer).ok()?
                };
                spec.render(&value, Style::for_format(format))
                    .ok()
                    .map(Emit::SetCookie)
            }
            SessionMode::Header { name } => {
                let value = if format.is_sealed() {
                    sealed(&cookie)?
                } else {
                    cookie::encode_header(&cookie, format, signer).ok()?
                };
                Some(Emit::Header {
                    name: name.clone(),
                    value,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cookie::{Key, KeyRing};
    use crate::http::set_cookie::CookieSpec;
    use alloc::vec;
    use core::time::Duration;

    const NOW: u64 = 1_800_000_000;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn wants_cookie_is_whether_respond_answers() {
        let spec = CookieSpec::new("s", "/", Duration::from_secs(60), vec![]).unwrap();
        let unsigned = SessionConfig::cookie(spec.clone());
        let mut signed = SessionConfig::cookie(spec);
        signed.keys = KeyRing::new(vec![Key::from_secret(b"0123456789abcdef").unwrap()]);
        signed.accept_unsigned = true;
        let a = addr("10.0.0.1:80");
        let b = addr("10.0.0.2:80");
        let others = [addr("[::1]:80")];
        let pinned = |cluster: Option<&str>, signature| {
            let mut cookie = SessionCookie::new(AddressList::one(a));
            cookie.cluster = cluster.map(String::from);
            Lookup::Pinned(Pin {
                cookie,
                format: Format::Envoy,
                signature,
                envoy_misreads: false,
            })
        };
        let lookups = [
            Lookup::Bypass,
            Lookup::Miss(Miss::Absent),
            pinned(None, Signature::Unsigned),
            pinned(Some("c1"), Signature::Unsigned),
            pinned(Some("c1"), Signature::Valid { key: 0 }),
        ];
        let mut answered = 0;
        for config in [unsigned, signed] {
            let session = Session::new(config).unwrap();
            for lookup in &lookups {
                for address in [None, Some(a), Some(b)] {
                    for cluster in [None, Some("c1"), Some("c2"), Some(""), Some("c\u{7}")] {
                        for other_addresses in [&[][..], &others[..]] {
                            for connect_failed in [false, true] {
                                let served = Served {
                                    address,
                                    other_addresses,
                                    cluster,
                                    connect_failed,
                                };
                                let emit = session.respond(lookup, &served, NOW);
                                assert_eq!(
                                    session.wants_cookie(lookup, &served),
                                    emit.is_some(),
                                    "{lookup:?} {served:?}"
                                );
                                answered += usize::from(emit.is_some());
                            }
                        }
                    }
                }
            }
        }
        // Both answers occur, so the comparison above means something.
        assert!(answered > 0 && answered < 2 * lookups.len() * 3 * 5 * 2 * 2);
    }

    /// Key rotation: a cookie an older key verifies is still read (the
    /// session stays) and re-issued under the writing key, for signed and
    /// sealed cookies alike; once re-issued, nothing more is sent.
    #[test]
    fn a_cookie_of_an_older_key_is_read_and_reissued_under_the_writing_one() {
        let old = Key::from_secret(&[1; 32]).unwrap();
        let new = Key::from_secret(&[2; 32]).unwrap();
        let a = addr("10.0.0.1:80");
        for format in [Format::Envoy, Format::Sealed] {
            let spec = CookieSpec::new("s", "/", Duration::from_secs(60), vec![]).unwrap();
            let session = |keys: Vec<Key>| {
                let mut config = SessionConfig::cookie(spec.clone());
                config.format = format;
                config.keys = KeyRing::new(keys);
                Session::new(config).unwrap()
            };
            let before = session(vec![old.clone()]);
            let during = session(vec![new.clone(), old.clone()]);
            let after = session(vec![new.clone()]);
            let served = Served {
                address: Some(a),
                other_addresses: &[],
                cluster: None,
                connect_failed: false,
            };
            let value = |s: &Session, lookup: &Lookup| match s.respond(lookup, &served, NOW) {
                Some(Emit::SetCookie(c)) => {
                    let v = c.split(';').next().unwrap();
                    alloc::string::String::from(&v[v.find('=').unwrap() + 1..])
                }
                other => panic!("{format:?}: expected a cookie, got {other:?}"),
            };
            let request = |s: &Session, v: &str| {
                let cookie = alloc::format!("s={v}");
                s.lookup(
                    &SessionRequest {
                        path: "/",
                        cookies: &[cookie.as_str()],
                        header: None,
                    },
                    NOW,
                )
            };
            let first = value(&before, &Lookup::Miss(Miss::Absent));
            // The old key's cookie still pins during the overlap ...
            let pinned = request(&during, &first);
            assert_eq!(
                pinned.addresses().map(|l| l.primary()),
                Some(a),
                "{format:?}"
            );
            // ... and is re-issued under the new key, which the ring
            // without the old key reads.
            let second = value(&during, &pinned);
            let again = request(&after, &second);
            assert_eq!(
                again.addresses().map(|l| l.primary()),
                Some(a),
                "{format:?}"
            );
            assert!(!during.wants_cookie(&request(&during, &second), &served));
            // Without the overlap the old cookie is no cookie.
            assert!(
                matches!(request(&after, &first), Lookup::Miss(_)),
                "{format:?}"
            );
        }
    }
}
