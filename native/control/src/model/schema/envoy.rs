//! The `envoy` section (session filter, plugin, per-node settings) and
//! Envoy's listener.

use serde::Deserialize;

use super::Config;

/// The `envoy` section: how Envoy clients keep sessions.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct EnvoySpec {
    /// Which filter pins `Session` routes in Envoy.
    #[serde(default, rename = "sessionFilter")]
    pub session_filter: SessionFilter,
    /// The tether plugin's settings, for `sessionFilter: plugin` (here or
    /// in one of `nodes`).
    #[serde(default)]
    pub plugin: Option<PluginSpec>,
    /// Envoys, by node ID, that get another session filter or listener
    /// than the rest: a fleet moving to the plugin one Envoy at a time, or
    /// Envoys sharing a host.
    #[serde(default)]
    pub nodes: Vec<EnvoyNodeSpec>,
}

impl EnvoySpec {
    /// Whether some Envoy (all of them, or one of `nodes`) runs the plugin.
    pub fn uses_plugin(&self) -> bool {
        self.session_filter == SessionFilter::Plugin
            || self
                .nodes
                .iter()
                .any(|n| n.session_filter == Some(SessionFilter::Plugin))
    }
}

/// One entry of `envoy.nodes`: what the Envoy with this node ID gets
/// instead of the file's settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EnvoyNodeSpec {
    /// The node ID in that Envoy's bootstrap (`node.id`).
    pub id: String,
    /// Its session filter (default: `envoy.sessionFilter`).
    #[serde(default, rename = "sessionFilter")]
    pub session_filter: Option<SessionFilter>,
    /// Its listener (default: the file's `listener`).
    #[serde(default)]
    pub listener: Option<ListenerSpec>,
}

/// The filter Envoy clients get for `Session` routes.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SessionFilter {
    /// Envoy's own `envoy.filters.http.stateful_session` (default).
    #[default]
    Native,
    /// The tether plugin (`envoy.filters.http.wasm` on V8) with Envoy's
    /// override_host load balancing policy on the session clusters.
    Plugin,
}

impl SessionFilter {
    /// The name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionFilter::Native => "native",
            SessionFilter::Plugin => "plugin",
        }
    }
}

/// `envoy.plugin`: where Envoy finds the tether plugin and how it hands the
/// session to Envoy's load balancer.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// The `.wasm` file as Envoy sees it (an absolute path);
    /// `tether-control --plugin FILE` overrides it.
    #[serde(default)]
    pub filename: Option<String>,
    /// The request header the plugin writes and the session clusters'
    /// override_host policy reads (default `x-tether-override-host`).
    #[serde(default, rename = "overrideHeader")]
    pub override_header: Option<String>,
}

/// The plugin's default override header.
pub const DEFAULT_OVERRIDE_HEADER: &str = "x-tether-override-host";

impl PluginSpec {
    /// The override header, lowercase, or the default.
    pub fn override_header(&self) -> String {
        self.override_header
            .as_deref()
            .unwrap_or(DEFAULT_OVERRIDE_HEADER)
            .to_ascii_lowercase()
    }
}

/// Envoy's listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerSpec {
    /// Listener name (default `tether-ingress`).
    #[serde(default = "default_listener_name")]
    pub name: String,
    /// IP address to bind (default `127.0.0.1`).
    #[serde(default = "default_listener_address")]
    pub address: std::net::IpAddr,
    /// Port to bind.
    pub port: u16,
}

fn default_listener_name() -> String {
    "tether-ingress".to_owned()
}

fn default_listener_address() -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
}

impl Config {
    /// Whether Envoys get a listener from this file (the file's own, or a
    /// node's), and so route to its services.
    pub fn serves_envoy(&self) -> bool {
        self.listener.is_some() || self.envoy.nodes.iter().any(|n| n.listener.is_some())
    }

    /// The configuration as the Envoy of `node` sees it: its session filter
    /// and listener in place of the file's, and no other node's.
    pub fn for_envoy_node(&self, node: &EnvoyNodeSpec) -> Config {
        let mut c = self.clone();
        if let Some(f) = node.session_filter {
            c.envoy.session_filter = f;
        }
        if let Some(l) = &node.listener {
            c.listener = Some(l.clone());
        }
        c.envoy.nodes.clear();
        c
    }
}
