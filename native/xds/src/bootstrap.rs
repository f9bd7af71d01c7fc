//! The xDS bootstrap, in the JSON form gRPC clients read, so one file serves
//! tether and gRPC alike:
//!
//! ```json
//! {
//!   "xds_servers": [
//!     { "server_uri": "127.0.0.1:18000", "channel_creds": [{ "type": "insecure" }],
//!       "server_features": ["xds_v3"] }
//!   ],
//!   "node": { "id": "client-1", "cluster": "demo",
//!             "locality": { "region": "r", "zone": "z", "sub_zone": "s" },
//!             "metadata": { "team": "a" } }
//! }
//! ```
//!
//! [`Bootstrap::from_env`] reads `GRPC_XDS_BOOTSTRAP` (a file) or
//! `GRPC_XDS_BOOTSTRAP_CONFIG` (the JSON itself), as gRPC does. Only the
//! first server is used; its `channel_creds` (required, as in C-core) are
//! the first of `insecure` and `tls` (gRFC A65: `ca_certificate_file`, else the system's roots;
//! `certificate_file` with `private_key_file`, read again for each new
//! connection) that it lists.
//! A `server_uri` may be a Unix domain socket, `unix:PATH` or
//! `unix:///ABSOLUTE_PATH` (Istio's agent serves xDS so); with `tls` the
//! handshake runs over the socket and the server's certificate must name
//! `localhost`.
//! `certificate_providers` (gRFC A29) defines the instances a cluster's TLS
//! names, with the `file_watcher` plugin:
//! `{"ca": {"plugin_name": "file_watcher", "config": {"certificate_file": "cert.pem",
//! "private_key_file": "key.pem", "ca_certificate_file": "ca.pem", "refresh_interval": "60s"}}}`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::google::protobuf as pbany;
use serde_json::{Map, Value};

/// A bootstrap error naming the field and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BootstrapError {
    /// Path of the field, e.g. `xds_servers[0].server_uri`.
    pub field: String,
    /// The offending value (empty when absent).
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

impl BootstrapError {
    pub(crate) fn new(field: &str, value: &str, problem: &str) -> Self {
        BootstrapError {
            field: field.to_owned(),
            value: value.to_owned(),
            problem: problem.to_owned(),
        }
    }
}

impl fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "bootstrap {}: {}", self.field, self.problem)
        } else {
            write!(
                f,
                "bootstrap {}: {} {}",
                self.field, self.value, self.problem
            )
        }
    }
}

impl std::error::Error for BootstrapError {}

/// One management server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsServer {
    /// The URI as written (`host:port`, `dns:///host:port` or `http://host:port`).
    pub server_uri: String,
    /// `server_features` as written (e.g. `xds_v3`, `ignore_resource_deletion`).
    pub server_features: Vec<String>,
    /// The first `channel_creds` type tether supports (gRPC's rule).
    pub channel_creds: ChannelCreds,
    /// `call_creds` as written: each entry's `type` and `config` (gRFC
    /// A97). The XdsClient applies the ones it supports (see
    /// [`crate::call_creds`]) when A97 is on.
    pub call_creds: Vec<(String, Value)>,
}

/// How the client secures its connection to the management server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ChannelCreds {
    /// Plaintext HTTP/2 (`insecure`).
    #[default]
    Insecure,
    /// TLS (gRFC A65's `tls` type): the server's certificate verified
    /// against `ca_certificate_file` (the system's roots without one) and
    /// the server URI's host; an optional client certificate (mTLS).
    Tls(TlsCreds),
}

/// The `tls` channel credentials' config (gRFC A65).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TlsCreds {
    /// The roots (PEM); the system's when absent.
    pub ca_certificate_file: Option<PathBuf>,
    /// The client certificate chain (PEM), with `private_key_file`.
    pub certificate_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub private_key_file: Option<PathBuf>,
}

/// Where a management server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerAddress {
    /// TCP: the `http://host:port` form a tonic endpoint takes.
    Tcp(String),
    /// A Unix domain socket (`unix:PATH` or `unix:///ABSOLUTE_PATH`), as
    /// Istio's agent serves xDS to proxyless clients.
    Unix(PathBuf),
}

/// The path of a `unix:` target, as gRPC's naming reads it; `None` for
/// other schemes.
fn unix_path(uri: &str) -> Option<&str> {
    let rest = uri.strip_prefix("unix:")?;
    Some(rest.strip_prefix("//").unwrap_or(rest))
}

