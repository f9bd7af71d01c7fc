//! # tether-js
//!
//! tether-core compiled to WebAssembly for JavaScript (Node and browsers),
//! so JavaScript services, edge workers and pages read and write the very
//! session cookies Envoy, the tether plugin and the native client do.
//!
//! This crate only converts types: every decision (decoding, encoding,
//! finding the cookie in a `Cookie` header, rendering a `Set-Cookie`, the
//! path gate, the session lookup and response) is a call into tether-core.
//! Bad input throws a JavaScript `Error` whose message is core's error text,
//! naming the field and the value, and whose `code` names the kind.
//!
//! `js/build.sh` builds it with `wasm-bindgen` into `js/pkg/node` (CommonJS
//! for Node) and `js/pkg/web` (an ES module for browsers).
// On wasm32 the crate is `no_std`, with dlmalloc (std's allocator there) and a
// panic handler that traps: std's panic machinery and its message and file
// strings are about 4 KB of the module. Nothing here panics on any input.
#![cfg_attr(target_arch = "wasm32", no_std)]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

extern crate alloc;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

mod convert;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use serde_json::{Map, Value};
use tether_core::config::{self, ConfigError, Problem, SessionMode};
use tether_core::cookie::{self, Decoded, Format, SessionCookie, Signature};
use tether_core::http::{cookie_header, path, set_cookie};
use tether_core::session::{Lookup, Miss};
use tether_core::{duration, AddressList, Emit, Served, Session, SessionConfig, SessionRequest};
use wasm_bindgen::prelude::*;

use convert::{Result, Thrown};

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &str = r#"
/** A session cookie wire format. */
export type Format = "envoy" | "grpc" | "legacy" | "sealed";

/** The MAC state of a cookie: no MAC, verified (by `key`), matching no key, or not checked (no keys given). */
export type SignatureState = "unsigned" | "valid" | "invalid" | "unchecked";

/** What a session cookie names. */
export interface SessionInfo {
  format: Format;
  /** `ip:port` addresses (IPv6 in brackets), the one to use first. */
  addresses: string[];
  cluster: string | null;
  /** Expiry in epoch seconds; null never expires. */
  expires: number | null;
  /** Whether the cookie carries a MAC (a tether signed cookie). */
  signed: boolean;
  /** true: the MAC verified; false: it matches no key; null: unsigned or no keys to check with. */
  verified: boolean | null;
  signature: SignatureState;
  /** Index of the verifying key, when verified. */
  key: number | null;
}

/** A decoded cookie value. */
export interface Decoded extends SessionInfo {
  /** Whether `expires` has passed at the options' `now` (default: the clock). */
  expired: boolean;
  /** Whether the value was in double quotes (Envoy quotes, gRPC does not). */
  quoted: boolean;
  /** Whether its base64 was padded. */
  padded: boolean;
}

export interface DecodeOptions {
  /** Base64 secrets (at least 16 bytes) to verify a MAC with. */
  keys?: string[];
  /** Epoch seconds to judge expiry at (default: the clock). */
  now?: number;
}

export interface EncodeInput {
  addresses: string[];
  cluster?: string | null;
  /** Time to live: seconds, or a protobuf duration such as "120s". Sets `expires` where the format carries one. */
  ttl?: number | string | null;
  /** Explicit expiry in epoch seconds (instead of `ttl`). */
  expires?: number | null;
  /** Default "envoy". */
  format?: Format;
  /** Base64 secrets; the first signs ("envoy") or seals ("sealed", 32 bytes or more). */
  keys?: string[];
  /** Epoch seconds `ttl` counts from (default: the clock). */
  now?: number;
  /** A "sealed" value's nonce, 24 hex digits, for reproducible values (default: random bytes from `crypto.getRandomValues`). */
  nonce?: string;
}

/** A cookie's `Set-Cookie` settings, as in Envoy's `CookieBasedSessionState`. */
export interface CookieSpec {
  name: string;
  path?: string;
  /** A protobuf duration such as "120s". */
  ttl?: string;
  attributes?: { name: string; value?: string }[];
}

/** The session configuration (the same JSON the plugin and the native side read). */
export interface SessionConfig {
  cookie?: CookieSpec;
  header?: { name: string };
  strict?: boolean;
  format?: Format;
  keys?: string[];
  accept_unsigned?: boolean;
}

