//! Session configuration, mirroring Envoy's `StatefulSession` with tether's
//! additions, and its JSON form.
//!
//! ```json
//! {
//!   "cookie": { "name": "global-session-cookie", "path": "/", "ttl": "120s",
//!               "attributes": [ { "name": "SameSite", "value": "Lax" } ] },
//!   "strict": false,
//!   "format": "envoy",
//!   "keys": [ "<base64 secret, at least 16 bytes>" ],
//!   "accept_unsigned": false
//! }
//! ```
//!
//! Exactly one of `cookie` (Envoy's `CookieBasedSessionState`) and `header`
//! (`{ "name": "x-session" }`, Envoy's `HeaderBasedSessionState`) is given.
//! `format` is what tether writes: `envoy` (default in cookie mode), `grpc` or
//! `legacy` (default in header mode, the form Envoy's header mode reads).
//! `keys` turns on signing (format `envoy`) or sealing (format `sealed`,
//! which needs them, each at least 32 bytes); with keys, unsigned cookies
//! (with `sealed`: any value that is not sealed) are ignored unless
//! `accept_unsigned` is true (for a migration; they are then re-issued). Validation follows gRPC C-core's rules (cookie name
//! required, ttl within `[0s, 315576000000s]`) and every error names the field
//! and the value.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::time::Duration;
use serde_json::{Map, Value};

use crate::cookie::{Format, KeyRing};
use crate::duration;
use crate::http::set_cookie::{Attribute, CookieSpec};
use crate::http::syntax::is_token;

pub use crate::error::{ConfigError, Problem};

/// Where the session state travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionMode {
    /// A cookie (Envoy's `CookieBasedSessionState`).
    Cookie(CookieSpec),
    /// A request/response header (Envoy's `HeaderBasedSessionState`); the
    /// name is stored lowercase.
    Header {
        /// Header name.
        name: String,
    },
}

/// A session configuration. Build one with [`SessionConfig::cookie`] or
/// [`SessionConfig::header`] (or from JSON) and check it with
/// [`SessionConfig::validate`]; [`crate::Session::new`] does that too.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Cookie or header.
    pub mode: SessionMode,
    /// Envoy's `strict`: a session naming an unusable host is refused (503)
    /// instead of falling back to load balancing. Applied by the adapter that
    /// knows which hosts are usable.
    pub strict: bool,
    /// The format tether writes (it reads all of them).
    pub format: Format,
    /// Signing keys (format `envoy`) or sealing keys (format `sealed`);
    /// empty for unsigned cookies.
    pub keys: KeyRing,
    /// With keys: still honour cookies that carry no MAC (with `sealed`:
    /// that are not sealed), and re-issue them.
    pub accept_unsigned: bool,
}

impl SessionConfig {
    /// Cookie mode, `envoy` format, not strict, unsigned.
    pub fn cookie(spec: CookieSpec) -> Self {
        SessionConfig {
            mode: SessionMode::Cookie(spec),
            strict: false,
            format: Format::Envoy,
            keys: KeyRing::empty(),
            accept_unsigned: false,
        }
    }

    /// Header mode, `legacy` format (what Envoy's header mode reads).
    pub fn header(name: &str) -> Result<Self, ConfigError> {
        if name.is_empty() {
            return Err(ConfigError::new("header.name", name, Problem::Missing));
        }
        if !is_token(name) {
            return Err(ConfigError::new("header.name", name, Problem::NotToken));
        }
        Ok(SessionConfig {
            mode: SessionMode::Header {
                name: name.to_ascii_lowercase(),
            },
            strict: false,
            format: Format::Legacy,
            keys: KeyRing::empty(),
            accept_unsigned: false,
        })
    }

