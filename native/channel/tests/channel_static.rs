//! `tether::Channel` over fixed endpoints (no control plane): the same LB
//! tree as xDS, against real tonic backends on loopback.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint, WaitForReady};
use tether::lb::ConnectivityState;
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};

fn config(endpoints: Vec<StaticEndpoint>) -> StaticConfig {
    StaticConfig::new("static-test", endpoints).with_policy(EndpointPolicy::RoundRobin)
}

async fn echo(channel: &Channel, message: &str) -> Result<String, tonic::Status> {
    let mut client = EchoClient::new(channel.clone());
    let reply = client
        .echo(EchoRequest {
            message: message.into(),
        })
        .await?;
    Ok(reply.into_inner().backend)
}

/// Calls until `want` answered (bounded), so a test starts from a settled tree.
async fn until_backend(channel: &Channel, want: &str) {
    for _ in 0..400 {
        if echo(channel, "x").await.is_ok_and(|b| b == want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{want} never answered");
}

#[tokio::test]
async fn round_robin_spreads_calls_over_every_backend() {
    let backends = [
        GrpcBackend::start("a").await,
        GrpcBackend::start("b").await,
        GrpcBackend::start("c").await,
    ];
    let channel = Channel::from_static(config(
        backends
            .iter()
            .map(|b| StaticEndpoint::new(b.addr()))
            .collect(),
    ))
    .unwrap();
    // Round robin only uses READY subchannels: wait until all three are.
    for b in &backends {
        until_backend(&channel, b.name()).await;
    }
    let mut counts: HashMap<String, u32> = HashMap::new();
    for _ in 0..300 {
        *counts
            .entry(echo(&channel, "hi").await.unwrap())
            .or_default() += 1;
    }
    for b in &backends {
        assert_eq!(counts[b.name()], 100, "{counts:?}");
    }
    assert_eq!(channel.state(), ConnectivityState::Ready);
}

#[tokio::test]
async fn priority_fails_over_and_back() {
    let primary = GrpcBackend::start("primary").await;
    let primary_addr = primary.addr();
    let secondary = GrpcBackend::start("secondary").await;
    let mut p1 = StaticEndpoint::new(secondary.addr());
    p1.priority = 1;
    let channel =
        Channel::from_static(config(vec![StaticEndpoint::new(primary_addr), p1])).unwrap();
    for _ in 0..20 {
        assert_eq!(echo(&channel, "x").await.unwrap(), "primary");
    }
    // Priority 0 dies: its endpoint fails, priority 1 takes the calls at once.
    primary.stop().await;
    until_backend(&channel, "secondary").await;
    for _ in 0..20 {
        assert_eq!(echo(&channel, "x").await.unwrap(), "secondary");
    }
    // It comes back: once READY again it takes the traffic back.
    let _primary = GrpcBackend::start_on("primary", primary_addr).await;
    until_backend(&channel, "primary").await;
    for _ in 0..20 {
        assert_eq!(echo(&channel, "x").await.unwrap(), "primary");
    }
}

fn refused_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

#[tokio::test]
async fn fail_fast_fails_and_wait_for_ready_waits() {
    let addr = refused_addr();
    let channel = Channel::from_static(config(vec![StaticEndpoint::new(addr)])).unwrap();
    channel
        .wait_for_state(ConnectivityState::TransientFailure)
        .await;
    let err = echo(&channel, "x").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message()
            .contains("connections to all backends failing")
            && err.message().contains(&addr.to_string()),
        "{err:?}"
    );

    // A wait_for_ready call waits through TRANSIENT_FAILURE and succeeds
    // once the backend is up.
    let waiting = tokio::spawn({
        let channel = channel.clone();
        async move {
            let mut client = EchoClient::new(channel);
            let mut request = tonic::Request::new(EchoRequest {
                message: "x".into(),
            });
            request.extensions_mut().insert(WaitForReady(true));
            request.set_timeout(Duration::from_secs(20));
            client.echo(request).await.map(|r| r.into_inner().backend)
        }
    });
    // A fail-fast twin spawned after it has failed: the tasks of this
    // one-thread runtime start in the order spawned, so the wait_for_ready
    // call met the same failing picker first, and would have failed too.
    let twin = tokio::spawn({
        let channel = channel.clone();
        async move { echo(&channel, "x").await }
    });
    let err = twin.await.unwrap().unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        !waiting.is_finished(),
        "the wait_for_ready call did not wait"
    );
    let _backend = GrpcBackend::start_on("late", addr).await;
    let answered = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the wait_for_ready call finished")
        .unwrap();
    assert_eq!(answered.unwrap(), "late");
}

