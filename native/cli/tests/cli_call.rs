//! `tether call` as a user runs it: the real `tether` binary against real
//! tonic Echo backends on 127.0.0.1, over a static target and over xDS from
//! a real `tether-control` (and from the test ADS fixture for a resource
//! tether-control would never serve: an invalid one, NACKed).

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use tether_testkit::grpc::GrpcBackend;
use tether_testkit::partition::Partition;
use tokio::process::Command;

use control_support::{Control, TempDir};
use xds_support::{Fixture, Mode, LDS};

const ECHO: &str = "/tether.demo.v1.Echo/Echo";
/// Every run of the binary is bounded by this.
const LIMIT: Duration = Duration::from_secs(30);
/// `EchoRequest { message: "hi" }` serialized: field 1, length 2.
const HI: &str = "\n\u{2}hi";

struct Run {
    status: ExitStatus,
    lines: Vec<Value>,
    stderr: String,
}

impl Run {
    /// The call lines (without a `--stats` line).
    fn calls(&self) -> Vec<&Value> {
        self.lines
            .iter()
            .filter(|l| l.get("call").is_some())
            .collect()
    }
}

/// Runs `tether call ARGS` without a bootstrap in the environment.
async fn call(args: &[&str]) -> Run {
    call_os(args.iter().map(OsString::from).collect()).await
}

/// As [`call`], with arguments that need not be UTF-8.
async fn call_os(args: Vec<OsString>) -> Run {
    let child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .arg("call")
        .args(args)
        .env_remove("GRPC_XDS_BOOTSTRAP")
        .env_remove("GRPC_XDS_BOOTSTRAP_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn tether");
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .expect("tether call did not exit in time")
        .expect("run tether call");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines = stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\nstderr: {stderr}"))
        })
        .collect();
    Run {
        status: out.status,
        lines,
        stderr,
    }
}

fn static_target(backends: &[&GrpcBackend]) -> String {
    let addrs: Vec<String> = backends.iter().map(|b| b.addr().to_string()).collect();
    format!("static:///{}", addrs.join(","))
}

fn refused_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// Each OK call was answered by the backend it names as its peer, which
/// echoed the message.
fn assert_answered_by_peer(run: &Run, names: &HashMap<String, &str>) {
    for c in run.calls() {
        assert_eq!(c["code"], "OK", "{c}\n{}", run.stderr);
        let peer = c["peer"].as_str().unwrap_or_default();
        let name = names
            .get(peer)
            .unwrap_or_else(|| panic!("peer {peer} is not a backend: {c}"));
        let response = c["response"].as_str().unwrap();
        assert!(response.contains(name) && response.contains("hi"), "{c}");
    }
}

#[tokio::test]
async fn a_static_target_round_robins_over_both_backends() {
    let a = GrpcBackend::start("echo-a").await;
    let b = GrpcBackend::start("echo-b").await;
    let names = HashMap::from([
        (a.addr().to_string(), a.name()),
        (b.addr().to_string(), b.name()),
    ]);
    let target = static_target(&[&a, &b]);
    let run = call(&[
        &target,
        ECHO,
        "--count",
        "4",
        "--data",
        HI,
        "--timeout",
        "10",
    ])
    .await;
    assert!(run.status.success(), "{:?}\n{}", run.lines, run.stderr);
    let calls = run.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    for (i, c) in calls.iter().enumerate() {
        let keys: Vec<&str> = c.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "call",
                "code",
                "peer",
                "cluster",
                "policy",
                "attempts",
                "response",
                "cookie",
                "set_cookie"
            ]
        );
        assert_eq!(c["call"], i + 1);
        assert_eq!(c["cluster"], "static");
        assert_eq!(c["policy"], "round_robin");
        assert_eq!(c["cookie"], Value::Null);
        assert_eq!(c["set_cookie"], serde_json::json!([]));
    }
    assert_answered_by_peer(&run, &names);
    // The first calls may all go to the backend that connected first; from
    // the first call to the other one on, round robin alternates.
    let peers: Vec<&str> = calls.iter().map(|c| c["peer"].as_str().unwrap()).collect();
    let switch = peers
        .iter()
        .position(|p| *p != peers[0])
        .unwrap_or_else(|| panic!("one backend took every call: {peers:?}"));
    for pair in peers[switch - 1..].windows(2) {
        assert_ne!(pair[0], pair[1], "not round robin: {peers:?}");
    }
}

