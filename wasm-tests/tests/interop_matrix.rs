//! The interop matrix: a session cookie minted by each of four peers and
//! sent to each of the four, one test per cell, named
//! `<minter>_cookie_honoured_by_<reader>`:
//!
//! - `envoy_native`: Envoy 1.40's own `stateful_session` filter (stock Envoy);
//! - `tether_plugin`: the tether plugin in Envoy 1.40;
//! - `tether_channel`: `tether::Channel` on `xds:///shop`;
//! - `grpcio`: gRPC C-core (PyPI grpcio) on `xds:///shop`.
//!
//! Sealed cookies (`format: sealed`) have cells of their own: the plugin on
//! `/as-sealed` and a channel given the same keys read each other's and the
//! JavaScript package's (`js/pkg/node` under Node, built by the test
//! command's JavaScript step), JavaScript opens theirs, and every reader
//! without the keys sees no session in any of them.
//!
//! One tether-control file drives all of them: both Envoys are bootstrapped
//! with nothing but ADS from the same control plane, whose file gives Envoys
//! their own filter (`envoy.sessionFilter: native`) and the node
//! `matrix-envoy-plugin` the plugin on its own port (`envoy.nodes`); the two
//! proxyless clients dial its virtual host. Three backends answer HTTP/1.1
//! (the Envoys' browser-like requests) and gRPC (the proxyless calls) on
//! one port and say who they are.
//!
//! Every cookie is minted by its minter (taken from its `Set-Cookie`, or the
//! response's initial metadata), never built here. "Honoured" means 20 of 20
//! requests carrying it reach the cookie's backend, among three that round
//! robin would spread them over, and the reader sets no new cookie, except
//! where it only adds the cluster to a cookie that has none: then it does
//! that once, for the same backend, and a client that keeps the new cookie
//! gets no other. Where a stock reader cannot read the minter's format the
//! cell shows it (requests are balanced and each gets a fresh cookie in the
//! reader's own format), and the test next to it shows the tether `format`
//! that makes the pair work.
//!
//! The stage (control plane, backends, Envoys, channels) is started once for
//! the file by the first test that needs it and shared by all, on a runtime
//! of its own. Its Envoys and the grpcio processes die with the test process
//! (`tether_testkit::command`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

use tether::channel::SessionOptions;
use tether::xds::Bootstrap;
use tether::Channel;
use tether_core::cookie::Format;
use tether_testkit::envoy::Envoy;
use tether_testkit::grpc::{DualBackend, EchoClient, EchoRequest};
use tether_testkit::grpcio;
use tether_wasm_tests::control::Control;
use tether_wasm_tests::scenario::{
    backend_on_loopback, minted, plugin_path, sealing_keys, session_cookies, start_envoy, Minted,
    COOKIE, SEALING_SECRET,
};
use tokio::runtime::Runtime;
use tokio::sync::OnceCell;

/// The node ID of the Envoy that runs the plugin (`envoy.nodes`).
const PLUGIN_NODE: &str = "matrix-envoy-plugin";
/// The cluster of the session route: what cookies that carry one name.
const CLUSTER: &str = "shop/session";
/// The proxyless target.
const TARGET: &str = "xds:///shop";
/// Requests a reader gets with an honoured cookie.
const CALLS: usize = 20;
/// Requests a reader gets with a cookie it cannot read.
const IGNORED_CALLS: usize = 9;