export interface LookupOptions {
  /** The request path, for the cookie path gate (default "/"). */
  path?: string;
  /** Epoch seconds (default: the clock). */
  now?: number;
}

export interface SessionRequest {
  /** The request path (default "/"). */
  path?: string;
  /** Every `Cookie` header value, in order (cookie mode). */
  cookies?: string | string[];
  /** The session header's value (header mode). */
  header?: string | null;
}

/** Where a request goes. */
export interface SessionLookup {
  /** pinned: route to `session.addresses`; miss: load balance (the response will carry a cookie); bypass: the cookie path does not apply. */
  outcome: "pinned" | "miss" | "bypass";
  reason: null | "absent" | "invalid" | "expired" | "bad-mac" | "unsigned" | "unsealed";
  /** Why the value names no session, for reason "invalid". */
  error: string | null;
  /** When the cookie expired, for reason "expired". */
  expiredAt: number | null;
  session: SessionInfo | null;
  /** The value for Envoy's override-host header: `ip:port[,ip:port]`. */
  overrideHost: string | null;
}

/** How a request was served. */
export interface Served {
  address?: string | null;
  otherAddresses?: string[];
  cluster?: string | null;
  /** The connection to the upstream failed: no cookie is minted. */
  connectFailed?: boolean;
}

/** A header to add to the response: "set-cookie" (append it) or the session header. */
export interface Emit {
  header: string;
  value: string;
}

export interface CookiePair {
  name: string;
  value: string;
}

/** A Set-Cookie value as a browser reads it. */
export interface ReceivedSetCookie {
  name: string;
  value: string;
  /** `known`: an attribute RFC 6265 defines (Path, Max-Age, HttpOnly, ...). */
  attributes: { name: string; value: string; known: boolean }[];
}
"#;

/// Decodes a session cookie value in any format (Envoy protobuf, gRPC text,
/// legacy `ip:port`, signed or not; quoted or not).
#[wasm_bindgen(unchecked_return_type = "Decoded")]
pub fn decode(
    #[wasm_bindgen(unchecked_param_type = "string")] value: JsValue,
    #[wasm_bindgen(unchecked_optional_param_type = "DecodeOptions")] options: JsValue,
) -> core::result::Result<JsValue, JsValue> {
    Ok(decode_value(&value, &options)?)
}

fn decode_value(value: &JsValue, options: &JsValue) -> Result<JsValue> {
    let value = convert::string(value, "value")?;
    let opts = convert::object(
        convert::from_js(options, "options")?,
        "options",
        &["keys", "now"],
    )?;
    let ring = convert::keys(&opts)?;
    let now = convert::now(&opts)?;
    let d = cookie::decode(&value, &ring).map_err(|error| Thrown::Decode {
        value: value.clone(),
        error,
    })?;
    Ok(decoded_json(&d, now))
}

fn session_json(c: &SessionCookie, format: Format, signature: Signature) -> convert::Out {
    let (state, verified, key) = match signature {
        Signature::Unsigned => ("unsigned", "null", None),
        Signature::Valid { key } => ("valid", "true", Some(key as u64)),
        Signature::Invalid => ("invalid", "false", None),
        Signature::Unchecked => ("unchecked", "null", None),
    };
    let addresses = c
        .addresses
        .as_slice()
        .iter()
        .map(|a| convert::json_string(&a.to_string()));
    convert::Out::new()
        .str("format", format.as_str())
        .raw("addresses", &convert::array(addresses))
        .opt_str("cluster", c.cluster.as_deref())
        .num("expires", c.expires)
        .bool("signed", signature != Signature::Unsigned)
        .raw("verified", verified)
        .str("signature", state)
        .num("key", key)
}

fn decoded_json(d: &Decoded, now: u64) -> JsValue {
    session_json(&d.cookie, d.format, d.signature)
        .bool("expired", d.cookie.is_expired(now))
        .bool("quoted", d.quoted)
        .bool("padded", d.padded)
        .done()
}

/// Encodes a session cookie and returns its value (base64, padded).
#[wasm_bindgen]
pub fn encode(
    #[wasm_bindgen(unchecked_param_type = "EncodeInput")] input: JsValue,
) -> core::result::Result<String, JsValue> {
    Ok(encode_value(&input)?)
}