#[tokio::test]
async fn an_xds_target_through_tether_control_names_its_cluster() {
    let a = GrpcBackend::start("echo-1").await;
    let b = GrpcBackend::start("echo-2").await;
    let names = HashMap::from([
        (a.addr().to_string(), a.name()),
        (b.addr().to_string(), b.name()),
    ]);
    let yaml = format!(
        r#"virtualhosts:
  - name: echo.tether.test
    routes:
      - services:
          - name: echo
services:
  - name: echo
    protocol: h2c
    endpoints:
      - address: {}
      - address: {}
"#,
        a.addr(),
        b.addr()
    );
    let control = Control::start(&yaml).await;
    let dir = TempDir::new("cli-call");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("tether-call"));
    let run = call(&[
        "--bootstrap",
        bootstrap.to_str().unwrap(),
        "xds:///echo.tether.test",
        ECHO,
        "--data",
        HI,
        "--count",
        "4",
        "--timeout",
        "10",
        "--stats",
    ])
    .await;
    assert!(run.status.success(), "{:?}\n{}", run.lines, run.stderr);
    let calls = run.calls();
    assert_eq!(calls.len(), 4, "{:?}", run.lines);
    for c in &calls {
        // RoundRobin, the default strategy: the cluster is the service's name.
        assert_eq!(c["cluster"], "echo", "{c}");
        assert_eq!(c["policy"], "round_robin", "{c}");
    }
    assert_answered_by_peer(&run, &names);
    let peers: HashSet<&str> = calls.iter().map(|c| c["peer"].as_str().unwrap()).collect();
    assert_eq!(peers.len(), 2, "{calls:?}");
    // --stats: one last line with the LB tree under the cluster manager.
    let last = run.lines.last().unwrap();
    let stats = &last["stats"];
    assert_eq!(stats["target"], "xds:///echo.tether.test", "{last}");
    assert_eq!(stats["state"], "READY", "{last}");
    assert_eq!(stats["tree"]["policy"], "xds_cluster_manager", "{last}");
    assert!(last.to_string().contains(&a.addr().to_string()), "{last}");
    assert!(control.nacks_none(), "{}", control.stderr());
}

#[tokio::test]
async fn a_route_with_header_controlled_faults_aborts_only_calls_that_ask() {
    let a = GrpcBackend::start("echo").await;
    let yaml = format!(
        r#"virtualhosts:
  - name: fault.tether.test
    routes:
      - services: [{{ name: echo }}]
        fault:
          abort: {{ header: true, percent: 100 }}
services:
  - name: echo
    protocol: h2c
    endpoints:
      - address: {}
"#,
        a.addr()
    );
    let control = Control::start(&yaml).await;
    let dir = TempDir::new("cli-fault");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("tether-call"));
    let args = |extra: &'static [&'static str]| {
        let mut v = vec![
            "--bootstrap",
            bootstrap.to_str().unwrap(),
            "xds:///fault.tether.test",
            ECHO,
            "--data",
            HI,
            "--timeout",
            "10",
        ];
        v.extend_from_slice(extra);
        v
    };
    let plain = call(&args(&[])).await;
    assert!(
        plain.status.success(),
        "{:?}\n{}",
        plain.lines,
        plain.stderr
    );
    assert_eq!(plain.calls()[0]["code"], "OK");
    let hits = a.hits();
    let run = call(&args(&[
        "--metadata",
        "x-envoy-fault-abort-grpc-request: 14",
    ]))
    .await;
    assert_eq!(
        run.status.code(),
        Some(1),
        "{:?}\n{}",
        run.lines,
        run.stderr
    );
    let c = run.calls()[0];
    assert_eq!(
        (&c["code"], &c["message"], &c["peer"]),
        (
            &Value::from("UNAVAILABLE"),
            &Value::from("Fault injected"),
            &Value::Null
        ),
        "{c}"
    );
    // Never sent.
    assert_eq!(a.hits(), hits);
    assert!(control.nacks_none(), "{}", control.stderr());
}