    /// Checks the combination of fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.format.is_sealed() {
            if self.keys.is_empty() {
                return Err(ConfigError::new(
                    "format",
                    self.format.as_str(),
                    Problem::NeedsKeys,
                ));
            }
            return self.keys.check_sealing();
        }
        if !self.keys.is_empty() && !self.format.carries_mac() {
            return Err(ConfigError::new(
                "format",
                self.format.as_str(),
                Problem::CannotSign,
            ));
        }
        Ok(())
    }

    /// Parses the JSON form. Fields named in `extra` are not tether-core's
    /// (an adapter's own settings, e.g. the plugin's `override_header`); they
    /// are returned untouched. Any other unknown field is an error.
    pub fn from_json(
        text: &str,
        extra: &[&str],
    ) -> Result<(SessionConfig, Map<String, Value>), ConfigError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ConfigError::new("", "", Problem::Json(e.to_string())))?;
        SessionConfig::from_json_value(&value, extra)
    }

    /// [`SessionConfig::from_json`] for an already parsed JSON value.
    pub fn from_json_value(
        value: &Value,
        extra: &[&str],
    ) -> Result<(SessionConfig, Map<String, Value>), ConfigError> {
        let obj = object(value, "")?;
        let mut extras = Map::new();
        for (k, v) in obj {
            let known = [
                "cookie",
                "header",
                "strict",
                "format",
                "keys",
                "accept_unsigned",
            ];
            if extra.contains(&k.as_str()) {
                extras.insert(k.clone(), v.clone());
            } else if !known.contains(&k.as_str()) {
                return Err(ConfigError::new(k, "", Problem::Unknown));
            }
        }
        let mut config = match (obj.get("cookie"), obj.get("header")) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new("header", "", Problem::Conflict("cookie")))
            }
            (Some(c), None) => {
                SessionConfig::cookie(cookie_spec(c).map_err(|e| e.within("cookie"))?)
            }
            (None, Some(h)) => {
                let h = object(h, "header")?;
                only(h, &["name"]).map_err(|e| e.within("header"))?;
                SessionConfig::header(string_field(h.get("name"), "header.name")?.unwrap_or(""))?
            }
            (None, None) => return Err(ConfigError::new("cookie", "", Problem::Missing)),
        };
        if let Some(strict) = boolean(obj.get("strict"), "strict")? {
            config.strict = strict;
        }
        if let Some(f) = string_field(obj.get("format"), "format")? {
            config.format = f.parse().map_err(|_| {
                ConfigError::new("format", f, Problem::OneOf("envoy, grpc, legacy, sealed"))
            })?;
        }
        if let Some(keys) = obj.get("keys") {
            let list = keys.as_array().ok_or_else(|| {
                // Whatever stands there may be a secret: never echoed.
                ConfigError::new("keys", "<not shown>", Problem::WrongType("a list"))
            })?;
            let mut secrets = Vec::with_capacity(list.len());
            for (i, k) in list.iter().enumerate() {
                let field = format!("keys[{i}]");
                secrets.push(k.as_str().ok_or_else(|| {
                    ConfigError::new(&field, "<not shown>", Problem::WrongType("a string"))
                })?);
            }
            config.keys = KeyRing::from_base64(secrets)?;
        }
        if let Some(a) = boolean(obj.get("accept_unsigned"), "accept_unsigned")? {
            config.accept_unsigned = a;
        }
        config.validate()?;
        Ok((config, extras))
    }
}

/// Parses `{name, path, ttl, attributes}`; field names relative to the cookie.
pub fn cookie_spec(value: &Value) -> Result<CookieSpec, ConfigError> {
    let c = object(value, "")?;
    only(c, &["name", "path", "ttl", "attributes"])?;
    let name = string_field(c.get("name"), "name")?.unwrap_or("");
    let path = string_field(c.get("path"), "path")?.unwrap_or("");
    let ttl = match string_field(c.get("ttl"), "ttl")? {
        Some(t) => {
            duration::parse(t).map_err(|e| ConfigError::new("ttl", t, Problem::Duration(e)))?
        }
        None => Duration::ZERO,
    };
    let mut attributes = Vec::new();
    if let Some(list) = c.get("attributes") {
        let list = list.as_array().ok_or_else(|| {
            ConfigError::new(
                "attributes",
                &list.to_string(),
                Problem::WrongType("a list"),
            )
        })?;
        for (i, a) in list.iter().enumerate() {
            let at = format!("attributes[{i}]");
            let o = object(a, &at)?;
            only(o, &["name", "value"]).map_err(|e| e.within(&at))?;
            let name = string_field(o.get("name"), "name")
                .map_err(|e| e.within(&at))?
                .unwrap_or("");
            let value = string_field(o.get("value"), "value")
                .map_err(|e| e.within(&at))?
                .unwrap_or("");
            attributes.push(Attribute::new(name, value).map_err(|e| e.within(&at))?);
        }
    }
    CookieSpec::new(name, path, ttl, attributes)
}

fn object<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object()
        .ok_or_else(|| ConfigError::new(field, &v.to_string(), Problem::WrongType("an object")))
}

fn only(o: &Map<String, Value>, known: &[&str]) -> Result<(), ConfigError> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ConfigError::new(k, "", Problem::Unknown)),
        None => Ok(()),
    }
}

/// A JSON field that must be a string when present (`null` reads as absent);
/// the error names `field` and the value found. Public for adapters that
/// read their own fields beside the session configuration's.
pub fn string_field<'a>(v: Option<&'a Value>, field: &str) -> Result<Option<&'a str>, ConfigError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ConfigError::new(
            field,
            &other.to_string(),
            Problem::WrongType("a string"),
        )),
    }
}

