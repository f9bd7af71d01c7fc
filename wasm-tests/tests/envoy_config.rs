//! The plugin's configuration in a real Envoy 1.40, and the ready-to-copy
//! files of `envoy-configs/`:
//! - an invalid plugin configuration is one log line naming the field and
//!   the value, and Envoy refuses it: at start-up it does not start, on a
//!   listener update it rejects the update and keeps serving the old one;
//! - every file passes `envoy --mode validate`;
//! - the Envoy-served backends (`backends.yaml`) and the plugin in front of
//!   them pin sessions when run as they are, on loopback;
//! - the compose demo's files agree with each other (`docker-compose.yml`,
//!   `compose/`): tether-control takes its file, the backends' addresses are
//!   the containers', Envoy validates its bootstrap. The compose project
//!   itself runs in `scripts/compose-test.sh`.

use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tether_testkit::envoy::{validate, Envoy};
use tether_testkit::{free_port, wait_until};
use tether_wasm_tests::scenario::{
    backend, config_file, config_text, listener, minted, override_host_cluster, plugin_config,
    plugin_filter, plugin_path, replace, route, start_envoy, with_plugin_config, Backends,
    CONFIG_BACKEND_PORTS, CONFIG_PLUGIN_PATH,
};

const BAD_LINE: &str = r#"tether: invalid plugin configuration: cookie.ttl: "-5s" is negative"#;

fn bad_config() -> serde_json::Value {
    let mut c = plugin_config();
    c["cookie"]["ttl"] = json!("-5s");
    c
}

#[tokio::test]
async fn invalid_configuration_stops_envoy_from_starting() {
    let b = Backends::start(3).await;
    let yaml = with_plugin_config(
        &config_file("plugin-override-host.yaml", free_port(), &b.addrs()),
        &bad_config(),
    );
    let err = match Envoy::start(&yaml).await {
        Ok(_) => panic!("Envoy started with an invalid plugin configuration"),
        Err(e) => e,
    };
    assert!(err.contains(BAD_LINE), "{err}");
    // `envoy --mode validate` runs the plugin's configure too.
    let err = validate(&yaml).await.unwrap_err();
    assert!(err.contains("Unable to create Wasm plugin tether"), "{err}");
    // Unknown fields, wrong types and bad values of the plugin's own fields too.
    for (field, value, line) in [
        ("stict", json!(true), "stict: is not a known field"),
        (
            "override_encoding",
            json!("csv"),
            r#"override_encoding: "csv" is not one of list, session_header"#,
        ),
        (
            "override_header",
            json!("a b"),
            r#"override_header: "a b" is not a valid name"#,
        ),
    ] {
        let mut c = plugin_config();
        c[field] = value;
        let yaml = with_plugin_config(
            &config_file("plugin-override-host.yaml", free_port(), &b.addrs()),
            &c,
        );
        let err = validate(&yaml).await.unwrap_err();
        assert!(err.contains(line), "{field}: {err}");
    }
}

/// A private directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tether-lds-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
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

/// Writes the listener as Envoy's filesystem LDS reads it, atomically (Envoy
/// watches for the file being moved into place).
fn write_lds(dir: &TempDir, listener: serde_json::Value) {
    let mut l = listener;
    l["@type"] = json!("type.googleapis.com/envoy.config.listener.v3.Listener");
    let tmp = dir.0.join("lds.tmp");
    std::fs::write(&tmp, json!({ "resources": [l] }).to_string()).unwrap();
    std::fs::rename(&tmp, dir.0.join("lds.yaml")).unwrap();
}

#[tokio::test]
async fn invalid_configuration_update_is_rejected_and_the_old_one_keeps_serving() {
    let b = Backends::start(3).await;
    let dir = TempDir::new();
    let port = free_port();
    let make = |config: &serde_json::Value| {
        listener(
            "ingress",
            port,
            vec![plugin_filter(config)],
            vec![route("/", "app")],
        )
    };
    write_lds(&dir, make(&plugin_config()));
    let yaml = json!({
        "node": { "id": "tether-test", "cluster": "tether-test" },
        "admin": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } } },
        "dynamic_resources": { "lds_config": {
            "path_config_source": { "path": dir.0.join("lds.yaml").display().to_string() },
            "resource_api_version": "V3"
        } },
        "static_resources": { "clusters": [override_host_cluster("app", &b.addrs())] }
    })
    .to_string();
    let envoy = start_envoy(&yaml).await;
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let first = tether_testkit::client::get(listen, "/", &[]).await.unwrap();
    let session = minted(&first).expect("the first configuration serves sessions");

    write_lds(&dir, make(&bad_config()));
    let rejected = wait_until(Duration::from_secs(10), || async {
        envoy
            .stat("listener_manager.lds.update_rejected")
            .await
            .unwrap_or(0)
            >= 1
    })
    .await;
    assert!(rejected, "the update was rejected:\n{}", envoy.log());
    assert!(envoy.log().contains(BAD_LINE), "{}", envoy.log());
    // The listener of the last good configuration still pins sessions.
    for _ in 0..10 {
        let r = tether_testkit::client::get(listen, "/", &[("cookie", &session.cookie_header())])
            .await
            .unwrap();
        assert_eq!(backend(&r), backend(&first));
    }
    assert!(minted(&tether_testkit::client::get(listen, "/", &[]).await.unwrap()).is_some());
}