/// The tether-control file: stock Envoys get their own filter, the node
/// `matrix-envoy-plugin` the plugin; `/as-grpc` and `/as-legacy` are
/// routes whose plugin writes that format (the default route writes
/// `envoy`). Proxyless clients take the default route.
fn config(native_port: u16, plugin_port: u16, backends: &[SocketAddr], keys_file: &Path) -> String {
    let endpoints = tether_wasm_tests::control::endpoints_yaml(backends);
    let session = |format: &str| {
        format!(
            "        loadBalancerPolicy:\n          strategy: Session\n          session:\n            cookie: {{ name: global-session-cookie, path: /, ttl: 600s }}\n{format}"
        )
    };
    format!(
        r#"listener:
  port: {native_port}
envoy:
  sessionFilter: native
  plugin:
    filename: {plugin}
  nodes:
    - id: {PLUGIN_NODE}
      sessionFilter: plugin
      listener: {{ port: {plugin_port} }}
virtualhosts:
  - name: shop
    domains: ["*"]
    routes:
      - conditions: [{{ prefix: /as-grpc }}]
        services: [{{ name: shop }}]
{as_grpc}      - conditions: [{{ prefix: /as-legacy }}]
        services: [{{ name: shop }}]
{as_legacy}      - conditions: [{{ prefix: /as-sealed }}]
        services: [{{ name: shop }}]
{as_sealed}      - services: [{{ name: shop }}]
{default}services:
  - name: shop
    endpoints:
{endpoints}"#,
        plugin = plugin_path(),
        as_grpc = session("            format: grpc\n"),
        as_legacy = session("            format: legacy\n"),
        as_sealed = session(&format!(
            "            format: sealed\n            keysFile: {}\n",
            keys_file.display()
        )),
        default = session(""),
    )
}

/// Everything the cells run against.
struct Stage {
    backends: Vec<DualBackend>,
    control: Control,
    native: (Envoy, SocketAddr),
    plugin: (Envoy, SocketAddr),
    /// `tether::Channel` as it comes (writing C-core's format).
    channel: Channel,
    /// `tether::Channel` writing Envoy's format.
    channel_envoy: Channel,
    /// `tether::Channel` sealing with the `/as-sealed` route's keys.
    channel_sealed: Channel,
    grpcio: grpcio::Client,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The stage's runtime, kept for the whole test process: the Envoys and
/// the grpcio processes are spawned on its workers and die with them.
static RUNTIME: LazyLock<Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("the matrix's runtime")
});

/// The stage, or why it did not start (said by every cell, at once).
static STAGE: OnceCell<Result<Stage, String>> = OnceCell::const_new();

/// Runs a cell on the stage's runtime (a worker thread, not the test's).
fn run<F>(cell: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Err(e) = RUNTIME.block_on(RUNTIME.spawn(cell)) {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("the cell did not finish: {e}"),
        }
    }
}

/// The shared stage, started by the first cell that asks.
async fn stage() -> &'static Stage {
    let started = STAGE
        .get_or_init(|| async {
            tokio::spawn(start())
                .await
                .map_err(|e| match e.try_into_panic() {
                    Ok(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "a panic".to_owned()),
                    Err(e) => e.to_string(),
                })
        })
        .await;
    match started {
        Ok(stage) => stage,
        Err(e) => panic!("the matrix's stage did not start: {e}"),
    }
}

async fn start() -> Stage {
    let mut backends = Vec::new();
    // Every backend at an address whose plain `legacy` text stock Envoy
    // misreads, so that the `legacy` cells always meet one.
    for i in 1..=3 {
        backends.push(backend_on_loopback(&format!("backend-{i}"), true).await);
    }
    let addrs: Vec<SocketAddr> = backends.iter().map(DualBackend::addr).collect();
    let (native_port, plugin_port) = (tether_testkit::free_port(), tether_testkit::free_port());
    // The `/as-sealed` route's keys, which the sealing channel holds too.
    let keys_file = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("matrix-keys-{}", std::process::id()));
    std::fs::write(&keys_file, format!("{SEALING_SECRET}\n")).expect("the keys file");
    let control = Control::start(&config(native_port, plugin_port, &addrs, &keys_file))
        .await
        .unwrap_or_else(|e| panic!("tether-control refused the matrix's file: {e}"));
    let native = start_envoy(&control.envoy_bootstrap("matrix-envoy-native")).await;
    let plugin = start_envoy(&control.envoy_bootstrap(PLUGIN_NODE)).await;
    let native = (native, SocketAddr::from(([127, 0, 0, 1], native_port)));
    let plugin = (plugin, SocketAddr::from(([127, 0, 0, 1], plugin_port)));
    for (envoy, listen) in [&native, &plugin] {
        let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
            tether_testkit::client::get(*listen, "/", &[])
                .await
                .is_ok_and(|r| r.status == 200)
        })
        .await;
        assert!(
            up,
            "Envoy's listener {listen} did not come up from tether-control; NACKs: {:?}\n{}",
            control.nacks(),
            envoy.log()
        );
    }
    let channel = |format: Format| {
        let bootstrap = Bootstrap::from_json(&control.grpc_bootstrap("matrix-channel"))
            .expect("the channel's bootstrap");
        let mut options = SessionOptions::new(format);
        if format == Format::Sealed {
            options.keys = sealing_keys();
        }
        Channel::builder()
            .bootstrap(bootstrap)
            .wait_for_ready(true)
            .session_options(options)
            .connect(TARGET)
            .expect("tether::Channel")
    };
    let dir = TempDir(
        control
            .file()
            .parent()
            .expect("the control file's directory")
            .join("grpcio"),
    );
    std::fs::create_dir_all(&dir.0).expect("the grpcio directory");
    let bootstrap = dir.0.join("bootstrap.json");
    std::fs::write(&bootstrap, control.grpc_bootstrap("matrix-grpcio")).expect("bootstrap.json");
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("py-grpcio");
    let python = grpcio::python_or_install(Some(&venv))
        .await
        .unwrap_or_else(|e| panic!("no Python with grpcio: {e}"));
    Stage {
        channel: channel(Format::Grpc),
        channel_envoy: channel(Format::Envoy),
        channel_sealed: channel(Format::Sealed),
        backends,
        control,
        native,
        plugin,
        grpcio: grpcio::Client::new(python, bootstrap),
        _dir: dir,
    }
}

