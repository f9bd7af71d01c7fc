//! Runs the real `tether-control` binary on 127.0.0.1 with a configuration
//! file the test rewrites; the process is killed when the handle drops.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The `tether-control` binary: this package's own when the tests are
/// tether-control's, else the workspace's (the channel's and the CLI's
/// tests include this file too).
pub fn control_binary() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_tether-control") {
        Some(path) => PathBuf::from(path),
        None => tether_testkit::workspace_bin("tether-control", "tether-control"),
    }
}

/// A service's `endpoints:` entries for `addrs`, indented as under a
/// service of a tether-control file.
pub fn endpoints_yaml(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| format!("      - address: \"{a}\"\n"))
        .collect()
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!("tether-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl TempDir {
    /// Writes `bootstrap.json` (an xDS bootstrap) here; returns its path.
    pub fn bootstrap(&self, json: &str) -> PathBuf {
        let path = self.0.join("bootstrap.json");
        std::fs::write(&path, json).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `tether-control`.
pub struct Control {
    child: Child,
    pub addr: SocketAddr,
    /// The admin listener's address, when started with `--admin`.
    pub admin: Option<SocketAddr>,
    pub config: PathBuf,
    stderr: Arc<Mutex<String>>,
    _dir: TempDir,
}

impl Control {
    /// Writes `yaml` and starts the binary on a free port, polling the file
    /// every 50 ms.
    pub async fn start(yaml: &str) -> Control {
        Control::start_polling(yaml, 50).await
    }

    /// As [`Control::start`], polling the file every `poll_ms`.
    pub async fn start_polling(yaml: &str, poll_ms: u64) -> Control {
        Control::start_with(yaml, poll_ms, false).await
    }

    /// As [`Control::start`], with the admin listener on a free port.
    #[allow(dead_code)]
    pub async fn start_with_admin(yaml: &str) -> Control {
        Control::start_with(yaml, 50, true).await
    }

    async fn start_with(yaml: &str, poll_ms: u64, admin: bool) -> Control {
        let dir = TempDir::new("control");
        let config = dir.0.join("tether.yaml");
        std::fs::write(&config, yaml).unwrap();
        let mut child = Command::new(control_binary())
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--poll-ms"])
            .arg(poll_ms.to_string())
            .args(if admin {
                &["--admin", "127.0.0.1:0"][..]
            } else {
                &[]
            })
            .arg("-v")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn tether-control");
        let stderr = Arc::new(Mutex::new(String::new()));
        let err_pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(err_pipe).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&l);
                s.push('\n');
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), out.next_line())
            .await
            .expect("tether-control did not start in 20 s")
            .unwrap()
            .unwrap_or_default();
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| {
                panic!("unexpected first line {line:?}: {}", stderr.lock().unwrap())
            });
        let admin = if admin {
            let line = tokio::time::timeout(Duration::from_secs(20), out.next_line())
                .await
                .expect("tether-control did not open its admin listener in 20 s")
                .unwrap()
                .unwrap_or_default();
            Some(
                line.strip_prefix("admin on ")
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("unexpected second line {line:?}")),
            )
        } else {
            None
        };
        Control {
            child,
            addr,
            admin,
            config,
            stderr,
            _dir: dir,
        }
    }

    /// The status of the DRAINING (or lately removed) endpoint `address`
    /// in `GET /drain` (the admin listener) now: `null` when it is not
    /// listed, a string when the page could not be read.
    #[allow(dead_code)]
    pub async fn drain_of(&self, address: SocketAddr) -> serde_json::Value {
        let admin = self.admin.expect("started with --admin");
        match tether_testkit::client::get(admin, "/drain", &[]).await {
            Ok(page) => page.json()["endpoints"]
                .as_array()
                .and_then(|l| l.iter().find(|e| e["address"] == address.to_string()))
                .cloned()
                .unwrap_or_default(),
            Err(e) => serde_json::Value::String(e),
        }
    }

    /// The status of the DRAINING endpoint `address` in `GET /drain` (the
    /// admin listener), once it satisfies `want`; panics after 30 s,
    /// naming `what` and the last status.
    #[allow(dead_code)]
    pub async fn until_drain(
        &self,
        address: SocketAddr,
        what: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let start = std::time::Instant::now();
        loop {
            let last = self.drain_of(address).await;
            if want(&last) {
                return last;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{what}: the status of {address} is {last}"
            );
            // The status changes with each report (a second apart at most
            // in the tests).
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET /status` (the admin listener) once it satisfies `want`; panics
    /// after 30 s, naming `what` and the last page.
    #[allow(dead_code)]
    pub async fn until_status(
        &self,
        what: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let admin = self.admin.expect("started with --admin");
        tether_testkit::client::until_json(admin, "/status", what, want).await
    }

    /// A JSON page of the admin listener (`path` with its query, e.g.
    /// `/load?node=N`).
    #[allow(dead_code)]
    pub async fn admin_json(&self, path: &str) -> serde_json::Value {
        let admin = self.admin.expect("started with --admin");
        tether_testkit::client::get(admin, path, &[])
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .json()
    }

    /// The admin listener's `/metrics` page.
    #[allow(dead_code)]
    pub async fn metrics(&self) -> String {
        let admin = self.admin.expect("started with --admin");
        tether_testkit::client::get(admin, "/metrics", &[])
            .await
            .map(|page| page.body)
            .unwrap_or_else(|e| panic!("GET /metrics: {e}"))
    }

    /// Replaces the configuration file (atomically, as editors do).
    pub fn write(&self, yaml: &str) {
        let tmp = self.config.with_extension("tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &self.config).unwrap();
    }

    /// What the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until stderr contains `needle`.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while tokio::time::Instant::now() < deadline {
            if self.stderr().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Whether no client NACKed anything (the server logs NACKs).
    pub fn nacks_none(&self) -> bool {
        !self.stderr().contains("NACK")
    }

    /// Sends SIGHUP (through `kill(1)`, to keep the tests free of libc).
    pub async fn hangup(&self) {
        let pid = self.child.id().expect("tether-control is running");
        let status = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .await
            .expect("run kill");
        assert!(status.success(), "kill -HUP {pid}: {status}");
    }

    /// Kills the process.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// A gRPC-style bootstrap JSON for this server.
    pub fn bootstrap_json(&self, node: &str) -> String {
        format!(
            r#"{{"xds_servers":[{{"server_uri":"{}","channel_creds":[{{"type":"insecure"}}],"server_features":["xds_v3"]}}],"node":{{"id":"{node}","cluster":"tether-test"}}}}"#,
            self.addr
        )
    }
}

/// `node`'s entry in `GET /status`'s `clients` (`status`), or `null`.
#[allow(dead_code)]
pub fn status_client(status: &serde_json::Value, node: &str) -> serde_json::Value {
    status["clients"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["node"] == node))
        .cloned()
        .unwrap_or_default()
}

/// The virtual host `echo.tether.test` behind C-core's session cookie
/// (`grpc-session`, sessions kept on DRAINING endpoints) to the service
/// `echo`, which reports load every 0.5 s: `a1` HEALTHY in `locality1`,
/// `a2` DRAINING in `locality2`.
#[allow(dead_code)]
pub fn echo_drain_yaml(a1: SocketAddr, locality1: &str, a2: SocketAddr, locality2: &str) -> String {
    echo_session_yaml(
        "0.5s",
        &[(a1, locality1, "HEALTHY"), (a2, locality2, "DRAINING")],
    )
}

/// The virtual host `echo.tether.test` behind C-core's session cookie
/// (`grpc-session`, sessions kept on DRAINING endpoints) to the service
/// `echo`, which reports load every `interval`, over `endpoints` (address,
/// locality, health).
#[allow(dead_code)]
pub fn echo_session_yaml(interval: &str, endpoints: &[(SocketAddr, &str, &str)]) -> String {
    let mut eps = String::new();
    for (address, locality, health) in endpoints {
        eps += &format!(
            "      - address: {address}\n        locality: {locality}\n        health: {health}\n"
        );
    }
    format!(
        r#"virtualhosts:
  - name: echo.tether.test
    routes:
      - services: [{{ name: echo }}]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: grpc-session, path: /, ttl: 60s }}
            overrideHostStatus: [UNKNOWN, HEALTHY, DRAINING]
services:
  - name: echo
    protocol: h2c
    loadReporting: {{ interval: {interval} }}
    endpoints:
{eps}"#
    )
}

/// A tether channel on `target` with node `tether_node` and a grpcio
/// client with node `core_node`, both through `control`, their bootstraps
/// in `dir`.
#[allow(dead_code)]
pub async fn channel_and_grpcio(
    control: &Control,
    dir: &TempDir,
    target: &str,
    tether_node: &str,
    core_node: &str,
) -> (tether::Channel, tether_testkit::grpcio::Client) {
    let tether_bootstrap = dir.0.join("tether.json");
    std::fs::write(&tether_bootstrap, control.bootstrap_json(tether_node)).unwrap();
    let channel = tether::Channel::builder()
        .bootstrap(tether_xds::Bootstrap::from_file(&tether_bootstrap).unwrap())
        .connect(target)
        .unwrap();
    let core = grpcio_client(&dir.bootstrap(&control.bootstrap_json(core_node))).await;
    (channel, core)
}

/// One Echo call over `channel` with the metadata `cookie` (10 s
/// deadline); the backend that answered.
#[allow(dead_code)]
pub async fn echo_with_cookie(
    channel: &tether::Channel,
    cookie: &str,
) -> Result<String, tonic::Status> {
    let mut request = tonic::Request::new(tether_testkit::grpc::EchoRequest {
        message: "x".into(),
    });
    request.set_timeout(std::time::Duration::from_secs(10));
    request
        .metadata_mut()
        .insert("cookie", cookie.parse().expect("a cookie metadata value"));
    tether_testkit::grpc::EchoClient::new(channel.clone())
        .echo(request)
        .await
        .map(|r| r.into_inner().backend)
}

/// The grpcio client over `bootstrap`: python3's grpcio, or one installed
/// into a virtual environment under the target directory (once).
#[allow(dead_code)]
pub async fn grpcio_client(bootstrap: &std::path::Path) -> tether_testkit::grpcio::Client {
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-grpcio");
    let py = tether_testkit::grpcio::python_or_install(Some(&venv))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    tether_testkit::grpcio::Client::new(py, bootstrap)
}

/// The `grpc-session` cookie (C-core's format) pinning `echo/session` to `to`.
#[allow(dead_code)]
pub fn session_cookie(to: SocketAddr) -> String {
    let mut pinned = tether_core::cookie::SessionCookie::new(tether_core::AddressList::one(to));
    pinned.cluster = Some("echo/session".to_owned());
    let value = tether_core::cookie::encode(&pinned, tether_core::Format::Grpc, None).unwrap();
    format!("grpc-session={value}")
}