fn encode_value(input: &JsValue) -> Result<String> {
    let known = [
        "addresses",
        "cluster",
        "ttl",
        "expires",
        "format",
        "keys",
        "now",
        "nonce",
    ];
    let m = convert::object(convert::from_js(input, "input")?, "", &known)?;
    let list = convert::opt_strings(&m, "addresses")?.unwrap_or_default();
    let addresses = AddressList::new(convert::addresses(&list, "addresses")?)
        .ok_or_else(|| ConfigError::new("addresses", "", Problem::Missing))?;
    let format = match convert::opt_string(&m, "format")? {
        None => Format::default(),
        Some(f) => f.parse().map_err(|_| {
            ConfigError::new("format", f, Problem::OneOf("envoy, grpc, legacy, sealed"))
        })?,
    };
    let explicit = convert::opt_epoch(&m, "expires")?;
    let expires = match (ttl(&m)?, explicit) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new("expires", "", Problem::Conflict("ttl")).into())
        }
        (Some(ttl), None) => format.expiry_after(ttl, convert::now(&m)?),
        (None, explicit) => explicit,
    };
    let ring = convert::keys(&m)?;
    let cookie = SessionCookie {
        addresses,
        cluster: convert::opt_string(&m, "cluster")?.map(String::from),
        expires,
    };
    match ring.signer() {
        Some(key) if format.is_sealed() => {
            cookie::sealed::seal(&cookie, key, &convert::nonce(&m)?).map_err(Thrown::Encode)
        }
        _ => cookie::encode(&cookie, format, ring.signer()).map_err(Thrown::Encode),
    }
}

/// `ttl` as seconds (a number) or a protobuf duration string.
fn ttl(m: &Map<String, Value>) -> Result<Option<core::time::Duration>> {
    let text = match m.get("ttl") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        // Numbers go through the same parser, so the same range checks apply.
        Some(Value::Number(n)) => format!("{n}s"),
        Some(other) => {
            return Err(convert::wrong_type(
                "ttl",
                other,
                "seconds or a duration such as \"120s\"",
            ))
        }
    };
    duration::parse(&text)
        .map(Some)
        .map_err(|e| ConfigError::new("ttl", &text, Problem::Duration(e)).into())
}

/// Finds the session a request's `Cookie` header(s) pin it to, under a
/// session configuration. In header mode `header` is the session header's
/// value instead.
#[wasm_bindgen(js_name = sessionFromCookieHeader, unchecked_return_type = "SessionLookup")]
pub fn session_from_cookie_header(
    #[wasm_bindgen(unchecked_param_type = "string | string[] | null | undefined")] header: JsValue,
    #[wasm_bindgen(unchecked_param_type = "SessionConfig | string")] config: JsValue,
    #[wasm_bindgen(unchecked_optional_param_type = "LookupOptions")] options: JsValue,
) -> core::result::Result<JsValue, JsValue> {
    let session = JsSession::new(config)?;
    let r = (|| {
        let opts = convert::object(
            convert::from_js(&options, "options")?,
            "options",
            &["path", "now"],
        )?;
        let header = convert::from_js(&header, "header")?;
        let mut values = strings_or_one(&header, "header")?;
        let mut req = SessionRequest {
            path: convert::opt_string(&opts, "path")?.unwrap_or("/"),
            ..SessionRequest::default()
        };
        if session.inner.header_name().is_some() {
            req.header = values.drain(..).next();
        } else {
            req.cookies = &values;
        }
        session.lookup_json(&req, convert::now(&opts)?)
    })();
    Ok(r?)
}

/// Renders a `Set-Cookie` value for a cookie value. `config` is a session
/// configuration (style from its `format`: gRPC C-core's order for "grpc",
/// Envoy's otherwise) or a bare cookie spec (Envoy's style unless `style`).
#[wasm_bindgen(js_name = renderSetCookie)]
pub fn render_set_cookie(
    #[wasm_bindgen(unchecked_param_type = "SessionConfig | CookieSpec | string")] config: JsValue,
    #[wasm_bindgen(unchecked_param_type = "string")] value: JsValue,
    #[wasm_bindgen(unchecked_optional_param_type = "\"envoy\" | \"grpc\"")] style: JsValue,
) -> core::result::Result<String, JsValue> {
    Ok(render(&config, &value, &style)?)
}