/// One answered request: who answered and the session cookies it set.
#[derive(Debug, Clone)]
struct Reply {
    backend: String,
    set: Vec<Minted>,
}

/// A cookie as its minter set it, and the backend it pins.
#[derive(Debug, Clone)]
struct Session {
    cookie: Minted,
    backend: String,
}

impl Session {
    /// The `Cookie` header a client sends back (`name=value`, as set).
    fn header(&self) -> String {
        self.cookie.cookie_header()
    }
}

impl Stage {
    fn name_at(&self, addr: SocketAddr) -> &str {
        self.backends
            .iter()
            .find(|b| b.addr() == addr)
            .map_or("an unknown address", |b| b.name())
    }

    /// A browser's `GET path` through `envoy`, with `cookie` if given.
    async fn envoy(&self, envoy: &(Envoy, SocketAddr), path: &str, cookie: Option<&str>) -> Reply {
        let mut headers = Vec::new();
        if let Some(c) = cookie {
            headers.push(("cookie", c));
        }
        let r = tether_testkit::client::get(envoy.1, path, &headers)
            .await
            .unwrap_or_else(|e| panic!("GET {path} through {}: {e}\n{}", envoy.1, envoy.0.log()));
        assert_eq!(r.status, 200, "{r:?}");
        Reply {
            backend: r.header("x-backend").unwrap_or_default().to_owned(),
            set: minted(&r).into_iter().collect(),
        }
    }

    /// One Echo call through `channel`, with `cookie` if given.
    async fn call(&self, channel: &Channel, cookie: Option<&str>) -> Reply {
        let mut client = EchoClient::new(channel.clone());
        let mut req = tonic::Request::new(EchoRequest {
            message: "matrix".into(),
        });
        req.set_timeout(Duration::from_secs(10));
        if let Some(c) = cookie {
            req.metadata_mut()
                .insert("cookie", c.parse().expect("a metadata value"));
        }
        let resp = client.echo(req).await.expect("the channel's call");
        let set_cookies = tether_wasm_tests::scenario::metadata_cookies(resp.metadata());
        Reply {
            backend: resp.into_inner().backend,
            set: set_cookies,
        }
    }

    /// `calls` calls through gRPC C-core in one process, each with `cookie`,
    /// after warming up to `warm` distinct backends.
    async fn ccore(&self, warm: usize, calls: usize, cookie: Option<&str>) -> Vec<Reply> {
        let lines = self
            .grpcio
            .calls_warmed(TARGET, warm, calls, cookie)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(lines.len(), calls, "{lines:?}");
        lines
            .into_iter()
            .map(|l| {
                let set: Vec<(String, String)> = l
                    .set_cookie
                    .iter()
                    .map(|v| ("set-cookie".to_owned(), v.clone()))
                    .collect();
                Reply {
                    backend: l.backend,
                    set: session_cookies(&set),
                }
            })
            .collect()
    }

