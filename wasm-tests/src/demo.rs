//! tether's cross-compatibility demo (`scripts/demo.sh`): one session
//! across Envoy 1.40 with the tether plugin, gRPC C-core (PyPI grpcio) and
//! `tether::Channel`, all driven by one tether-control file
//! (`src/demo.yaml`), on 127.0.0.1.
//!
//! [`run`] starts tether-control (in-process), three backends that answer
//! HTTP/1.1 and gRPC on one port and say who they are, Envoy bootstrapped
//! with only ADS, a `tether::Channel` on `xds:///shop`, and, when a Python
//! with grpcio is given, the C-core client of `testkit/peers`. It then
//! plays three steps, one function each, and returns what happened: rows of
//! a table and a verdict per step. Everything it started stops when it
//! returns (or when the future is dropped).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tether::xds::Bootstrap;
use tether::Channel;
use tether_core::cookie::Format;
use tether_testkit::envoy::Envoy;
use tether_testkit::grpc::{DualBackend, EchoClient, EchoRequest};
use tether_testkit::grpcio;

use crate::control::Control;
use crate::scenario::{minted, plugin_path, session_cookies, start_envoy, Minted};

/// The demo's tether-control file, with `@LISTEN@`, `@PLUGIN@`, `@SHOP@`
/// and `@CATALOG@` to fill in.
pub const CONFIG: &str = include_str!("demo.yaml");

/// The route cluster of the session route (what cookies in C-core's format name).
pub const SESSION_CLUSTER: &str = "shop/session";

/// How many users step 3 hashes.
const USERS: usize = 8;
/// How many new sessions step 2 starts per client while a backend drains.
const NEW_SESSIONS: usize = 6;
/// The longest wait for a peer to see a change.
const CONVERGE: Duration = Duration::from_secs(15);

/// One line of a step's table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Who sent the request.
    pub client: String,
    /// The session cookie (or header) it carried.
    pub sent: String,
    /// The backend(s) that answered.
    pub answered: String,
    /// The session cookie the response set, decoded.
    pub received: String,
}

/// A step of the story.
#[derive(Debug, Clone)]
pub struct Step {
    /// What it shows.
    pub title: String,
    /// What happened.
    pub rows: Vec<Row>,
    /// Whether it showed it.
    pub ok: bool,
    /// One line saying so.
    pub verdict: String,
}

/// One answered request.
#[derive(Debug, Clone)]
struct Hop {
    backend: String,
    set: Option<Minted>,
}

