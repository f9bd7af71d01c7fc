//! The xDS server's credentials beside gRPC C-core (grpcio) on the same
//! bootstrap, token and certificates: gRFC A97's `jwt_token_file` call
//! credentials on the stream (a TLS ADS server records each stream's
//! `authorization` header), TLS over a `unix:` socket, and the
//! `channel_creds` C-core refuses.

mod xds_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_testkit::grpc::GrpcBackend;
use tether_testkit::grpcio;
use tether_testkit::tls::{server_config, Ca};
use tether_xds::resource::pack;
use xds_support::make::{endpoints, route, route_config};
use xds_support::{make, Fixture, Mode, CDS, LDS};

const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const TARGET: &str = "jwt.tether.test";

/// A JWT (unsigned: the client only reads `exp`) expiring at `exp`.
fn jwt(exp: u64) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.{}",
        b64(r#"{"alg":"none","typ":"JWT"}"#),
        b64(&format!(r#"{{"exp":{exp},"sub":"tether-test"}}"#)),
        b64("signature")
    )
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn bootstrap(port: u16, creds: &str, token: &Path, node: &str) -> String {
    format!(
        r#"{{"xds_servers":[{{"server_uri":"localhost:{port}","channel_creds":[{creds}],
            "call_creds":[{{"type":"jwt_token_file","config":{{"jwt_token_file":"{}"}}}}],
            "server_features":["xds_v3"]}}],"node":{{"id":"{node}"}}}}"#,
        token.display()
    )
}

/// The target's listener, routes, cluster and `backend` as its endpoint.
fn serve(f: &Fixture, backend: &GrpcBackend) {
    f.set_resources(LDS, vec![make::listener(TARGET, "routes")]);
    f.set_resources(
        RDS,
        vec![pack(&route_config("routes", vec![route("/", "c")]))],
    );
    f.set_resources(CDS, vec![pack(&make::cluster("c"))]);
    f.set_resources(
        EDS,
        vec![pack(&endpoints("c", &backend.addr().to_string()))],
    );
}

