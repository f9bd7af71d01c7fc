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
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::time::Duration;

use control_support::{Control, TempDir};
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio;
use tether_testkit::tls::{server_config, Ca};

const BACKEND_ID: &str = "spiffe://tether.test/ns/default/sa/backend";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_root_certs_beside_c_core() {
    log::set_logger(&LOGGER).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
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
    assert_eq!(
        backend_through(&path, "xds:///roots.tether.test").await,
        "system-roots"
    );
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

    // The system's roots and no SAN matcher (tether-control refuses to
    // write it; another control plane may send it): C-core accepts any
    // certificate that chains, and so does tether, saying once that the
    // cluster trusts every public CA.
    let f = xds_support::Fixture::start(xds_support::Mode::Serve).await;
    serve_system_roots_without_sans(&f, backend.addr());
    let path = dir.0.join("bootstrap-any.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"xds_servers":[{{"server_uri":"{}","channel_creds":[{{"type":"insecure"}}],"server_features":["xds_v3"]}}],"node":{{"id":"any"}}}}"#,
            f.addr
        ),
    )
    .unwrap();
    assert_eq!(
        backend_through(&path, "xds:///any.tether.test").await,
        "system-roots"
    );
    let warnings = warnings();
    assert_eq!(
        warnings
            .iter()
            .filter(|w| w.starts_with("cluster any: TLS verified against the system's roots with no match_subject_alt_names"))
            .count(),
        1,
        "{warnings:?}"
    );
    let theirs = grpcio::Client::new(&python, &path)
        .with_env("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", ca.to_str().unwrap())
        .run(
            &[
                "--xds-creds".into(),
                "--timeout".into(),
                "5".into(),
                "xds:///any.tether.test".into(),
                "1".into(),
            ],
            None,
        )
        .await
        .unwrap();
    assert!(
        !theirs.is_empty() && theirs.iter().all(|c| c.code == "OK"),
        "C-core: {theirs:?}"
    );
}

/// The backend that answers one call to `target` through a channel on the
/// bootstrap at `path`.
async fn backend_through(path: &std::path::Path, target: &str) -> String {
    let channel = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(path).unwrap())
        .connect(target)
        .unwrap();
    let mut request = tonic::Request::new(EchoRequest {
        message: "hi".into(),
    });
    request.set_timeout(Duration::from_secs(5));
    let reply = EchoClient::new(channel).echo(request).await;
    reply.unwrap().into_inner().backend
}

/// Cluster `any`, TLS against the system's roots, no SAN matcher, at
/// `backend`, for the target `any.tether.test`.
fn serve_system_roots_without_sans(f: &xds_support::Fixture, backend: std::net::SocketAddr) {
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
    use tether::xds::resource::pack;
    use xds_support::make;
    let context = tls::UpstreamTlsContext {
        common_tls_context: Some(tls::CommonTlsContext {
            validation_context_type: Some(
                tls::common_tls_context::ValidationContextType::ValidationContext(
                    tls::CertificateValidationContext {
                        system_root_certs: Some(
                            tls::certificate_validation_context::SystemRootCerts {},
                        ),
                        ..Default::default()
                    },
                ),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut cluster = make::cluster("any");
    cluster.transport_socket = Some(core::TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(pack(
            &context,
        ))),
    });
    f.set_resources(
        xds_support::LDS,
        vec![make::listener("any.tether.test", "routes")],
    );
    f.set_resources(
        "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        vec![pack(&make::route_config(
            "routes",
            vec![make::route("/", "any")],
        ))],
    );
    f.set_resources(xds_support::CDS, vec![pack(&cluster)]);
    f.set_resources(
        "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        vec![pack(&make::endpoints("any", &backend.to_string()))],
    );
}

/// The warnings logged in this test binary so far.
fn warnings() -> Vec<String> {
    LOGGER.lines.lock().unwrap().clone()
}

/// Keeps the process's warnings, so the test can see what an operator
/// would read.
struct Capture {
    lines: std::sync::Mutex<Vec<String>>,
}

static LOGGER: Capture = Capture {
    lines: std::sync::Mutex::new(Vec::new()),
};

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            self.lines.lock().unwrap().push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}