#[tokio::test]
async fn a_wait_for_ready_call_fails_at_its_deadline() {
    let channel = Channel::from_static(config(vec![StaticEndpoint::new(refused_addr())])).unwrap();
    let mut client = EchoClient::new(channel);
    let mut request = tonic::Request::new(EchoRequest {
        message: "x".into(),
    });
    request.extensions_mut().insert(WaitForReady(true));
    request.set_timeout(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let err = client.echo(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(290));
}

#[tokio::test]
async fn static_configs_are_checked() {
    let e = Channel::from_static(config(vec![]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no endpoints"), "{e}");
    let mut skip = StaticEndpoint::new(refused_addr());
    skip.priority = 2;
    let e = Channel::from_static(config(vec![skip]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("priorities [2] skip a level"), "{e}");
}

/// The attempts the tree's only subchannel has made.
async fn attempts(channel: &Channel) -> u64 {
    let stats = channel.stats().await.unwrap();
    fn walk(p: &tether::lb::PolicyStats) -> u64 {
        p.endpoints.iter().map(|e| e.connect_attempts).sum::<u64>()
            + p.children.iter().map(walk).sum::<u64>()
    }
    walk(&stats.tree)
}

#[tokio::test(start_paused = true)]
async fn refused_connections_are_transient_failure_retried_after_grpc_backoff() {
    use tether::subchannel::backoff::{Backoff, BackoffConfig};
    use tether::subchannel::SubchannelOptions;
    let mut options = SubchannelOptions::default();
    options.backoff_seed = Some(11);
    let channel = Channel::builder()
        .subchannel_options(options)
        .connect_static(config(vec![StaticEndpoint::new(refused_addr())]))
        .unwrap();
    channel
        .wait_for_state(ConnectivityState::TransientFailure)
        .await;
    assert_eq!(attempts(&channel).await, 1);
    // Each retry waits gRPC's backoff (1 s x 1.6, jitter 0.2) after the
    // failure; the tree stays in TRANSIENT_FAILURE all along.
    // A refused loopback connect fails without the paused clock moving, so
    // attempt k+1 starts exactly one delay after attempt k.
    let mut expected = Backoff::with_seed(BackoffConfig::default(), 11);
    let mut failed_at = tokio::time::Instant::now();
    for attempt in 1..=4u64 {
        let delay = expected.next_delay();
        let next = failed_at + delay;
        tokio::time::sleep_until(next - Duration::from_millis(5)).await;
        assert_eq!(attempts(&channel).await, attempt, "before delay {delay:?}");
        tokio::time::sleep_until(next + Duration::from_millis(5)).await;
        assert_eq!(
            attempts(&channel).await,
            attempt + 1,
            "after delay {delay:?}"
        );
        failed_at = next;
        assert_eq!(channel.state(), ConnectivityState::TransientFailure);
    }
}

/// A response body that never ends (nor sends anything).
struct Stall;

impl http_body::Body for Stall {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

#[tokio::test]
async fn the_deadline_bounds_a_body_that_stalls_after_its_headers() {
    // A server that answers with headers, then nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    let response = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(Stall)
                        .unwrap();
                    Ok::<_, std::convert::Infallible>(response)
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
            });
        }
    });
    let channel = Channel::from_static(config(vec![StaticEndpoint::new(addr)])).unwrap();
    let mut client = EchoClient::new(channel);
    let mut request = tonic::Request::new(EchoRequest {
        message: "x".into(),
    });
    request.set_timeout(Duration::from_millis(500));
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), client.echo(request))
        .await
        .expect("the call ended")
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn pick_first_stays_on_the_first_address_that_connects() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let channel = Channel::from_static(
        StaticConfig::new(
            "pf",
            vec![StaticEndpoint::new(a.addr()), StaticEndpoint::new(b.addr())],
        )
        .with_policy(EndpointPolicy::PickFirst { shuffle: false }),
    )
    .unwrap();
    for _ in 0..20 {
        assert_eq!(echo(&channel, "x").await.unwrap(), "a");
    }
    a.stop().await;
    until_backend(&channel, "b").await;
    for _ in 0..20 {
        assert_eq!(echo(&channel, "x").await.unwrap(), "b");
    }
}

