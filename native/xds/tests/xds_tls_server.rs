//! TLS to the management server (gRFC A65's `tls` channel credentials in
//! the bootstrap), beside gRPC C-core on the same bootstrap and files:
//! tether-control serving ADS over TLS; both clients get their
//! resources; roots the server does not chain to fail the stream naming
//! the TLS error; the first supported `channel_creds` type wins.

use std::path::Path;
use std::time::Duration;

use tether_control::{translate, Config, ControlPlane};
use tether_testkit::grpc::GrpcBackend;
use tether_testkit::grpcio;
use tether_testkit::tls::{server_config, Ca};
use tether_xds::bootstrap::ChannelCreds;
use tether_xds::{Bootstrap, ResourceKind, XdsClient};
use tokio::net::TcpListener;

fn bootstrap_json(port: u16, ca: &Path) -> String {
    format!(
        r#"{{"xds_servers":[{{"server_uri":"localhost:{port}",
            "channel_creds":[{{"type":"tls","config":{{"ca_certificate_file":"{}"}}}}],
            "server_features":["xds_v3"]}}],"node":{{"id":"tls-node"}}}}"#,
        ca.display()
    )
}

#[test]
fn the_first_supported_channel_creds_type_wins() {
    let parse = |creds: &str| {
        Bootstrap::from_json(&format!(
            r#"{{"xds_servers":[{{"server_uri":"localhost:1","channel_creds":{creds}}}],"node":{{"id":"n"}}}}"#
        ))
        .map(|b| b.server().unwrap().channel_creds.clone())
        .map_err(|e| e.to_string())
    };
    assert!(matches!(
        parse(r#"[{"type":"google_default"},{"type":"tls"},{"type":"insecure"}]"#),
        Ok(ChannelCreds::Tls(_))
    ));
    assert_eq!(
        parse(r#"[{"type":"insecure"},{"type":"tls"}]"#),
        Ok(ChannelCreds::Insecure)
    );
    assert_eq!(
        parse(r#"[{"type":"google_default"}]"#).unwrap_err(),
        "bootstrap xds_servers[0].channel_creds: [\"google_default\"] has no supported type (tether supports \
         \"insecure\" and \"tls\"; google_default needs Google's metadata server, which tether does not use)"
    );
    assert_eq!(
        parse(r#"[{"type":"tls","config":{"certificate_file":"c.pem"}}]"#).unwrap_err(),
        "bootstrap xds_servers[0].channel_creds[0].config: needs both certificate_file and private_key_file, \
         or neither"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_the_control_plane_beside_c_core() {
    let backend = GrpcBackend::start("behind-tls").await;
    let yaml = format!(
        "virtualhosts:\n  - name: tls.tether.test\n    routes:\n      - services: [{{ name: s }}]\n\
         services:\n  - name: s\n    protocol: h2c\n    endpoints:\n      - address: \"{}\"\n",
        backend.addr()
    );
    // tether-control itself serves ADS over TLS.
    let plane = ControlPlane::new(translate(&Config::parse(&yaml).unwrap()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let ca = Ca::new("control plane CA");
    let config = server_config(&ca.issue(&["localhost"]), None);
    tokio::spawn(async move {
        plane
            .serve_tls(listener, config, std::future::pending())
            .await
    });
    let dir = std::env::temp_dir().join(format!("tether-xds-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let other_file = dir.join("other.pem");
    std::fs::write(&other_file, Ca::new("another CA").pem()).unwrap();

    let client =
        XdsClient::start(Bootstrap::from_json(&bootstrap_json(port, &ca_file)).unwrap()).unwrap();
    let mut w = client.watch(ResourceKind::Listener, "tls.tether.test");
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        w.wait_for(|s| s.resource.is_some()),
    )
    .await
    .expect("the listener over TLS within 10 s")
    .unwrap();
    assert!(got.error.is_none(), "{got:?}");

    let file = dir.join("bootstrap.json");
    std::fs::write(&file, bootstrap_json(port, &ca_file)).unwrap();
    let python = grpcio::python_or_install(None)
        .await
        .expect("grpcio is needed (scripts/setup.sh installs it)");
    let calls = grpcio::Client::new(&python, &file)
        .calls("xds:///tls.tether.test", 2, None)
        .await
        .expect("C-core with TLS to the control plane");
    assert!(
        calls.iter().all(|c| c.ok() && c.backend == "behind-tls"),
        "{calls:?}"
    );

    // Roots the server does not chain to: the stream fails, naming why.
    let client =
        XdsClient::start(Bootstrap::from_json(&bootstrap_json(port, &other_file)).unwrap())
            .unwrap();
    let mut w = client.watch(ResourceKind::Listener, "tls.tether.test");
    let failed = tokio::time::timeout(Duration::from_secs(10), w.wait_for(|s| s.error.is_some()))
        .await
        .expect("an error within 10 s")
        .unwrap();
    assert!(failed.resource.is_none());
    let error = failed.error.unwrap().to_string();
    assert!(
        error.contains("TLS handshake with localhost") && error.contains("UnknownIssuer"),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