fn render(config: &JsValue, value: &JsValue, style: &JsValue) -> Result<String> {
    let v = config_value(config)?;
    let is_session = v
        .as_object()
        .is_some_and(|o| o.contains_key("cookie") || o.contains_key("header"));
    let (spec, default_style) = if is_session {
        let (c, _) = SessionConfig::from_json_value(&v, &[])?;
        match c.mode {
            SessionMode::Cookie(spec) => (spec, set_cookie::Style::for_format(c.format)),
            SessionMode::Header { .. } => {
                return Err(ConfigError::new("cookie", "", Problem::Missing).into())
            }
        }
    } else {
        (config::cookie_spec(&v)?, set_cookie::Style::Envoy)
    };
    let style = match convert::from_js(style, "style")? {
        Value::Null => default_style,
        Value::String(s) if s == "envoy" => set_cookie::Style::Envoy,
        Value::String(s) if s == "grpc" => set_cookie::Style::Grpc,
        Value::String(s) => {
            return Err(ConfigError::new("style", &s, Problem::OneOf("envoy, grpc")).into())
        }
        other => return Err(convert::wrong_type("style", &other, "a string")),
    };
    let value = convert::string(value, "value")?;
    Ok(spec.render(&value, style)?)
}

/// A configuration given as an object or as its JSON text.
fn config_value(config: &JsValue) -> Result<Value> {
    match config.as_string() {
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| ConfigError::new("", "", Problem::Json(e.to_string())).into()),
        None => convert::from_js(config, "config"),
    }
}

/// Whether a cookie with `Path=cookiePath` applies to `requestPath`
/// (RFC 6265 path-match; a `?` or `#` right after the path counts as a
/// boundary, as in Envoy).
#[wasm_bindgen(js_name = pathMatches)]
pub fn path_matches(
    #[wasm_bindgen(js_name = cookiePath, unchecked_param_type = "string")] cookie_path: JsValue,
    #[wasm_bindgen(js_name = requestPath, unchecked_param_type = "string")] request_path: JsValue,
) -> core::result::Result<bool, JsValue> {
    let c = convert::string(&cookie_path, "cookiePath")?;
    let r = convert::string(&request_path, "requestPath")?;
    Ok(path::path_matches(&c, &r))
}

/// The `name=value` pairs of one `Cookie` header value, in order (what the
/// session lookup searches).
#[wasm_bindgen(js_name = cookiePairs, unchecked_return_type = "CookiePair[]")]
pub fn cookie_pairs(
    #[wasm_bindgen(unchecked_param_type = "string")] header: JsValue,
) -> core::result::Result<JsValue, JsValue> {
    let header = convert::string(&header, "header")?;
    let pairs = cookie_header::pairs(&header).map(|(name, value)| {
        convert::Out::new()
            .str("name", name)
            .str("value", value)
            .text()
    });
    Ok(convert::parse(&convert::array(pairs)))
}

/// The value of the first cookie called `name` across a request's `Cookie`
/// header values (in the order received), as sent; `null` when absent.
#[wasm_bindgen(js_name = findCookie, unchecked_return_type = "string | null")]
pub fn find_cookie(
    #[wasm_bindgen(unchecked_param_type = "string | string[]")] headers: JsValue,
    #[wasm_bindgen(unchecked_param_type = "string")] name: JsValue,
) -> core::result::Result<JsValue, JsValue> {
    let name = convert::string(&name, "name")?;
    let headers = convert::from_js(&headers, "headers")?;
    let list = strings_or_one(&headers, "headers")?;
    Ok(match cookie_header::find(list.iter().copied(), &name) {
        Some(v) => JsValue::from_str(v),
        None => JsValue::NULL,
    })
}

/// Reads a `Set-Cookie` value as a browser does (RFC 6265 §5.2); `null`
/// when a browser would ignore it (no `name=` first).
#[wasm_bindgen(js_name = parseSetCookie, unchecked_return_type = "ReceivedSetCookie | null")]
pub fn parse_set_cookie(
    #[wasm_bindgen(unchecked_param_type = "string")] header: JsValue,
) -> core::result::Result<JsValue, JsValue> {
    let header = convert::string(&header, "header")?;
    let Some(r) = set_cookie::parse(&header) else {
        return Ok(JsValue::NULL);
    };
    let attributes = r.attributes.iter().map(|(name, value)| {
        convert::Out::new()
            .str("name", name)
            .str("value", value)
            .bool("known", set_cookie::is_attribute_name(name))
            .text()
    });
    Ok(convert::Out::new()
        .str("name", r.name)
        .str("value", r.value)
        .raw("attributes", &convert::array(attributes))
        .done())
}