#[tokio::test]
async fn the_line_counts_the_attempts_a_retry_policy_made() {
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let a = GrpcBackend::start_failing("echo", failing.clone()).await;
    let yaml = format!(
        r#"virtualhosts:
  - name: retry.tether.test
    routes:
      - services: [{{ name: echo }}]
        retryPolicy: {{ count: 2, retryOn: [unavailable], backOff: {{ baseInterval: 0.005s }} }}
services:
  - name: echo
    protocol: h2c
    endpoints:
      - address: {}
"#,
        a.addr()
    );
    let control = Control::start(&yaml).await;
    let dir = TempDir::new("cli-retry");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("tether-call"));
    let args = [
        "--bootstrap",
        bootstrap.to_str().unwrap(),
        "xds:///retry.tether.test",
        ECHO,
        "--data",
        HI,
        "--timeout",
        "10",
    ];
    let run = call(&args).await;
    assert_eq!(
        run.status.code(),
        Some(1),
        "{:?}\n{}",
        run.lines,
        run.stderr
    );
    let c = run.calls()[0];
    assert_eq!(
        (&c["code"], &c["attempts"]),
        (&Value::from("UNAVAILABLE"), &Value::from(3)),
        "{c}"
    );
    assert_eq!(a.hits(), 3);
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    let run = call(&args).await;
    let c = run.calls()[0];
    assert_eq!(
        (&c["code"], &c["attempts"]),
        (&Value::from("OK"), &Value::from(1)),
        "{c}"
    );
    assert!(control.nacks_none(), "{}", control.stderr());
}

#[tokio::test]
async fn a_refused_address_is_unavailable_and_exits_1() {
    let target = format!("static:///{}", refused_addr());
    let run = call(&[&target, ECHO, "--cookie", "abc", "--timeout", "10"]).await;
    assert_eq!(
        run.status.code(),
        Some(1),
        "{:?}\n{}",
        run.lines,
        run.stderr
    );
    let calls = run.calls();
    assert_eq!(calls.len(), 1, "{:?}", run.lines);
    let c = calls[0];
    let keys: Vec<&str> = c.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "call",
            "code",
            "peer",
            "cluster",
            "policy",
            "attempts",
            "message",
            "cookie",
            "set_cookie"
        ]
    );
    assert_eq!(c["code"], "UNAVAILABLE", "{c}");
    assert_eq!(c["policy"], Value::Null, "{c}");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("Connection refused"),
        "{c}"
    );
    assert_eq!(c["peer"], Value::Null, "no pick: {c}");
    assert_eq!(c["cookie"], "abc", "{c}");
}

#[tokio::test]
async fn a_call_the_backend_fails_still_names_its_peer_and_sends_the_cookie() {
    let a = GrpcBackend::start("echo-a").await;
    let target = static_target(&[&a]);
    let run = call(&[
        &target,
        "tether.demo.v1.Echo/NoSuchMethod",
        "--cookie",
        "session=abc",
        "--metadata",
        "x-user: alice",
        "--timeout",
        "10",
    ])
    .await;
    assert_eq!(
        run.status.code(),
        Some(1),
        "{:?}\n{}",
        run.lines,
        run.stderr
    );
    let c = run.calls()[0];
    assert_eq!(c["code"], "UNIMPLEMENTED", "{c}");
    assert_eq!(c["peer"], a.addr().to_string(), "{c}");
    assert_eq!(c["cluster"], "static", "{c}");
    assert_eq!(c["cookie"], "session=abc", "{c}");
}

#[cfg(unix)]
#[tokio::test]
async fn data_is_sent_as_raw_bytes_even_when_not_utf8() {
    use std::os::unix::ffi::OsStringExt;
    let a = GrpcBackend::start("echo-a").await;
    // EchoRequest { message: 200 × "x" }: the length 200 is the varint
    // c8 01, which is not UTF-8.
    let mut data = vec![0x0a, 0xc8, 0x01];
    data.extend([b'x'; 200]);
    let mut args: Vec<OsString> = [static_target(&[&a]).as_str(), ECHO, "--timeout", "10"]
        .iter()
        .map(OsString::from)
        .collect();
    args.extend([OsString::from("--data"), OsString::from_vec(data)]);
    let run = call_os(args).await;
    assert!(run.status.success(), "{:?}\n{}", run.lines, run.stderr);
    let c = run.calls()[0];
    let response = c["response"].as_str().unwrap();
    assert!(response.contains(&"x".repeat(200)), "{c}");
    assert!(response.contains("echo-a"), "{c}");
}

