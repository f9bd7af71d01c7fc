//! HTTP/2 keepalive (gRFC A8) against a backend that stops answering
//! without closing (a network partition, a hung host): the connection is
//! found dead within keepalive `time + timeout`, the call in flight on it
//! fails UNAVAILABLE instead of hanging, new calls move to the other
//! backend, and the session pinned there moves once its endpoint is really
//! gone (its reconnection failed), with a fresh cookie. A server that ends
//! the connection for pinging too often (GOAWAY ENHANCE_YOUR_CALM) makes
//! the subchannel double its keepalive time, as C-core does.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tether::channel::{StaticConfig, StaticEndpoint};
use tether::lb::ConnectivityState;
use tether::session::{CookieJar, CookieJarLayer, Layer};
use tether::subchannel::{KeepaliveOptions, SubchannelOptions};
use tether::Channel;
use tether_core::http::set_cookie::CookieSpec;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::partition::Partition;

const TIME: Duration = Duration::from_millis(500);
const TIMEOUT: Duration = Duration::from_millis(500);

fn request(message: &str) -> tonic::Request<EchoRequest> {
    let mut r = tonic::Request::new(EchoRequest {
        message: message.into(),
    });
    r.set_timeout(Duration::from_secs(10));
    r
}

/// The state of the subchannel for `addr` in the channel's tree.
async fn subchannel_state(channel: &Channel, addr: SocketAddr) -> Option<ConnectivityState> {
    let stats = channel.stats().await.expect("the channel answers");
    fn walk(n: &tether::lb::PolicyStats, addr: &str) -> Option<ConnectivityState> {
        n.endpoints
            .iter()
            .find(|e| e.address == addr)
            .map(|e| e.state)
            .or_else(|| n.children.iter().find_map(|c| walk(c, addr)))
    }
    walk(&stats.tree, &addr.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_stops_answering_is_found_within_time_plus_timeout() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let partition = Partition::start(a.addr()).await;
    let mut options = SubchannelOptions::default();
    // A reconnection through the partition gets no answer: it gives up
    // after a second (the endpoint is then really gone).
    options.min_connect_timeout = Duration::from_secs(1);
    let spec = CookieSpec::new("session", "/", Duration::from_secs(600), Vec::new()).unwrap();
    let channel = Channel::builder()
        .subchannel_options(options)
        .keepalive(
            KeepaliveOptions::new(TIME)
                .with_timeout(TIMEOUT)
                .permit_without_calls(true),
        )
        .connect_static(
            StaticConfig::new(
                "keepalive",
                vec![
                    StaticEndpoint::new(partition.addr()),
                    StaticEndpoint::new(b.addr()),
                ],
            )
            .with_session(spec),
        )
        .unwrap();

    // A session on `a` (behind the partition): new jars until one lands
    // there.
    let mut session = None;
    for _ in 0..20 {
        let jar = CookieJar::new();
        let mut client = EchoClient::new(CookieJarLayer::new(jar.clone()).layer(channel.clone()));
        let reply = client.echo(request("first")).await.unwrap().into_inner();
        if reply.backend == "a" {
            session = Some((jar, client));
            break;
        }
    }
    let (jar, mut client) = session.expect("a session on a within 20 tries");
    let cookie_on_a = jar.get("session").expect("the session's cookie");
    assert_eq!(
        client
            .echo(request("again"))
            .await
            .unwrap()
            .into_inner()
            .backend,
        "a"
    );

    // A call in flight on `a` when it goes silent.
    let mut in_flight = client.clone();
    let flying = tokio::spawn(async move { in_flight.echo(request("sleep:5000")).await });
    assert!(
        tether_testkit::wait_until(Duration::from_secs(5), || async { a.hits() >= 3 }).await,
        "the slow call reached a"
    );
    partition.cut();
    let cut_at = Instant::now();

    // It fails, and fast: keepalive found the connection dead.
    let failed = flying
        .await
        .unwrap()
        .expect_err("the call on a dead connection fails");
    let found = cut_at.elapsed();
    println!("the call in flight failed after {found:?}: {failed:?}");
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    assert!(
        found <= TIME + TIMEOUT + Duration::from_millis(1500),
        "found dead after {found:?}, keepalive bound {:?}",
        TIME + TIMEOUT
    );
    // Its subchannel leaves READY with the connection (within the same bound).
    let left_ready = tether_testkit::wait_until(
        (TIME + TIMEOUT + Duration::from_millis(1500)).saturating_sub(cut_at.elapsed()),
        || async {
            subchannel_state(&channel, partition.addr()).await != Some(ConnectivityState::Ready)
        },
    )
    .await;
    assert!(left_ready, "the dead connection's subchannel stayed READY");

    // New calls go to `b`.
    let mut fresh = EchoClient::new(channel.clone());
    for i in 0..6 {
        let reply = fresh.echo(request(&format!("new {i}"))).await.unwrap();
        assert_eq!(reply.into_inner().backend, "b");
    }

    // The session moves once `a` is really gone (its reconnection through
    // the partition failed), with a fresh cookie.
    let moved = client.echo(request("after")).await.unwrap().into_inner();
    assert_eq!(moved.backend, "b");
    let cookie_now = jar.get("session").expect("a cookie");
    assert_ne!(
        cookie_now, cookie_on_a,
        "the moved session got a new cookie"
    );
    assert_eq!(
        client
            .echo(request("stays"))
            .await
            .unwrap()
            .into_inner()
            .backend,
        "b"
    );
}

/// A peer that drops packets: a listener whose accept queue is full (one
/// connection fills a backlog of 0), so the kernel drops further SYNs as a
/// partitioned host does. Keep the two values alive while it is used.
fn dropping_peer() -> (SocketAddr, socket2::Socket, std::net::TcpStream) {
    use socket2::{Domain, Socket, Type};
    let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    listener
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    listener.listen(0).unwrap();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    let filler = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .expect("the first connection fills the queue");
    (addr, listener, filler)
}

/// With keepalive on, a connection attempt to a peer that drops packets
/// fails within about the keepalive timeout (the socket's TCP_USER_TIMEOUT,
/// as C-core sets it), so a call waiting for that endpoint ends UNAVAILABLE
/// at once; without keepalive the attempt runs to the 20 s connect timeout
/// and the same call reaches its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_attempt_to_a_peer_that_drops_packets_fails_within_the_keepalive_timeout() {
    let (addr, _listener, _filler) = dropping_peer();
    let deadline = Duration::from_secs(3);
    for keepalive in [true, false] {
        let mut builder = Channel::builder();
        if keepalive {
            builder = builder.keepalive(
                KeepaliveOptions::new(Duration::from_secs(1))
                    .with_timeout(Duration::from_millis(300)),
            );
        }
        let channel = builder
            .connect_static(StaticConfig::new(
                "dropping",
                vec![StaticEndpoint::new(addr)],
            ))
            .unwrap();
        let mut client = EchoClient::new(channel);
        let mut r = request("x");
        r.set_timeout(deadline);
        let began = Instant::now();
        let status = client.echo(r).await.expect_err("nothing answers");
        let took = began.elapsed();
        println!("keepalive {keepalive}: {:?} after {took:?}", status.code());
        if keepalive {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            // The first SYN retransmission (1 s) finds the 300 ms passed.
            assert!(
                took < Duration::from_millis(2500),
                "took {took:?}: {status:?}"
            );
        } else {
            assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        }
    }
}

