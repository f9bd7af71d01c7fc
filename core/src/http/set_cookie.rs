//! Rendering `Set-Cookie` values, byte for byte the way the peers do.
//!
//! [`Style::Envoy`] (Envoy's stateful session and hash-policy cookies):
//! `name="value"; Max-Age=N; Path=p; <attributes in order>; HttpOnly` with
//! `Max-Age` only when the ttl is at least one second and `Path` only when set.
//!
//! [`Style::Grpc`] (gRPC C-core): `name=value; HttpOnly; Path=p; Max-Age=N`,
//! value unquoted, then any configured attributes (C-core has none).
//!
//! Every name and value is validated when the [`CookieSpec`] is built, so a
//! rendered header can never carry an injected `;`, quote or line break.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::Write as _;
use core::time::Duration;

use super::syntax::{is_attribute_value, is_cookie_value, is_token};
use crate::cookie::Format;
use crate::error::{ConfigError, Problem};

/// Byte order and quoting of a rendered `Set-Cookie`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Style {
    /// Envoy's order, value in double quotes.
    Envoy,
    /// gRPC C-core's order, value bare.
    Grpc,
}

impl Style {
    /// The style that goes with a cookie format: Envoy's for `envoy` (the
    /// peer that writes it), C-core's for `grpc`, and C-core's bare value for
    /// `legacy`, the one format all four peers read: Envoy's filter takes a
    /// value quoted or not, C-core refuses a quoted one.
    pub fn for_format(format: Format) -> Style {
        match format {
            // Sealed values are read by tether alone, which takes them bare.
            Format::Grpc | Format::Legacy | Format::Sealed => Style::Grpc,
            Format::Envoy => Style::Envoy,
        }
    }
}

/// One extra cookie attribute: `Name=Value`, or a bare `Name` when the value
/// is empty (as Envoy's `CookieAttribute` renders it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attribute {
    name: String,
    value: String,
}

impl Attribute {
    /// Validates an attribute. `SameSite` must be `Strict`, `Lax` or `None`;
    /// `Max-Age`, `Path` and `HttpOnly` are rejected because tether renders
    /// them itself from the cookie's ttl and path.
    pub fn new(name: &str, value: &str) -> Result<Self, ConfigError> {
        if !is_token(name) {
            return Err(ConfigError::new("name", name, Problem::NotToken));
        }
        for own in ["Max-Age", "Path", "HttpOnly"] {
            if name.eq_ignore_ascii_case(own) {
                return Err(ConfigError::new("name", name, Problem::Reserved));
            }
        }
        if !is_attribute_value(value) {
            return Err(ConfigError::new("value", value, Problem::NotAttributeValue));
        }
        if name.eq_ignore_ascii_case("SameSite")
            && !["Strict", "Lax", "None"]
                .iter()
                .any(|v| v.eq_ignore_ascii_case(value))
        {
            return Err(ConfigError::new(
                "value",
                value,
                Problem::OneOf("Strict, Lax, None"),
            ));
        }
        Ok(Attribute {
            name: name.to_string(),
            value: value.to_string(),
        })
    }

    /// `Domain=<domain>`.
    pub fn domain(domain: &str) -> Result<Self, ConfigError> {
        Attribute::new("Domain", domain)
    }

    /// `SameSite=<Strict|Lax|None>`.
    pub fn same_site(value: &str) -> Result<Self, ConfigError> {
        Attribute::new("SameSite", value)
    }

    /// `Secure`.
    pub fn secure() -> Self {
        Attribute {
            name: "Secure".to_string(),
            value: String::new(),
        }
    }

    /// The attribute's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The attribute's value (empty for a bare attribute).
    pub fn value(&self) -> &str {
        &self.value
    }
}

/// What a `Set-Cookie` is made from: name, path, ttl and extra attributes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CookieSpec {
    name: String,
    path: String,
    ttl: Duration,
    attributes: Vec<Attribute>,
}