#[tokio::test]
async fn dns_ipv4_and_http_targets_reach_the_backend() {
    let dns = tether_testkit::dns::DnsServer::start().await;
    let backend = GrpcBackend::start("echo").await;
    let port = backend.addr().port();
    dns.set("echo.test", &[backend.addr().ip()]);
    let names = HashMap::from([(backend.addr().to_string(), backend.name())]);
    for target in [
        format!("dns://{}/echo.test:{port}", dns.addr()),
        format!("ipv4:127.0.0.1:{port}"),
        format!("http://127.0.0.1:{port}"),
        format!("127.0.0.1:{port}"),
    ] {
        let run = call(&[
            &target,
            ECHO,
            "--data",
            HI,
            "--timeout",
            "10",
            "--service-config",
            r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#,
        ])
        .await;
        assert_eq!(run.status.code(), Some(0), "{target}: {}", run.stderr);
        assert_eq!(run.calls().len(), 1, "{target}");
        assert_answered_by_peer(&run, &names);
    }
    // A name that resolves to nothing: UNAVAILABLE naming it, exit 1.
    let run = call(&[
        &format!("dns://{}/nope.test:{port}", dns.addr()),
        ECHO,
        "--timeout",
        "10",
    ])
    .await;
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    let c = run.calls()[0];
    assert_eq!(c["code"], "UNAVAILABLE", "{c}");
    assert!(c["message"].as_str().unwrap().contains("nope.test"), "{c}");
}

#[tokio::test]
async fn usage_errors_exit_2_naming_the_value() {
    for (args, needle) in [
        (vec!["dns:///x:http", ECHO], "port \"http\""),
        (vec!["ipv4:127.0.0.1", ECHO], "gRPC requires the port"),
        (vec!["unix:", ECHO], "no socket path"),
        (
            vec![
                "dns:///x:1",
                ECHO,
                "--service-config",
                r#"{"loadBalancingConfig": 1}"#,
            ],
            "loadBalancingConfig: 1 is not an array",
        ),
        (
            vec!["xds:///x", ECHO, "--service-config", "{}"],
            "an xds:/// target takes its LB policy from xDS",
        ),
        (vec!["static:///localhost:1", ECHO], "localhost:1"),
        (vec!["static:///127.0.0.1:1", "Echo"], "Echo"),
        (
            vec!["static:///127.0.0.1:1", ECHO, "--metadata", "X-User:a"],
            "--metadata",
        ),
        (
            vec!["static:///127.0.0.1:1", ECHO, "--keepalive-timeout", "1"],
            "--keepalive-time",
        ),
        (
            vec!["static:///127.0.0.1:1", ECHO, "--keepalive-time", "soon"],
            "soon",
        ),
    ] {
        let run = call(&args).await;
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
        assert!(run.lines.is_empty(), "{args:?}: {:?}", run.lines);
    }
}

#[tokio::test]
async fn an_xds_target_without_a_bootstrap_exits_1_naming_it() {
    let run = call(&["xds:///echo.tether.test", ECHO]).await;
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("GRPC_XDS_BOOTSTRAP"), "{}", run.stderr);
    let dir = TempDir::new("cli-call-missing");
    let missing = dir.0.join("missing.json");
    let run = call(&[
        "--bootstrap",
        missing.to_str().unwrap(),
        "xds:///echo.tether.test",
        ECHO,
    ])
    .await;
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("--bootstrap") && run.stderr.contains("missing.json"),
        "{}",
        run.stderr
    );
}

