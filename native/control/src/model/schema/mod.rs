//! The file's schema: the serde structs and enums the YAML is read into,
//! their defaults and plain accessors, by section: `dns` (the `dns`
//! section and the names endpoints use), `envoy` (the `envoy` section and
//! the listener), `route` (virtual hosts, routes and load
//! balancer policies), `service` (services, endpoints and their TLS,
//! keepalive, outlier detection, load reporting, drain and drops) and
//! `field` (scalar fields checked as they are read).

use serde::Deserialize;

pub(super) mod dns;
pub(super) mod envoy;
pub(super) mod field;
pub(super) mod route;
pub(super) mod service;

use dns::DnsSpec;
use envoy::{EnvoySpec, ListenerSpec, PluginSpec};
use route::VirtualHostSpec;
use service::ServiceSpec;

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where Envoy listens; omit it for proxyless clients only.
    #[serde(default)]
    pub listener: Option<ListenerSpec>,
    /// Virtual hosts; each is also a proxyless target (`xds:///<name>`).
    #[serde(default)]
    pub virtualhosts: Vec<VirtualHostSpec>,
    /// Services and their endpoints.
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    /// What Envoy clients get for `Session` routes (default: Envoy's own
    /// stateful_session filter). Proxyless clients are not affected.
    #[serde(default)]
    pub envoy: EnvoySpec,
    /// How endpoints written as `NAME:PORT` are resolved.
    #[serde(default)]
    pub dns: DnsSpec,
}

/// Settings given outside the file (on tether-control's command line);
/// they win over the file's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `envoy.plugin.filename` (`--plugin FILE`).
    pub plugin_filename: Option<String>,
}

impl Overrides {
    pub(super) fn apply(&self, config: &mut Config) {
        if let Some(f) = &self.plugin_filename {
            config
                .envoy
                .plugin
                .get_or_insert_with(PluginSpec::default)
                .filename = Some(f.clone());
        }
    }
}

/// The default of a weight.
fn one() -> u32 {
    1
}