/// An HTTP/2 server that ends every connection with GOAWAY
/// ENHANCE_YOUR_CALM shortly after the handshake, as a gRPC server does to
/// a client that pings too often.
async fn calm_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
                loop {
                    tokio::select! {
                        next = conn.accept() => if next.is_none() { return },
                        () = tokio::time::sleep_until(deadline) => break,
                    }
                }
                conn.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                while conn.accept().await.is_some() {}
            });
        }
    });
    addr
}

/// The keepalive time the subchannels of `channel` use next.
async fn keepalive_ms(channel: &Channel) -> Option<u64> {
    let stats = channel.stats().await.expect("the channel answers");
    fn walk(n: &tether::lb::PolicyStats) -> Option<u64> {
        n.endpoints
            .iter()
            .find_map(|e| e.keepalive_time_ms)
            .or_else(|| n.children.iter().find_map(walk))
    }
    walk(&stats.tree)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_pings_doubles_the_keepalive_time() {
    let addr = calm_server().await;
    let channel = Channel::builder()
        .keepalive(KeepaliveOptions::new(Duration::from_millis(300)))
        .connect_static(StaticConfig::new("calm", vec![StaticEndpoint::new(addr)]))
        .unwrap();
    let keepalive_ms = || keepalive_ms(&channel);
    assert_eq!(keepalive_ms().await, Some(300));
    // A call makes the channel connect; the server then sends its GOAWAY.
    let mut client = EchoClient::new(channel.clone());
    let _ = client.echo(request("x")).await;
    let doubled = tether_testkit::wait_until(Duration::from_secs(5), || async {
        keepalive_ms().await == Some(600)
    })
    .await;
    assert!(doubled, "keepalive time is {:?}", keepalive_ms().await);
}

/// Against a real gRPC server (C-core, PyPI grpcio) with its default ping
/// policy (pings without data at most every 5 minutes, 2 strikes): a call
/// held 3 s while the channel pings every 100 ms earns C-core's GOAWAY
/// ENHANCE_YOUR_CALM "too_many_pings", and the channel doubles its keepalive
/// time (gRFC A8); the next connection's calls then complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_grpc_server_s_too_many_pings_doubles_the_keepalive_time() {
    use tokio::io::AsyncBufReadExt;
    let python = tether_testkit::grpcio::python_or_install(None)
        .await
        .expect("grpcio is needed (scripts/setup.sh installs it)");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testkit/peers/grpc_echo_server.py");
    let mut server = tether_testkit::command(&python)
        .arg(&script)
        .args(["c-core", "3000"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the grpcio server");
    let mut lines = tokio::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the grpcio server started")
        .unwrap()
        .expect("its address");
    let addr: SocketAddr = first
        .strip_prefix("listening on ")
        .expect("listening on ADDR")
        .parse()
        .unwrap();
    let channel = Channel::builder()
        .keepalive(KeepaliveOptions::new(Duration::from_millis(100)))
        .connect_static(StaticConfig::new("c-core", vec![StaticEndpoint::new(addr)]))
        .unwrap();
    assert_eq!(keepalive_ms(&channel).await, Some(100));
    let mut client = EchoClient::new(channel.clone());
    let first = client.echo(request("held")).await;
    let doubled = tether_testkit::wait_until(Duration::from_secs(10), || async {
        keepalive_ms(&channel).await.is_some_and(|ms| ms >= 200)
    })
    .await;
    assert!(
        doubled,
        "keepalive time {:?} (first call: {first:?})",
        keepalive_ms(&channel).await
    );
    drop(server.stdin.take());
    let _ = server.wait().await;
}
