//! xDS-managed mTLS (gRFC A29) beside gRPC C-core on the same control
//! plane, bootstrap and certificate files: tether-control gives a service's
//! cluster an `UpstreamTlsContext` naming the bootstrap's `file_watcher`
//! provider instances and a SPIFFE SAN matcher; tonic backends serve mTLS
//! and report the client certificate they saw. The channel and grpcio
//! (with xDS credentials) both succeed presenting the same certificate,
//! both fail when the SAN matcher names another identity, and a cluster
//! without TLS still works for both.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;

use std::path::Path;
use std::time::Duration;

use control_support::{Control, TempDir};
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio;
use tether_testkit::tls::{fingerprint, server_config, Ca};

const BACKEND_ID: &str = "spiffe://tether.test/ns/default/sa/backend";

fn yaml(secure: &GrpcBackend, plain: &GrpcBackend, san: &str) -> String {
    format!(
        r#"virtualhosts:
  - name: secure.tether.test
    domains: ["secure.tether.test"]
    routes:
      - services: [{{ name: secure }}]
  - name: plain.tether.test
    domains: ["plain.tether.test"]
    routes:
      - services: [{{ name: plain }}]
services:
  - name: secure
    protocol: h2c
    tls:
      caInstance: roots
      identityInstance: identity
      subjectAltNames:
        - exact: "{san}"
    endpoints:
      - address: "{}"
  - name: plain
    protocol: h2c
    endpoints:
      - address: "{}"
"#,
        secure.addr(),
        plain.addr()
    )
}

