//! The plugin's counters in a real Envoy 1.40 (V8), scraped as Prometheus
//! does, from the admin's `/stats/prometheus`: requests that make each
//! counted event happen, then every counter's exact value.
//!
//! The plugin counts in the VM's memory and hands the counts to Envoy on its
//! one-second timer, so the test polls the admin endpoint (at most 10 s)
//! until the figures reach what it made, never sleeping a fixed time. Envoy
//! prints a plugin's stats without its `envoy_` prefix and without the
//! `wasmcustom.` of `/stats`: `wasmcustom.tether.session_cookie_pinned_total`
//! is `tether_session_cookie_pinned_total`.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tether_core::cookie::{self, Format, KeyRing, SessionCookie};
use tether_core::AddressList;
use tether_testkit::envoy::Envoy;
use tether_testkit::{free_port, wait_until};
use tether_wasm_tests::scenario::{
    backend, cookie as cookie_pair, listener, minted, now, override_host_cluster, plugin_config,
    plugin_filter, route, start_envoy, Backends, Stage, COOKIE,
};

const FILE: &str = "plugin-override-host.yaml";
const CLUSTER: &str = "app";
/// The signing key (base64 of "metrics-test-signing-key").
const KEY: &str = "bWV0cmljcy10ZXN0LXNpZ25pbmcta2V5";
/// A key the plugin does not hold (base64 of "someone-elses-signing-key").
const OTHER_KEY: &str = "c29tZW9uZS1lbHNlcy1zaWduaW5nLWtleQ==";

/// The Prometheus names of the plugin's counters, in its README's order.
const COUNTERS: [&str; 11] = [
    "tether_session_cookie_pinned_total",
    "tether_session_cookie_refused_invalid_total",
    "tether_session_cookie_refused_unverified_total",
    "tether_session_cookie_refused_expired_total",
    "tether_session_cookie_written_new_total",
    "tether_session_cookie_written_moved_total",
    "tether_session_cookie_written_reissued_total",
    "tether_session_cookie_envoy_misreads",
    "tether_path_gate_bypassed_requests_total",
    "tether_config_errors_total",
    "tether_host_call_failures_total",
];

/// Every `tether_` series of `/stats/prometheus`: name, its `# TYPE`, its
/// value. A series without labels prints as `name{} value`.
fn tether_series(text: &str) -> BTreeMap<String, (String, u64)> {
    let mut types = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                types.insert(name.to_string(), kind.to_string());
            }
            continue;
        }
        if !line.starts_with("tether_") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        assert_eq!(labels, "}", "no labels expected: {line}");
        let value = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
        let kind = types.get(name).cloned().unwrap_or_default();
        out.insert(name.to_string(), (kind, value));
    }
    out
}

/// Polls `/stats/prometheus` (at most 10 s) until the plugin's counters are
/// exactly `want` (name, value; the others zero), then checks that they are
/// counters and that no other `tether_` series exists.
async fn assert_counters(envoy: &Envoy, want: &[(&str, u64)]) {
    for (name, _) in want {
        assert!(COUNTERS.contains(name), "{name} is not a plugin counter");
    }
    let expected: BTreeMap<String, (String, u64)> = COUNTERS
        .iter()
        .map(|name| {
            let value = want.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v);
            (name.to_string(), ("counter".to_string(), value))
        })
        .collect();
    let scrape = || async {
        envoy
            .admin_get("/stats/prometheus")
            .await
            .map(|text| tether_series(&text))
            .unwrap_or_default()
    };
    let reached = wait_until(Duration::from_secs(10), || async {
        scrape().await == expected
    })
    .await;
    if !reached {
        let got = scrape().await;
        let diff: Vec<String> = expected
            .keys()
            .chain(got.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|k| expected.get(*k) != got.get(*k))
            .map(|k| format!("{k}: want {:?}, got {:?}", expected.get(k), got.get(k)))
            .collect();
        panic!(
            "the plugin's counters did not reach the figures in 10 s:\n{}\nEnvoy log:\n{}",
            diff.join("\n"),
            envoy.log()
        );
    }
}

/// An `envoy`-format value for `addr` (with `cluster` and `expires`),
/// signed with the base64 key `key`, as a `Cookie` header.
fn signed(
    addr: SocketAddr,
    cluster: Option<&str>,
    expires: Option<u64>,
    key: Option<&str>,
) -> String {
    let mut c = SessionCookie::new(AddressList::one(addr));
    c.cluster = cluster.map(String::from);
    c.expires = expires;
    let ring = KeyRing::from_base64(key).expect("a test key");
    cookie_pair(&cookie::encode(&c, Format::Envoy, ring.signer()).expect("encode"))
}

/// The plugin configuration of these tests: sessions under `/app` only,
/// signed, unsigned cookies still honoured (and re-issued signed).
fn metrics_config() -> Value {
    let mut config = plugin_config();
    config["cookie"]["path"] = json!("/app");
    config["keys"] = json!([KEY]);
    config["accept_unsigned"] = json!(true);
    config
}

