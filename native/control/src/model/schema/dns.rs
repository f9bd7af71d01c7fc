//! The `dns` section: where and how often tether-control resolves the
//! endpoints written as `NAME:PORT`, and how long a vanished address drains.

use std::time::Duration;

use serde::Deserialize;

use super::field::{AddressField, DnsServerField, DurationField};
use super::Config;
use crate::dns::DnsSettings;

/// `dns`: every setting optional (see [`DnsSettings`] for the defaults).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DnsSpec {
    /// The DNS servers to ask, `IP:PORT`; the system's (resolv.conf) when
    /// left out.
    #[serde(default)]
    pub servers: Option<Vec<DnsServerField>>,
    /// A name is asked again after its records' TTL, but never sooner than
    /// this (default 5 s, Envoy's `dns_refresh_rate`).
    #[serde(default, rename = "minRefresh")]
    pub min_refresh: Option<DurationField>,
    /// ... and never later than this (default 60 s).
    #[serde(default, rename = "maxRefresh")]
    pub max_refresh: Option<DurationField>,
    /// How long an address that left a name's answer stays, DRAINING,
    /// before it is removed (default 30 s; 0 removes it at once).
    #[serde(default, rename = "drainOnRemoval")]
    pub drain_on_removal: Option<DurationField>,
    /// How long one query waits for an answer before it is asked again
    /// (default 5 s, resolv.conf's; two attempts per server).
    #[serde(default)]
    pub timeout: Option<DurationField>,
}

impl DnsSpec {
    /// The settings, defaults filled in.
    pub fn settings(&self) -> DnsSettings {
        let d = DnsSettings::default();
        let or = |f: Option<DurationField>, default: Duration| f.map_or(default, |f| f.0);
        DnsSettings {
            servers: self
                .servers
                .as_ref()
                .map(|s| s.iter().map(|s| s.0).collect())
                .unwrap_or_default(),
            min_refresh: or(self.min_refresh, d.min_refresh),
            max_refresh: or(self.max_refresh, d.max_refresh),
            drain_on_removal: or(self.drain_on_removal, d.drain_on_removal),
            timeout: or(self.timeout, d.timeout),
        }
    }
}

/// A DNS name the file uses, with where it is first written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NameUse {
    /// The name (lower case).
    pub host: String,
    /// The field of its first use, e.g. `services[0].endpoints[1].address`.
    pub field: String,
    /// That field's value, `NAME:PORT`.
    pub value: String,
}

impl Config {
    /// Every DNS name the endpoints use, once, in the file's order.
    pub fn dns_names(&self) -> Vec<NameUse> {
        let mut out: Vec<NameUse> = Vec::new();
        for (i, s) in self.services.iter().enumerate() {
            for (j, e) in s.endpoints.iter().enumerate() {
                let fields =
                    std::iter::once((format!("services[{i}].endpoints[{j}].address"), &e.address))
                        .chain(e.additional_addresses.iter().enumerate().map(|(k, a)| {
                            (
                                format!("services[{i}].endpoints[{j}].additionalAddresses[{k}]"),
                                a,
                            )
                        }));
                for (field, a) in fields {
                    let AddressField::Name { host, .. } = a else {
                        continue;
                    };
                    if !out.iter().any(|n| &n.host == host) {
                        out.push(NameUse {
                            host: host.clone(),
                            field,
                            value: a.to_string(),
                        });
                    }
                }
            }
        }
        out
    }
}
