//! Scalar and small fields checked as they are read, so a bad value is
//! reported with its own path, line and column: durations, health
//! statuses, cookie formats, cookie specifications, endpoint addresses
//! (`IP:PORT` or `NAME:PORT`) and DNS servers.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::Deserialize;

use tether_core::http::set_cookie::CookieSpec;
use tether_xds::resource::endpoint::HealthStatus;

/// A cookie format name (`envoy`, `grpc`, `legacy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatField(pub tether_core::cookie::Format);

impl TryFrom<String> for FormatField {
    type Error = String;
    fn try_from(v: String) -> Result<Self, String> {
        v.parse().map(FormatField).map_err(|e| e.to_string())
    }
}

/// A cookie specification (`{name, path, ttl, attributes}`) checked by
/// `tether_core::config::cookie_spec`, the same rules as every other
/// session configuration in tether.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CookieField(pub CookieSpec);

impl<'de> Deserialize<'de> for CookieField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = CookieField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a cookie: {name, path, ttl, attributes}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<CookieField, A::Error> {
                let mut fields = serde_json::Map::new();
                while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                    fields.insert(k, v);
                }
                // Failing here, inside the mapping, keeps the cookie's path and line.
                tether_core::config::cookie_spec(&serde_json::Value::Object(fields))
                    .map(CookieField)
                    .map_err(|e| serde::de::Error::custom(e.to_string()))
            }
        }
        d.deserialize_map(V)
    }
}

/// A duration as protobuf JSON writes it (`"60s"`, `"1.5s"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationField(pub Duration);

impl TryFrom<String> for DurationField {
    type Error = String;
    fn try_from(v: String) -> Result<Self, String> {
        tether_core::duration::parse(&v)
            .map(DurationField)
            .map_err(|e| format!("{v:?} {e}"))
    }
}

/// An EDS health status name (`HEALTHY`, `DRAINING`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HealthField(pub HealthStatus);

/// Deserializes a scalar through `TryFrom<String>`, failing inside the
/// scalar so the error carries the field's own path, line and column.
macro_rules! scalar_via_try_from {
    ($t:ty, $what:literal) => {
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$t, E> {
                        <$t>::try_from(v.to_owned()).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    };
}

scalar_via_try_from!(DurationField, "a duration such as \"60s\"");
scalar_via_try_from!(HealthField, "a health status such as HEALTHY");
scalar_via_try_from!(
    FormatField,
    "a cookie format: envoy, grpc, legacy or sealed"
);

impl TryFrom<String> for HealthField {
    type Error = String;
    fn try_from(v: String) -> Result<Self, String> {
        v.parse().map(HealthField).map_err(|()| {
            format!("{v:?} is not one of UNKNOWN, HEALTHY, UNHEALTHY, DRAINING, TIMEOUT, DEGRADED")
        })
    }
}

impl Default for HealthField {
    fn default() -> Self {
        HealthField(HealthStatus::Healthy)
    }
}

/// An endpoint's address as written: `IP:PORT` (`[v6]:PORT` for IPv6) or
/// `NAME:PORT`, a DNS name that tether-control resolves (A and AAAA); each
/// address it resolves to becomes an endpoint of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum AddressField {
    /// An IP address and port.
    Ip(SocketAddr),
    /// A DNS name (lower case, as written otherwise) and a port.
    Name {
        /// The name, e.g. `api.internal` (a trailing dot kept: it makes
        /// the name absolute, past the resolver's search list).
        host: String,
        /// The port every resolved address gets.
        port: u16,
    },
}

impl AddressField {
    /// The IP address and port, when written as one.
    pub fn ip(&self) -> Option<SocketAddr> {
        match self {
            AddressField::Ip(a) => Some(*a),
            AddressField::Name { .. } => None,
        }
    }

    /// The DNS name, when written as one.
    pub fn host(&self) -> Option<&str> {
        match self {
            AddressField::Ip(_) => None,
            AddressField::Name { host, .. } => Some(host),
        }
    }
}

impl fmt::Display for AddressField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddressField::Ip(a) => write!(f, "{a}"),
            AddressField::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl TryFrom<String> for AddressField {
    type Error = String;
    fn try_from(v: String) -> Result<Self, String> {
        let ip_error = match v.parse::<SocketAddr>() {
            Ok(a) => return Ok(AddressField::Ip(a)),
            Err(e) => e,
        };
        let neither =
            || format!("{ip_error}: {v:?} is neither IP:PORT ([v6]:PORT for IPv6) nor NAME:PORT");
        let Some((host, port)) = v.rsplit_once(':') else {
            return Err(neither());
        };
        // `10.0.0.1` without a port, or an IPv6 address without brackets,
        // is a mistake, not a name.
        if host.parse::<IpAddr>().is_ok() || host.contains(':') || host.starts_with('[') {
            return Err(neither());
        }
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(format!(
                    "{v:?}: port {port:?} must be a number from 1 to 65535"
                ))
            }
        };
        if let Err(why) = check_host_name(host) {
            return Err(format!("{v:?}: {host:?} is not a DNS name ({why})"));
        }
        Ok(AddressField::Name {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// A host name as resolvers take it: dot-separated labels of letters,
/// digits, `-` and `_` (not starting or ending with `-`), each 1 to 63
/// characters, 253 in all, and a last label that is not all digits (so a
/// mistyped IPv4 address is not taken for a name).
fn check_host_name(host: &str) -> Result<(), &'static str> {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 {
        return Err("1 to 253 characters");
    }
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each label 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("letters, digits, '-' and '_' only");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label cannot start or end with '-'");
        }
        last = label;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err("its last label is all digits");
    }
    Ok(())
}

/// A DNS server's address: `IP:PORT`, or an IP alone for port 53.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnsServerField(pub SocketAddr);

impl TryFrom<String> for DnsServerField {
    type Error = String;
    fn try_from(v: String) -> Result<Self, String> {
        if let Ok(a) = v.parse::<SocketAddr>() {
            return Ok(DnsServerField(a));
        }
        match v.parse::<IpAddr>() {
            Ok(ip) => Ok(DnsServerField(SocketAddr::new(ip, 53))),
            Err(_) => Err(format!(
                "{v:?} is not a DNS server's IP:PORT ([v6]:PORT for IPv6, or an IP alone for port 53)"
            )),
        }
    }
}

scalar_via_try_from!(AddressField, "an address: IP:PORT or NAME:PORT");
scalar_via_try_from!(DnsServerField, "a DNS server's address: IP:PORT");