/// A validated session configuration and the two decisions made with it:
/// where a request goes (`lookup`) and what its response carries
/// (`respond`). Build it once and reuse it.
#[wasm_bindgen(js_name = Session)]
pub struct JsSession {
    inner: Session,
}

#[wasm_bindgen(js_class = Session)]
impl JsSession {
    /// Parses and validates a session configuration (an object or its JSON text).
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_param_type = "SessionConfig | string")] config: JsValue,
    ) -> core::result::Result<JsSession, JsValue> {
        let r: Result<JsSession> = (|| {
            let (c, _) = SessionConfig::from_json_value(&config_value(&config)?, &[])?;
            Ok(JsSession {
                inner: Session::new(c)?,
            })
        })();
        Ok(r?)
    }

    /// The session cookie's name (cookie mode), else `undefined`.
    #[wasm_bindgen(getter, js_name = cookieName)]
    pub fn cookie_name(&self) -> Option<String> {
        self.inner.cookie_name().map(String::from)
    }

    /// The session header's name (header mode, lowercase), else `undefined`.
    #[wasm_bindgen(getter, js_name = headerName)]
    pub fn header_name(&self) -> Option<String> {
        self.inner.header_name().map(String::from)
    }

    /// Envoy's `strict`: a pinned host that cannot be used means 503.
    #[wasm_bindgen(getter)]
    pub fn strict(&self) -> bool {
        self.inner.strict()
    }

    /// Where a request goes, at `now` (epoch seconds; default the clock).
    #[wasm_bindgen(unchecked_return_type = "SessionLookup")]
    pub fn lookup(
        &self,
        #[wasm_bindgen(unchecked_param_type = "SessionRequest")] request: JsValue,
        now: Option<f64>,
    ) -> core::result::Result<JsValue, JsValue> {
        let r = (|| {
            let now = epoch_arg(now)?;
            let v = convert::from_js(&request, "request")?;
            with_request(v, |r| self.lookup_json(r, now))
        })();
        Ok(r?)
    }

    /// What the response to `request` carries once it was `served`: a
    /// header to add, or `null` (the session already names that host).
    #[wasm_bindgen(unchecked_return_type = "Emit | null")]
    pub fn respond(
        &self,
        #[wasm_bindgen(unchecked_param_type = "SessionRequest")] request: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Served")] served: JsValue,
        now: Option<f64>,
    ) -> core::result::Result<JsValue, JsValue> {
        let r = (|| {
            let now = epoch_arg(now)?;
            let v = convert::from_js(&request, "request")?;
            let lookup = with_request(v, |r| Ok(self.inner.lookup(r, now)))?;
            self.respond_to(&lookup, &served, now)
        })();
        Ok(r?)
    }

    /// The header that pins a client to the host that `served`, whatever the
    /// request carried; `null` when no host is known or it failed to connect.
    #[wasm_bindgen(unchecked_return_type = "Emit | null")]
    pub fn mint(
        &self,
        #[wasm_bindgen(unchecked_param_type = "Served")] served: JsValue,
        now: Option<f64>,
    ) -> core::result::Result<JsValue, JsValue> {
        let r = (|| {
            let now = epoch_arg(now)?;
            // A request without a session: core mints for the host that served.
            self.respond_to(&Lookup::Miss(Miss::Absent), &served, now)
        })();
        Ok(r?)
    }
}