impl XdsServer {
    /// Where the server listens.
    pub fn address(&self) -> ServerAddress {
        match unix_path(&self.server_uri) {
            Some(path) => ServerAddress::Unix(PathBuf::from(path)),
            None => ServerAddress::Tcp(self.endpoint_uri()),
        }
    }

    /// The `http://host:port` form a tonic endpoint takes.
    pub fn endpoint_uri(&self) -> String {
        let uri = self.server_uri.as_str();
        let rest = uri.strip_prefix("dns:///").unwrap_or(uri);
        if rest.starts_with("http://") || rest.starts_with("https://") {
            rest.to_owned()
        } else {
            format!("http://{rest}")
        }
    }

    /// Whether the server asked clients to keep LDS/CDS resources that a
    /// later state-of-the-world response leaves out.
    pub fn ignore_resource_deletion(&self) -> bool {
        self.server_features
            .iter()
            .any(|f| f == "ignore_resource_deletion")
    }

    /// gRFC A88's `fail_on_data_errors`: a data error (a NACK, a deleted
    /// LDS/CDS resource) drops the cached resource, when the client handles
    /// data errors as A88 says ([`crate::client::ClientOptions`]).
    pub fn fail_on_data_errors(&self) -> bool {
        self.server_features
            .iter()
            .any(|f| f == "fail_on_data_errors")
    }

    /// gRFC A88's `resource_timer_is_transient_error`: a resource the
    /// server does not send within the timer is a transient error (CSDS
    /// `TIMEOUT`), not a missing resource, when the client handles data
    /// errors as A88 says (15 s as in grpcio 1.85; A88's text says 30).
    pub fn resource_timer_is_transient_error(&self) -> bool {
        self.server_features
            .iter()
            .any(|f| f == "resource_timer_is_transient_error")
    }
}

/// A parsed bootstrap.
#[derive(Debug, Clone, PartialEq)]
pub struct Bootstrap {
    /// The management servers, in order; the client uses the first.
    pub servers: Vec<XdsServer>,
    /// The node this client presents.
    pub node: core::Node,
    /// `certificate_providers`: the instances a cluster's TLS (gRFC A29)
    /// may name, by instance name.
    pub certificate_providers: BTreeMap<String, CertificateProvider>,
}

/// A certificate provider instance of the bootstrap.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CertificateProvider {
    /// `file_watcher`: PEM files read again every `refresh_interval`.
    FileWatcher(FileWatcher),
}

/// The `file_watcher` plugin's config, as gRPC reads it: an identity
/// (`certificate_file` with `private_key_file`), roots
/// (`ca_certificate_file`), or both.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileWatcher {
    /// The certificate chain (PEM), with `private_key_file`.
    pub certificate_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub private_key_file: Option<PathBuf>,
    /// The roots (PEM).
    pub ca_certificate_file: Option<PathBuf>,
    /// How often the files are read again (default 10 minutes).
    pub refresh_interval: Duration,
}

impl FileWatcher {
    /// A `file_watcher` config (as the bootstrap's JSON would give it).
    pub fn new(
        certificate_file: Option<PathBuf>,
        private_key_file: Option<PathBuf>,
        ca_certificate_file: Option<PathBuf>,
        refresh_interval: Duration,
    ) -> Self {
        FileWatcher {
            certificate_file,
            private_key_file,
            ca_certificate_file,
            refresh_interval,
        }
    }
}

/// `file_watcher`'s default `refresh_interval`.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(600);
/// The shortest `refresh_interval` used, as C-core's file watcher floors it.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Environment variable naming a bootstrap file.
pub const ENV_FILE: &str = "GRPC_XDS_BOOTSTRAP";
/// Environment variable holding the bootstrap JSON.
pub const ENV_CONFIG: &str = "GRPC_XDS_BOOTSTRAP_CONFIG";

impl Bootstrap {
    /// Reads the bootstrap from `GRPC_XDS_BOOTSTRAP` (a path) or else
    /// `GRPC_XDS_BOOTSTRAP_CONFIG` (the JSON).
    pub fn from_env() -> Result<Self, BootstrapError> {
        if let Some(path) = std::env::var_os(ENV_FILE) {
            return Bootstrap::from_file(std::path::Path::new(&path));
        }
        match std::env::var(ENV_CONFIG) {
            Ok(json) => Bootstrap::from_json(&json),
            Err(_) => Err(BootstrapError::new(
                ENV_FILE,
                "",
                &format!("is not set (nor {ENV_CONFIG})"),
            )),
        }
    }

