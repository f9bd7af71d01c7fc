//! Moving values between JavaScript and Rust, and turning core's errors into
//! JavaScript `Error`s. Nothing here decides anything about a cookie.
//!
//! Inputs cross the boundary as JSON: `JSON.stringify` on the JavaScript side,
//! `serde_json` (already part of tether-core for its config parser) on this
//! side. Outputs are plain objects built as JSON text and parsed once.
//! For values the size of a cookie this costs microseconds, and it keeps the
//! `.wasm` small: no second JSON encoder, no JavaScript glue of our own.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{Map, Value};
use tether_core::address::{self, AddressError};
use tether_core::config::{ConfigError, Problem};
use tether_core::cookie::sealed::NONCE_LEN;
use tether_core::cookie::{DecodeError, EncodeError, KeyRing};
use wasm_bindgen::prelude::*;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = JSON, js_name = stringify, catch)]
    fn json_stringify(value: &JsValue) -> core::result::Result<JsValue, JsValue>;

    #[wasm_bindgen(js_namespace = JSON, js_name = parse)]
    fn json_parse(text: &str) -> JsValue;

    #[wasm_bindgen(js_namespace = Date, js_name = now)]
    fn date_now() -> f64;

    // The Web Crypto API's CSPRNG (browsers, Node 19+, Deno, workers).
    #[wasm_bindgen(js_namespace = crypto, js_name = getRandomValues, catch)]
    fn get_random_values(bytes: &mut [u8]) -> core::result::Result<JsValue, JsValue>;

    /// A JavaScript `Error`, so thrown errors have a stack and `instanceof Error`.
    #[wasm_bindgen(js_name = Error)]
    type JsErrorObject;

    #[wasm_bindgen(constructor, js_class = "Error")]
    fn new(message: &str) -> JsErrorObject;

    #[wasm_bindgen(method, setter = code, js_class = "Error")]
    fn set_code(this: &JsErrorObject, code: &str);
}

/// An error to throw into JavaScript. Every message names the field and
/// the value, using core's own error text.
pub enum Thrown {
    /// A configuration or argument error (`code` "config").
    Config(ConfigError),
    /// A cookie value that names no session (`code` is core's kind).
    Decode {
        /// The value as given.
        value: String,
        /// Why it names no session.
        error: DecodeError,
    },
    /// A cookie the chosen format cannot carry (`code` "encode").
    Encode(EncodeError),
    /// An address that is not `ip:port` (`code` "address").
    Address {
        /// Where it was, e.g. `addresses[1]`.
        field: String,
        /// Core's error, which quotes the value.
        error: AddressError,
    },
}

impl Thrown {
    /// The short kind name put on the `Error` as `code`.
    pub fn code(&self) -> &'static str {
        match self {
            Thrown::Config(_) => "config",
            Thrown::Decode { error, .. } => error.code(),
            Thrown::Encode(_) => "encode",
            Thrown::Address { .. } => "address",
        }
    }

    /// The error message.
    pub fn message(&self) -> String {
        match self {
            Thrown::Config(e) => e.to_string(),
            Thrown::Decode { value, error } => format!("value {value:?}: {error}"),
            Thrown::Encode(e) => e.to_string(),
            Thrown::Address { field, error } => format!("{field}: {error}"),
        }
    }
}

impl From<ConfigError> for Thrown {
    fn from(e: ConfigError) -> Self {
        Thrown::Config(e)
    }
}

impl From<Thrown> for JsValue {
    fn from(t: Thrown) -> JsValue {
        let e = JsErrorObject::new(&t.message());
        e.set_code(t.code());
        e.into()
    }
}

/// A result whose error becomes a thrown JavaScript `Error`.
pub type Result<T> = core::result::Result<T, Thrown>;

/// `field: <value> is not <what>`.
pub fn wrong_type(field: &str, value: &Value, what: &'static str) -> Thrown {
    ConfigError::new(field, &value.to_string(), Problem::WrongType(what)).into()
}

