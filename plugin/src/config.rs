//! The plugin's configuration: tether-core's session configuration plus the
//! two settings that say how the plugin hands a session to Envoy.
//!
//! ```json
//! {
//!   "cookie": { "name": "global-session-cookie", "path": "/", "ttl": "120s",
//!               "attributes": [ { "name": "SameSite", "value": "Lax" } ] },
//!   "strict": false,
//!   "format": "envoy",
//!   "keys": [ "<base64 secret>" ],
//!   "accept_unsigned": false,
//!   "override_header": "x-tether-override-host",
//!   "override_encoding": "list"
//! }
//! ```
//!
//! Everything but the last two fields is parsed by
//! [`SessionConfig::from_json`], so the plugin and every other adapter agree
//! on what a configuration means and on the wording of its errors.

use alloc::string::{String, ToString};
use serde_json::{Map, Value};
use tether_core::config::{string_field, Problem};
use tether_core::http::syntax::is_token;
use tether_core::{ConfigError, Session, SessionConfig};

/// The request header the plugin writes when `override_header` is not set.
pub const DEFAULT_OVERRIDE_HEADER: &str = "x-tether-override-host";

/// How the pinned hosts are written into the override header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideEncoding {
    /// `ip:port[,ip:port...]`, read by Envoy's
    /// `envoy.load_balancing_policies.override_host` policy (wiring a).
    List,
    /// Base64 of the primary `ip:port`, read by Envoy's own
    /// `stateful_session` filter in header mode (wiring b).
    SessionHeader,
}

impl OverrideEncoding {
    /// The name used in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideEncoding::List => "list",
            OverrideEncoding::SessionHeader => "session_header",
        }
    }
}

/// A validated plugin configuration.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The session decisions (tether-core).
    pub session: Session,
    /// The request header Envoy reads the pinned hosts from (lowercase).
    pub override_header: String,
    /// How the hosts are written into it.
    pub encoding: OverrideEncoding,
}

impl PluginConfig {
    /// Parses the plugin's JSON configuration. Every error names the field
    /// and the value (tether-core's [`ConfigError`]).
    pub fn from_json(text: &str) -> Result<PluginConfig, ConfigError> {
        let (config, extras) =
            SessionConfig::from_json(text, &["override_header", "override_encoding"])?;
        let override_header = override_header(&extras)?;
        let encoding = match string_field(extras.get("override_encoding"), "override_encoding")? {
            None | Some("list") => OverrideEncoding::List,
            Some("session_header") => OverrideEncoding::SessionHeader,
            Some(other) => {
                return Err(ConfigError::new(
                    "override_encoding",
                    other,
                    Problem::OneOf("list, session_header"),
                ))
            }
        };
        let session = Session::new(config)?;
        // The plugin strips the override header from every request; were it the
        // session header itself, no client could ever present its session.
        if session.header_name() == Some(override_header.as_str()) {
            return Err(ConfigError::new(
                "override_header",
                &override_header,
                Problem::Conflict("header.name"),
            ));
        }
        Ok(PluginConfig {
            session,
            override_header,
            encoding,
        })
    }
}

fn override_header(extras: &Map<String, Value>) -> Result<String, ConfigError> {
    let Some(name) = string_field(extras.get("override_header"), "override_header")? else {
        return Ok(DEFAULT_OVERRIDE_HEADER.to_string());
    };
    if name.is_empty() {
        return Err(ConfigError::new("override_header", name, Problem::Missing));
    }
    if !is_token(name) {
        return Err(ConfigError::new("override_header", name, Problem::NotToken));
    }
    let name = name.to_ascii_lowercase();
    // Removing these from every request would break the session itself.
    if name == "cookie" || name == "host" {
        return Err(ConfigError::new(
            "override_header",
            &name,
            Problem::Conflict("a header the request needs"),
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        PluginConfig::from_json(json).unwrap_err().to_string()
    }

    #[test]
    fn defaults_to_the_override_host_list() {
        let c = PluginConfig::from_json(r#"{"cookie":{"name":"s"}}"#).unwrap();
        assert_eq!(c.override_header, DEFAULT_OVERRIDE_HEADER);
        assert_eq!(c.encoding, OverrideEncoding::List);
        assert_eq!(c.session.cookie_name(), Some("s"));
    }

    #[test]
    fn reads_the_lead_example() {
        let c = PluginConfig::from_json(
            r#"{"cookie":{"name":"global-session-cookie","path":"/","ttl":"120s",
                "attributes":[{"name":"SameSite","value":"Lax"}]},
                "strict":false,"format":"envoy","keys":["MDEyMzQ1Njc4OWFiY2RlZg=="],
                "accept_unsigned":false,"override_header":"X-Pin","override_encoding":"session_header"}"#,
        )
        .unwrap();
        assert_eq!(c.override_header, "x-pin");
        assert_eq!(c.encoding, OverrideEncoding::SessionHeader);
        assert_eq!(c.session.config().keys.len(), 1);
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"override_encoding":"csv"}"#),
            r#"override_encoding: "csv" is not one of list, session_header"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"override_header":"a b"}"#),
            r#"override_header: "a b" is not a valid name (RFC 9110 token characters only)"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"override_header":""}"#),
            "override_header: field not present"
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"override_header":7}"#),
            "override_header: 7 is not a string"
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"override_header":"Cookie"}"#),
            r#"override_header: "cookie" cannot be combined with a header the request needs"#
        );
        assert_eq!(
            err(r#"{"header":{"name":"X-S"},"override_header":"x-s"}"#),
            r#"override_header: "x-s" cannot be combined with header.name"#
        );
        // Core's own errors come through unchanged.
        assert_eq!(
            err(r#"{"cookie":{"name":"s","ttl":"-5s"}}"#),
            r#"cookie.ttl: "-5s" is negative"#
        );
        assert_eq!(
            err(r#"{"cookie":{"name":"s"},"overide_header":"x"}"#),
            "overide_header: is not a known field"
        );
    }
}
