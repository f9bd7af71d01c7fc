//! `dns:`, `http://`, `ipv4:` and `unix:` targets, with the in-process DNS
//! server on 127.0.0.1 and backends on several loopback addresses sharing
//! one port, as the instances of a scaled service look; beside gRPC C-core
//! (grpcio, its c-ares resolver asking the same kind of server).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tether::channel::WaitForReady;
use tether::Channel;
use tether_core::http::set_cookie::CookieSpec;
use tether_testkit::dns::DnsServer;
use tether_testkit::grpc::{EchoClient, EchoReply, EchoRequest, GrpcBackend};
use tether_testkit::grpcio;
use tokio::time::Instant;

const PICK_FIRST: &str = r#"{"loadBalancingConfig": [{"pick_first": {}}]}"#;
const ROUND_ROBIN: &str = r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#;
/// Bound on any wait for a change.
const WAIT: Duration = Duration::from_secs(20);

/// Backends named `b2`, `b3`, ... on 127.0.0.2, 127.0.0.3, ... one port,
/// each ending its connections with a GOAWAY after `max_age` when given.
async fn scaled(n: u8, max_age: Option<Duration>) -> (u16, Vec<GrpcBackend>) {
    'port: for _ in 0..20 {
        let first = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut held = vec![first];
        for i in 3..2 + n {
            match tokio::net::TcpListener::bind((Ipv4Addr::new(127, 0, 0, i), port)).await {
                Ok(l) => held.push(l),
                Err(_) => continue 'port,
            }
        }
        // The listeners bound here serve: dropping them to bind again would
        // let another process take the port in between.
        let mut backends = Vec::new();
        for (i, listener) in (2..2 + n).zip(held) {
            let name = format!("b{i}");
            backends.push(match max_age {
                Some(age) => {
                    GrpcBackend::start_rotating_on_listener(&name, listener, age)
                        .await
                        .0
                }
                None => GrpcBackend::start_on_listener(&name, listener).await,
            });
        }
        return (port, backends);
    }
    panic!("no port free on 127.0.0.2.. in 20 tries");
}

fn ips(backends: &[GrpcBackend]) -> Vec<IpAddr> {
    backends.iter().map(|b| b.addr().ip()).collect()
}

async fn echo(client: &mut EchoClient<Channel>, message: &str) -> Result<EchoReply, tonic::Status> {
    let mut request = tonic::Request::new(EchoRequest {
        message: message.into(),
    });
    request.set_timeout(WAIT);
    client.echo(request).await.map(tonic::Response::into_inner)
}

async fn python() -> std::path::PathBuf {
    grpcio::python_or_install(None)
        .await
        .expect("grpcio is needed (scripts/setup.sh installs it)")
}

