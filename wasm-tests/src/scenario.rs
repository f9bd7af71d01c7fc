//! Shared pieces of the real-Envoy scenarios (`tests/envoy_*.rs`,
//! `tests/grpc_through_envoy.rs`) and of the demo (`examples/demo.rs`):
//!
//! - the ready-to-copy configurations of `envoy-configs/`, with their
//!   addresses replaced by the test's ([`config_file`]), so the scenarios
//!   run the very files users copy;
//! - configurations built in code for the variants ([`bootstrap`] and the
//!   builders next to it), written as JSON, which Envoy reads as YAML;
//! - backends that say who they are ([`Backends`]);
//! - what came back: the backend that answered and the session cookie,
//!   decoded with tether-core ([`minted`]).

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};
use tether_core::cookie::{self, Decoded, Format, KeyRing, SessionCookie};
use tether_core::http::set_cookie;
use tether_core::AddressList;
use tether_testkit::backend::HttpBackend;
use tether_testkit::client::Response;
use tether_testkit::envoy::Envoy;

/// The session cookie's name in every configuration here.
pub const COOKIE: &str = "global-session-cookie";
/// The request header the plugin writes for Envoy.
pub const OVERRIDE_HEADER: &str = "x-tether-override-host";
/// Where the files of `envoy-configs/` expect the plugin.
pub const CONFIG_PLUGIN_PATH: &str = "/etc/tether/tether_plugin.wasm";
/// The listener port in `envoy-configs/`.
pub const CONFIG_LISTEN_PORT: u16 = 10000;
/// The admin port in `envoy-configs/`.
pub const CONFIG_ADMIN_PORT: u16 = 9901;
/// The backend ports in `envoy-configs/` (all on 127.0.0.1).
pub const CONFIG_BACKEND_PORTS: [u16; 3] = [8081, 8082, 8083];

/// The built plugin's path; panics with the command that builds it.
pub fn plugin_path() -> String {
    match crate::host::plugin_wasm() {
        Ok(p) => p.display().to_string(),
        Err(e) => panic!("{e}"),
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// The text of `envoy-configs/<file>`.
pub fn config_text(file: &str) -> String {
    let path = repo_root().join("envoy-configs").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Replaces every `from` with `to`; panics when `from` is absent, so that a
/// config file drifting away from what the tests expect fails loudly.
pub fn replace(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not found in the config");
    text.replace(from, to)
}

/// `envoy-configs/<file>` with its listener on `listen`, the admin on an
/// ephemeral port, `backends` in place of 127.0.0.1:8081-8083 and the built
/// plugin in place of its default path.
pub fn config_file(file: &str, listen: u16, backends: &[SocketAddr]) -> String {
    let mut text = config_text(file);
    text = replace(
        &text,
        &format!("port_value: {CONFIG_LISTEN_PORT} "),
        &format!("port_value: {listen} "),
    );
    text = replace(
        &text,
        &format!("port_value: {CONFIG_ADMIN_PORT} "),
        "port_value: 0 ",
    );
    assert_eq!(
        backends.len(),
        CONFIG_BACKEND_PORTS.len(),
        "{file} has 3 backends"
    );
    for (port, b) in CONFIG_BACKEND_PORTS.iter().zip(backends) {
        text = replace(
            &text,
            &format!("address: 127.0.0.1, port_value: {port} "),
            &format!("address: {}, port_value: {} ", b.ip(), b.port()),
        );
    }
    if text.contains(CONFIG_PLUGIN_PATH) {
        text = text.replace(CONFIG_PLUGIN_PATH, &plugin_path());
    }
    text
}

/// `yaml` with its plugin configuration (the JSON in the `value: |` block)
/// replaced by `config`.
pub fn with_plugin_config(yaml: &str, config: &Value) -> String {
    let start = yaml
        .find("value: |\n")
        .expect("a plugin configuration block")
        + "value: |\n".len();
    let indent: String = yaml[start..].chars().take_while(|c| *c == ' ').collect();
    let end = yaml[start..]
        .lines()
        .take_while(|l| l.starts_with(&indent))
        .map(|l| l.len() + 1)
        .sum::<usize>()
        + start;
    format!("{}{indent}{config}\n{}", &yaml[..start], &yaml[end..])
}

/// The plugin configuration of `envoy-configs/`: cookie `global-session-cookie`,
/// path `/`, ttl 120 s, `SameSite=Lax`, format `envoy`, wiring (a).
pub fn plugin_config() -> Value {
    json!({
        "cookie": { "name": COOKIE, "path": "/", "ttl": "120s",
                    "attributes": [ { "name": "SameSite", "value": "Lax" } ] },
        "override_header": OVERRIDE_HEADER,
        "override_encoding": "list"
    })
}

fn socket(port: u16) -> Value {
    json!({ "socket_address": { "address": "127.0.0.1", "port_value": port } })
}

/// A bootstrap with an admin listener on an ephemeral 127.0.0.1 port.
pub fn bootstrap(listeners: Vec<Value>, clusters: Vec<Value>) -> String {
    json!({
        "admin": { "address": socket(0) },
        "static_resources": { "listeners": listeners, "clusters": clusters }
    })
    .to_string()
}

/// An HTTP listener on 127.0.0.1:`port` (HTTP/1.1 and HTTP/2), its HTTP
/// filters in order, then the router.
pub fn listener(name: &str, port: u16, mut filters: Vec<Value>, routes: Vec<Value>) -> Value {
    filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
    }));
    json!({
        "name": name,
        "address": socket(port),
        "filter_chains": [{ "filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "codec_type": "AUTO",
                "route_config": { "name": name, "virtual_hosts": [
                    { "name": name, "domains": ["*"], "routes": routes }
                ] },
                "http_filters": filters
            }
        }] }]
    })
}

