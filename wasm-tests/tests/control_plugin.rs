//! tether-control gives a real Envoy 1.40 the tether plugin: Envoy is
//! bootstrapped with nothing but an ADS cluster pointing at tether-control,
//! whose file says `envoy: {sessionFilter: plugin}` and a `Session` route
//! with `format: grpc`. A first request gets the plugin's cookie in C-core's
//! format (which Envoy's own filter cannot write), naming the route's
//! cluster; the same cookie pins every later request, and no client NACKed.

use std::net::SocketAddr;
use std::time::Duration;

use tether_core::cookie::Format;
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