    /// The session a first request without a cookie starts at `minter`,
    /// checked: one cookie, in the minter's `format`, for the backend that
    /// answered.
    async fn mint(&self, minter: Minter, format: Format) -> Session {
        let reply = match minter {
            Minter::Native => self.envoy(&self.native, "/", None).await,
            Minter::Plugin => {
                let path = match format {
                    Format::Envoy => "/",
                    Format::Grpc => "/as-grpc",
                    Format::Legacy => "/as-legacy",
                    Format::Sealed => "/as-sealed",
                };
                self.envoy(&self.plugin, path, None).await
            }
            Minter::Channel => {
                let channel = match format {
                    Format::Grpc => &self.channel,
                    Format::Envoy => &self.channel_envoy,
                    Format::Legacy => panic!("no channel writes legacy cookies here"),
                    Format::Sealed => &self.channel_sealed,
                };
                self.call(channel, None).await
            }
            Minter::CCore => self.ccore(0, 1, None).await.remove(0),
            Minter::JavaScript => {
                // The JavaScript package seals for the first backend, as a
                // Node service in front of the mesh would.
                let backend = &self.backends[0];
                let value =
                    javascript(&["seal", &backend.addr().to_string(), CLUSTER, SEALING_SECRET]);
                let header = format!("{COOKIE}={value}; Path=/; HttpOnly");
                Reply {
                    backend: backend.name().to_owned(),
                    set: session_cookies(&[("set-cookie".to_owned(), header)]),
                }
            }
        };
        assert_eq!(reply.set.len(), 1, "{minter:?} sets one cookie: {reply:?}");
        let cookie = reply.set[0].clone();
        assert_eq!(
            cookie.decoded.format, format,
            "{minter:?}: {}",
            cookie.header
        );
        assert_eq!(
            self.name_at(cookie.address()),
            reply.backend,
            "{minter:?}'s cookie names the backend that answered: {}",
            cookie.header
        );
        Session {
            cookie,
            backend: reply.backend,
        }
    }

    /// `count` requests from `reader`, each with `cookie`. A client that
    /// `keeps` cookies sends the latest one it was given instead; C-core's
    /// client keeps none, and when it replays a cookie it first warms up to
    /// the three backends (its round robin only picks connected ones).
    async fn read(&self, reader: Reader, cookie: &str, count: usize, keeps: bool) -> Vec<Reply> {
        if let Reader::CCore = reader {
            let warm = if keeps { 0 } else { 3 };
            return self.ccore(warm, count, Some(cookie)).await;
        }
        let mut sent = cookie.to_owned();
        let mut replies = Vec::new();
        for _ in 0..count {
            let reply = match reader {
                Reader::Native => self.envoy(&self.native, "/", Some(&sent)).await,
                Reader::Plugin => self.envoy(&self.plugin, "/", Some(&sent)).await,
                Reader::PluginSealed => self.envoy(&self.plugin, "/as-sealed", Some(&sent)).await,
                Reader::Channel => self.call(&self.channel, Some(&sent)).await,
                Reader::ChannelSealed => self.call(&self.channel_sealed, Some(&sent)).await,
                Reader::CCore => unreachable!(),
            };
            if let (true, Some(m)) = (keeps, reply.set.last()) {
                sent = m.cookie_header();
            }
            replies.push(reply);
        }
        replies
    }