#[tokio::test]
async fn every_ready_to_copy_config_validates() {
    for file in [
        "native-cookie.yaml",
        "plugin-override-host.yaml",
        "plugin-native-header.yaml",
        "backends.yaml",
    ] {
        let text = config_text(file).replace(CONFIG_PLUGIN_PATH, &plugin_path());
        if let Err(e) = validate(&text).await {
            panic!("{file}: {e}");
        }
    }
}

#[tokio::test]
async fn compose_demo_files_agree() {
    let compose = config_text("docker-compose.yml");
    // Image names are parameters; the defaults are the official images (and
    // the tether image built from its Dockerfile).
    for image in [
        "image: ${ENVOY_IMAGE:-envoyproxy/envoy:v1.40.0}",
        "image: ${PYTHON_IMAGE:-python:3.11-slim}",
        "image: ${TETHER_IMAGE:-",
        "dockerfile: envoy-configs/images/tether.Dockerfile",
    ] {
        assert!(compose.contains(image), "docker-compose.yml: {image}");
    }
    // tether-control takes its file, and its backends are the replicas of
    // one service, found by name through Docker's DNS.
    let yaml = config_text("compose/tether.yaml");
    let config = tether_control::Config::parse(&yaml).unwrap_or_else(|e| panic!("{e}"));
    for service in ["shop", "catalog"] {
        let spec = config.services.iter().find(|s| s.name == service).unwrap();
        let addrs: Vec<String> = spec
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect();
        assert_eq!(addrs, ["backend:8080"], "service {service}");
    }
    for text in [
        "  backend:\n",
        "command: [\"tether-demo-backend\", \"--listen\", \"0.0.0.0:8080\"]",
        "scale: 3",
        "depends_on: [backend]",
        "ip_range: \"${TETHER_NET:-10.203.117}.128/25\"",
    ] {
        assert!(compose.contains(text), "docker-compose.yml: {text}");
    }
    assert!(
        !compose.contains("backend-1"),
        "docker-compose.yml: a fixed backend container is left"
    );
    // The plugin is where the image puts it and Envoy mounts it.
    let plugin = config
        .envoy
        .plugin
        .as_ref()
        .and_then(|p| p.filename.clone());
    assert_eq!(
        plugin.as_deref(),
        Some("/opt/tether/plugin/tether_plugin.wasm")
    );
    assert!(compose.contains("- plugin:/opt/tether/plugin:ro"));
    assert!(config_text("images/tether.Dockerfile").contains("/opt/tether/plugin/"));
    // The bootstraps point at the tether-control service.
    let bootstrap = tether::xds::Bootstrap::from_json(&config_text("compose/bootstrap.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        bootstrap.server().unwrap().server_uri,
        "tether-control:18000"
    );
    let envoy = config_text("compose/envoy.yaml");
    assert!(envoy.contains("address: tether-control, port_value: 18000"));
    if let Err(e) = validate(&envoy).await {
        panic!("compose/envoy.yaml: {e}");
    }
}

/// The mTLS variant (`docker-compose.mtls.yml` over `docker-compose.yml`)
/// agrees with itself: tether-control's file is the plain one with `tls` on
/// every service, naming instances the bootstrap defines and the SAN the
/// `certs` service issues; the certificates live where everything mounts
/// them; Envoy validates its bootstrap with certificates at those paths.
#[tokio::test]
async fn compose_mtls_variant_files_agree() {
    let overlay = config_text("docker-compose.mtls.yml");
    let plain = tether_control::Config::parse(&config_text("compose/tether.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let mtls = tether_control::Config::parse(&config_text("compose/tether-mtls.yaml"))
        .unwrap_or_else(|e| panic!("compose/tether-mtls.yaml: {e}"));
    let bootstrap = tether::xds::Bootstrap::from_json(&config_text("compose/bootstrap-mtls.json"))
        .unwrap_or_else(|e| panic!("compose/bootstrap-mtls.json: {e}"));
    assert_eq!(mtls.services.len(), plain.services.len());
    for (p, m) in plain.services.iter().zip(&mtls.services) {
        assert_eq!((&p.name, &p.endpoints), (&m.name, &m.endpoints));
        let tls = m
            .tls
            .as_ref()
            .unwrap_or_else(|| panic!("service {}: no tls", m.name));
        for instance in [Some(&tls.ca_instance), tls.identity_instance.as_ref()] {
            let instance = instance.unwrap();
            assert!(
                bootstrap.certificate_providers.contains_key(instance),
                "service {}: instance {instance} is not in bootstrap-mtls.json",
                m.name
            );
        }
        assert_eq!(
            tls.subject_alt_names[0].exact.as_deref(),
            Some("spiffe://tether.demo/ns/shop/sa/backend"),
            "the backends' SAN as tether-demo-certs issues it"
        );
        let files = tls.envoy.as_ref().expect("tls.envoy");
        assert_eq!(files.ca_file, "/certs/ca.pem");
    }
    let server = bootstrap.server().unwrap();
    assert_eq!(server.server_uri, "tether-control:18000");
    assert!(
        matches!(
            server.channel_creds,
            tether::xds::bootstrap::ChannelCreds::Tls(_)
        ),
        "bootstrap-mtls.json: TLS to tether-control"
    );
    // Every service but the one-shot `certs` mounts the volume and waits for it.
    for service in [
        "tether-control",
        "backend",
        "envoy",
        "channel-client",
        "grpcio-client",
    ] {
        assert!(
            overlay.contains(&format!("  {service}:\n    <<: *certs\n")),
            "docker-compose.mtls.yml: {service} does not take the certs volume"
        );
    }
    assert!(overlay.contains("certs: { condition: service_completed_successfully }"));
    assert!(overlay.contains("\"--config\", \"/etc/tether/tether-mtls.yaml\""));
    assert_eq!(
        overlay
            .matches("\"--tls-client-ca\", \"/certs/ca.pem\"")
            .count(),
        2,
        "tether-control and the backend service ask for client certificates"
    );
    // Envoy's bootstrap, with certificates where the volume puts them.
    let dir = std::env::temp_dir().join(format!("tether-compose-mtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = tether_testkit::tls::Ca::new("compose test CA");
    ca.issue(&["spiffe://tether.demo/ns/shop/sa/client"])
        .write(&dir, "client");
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let envoy = config_text("compose/envoy-mtls.yaml");
    assert!(envoy.contains("matcher: { exact: tether-control }"));
    let envoy = envoy.replace("/certs/", &format!("{}/", dir.display()));
    let validated = validate(&envoy).await;
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = validated {
        panic!("compose/envoy-mtls.yaml: {e}");
    }
}

#[tokio::test]
async fn envoy_served_backends_and_the_plugin_pin_sessions() {
    // Envoy serving the backends, and Envoy with the plugin in front of them.
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut backends_yaml = config_text("backends.yaml");
    for (from, to) in CONFIG_BACKEND_PORTS.iter().zip(&ports) {
        backends_yaml = replace(
            &backends_yaml,
            &format!("port_value: {from} "),
            &format!("port_value: {to} "),
        );
    }
    backends_yaml = format!(
        "admin:\n  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}\n{backends_yaml}"
    );
    let _backends = start_envoy(&backends_yaml).await;
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    let port = free_port();
    let _envoy = start_envoy(&config_file("plugin-override-host.yaml", port, &addrs)).await;
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    let first = tether_testkit::client::get(listen, "/", &[]).await.unwrap();
    let name = backend(&first).to_string();
    assert!(name.starts_with("backend-"), "{:?}", first.headers);
    let session = minted(&first).expect("a session cookie");
    assert_eq!(
        format!(
            "backend-{}",
            ports
                .iter()
                .position(|p| *p == session.address().port())
                .unwrap()
                + 1
        ),
        name
    );
    for _ in 0..20 {
        let r = tether_testkit::client::get(listen, "/", &[("cookie", &session.cookie_header())])
            .await
            .unwrap();
        assert_eq!(backend(&r), name);
        assert!(minted(&r).is_none());
    }
}