/// Reads a JavaScript value as JSON. `undefined`, `null` and values JSON has
/// no form for (functions) read as `null`, i.e. "not given".
pub fn from_js(v: &JsValue, field: &str) -> Result<Value> {
    if v.is_undefined() || v.is_null() {
        return Ok(Value::Null);
    }
    let text = json_stringify(v).map_err(|_| {
        // BigInt and cyclic objects: JSON.stringify throws.
        Thrown::from(ConfigError::new(
            field,
            "<not JSON>",
            Problem::WrongType("plain JSON data"),
        ))
    })?;
    match text.as_string() {
        None => Ok(Value::Null),
        Some(text) => serde_json::from_str(&text)
            .map_err(|e| ConfigError::new(field, "", Problem::Json(e.to_string())).into()),
    }
}

/// A result object under construction, as JSON text. One `JSON.parse` at the
/// end is several times faster than setting fields across the boundary one
/// by one, and the string escaping is serde_json's, linked in already.
pub struct Out(String);

impl Out {
    /// An empty object.
    pub fn new() -> Out {
        Out(String::from("{"))
    }

    /// Sets `key` (one of ours: never needs escaping) to JSON text.
    pub fn raw(mut self, key: &str, json: &str) -> Out {
        if self.0.len() > 1 {
            self.0.push(',');
        }
        self.0.push('"');
        self.0.push_str(key);
        self.0.push_str("\":");
        self.0.push_str(json);
        self
    }

    /// Sets `key` to a string.
    pub fn str(self, key: &str, value: &str) -> Out {
        self.raw(key, &json_string(value))
    }

    /// Sets `key` to a string or `null`.
    pub fn opt_str(self, key: &str, value: Option<&str>) -> Out {
        match value {
            Some(v) => self.str(key, v),
            None => self.raw(key, "null"),
        }
    }

    /// Sets `key` to a boolean.
    pub fn bool(self, key: &str, value: bool) -> Out {
        self.raw(key, if value { "true" } else { "false" })
    }

    /// Sets `key` to a number or `null`. Epoch seconds and indexes are exact
    /// in JavaScript up to 2^53.
    pub fn num(self, key: &str, value: Option<u64>) -> Out {
        match value {
            Some(n) => self.raw(key, &n.to_string()),
            None => self.raw(key, "null"),
        }
    }

    /// The object as JSON text, to nest in another.
    pub fn text(mut self) -> String {
        self.0.push('}');
        self.0
    }

    /// The finished object.
    pub fn done(self) -> JsValue {
        parse(&self.text())
    }
}

/// A string as JSON text.
pub fn json_string(s: &str) -> String {
    // Serialising a str cannot fail.
    serde_json::to_string(s).unwrap_or_else(|_| String::from("null"))
}

/// A JSON array of JSON texts.
pub fn array<I: IntoIterator<Item = String>>(items: I) -> String {
    let mut out = String::from("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&item);
    }
    out.push(']');
    out
}

/// Hands JSON text built here to JavaScript.
pub fn parse(json: &str) -> JsValue {
    json_parse(json)
}

/// A required string argument.
pub fn string(v: &JsValue, field: &str) -> Result<String> {
    if let Some(s) = v.as_string() {
        return Ok(s);
    }
    match from_js(v, field)? {
        Value::String(s) => Ok(s),
        Value::Null => Err(ConfigError::new(field, "", Problem::Missing).into()),
        other => Err(wrong_type(field, &other, "a string")),
    }
}

/// An options object (absent reads as empty); unknown fields are errors so
/// a misspelt option does not pass silently.
pub fn object(v: Value, field: &str, known: &[&str]) -> Result<Map<String, Value>> {
    let map = match v {
        Value::Null => Map::new(),
        Value::Object(m) => m,
        other => return Err(wrong_type(field, &other, "an object")),
    };
    if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
        let at = if field.is_empty() {
            k.clone()
        } else {
            format!("{field}.{k}")
        };
        return Err(ConfigError::new(&at, "", Problem::Unknown).into());
    }
    Ok(map)
}

