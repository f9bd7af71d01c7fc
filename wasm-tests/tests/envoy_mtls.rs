//! One tether-control file runs a whole mTLS deployment: three tonic
//! backends serve gRPC over mTLS only (a SPIFFE SAN, client certificates
//! from a CA of their own); the service's `tls` gives proxyless clients
//! A29's `UpstreamTlsContext` (bootstrap `file_watcher` instances) and
//! Envoy the same TLS from files (`tls.envoy`). Envoy 1.40 runs the tether
//! plugin writing C-core's format; a session cookie it mints over mTLS is
//! honoured by Envoy, by `tether::Channel` and by gRPC C-core (grpcio with
//! xDS credentials), each presenting the client certificate to the backend.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio;
use tether_testkit::tls::{fingerprint, server_config, Ca};
use tether_wasm_tests::control::Control;
use tether_wasm_tests::scenario::{plugin_path, start_envoy, COOKIE};

const BACKEND_ID: &str = "spiffe://tether.test/ns/shop/sa/backend";
const CALLS: usize = 10;

fn config(port: u16, backends: &[SocketAddr], dir: &Path) -> String {
    let file = |n: &str| dir.join(n).display().to_string();
    format!(
        r#"listener:
  port: {port}
envoy:
  sessionFilter: plugin
  plugin:
    filename: {plugin}
virtualhosts:
  - name: shop
    domains: ["*"]
    routes:
      - services: [{{ name: shop }}]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: {COOKIE}, path: /, ttl: 600s }}
            format: grpc
services:
  - name: shop
    protocol: h2c
    tls:
      caInstance: roots
      identityInstance: identity
      subjectAltNames:
        - exact: "{BACKEND_ID}"
      envoy:
        caFile: {ca}
        certificateFile: {cert}
        privateKeyFile: {key}
    endpoints:
{endpoints}"#,
        plugin = plugin_path(),
        ca = file("ca.pem"),
        cert = file("client.pem"),
        key = file("client.key"),
        endpoints = tether_wasm_tests::control::endpoints_yaml(backends),
    )
}

/// A proxyless bootstrap: the control plane plus `file_watcher` instances.
fn bootstrap(control: &Control, dir: &Path, node: &str) -> PathBuf {
    let mut doc: serde_json::Value = serde_json::from_str(&control.grpc_bootstrap(node)).unwrap();
    let file = |n: &str| dir.join(n).display().to_string();
    doc["certificate_providers"] = serde_json::json!({
        "roots": { "plugin_name": "file_watcher",
                   "config": { "ca_certificate_file": file("ca.pem") } },
        "identity": { "plugin_name": "file_watcher",
                      "config": { "certificate_file": file("client.pem"),
                                  "private_key_file": file("client.key") } },
    });
    let path = dir.join(format!("bootstrap-{node}.json"));
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

/// One Echo call with an optional cookie: (backend, client certificate the
/// backend saw, the session cookie set, if any).
async fn call<T>(client: &mut EchoClient<T>, cookie: Option<&str>) -> (String, String, Vec<String>)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut req = tonic::Request::new(EchoRequest {
        message: "mtls".into(),
    });
    req.set_timeout(Duration::from_secs(10));
    if let Some(c) = cookie {
        req.metadata_mut().insert("cookie", c.parse().unwrap());
    }
    let resp = client.echo(req).await.expect("the call succeeds");
    let set_cookies = tether_wasm_tests::scenario::metadata_cookies(resp.metadata());
    let cert = resp
        .metadata()
        .get("x-client-cert")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let set = set_cookies.into_iter().map(|m| m.cookie_header()).collect();
    (resp.into_inner().backend, cert, set)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_minted_over_mtls_crosses_envoy_the_channel_and_c_core() {
    let servers = Ca::new("shop server CA");
    let clients = Ca::new("shop client CA");
    let client = clients.issue(&["spiffe://tether.test/ns/shop/sa/client"]);
    let want = fingerprint(&client.cert_der);
    let mut backends = Vec::new();
    for i in 1..=3 {
        backends.push(
            GrpcBackend::start_tls(
                &format!("secure-{i}"),
                server_config(&servers.issue(&[BACKEND_ID, "127.0.0.1"]), Some(&clients)),
            )
            .await,
        );
    }
    let addrs: Vec<SocketAddr> = backends.iter().map(GrpcBackend::addr).collect();
    let dir = std::env::temp_dir().join(format!("tether-envoy-mtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.pem"), servers.pem()).unwrap();
    client.write(&dir, "client");
    let port = tether_testkit::free_port();
    let control = Control::start(&config(port, &addrs, &dir))
        .await
        .unwrap_or_else(|e| panic!("tether-control: {e}"));
    let envoy = start_envoy(&control.envoy_bootstrap("mtls-envoy")).await;
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        match tonic::transport::Endpoint::from_shared(format!("http://{listen}"))
            .unwrap()
            .connect()
            .await
        {
            Ok(ch) => {
                let mut r = tonic::Request::new(EchoRequest {
                    message: "up".into(),
                });
                r.set_timeout(Duration::from_secs(2));
                EchoClient::new(ch).echo(r).await.is_ok()
            }
            Err(_) => false,
        }
    })
    .await;
    assert!(
        up,
        "Envoy did not reach the mTLS backends; NACKs {:?}\n{}",
        control.nacks(),
        envoy.log()
    );

    // Envoy mints: C-core's format, over mTLS with the client certificate.
    let through_envoy = tonic::transport::Endpoint::from_shared(format!("http://{listen}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut envoy_client = EchoClient::new(through_envoy);
    let (pinned, cert, set) = call(&mut envoy_client, None).await;
    assert_eq!(cert, want, "Envoy presents the client certificate");
    assert_eq!(set.len(), 1, "{set:?}");
    let cookie = set[0].clone();
    // Envoy honours it.
    for _ in 0..CALLS {
        let (b, cert, set) = call(&mut envoy_client, Some(&cookie)).await;
        assert_eq!(
            (b.as_str(), cert.as_str()),
            (pinned.as_str(), want.as_str())
        );
        assert!(set.is_empty(), "{set:?}");
    }
    // The channel over xDS mTLS honours it.
    let path = bootstrap(&control, &dir, "mtls-channel");
    let channel = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&path).unwrap())
        .connect("xds:///shop")
        .unwrap();
    let mut channel_client = EchoClient::new(channel);
    for _ in 0..CALLS {
        let (b, cert, _) = call(&mut channel_client, Some(&cookie)).await;
        assert_eq!(
            (b.as_str(), cert.as_str()),
            (pinned.as_str(), want.as_str())
        );
    }
    // gRPC C-core with xDS credentials honours it.
    let python = grpcio::python_or_install(None).await.unwrap();
    let path = bootstrap(&control, &dir, "mtls-grpcio");
    let calls = grpcio::Client::new(&python, &path)
        .run(
            &[
                "--xds-creds".into(),
                "--warm".into(),
                "3".into(),
                "xds:///shop".into(),
                CALLS.to_string(),
                cookie.clone(),
            ],
            None,
        )
        .await
        .unwrap_or_else(|e| panic!("C-core: {e}"));
    assert_eq!(calls.len(), CALLS);
    assert!(
        calls.iter().all(|c| c.ok()
            && c.backend == pinned
            && c.client_cert.as_deref() == Some(want.as_str())),
        "{calls:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