/// Everything the story runs against.
struct Stage {
    backends: Vec<DualBackend>,
    control: Control,
    envoy: Envoy,
    listen: SocketAddr,
    channel: Channel,
    /// The C-core client, when C-core plays.
    ccore: Option<grpcio::Client>,
    dir: PathBuf,
    /// The shop service's endpoints: (address, health or None when removed).
    shop: Vec<(SocketAddr, Option<&'static str>)>,
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The demo's file with the addresses filled in; `shop` lists the session
/// service's endpoints with their health (left out when `None`).
pub fn config(
    listen: u16,
    plugin: &str,
    shop: &[(SocketAddr, Option<&str>)],
    catalog: &[SocketAddr],
) -> String {
    let shop: String = shop
        .iter()
        .filter_map(|(a, h)| h.map(|h| format!("      - address: {a}\n        health: {h}\n")))
        .collect();
    let catalog = crate::control::endpoints_yaml(catalog);
    CONFIG
        .replace("@LISTEN@", &listen.to_string())
        .replace("@PLUGIN@", plugin)
        .replace("@SHOP@\n", &shop)
        .replace("@CATALOG@\n", &catalog)
}

/// A Python that imports grpc: `$TETHER_PYTHON`, `python3`, or the
/// virtual environment the `control_grpc` tests create under
/// `target/tmp/py-grpcio`. `None` when there is none.
pub async fn find_python() -> Option<PathBuf> {
    grpcio::find_python(None).await
}

/// Runs the story; `python` (with grpcio) adds the C-core client. An error
/// is a part that did not start; a step that fails says so in its verdict.
pub async fn run(python: Option<PathBuf>) -> Result<Vec<Step>, String> {
    let stage = start(python).await?;
    let mut steps = Vec::new();
    let (step, sessions) = one_session_three_clients(&stage).await;
    steps.push(step);
    let mut stage = stage;
    steps.push(drain_then_remove(&mut stage, sessions.as_ref()).await);
    steps.push(request_hash(&stage).await);
    Ok(steps)
}

async fn start(python: Option<PathBuf>) -> Result<Stage, String> {
    let mut backends = Vec::new();
    for i in 1..=3 {
        backends.push(DualBackend::start(&format!("backend-{i}")).await);
    }
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr()).collect();
    let shop: Vec<(SocketAddr, Option<&'static str>)> =
        addrs.iter().map(|a| (*a, Some("HEALTHY"))).collect();
    let port = tether_testkit::free_port();
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let control = Control::start(&config(port, &plugin_path(), &shop, &addrs)).await?;
    let envoy = start_envoy(&control.envoy_bootstrap("demo-envoy")).await;
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        tether_testkit::client::get(listen, "/", &[])
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
    if !up {
        return Err(format!(
            "Envoy's listener {listen} did not come up from tether-control; NACKs: {:?}\n{}",
            control.nacks(),
            envoy.log()
        ));
    }
    let bootstrap = Bootstrap::from_json(&control.grpc_bootstrap("demo-channel"))
        .map_err(|e| format!("bootstrap: {e}"))?;
    let channel = Channel::builder()
        .bootstrap(bootstrap)
        .wait_for_ready(true)
        .connect("xds:///shop")
        .map_err(|e| format!("tether::Channel: {e}"))?;
    let dir = control
        .file()
        .parent()
        .map(|d| d.join("grpcio"))
        .unwrap_or_else(|| std::env::temp_dir().join("tether-demo-grpcio"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let ccore = match python {
        Some(py) => {
            let file = dir.join("bootstrap.json");
            std::fs::write(&file, control.grpc_bootstrap("demo-grpcio"))
                .map_err(|e| format!("write {}: {e}", file.display()))?;
            Some(grpcio::Client::new(py, file))
        }
        None => None,
    };
    Ok(Stage {
        backends,
        control,
        envoy,
        listen,
        channel,
        ccore,
        dir,
        shop,
    })
}

impl Stage {
    fn name_at(&self, addr: SocketAddr) -> String {
        self.backends
            .iter()
            .find(|b| b.addr() == addr)
            .map_or_else(|| addr.to_string(), |b| b.name().to_owned())
    }

    fn addr_of(&self, name: &str) -> Option<SocketAddr> {
        self.backends
            .iter()
            .find(|b| b.name() == name)
            .map(|b| b.addr())
    }

    /// `grpc: backend-2, cluster shop/session` for a cookie.
    fn describe(&self, m: &Minted) -> String {
        let c = &m.decoded.cookie;
        let mut s = format!(
            "{}: {}",
            m.decoded.format,
            self.name_at(c.addresses.primary())
        );
        if let Some(cluster) = &c.cluster {
            s.push_str(&format!(", cluster {cluster}"));
        }
        s
    }

    fn received(&self, h: &Hop) -> String {
        h.set
            .as_ref()
            .map_or_else(|| "-".into(), |m| self.describe(m))
    }

    /// A browser's `GET /` through Envoy.
    async fn envoy(&self, cookie: Option<&str>, user: Option<&str>) -> Result<Hop, String> {
        let mut headers = Vec::new();
        if let Some(c) = cookie {
            headers.push(("cookie", c));
        }
        if let Some(u) = user {
            headers.push(("x-user", u));
        }
        let r = tether_testkit::client::get(self.listen, "/", &headers)
            .await
            .map_err(|e| format!("Envoy: {e}"))?;
        if r.status != 200 {
            return Err(format!("Envoy answered {}: {}", r.status, r.body));
        }
        Ok(Hop {
            backend: r.header("x-backend").unwrap_or("").to_owned(),
            set: minted(&r),
        })
    }

    /// One Echo call through the channel.
    async fn channel(&self, cookie: Option<&str>, user: Option<&str>) -> Result<Hop, String> {
        let mut client = EchoClient::new(self.channel.clone());
        let mut req = tonic::Request::new(EchoRequest {
            message: "demo".into(),
        });
        req.set_timeout(Duration::from_secs(10));
        for (k, v) in [("cookie", cookie), ("x-user", user)] {
            if let Some(v) = v {
                let v = v.parse().map_err(|e| format!("metadata {k}: {e}"))?;
                req.metadata_mut().insert(k, v);
            }
        }
        let resp = client
            .echo(req)
            .await
            .map_err(|e| format!("tether::Channel: {e}"))?;
        let set_cookies = crate::scenario::metadata_cookies(resp.metadata());
        let mut set = set_cookies;
        Ok(Hop {
            backend: resp.into_inner().backend,
            set: set.pop(),
        })
    }

    /// `calls` Echo calls through gRPC C-core in one process, each with
    /// `cookie`; `None` when C-core does not play.
    async fn ccore(&self, calls: usize, cookie: Option<&str>) -> Option<Result<Vec<Hop>, String>> {
        let client = self.ccore.as_ref()?;
        let lines = client.calls("xds:///shop", calls, cookie).await;
        Some(lines.map(|lines| {
            lines
                .iter()
                .map(|l| {
                    let set: Vec<(String, String)> = l
                        .set_cookie
                        .iter()
                        .map(|v| ("set-cookie".to_owned(), v.clone()))
                        .collect();
                    Hop {
                        backend: l.backend.clone(),
                        set: session_cookies(&set).pop(),
                    }
                })
                .collect()
        }))
    }

    /// One C-core call per user with `x-user: <user>`: the backends.
    async fn ccore_users(&self, users: &[String]) -> Option<Result<Vec<String>, String>> {
        let client = self.ccore.as_ref()?;
        let lines = client.keys("xds:///shop", "x-user", users).await;
        Some(lines.map(|lines| lines.into_iter().map(|l| l.backend).collect()))
    }

    /// Rewrites the file with the shop's endpoints as they are now.
    async fn publish(&self) -> Result<u64, String> {
        let addrs: Vec<SocketAddr> = self.backends.iter().map(|b| b.addr()).collect();
        self.control
            .rewrite(&config(
                self.listen.port(),
                &plugin_path(),
                &self.shop,
                &addrs,
            ))
            .await
    }

    /// Envoy's `/clusters` lines of the session cluster for `addr`.
    async fn envoy_host_flags(&self, addr: SocketAddr) -> Option<String> {
        let text = self.envoy.admin_get("/clusters").await.ok()?;
        let prefix = format!("{SESSION_CLUSTER}::{addr}::health_flags::");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
    }

    /// The channel's drain readiness of `addr` in the session cluster:
    /// (health, sessions).
    async fn channel_sessions(&self, addr: SocketAddr) -> Option<(String, usize)> {
        let stats = self.channel.stats().await?;
        stats
            .sessions()
            .into_iter()
            .find(|s| s.cluster == SESSION_CLUSTER && s.sessions.address == addr)
            .map(|s| (s.sessions.health.to_string(), s.sessions.sessions))
    }
}

/// `backend-1 ×3, backend-2` for a list of backends.
fn tally(backends: &[String]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for b in backends {
        match counts.iter_mut().find(|(n, _)| n == b) {
            Some((_, c)) => *c += 1,
            None => counts.push((b.clone(), 1)),
        }
    }
    counts.sort();
    counts
        .iter()
        .map(|(n, c)| {
            if *c == 1 {
                n.clone()
            } else {
                format!("{n} ×{c}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Collects the rows and failures of a step.
struct Log<'a> {
    stage: &'a Stage,
    rows: Vec<Row>,
    failures: Vec<String>,
}

impl<'a> Log<'a> {
    fn new(stage: &'a Stage) -> Self {
        Log {
            stage,
            rows: Vec::new(),
            failures: Vec::new(),
        }
    }

    fn row(&mut self, client: &str, sent: &str, answered: String, received: String) {
        self.rows.push(Row {
            client: client.into(),
            sent: sent.into(),
            answered,
            received,
        });
    }

    /// A row for one hop (or its error).
    fn hop(&mut self, client: &str, sent: &str, hop: &Result<Hop, String>) -> Option<Hop> {
        match hop {
            Ok(h) => {
                let received = self.stage.received(h);
                self.row(client, sent, h.backend.clone(), received);
                Some(h.clone())
            }
            Err(e) => {
                self.row(client, sent, format!("FAILED: {e}"), "-".into());
                self.failures.push(format!("{client}: {e}"));
                None
            }
        }
    }

    /// A row for C-core's calls, unless C-core does not play.
    fn ccore(&mut self, sent: &str, hops: Option<Result<Vec<Hop>, String>>) -> Option<Vec<Hop>> {
        match hops? {
            Ok(h) => {
                let backends: Vec<String> = h.iter().map(|h| h.backend.clone()).collect();
                let received = h
                    .iter()
                    .find_map(|h| h.set.as_ref())
                    .map_or_else(|| "-".into(), |m| self.stage.describe(m));
                self.row("C-core (grpcio)", sent, tally(&backends), received);
                Some(h)
            }
            Err(e) => {
                self.row("C-core (grpcio)", sent, format!("FAILED: {e}"), "-".into());
                self.failures.push(format!("C-core: {e}"));
                None
            }
        }
    }

    fn check(&mut self, ok: bool, failure: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(failure());
        }
    }

    fn finish(self, title: &str, verdict: String) -> Step {
        let ok = self.failures.is_empty();
        Step {
            title: title.into(),
            rows: self.rows,
            ok,
            verdict: if ok {
                verdict
            } else {
                self.failures.join("; ")
            },
        }
    }
}

/// The two sessions step 1 starts: (cookie header, backend).
struct Sessions {
    envoy: (String, String),
    channel: (String, String),
}

/// Step 1: a browser session started through Envoy continues through the
/// channel and C-core; a session started by the channel continues through
/// Envoy and C-core.
async fn one_session_three_clients(stage: &Stage) -> (Step, Option<Sessions>) {
    const TITLE: &str = "1. one session, three clients";
    let mut log = Log::new(stage);
    let ccore_note = if stage.ccore.is_some() {
        ""
    } else {
        " (C-core skipped: no Python with grpcio)"
    };

    // Envoy starts it; the plugin writes C-core's format.
    let first = log.hop("Envoy (browser)", "-", &stage.envoy(None, None).await);
    let envoy_session = first.and_then(|h| h.set.clone().map(|m| (m, h.backend)));
    let Some((cookie, a)) = envoy_session else {
        log.failures
            .push("Envoy set no session cookie on a first request".into());
        return (log.finish(TITLE, String::new()), None);
    };
    log.check(
        cookie.decoded.format == Format::Grpc
            && cookie.decoded.cookie.cluster.as_deref() == Some(SESSION_CLUSTER),
        || {
            format!(
                "Envoy's cookie is not C-core's format for {SESSION_CLUSTER}: {}",
                cookie.header
            )
        },
    );
    let c1 = cookie.cookie_header();
    let h = log.hop(
        "tether::Channel",
        "Envoy's cookie",
        &stage.channel(Some(&c1), None).await,
    );
    log.check(h.is_some_and(|h| h.backend == a), || {
        format!("the channel did not keep Envoy's session on {a}")
    });
    if let Some(hops) = log.ccore("Envoy's cookie", stage.ccore(3, Some(&c1)).await) {
        log.check(hops.iter().all(|h| h.backend == a), || {
            format!("C-core did not keep Envoy's session on {a}")
        });
    }

    // The channel starts one; Envoy and C-core continue it.
    let started = log.hop("tether::Channel", "-", &stage.channel(None, None).await);
    let channel_session = started.and_then(|h| h.set.clone().map(|m| (m, h.backend)));
    let Some((cookie2, b)) = channel_session else {
        log.failures
            .push("the channel set no session cookie on a first call".into());
        return (log.finish(TITLE, String::new()), None);
    };
    let c2 = cookie2.cookie_header();
    let h = log.hop(
        "Envoy (browser)",
        "channel's cookie",
        &stage.envoy(Some(&c2), None).await,
    );
    log.check(h.is_some_and(|h| h.backend == b && h.set.is_none()), || {
        format!("Envoy did not keep the channel's session on {b}")
    });
    if let Some(hops) = log.ccore("channel's cookie", stage.ccore(3, Some(&c2)).await) {
        log.check(hops.iter().all(|h| h.backend == b), || {
            format!("C-core did not keep the channel's session on {b}")
        });
    }
    let verdict = format!(
        "Envoy's session stayed on {a} through the channel and C-core; the channel's stayed on {b} through Envoy and C-core{ccore_note}"
    );
    let sessions = Sessions {
        envoy: (c1, a),
        channel: (c2, b),
    };
    (log.finish(TITLE, verdict), Some(sessions))
}

/// Step 2: the backend of Envoy's session goes DRAINING (sessions stay, new
/// ones avoid it, the channel counts its sessions), then is removed (its
/// sessions move with a fresh cookie, no request fails).
async fn drain_then_remove(stage: &mut Stage, sessions: Option<&Sessions>) -> Step {
    const TITLE: &str = "2. drain a backend, then remove it";
    let Some(sessions) = sessions else {
        return Log::new(stage)
            .finish(TITLE, String::new())
            .failed("needs step 1's sessions");
    };
    let (c1, a) = sessions.envoy.clone();
    let Some(a_addr) = stage.addr_of(&a) else {
        return Log::new(stage)
            .finish(TITLE, String::new())
            .failed(&format!("no backend {a}"));
    };

    // DRAINING: the file says so, both Envoy and the channel see it.
    for e in &mut stage.shop {
        if e.0 == a_addr {
            e.1 = Some("DRAINING");
        }
    }
    let stage: &Stage = stage;
    let mut log = Log::new(stage);
    if let Err(e) = stage.publish().await {
        log.failures.push(e);
        return log.finish(TITLE, String::new());
    }
    let seen = tether_testkit::wait_until(CONVERGE, || async {
        let envoy = stage
            .envoy_host_flags(a_addr)
            .await
            .is_some_and(|f| f.contains("draining"));
        let channel = stage
            .channel_sessions(a_addr)
            .await
            .is_some_and(|(h, _)| h == "DRAINING");
        envoy && channel
    })
    .await;
    log.row(
        "tether-control",
        "-",
        format!("{a} set DRAINING in the file"),
        "-".into(),
    );
    log.check(seen, || {
        format!("Envoy or the channel did not see {a} DRAINING")
    });

    // Sessions stay.
    let mut stayed = 0;
    let mut total = 0;
    let h = log.hop(
        "Envoy (browser)",
        "Envoy's cookie",
        &stage.envoy(Some(&c1), None).await,
    );
    total += 1;
    stayed += usize::from(h.is_some_and(|h| h.backend == a));
    let h = log.hop(
        "tether::Channel",
        "Envoy's cookie",
        &stage.channel(Some(&c1), None).await,
    );
    total += 1;
    stayed += usize::from(h.is_some_and(|h| h.backend == a));
    if let Some(hops) = log.ccore("Envoy's cookie", stage.ccore(2, Some(&c1)).await) {
        total += 1;
        stayed += usize::from(hops.iter().all(|h| h.backend == a));
    }
    let (c2, b) = &sessions.channel;
    let h = log.hop(
        "Envoy (browser)",
        "channel's cookie",
        &stage.envoy(Some(c2), None).await,
    );
    total += 1;
    stayed += usize::from(h.is_some_and(|h| h.backend == *b));
    log.check(stayed == total, || {
        format!(
            "{} of {total} sessions left the DRAINING {a}",
            total - stayed
        )
    });

    // New sessions avoid it.
    let mut fresh = Vec::new();
    for _ in 0..NEW_SESSIONS {
        match stage.envoy(None, None).await {
            Ok(h) => fresh.push(h.backend),
            Err(e) => log.failures.push(e),
        }
    }
    log.row(
        &format!("Envoy (browser) ×{NEW_SESSIONS}"),
        "-",
        tally(&fresh),
        "new sessions".into(),
    );
    let mut fresh_channel = Vec::new();
    for _ in 0..NEW_SESSIONS {
        match stage.channel(None, None).await {
            Ok(h) => fresh_channel.push(h.backend),
            Err(e) => log.failures.push(e),
        }
    }
    log.row(
        &format!("tether::Channel ×{NEW_SESSIONS}"),
        "-",
        tally(&fresh_channel),
        "new sessions".into(),
    );
    let landed = fresh
        .iter()
        .chain(&fresh_channel)
        .filter(|b| **b == a)
        .count();
    log.check(landed == 0, || {
        format!("{landed} new session(s) landed on the DRAINING {a}")
    });

    // The channel's drain readiness.
    let readiness = stage.channel_sessions(a_addr).await;
    let counted = readiness.as_ref().map_or(0, |(_, n)| *n);
    log.row(
        "Channel::stats().sessions()",
        "-",
        match &readiness {
            Some((h, n)) => format!("{a}: {h}, {n} session(s)"),
            None => format!("{a}: not listed"),
        },
        "-".into(),
    );
    log.check(counted >= 1, || {
        format!("the channel counts no session on the DRAINING {a}")
    });

    // Removed: its sessions move, each with a fresh cookie.
    let mut stage_shop = stage.shop.clone();
    for e in &mut stage_shop {
        if e.0 == a_addr {
            e.1 = None;
        }
    }
    let addrs: Vec<SocketAddr> = stage.backends.iter().map(|b| b.addr()).collect();
    let removed = stage
        .control
        .rewrite(&config(
            stage.listen.port(),
            &plugin_path(),
            &stage_shop,
            &addrs,
        ))
        .await;
    if let Err(e) = removed {
        log.failures.push(e);
        return log.finish(TITLE, String::new());
    }
    let gone = tether_testkit::wait_until(CONVERGE, || async {
        stage.envoy_host_flags(a_addr).await.is_none()
            && stage.channel_sessions(a_addr).await.is_none()
    })
    .await;
    log.row(
        "tether-control",
        "-",
        format!("{a} removed from the file"),
        "-".into(),
    );
    log.check(gone, || format!("Envoy or the channel still has {a}"));
    let mut moved = 0;
    let mut replays = 0;
    let moved_ok =
        |h: &Hop| h.backend != a && h.set.as_ref().is_some_and(|m| m.address() != a_addr);
    let h = log.hop(
        "Envoy (browser)",
        "Envoy's cookie",
        &stage.envoy(Some(&c1), None).await,
    );
    replays += 1;
    let repinned = h
        .as_ref()
        .and_then(|h| h.set.clone().map(|m| (m, h.backend.clone())));
    moved += usize::from(h.as_ref().is_some_and(moved_ok));
    let h = log.hop(
        "tether::Channel",
        "Envoy's cookie",
        &stage.channel(Some(&c1), None).await,
    );
    replays += 1;
    moved += usize::from(h.as_ref().is_some_and(moved_ok));
    if let Some(hops) = log.ccore("Envoy's cookie", stage.ccore(1, Some(&c1)).await) {
        replays += 1;
        moved += usize::from(hops.iter().all(moved_ok));
    }
    log.check(moved == replays, || {
        format!(
            "{} of {replays} sessions of {a} did not move with a fresh cookie",
            replays - moved
        )
    });
    if let Some((m, x)) = repinned {
        let h = log.hop(
            "Envoy (browser)",
            "the fresh cookie",
            &stage.envoy(Some(&m.cookie_header()), None).await,
        );
        log.check(h.is_some_and(|h| h.backend == x && h.set.is_none()), || {
            format!("the fresh cookie did not keep the session on {x}")
        });
    }
    let verdict = format!(
        "{a} DRAINING: {stayed}/{total} sessions stayed, {}/{} new sessions avoided it, the channel counted {counted} session(s) on it; removed: {moved}/{replays} sessions moved with a fresh cookie, 0 failed requests",
        fresh.len() + fresh_channel.len() - landed,
        fresh.len() + fresh_channel.len()
    );
    log.finish(TITLE, verdict)
}

impl Step {
    fn failed(mut self, why: &str) -> Step {
        self.ok = false;
        self.verdict = why.into();
        self
    }
}

/// Step 3: a `RequestHash` route on `x-user`: each user lands on the same
/// backend through Envoy, the channel and C-core.
async fn request_hash(stage: &Stage) -> Step {
    const TITLE: &str = "3. RequestHash on x-user";
    let mut log = Log::new(stage);
    let users: Vec<String> = (1..=USERS).map(|i| format!("user-{i}")).collect();
    let ccore = match stage.ccore_users(&users).await {
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => {
            log.failures.push(format!("C-core: {e}"));
            None
        }
        None => None,
    };
    let mut same = 0;
    let mut used = std::collections::BTreeSet::new();
    for (i, user) in users.iter().enumerate() {
        let e = stage.envoy(None, Some(user)).await;
        let c = stage.channel(None, Some(user)).await;
        let (e, c) = match (e, c) {
            (Ok(e), Ok(c)) => (e.backend, c.backend),
            (e, c) => {
                let why = [e.err(), c.err()].into_iter().flatten().collect::<Vec<_>>();
                log.failures.push(why.join("; "));
                continue;
            }
        };
        let g = ccore.as_ref().and_then(|b| b.get(i)).cloned();
        let mut answered = format!("Envoy {e}, channel {c}");
        if let Some(g) = &g {
            answered.push_str(&format!(", C-core {g}"));
        }
        let agree = e == c && g.as_ref().is_none_or(|g| *g == e);
        same += usize::from(agree);
        used.insert(e.clone());
        log.row(&format!("x-user: {user}"), "-", answered, "-".into());
    }
    log.check(same == USERS, || {
        format!(
            "{} of {USERS} users landed on different backends",
            USERS - same
        )
    });
    let clients = if ccore.is_some() {
        "Envoy, the channel and C-core"
    } else {
        "Envoy and the channel (C-core skipped)"
    };
    let verdict = format!(
        "{same}/{USERS} users on the same backend through {clients} ({} backends used)",
        used.len()
    );
    log.finish(TITLE, verdict)
}

/// The story as a table: per step its title, rows and verdict line.
pub fn render(steps: &[Step]) -> String {
    let head = [
        "client",
        "cookie sent",
        "answered by",
        "Set-Cookie received",
    ];
    let mut width = head.map(|h| h.chars().count());
    for r in steps.iter().flat_map(|s| &s.rows) {
        for (w, c) in width
            .iter_mut()
            .zip([&r.client, &r.sent, &r.answered, &r.received])
        {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: [&str; 4]| {
        let parts: Vec<String> = cells
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w.saturating_sub(c.chars().count()))))
            .collect();
        format!("{}\n", parts.join(" | ").trim_end())
    };
    let mut out = String::new();
    out.push_str(&line(head));
    out.push_str(&format!("{}\n", width.map(|w| "-".repeat(w)).join("-+-")));
    for s in steps {
        out.push_str(&format!("{}\n", s.title));
        for r in &s.rows {
            out.push_str(&line([&r.client, &r.sent, &r.answered, &r.received]));
        }
        out.push_str(&format!(
            "=> {} {}\n\n",
            if s.ok { "PASS" } else { "FAIL" },
            s.verdict
        ));
    }
    out
}
