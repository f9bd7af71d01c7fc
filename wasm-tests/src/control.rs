//! tether-control run in-process on 127.0.0.1, serving a YAML file that a
//! scenario (or the demo) rewrites, with the bootstraps that point Envoy and
//! proxyless clients at it. It is the same code the `tether-control` binary
//! runs ([`Reloader`] and [`ControlPlane::serve`]); everything stops when the
//! [`Control`] is dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tether_control::server::Nack;
use tether_control::{ControlPlane, Reload, Reloader};
use tokio::task::JoinHandle;

/// How often the file is checked for changes.
pub const POLL: Duration = Duration::from_millis(50);

/// A running control plane and the file it watches.
pub struct Control {
    addr: SocketAddr,
    file: PathBuf,
    dir: PathBuf,
    plane: ControlPlane,
    tasks: Vec<JoinHandle<()>>,
}

/// A tether-control file's `endpoints:` list for `addrs`, indented for a
/// service's `endpoints` key (six spaces).
pub fn endpoints_yaml(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| format!("      - address: {a}\n"))
        .collect()
}

impl Control {
    /// Writes `yaml` to a private file and serves it over ADS on a free
    /// 127.0.0.1 port; fails with tether-control's message when the file is
    /// refused.
    pub async fn start(yaml: &str) -> Result<Control, String> {
        static N: AtomicU64 = AtomicU64::new(0);
        tether_testkit::sweep_stale_temp_dirs();
        let dir = std::env::temp_dir().join(format!(
            "tether-control-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let file = dir.join("tether.yaml");
        write_atomically(&file, yaml)?;
        let (plane, reloader) = Reloader::start(&file).map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind the ADS listener: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("ADS listener address: {e}"))?;
        let serve = tokio::spawn({
            let plane = plane.clone();
            async move {
                if let Err(e) = plane.serve(listener, std::future::pending()).await {
                    log::warn!("tether-control stopped: {e}");
                }
            }
        });
        let watch = tokio::spawn(reloader.run(POLL, |r| {
            if let Reload::Rejected(e) = r {
                log::warn!("tether-control rejected the file: {e}");
            }
        }));
        Ok(Control {
            addr,
            file,
            dir,
            plane,
            tasks: vec![serve, watch],
        })
    }

    /// Where it serves ADS.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The file it watches.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The version it serves (1 at start, one more per published change).
    pub fn version(&self) -> u64 {
        self.plane.snapshot().version
    }

    /// The NACKs clients sent so far.
    pub fn nacks(&self) -> Vec<Nack> {
        self.plane.nacks()
    }

    /// Replaces the file (atomically, as editors do) and waits (at most
    /// 5 s) until the new content is served; returns the new version.
    pub async fn rewrite(&self, yaml: &str) -> Result<u64, String> {
        let before = self.version();
        write_atomically(&self.file, yaml)?;
        let published = tether_testkit::wait_until(Duration::from_secs(5), || async {
            self.version() > before
        })
        .await;
        if published {
            Ok(self.version())
        } else {
            Err(format!(
                "tether-control did not publish {} within 5 s (still version {before})",
                self.file.display()
            ))
        }
    }

    /// An Envoy bootstrap with only an ADS cluster pointing here and an
    /// admin listener on an ephemeral 127.0.0.1 port.
    pub fn envoy_bootstrap(&self, node_id: &str) -> String {
        tether_testkit::envoy::ads_bootstrap(self.addr, node_id)
    }

    /// A gRPC xDS bootstrap (JSON) pointing here, for proxyless clients.
    pub fn grpc_bootstrap(&self, node_id: &str) -> String {
        serde_json::json!({
            "xds_servers": [ { "server_uri": self.addr.to_string(),
                               "channel_creds": [ { "type": "insecure" } ],
                               "server_features": ["xds_v3"] } ],
            "node": { "id": node_id, "cluster": "tether-demo" }
        })
        .to_string()
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write_atomically(file: &Path, text: &str) -> Result<(), String> {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, file).map_err(|e| format!("rename to {}: {e}", file.display()))
}