/// The control plane's bootstrap with `file_watcher` instances over the
/// files in `dir`.
fn bootstrap(control: &Control, dir: &Path, node: &str) -> std::path::PathBuf {
    let mut doc: serde_json::Value = serde_json::from_str(&control.bootstrap_json(node)).unwrap();
    let file = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    doc["certificate_providers"] = serde_json::json!({
        "roots": { "plugin_name": "file_watcher",
                   "config": { "ca_certificate_file": file("ca.pem"), "refresh_interval": "1s" } },
        "identity": { "plugin_name": "file_watcher",
                      "config": { "certificate_file": file("client.pem"),
                                  "private_key_file": file("client.key"),
                                  "refresh_interval": "1s" } },
    });
    let path = dir.join(format!("bootstrap-{node}.json"));
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

fn request() -> tonic::Request<EchoRequest> {
    let mut r = tonic::Request::new(EchoRequest {
        message: "hi".into(),
    });
    r.set_timeout(Duration::from_secs(10));
    r
}

/// The channel's first outcome once the resources are in: the backend and
/// the client certificate it saw, or the status.
async fn channel_call(channel: &Channel) -> Result<(String, Option<String>), tonic::Status> {
    let mut client = EchoClient::new(channel.clone());
    let mut last = None;
    for _ in 0..100 {
        match client.echo(request()).await {
            Ok(reply) => {
                let seen = reply
                    .metadata()
                    .get("x-client-cert")
                    .map(|v| v.to_str().unwrap().to_owned());
                return Ok((reply.into_inner().backend, seen));
            }
            // Not yet resolved: the resources are still coming.
            Err(s) if !s.message().contains("TLS handshake") && !s.message().contains("SAN") => {
                last = Some(s);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => return Err(s),
        }
    }
    Err(last.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_from_the_control_plane_beside_c_core() {
    let Ok(python) = grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let servers = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let client = clients.issue(&["spiffe://tether.test/ns/default/sa/client"]);
    let secure = GrpcBackend::start_tls(
        "secure",
        server_config(&servers.issue(&[BACKEND_ID, "127.0.0.1"]), Some(&clients)),
    )
    .await;
    let plain = GrpcBackend::start("plain").await;
    let dir = TempDir::new("xds-tls");
    std::fs::write(dir.0.join("ca.pem"), servers.pem()).unwrap();
    client.write(&dir.0, "client");
    let want = fingerprint(&client.cert_der);

    for (san, ok) in [
        (BACKEND_ID, true),
        ("spiffe://tether.test/ns/default/sa/other", false),
    ] {
        let control = Control::start(&yaml(&secure, &plain, san)).await;
        let path = bootstrap(&control, &dir.0, "xds-tls");
        let channel = Channel::builder()
            .bootstrap(tether::xds::Bootstrap::from_file(&path).unwrap())
            .connect("xds:///secure.tether.test")
            .unwrap();
        let plain_channel = Channel::builder()
            .bootstrap(tether::xds::Bootstrap::from_file(&path).unwrap())
            .connect("xds:///plain.tether.test")
            .unwrap();
        let ccore = grpcio::Client::new(&python, &path);
        let c_secure = ccore
            .run(
                &[
                    "--xds-creds".into(),
                    "--fail-fast".into(),
                    "--failures-ok".into(),
                    "--warm".into(),
                    "0".into(),
                    "xds:///secure.tether.test".into(),
                    "3".into(),
                ],
                None,
            )
            .await
            .unwrap();
        let c_plain = ccore
            .run(
                &[
                    "--xds-creds".into(),
                    "xds:///plain.tether.test".into(),
                    "2".into(),
                ],
                None,
            )
            .await
            .unwrap();
        // A cluster without TLS works for both.
        assert!(
            c_plain.iter().all(|c| c.ok() && c.backend == "plain"),
            "{c_plain:?}"
        );
        assert_eq!(channel_call(&plain_channel).await.unwrap().0, "plain");

        let ours = channel_call(&channel).await;
        if ok {
            let (backend, seen) = ours.expect("the channel's mTLS call");
            assert_eq!(
                (backend.as_str(), seen.as_deref()),
                ("secure", Some(want.as_str()))
            );
            assert!(
                c_secure
                    .iter()
                    .all(|c| c.ok() && c.client_cert.as_deref() == Some(want.as_str())),
                "{c_secure:?}"
            );
        } else {
            let status = ours.expect_err("a server whose SAN does not match");
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(
                status.message().contains(
                    "no SAN of the server's certificate [\"spiffe://tether.test/ns/default/sa/backend\", \"127.0.0.1\"] matches"
                ),
                "{status:?}"
            );
            // C-core fails the same calls.
            println!("C-core: {:?}", c_secure.first());
            assert!(
                !c_secure.is_empty() && c_secure.iter().all(|c| c.code == "UNAVAILABLE"),
                "{c_secure:?}"
            );
        }
    }
}

/// A client certificate rotated under load, beside C-core: backends end
/// every connection after 300 ms (GOAWAY), so both clients keep making new
/// mTLS connections; the certificate files are rewritten mid-run (certificate
/// then key, a torn pair in between). No call of either client fails, and
/// new connections present the new certificate once the file watcher
/// (`refresh_interval` 1 s) has read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_rotated_under_load_fails_no_call_beside_c_core() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let Ok(python) = grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let servers = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let old = clients.issue(&["spiffe://tether.test/ns/default/sa/client"]);
    let new = clients.issue(&["spiffe://tether.test/ns/default/sa/client"]);
    let (secure, goaways) = GrpcBackend::start_tls_rotating(
        "secure",
        server_config(&servers.issue(&[BACKEND_ID, "127.0.0.1"]), Some(&clients)),
        Duration::from_millis(300),
    )
    .await;
    let plain = GrpcBackend::start("plain").await;
    let dir = TempDir::new("xds-tls-rotation");
    std::fs::write(dir.0.join("ca.pem"), servers.pem()).unwrap();
    old.write(&dir.0, "client");
    let (old_fp, new_fp) = (fingerprint(&old.cert_der), fingerprint(&new.cert_der));
    let control = Control::start(&yaml(&secure, &plain, BACKEND_ID)).await;
    let path = bootstrap(&control, &dir.0, "xds-tls-rotation");
    let channel = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&path).unwrap())
        .connect("xds:///secure.tether.test")
        .unwrap();
    // C-core: 160 calls 50 ms apart, in its own process.
    let ccore = grpcio::Client::new(&python, &path);
    let theirs = tokio::spawn(async move {
        ccore
            .run(
                &[
                    "--xds-creds".into(),
                    "--failures-ok".into(),
                    "--pace".into(),
                    "50".into(),
                    "xds:///secure.tether.test".into(),
                    "160".into(),
                ],
                None,
            )
            .await
    });
    // The channel: 8 callers until told to stop (at most 20,000 calls).
    let stop = Arc::new(AtomicBool::new(false));
    let ours = Arc::new(AtomicU64::new(0));
    let mut callers = Vec::new();
    for _ in 0..8 {
        let (channel, stop, ours) = (channel.clone(), stop.clone(), ours.clone());
        callers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::SeqCst) && ours.fetch_add(1, Ordering::SeqCst) < 20_000 {
                let mut client = EchoClient::new(channel.clone());
                seen.push(match client.echo(request()).await {
                    Ok(r) => Ok(r
                        .metadata()
                        .get("x-client-cert")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()),
                    Err(s) => Err(s),
                });
            }
            seen
        }));
    }
    // Rotate once C-core has made 20 calls (the backend's count beyond ours).
    let started = tether_testkit::wait_until(Duration::from_secs(30), || async {
        secure.hits() >= ours.load(Ordering::SeqCst) + 20
    })
    .await;
    assert!(started, "C-core made no calls");
    std::fs::write(dir.0.join("client.pem"), &new.cert_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // a torn pair for a while
    std::fs::write(dir.0.join("client.key"), &new.key_pem).unwrap();
    let theirs = theirs.await.unwrap().expect("the C-core run");
    stop.store(true, Ordering::SeqCst);
    let mut mine = Vec::new();
    for c in callers {
        mine.extend(c.await.unwrap());
    }
    let failed: Vec<_> = mine.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        mine.len(),
        failed.first()
    );
    let presented = |fp: &str| {
        mine.iter()
            .filter(|r| r.as_deref().ok() == Some(fp))
            .count()
    };
    assert!(
        presented(&old_fp) > 0 && presented(&new_fp) > 0,
        "old {} new {}",
        presented(&old_fp),
        presented(&new_fp)
    );
    assert!(
        theirs.iter().all(|c| c.ok()),
        "C-core: {:?}",
        theirs.iter().find(|c| !c.ok())
    );
    let theirs_fp: Vec<_> = theirs
        .iter()
        .filter_map(|c| c.client_cert.clone())
        .collect();
    assert!(
        theirs_fp.contains(&old_fp) && theirs_fp.contains(&new_fp),
        "C-core presented {theirs_fp:?}"
    );
    assert!(
        goaways.load(Ordering::SeqCst) > 10,
        "the backend rotated connections"
    );
    println!(
        "rotation: channel {} calls ({} old, {} new certificate), C-core {} calls, {} GOAWAYs",
        mine.len(),
        presented(&old_fp),
        presented(&new_fp),
        theirs.len(),
        goaways.load(Ordering::SeqCst)
    );
}