    /// Reads a bootstrap file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, BootstrapError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            BootstrapError::new(ENV_FILE, &path.display().to_string(), &e.to_string())
        })?;
        Bootstrap::from_json(&text)
    }

    /// Parses the bootstrap JSON.
    pub fn from_json(text: &str) -> Result<Self, BootstrapError> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| BootstrapError::new("(document)", "", &format!("is not JSON: {e}")))?;
        let root = object(&root, "(document)")?;
        let servers = match root.get("xds_servers") {
            Some(Value::Array(list)) if !list.is_empty() => list,
            Some(Value::Array(_)) => {
                return Err(BootstrapError::new("xds_servers", "[]", "is empty"))
            }
            Some(other) => {
                return Err(BootstrapError::new(
                    "xds_servers",
                    &other.to_string(),
                    "is not a list",
                ))
            }
            None => return Err(BootstrapError::new("xds_servers", "", "field not present")),
        };
        let mut parsed = Vec::with_capacity(servers.len());
        for (i, s) in servers.iter().enumerate() {
            parsed.push(server(s, &format!("xds_servers[{i}]"))?);
        }
        let node = match root.get("node") {
            None => core::Node::default(),
            Some(n) => node(n)?,
        };
        let certificate_providers = match root.get("certificate_providers") {
            None => BTreeMap::new(),
            Some(v) => certificate_providers(v)?,
        };
        Ok(Bootstrap {
            servers: parsed,
            node,
            certificate_providers,
        })
    }

    /// The server the client talks to (the first); an error naming
    /// `xds_servers` when there is none (`from_json` refuses such a file,
    /// a hand-built `Bootstrap` may have none).
    pub fn server(&self) -> Result<&XdsServer, BootstrapError> {
        self.servers
            .first()
            .ok_or_else(|| BootstrapError::new("xds_servers", "[]", "has no server"))
    }

    /// The node ID.
    pub fn node_id(&self) -> &str {
        &self.node.id
    }
}

fn object<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, BootstrapError> {
    v.as_object()
        .ok_or_else(|| BootstrapError::new(field, &v.to_string(), "is not an object"))
}

fn string(o: &Map<String, Value>, key: &str, field: &str) -> Result<String, BootstrapError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(BootstrapError::new(
            &format!("{field}.{key}"),
            &other.to_string(),
            "is not a string",
        )),
    }
}

fn server(v: &Value, field: &str) -> Result<XdsServer, BootstrapError> {
    let o = object(v, field)?;
    let uri = string(o, "server_uri", field)?;
    if uri.is_empty() {
        return Err(BootstrapError::new(
            &format!("{field}.server_uri"),
            "",
            "field not present",
        ));
    }
    if unix_path(&uri).is_some_and(|p| p.is_empty() || p == "/") {
        return Err(BootstrapError::new(
            &format!("{field}.server_uri"),
            &uri,
            "names no socket path (unix:PATH or unix:///ABSOLUTE_PATH)",
        ));
    }
    let creds_field = format!("{field}.channel_creds");
    // C-core requires the list and a usable type in it: a server with
    // nothing said about security is refused, not spoken to in plaintext.
    let channel_creds = match o.get("channel_creds") {
        None => return Err(BootstrapError::new(&creds_field, "", "field not present")),
        Some(Value::Array(list)) => channel_creds(list, &creds_field)?,
        Some(other) => {
            return Err(BootstrapError::new(
                &creds_field,
                &other.to_string(),
                "is not a list",
            ))
        }
    };
    let mut server_features = Vec::new();
    if let Some(list) = o.get("server_features") {
        let list = list.as_array().ok_or_else(|| {
            BootstrapError::new(
                &format!("{field}.server_features"),
                &list.to_string(),
                "is not a list",
            )
        })?;
        for f in list {
            if let Some(s) = f.as_str() {
                server_features.push(s.to_owned());
            }
        }
    }
    let mut call_creds = Vec::new();
    if let Some(list) = o.get("call_creds") {
        let at = format!("{field}.call_creds");
        let list = list
            .as_array()
            .ok_or_else(|| BootstrapError::new(&at, &list.to_string(), "is not a list"))?;
        for (i, c) in list.iter().enumerate() {
            let entry = object(c, &format!("{at}[{i}]"))?;
            let kind = string(entry, "type", &format!("{at}[{i}]"))?;
            let config = entry
                .get("config")
                .cloned()
                .unwrap_or(Value::Object(Map::new()));
            call_creds.push((kind, config));
        }
    }
    Ok(XdsServer {
        server_uri: uri,
        server_features,
        channel_creds,
        call_creds,
    })
}