    /// `reader` honours `session`: [`CALLS`] requests reach its backend and
    /// no cookie is set, or (`adds_cluster`: the cookie has no cluster and
    /// the reader's format carries one) the first response sets one for the
    /// same backend in `reader`'s format, now naming the cluster, and the
    /// client that keeps it gets no other.
    async fn honours(&self, reader: Reader, session: &Session, adds_cluster: bool) {
        let replies = self.read(reader, &session.header(), CALLS, true).await;
        let landed = replies
            .iter()
            .filter(|r| r.backend == session.backend)
            .count();
        assert_eq!(
            landed,
            CALLS,
            "{reader:?} with {}: {:?}",
            session.cookie.header,
            backends(&replies)
        );
        assert!(
            self.control.nacks().is_empty(),
            "{:?}",
            self.control.nacks()
        );
        let set: Vec<(usize, &Minted)> = replies
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.set.iter().map(move |m| (i, m)))
            .collect();
        if !adds_cluster {
            assert!(
                set.is_empty(),
                "{reader:?} set a cookie for {}: {set:?}",
                session.cookie.header
            );
            return;
        }
        assert_eq!(set.len(), 1, "{reader:?} adds the cluster once: {set:?}");
        let (i, m) = set[0];
        assert_eq!(i, 0, "on the first request: {set:?}");
        assert_eq!(m.address(), session.cookie.address(), "{}", m.header);
        assert_eq!(m.decoded.format, reader.format(), "{}", m.header);
        assert_eq!(m.decoded.cookie.cluster.as_deref(), Some(CLUSTER));
    }

    /// `reader` cannot read `session`'s cookie: each of [`IGNORED_CALLS`]
    /// requests carrying it is balanced (they reach more than one backend)
    /// and gets a fresh cookie in `reader`'s own format for the backend
    /// that answered.
    async fn ignores(&self, reader: Reader, session: &Session) {
        let replies = self
            .read(reader, &session.header(), IGNORED_CALLS, false)
            .await;
        for r in &replies {
            assert_eq!(r.set.len(), 1, "{reader:?} sets a fresh cookie: {r:?}");
            let m = &r.set[0];
            assert_eq!(m.decoded.format, reader.format(), "{}", m.header);
            assert_eq!(self.name_at(m.address()), r.backend, "{}", m.header);
        }
        assert!(
            self.control.nacks().is_empty(),
            "{:?}",
            self.control.nacks()
        );
        let spread: BTreeSet<&str> = replies.iter().map(|r| r.backend.as_str()).collect();
        assert!(
            spread.len() > 1,
            "{reader:?} balances requests carrying {}: {:?}",
            session.cookie.header,
            backends(&replies)
        );
    }
}

fn backends(replies: &[Reply]) -> Vec<&str> {
    replies.iter().map(|r| r.backend.as_str()).collect()
}

/// Who mints a cookie.
#[derive(Debug, Clone, Copy)]
enum Minter {
    Native,
    Plugin,
    Channel,
    CCore,
    /// The JavaScript package (`js/pkg/node`) under Node.
    JavaScript,
}

/// Runs the JavaScript package under Node: `seal ADDRESS CLUSTER KEY`
/// prints a sealed value (`encode`, a random nonce); `open VALUE [KEY]`
/// prints what `decode` makes of it as JSON, or `{"error": CODE}`. The
/// package is built by the test command's JavaScript step (`js/build.sh`).
fn javascript(args: &[&str]) -> String {
    let module = tether_wasm_tests::scenario::repo_root().join("js/pkg/node/tether_js.js");
    assert!(
        module.exists(),
        "{} is missing: build the JavaScript package first (js/build.sh; the test command does)",
        module.display()
    );
    let script = r#"
const [mode, a, b, c] = process.argv.slice(1);
const { encode, decode } = require(process.env.TETHER_JS);
if (mode === "seal") {
  process.stdout.write(encode({ addresses: [a], cluster: b, ttl: 600, format: "sealed", keys: [c] }));
} else {
  try {
    process.stdout.write(JSON.stringify(decode(a, b ? { keys: [b] } : {})));
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: e.code }));
  }
}
"#;
    let out = std::process::Command::new("node")
        .arg("-e")
        .arg(script)
        .args(args)
        .env("TETHER_JS", &module)
        .output()
        .unwrap_or_else(|e| panic!("node: {e}"));
    assert!(
        out.status.success(),
        "node {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 from node")
}

/// Who is sent it.
#[derive(Debug, Clone, Copy)]
enum Reader {
    Native,
    Plugin,
    /// The plugin on the `/as-sealed` route, which holds the keys.
    PluginSealed,
    Channel,
    /// The channel given the same keys.
    ChannelSealed,
    CCore,
}