impl JsSession {
    fn respond_to(&self, lookup: &Lookup, served: &JsValue, now: u64) -> Result<JsValue> {
        let m = convert::object(
            convert::from_js(served, "served")?,
            "served",
            &["address", "otherAddresses", "cluster", "connectFailed"],
        )?;
        let address = match convert::opt_string(&m, "address")? {
            Some(a) => Some(
                tether_core::address::parse(a).map_err(|error| Thrown::Address {
                    field: "address".into(),
                    error,
                })?,
            ),
            None => None,
        };
        let others = convert::addresses(
            &convert::opt_strings(&m, "otherAddresses")?.unwrap_or_default(),
            "otherAddresses",
        )?;
        let served = Served {
            address,
            other_addresses: &others,
            cluster: convert::opt_string(&m, "cluster")?,
            connect_failed: convert::opt_bool(&m, "connectFailed")?.unwrap_or(false),
        };
        let mut nonce = [0; cookie::sealed::NONCE_LEN];
        if self.inner.config().format.is_sealed() && self.inner.wants_cookie(lookup, &served) {
            convert::random(&mut nonce)?;
        }
        Ok(emit_json(
            self.inner.respond_with(lookup, &served, now, &nonce),
        ))
    }

    fn lookup_json(&self, req: &SessionRequest<'_>, now: u64) -> Result<JsValue> {
        let lookup = self.inner.lookup(req, now);
        let (outcome, reason) = match &lookup {
            Lookup::Bypass => ("bypass", None),
            Lookup::Pinned(_) => ("pinned", None),
            Lookup::Miss(m) => (
                "miss",
                Some(match m {
                    Miss::Absent => "absent",
                    Miss::Invalid(_) => "invalid",
                    Miss::Expired(_) => "expired",
                    Miss::BadMac => "bad-mac",
                    Miss::Unsigned => "unsigned",
                    Miss::Unsealed => "unsealed",
                }),
            ),
        };
        let error = match &lookup {
            Lookup::Miss(Miss::Invalid(e)) => Some(e.to_string()),
            _ => None,
        };
        let expired_at = match &lookup {
            Lookup::Miss(Miss::Expired(at)) => Some(*at),
            _ => None,
        };
        let session = match &lookup {
            Lookup::Pinned(p) => session_json(&p.cookie, p.format, p.signature).text(),
            _ => String::from("null"),
        };
        Ok(convert::Out::new()
            .str("outcome", outcome)
            .opt_str("reason", reason)
            .opt_str("error", error.as_deref())
            .num("expiredAt", expired_at)
            .raw("session", &session)
            .opt_str("overrideHost", lookup.override_header_value().as_deref())
            .done())
    }
}

/// A `now` argument: epoch seconds, or the clock when absent.
fn epoch_arg(now: Option<f64>) -> Result<u64> {
    let mut m = Map::new();
    if let Some(n) = now {
        // NaN and infinities have no JSON number. Naming them here rather
        // than printing the f64 keeps float formatting out of the module.
        let n = serde_json::Number::from_f64(n).ok_or_else(|| {
            let shown = match n {
                _ if n.is_nan() => "NaN",
                _ if n > 0.0 => "Infinity",
                _ => "-Infinity",
            };
            ConfigError::new("now", shown, Problem::WrongType("epoch seconds"))
        })?;
        m.insert("now".into(), Value::Number(n));
    }
    convert::now(&m)
}

/// Runs `f` with a core request built from `{path, cookies, header}`.
fn with_request<T>(v: Value, f: impl FnOnce(&SessionRequest<'_>) -> Result<T>) -> Result<T> {
    let m = convert::object(v, "request", &["path", "cookies", "header"])?;
    let cookies = match m.get("cookies") {
        Some(v) => strings_or_one(v, "cookies")?,
        None => Vec::new(),
    };
    let req = SessionRequest {
        path: convert::opt_string(&m, "path")?.unwrap_or("/"),
        cookies: &cookies,
        header: convert::opt_string(&m, "header")?,
    };
    f(&req)
}

/// A string or a list of strings (header values); `null` is none.
fn strings_or_one<'a>(v: &'a Value, field: &str) -> Result<Vec<&'a str>> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.as_str()]),
        Value::Array(list) => list
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_str()
                    .ok_or_else(|| convert::wrong_type(&format!("{field}[{i}]"), item, "a string"))
            })
            .collect(),
        other => Err(convert::wrong_type(
            field,
            other,
            "a string or a list of strings",
        )),
    }
}

fn emit_json(emit: Option<Emit>) -> JsValue {
    match emit {
        None => JsValue::NULL,
        Some(Emit::SetCookie(value)) => convert::Out::new()
            .str("header", "set-cookie")
            .str("value", &value)
            .done(),
        Some(Emit::Header { name, value }) => convert::Out::new()
            .str("header", &name)
            .str("value", &value)
            .done(),
    }
}