impl CookieSpec {
    /// Validates a cookie spec. Errors name the field relative to the spec
    /// (`name`, `path`, `attributes[1]...`); callers prefix their own path.
    pub fn new(
        name: &str,
        path: &str,
        ttl: Duration,
        attributes: Vec<Attribute>,
    ) -> Result<Self, ConfigError> {
        if name.is_empty() {
            return Err(ConfigError::new("name", name, Problem::Missing));
        }
        if !is_token(name) {
            return Err(ConfigError::new("name", name, Problem::NotToken));
        }
        if !is_attribute_value(path) {
            return Err(ConfigError::new("path", path, Problem::NotAttributeValue));
        }
        if ttl.as_secs() > crate::duration::MAX_SECONDS {
            return Err(ConfigError::new(
                "ttl",
                &format!("{}", crate::duration::display(ttl)),
                Problem::Duration(crate::duration::DurationError::TooLarge),
            ));
        }
        Ok(CookieSpec {
            name: name.to_string(),
            path: path.to_string(),
            ttl,
            attributes,
        })
    }

    /// The cookie's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configured `Path` (empty when unset).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The configured time to live (zero: a session cookie without `Max-Age`).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The extra attributes, in order.
    pub fn attributes(&self) -> &[Attribute] {
        &self.attributes
    }

    /// Renders a `Set-Cookie` value for `value` in `style`. Fails only when
    /// `value` holds characters a cookie value may not (RFC 6265
    /// cookie-octet), which tether's own encoders never produce.
    pub fn render(&self, value: &str, style: Style) -> Result<String, ConfigError> {
        if !is_cookie_value(value) {
            return Err(ConfigError::new("value", value, Problem::NotCookieValue));
        }
        let max_age = self.ttl.as_secs();
        let mut out = String::with_capacity(self.name.len() + value.len() + 64);
        // Writing to a String cannot fail.
        match style {
            Style::Envoy => {
                let _ = write!(out, "{}=\"{}\"", self.name, value);
                if max_age > 0 {
                    let _ = write!(out, "; Max-Age={max_age}");
                }
                if !self.path.is_empty() {
                    let _ = write!(out, "; Path={}", self.path);
                }
                self.write_attributes(&mut out);
                out.push_str("; HttpOnly");
            }
            Style::Grpc => {
                let _ = write!(out, "{}={}; HttpOnly", self.name, value);
                if !self.path.is_empty() {
                    let _ = write!(out, "; Path={}", self.path);
                }
                if max_age > 0 {
                    let _ = write!(out, "; Max-Age={max_age}");
                }
                self.write_attributes(&mut out);
            }
        }
        Ok(out)
    }

    fn write_attributes(&self, out: &mut String) {
        for a in &self.attributes {
            out.push_str("; ");
            out.push_str(&a.name);
            if !a.value.is_empty() {
                out.push('=');
                out.push_str(&a.value);
            }
        }
    }
}

/// The attribute names RFC 6265 and its successor draft define for
/// `Set-Cookie` (matched case-insensitively).
pub const ATTRIBUTE_NAMES: [&str; 8] = [
    "Expires",
    "Max-Age",
    "Domain",
    "Path",
    "Secure",
    "HttpOnly",
    "SameSite",
    "Partitioned",
];

/// Whether `name` is one of [`ATTRIBUTE_NAMES`], ignoring ASCII case.
pub fn is_attribute_name(name: &str) -> bool {
    ATTRIBUTE_NAMES.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// A `Set-Cookie` value as a user agent reads it: the cookie, then its
/// attributes in the order sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received<'a> {
    /// The cookie's name.
    pub name: &'a str,
    /// The cookie's value as sent (quotes, if any, kept for the decoder).
    pub value: &'a str,
    /// `(name, value)` of each attribute; the value is empty for a bare one.
    pub attributes: Vec<(&'a str, &'a str)>,
}

