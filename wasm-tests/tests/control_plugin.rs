//! tether-control gives a real Envoy 1.40 the tether plugin: Envoy is
//! bootstrapped with nothing but an ADS cluster pointing at tether-control,
//! whose file says `envoy: {sessionFilter: plugin}` and a `Session` route
//! with `format: grpc`. A first request gets the plugin's cookie in C-core's
//! format (which Envoy's own filter cannot write), naming the route's
//! cluster; the same cookie pins every later request, and no client NACKed.
//!
//! With a load stats config in its bootstrap, the same Envoy reports load
//! (LRS) to tether-control: a session kept on a DRAINING endpoint by the
//! plugin shows as Envoy's load in `GET /status` and makes the endpoint
//! `busy` in `GET /drain`, then `idle` once the session stops.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tether_control::{ControlPlane, Reloader};
use tether_core::cookie::Format;
use tether_testkit::client::status_load;
use tether_testkit::free_port;
use tether_wasm_tests::control::Control;
use tether_wasm_tests::scenario::{
    backend, cookie, minted, plugin_path, start_envoy, Backends, COOKIE,
};

fn config(listen: u16, backends: &[SocketAddr]) -> String {
    let endpoints = tether_wasm_tests::control::endpoints_yaml(backends);
    format!(
        r#"listener:
  port: {listen}
envoy:
  sessionFilter: plugin
  plugin:
    filename: {plugin}
virtualhosts:
  - name: web
    domains: ["*"]
    routes:
      - services: [{{ name: web }}]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: {COOKIE}, path: /, ttl: 120s }}
            format: grpc
services:
  - name: web
    endpoints:
{endpoints}"#,
        plugin = plugin_path()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gets_the_plugin_from_tether_control() {
    let backends = Backends::start(3).await;
    let port = free_port();
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let control = Control::start(&config(port, &backends.addrs()))
        .await
        .expect("tether-control starts");
    let envoy = start_envoy(&control.envoy_bootstrap("envoy-plugin-test")).await;
    // Up once the listener (LDS, RDS, CDS, EDS) answers from a backend.
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        tether_testkit::client::get(listen, "/", &[])
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
    assert!(
        up,
        "Envoy's listener did not come up; NACKs {:?}\n{}",
        control.nacks(),
        envoy.log()
    );

    let r = tether_testkit::client::get(listen, "/", &[]).await.unwrap();
    let first = minted(&r).expect("the plugin sets a session cookie");
    assert_eq!(first.decoded.format, Format::Grpc, "{}", first.header);
    assert_eq!(
        first.decoded.cookie.cluster.as_deref(),
        Some("web/session"),
        "{}",
        first.header
    );
    let pinned = backend(&r).to_owned();
    assert_eq!(backends.name_at(first.address()), pinned);
    assert_eq!(first.attribute("Max-Age"), Some("120"));

    let c = cookie(&first.value);
    for i in 0..20 {
        let r = tether_testkit::client::get(listen, "/", &[("cookie", &c)])
            .await
            .unwrap();
        assert_eq!(backend(&r), pinned, "request {i} with {c}");
        assert!(minted(&r).is_none(), "request {i}: {:?}", r.headers);
    }
    // Without a cookie, requests still spread (round robin falls back).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..9 {
        let r = tether_testkit::client::get(listen, "/", &[]).await.unwrap();
        seen.insert(backend(&r).to_owned());
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(control.nacks().is_empty(), "{:?}", control.nacks());
}

/// A file whose service `web` reports load and keeps sessions on DRAINING
/// endpoints; `draining` is DRAINING.
fn reporting_config(listen: u16, backends: &[SocketAddr], draining: Option<SocketAddr>) -> String {
    let mut endpoints = String::new();
    for a in backends {
        endpoints += &format!("      - address: {a}\n");
        if Some(*a) == draining {
            endpoints += "        health: DRAINING\n";
        }
    }
    config(listen, backends)
        .replace(
            "            format: grpc\n",
            "            format: grpc\n            overrideHostStatus: [UNKNOWN, HEALTHY, DRAINING]\n",
        )
        .replace(
            "  - name: web\n    endpoints:\n",
            "  - name: web\n    loadReporting: { interval: 0.5s }\n    endpoints:\n",
        )
        .replace(&tether_wasm_tests::control::endpoints_yaml(backends), &endpoints)
}