/// A route sending `prefix` to `cluster`.
pub fn route(prefix: &str, cluster: &str) -> Value {
    json!({ "match": { "prefix": prefix }, "route": { "cluster": cluster } })
}

/// The tether plugin filter (named `tether`) with `config`, on V8.
pub fn plugin_filter(config: &Value) -> Value {
    plugin_filter_named("tether", config)
}

/// The tether plugin filter named `name` (filter, plugin and root id) with
/// `config`, on V8.
pub fn plugin_filter_named(name: &str, config: &Value) -> Value {
    json!({
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": name,
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": config.to_string()
                },
                "vm_config": {
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": { "local": { "filename": plugin_path() } }
                }
            }
        }
    })
}

/// Envoy's own stateful_session filter with the cookie `global-session-cookie`
/// on path `/`, with `ttl` if given.
pub fn native_cookie_filter(ttl: Option<&str>, strict: bool) -> Value {
    let mut cookie = json!({ "name": COOKIE, "path": "/" });
    if let Some(ttl) = ttl {
        cookie["ttl"] = json!(ttl);
    }
    native_filter(
        strict,
        "cookie",
        json!({
            "@type": "type.googleapis.com/envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState",
            "cookie": cookie
        }),
    )
}

/// Envoy's own stateful_session filter in header mode, reading `header`.
pub fn native_header_filter(header: &str, strict: bool) -> Value {
    native_filter(
        strict,
        "header",
        json!({
            "@type": "type.googleapis.com/envoy.extensions.http.stateful_session.header.v3.HeaderBasedSessionState",
            "name": header
        }),
    )
}

/// Envoy's stateful_session filter with the session state extension
/// `envoy.http.stateful_session.<state>` configured by `state_config`.
fn native_filter(strict: bool, state: &str, state_config: Value) -> Value {
    json!({
        "name": "envoy.filters.http.stateful_session",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession",
            "strict": strict,
            "session_state": {
                "name": format!("envoy.http.stateful_session.{state}"),
                "typed_config": state_config
            }
        }
    })
}

/// A STATIC round-robin cluster of `backends`.
pub fn static_cluster(name: &str, backends: &[SocketAddr]) -> Value {
    let endpoints: Vec<Value> = backends
        .iter()
        .map(|b| {
            json!({ "endpoint": { "address": { "socket_address": {
                "address": b.ip().to_string(), "port_value": b.port() } } } })
        })
        .collect();
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": { "cluster_name": name, "endpoints": [ { "lb_endpoints": endpoints } ] }
    })
}

/// [`static_cluster`] behind Envoy's override_host policy reading the
/// plugin's header, round robin as the fallback (wiring a).
pub fn override_host_cluster(name: &str, backends: &[SocketAddr]) -> Value {
    let mut c = static_cluster(name, backends);
    c["load_balancing_policy"] = json!({ "policies": [ { "typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [ { "header": OVERRIDE_HEADER } ],
            "fallback_policy": { "policies": [ { "typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": { "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin" }
            } } ] }
        }
    } } ] });
    c
}

/// Makes `cluster` talk HTTP/2 to its hosts (gRPC backends).
pub fn http2_upstream(cluster: &mut Value) {
    cluster["typed_extension_protocol_options"] = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": { "http2_protocol_options": {} }
        }
    });
}

