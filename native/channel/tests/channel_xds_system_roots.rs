//! gRFC A82's `system_root_certs` beside gRPC C-core: tether-control gives a
//! service's cluster TLS verified against the clients' system roots (no CA
//! provider instance). The system's roots here are a test CA the tests
//! generate, named the way each client reads its system store: `SSL_CERT_FILE`
//! for tether (rustls-native-certs), `GRPC_DEFAULT_SSL_ROOTS_FILE_PATH` for
//! C-core. Both reach the backend; C-core does whatever A82's
//! `GRPC_EXPERIMENTAL_XDS_SYSTEM_ROOT_CERTS` says (grpcio 1.85 no longer
//! reads it), and so does tether. With roots that are not the backend's CA,
//! C-core's call does not succeed. Its own test binary: it sets `SSL_CERT_FILE`
//! for the process.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;

use std::time::Duration;

use control_support::{Control, TempDir};
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio;
use tether_testkit::tls::{server_config, Ca};

const BACKEND_ID: &str = "spiffe://tether.test/ns/default/sa/backend";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_root_certs_beside_c_core() {
    let Ok(python) = grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let servers = Ca::new("the system's CA, for this test");
    let backend = GrpcBackend::start_tls(
        "system-roots",
        server_config(&servers.issue(&[BACKEND_ID, "127.0.0.1"]), None),
    )
    .await;
    let dir = TempDir::new("xds-system-roots");
    let ca = dir.0.join("system-ca.pem");
    std::fs::write(&ca, servers.pem()).unwrap();
    // Before anything reads the system's roots (once per process).
    std::env::set_var("SSL_CERT_FILE", &ca);
    let yaml = format!(
        r#"virtualhosts:
  - name: roots.tether.test
    routes:
      - services: [{{ name: secure }}]
services:
  - name: secure
    protocol: h2c
    tls:
      systemRootCerts: true
      subjectAltNames:
        - exact: "{BACKEND_ID}"
    endpoints:
      - address: "{}"
"#,
        backend.addr()
    );
    let control = Control::start(&yaml).await;
    let path = dir.0.join("bootstrap.json");
    std::fs::write(&path, control.bootstrap_json("system-roots")).unwrap();
    let channel = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&path).unwrap())
        .connect("xds:///roots.tether.test")
        .unwrap();
    let mut request = tonic::Request::new(EchoRequest {
        message: "hi".into(),
    });
    request.set_timeout(Duration::from_secs(5));
    let ours = EchoClient::new(channel).echo(request).await;
    assert_eq!(ours.unwrap().into_inner().backend, "system-roots");
    let other = dir.0.join("other-ca.pem");
    std::fs::write(&other, Ca::new("another CA").pem()).unwrap();
    for (roots, a82, ok) in [
        (&ca, "true", true),
        (&ca, "false", true),
        (&other, "true", false),
    ] {
        let theirs = grpcio::Client::new(&python, &path)
            .with_env("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", roots.to_str().unwrap())
            .with_env("GRPC_EXPERIMENTAL_XDS_SYSTEM_ROOT_CERTS", a82)
            .run(
                &[
                    "--xds-creds".into(),
                    "--failures-ok".into(),
                    "--timeout".into(),
                    "5".into(),
                    "xds:///roots.tether.test".into(),
                    "1".into(),
                ],
                None,
            )
            .await
            .unwrap();
        assert!(
            !theirs.is_empty() && theirs.iter().all(|c| (c.code == "OK") == ok),
            "roots {roots:?}, A82 variable {a82}: {theirs:?}"
        );
    }
}