/// An optional string field.
pub fn opt_string<'a>(m: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(key, other, "a string")),
    }
}

/// An optional boolean field.
pub fn opt_bool(m: &Map<String, Value>, key: &str) -> Result<Option<bool>> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(key, other, "true or false")),
    }
}

/// An optional list of strings (a single string is not accepted: a list
/// makes the order of keys and addresses explicit).
pub fn opt_strings<'a>(m: &'a Map<String, Value>, key: &str) -> Result<Option<Vec<&'a str>>> {
    let list = match m.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(other) => return Err(wrong_type(key, other, "a list of strings")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        match item {
            Value::String(s) => out.push(s.as_str()),
            other => return Err(wrong_type(&format!("{key}[{i}]"), other, "a string")),
        }
    }
    Ok(Some(out))
}

/// An optional epoch-seconds field; fractions (as `Date.now() / 1000`
/// gives) are dropped.
pub fn opt_epoch(m: &Map<String, Value>, key: &str) -> Result<Option<u64>> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(secs), _) => Ok(Some(secs)),
            (None, Some(f)) if f.is_finite() && f >= 0.0 => Ok(Some(f as u64)),
            _ => Err(wrong_type(key, &Value::Number(n.clone()), "epoch seconds")),
        },
        Some(other) => Err(wrong_type(key, other, "epoch seconds")),
    }
}

/// `now` from the options, else the clock.
pub fn now(m: &Map<String, Value>) -> Result<u64> {
    // `as` saturates: a clock before 1970 reads as 0.
    Ok(opt_epoch(m, "now")?.unwrap_or_else(|| (date_now() / 1000.0) as u64))
}

/// A sealed value's nonce: the optional `nonce` field (24 hex digits, for
/// reproducible values), else random bytes from `crypto.getRandomValues`.
pub fn nonce(m: &Map<String, Value>) -> Result<[u8; NONCE_LEN]> {
    let mut nonce = [0; NONCE_LEN];
    let Some(text) = opt_string(m, "nonce")? else {
        random(&mut nonce)?;
        return Ok(nonce);
    };
    let wrong = || ConfigError::new("nonce", text, Problem::WrongType("24 hex digits"));
    if text.len() != 2 * NONCE_LEN || !text.is_ascii() {
        return Err(wrong().into());
    }
    for (byte, pair) in nonce.iter_mut().zip(text.as_bytes().chunks(2)) {
        let pair = core::str::from_utf8(pair).map_err(|_| wrong())?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| wrong())?;
    }
    Ok(nonce)
}

/// Random bytes from `crypto.getRandomValues`; an error where the host
/// has no Web Crypto (a sealed value is never written with a fixed nonce
/// behind the caller's back).
pub fn random(bytes: &mut [u8]) -> Result<()> {
    get_random_values(bytes).map(|_| ()).map_err(|_| {
        Thrown::from(ConfigError::new(
            "nonce",
            "crypto.getRandomValues",
            Problem::WrongType("available (a sealed value needs random bytes)"),
        ))
    })
}

/// The key ring from an optional `keys` list of base64 secrets.
pub fn keys(m: &Map<String, Value>) -> Result<KeyRing> {
    match opt_strings(m, "keys")? {
        None => Ok(KeyRing::empty()),
        Some(list) => Ok(KeyRing::from_base64(list)?),
    }
}

/// Parses `ip:port` addresses, naming the entry on error.
pub fn addresses(list: &[&str], field: &str) -> Result<Vec<core::net::SocketAddr>> {
    list.iter()
        .enumerate()
        .map(|(i, a)| {
            address::parse(a).map_err(|error| Thrown::Address {
                field: format!("{field}[{i}]"),
                error,
            })
        })
        .collect()
}