fn boolean(v: Option<&Value>, field: &str) -> Result<Option<bool>, ConfigError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ConfigError::new(
            field,
            &other.to_string(),
            Problem::WrongType("true or false"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::borrow::ToOwned;

    fn err(json: &str) -> String {
        SessionConfig::from_json(json, &["override_header"])
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn parses_full_cookie_config() {
        let (c, extra) = SessionConfig::from_json(
            r#"{"cookie":{"name":"s","path":"/","ttl":"120s","attributes":[{"name":"SameSite","value":"Lax"},{"name":"Secure"}]},
                "strict":true,"format":"envoy","keys":["MDEyMzQ1Njc4OWFiY2RlZg=="],"override_header":"x-o"}"#,
            &["override_header"],
        )
        .unwrap();
        assert!(c.strict);
        assert_eq!(c.keys.len(), 1);
        assert_eq!(
            extra.get("override_header").and_then(Value::as_str),
            Some("x-o")
        );
        let SessionMode::Cookie(spec) = &c.mode else {
            panic!("cookie mode")
        };
        assert_eq!(spec.ttl(), Duration::from_secs(120));
        assert_eq!(spec.attributes().len(), 2);
    }

    #[test]
    fn header_mode_defaults_to_legacy_lowercase() {
        let (c, _) = SessionConfig::from_json(r#"{"header":{"name":"X-Session"}}"#, &[]).unwrap();
        assert_eq!(c.format, Format::Legacy);
        assert_eq!(
            c.mode,
            SessionMode::Header {
                name: "x-session".into()
            }
        );
    }

    #[test]
    fn errors_name_field_and_value() {
        assert_eq!(
            err(r#"{"cookie":{"name":"s","ttl":"-5s"}}"#),
            r#"cookie.ttl: "-5s" is negative"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":""}}"#),
            "cookie.name: field not present"
        );
        assert_eq!(err(r#"{"cookie":{}}"#), "cookie.name: field not present");
        assert_eq!(err(r#"{}"#), "cookie: field not present");
        assert_eq!(
            err(r#"{"cookie":{"name":"s","ttl":"315576000001s"}}"#),
            r#"cookie.ttl: "315576000001s" is above 315576000000s"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"format":"xml"}"#),
            r#"format: "xml" is not one of envoy, grpc, legacy, sealed"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"stict":true}"#),
            "stict: is not a known field"
        );
        assert_eq!(
            err(
                r#"{"cookie":{"name":"s","attributes":[{"name":"SameSite","value":"Lax"},{"name":"a b"}]}}"#
            ),
            r#"cookie.attributes[1].name: "a b" is not a valid name (RFC 9110 token characters only)"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"keys":["c2hvcnQ="]}"#),
            r#"keys[0]: "<8 characters>" decodes to 5 bytes; a key needs at least 16"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"format":"grpc","keys":["MDEyMzQ1Njc4OWFiY2RlZg=="]}"#),
            r#"format: "grpc" cannot carry a MAC; signing keys need format "envoy""#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"strict":"yes"}"#),
            r#"strict: "yes" is not true or false"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"header":{"name":"h"}}"#),
            "header: cannot be combined with cookie"
        );
        assert!(err("{").starts_with("configuration: is not valid JSON"));
        assert_eq!(err("[]"), "configuration: [] is not an object");
    }

    /// A key written where it does not belong (a string for the list, a
    /// number in it, a short one) is never echoed: the message names the
    /// field, and Debug shows no key either.
    #[test]
    fn keys_never_appear_in_errors_or_debug() {
        let secret = "MDEyMzQ1Njc4OWFiY2RlZg==";
        for json in [
            format!(r#"{{"cookie":{{"name":"s"}},"keys":"{secret}"}}"#),
            format!(r#"{{"cookie":{{"name":"s"}},"keys":{{"k":"{secret}"}}}}"#),
            format!(r#"{{"cookie":{{"name":"s"}},"keys":["{secret}",7]}}"#),
            r#"{"cookie":{"name":"s"},"keys":["c2hvcnQ="]}"#.to_owned(),
            format!(r#"{{"cookie":{{"name":"s"}},"format":"grpc","keys":["{secret}"]}}"#),
        ] {
            let e = SessionConfig::from_json(&json, &[]).unwrap_err();
            let text = format!("{e} {e:?}");
            assert!(
                !text.contains(secret) && !text.contains("c2hvcnQ"),
                "{json}: {text}"
            );
        }
        assert_eq!(
            err(&format!(r#"{{"cookie":{{"name":"s"}},"keys":"{secret}"}}"#)),
            "keys: <not shown> is not a list"
        );
        let (config, _) = SessionConfig::from_json(
            &format!(r#"{{"cookie":{{"name":"s"}},"format":"envoy","keys":["{secret}"]}}"#),
            &[],
        )
        .unwrap();
        let debug = format!("{config:?}");
        assert!(
            !debug.contains(secret) && !debug.contains("0123456789abcdef"),
            "{debug}"
        );
    }
}
