//! The management server on a Unix domain socket (`unix:` server URIs), as
//! Istio's agent serves xDS to proxyless clients: the XdsClient gets its
//! resources from tether-control through the socket, and gRPC C-core
//! (grpcio) on the same bootstrap dials the same socket and asks for the
//! same listener; a `unix:` URI without a path is refused naming the field.
//!
//! C-core sends the socket's path, percent-encoded, as the ADS call's
//! `:authority` (`tmp%2F...%2Fxds.sock`); servers built on hyper/h2 (tonic,
//! so tether-control) refuse such an authority with RST_STREAM
//! PROTOCOL_ERROR, while Istio's agent (Go) takes it. tether's client sends
//! `localhost`. So C-core is checked here up to its request on the socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_control::{translate, Config, ControlPlane};
use tether_testkit::grpc::GrpcBackend;
use tether_testkit::grpcio;
use tether_xds::bootstrap::ServerAddress;
use tether_xds::{Bootstrap, ResourceKind, XdsClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};

/// Forwards every connection on a Unix socket at `path` to `to` (where
/// tether-control listens on TCP); the bytes cross a real Unix socket.
fn unix_front(path: &Path, to: std::net::SocketAddr) {
    let listener = UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        while let Ok((mut unix, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut tcp) = TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut unix, &mut tcp).await;
                }
            });
        }
    });
}

fn bootstrap_json(uri: &str) -> String {
    format!(
        r#"{{"xds_servers":[{{"server_uri":"{uri}","channel_creds":[{{"type":"insecure"}}],
            "server_features":["xds_v3"]}}],"node":{{"id":"unix-node"}}}}"#
    )
}

fn socket_path(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tether-unix-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("xds.sock")
}

#[test]
fn unix_server_uris() {
    let b = Bootstrap::from_json(&bootstrap_json("unix:///var/run/agent/xds.sock")).unwrap();
    assert_eq!(
        b.server().unwrap().address(),
        ServerAddress::Unix("/var/run/agent/xds.sock".into())
    );
    let b = Bootstrap::from_json(&bootstrap_json("unix:relative.sock")).unwrap();
    assert_eq!(
        b.server().unwrap().address(),
        ServerAddress::Unix("relative.sock".into())
    );
    let b = Bootstrap::from_json(&bootstrap_json("127.0.0.1:18000")).unwrap();
    assert_eq!(
        b.server().unwrap().address(),
        ServerAddress::Tcp("http://127.0.0.1:18000".into())
    );
    let e = Bootstrap::from_json(&bootstrap_json("unix://")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bootstrap xds_servers[0].server_uri: unix:// names no socket path (unix:PATH or unix:///ABSOLUTE_PATH)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_xds_client_gets_its_resources_over_a_unix_socket() {
    let backend = GrpcBackend::start("over-unix").await;
    let yaml = format!(
        "virtualhosts:\n  - name: unix.tether.test\n    routes:\n      - services: [{{ name: s }}]\n\
         services:\n  - name: s\n    protocol: h2c\n    endpoints:\n      - address: \"{}\"\n",
        backend.addr()
    );
    let plane = ControlPlane::new(translate(&Config::parse(&yaml).unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { plane.serve(listener, std::future::pending()).await });
    let path = socket_path("client");
    let _ = std::fs::remove_file(&path);
    unix_front(&path, addr);
    let uri = format!("unix://{}", path.display());

    let client = XdsClient::start(Bootstrap::from_json(&bootstrap_json(&uri)).unwrap()).unwrap();
    let mut watcher = client.watch(ResourceKind::Listener, "unix.tether.test");
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        watcher.wait_for(|s| s.resource.is_some()),
    )
    .await
    .expect("the listener over the Unix socket within 10 s")
    .expect("the client runs");
    assert!(got.error.is_none(), "{got:?}");

    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// What a client wrote on a Unix socket at `path` after the server's empty
/// SETTINGS, until `enough` holds for it (10 s at most).
async fn first_bytes(listener: UnixListener, enough: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("a connection within 10 s")
        .unwrap();
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !enough(&seen) {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    seen
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_core_dials_the_same_socket_for_the_same_listener() {
    let path = socket_path("ccore");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let file = path.with_file_name("bootstrap.json");
    std::fs::write(&file, bootstrap_json(&format!("unix://{}", path.display()))).unwrap();
    let python = grpcio::python_or_install(None)
        .await
        .expect("grpcio is needed (scripts/setup.sh installs it)");
    let _ccore = tether_testkit::command(&python)
        .arg(grpcio::client_script())
        .args(["xds:///unix.tether.test", "1"])
        .env("GRPC_XDS_BOOTSTRAP", &file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let seen = first_bytes(listener, |b| contains(b, b"unix.tether.test")).await;
    assert!(
        contains(
            &seen,
            b"/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
        ),
        "{}",
        String::from_utf8_lossy(&seen)
    );
    assert!(contains(&seen, b"unix-node"), "the bootstrap's node");
    assert!(
        contains(&seen, b"unix.tether.test"),
        "the listener asked for"
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