impl Reader {
    /// The format the reader writes (on its default route, as it comes).
    fn format(self) -> Format {
        match self {
            Reader::Native | Reader::Plugin => Format::Envoy,
            Reader::Channel | Reader::CCore => Format::Grpc,
            Reader::PluginSealed | Reader::ChannelSealed => Format::Sealed,
        }
    }
}

// Minted by Envoy's own filter: Envoy's format (no cluster, quoted).

#[test]
fn envoy_native_cookie_honoured_by_envoy_native() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Native, Format::Envoy).await;
        assert_eq!(session.cookie.decoded.cookie.cluster, None);
        s.honours(Reader::Native, &session, false).await;
    });
}

#[test]
fn envoy_native_cookie_honoured_by_tether_plugin() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Native, Format::Envoy).await;
        // The plugin adds the route's cluster once, as C-core would.
        s.honours(Reader::Plugin, &session, true).await;
    });
}

#[test]
fn envoy_native_cookie_honoured_by_tether_channel() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Native, Format::Envoy).await;
        // The channel adds the cluster once, in its own (C-core's) format.
        s.honours(Reader::Channel, &session, true).await;
    });
}

/// C-core cannot read Envoy's cookie (a protobuf, and quoted).
#[test]
fn envoy_native_cookie_honoured_by_grpcio() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Native, Format::Envoy).await;
        s.ignores(Reader::CCore, &session).await;
    });
}

/// What makes it work: the cookie passes once through the plugin on a route
/// with `format: grpc`, which honours it and adds the cluster in C-core's
/// format; C-core honours that.
#[test]
fn envoy_native_cookie_honoured_by_grpcio_after_the_plugin_writing_grpc() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Native, Format::Envoy).await;
        let reply = s
            .envoy(&s.plugin, "/as-grpc", Some(&session.header()))
            .await;
        assert_eq!(reply.backend, session.backend);
        assert_eq!(reply.set.len(), 1, "{reply:?}");
        let rewritten = Session {
            cookie: reply.set[0].clone(),
            backend: reply.backend,
        };
        assert_eq!(rewritten.cookie.decoded.format, Format::Grpc);
        assert_eq!(rewritten.cookie.address(), session.cookie.address());
        s.honours(Reader::CCore, &rewritten, false).await;
    });
}

// Minted by the tether plugin: Envoy's format by default (with the cluster).

#[test]
fn tether_plugin_cookie_honoured_by_envoy_native() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Plugin, Format::Envoy).await;
        assert_eq!(
            session.cookie.decoded.cookie.cluster.as_deref(),
            Some(CLUSTER)
        );
        s.honours(Reader::Native, &session, false).await;
    });
}

#[test]
fn tether_plugin_cookie_honoured_by_tether_plugin() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Plugin, Format::Envoy).await;
        s.honours(Reader::Plugin, &session, false).await;
    });
}

#[test]
fn tether_plugin_cookie_honoured_by_tether_channel() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Plugin, Format::Envoy).await;
        s.honours(Reader::Channel, &session, false).await;
    });
}

/// C-core cannot read the plugin's default format (Envoy's).
#[test]
fn tether_plugin_cookie_honoured_by_grpcio() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Plugin, Format::Envoy).await;
        s.ignores(Reader::CCore, &session).await;
    });
}

/// What makes it work: the plugin writing `format: grpc`.
#[test]
fn tether_plugin_cookie_in_grpc_format_honoured_by_grpcio() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Plugin, Format::Grpc).await;
        assert_eq!(
            session.cookie.decoded.cookie.cluster.as_deref(),
            Some(CLUSTER)
        );
        s.honours(Reader::CCore, &session, false).await;
    });
}

/// The plugin writing `format: legacy` (`ip:port` alone, the value bare as
/// C-core writes values) makes one cookie every peer reads: stock Envoy
/// honours it as is, C-core too (and adds the cluster once, A60), which it
/// would not with a quoted value.
#[test]
fn tether_plugin_cookie_in_legacy_format_honoured_by_envoy_native_and_grpcio() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Plugin, Format::Legacy).await;
        assert!(
            !session.cookie.value.starts_with('"'),
            "{}",
            session.cookie.header
        );
        s.honours(Reader::Native, &session, false).await;
        // C-core's client here keeps no cookie, so C-core adds the cluster on
        // every response; each call still lands on the cookie's backend, and
        // each new cookie names that backend and the cluster (A60).
        let replies = s.read(Reader::CCore, &session.header(), CALLS, true).await;
        assert_eq!(replies.len(), CALLS);
        for r in &replies {
            assert_eq!(r.backend, session.backend, "{}", session.cookie.header);
            for m in &r.set {
                assert_eq!(m.address(), session.cookie.address(), "{}", m.header);
                assert_eq!(m.decoded.cookie.cluster.as_deref(), Some(CLUSTER));
            }
        }
    });
}