/// One C-core call to the target with a 3 s deadline (for calls that fail).
fn short_call() -> Vec<String> {
    ["--timeout", "3", &format!("xds:///{TARGET}"), "1"]
        .map(str::to_owned)
        .to_vec()
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn tether_client(
    file: &Path,
    a97: bool,
) -> (tether_xds::XdsClient, tether_xds::ResourceState) {
    let mut options = tether_xds::client::ClientOptions::default();
    options.bootstrap_call_creds = a97;
    let client =
        tether_xds::XdsClient::start_with(tether_xds::Bootstrap::from_file(file).unwrap(), options)
            .unwrap();
    let mut w = client.watch(tether_xds::ResourceKind::Listener, TARGET);
    let state = tokio::time::timeout(
        Duration::from_secs(10),
        w.wait_for(|s| s.resource.is_some() || s.error.is_some()),
    )
    .await
    .expect("the listener or an error within 10 s")
    .unwrap();
    (client, state)
}

/// With TLS and A97 on, both send `Bearer <token>` on their ADS stream and
/// get their resources; with A97 off (C-core's switch unset) neither sends
/// it; over plaintext both refuse to, and their streams fail UNAUTHENTICATED
/// with C-core's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jwt_goes_on_the_ads_stream_as_c_core_sends_it() {
    let backend = GrpcBackend::start("behind-jwt").await;
    let ca = Ca::new("xds CA");
    let f = Fixture::start_tls(Mode::Serve, server_config(&ca.issue(&["localhost"]), None)).await;
    serve(&f, &backend);
    let plain = Fixture::start(Mode::Serve).await;
    serve(&plain, &backend);
    let dir = Dir(std::env::temp_dir().join(format!("tether-a97-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let token_file = dir.0.join("token.jwt");
    let token = jwt(now() + 3600);
    std::fs::write(&token_file, &token).unwrap();
    let tls = format!(
        r#"{{"type":"tls","config":{{"ca_certificate_file":"{}"}}}}"#,
        ca_file.display()
    );
    let python = grpcio::python_or_install(None).await.unwrap();
    let bearer = Some(format!("Bearer {token}"));
    for (name, a97, want) in [
        ("tls-a97", true, bearer.clone()),
        ("tls-no-a97", false, None),
    ] {
        let file = dir.0.join(format!("{name}.json"));
        std::fs::write(&file, bootstrap(f.addr.port(), &tls, &token_file, name)).unwrap();
        // tether.
        let before = f.authorizations().len();
        let (_client, state) = tether_client(&file, a97).await;
        assert!(state.resource.is_some(), "{name}: {state:?}");
        let mine = f.authorizations()[before..].to_vec();
        assert_eq!(mine.first(), Some(&want), "{name}: tether");
        // C-core on the same files.
        let mut client = grpcio::Client::new(&python, &file);
        if a97 {
            client = client.with_env(tether_xds::call_creds::ENV, "true");
        }
        let before = f.authorizations().len();
        let calls = client
            .calls(&format!("xds:///{TARGET}"), 1, None)
            .await
            .unwrap_or_else(|e| panic!("{name}: C-core: {e}"));
        assert!(calls.iter().all(|c| c.ok()), "{name}: {calls:?}");
        let theirs = f.authorizations()[before..].to_vec();
        assert_eq!(theirs.first(), Some(&want), "{name}: C-core");
    }
    // A token file ending in a newline: tether sends the token trimmed;
    // C-core sends the bytes as they are, an invalid header value the
    // server refuses (hyper's h2 answers GOAWAY PROTOCOL_ERROR).
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let file = dir.0.join("tls-a97.json");
    let before = f.authorizations().len();
    let (_client, state) = tether_client(&file, true).await;
    assert!(state.resource.is_some(), "{state:?}");
    assert_eq!(f.authorizations()[before..].first(), Some(&bearer));
    let theirs = grpcio::Client::new(&python, &file)
        .with_env(tether_xds::call_creds::ENV, "true")
        .run(&short_call(), None)
        .await
        .expect_err("C-core sends the newline");
    assert!(theirs.contains("GOAWAY"), "C-core: {theirs}");

    // Plaintext: neither sends the token; both fail the stream.
    let file = dir.0.join("plaintext.json");
    std::fs::write(
        &file,
        bootstrap(
            plain.addr.port(),
            r#"{"type":"insecure"}"#,
            &token_file,
            "plaintext",
        ),
    )
    .unwrap();
    let (_client, state) = tether_client(&file, true).await;
    let error = state.error.expect("an error").to_string();
    let words = "status: UNAUTHENTICATED: Established channel does not have a sufficient security \
                 level to transfer call credential.";
    assert!(error.contains(words), "tether: {error}");
    let theirs = grpcio::Client::new(&python, &file)
        .with_env(tether_xds::call_creds::ENV, "true")
        .run(&short_call(), None)
        .await
        .expect_err("C-core fails too");
    assert!(theirs.contains(words), "C-core: {theirs}");
    assert!(plain.authorizations().iter().all(Option::is_none));
}

/// A `jwt_token_file` entry without its file is a bootstrap error naming the
/// field; entries of other types are ignored, as gRPC ignores them.
#[test]
fn call_creds_configs_are_checked_when_a97_is_on() {
    let parse = |creds: &str, a97: bool| {
        let b = tether_xds::Bootstrap::from_json(&format!(
            r#"{{"xds_servers":[{{"server_uri":"localhost:1","channel_creds":[{{"type":"insecure"}}],"call_creds":{creds}}}],"node":{{"id":"n"}}}}"#
        ))
        .unwrap();
        let mut options = tether_xds::client::ClientOptions::default();
        options.bootstrap_call_creds = a97;
        tether_xds::XdsClient::start_with(b, options)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    assert_eq!(
        parse(r#"[{"type":"jwt_token_file","config":{}}]"#, true).unwrap_err(),
        "bootstrap xds_servers[0].call_creds[0].config.jwt_token_file: field not present"
    );
    assert_eq!(
        parse(
            r#"[{"type":"other"},{"type":"jwt_token_file","config":{"jwt_token_file":7}}]"#,
            true
        )
        .unwrap_err(),
        "bootstrap xds_servers[0].call_creds[1].config.jwt_token_file: 7 is not a file path"
    );
    assert!(parse(r#"[{"type":"jwt_token_file","config":{}}]"#, false).is_ok());
    assert!(parse(r#"[{"type":"something_else"}]"#, true).is_ok());
}

/// The first bytes a client writes on a Unix socket at `path` (up to 10 s
/// for the first of them).
async fn first_bytes_on(listener: tokio::net::UnixListener) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("a connection within 10 s")
        .unwrap();
    let mut buf = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
        .await
        .expect("bytes within 10 s")
        .unwrap();
    buf.truncate(n);
    buf
}

/// A `unix:` server with `tls` channel creds: the TLS handshake runs over
/// the socket, as C-core runs its credentials over any transport, so the
/// A97 token is only ever sent encrypted. It was plaintext HTTP/2 with the
/// token in it. Beside grpcio: both open with a TLS ClientHello (a record
/// of type 22), never HTTP/2's preface.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_server_with_tls_creds_gets_tls_and_the_token_only_inside_it() {
    let dir = Dir(std::env::temp_dir().join(format!("tether-a97-unix-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let ca = Ca::new("xds CA");
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let token_file = dir.0.join("token.jwt");
    let token = jwt(now() + 3600);
    std::fs::write(&token_file, &token).unwrap();
    let unix_bootstrap = |socket: &Path, node: &str| {
        let file = dir.0.join(format!("{node}.json"));
        std::fs::write(
            &file,
            format!(
                r#"{{"xds_servers":[{{"server_uri":"unix://{}","channel_creds":[{{"type":"tls","config":{{"ca_certificate_file":"{}"}}}}],
                    "call_creds":[{{"type":"jwt_token_file","config":{{"jwt_token_file":"{}"}}}}],
                    "server_features":["xds_v3"]}}],"node":{{"id":"{node}"}}}}"#,
                socket.display(),
                ca_file.display(),
                token_file.display()
            ),
        )
        .unwrap();
        file
    };
    let start = |file: &Path| {
        let mut options = tether_xds::client::ClientOptions::default();
        options.bootstrap_call_creds = true;
        let client = tether_xds::XdsClient::start_with(
            tether_xds::Bootstrap::from_file(file).unwrap(),
            options,
        )
        .unwrap();
        let w = client.watch(tether_xds::ResourceKind::Listener, TARGET);
        (client, w)
    };

    // A plaintext listener sees what each client opens with.
    let plain = dir.0.join("plain.sock");
    let file = unix_bootstrap(&plain, "unix-plain");
    let listener = tokio::net::UnixListener::bind(&plain).unwrap();
    let (_client, _w) = start(&file);
    let ours = first_bytes_on(listener).await;
    assert_eq!(
        ours.first(),
        Some(&22),
        "tether: {:?}",
        String::from_utf8_lossy(&ours)
    );
    assert!(!ours.starts_with(b"PRI * HTTP/2.0"));
    let _ = std::fs::remove_file(&plain);
    let listener = tokio::net::UnixListener::bind(&plain).unwrap();
    let python = grpcio::python_or_install(None).await.unwrap();
    let _ccore = tether_testkit::command(&python)
        .arg(grpcio::client_script())
        .args(["--timeout", "10", &format!("xds:///{TARGET}"), "1"])
        .env("GRPC_XDS_BOOTSTRAP", &file)
        .env(tether_xds::call_creds::ENV, "true")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let theirs = first_bytes_on(listener).await;
    assert_eq!(
        theirs.first(),
        Some(&22),
        "C-core: {:?}",
        String::from_utf8_lossy(&theirs)
    );

    // A TLS server behind the socket (its certificate names localhost,
    // gRPC's authority for Unix sockets): the stream carries the token and
    // gets the resources.
    let backend = GrpcBackend::start("behind-unix-tls").await;
    let f = Fixture::start_tls(Mode::Serve, server_config(&ca.issue(&["localhost"]), None)).await;
    serve(&f, &backend);
    let socket = dir.0.join("tls.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let to = f.addr;
    tokio::spawn(async move {
        while let Ok((mut unix, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut tcp) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut unix, &mut tcp).await;
                }
            });
        }
    });
    let (_client, mut w) = start(&unix_bootstrap(&socket, "unix-tls"));
    let state = tokio::time::timeout(
        Duration::from_secs(10),
        w.wait_for(|s| s.resource.is_some()),
    )
    .await
    .expect("the listener over TLS over the socket within 10 s")
    .unwrap()
    .clone();
    assert!(state.error.is_none(), "{state:?}");
    assert_eq!(
        f.authorizations().first(),
        Some(&Some(format!("Bearer {token}")))
    );
}

/// Token files at the edges, beside C-core: an expired token is still sent
/// (the server judges it; C-core does not check `exp` before sending), and
/// an `exp` no clock holds (1e19) fails the stream UNAUTHENTICATED on both
/// sides; tether's XdsClient task panicked on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_absurd_tokens_as_c_core_treats_them() {
    let backend = GrpcBackend::start("behind-jwt-edges").await;
    let ca = Ca::new("xds CA");
    let f = Fixture::start_tls(Mode::Serve, server_config(&ca.issue(&["localhost"]), None)).await;
    serve(&f, &backend);
    let dir = Dir(std::env::temp_dir().join(format!("tether-a97-edges-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let tls = format!(
        r#"{{"type":"tls","config":{{"ca_certificate_file":"{}"}}}}"#,
        ca_file.display()
    );
    let python = grpcio::python_or_install(None).await.unwrap();

    // Expired an hour ago: both send it as it is.
    let token_file = dir.0.join("expired.jwt");
    let expired = jwt(now() - 3600);
    std::fs::write(&token_file, &expired).unwrap();
    let file = dir.0.join("expired.json");
    std::fs::write(
        &file,
        bootstrap(f.addr.port(), &tls, &token_file, "expired"),
    )
    .unwrap();
    let want = Some(format!("Bearer {expired}"));
    let before = f.authorizations().len();
    let (_client, state) = tether_client(&file, true).await;
    assert!(state.resource.is_some(), "tether: {state:?}");
    assert_eq!(f.authorizations()[before..].first(), Some(&want), "tether");
    let before = f.authorizations().len();
    let calls = grpcio::Client::new(&python, &file)
        .with_env(tether_xds::call_creds::ENV, "true")
        .calls(&format!("xds:///{TARGET}"), 1, None)
        .await
        .unwrap_or_else(|e| panic!("C-core: {e}"));
    assert!(calls.iter().all(|c| c.ok()), "C-core: {calls:?}");
    assert_eq!(f.authorizations()[before..].first(), Some(&want), "C-core");

    // exp = 1e19: neither opens a stream with it.
    let token_file = dir.0.join("absurd.jwt");
    let absurd = {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!(
            "{}.{}.{}",
            b64(r#"{"alg":"none"}"#),
            b64(r#"{"exp":1e19}"#),
            b64("sig")
        )
    };
    std::fs::write(&token_file, &absurd).unwrap();
    let file = dir.0.join("absurd.json");
    std::fs::write(&file, bootstrap(f.addr.port(), &tls, &token_file, "absurd")).unwrap();
    let before = f.authorizations().len();
    let (_client, state) = tether_client(&file, true).await;
    let error = state.error.expect("an error, not a panic").to_string();
    assert!(error.contains("UNAUTHENTICATED"), "tether: {error}");
    assert!(
        error.contains("is past any time this clock can hold"),
        "tether: {error}"
    );
    let theirs = grpcio::Client::new(&python, &file)
        .with_env(tether_xds::call_creds::ENV, "true")
        .run(&short_call(), None)
        .await
        .expect_err("C-core fails too");
    assert!(theirs.contains("UNAUTHENTICATED"), "C-core: {theirs}");
    assert!(
        f.authorizations()[before..]
            .iter()
            .all(|a| a.as_deref() != Some(absurd.as_str())),
        "nobody sent the absurd token"
    );
}

/// `channel_creds` absent or `[]`: C-core refuses the bootstrap (it does
/// not fall back to plaintext), and so does tether, in C-core's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_usable_channel_creds_is_refused_as_c_core_refuses_it() {
    let dir = Dir(std::env::temp_dir().join(format!("tether-creds-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let python = grpcio::python_or_install(None).await.unwrap();
    for (name, creds, words) in [
        ("absent", "", "field not present"),
        (
            "empty",
            r#","channel_creds":[]"#,
            "no known creds type found",
        ),
    ] {
        let json = format!(
            r#"{{"xds_servers":[{{"server_uri":"localhost:1"{creds},"server_features":["xds_v3"]}}],"node":{{"id":"n"}}}}"#
        );
        let ours = tether_xds::Bootstrap::from_json(&json)
            .unwrap_err()
            .to_string();
        assert!(
            ours.starts_with("bootstrap xds_servers[0].channel_creds:") && ours.contains(words),
            "{name}: tether: {ours}"
        );
        let file = dir.0.join(format!("{name}.json"));
        std::fs::write(&file, &json).unwrap();
        let theirs = grpcio::Client::new(&python, &file)
            .run(&short_call(), None)
            .await
            .expect_err("C-core refuses the bootstrap");
        assert!(
            theirs.contains("channel_creds") && theirs.contains(words),
            "{name}: C-core: {theirs}"
        );
    }
}