#[tokio::test]
async fn a_priority_that_does_not_connect_in_10_s_fails_over() {
    // Priority 0 accepts connections and never speaks HTTP/2: its attempt
    // only times out after 20 s, so the 10 s failover timer decides.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let backup = GrpcBackend::start("backup").await;
    let mut p1 = StaticEndpoint::new(backup.addr());
    p1.priority = 1;
    let channel = Channel::from_static(config(vec![StaticEndpoint::new(silent_addr), p1])).unwrap();
    let started = std::time::Instant::now();
    assert_eq!(echo(&channel, "x").await.unwrap(), "backup");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(9_900) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    hold.abort();
}

/// Happy eyeballs (gRFC A61) over one endpoint's addresses: the first
/// refuses, so the second starts at once and serves. A connect that hangs
/// cannot be made on loopback; the Connection Attempt Delay is covered by
/// pick_first's unit tests on a paused clock.
#[tokio::test]
async fn pick_first_moves_past_a_refusing_address_of_an_endpoint() {
    let b = GrpcBackend::start("b").await;
    let mut endpoint = StaticEndpoint::new(refused_addr());
    endpoint.addresses.push(b.addr());
    for policy in [
        EndpointPolicy::PickFirst { shuffle: false },
        EndpointPolicy::RoundRobin,
    ] {
        let channel = Channel::from_static(
            StaticConfig::new("pf-he", vec![endpoint.clone()]).with_policy(policy),
        )
        .unwrap();
        let started = std::time::Instant::now();
        assert_eq!(echo(&channel, "x").await.unwrap(), "b");
        // The refusal moves on at once, without waiting out the delay.
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}

/// The server is given the deadline that remains when the request leaves,
/// not the one the caller set: a 3 s call that waited (wait-for-ready)
/// about a second for its backend to come up reaches it with less than
/// 2 s left, as C-core's would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_sent_is_what_remains_of_it() {
    use tether::subchannel::SubchannelOptions;
    let addr = refused_addr();
    let mut options = SubchannelOptions::default();
    options.backoff.initial = Duration::from_millis(100);
    options.backoff.max = Duration::from_millis(100);
    let channel = Channel::builder()
        .wait_for_ready(true)
        .subchannel_options(options)
        .connect_static(config(vec![StaticEndpoint::new(addr)]))
        .unwrap();
    let started = std::time::Instant::now();
    let call = tokio::spawn(async move {
        let mut client = EchoClient::new(channel);
        let mut request = tonic::Request::new(EchoRequest {
            message: "late".into(),
        });
        request.set_timeout(Duration::from_secs(3));
        client.echo(request).await
    });
    // The wait the call goes through: its backend is not there for 1 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _backend = GrpcBackend::start_on("late", addr).await;
    let reply = call
        .await
        .unwrap()
        .expect("the call waited for its backend");
    let waited = started.elapsed();
    let seen = tether::channel::call::parse_grpc_timeout(
        reply
            .metadata()
            .get("x-seen-grpc-timeout")
            .expect("the server saw a grpc-timeout")
            .to_str()
            .unwrap(),
    )
    .expect("a valid grpc-timeout");
    println!("waited {waited:?}; the server was given {seen:?} of 3 s");
    assert!(
        seen <= Duration::from_secs(2),
        "the server was given {seen:?} after the call had waited at least 1 s of its 3 s"
    );
    assert!(seen >= Duration::from_millis(1500), "{seen:?}");
}