/// A backend called `name` on a 127.0.0.0/8 address (drawn at random)
/// whose plain `legacy` cookie text stock Envoy's cookie session state
/// misreads as a protobuf (`flagged`), or reads
/// (`tether_core::cookie::readers`).
pub async fn backend_on_loopback(name: &str, flagged: bool) -> tether_testkit::grpc::DualBackend {
    let listener = tether_testkit::loopback_listener(|a| {
        tether_core::cookie::readers::legacy_text_read_by_envoy(a) != flagged
    })
    .await;
    tether_testkit::grpc::DualBackend::start_on(name, listener)
}

/// Starts Envoy or panics with its log.
pub async fn start_envoy(yaml: &str) -> Envoy {
    match Envoy::start(yaml).await {
        Ok(e) => e,
        Err(e) => panic!("Envoy did not start: {e}\nconfig:\n{yaml}"),
    }
}

/// Backends named `backend-1`, `backend-2`, ... that say who they are.
pub struct Backends(pub Vec<HttpBackend>);

impl Backends {
    /// Starts `n` backends.
    pub async fn start(n: usize) -> Backends {
        let mut v = Vec::with_capacity(n);
        for i in 1..=n {
            v.push(HttpBackend::start(&format!("backend-{i}")).await);
        }
        Backends(v)
    }

    /// Their addresses, in order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.0.iter().map(HttpBackend::addr).collect()
    }

    /// The backend called `name`.
    pub fn named(&self, name: &str) -> &HttpBackend {
        self.0
            .iter()
            .find(|b| b.name() == name)
            .unwrap_or_else(|| panic!("no backend {name:?}"))
    }

    /// The name of the backend at `addr`.
    pub fn name_at(&self, addr: SocketAddr) -> &str {
        self.0
            .iter()
            .find(|b| b.addr() == addr)
            .map(HttpBackend::name)
            .unwrap_or_else(|| panic!("no backend at {addr}"))
    }

    /// Requests served by all of them.
    pub fn hits(&self) -> u64 {
        self.0.iter().map(HttpBackend::hits).sum()
    }
}

/// The `x-backend` of a response ("" when absent: Envoy answered itself).
pub fn backend(resp: &Response) -> &str {
    resp.header("x-backend").unwrap_or("")
}

/// A session cookie as a response set it.
#[derive(Debug, Clone)]
pub struct Minted {
    /// The whole `Set-Cookie` value.
    pub header: String,
    /// The cookie value as sent (quotes kept).
    pub value: String,
    /// Attributes in order, `(name, value)`; the value is empty for a bare one.
    pub attributes: Vec<(String, String)>,
    /// The value decoded by tether-core (no keys).
    pub decoded: Decoded,
}

impl Minted {
    /// The address the cookie pins to.
    pub fn address(&self) -> SocketAddr {
        self.decoded.cookie.addresses.primary()
    }

    /// The `Cookie` request header a browser sends back.
    pub fn cookie_header(&self) -> String {
        format!("{COOKIE}={}", self.value)
    }