/// One request of each kind the plugin counts, through
/// `envoy-configs/plugin-override-host.yaml` (wiring a); then every counter,
/// exactly, from `/stats/prometheus`.
#[tokio::test]
async fn every_counter_reaches_prometheus_with_its_exact_figure() {
    let stage = Stage::config_file(FILE, Some(&metrics_config())).await;
    // Before any request: every counter is there, at zero (Prometheus sees
    // a series from the start, not from its first event).
    assert_counters(&stage.envoy, &[]).await;

    let get = |path: &'static str, cookie: String| {
        let stage = &stage;
        async move {
            let headers: Vec<(&str, &str)> = if cookie.is_empty() {
                vec![]
            } else {
                vec![("cookie", cookie.as_str())]
            };
            let r = stage.get(path, &headers).await;
            assert_eq!(r.status, 200, "{path}: {}", stage.envoy.log());
            r
        }
    };

    // A new session, then three requests it pins.
    let first = get("/app", String::new()).await;
    let session = minted(&first).expect("a new session").cookie_header();
    let home = backend(&first).to_string();
    for _ in 0..3 {
        let r = get("/app/cart", session.clone()).await;
        assert_eq!(backend(&r), home);
        assert!(minted(&r).is_none());
    }
    // A session naming a host outside the cluster: pinned, Envoy's policy
    // falls back, and the host that answered gets the session (moved).
    let gone = SocketAddr::from(([127, 0, 0, 1], 1));
    let r = get("/app", signed(gone, Some(CLUSTER), None, Some(KEY))).await;
    let moved = minted(&r).expect("the session moved");
    assert_eq!(stage.backends.name_at(moved.address()), backend(&r));
    // The session's host answered a cookie without the cluster: re-issued.
    let b2 = stage.addr_of("backend-2");
    let r = get("/app", signed(b2, None, None, Some(KEY))).await;
    assert_eq!(backend(&r), "backend-2");
    let reissued = minted(&r).expect("re-issued with the cluster");
    assert_eq!(reissued.decoded.cookie.cluster.as_deref(), Some(CLUSTER));
    // A plain legacy text stock Envoy misreads (10.0.0.1:8080): pinned and
    // counted; that host is not in the cluster, so the session moves too.
    let r = get("/app", format!("{COOKIE}=MTAuMC4wLjE6ODA4MA==")).await;
    assert!(minted(&r).is_some());
    // Refused: not a cookie value, signed by another key, expired; each
    // load balanced with a new session.
    for refused in [
        format!("{COOKIE}=%%%not-base64"),
        signed(b2, Some(CLUSTER), None, Some(OTHER_KEY)),
        signed(b2, Some(CLUSTER), Some(now() - 60), Some(KEY)),
    ] {
        let r = get("/app", refused.clone()).await;
        let fresh = minted(&r).unwrap_or_else(|| panic!("a new session for {refused}"));
        assert_eq!(stage.backends.name_at(fresh.address()), backend(&r));
    }
    // Outside the cookie path: left alone, twice.
    for _ in 0..2 {
        let r = get("/other", session.clone()).await;
        assert!(minted(&r).is_none());
    }

    assert_counters(
        &stage.envoy,
        &[
            ("tether_session_cookie_pinned_total", 6),
            ("tether_session_cookie_refused_invalid_total", 1),
            ("tether_session_cookie_refused_unverified_total", 1),
            ("tether_session_cookie_refused_expired_total", 1),
            ("tether_session_cookie_written_new_total", 4),
            ("tether_session_cookie_written_moved_total", 2),
            ("tether_session_cookie_written_reissued_total", 1),
            ("tether_session_cookie_envoy_misreads", 1),
            ("tether_path_gate_bypassed_requests_total", 2),
        ],
    )
    .await;
    // `/stats` names them under `wasmcustom.`.
    assert_eq!(
        stage
            .envoy
            .stat("wasmcustom.tether.session_cookie_pinned_total")
            .await,
        Some(6)
    );
}

/// Writes the listener `l` as Envoy's filesystem LDS reads it, atomically
/// (Envoy watches for the file being moved into place).
fn write_lds(dir: &std::path::Path, mut l: Value) {
    l["@type"] = json!("type.googleapis.com/envoy.config.listener.v3.Listener");
    let tmp = dir.join("lds.tmp");
    std::fs::write(&tmp, json!({ "resources": [l] }).to_string()).unwrap();
    std::fs::rename(&tmp, dir.join("lds.yaml")).unwrap();
}

/// A private temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "tether-metrics-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A listener update whose plugin configuration is invalid: Envoy rejects
/// it and keeps the old listener, and the plugin counts the refusal.
#[tokio::test]
async fn a_refused_configuration_update_is_counted() {
    let b = Backends::start(3).await;
    let dir = TempDir::new();
    let port = free_port();
    let make = |config: &Value| {
        listener(
            "ingress",
            port,
            vec![plugin_filter(config)],
            vec![route("/", CLUSTER)],
        )
    };
    write_lds(&dir.0, make(&plugin_config()));
    let yaml = json!({
        "node": { "id": "tether-test", "cluster": "tether-test" },
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
        "dynamic_resources": { "lds_config": {
            "path_config_source": { "path": dir.0.join("lds.yaml").display().to_string() },
            "resource_api_version": "V3"
        } },
        "static_resources": { "clusters": [override_host_cluster(CLUSTER, &b.addrs())] }
    })
    .to_string();
    let envoy = start_envoy(&yaml).await;
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    // The listener comes from the LDS file, possibly after the admin is up.
    let listening = wait_until(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(listen).await.is_ok()
    })
    .await;
    assert!(listening, "no listener from LDS:\n{}", envoy.log());
    let first = tether_testkit::client::get(listen, "/", &[]).await.unwrap();
    assert!(minted(&first).is_some(), "{}", envoy.log());
    assert_counters(&envoy, &[("tether_session_cookie_written_new_total", 1)]).await;

    let mut bad = plugin_config();
    bad["cookie"]["ttl"] = json!("-5s");
    write_lds(&dir.0, make(&bad));
    let rejected = wait_until(Duration::from_secs(10), || async {
        envoy
            .stat("listener_manager.lds.update_rejected")
            .await
            .unwrap_or(0)
            >= 1
    })
    .await;
    assert!(rejected, "the update was rejected:\n{}", envoy.log());
    assert_counters(
        &envoy,
        &[
            ("tether_session_cookie_written_new_total", 1),
            ("tether_config_errors_total", 1),
        ],
    )
    .await;
}