/// How an `exact` SAN matcher reads SANs of each type, beside C-core on the
/// same certificates: DNS rules (case folded, a `*.` left-most label
/// matching one label) apply to URI SANs too, as C-core applies them
/// (grpc-go applies them to DNS SANs only), and e-mail SANs are not
/// consulted at all, as C-core does not consult them. tether follows
/// C-core; it used to accept an e-mail SAN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_san_matching_by_san_type_beside_c_core() {
    let Ok(python) = grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let servers = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let client = clients.issue(&["spiffe://tether.test/ns/default/sa/client"]);
    let dir = TempDir::new("xds-tls-san-types");
    std::fs::write(dir.0.join("ca.pem"), servers.pem()).unwrap();
    client.write(&dir.0, "client");
    // (the server certificate's SAN, the matcher, what C-core does)
    let cases = [
        (
            "uri:spiffe://Tether.Test/NS/default/sa/backend",
            BACKEND_ID,
            true,
        ),
        ("uri:*.tether.test", "backend.tether.test", true),
        ("uri:*.tether.test", "a.backend.tether.test", false),
        ("email:backend@tether.test", "backend@tether.test", false),
        ("BACKEND.tether.test", "backend.tether.test", true),
    ];
    let mut backends = Vec::new();
    let mut yaml = String::from("virtualhosts:\n");
    for i in 0..cases.len() {
        yaml += &format!(
            "  - name: san{i}.tether.test\n    routes:\n      - services: [{{ name: s{i} }}]\n"
        );
    }
    yaml += "services:\n";
    for (i, (san, matcher, _)) in cases.iter().enumerate() {
        let backend = GrpcBackend::start_tls(
            &format!("s{i}"),
            server_config(&servers.issue(&[san]), Some(&clients)),
        )
        .await;
        yaml += &format!(
            "  - name: s{i}\n    protocol: h2c\n    tls:\n      caInstance: roots\n      \
             identityInstance: identity\n      subjectAltNames: [ {{ exact: \"{matcher}\" }} ]\n    \
             endpoints:\n      - address: \"{}\"\n",
            backend.addr()
        );
        backends.push(backend);
    }
    let control = Control::start(&yaml).await;
    let path = bootstrap(&control, &dir.0, "xds-tls-san-types");
    for (i, (san, matcher, c_core)) in cases.iter().enumerate() {
        let target = format!("xds:///san{i}.tether.test");
        let channel = Channel::builder()
            .bootstrap(tether::xds::Bootstrap::from_file(&path).unwrap())
            .connect(&target)
            .unwrap();
        let ours = channel_call(&channel).await.is_ok();
        let theirs = grpcio::Client::new(&python, &path)
            .run(
                &[
                    "--xds-creds".into(),
                    "--fail-fast".into(),
                    "--failures-ok".into(),
                    "--timeout".into(),
                    "5".into(),
                    target.clone(),
                    "1".into(),
                ],
                None,
            )
            .await
            .unwrap();
        assert!(!theirs.is_empty(), "{target}");
        let theirs = theirs.iter().all(|c| c.ok());
        assert_eq!(
            (ours, theirs),
            (*c_core, *c_core),
            "SAN {san} against exact {matcher}: (tether, C-core)"
        );
    }
}