/// Parses a `Set-Cookie` value the way RFC 6265 §5.2 tells user agents to:
/// the part before the first `;` is `name=value` (without an `=` or with an
/// empty name the whole header is ignored: `None`); each later part is an
/// attribute `name[=value]`. Spaces and tabs around names and values are
/// dropped and empty parts skipped. Attribute values are not interpreted.
pub fn parse(header: &str) -> Option<Received<'_>> {
    let mut parts = header.split(';');
    let (name, value) = parts.next()?.split_once('=')?;
    let name = name.trim_matches([' ', '\t']);
    if name.is_empty() {
        return None;
    }
    let attributes = parts
        .filter_map(|part| {
            let (n, v) = part.split_once('=').unwrap_or((part, ""));
            let n = n.trim_matches([' ', '\t']);
            (!n.is_empty()).then(|| (n, v.trim_matches([' ', '\t'])))
        })
        .collect();
    Some(Received {
        name,
        value: value.trim_matches([' ', '\t']),
        attributes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn rejects_injection() {
        assert!(CookieSpec::new("a;b", "/", Duration::ZERO, vec![]).is_err());
        assert!(CookieSpec::new("a", "/\r\nX: y", Duration::ZERO, vec![]).is_err());
        assert!(CookieSpec::new("a", "/;Domain=evil", Duration::ZERO, vec![]).is_err());
        assert!(Attribute::new("Domain", "x; Secure").is_err());
        assert!(Attribute::new("Dom ain", "x").is_err());
        assert!(Attribute::new("path", "/x").is_err());
        assert!(Attribute::same_site("sometimes").is_err());
        let spec = CookieSpec::new("a", "", Duration::ZERO, vec![]).unwrap();
        assert!(spec.render("x\"; Secure", Style::Envoy).is_err());
    }

    #[test]
    fn sub_second_ttl_has_no_max_age() {
        let spec = CookieSpec::new("s", "", Duration::from_millis(900), vec![]).unwrap();
        assert_eq!(spec.render("v", Style::Envoy).unwrap(), "s=\"v\"; HttpOnly");
        assert_eq!(spec.render("v", Style::Grpc).unwrap(), "s=v; HttpOnly");
    }

    #[test]
    fn attributes_keep_their_order() {
        let attrs = vec![
            Attribute::same_site("Lax").unwrap(),
            Attribute::secure(),
            Attribute::domain("example.com").unwrap(),
            Attribute::new("Partitioned", "").unwrap(),
        ];
        let spec = CookieSpec::new("s", "/p", Duration::from_secs(5), attrs).unwrap();
        assert_eq!(
            spec.render("v", Style::Envoy).unwrap(),
            "s=\"v\"; Max-Age=5; Path=/p; SameSite=Lax; Secure; Domain=example.com; Partitioned; HttpOnly"
        );
        assert_eq!(
            spec.render("v", Style::Grpc).unwrap(),
            "s=v; HttpOnly; Path=/p; Max-Age=5; SameSite=Lax; Secure; Domain=example.com; Partitioned"
        );
    }

    #[test]
    fn style_follows_the_format_reader() {
        assert_eq!(Style::for_format(Format::Grpc), Style::Grpc);
        assert_eq!(Style::for_format(Format::Envoy), Style::Envoy);
        assert_eq!(Style::for_format(Format::Legacy), Style::Grpc);
    }

    #[test]
    fn parses_what_it_renders() {
        let attrs = vec![Attribute::same_site("Lax").unwrap(), Attribute::secure()];
        let spec = CookieSpec::new("s", "/p", Duration::from_secs(5), attrs).unwrap();
        for style in [Style::Envoy, Style::Grpc] {
            let header = spec.render("Cg8=", style).unwrap();
            let got = parse(&header).unwrap();
            assert_eq!(got.name, "s");
            let mut names: Vec<_> = got.attributes.iter().map(|a| a.0).collect();
            names.sort_unstable();
            assert_eq!(names, ["HttpOnly", "Max-Age", "Path", "SameSite", "Secure"]);
            assert!(got.attributes.contains(&("Max-Age", "5")));
            assert!(got.attributes.contains(&("Path", "/p")));
            assert!(names.iter().all(|n| is_attribute_name(n)));
        }
        assert_eq!(
            parse(&spec.render("Cg8=", Style::Envoy).unwrap())
                .unwrap()
                .value,
            "\"Cg8=\""
        );
    }

    #[test]
    fn parse_follows_rfc6265_section_5_2() {
        let got = parse(" s = v=x ;;\tpath=/a ; Secure;=skip; Domain= ").unwrap();
        assert_eq!((got.name, got.value), ("s", "v=x"));
        assert_eq!(
            got.attributes,
            [("path", "/a"), ("Secure", ""), ("Domain", "")]
        );
        assert_eq!(parse("novalue; Path=/"), None);
        assert_eq!(parse("=v; Path=/"), None);
        assert_eq!(parse(""), None);
        assert!(is_attribute_name("max-age"));
        assert!(!is_attribute_name("Max-Ages"));
    }
}