// Minted by tether::Channel: C-core's format by default.

/// Stock Envoy cannot read C-core's format.
#[test]
fn tether_channel_cookie_honoured_by_envoy_native() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Channel, Format::Grpc).await;
        s.ignores(Reader::Native, &session).await;
    });
}

/// What makes it work: the channel writing `format: envoy`
/// (`SessionOptions::format`).
#[test]
fn tether_channel_cookie_in_envoy_format_honoured_by_envoy_native() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Channel, Format::Envoy).await;
        s.honours(Reader::Native, &session, false).await;
    });
}

#[test]
fn tether_channel_cookie_honoured_by_tether_plugin() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Channel, Format::Grpc).await;
        s.honours(Reader::Plugin, &session, false).await;
    });
}

#[test]
fn tether_channel_cookie_honoured_by_tether_channel() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Channel, Format::Grpc).await;
        s.honours(Reader::Channel, &session, false).await;
    });
}

/// C-core honours the channel's cookie, which is byte for byte the one
/// C-core writes itself for that backend (Set-Cookie included).
#[test]
fn tether_channel_cookie_honoured_by_grpcio() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::Channel, Format::Grpc).await;
        assert!(
            session
                .cookie
                .header
                .ends_with("; HttpOnly; Path=/; Max-Age=600"),
            "{}",
            session.cookie.header
        );
        s.honours(Reader::CCore, &session, false).await;
        let same_backend = s
            .ccore(3, 12, None)
            .await
            .into_iter()
            .find(|r| r.backend == session.backend)
            .expect("C-core reached the channel's backend within 12 calls");
        assert_eq!(same_backend.set.len(), 1, "{same_backend:?}");
        assert_eq!(same_backend.set[0].header, session.cookie.header);
    });
}

// Sealed (`format: sealed`): read by tether holding the keys, no session
// anywhere else.

/// Sealed cookies, whether the plugin, the channel or the JavaScript
/// package sealed them, pin at the plugin and the channel holding the
/// same keys.
#[test]
fn tether_sealed_cookies_honoured_by_tether_plugin_and_tether_channel_with_the_keys() {
    run(async {
        let s = stage().await;
        for minter in [Minter::Plugin, Minter::Channel, Minter::JavaScript] {
            let session = s.mint(minter, Format::Sealed).await;
            s.honours(Reader::PluginSealed, &session, false).await;
            s.honours(Reader::ChannelSealed, &session, false).await;
        }
    });
}

/// Fail closed: stock Envoy, C-core, and the plugin and the channel
/// without the keys see no session in a sealed cookie (each balances and
/// sets its own), whoever sealed it.
#[test]
fn sealed_cookies_are_no_session_to_every_reader_without_the_keys() {
    run(async {
        let s = stage().await;
        for minter in [Minter::Plugin, Minter::Channel, Minter::JavaScript] {
            let session = s.mint(minter, Format::Sealed).await;
            for reader in [
                Reader::Native,
                Reader::CCore,
                Reader::Plugin,
                Reader::Channel,
            ] {
                s.ignores(reader, &session).await;
            }
        }
    });
}