/// tether-control in this process with its admin listener (the scenarios'
/// [`Control`] has none); stopped when dropped.
struct WithAdmin {
    ads: SocketAddr,
    admin: SocketAddr,
    plane: ControlPlane,
    file: PathBuf,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl WithAdmin {
    async fn start(yaml: &str) -> WithAdmin {
        let dir = std::env::temp_dir().join(format!(
            "tether-control-plugin-lrs-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tether.yaml");
        std::fs::write(&file, yaml).unwrap();
        let (plane, reloader) = Reloader::start(&file).unwrap_or_else(|e| panic!("{e}"));
        let ads = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (ads_addr, admin_addr) = (ads.local_addr().unwrap(), admin.local_addr().unwrap());
        let served = plane.clone();
        let tasks = vec![
            tokio::spawn(async move {
                let _ = served.serve(ads, std::future::pending()).await;
            }),
            tokio::spawn(
                tether_control::admin::Admin::new(plane.clone(), None)
                    .serve(admin, std::future::pending()),
            ),
            tokio::spawn(reloader.run(Duration::from_millis(50), |_| {})),
        ];
        WithAdmin {
            ads: ads_addr,
            admin: admin_addr,
            plane,
            file,
            tasks,
        }
    }

    /// Replaces the file and waits (at most 5 s) until it is served.
    async fn rewrite(&self, yaml: &str) {
        let before = self.plane.snapshot().version;
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, &self.file).unwrap();
        let published = tether_testkit::wait_until(Duration::from_secs(5), || async {
            self.plane.snapshot().version > before
        })
        .await;
        assert!(published, "the new file was not served within 5 s");
    }

    /// The admin page `path` once `want` holds; panics after 30 s, naming
    /// `what` and the last page.
    async fn until(&self, path: &str, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        tether_testkit::client::until_json(self.admin, path, what, want).await
    }
}

impl Drop for WithAdmin {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(dir) = self.file.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The endpoint `address` of `web` in `GET /drain`, or `null`.
fn drain_of(drain: &Value, address: SocketAddr) -> Value {
    drain["endpoints"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["address"] == address.to_string()))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_the_plugin_reports_load_that_status_and_drain_show() {
    const NODE: &str = "envoy-plugin-lrs";
    let backends = Backends::start(2).await;
    let port = free_port();
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let control = WithAdmin::start(&reporting_config(port, &backends.addrs(), None)).await;
    let mut bootstrap: Value =
        serde_json::from_str(&tether_testkit::envoy::ads_bootstrap(control.ads, NODE)).unwrap();
    bootstrap["cluster_manager"] = serde_json::json!({ "load_stats_config": {
        "api_type": "GRPC",
        "transport_api_version": "V3",
        "grpc_services": [ { "envoy_grpc": { "cluster_name": "xds" } } ]
    } });
    let envoy = start_envoy(&bootstrap.to_string()).await;
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        tether_testkit::client::get(listen, "/", &[])
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
    assert!(up, "Envoy's listener did not come up\n{}", envoy.log());
    let r = tether_testkit::client::get(listen, "/", &[]).await.unwrap();
    let first = minted(&r).expect("the plugin sets a session cookie");
    let (pinned, at) = (backend(&r).to_owned(), first.address());
    let c = cookie(&first.value);

    // The session's endpoint drains while the session keeps calling it.
    control
        .rewrite(&reporting_config(port, &backends.addrs(), Some(at)))
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let caller = {
        let (stop, c) = (stop.clone(), c.clone());
        tokio::spawn(async move {
            let mut served = Vec::new();
            while !stop.load(Ordering::SeqCst) && served.len() < 2000 {
                let r = tether_testkit::client::get(listen, "/", &[("cookie", &c)]).await;
                served.push(r.map(|r| backend(&r).to_owned()).unwrap_or_default());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            served
        })
    };
    let busy = control
        .until("/drain", "the session on the DRAINING endpoint", |d| {
            drain_of(d, at)["verdict"] == "busy"
        })
        .await;
    let me = &drain_of(&busy, at)["clients"][0];
    assert_eq!(me["node"], NODE, "{busy}");
    assert_eq!(me["granularity"], "endpoint", "{busy}");
    let status = control
        .until("/status", "Envoy's load on the endpoint", |s| {
            status_load(s, "web", at, NODE)["requests"].as_u64() > Some(0)
        })
        .await;
    assert_eq!(
        status_load(&status, "web", at, NODE)["granularity"],
        "endpoint"
    );
    let client = status["clients"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["node"] == NODE))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        client["streams"],
        serde_json::json!(["ADS", "LRS"]),
        "{status}"
    );
    assert_eq!(client["reports"], serde_json::json!(["web"]), "{status}");

    // The session stops: Envoy's next reports show no request to it.
    stop.store(true, Ordering::SeqCst);
    let served = caller.await.unwrap();
    assert!(
        served.iter().all(|b| *b == pinned),
        "the session stayed on {pinned} while it drained: {served:?}"
    );
    control
        .until("/drain", "the session stopped", |d| {
            drain_of(d, at)["verdict"] == "idle"
        })
        .await;
    assert!(
        control.plane.nacks().is_empty(),
        "{:?}",
        control.plane.nacks()
    );
}