fn certificate_providers(
    v: &Value,
) -> Result<BTreeMap<String, CertificateProvider>, BootstrapError> {
    let mut out = BTreeMap::new();
    for (name, def) in object(v, "certificate_providers")? {
        let field = format!("certificate_providers[{name:?}]");
        let def = object(def, &field)?;
        let plugin = string(def, "plugin_name", &field)?;
        if plugin != "file_watcher" {
            return Err(BootstrapError::new(
                &format!("{field}.plugin_name"),
                &plugin,
                "is not a known plugin (tether knows \"file_watcher\")",
            ));
        }
        let config_field = format!("{field}.config");
        let empty = Map::new();
        let config = match def.get("config") {
            None => &empty,
            Some(c) => object(c, &config_field)?,
        };
        let path = |key: &str| -> Result<Option<PathBuf>, BootstrapError> {
            let p = string(config, key, &config_field)?;
            Ok((!p.is_empty()).then(|| PathBuf::from(p)))
        };
        let watcher = FileWatcher {
            certificate_file: path("certificate_file")?,
            private_key_file: path("private_key_file")?,
            ca_certificate_file: path("ca_certificate_file")?,
            refresh_interval: match config.get("refresh_interval") {
                None => DEFAULT_REFRESH_INTERVAL,
                Some(Value::String(d)) => parse_duration(d).ok_or_else(|| {
                    BootstrapError::new(
                        &format!("{config_field}.refresh_interval"),
                        d,
                        "is not a duration such as \"600s\"",
                    )
                })?,
                Some(other) => {
                    return Err(BootstrapError::new(
                        &format!("{config_field}.refresh_interval"),
                        &other.to_string(),
                        "is not a duration string such as \"600s\"",
                    ))
                }
            },
        };
        if watcher.certificate_file.is_some() != watcher.private_key_file.is_some() {
            return Err(BootstrapError::new(
                &config_field,
                "",
                "needs both certificate_file and private_key_file, or neither",
            ));
        }
        if watcher.certificate_file.is_none() && watcher.ca_certificate_file.is_none() {
            return Err(BootstrapError::new(
                &config_field,
                "",
                "needs certificate_file or ca_certificate_file",
            ));
        }
        let mut watcher = watcher;
        // C-core's floor: a shorter interval (even 0) reads the files every
        // second, never in a busy loop.
        if watcher.refresh_interval < MIN_REFRESH_INTERVAL {
            log::warn!(
                "bootstrap {config_field}.refresh_interval: {:?} is below 1s; the files are read \
                 every second (C-core's floor)",
                watcher.refresh_interval
            );
            watcher.refresh_interval = MIN_REFRESH_INTERVAL;
        }
        out.insert(name.clone(), CertificateProvider::FileWatcher(watcher));
    }
    Ok(out)
}

/// A protobuf-JSON duration: seconds with an `s` (`"600s"`, `"0.5s"`).
fn parse_duration(text: &str) -> Option<Duration> {
    let secs: f64 = text.strip_suffix('s')?.parse().ok()?;
    (0.0..1e12)
        .contains(&secs)
        .then(|| Duration::from_secs_f64(secs))
}

/// The first `channel_creds` entry of a type tether supports.
fn channel_creds(list: &[Value], field: &str) -> Result<ChannelCreds, BootstrapError> {
    let mut types = Vec::new();
    for (i, c) in list.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let c = object(c, &at)?;
        let kind = string(c, "type", &at)?;
        match kind.as_str() {
            "insecure" => return Ok(ChannelCreds::Insecure),
            "tls" => {
                let empty = Map::new();
                let config = match c.get("config") {
                    None => &empty,
                    Some(v) => object(v, &format!("{at}.config"))?,
                };
                let path = |key: &str| -> Result<Option<PathBuf>, BootstrapError> {
                    let p = string(config, key, &format!("{at}.config"))?;
                    Ok((!p.is_empty()).then(|| PathBuf::from(p)))
                };
                let creds = TlsCreds {
                    ca_certificate_file: path("ca_certificate_file")?,
                    certificate_file: path("certificate_file")?,
                    private_key_file: path("private_key_file")?,
                };
                if creds.certificate_file.is_some() != creds.private_key_file.is_some() {
                    return Err(BootstrapError::new(
                        &format!("{at}.config"),
                        "",
                        "needs both certificate_file and private_key_file, or neither",
                    ));
                }
                return Ok(ChannelCreds::Tls(creds));
            }
            // Not supported here: gRPC goes on to the next entry.
            _ => types.push(kind),
        }
    }
    if types.is_empty() {
        return Err(BootstrapError::new(
            field,
            "[]",
            "no known creds type found (C-core's words: give at least \"insecure\" or \"tls\")",
        ));
    }
    let why = if types.iter().any(|t| t == "google_default") {
        "has no supported type (tether supports \"insecure\" and \"tls\"; google_default needs Google's \
         metadata server, which tether does not use)"
    } else {
        "has no supported type (tether supports \"insecure\" and \"tls\")"
    };
    Err(BootstrapError::new(field, &format!("{types:?}"), why))
}