/// `--keepalive-time`: a call in flight on a backend that stops answering
/// (its bytes held, nothing closed) fails UNAVAILABLE within keepalive time
/// + timeout, long before the backend would answer or the deadline.
#[tokio::test]
async fn keepalive_ends_a_call_on_a_backend_that_stops_answering() {
    let a = GrpcBackend::start("a").await;
    let partition = Partition::start(a.addr()).await;
    // EchoRequest { message: "sleep:10000" }: answered after 10 s.
    let args: Vec<OsString> = [
        format!("static:///{}", partition.addr()).as_str(),
        ECHO,
        "--data",
        "\n\u{b}sleep:10000",
        "--timeout",
        "20",
        "--keepalive-time",
        "0.3",
        "--keepalive-timeout",
        "0.5",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let run = tokio::spawn(call_os(args));
    let arrived =
        tether_testkit::wait_until(Duration::from_secs(10), || async { a.hits() == 1 }).await;
    assert!(arrived, "the call did not reach the backend");
    partition.cut();
    let cut = std::time::Instant::now();
    let run = run.await.unwrap();
    let took = cut.elapsed();
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    let calls = run.calls();
    assert_eq!(calls.len(), 1, "{:?}", run.lines);
    assert_eq!(calls[0]["code"], "UNAVAILABLE", "{}", calls[0]);
    // time + timeout is 0.8 s; the backend would answer after 10 s.
    assert!(
        took < Duration::from_secs(4),
        "ended {took:?} after the cut: {}",
        calls[0]
    );
}

/// `--tls-ca`, `--tls-cert`/`--tls-key`: mTLS to a backend that requires a
/// client certificate; without the identity the call fails UNAVAILABLE
/// naming the TLS alert, and a bad file is named before any call.
#[tokio::test]
async fn tls_flags_make_mtls_calls() {
    use tether_testkit::tls::{server_config, Ca};
    let servers = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let client = clients.issue(&["spiffe://tether.test/cli"]);
    let a = GrpcBackend::start_tls(
        "a",
        server_config(&servers.issue(&["127.0.0.1"]), Some(&clients)),
    )
    .await;
    let dir = TempDir::new("cli-tls");
    let ca = dir.0.join("ca.pem");
    std::fs::write(&ca, servers.pem()).unwrap();
    let (cert, key) = client.write(&dir.0, "client");
    let target = static_target(&[&a]);
    let (ca, cert, key) = (
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );

    let run = call(&[
        &target,
        ECHO,
        "--tls-ca",
        ca,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
    ])
    .await;
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(run.calls()[0]["code"], "OK");
    assert_eq!(a.hits(), 1);

    let run = call(&[&target, ECHO, "--tls-ca", ca, "--timeout", "5"]).await;
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    // TLS 1.3: the server refuses the certificate after the client finished;
    // the client reads its alert, or finds the connection closed first.
    let message = run.calls()[0]["message"].as_str().unwrap().to_owned();
    assert!(
        ["CertificateRequired", "broken pipe", "reset"]
            .iter()
            .any(|m| message.contains(m)),
        "{message}"
    );

    let run = call(&[
        &target,
        ECHO,
        "--tls-ca",
        cert,
        "--tls-cert",
        cert,
        "--tls-key",
        cert,
    ])
    .await;
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("client key"), "{}", run.stderr);
    assert!(run.stderr.contains("client.pem"), "{}", run.stderr);
    let run = call(&[&target, ECHO, "--tls-cert", cert, "--tls-key", key]).await;
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--tls-ca"), "{}", run.stderr);
}