/// The JavaScript package opens the plugin's and the channel's sealed
/// cookies with the keys, and sees no session in them without.
#[test]
fn tether_sealed_cookies_opened_by_javascript_with_the_keys() {
    run(async {
        let s = stage().await;
        for minter in [Minter::Plugin, Minter::Channel] {
            let session = s.mint(minter, Format::Sealed).await;
            let value = session.cookie.value.trim_matches('"');
            let opened: serde_json::Value =
                serde_json::from_str(&javascript(&["open", value, SEALING_SECRET])).unwrap();
            assert_eq!(opened["format"], "sealed", "{minter:?}: {opened}");
            assert_eq!(
                opened["addresses"][0],
                session.cookie.address().to_string(),
                "{minter:?}: {opened}"
            );
            assert_eq!(opened["cluster"], CLUSTER, "{minter:?}: {opened}");
            let closed: serde_json::Value =
                serde_json::from_str(&javascript(&["open", value])).unwrap();
            assert_eq!(closed["error"], "sealed", "{minter:?}: {closed}");
        }
    });
}

// Minted by gRPC C-core: its own format (with the cluster, unquoted).

/// Stock Envoy cannot read C-core's format; an Envoy running the plugin
/// can (next test): there is no format to choose on C-core's side.
#[test]
fn grpcio_cookie_honoured_by_envoy_native() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::CCore, Format::Grpc).await;
        s.ignores(Reader::Native, &session).await;
    });
}

#[test]
fn grpcio_cookie_honoured_by_tether_plugin() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::CCore, Format::Grpc).await;
        s.honours(Reader::Plugin, &session, false).await;
    });
}

#[test]
fn grpcio_cookie_honoured_by_tether_channel() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::CCore, Format::Grpc).await;
        s.honours(Reader::Channel, &session, false).await;
    });
}

#[test]
fn grpcio_cookie_honoured_by_grpcio() {
    run(async {
        let s = stage().await;
        let session = s.mint(Minter::CCore, Format::Grpc).await;
        assert_eq!(
            session.cookie.decoded.cookie.cluster.as_deref(),
            Some(CLUSTER)
        );
        s.honours(Reader::CCore, &session, false).await;
    });
}

/// A cookie older writers left behind: the plain `legacy` text of a
/// backend's address, which stock Envoy takes for a protobuf (every backend
/// here sits at such an address). Stock Envoy ignores it and balances; the
/// plugin pins it, re-issues it guarded (which stock Envoy then honours) and
/// counts it in Envoy's stats (custom wasm stats are under `wasmcustom.`;
/// the plugin hands its counts over once a second).
#[test]
fn a_plain_legacy_cookie_stock_envoy_misreads_is_pinned_and_respelled_by_the_plugin() {
    run(async {
        let s = stage().await;
        let backend = &s.backends[0];
        let plain = tether_core::cookie::encode_header(
            &tether_core::SessionCookie::new(tether_core::AddressList::one(backend.addr())),
            Format::Legacy,
            None,
        )
        .unwrap();
        let header = format!("{}={plain}", tether_wasm_tests::scenario::COOKIE);
        let stock = s.envoy(&s.native, "/", Some(&header)).await;
        assert_eq!(stock.set.len(), 1, "stock Envoy mints its own: {stock:?}");
        let before = s
            .plugin
            .0
            .stat("wasmcustom.tether.session_cookie_envoy_misreads")
            .await;
        let reply = s.envoy(&s.plugin, "/as-legacy", Some(&header)).await;
        assert_eq!(reply.backend, backend.name(), "{reply:?}");
        assert_eq!(reply.set.len(), 1, "{reply:?}");
        let respelled = Session {
            cookie: reply.set[0].clone(),
            backend: reply.backend.clone(),
        };
        assert!(
            !respelled.cookie.decoded.envoy_misreads,
            "{}",
            respelled.cookie.header
        );
        // The plugin hands its counts to Envoy once a second.
        let counted = tether_testkit::wait_until(Duration::from_secs(10), || async {
            s.plugin
                .0
                .stat("wasmcustom.tether.session_cookie_envoy_misreads")
                .await
                .unwrap_or(0)
                > before.unwrap_or(0)
        })
        .await;
        let after = s
            .plugin
            .0
            .stat("wasmcustom.tether.session_cookie_envoy_misreads")
            .await;
        assert!(counted, "not counted within 10 s");
        assert_eq!(
            after.unwrap_or(0),
            before.unwrap_or(0) + 1,
            "{}",
            s.plugin
                .0
                .admin_get("/stats?filter=misreads")
                .await
                .unwrap_or_default()
        );
        s.honours(Reader::Native, &respelled, false).await;
    });
}
