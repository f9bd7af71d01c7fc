//! `tether_core::cookie::readers` against the real peers: stock Envoy 1.40's
//! own cookie session state and gRPC C-core (PyPI grpcio) pin exactly where
//! the function says they do, at addresses it flags (whose plain `legacy`
//! text Envoy parses as a protobuf `Cookie` without an address) and at
//! addresses it does not.
//!
//! Four backends on 127.0.0.0/8: two at addresses the function flags, two at
//! addresses it does not. For each, values a client may carry: the plain
//! `legacy` text (what tether wrote before it knew, and what other tools
//! write), what tether writes now in `legacy` (guarded where needed), in
//! `envoy` and in `grpc`. Each value goes to Envoy and to C-core on the same
//! tether-control; "pinned" is every request reaching that backend, and
//! otherwise the requests are balanced over the four.

use std::net::SocketAddr;
use std::time::Duration;

use tether_core::cookie::readers::{honours, legacy_text_read_by_envoy, Reader};
use tether_core::cookie::{self, Format, SessionCookie};
use tether_core::AddressList;
use tether_testkit::grpc::DualBackend;
use tether_testkit::grpcio;
use tether_wasm_tests::control::Control;
use tether_wasm_tests::scenario::{backend_on_loopback, minted, start_envoy, COOKIE};

const TARGET: &str = "xds:///shop";
const CALLS: usize = 12;

fn config(port: u16, backends: &[SocketAddr]) -> String {
    let endpoints = tether_wasm_tests::control::endpoints_yaml(backends);
    format!(
        r#"listener:
  port: {port}
envoy:
  sessionFilter: native
virtualhosts:
  - name: shop
    domains: ["*"]
    routes:
      - services: [{{ name: shop }}]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: {COOKIE}, path: /, ttl: 600s }}
services:
  - name: shop
    endpoints:
{endpoints}"#
    )
}

fn one(addr: SocketAddr) -> SessionCookie {
    SessionCookie::new(AddressList::one(addr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_and_c_core_pin_exactly_where_the_readers_function_says() {
    let mut backends = Vec::new();
    for (i, flagged) in [true, true, false, false].into_iter().enumerate() {
        backends.push(backend_on_loopback(&format!("backend-{i}"), flagged).await);
    }
    let addrs: Vec<SocketAddr> = backends.iter().map(DualBackend::addr).collect();
    let port = tether_testkit::free_port();
    let control = Control::start(&config(port, &addrs))
        .await
        .unwrap_or_else(|e| panic!("tether-control: {e}"));
    let envoy = start_envoy(&control.envoy_bootstrap("readers-envoy")).await;
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        tether_testkit::client::get(listen, "/", &[])
            .await
            .is_ok_and(|r| r.status == 200)
    })
    .await;
    assert!(up, "Envoy did not come up: {}", envoy.log());
    let dir = std::env::temp_dir().join(format!("tether-readers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bootstrap = dir.join("bootstrap.json");
    std::fs::write(&bootstrap, control.grpc_bootstrap("readers-grpcio")).unwrap();
    let python = grpcio::python_or_install(None)
        .await
        .unwrap_or_else(|e| panic!("no Python with grpcio: {e}"));
    let grpc = grpcio::Client::new(python, bootstrap);

    let name_at = |addr: &str| {
        backends
            .iter()
            .find(|b| b.addr().to_string() == addr)
            .map_or("?", |b| b.name())
            .to_owned()
    };
    let mut checked = 0;
    for b in &backends {
        let addr = b.addr();
        // The plain text, as a header value is written.
        let plain = cookie::encode_header(&one(addr), Format::Legacy, None).unwrap();
        let mut clustered = one(addr);
        clustered.cluster = Some("shop".into());
        let values = [
            ("plain legacy", plain),
            (
                "legacy",
                cookie::encode(&one(addr), Format::Legacy, None).unwrap(),
            ),
            (
                "envoy",
                cookie::encode(&one(addr), Format::Envoy, None).unwrap(),
            ),
            (
                "grpc",
                cookie::encode(&clustered, Format::Grpc, None).unwrap(),
            ),
        ];
        for (what, value) in &values {
            let header = format!("{COOKIE}={value}");
            let label = format!(
                "{what} for {} at {addr} (flagged: {})",
                b.name(),
                !legacy_text_read_by_envoy(addr)
            );
            // Stock Envoy.
            let mut served = Vec::new();
            let mut fresh = 0;
            for _ in 0..CALLS {
                let r = tether_testkit::client::get(listen, "/", &[("cookie", &header)])
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{label}: {r:?}");
                served.push(r.header("x-backend").unwrap_or_default().to_owned());
                fresh += usize::from(minted(&r).is_some());
            }
            let envoy_pinned = served.iter().all(|s| s == b.name());
            let predicted = honours(Reader::EnvoyCookie, value, addr, tether_core_now());
            assert_eq!(envoy_pinned, predicted, "Envoy, {label}: {served:?}");
            if envoy_pinned {
                assert_eq!(fresh, 0, "Envoy re-issued a cookie it honours: {label}");
            } else {
                assert_eq!(fresh, CALLS, "Envoy sets its own cookie each time: {label}");
                assert!(served.iter().any(|s| s != b.name()), "{label}: {served:?}");
            }
            // gRPC C-core, warmed to every backend first (its round robin
            // only picks connected ones).
            let calls = grpc
                .calls_warmed(TARGET, addrs.len(), CALLS, Some(&header))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let served: Vec<String> = calls.iter().map(|c| name_at(&c.address)).collect();
            let pinned = served.iter().all(|s| s == b.name());
            let predicted = honours(Reader::Grpc, value, addr, tether_core_now());
            assert_eq!(pinned, predicted, "C-core, {label}: {served:?}");
            if !pinned {
                assert!(served.iter().any(|s| s != b.name()), "{label}: {served:?}");
            }
            println!("{label}: Envoy pins: {envoy_pinned}, C-core pins: {pinned}");
            checked += 1;
        }
    }
    assert_eq!(checked, 16);
    // What tether writes in legacy is read by both at every address.
    for b in &backends {
        let value = cookie::encode(&one(b.addr()), Format::Legacy, None).unwrap();
        for reader in [Reader::EnvoyCookie, Reader::Grpc, Reader::Tether] {
            assert!(honours(reader, &value, b.addr(), tether_core_now()));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn tether_core_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