#[tokio::test]
async fn verbose_logs_the_channel_on_stderr() {
    let a = GrpcBackend::start("echo-a").await;
    let target = static_target(&[&a]);
    let quiet = call(&[&target, ECHO, "--timeout", "10"]).await;
    assert!(quiet.status.success(), "{}", quiet.stderr);
    assert_eq!(quiet.stderr, "", "only warnings without -v");
    let run = call(&[&target, ECHO, "--timeout", "10", "-v"]).await;
    assert!(run.status.success(), "{}", run.stderr);
    let ready = format!("subchannel {}: CONNECTING -> READY", a.addr());
    assert!(run.stderr.contains(&ready), "{}", run.stderr);
    assert!(run.stderr.contains(" INFO "), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_logs_what_the_xds_client_nacks() {
    let f = Fixture::start(Mode::Serve).await;
    // A listener without an API listener: invalid for a gRPC client.
    let invalid = envoy_types::pb::envoy::config::listener::v3::Listener {
        name: "nack.example".into(),
        ..Default::default()
    };
    f.set_resources(LDS, vec![tether::xds::resource::pack(&invalid)]);
    let version = f.version();
    let dir = TempDir::new("cli-call-nack");
    let bootstrap = dir.bootstrap(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"nack-node"}}}}"#,
        f.addr
    ));
    let run = call(&[
        "--bootstrap",
        bootstrap.to_str().unwrap(),
        "xds:///nack.example",
        ECHO,
        "--timeout",
        "10",
        "-v",
    ])
    .await;
    assert_eq!(
        run.status.code(),
        Some(1),
        "{:?}\n{}",
        run.lines,
        run.stderr
    );
    let c = run.calls()[0];
    assert_eq!(c["code"], "UNAVAILABLE", "{c}");
    assert!(c["message"].as_str().unwrap().contains("rejected"), "{c}");
    let nack = run
        .stderr
        .lines()
        .find(|l| l.contains("NACK"))
        .unwrap_or_else(|| panic!("no NACK line: {}", run.stderr));
    assert!(
        nack.contains(" WARN ")
            && nack.contains(&format!("version \"{version}\""))
            && nack.contains("Listener \"nack.example\""),
        "{nack}"
    );
    assert!(run.stderr.contains("ADS stream open"), "{}", run.stderr);
}

#[tokio::test]
async fn jar_keeps_the_session_cookie_across_the_calls_of_a_run() {
    let backends = [
        GrpcBackend::start("echo-1").await,
        GrpcBackend::start("echo-2").await,
        GrpcBackend::start("echo-3").await,
    ];
    let yaml = format!(
        r#"virtualhosts:
  - name: echo.tether.test
    routes:
      - services:
          - name: echo
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: grpc-session, path: /, ttl: 60s }}
services:
  - name: echo
    protocol: h2c
    endpoints:
      - address: {}
      - address: {}
      - address: {}
"#,
        backends[0].addr(),
        backends[1].addr(),
        backends[2].addr()
    );
    let control = Control::start(&yaml).await;
    let dir = TempDir::new("cli-call-jar");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("tether-call-jar"));
    let run = call(&[
        "--bootstrap",
        bootstrap.to_str().unwrap(),
        "xds:///echo.tether.test",
        ECHO,
        "--count",
        "8",
        "--timeout",
        "10",
        "--jar",
    ])
    .await;
    assert!(run.status.success(), "{:?}\n{}", run.lines, run.stderr);
    let calls = run.calls();
    // The first call has no cookie and gets one; the jar sends it on every
    // later call, which all reach the same peer and get no new cookie.
    assert!(calls[0]["cookie"].is_null(), "{}", calls[0]);
    let set = calls[0]["set_cookie"][0].as_str().unwrap();
    let pair = set.split(';').next().unwrap();
    for c in &calls[1..] {
        assert_eq!(c["cookie"], pair, "{c}");
        assert_eq!(c["peer"], calls[0]["peer"], "{c}");
        assert_eq!(c["set_cookie"].as_array().unwrap().len(), 0, "{c}");
    }
    // Without --jar each call is a new session.
    let run = call(&[
        "--bootstrap",
        bootstrap.to_str().unwrap(),
        "xds:///echo.tether.test",
        ECHO,
        "--count",
        "3",
        "--timeout",
        "10",
    ])
    .await;
    for c in run.calls() {
        assert!(c["cookie"].is_null(), "{c}");
        assert_eq!(c["set_cookie"].as_array().unwrap().len(), 1, "{c}");
    }
}

