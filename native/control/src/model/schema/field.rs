//! Scalar and small fields checked as they are read, so a bad value is
//! reported with its own path, line and column: durations, health
//! statuses, cookie formats and cookie specifications.

use std::fmt;
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
scalar_via_try_from!(FormatField, "a cookie format: envoy, grpc or legacy");

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