    /// The value of attribute `name` (case-insensitive), if present.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The session cookies set in a gRPC response's metadata (its initial
/// metadata's `set-cookie` values).
pub fn metadata_cookies(metadata: &tonic::metadata::MetadataMap) -> Vec<Minted> {
    let headers: Vec<(String, String)> = metadata
        .clone()
        .into_headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    session_cookies(&headers)
}

/// Every `Set-Cookie` of the session cookie in `headers`, decoded.
pub fn session_cookies(headers: &[(String, String)]) -> Vec<Minted> {
    headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .filter_map(|(_, v)| {
            let got = set_cookie::parse(v)?;
            (got.name == COOKIE).then(|| Minted {
                header: v.clone(),
                value: got.value.to_string(),
                attributes: got
                    .attributes
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
                decoded: cookie::decode(got.value, &KeyRing::empty())
                    .or_else(|e| match e {
                        cookie::DecodeError::Sealed => cookie::decode(got.value, &sealing_keys()),
                        e => Err(e),
                    })
                    .unwrap_or_else(|e| panic!("undecodable Set-Cookie {v:?}: {e}")),
            })
        })
        .collect()
}

/// The session cookie a response set, if any (at most one is allowed).
pub fn minted(resp: &Response) -> Option<Minted> {
    let mut all = session_cookies(&resp.headers);
    assert!(
        all.len() <= 1,
        "several session cookies: {:?}",
        resp.headers
    );
    all.pop()
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The sealing secret the tests' sealed cookies use (32 bytes, base64).
pub const SEALING_SECRET: &str = "WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpaWlo=";

/// The ring of [`SEALING_SECRET`], which opens the tests' sealed cookies.
pub fn sealing_keys() -> KeyRing {
    KeyRing::from_base64([SEALING_SECRET]).expect("the tests' sealing secret")
}

/// An `envoy`-format value pinning `addr`, expiring at `expires`.
pub fn envoy_value(addr: SocketAddr, expires: Option<u64>) -> String {
    let mut c = SessionCookie::new(AddressList::one(addr));
    c.expires = expires;
    cookie::encode(&c, Format::Envoy, None).expect("encode")
}

/// A gRPC C-core value `addr;cluster`.
pub fn grpc_value(addr: SocketAddr, cluster: &str) -> String {
    let mut c = SessionCookie::new(AddressList::one(addr));
    c.cluster = Some(cluster.to_string());
    cookie::encode(&c, Format::Grpc, None).expect("encode")
}

/// A legacy value: base64 of `ip:port`.
pub fn legacy_value(addr: SocketAddr) -> String {
    cookie::encode(
        &SessionCookie::new(AddressList::one(addr)),
        Format::Legacy,
        None,
    )
    .expect("encode")
}

/// `global-session-cookie=<value>`.
pub fn cookie(value: &str) -> String {
    format!("{COOKIE}={value}")
}

/// Backends behind one Envoy, and a client of its listener.
pub struct Stage {
    /// The backends, `backend-1`...
    pub backends: Backends,
    /// The running Envoy.
    pub envoy: Envoy,
    /// Its listener.
    pub listen: SocketAddr,
}

impl Stage {
    /// Three backends behind `envoy-configs/<file>`, with `plugin` as the
    /// plugin configuration instead of the file's when given.
    pub async fn config_file(file: &str, plugin: Option<&Value>) -> Stage {
        let backends = Backends::start(3).await;
        Stage::config_file_with(file, plugin, backends).await
    }

    /// [`Stage::config_file`] in front of `backends` (three).
    pub async fn config_file_with(file: &str, plugin: Option<&Value>, backends: Backends) -> Stage {
        let port = tether_testkit::free_port();
        let mut yaml = config_file(file, port, &backends.addrs());
        if let Some(config) = plugin {
            yaml = with_plugin_config(&yaml, config);
        }
        let envoy = start_envoy(&yaml).await;
        Stage {
            backends,
            envoy,
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// `n` backends behind a configuration built by `yaml` from their
    /// addresses and a free listener port.
    pub async fn built(n: usize, yaml: impl FnOnce(u16, &[SocketAddr]) -> String) -> Stage {
        let backends = Backends::start(n).await;
        let port = tether_testkit::free_port();
        let envoy = start_envoy(&yaml(port, &backends.addrs())).await;
        Stage {
            backends,
            envoy,
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    /// `GET path` on a new connection; panics with Envoy's log on failure.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        match tether_testkit::client::get(self.listen, path, headers).await {
            Ok(r) => r,
            Err(e) => panic!("GET {path}: {e}\nEnvoy log:\n{}", self.envoy.log()),
        }
    }

    /// `GET path` with only the session cookie `value`.
    pub async fn get_with_cookie(&self, path: &str, value: &str) -> Response {
        let c = cookie(value);
        self.get(path, &[("cookie", &c)]).await
    }

    /// The address of backend `name`.
    pub fn addr_of(&self, name: &str) -> SocketAddr {
        self.backends.named(name).addr()
    }

    /// Waits (at most 15 s) until no host of `cluster` carries a health flag
    /// (active health checks passed everywhere); panics otherwise.
    pub async fn wait_all_healthy(&self, cluster: &str) {
        let healthy = tether_testkit::wait_until(std::time::Duration::from_secs(15), || async {
            let text = self.envoy.admin_get("/clusters").await.unwrap_or_default();
            let flags: Vec<&str> = text
                .lines()
                .filter(|l| {
                    l.starts_with(&format!("{cluster}::")) && l.contains("::health_flags::")
                })
                .collect();
            flags.len() == self.backends.0.len() && flags.iter().all(|l| l.ends_with("::healthy"))
        })
        .await;
        assert!(
            healthy,
            "{cluster} not healthy:\n{}",
            self.envoy.admin_get("/clusters").await.unwrap_or_default()
        );
    }
}