/// `--linger`: the channel stays open after its calls, so its load
/// reports (gRFC A27) reach the control plane: a session pinned to a
/// DRAINING endpoint shows `busy` with this client named while it lingers,
/// and the client leaves the verdict once it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linger_keeps_the_channel_reporting_load_after_its_calls() {
    let a = GrpcBackend::start("echo-1").await;
    let b = GrpcBackend::start("echo-2").await;
    let control = Control::start_with_admin(&control_support::echo_drain_yaml(
        a.addr(),
        "us/a",
        b.addr(),
        "us/b",
    ))
    .await;
    let dir = TempDir::new("cli-linger");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("tether-call-linger"));
    let mut pinned =
        tether_core::cookie::SessionCookie::new(tether_core::AddressList::one(b.addr()));
    pinned.cluster = Some("echo/session".to_owned());
    let value = tether_core::cookie::encode(&pinned, tether_core::Format::Grpc, None).unwrap();
    let cookie = format!("grpc-session={value}");
    let run = {
        let (bootstrap, cookie) = (bootstrap.to_str().unwrap().to_owned(), cookie.clone());
        tokio::spawn(async move {
            call(&[
                "--bootstrap",
                &bootstrap,
                "xds:///echo.tether.test",
                ECHO,
                "--cookie",
                &cookie,
                "--count",
                "3",
                "--timeout",
                "10",
                "--linger",
                "4",
            ])
            .await
        })
    };
    let busy = control
        .until_drain(b.addr(), "the lingering client's report", |e| {
            e["verdict"] == "busy"
        })
        .await;
    assert_eq!(busy["clients"][0]["node"], "tether-call-linger", "{busy}");
    assert!(busy["clients"][0]["requests"].as_u64() > Some(0), "{busy}");
    let run = run.await.unwrap();
    assert!(run.status.success(), "{:?}\n{}", run.lines, run.stderr);
    assert!(
        run.calls()
            .iter()
            .all(|c| c["backend"] == "echo-2" || c["peer"] == b.addr().to_string()),
        "{:?}",
        run.lines
    );
    control
        .until_drain(b.addr(), "the client exited", |e| {
            e["clients"].as_array().is_some_and(|c| c.is_empty())
        })
        .await;
}

/// A data point's integer as OTLP JSON writes it (a string, or a number).
fn otlp_int(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap(),
        other => other
            .as_u64()
            .unwrap_or_else(|| panic!("not an integer: {other}")),
    }
}

/// A data point's attributes as (key, string value) pairs.
fn otlp_attributes(point: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = point["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| {
            (
                kv["key"].as_str().unwrap().to_owned(),
                kv["value"]["stringValue"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn metrics_writes_what_the_channel_recorded_as_otlp_json() {
    let failing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let backend = GrpcBackend::start_failing("echo", failing.clone()).await;
    let dir = TempDir::new("cli-metrics");
    let file = dir.0.join("metrics.jsonl");
    let target = static_target(&[&backend]);
    let run = call(&[
        &target,
        ECHO,
        "--count",
        "3",
        "--data",
        HI,
        "--metrics",
        file.to_str().unwrap(),
    ])
    .await;
    assert!(run.status.success(), "{:?}\n{}", run.lines, run.stderr);
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one ExportMetricsServiceRequest: {text}");
    let request: Value = serde_json::from_str(lines[0]).unwrap();
    let scope = &request["resourceMetrics"][0]["scopeMetrics"][0];
    assert_eq!(scope["scope"]["name"], "tether", "{request}");
    let metric = |name: &str| -> &Value {
        scope["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {request}"))
    };
    let started = metric("grpc.client.attempt.started");
    assert_eq!(started["unit"], "{attempt}");
    let point = &started["sum"]["dataPoints"][0];
    assert_eq!(otlp_int(&point["asInt"]), 3, "{started}");
    assert_eq!(
        otlp_attributes(point),
        [
            ("grpc.method".to_owned(), ECHO[1..].to_owned()),
            ("grpc.target".to_owned(), target.clone())
        ]
    );
    let calls = metric("grpc.client.call.duration");
    assert_eq!(calls["unit"], "s");
    let points = calls["histogram"]["dataPoints"].as_array().unwrap();
    assert_eq!(points.len(), 1, "{calls}");
    assert_eq!(otlp_int(&points[0]["count"]), 3);
    assert!(otlp_attributes(&points[0]).contains(&("grpc.status".to_owned(), "OK".to_owned())));

    // A file that cannot be written fails the run before any call.
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let bad = dir.0.join("no-such-dir").join("m.jsonl");
    let run = call(&[&target, ECHO, "--metrics", bad.to_str().unwrap()]).await;
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(run.calls().is_empty(), "{:?}", run.lines);
    assert!(
        run.stderr.contains("--metrics") && run.stderr.contains("no-such-dir"),
        "{}",
        run.stderr
    );
    assert_eq!(backend.hits(), 3, "no call was made");
}