fn node(v: &Value) -> Result<core::Node, BootstrapError> {
    let o = object(v, "node")?;
    let mut node = core::Node {
        id: string(o, "id", "node")?,
        cluster: string(o, "cluster", "node")?,
        user_agent_name: "tether".to_owned(),
        user_agent_version_type: Some(core::node::UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_owned(),
        )),
        client_features: vec![
            "envoy.lb.does_not_support_overprovisioning".to_owned(),
            "xds.config.resource-in-sotw".to_owned(),
        ],
        ..Default::default()
    };
    if let Some(l) = o.get("locality") {
        let lo = object(l, "node.locality")?;
        node.locality = Some(core::Locality {
            region: string(lo, "region", "node.locality")?,
            zone: string(lo, "zone", "node.locality")?,
            sub_zone: string(lo, "sub_zone", "node.locality")?,
        });
    }
    if let Some(m) = o.get("metadata") {
        object(m, "node.metadata")?;
        node.metadata = match json_to_value(m) {
            pbany::Value {
                kind: Some(pbany::value::Kind::StructValue(s)),
            } => Some(s),
            _ => None,
        };
    }
    Ok(node)
}

/// JSON to `google.protobuf.Value`.
pub(crate) fn json_to_value(v: &Value) -> pbany::Value {
    use pbany::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(pbany::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        Value::Object(o) => Kind::StructValue(pbany::Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        }),
    };
    pbany::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grpc_bootstrap() {
        let b = Bootstrap::from_json(
            r#"{"xds_servers":[{"server_uri":"dns:///127.0.0.1:18000","channel_creds":[{"type":"google_default"},{"type":"insecure"}],"server_features":["xds_v3"]}],
                "node":{"id":"n1","cluster":"c","locality":{"zone":"z"},"metadata":{"k":"v","n":1}}}"#,
        )
        .unwrap();
        assert_eq!(b.server().unwrap().endpoint_uri(), "http://127.0.0.1:18000");
        assert_eq!(b.node_id(), "n1");
        assert_eq!(b.node.locality.as_ref().unwrap().zone, "z");
        assert!(b.node.metadata.as_ref().unwrap().fields.contains_key("k"));
        assert_eq!(b.node.user_agent_name, "tether");
    }

    #[test]
    fn errors_name_field_and_value() {
        let e = |j: &str| Bootstrap::from_json(j).unwrap_err().to_string();
        assert_eq!(e("{}"), "bootstrap xds_servers: field not present");
        assert_eq!(
            e(r#"{"xds_servers":[]}"#),
            "bootstrap xds_servers: [] is empty"
        );
        assert_eq!(
            e(r#"{"xds_servers":[{"server_uri":""}]}"#),
            "bootstrap xds_servers[0].server_uri: field not present"
        );
        assert_eq!(
            e(r#"{"xds_servers":[{"server_uri":"a:1","channel_creds":[{"type":"alts"}]}]}"#),
            "bootstrap xds_servers[0].channel_creds: [\"alts\"] has no supported type (tether supports \"insecure\" and \"tls\")"
        );
        assert_eq!(
            e(r#"{"xds_servers":[{"server_uri":"a:1"}]}"#),
            "bootstrap xds_servers[0].channel_creds: field not present"
        );
        assert_eq!(
            e(r#"{"xds_servers":[{"server_uri":"a:1","channel_creds":[]}]}"#),
            "bootstrap xds_servers[0].channel_creds: [] no known creds type found (C-core's words: \
             give at least \"insecure\" or \"tls\")"
        );
        assert_eq!(
            e(
                r#"{"xds_servers":[{"server_uri":"a:1","channel_creds":[{"type":"insecure"}]}],"node":{"id":5}}"#
            ),
            "bootstrap node.id: 5 is not a string"
        );
    }
}