/// grpcio with its c-ares resolver (C-core's default), no bootstrap.
fn ccore(python: &std::path::Path) -> grpcio::Client {
    grpcio::Client::new(python, "/nonexistent-bootstrap.json").with_env("GRPC_DNS_RESOLVER", "ares")
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pick_first_and_round_robin_reach_the_same_backends_as_c_core() {
    let python = python().await;
    let dns = DnsServer::start().await;
    let (port, backends) = scaled(3, None).await;
    dns.set("echo.test", &ips(&backends));
    let target = format!("dns://{}/echo.test:{port}", dns.addr());
    let everyone: BTreeSet<String> = backends.iter().map(|b| b.name().to_owned()).collect();

    for (config, want) in [
        // pick_first: the first address of the answer, in both.
        (PICK_FIRST, BTreeSet::from(["b2".to_owned()])),
        (ROUND_ROBIN, everyone.clone()),
    ] {
        let channel = Channel::builder()
            .default_service_config(config)
            .connect(&target)
            .unwrap();
        let mut client = EchoClient::new(channel);
        let mut tether = BTreeSet::new();
        // Round robin picks READY endpoints only: call until all answered.
        for i in 0..200 {
            tether.insert(echo(&mut client, "hi").await.unwrap().backend);
            if tether == everyone || (i >= 19 && config == PICK_FIRST) {
                break;
            }
        }
        let warm = if config == ROUND_ROBIN { "3" } else { "0" };
        let calls = ccore(&python)
            .run(
                &args(&["--service-config", config, "--warm", warm, &target, "20"]),
                None,
            )
            .await
            .unwrap();
        let c_core: BTreeSet<String> = calls.into_iter().map(|c| c.backend).collect();
        assert_eq!(tether, want, "tether with {config}");
        assert_eq!(c_core, want, "C-core with {config}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_leaving_dns_and_stopping_fails_no_call_in_either() {
    let python = python().await;
    // One server each, so each client's re-resolution is its own signal.
    let (dns_tether, dns_ccore) = (DnsServer::start().await, DnsServer::start().await);
    // Connections end every 300 ms (a GOAWAY): each end is a lost
    // connection, which is when gRPC re-resolves.
    let (port, backends) = scaled(3, Some(Duration::from_millis(300))).await;
    for dns in [&dns_tether, &dns_ccore] {
        dns.set("echo.test", &ips(&backends));
    }
    let leaving = &backends[2];
    let channel = Channel::builder()
        .default_service_config(ROUND_ROBIN)
        .dns_min_time_between_resolutions(Duration::from_millis(100))
        .connect(&format!("dns://{}/echo.test:{port}", dns_tether.addr()))
        .unwrap();
    let mut client = EchoClient::new(channel.clone());
    let mut seen = BTreeSet::new();
    for _ in 0..200 {
        seen.insert(echo(&mut client, "warm").await.unwrap().backend);
        if seen.len() == 3 {
            break;
        }
    }
    assert_eq!(seen.len(), 3, "tether reached {seen:?}");

    let before = leaving.hits();
    let c_target = format!("dns://{}/echo.test:{port}", dns_ccore.addr());
    let c_run = {
        let client = ccore(&python);
        let a = args(&[
            "--service-config",
            ROUND_ROBIN,
            "--channel-arg",
            "grpc.dns_min_time_between_resolutions_ms=100",
            "--failures-ok",
            "--warm",
            "3",
            "--pace",
            "20",
            &c_target,
            "200",
        ]);
        tokio::spawn(async move { client.run(&a, None).await })
    };
    // C-core's warm-up reached the leaving backend: both use it.
    leaving.until_hits(before + 1, WAIT).await;

    for dns in [&dns_tether, &dns_ccore] {
        dns.set("echo.test", &ips(&backends[..2]));
    }
    // C-core asks again (after its next lost connection) and sees it gone;
    // tether's picker stops listing it, while its calls go on.
    assert!(
        dns_ccore.wait_queries(2, WAIT).await,
        "C-core never re-resolved"
    );
    let gone = leaving.addr().to_string();
    let deadline = Instant::now() + WAIT;
    loop {
        echo(&mut client, "during")
            .await
            .expect("a call while the backend leaves");
        let stats = serde_json::to_string(&channel.stats().await.unwrap().tree).unwrap();
        if !stats.contains(&gone) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tether still lists {gone}: {stats}"
        );
    }
    leaving.stop().await;

    for i in 0..50 {
        let reply = echo(&mut client, "after").await;
        let reply = reply.unwrap_or_else(|e| panic!("tether call {i} after the stop: {e}"));
        assert_ne!(reply.backend, leaving.name());
    }
    let calls = c_run.await.unwrap().unwrap();
    let failed: Vec<_> = calls.iter().filter(|c| !c.ok()).collect();
    assert!(failed.is_empty(), "C-core calls failed: {failed:?}");
    assert!(calls.len() == 200, "{} C-core calls", calls.len());
    assert!(
        calls[150..].iter().all(|c| c.backend != leaving.name()),
        "C-core still used {} at the end",
        leaving.name()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_name_fails_unavailable_at_once_in_both() {
    let python = python().await;
    let dns = DnsServer::start().await;
    let target = format!("dns://{}/nope.test:50051", dns.addr());

    let channel = Channel::builder().connect(&target).unwrap();
    let mut client = EchoClient::new(channel.clone());
    let started = Instant::now();
    let e = echo(&mut client, "hi").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        e.message().contains("nope.test:50051") && e.message().contains(&dns.addr().to_string()),
        "{}",
        e.message()
    );
    // wait_for_ready waits, for the deadline.
    let mut request = tonic::Request::new(EchoRequest {
        message: "w".into(),
    });
    request.extensions_mut().insert(WaitForReady(true));
    request.set_timeout(Duration::from_millis(300));
    let e = client.echo(request).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");

    let calls = ccore(&python)
        .run(&args(&["--fail-fast", "--failures-ok", &target, "1"]), None)
        .await
        .unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].code, "UNAVAILABLE", "{calls:?}");
    assert!(calls[0].ms < 5000, "C-core took {} ms", calls[0].ms);
    assert!(
        calls[0].message.contains("nope.test"),
        "{}",
        calls[0].message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_names_the_resolved_address_and_moves_when_it_leaves_dns() {
    let dns = DnsServer::start().await;
    let (port, backends) = scaled(2, Some(Duration::from_millis(300))).await;
    dns.set("echo.test", &ips(&backends));
    let cookie =
        CookieSpec::new("grpc-session", "/", Duration::from_secs(600), Vec::new()).unwrap();
    let channel = Channel::builder()
        .default_service_config(ROUND_ROBIN)
        .session_cookie(cookie)
        .dns_min_time_between_resolutions(Duration::from_millis(100))
        .connect(&format!("dns://{}/echo.test:{port}", dns.addr()))
        .unwrap();
    let jar = tether::CookieJar::new();
    let mut client = EchoClient::new(channel.with_cookie_jar(jar.clone()));
    let first = echo(&mut client, "1").await.unwrap().backend;
    let pinned = jar.get("grpc-session").expect("a session cookie");
    for _ in 0..10 {
        assert_eq!(echo(&mut client, "again").await.unwrap().backend, first);
    }
    assert_eq!(jar.get("grpc-session").as_deref(), Some(pinned.as_str()));

    let (leaving, staying) = if backends[0].name() == first {
        (&backends[0], &backends[1])
    } else {
        (&backends[1], &backends[0])
    };
    dns.set("echo.test", &[staying.addr().ip()]);
    let gone = leaving.addr().to_string();
    let deadline = Instant::now() + WAIT;
    loop {
        let stats = serde_json::to_string(&channel.stats().await.unwrap().tree).unwrap();
        if !stats.contains(&gone) {
            break;
        }
        assert!(Instant::now() < deadline, "tether still lists {gone}");
        echo(&mut client, "during").await.unwrap();
    }
    leaving.stop().await;
    let moved = echo(&mut client, "moved").await.unwrap().backend;
    assert_eq!(moved, staying.name());
    let fresh = jar.get("grpc-session").expect("a cookie");
    assert_ne!(fresh, pinned, "the moved session got a fresh cookie");
    assert_eq!(
        echo(&mut client, "stays").await.unwrap().backend,
        staying.name()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_ipv4_and_bare_targets_reach_their_backends() {
    let (port, backends) = scaled(2, None).await;
    for (target, want) in [
        (format!("http://127.0.0.2:{port}"), vec!["b2"]),
        (format!("127.0.0.3:{port}"), vec!["b3"]),
        (
            format!("ipv4:127.0.0.2:{port},127.0.0.3:{port}"),
            vec!["b2"],
        ),
    ] {
        let channel = Channel::builder().connect(&target).unwrap();
        let mut client = EchoClient::new(channel);
        let reply = echo(&mut client, "hi").await.unwrap();
        assert!(
            want.contains(&reply.backend.as_str()),
            "{target}: {}",
            reply.backend
        );
    }
    // localhost through the system's hosts file.
    let local = GrpcBackend::start("local").await;
    let channel = Channel::builder()
        .user_agent("migrating-app/1.0")
        .timeout(Duration::from_secs(5))
        .connect(&format!("http://localhost:{}", local.addr().port()))
        .unwrap();
    let reply = echo(&mut EchoClient::new(channel), "hi").await.unwrap();
    assert_eq!(reply.backend, "local");
    drop(backends);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_targets_fail_at_connect_naming_the_target() {
    for (target, want) in [
        ("dns:///echo.test:http", "port \"http\""),
        ("ipv4:127.0.0.1", "gRPC requires the port"),
        (
            "dns://resolver.example/echo.test",
            "DNS server \"resolver.example\"",
        ),
    ] {
        let e = Channel::builder().connect(target).unwrap_err().to_string();
        assert!(e.contains(target) && e.contains(want), "{target}: {e}");
    }
    let e = Channel::builder()
        .default_service_config(r#"{"loadBalancingConfig": [{"nope": {}}]}"#)
        .connect("dns:///echo.test:1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("tried: nope"), "{e}");
}

/// An Echo service answering as "unix", served on a Unix socket.
struct UnixEcho;

#[tonic::async_trait]
impl tether_proto::demo::v1::echo_server::Echo for UnixEcho {
    async fn echo(
        &self,
        request: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<EchoReply>, tonic::Status> {
        Ok(tonic::Response::new(EchoReply {
            message: request.into_inner().message,
            backend: "unix".into(),
            ..Default::default()
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_target_reaches_a_server_on_its_socket() {
    let dir = std::env::temp_dir().join(format!("tether-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("echo.sock");
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(tether_proto::demo::v1::echo_server::EchoServer::new(
                UnixEcho,
            ))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    for target in [
        format!("unix:{}", path.display()),
        format!("unix://{}", path.display()),
    ] {
        let channel = Channel::builder().connect(&target).unwrap();
        let reply = echo(&mut EchoClient::new(channel), "over unix")
            .await
            .unwrap();
        assert_eq!(
            (reply.backend.as_str(), reply.message.as_str()),
            ("unix", "over unix"),
            "{target}"
        );
    }
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
