//! gRFC A57 failure behaviour of the XdsClient, with real fault injection: a
//! real ADS server on 127.0.0.1 that is killed, restarted, has its streams
//! reset or withholds responses. Tokio's paused clock makes the 15 s
//! does-not-exist timer and the backoff delays exact.

mod xds_support;

use std::time::Duration;

use tether_xds::client::{ClientOptions, ResourceStatus};
use tether_xds::{ResourceKind, ResourceState, Watcher, XdsClient, XdsError};
use tokio::time::Instant;
use xds_support::{bootstrap, make, Fixture, Mode, LDS};

const NODE: &str = "a57-node";

async fn wait<T>(what: &str, secs: u64, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Waits (paused time, up to 600 s) until `w`'s resource does not exist;
/// returns its state and when that was seen.
async fn does_not_exist(w: &mut Watcher) -> (ResourceState, Instant) {
    let s = wait(
        "does-not-exist",
        600,
        w.wait_for(|s| s.status == ResourceStatus::DoesNotExist),
    )
    .await
    .unwrap();
    (s, Instant::now())
}

/// Waits (up to 30 s) for `w`'s first error; returns the state that has it.
async fn first_error(w: &mut Watcher) -> ResourceState {
    wait("an error", 30, w.wait_for(|s| s.error.is_some()))
        .await
        .unwrap()
}

fn assert_connectivity(err: &XdsError, addr: std::net::SocketAddr) {
    match err {
        XdsError::Connectivity {
            server_uri,
            node_id,
            code,
            ..
        } => {
            assert_eq!(server_uri, &addr.to_string());
            assert_eq!(node_id, NODE);
            assert_eq!(code, "UNAVAILABLE", "{err}");
        }
        other => panic!("expected a connectivity error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("xDS channel for server {addr}: xDS call failed with no responses received; status: UNAVAILABLE: ")),
        "{text}"
    );
    assert!(text.ends_with(&format!("(node ID:{NODE})")), "{text}");
}

#[tokio::test(start_paused = true)]
async fn stream_closed_before_any_response_is_a_connectivity_error_to_its_watchers() {
    let f = Fixture::start(Mode::FailFirstRequest).await;
    let client = XdsClient::start(bootstrap(f.addr, NODE)).unwrap();
    let mut a = client.watch(ResourceKind::Listener, "a");
    let mut b = client.watch(ResourceKind::Cluster, "b");
    for w in [&mut a, &mut b] {
        let s = first_error(w).await;
        // Nothing cached: the error is the resource error, not ambient.
        assert!(s.resource.is_none() && !s.is_ambient_error());
        assert_eq!(s.status, ResourceStatus::Requested);
        assert_connectivity(s.error.as_ref().unwrap(), f.addr);
        assert!(s
            .error
            .unwrap()
            .to_string()
            .contains("injected failure before any response"));
    }
    // Both subscriptions were sent on the stream that failed.
    let reqs = f.requests();
    assert!(reqs
        .iter()
        .any(|r| r.request.type_url == LDS && r.request.resource_names == ["a"]));
}

#[tokio::test(start_paused = true)]
async fn connection_refused_is_an_error_naming_server_and_node() {
    let addr = Fixture::unused_addr().await;
    let client = XdsClient::start(bootstrap(addr, NODE)).unwrap();
    let mut w = client.watch(ResourceKind::Listener, "a");
    let s = first_error(&mut w).await;
    assert_connectivity(s.error.as_ref().unwrap(), addr);
    // A watcher added while the channel is failing hears about it at once.
    let late = client.watch(ResourceKind::Cluster, "late");
    let mut late = late;
    let s = wait(
        "the error for a new watcher",
        5,
        late.wait_for(|s| s.error.is_some()),
    )
    .await
    .unwrap();
    assert_connectivity(s.error.as_ref().unwrap(), addr);
}

#[tokio::test(start_paused = true)]
async fn closed_after_a_response_is_no_error_and_resubscribes_with_acked_version_and_empty_nonce() {
    let f = Fixture::start(Mode::Serve).await;
    f.set_resources(LDS, vec![make::listener("a", "r")]);
    let version = f.version().to_string();
    let client = XdsClient::start(bootstrap(f.addr, NODE)).unwrap();
    let mut w = client.watch(ResourceKind::Listener, "a");
    let s = wait("the listener", 30, w.wait_for(|s| s.resource.is_some()))
        .await
        .unwrap();
    assert_eq!(
        s.status,
        ResourceStatus::Acked {
            version: version.clone()
        }
    );
    // Wait for the ACK, then reset the stream.
    wait("the ACK", 30, async {
        while !f
            .requests()
            .iter()
            .any(|r| r.request.version_info == version)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let reset_at = Instant::now();
    f.reset_streams();
    wait("a second stream", 30, async {
        while f.stream_starts().len() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    // No backoff after a stream that had a response (the shortest backoff is
    // 0.8 s: 1 s less 20% jitter; the margin absorbs a loaded machine).
    let gap = f.stream_starts()[1] - reset_at;
    assert!(
        gap < Duration::from_millis(500),
        "reconnected after {gap:?}"
    );
    let first_on_new = wait("the resubscription", 30, async {
        loop {
            if let Some(r) = f.requests().into_iter().find(|r| r.stream == 1) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!(first_on_new.request.type_url, LDS);
    assert_eq!(
        first_on_new.request.version_info, version,
        "last ACKed version"
    );
    assert_eq!(
        first_on_new.request.response_nonce, "",
        "empty nonce on a new stream"
    );
    assert_eq!(first_on_new.request.resource_names, ["a"]);
    assert!(
        first_on_new.request.node.is_some(),
        "node on the first request of a stream"
    );
    // And the watcher never saw an error: not once the new stream's
    // response is ACKed, which the client sends after handling it (and
    // after handling the old stream's end).
    wait("the ACK on the new stream", 30, async {
        while !f
            .requests()
            .iter()
            .any(|r| r.stream == 1 && !r.request.response_nonce.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let s = w.current();
    assert!(s.error.is_none(), "{:?}", s.error);
    assert!(s.resource.is_some());
}

#[tokio::test(start_paused = true)]
async fn backoff_grows_1_6x_with_jitter_to_120s_and_resets_after_a_response() {
    let f = Fixture::start(Mode::FailFirstRequest).await;
    let client = XdsClient::start(bootstrap(f.addr, NODE)).unwrap();
    let _w = client.watch(ResourceKind::Listener, "a");
    let attempts = 16;
    wait("16 stream attempts", 3600, async {
        while f.stream_starts().len() < attempts {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let starts = f.stream_starts();
    let mut base = 1.0f64;
    for i in 1..attempts {
        let gap = (starts[i] - starts[i - 1]).as_secs_f64();
        assert!(
            gap >= base * 0.8 - 0.02 && gap <= base * 1.2 + 0.02,
            "attempt {i}: waited {gap:.3}s, expected {base:.3}s ±20%"
        );
        base = (base * 1.6).min(120.0);
    }
    assert_eq!(base, 120.0, "the cap was reached");
    // A response resets the backoff: serve once, then fail again.
    f.set_resources(LDS, vec![make::listener("a", "r")]);
    f.set_mode(Mode::Serve);
    let served = wait("a served stream", 600, async {
        loop {
            let n = f.stream_starts().len();
            if n > attempts {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    wait("the response to arrive", 30, async {
        while !f
            .requests()
            .iter()
            .any(|r| !r.request.response_nonce.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    f.set_mode(Mode::FailFirstRequest);
    f.reset_streams();
    wait("two more attempts", 60, async {
        while f.stream_starts().len() < served + 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let starts = f.stream_starts();
    let gap = (starts[served + 1] - starts[served]).as_secs_f64();
    assert!(
        (0.78..=1.22).contains(&gap),
        "after a response the backoff restarts at 1s: {gap}"
    );
}

#[tokio::test(start_paused = true)]
async fn does_not_exist_timer_starts_only_once_connected() {
    let addr = Fixture::unused_addr().await;
    let client = XdsClient::start(bootstrap(addr, NODE)).unwrap();
    let mut w = client.watch(ResourceKind::Cluster, "missing");
    let t0 = Instant::now();
    // 40 s of refused connections: errors, but never "does not exist".
    // Paused time runs on while a connection attempt is in flight, so the
    // window also lasts until the client has failed 7 attempts: the 6
    // backoff delays between them (at least 0.8 + 1.28 + 2.05 + 3.28 +
    // 5.24 + 8.39 s) are 21 s of its own time, past the 15 s timer.
    let mut failed = 0;
    while Instant::now() - t0 < Duration::from_secs(40) || failed < 7 {
        tokio::select! {
            s = w.changed() => {
                if s.expect("the client stopped").error.is_some() {
                    failed += 1;
                }
            }
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        assert_ne!(w.current().status, ResourceStatus::DoesNotExist);
        assert!(
            Instant::now() - t0 < Duration::from_secs(600),
            "{failed} attempts failed"
        );
    }
    assert!(matches!(
        w.current().error,
        Some(XdsError::Connectivity { .. })
    ));
    // The server comes up but never answers.
    let f = Fixture::start_at(addr, Mode::Withhold).await;
    let (s, fired) = does_not_exist(&mut w).await;
    let sent = f
        .requests()
        .iter()
        .find(|r| r.request.resource_names == ["missing"])
        .unwrap()
        .at;
    let after = (fired - sent).as_secs_f64();
    assert!(
        (15.0..15.1).contains(&after),
        "fired {after:.3}s after the subscription reached the server"
    );
    assert!(matches!(s.error, Some(XdsError::DoesNotExist { .. })));
    assert!(s.error.unwrap().to_string().contains("(node ID:a57-node)"));
}

#[tokio::test(start_paused = true)]
async fn does_not_exist_timer_restarts_on_a_new_stream_while_uncached() {
    let f = Fixture::start(Mode::Withhold).await;
    let client = XdsClient::start(bootstrap(f.addr, NODE)).unwrap();
    let mut w = client.watch(ResourceKind::Listener, "slow");
    let t0 = Instant::now();
    // The first stream is open (its subscription reached the server), then
    // 10 s of its timer run.
    wait("the first subscription", 30, async {
        while !f.requests().iter().any(|r| r.stream == 0) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    tokio::time::sleep_until(t0 + Duration::from_secs(10)).await;
    assert_eq!(w.current().status, ResourceStatus::Requested);
    // The stream fails before any response: a new one starts after backoff.
    f.reset_streams();
    let (s, fired) = does_not_exist(&mut w).await;
    let second = f
        .requests()
        .iter()
        .filter(|r| r.stream == 1)
        .map(|r| r.at)
        .next()
        .unwrap();
    assert!(
        (fired - t0) > Duration::from_secs(20),
        "not the first stream's timer"
    );
    let after = (fired - second).as_secs_f64();
    assert!(
        (15.0..15.1).contains(&after),
        "fired {after:.3}s after the new subscription"
    );
    assert!(s.resource.is_none());
}

#[tokio::test(start_paused = true)]
async fn cached_resources_never_time_out_and_errors_are_ambient() {
    let f = Fixture::start(Mode::Serve).await;
    f.set_resources(LDS, vec![make::listener("a", "r")]);
    let client = XdsClient::start(bootstrap(f.addr, NODE)).unwrap();
    let mut w = client.watch(ResourceKind::Listener, "a");
    wait("the listener", 30, w.wait_for(|s| s.resource.is_some())).await;
    // New stream that never answers: the cached resource must not expire.
    f.set_mode(Mode::Withhold);
    let reset = Instant::now();
    f.reset_streams();
    // A resource nobody sends, watched beside it, does expire on the new
    // stream (paused time would run past a stream still connecting): its
    // timer ran, and a timer for the cached one would have run with it.
    let mut uncached = client.watch(ResourceKind::Cluster, "uncached");
    does_not_exist(&mut uncached).await;
    tokio::time::sleep_until(reset + Duration::from_secs(60)).await;
    let s = w.current();
    assert!(s.resource.is_some());
    assert!(matches!(s.status, ResourceStatus::Acked { .. }));
    assert!(s.error.is_none());
    // New watchers get the cached resource at once, without a request.
    let before = f.requests().len();
    let second = client.watch(ResourceKind::Listener, "a");
    assert!(second.current().resource.is_some());
    // A subscription made after it reaches the server: a request the new
    // watcher caused would have been sent first, on the same stream.
    let _later = client.watch(ResourceKind::Endpoints, "later");
    let eds = ResourceKind::Endpoints.type_url();
    let first_new = wait("the later subscription", 30, async {
        loop {
            let requests = f.requests();
            if requests[before..].iter().any(|r| r.request.type_url == eds) {
                return requests[before].clone();
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!(
        first_new.request.type_url, eds,
        "no new subscription for a cached resource"
    );
    // Kill the server: the next stream fails without a response.
    f.kill();
    let s = wait("an ambient error", 60, w.wait_for(|s| s.error.is_some()))
        .await
        .unwrap();
    assert!(s.is_ambient_error());
    assert!(s.resource.is_some(), "the resource is kept");
    assert_connectivity(s.error.as_ref().unwrap(), f.addr);
    assert_eq!(second.current().error, s.error);
    // Restart: the client reconnects, resubscribes, and the error clears.
    f.set_mode(Mode::Serve);
    f.restart().await;
    let s = wait("recovery", 600, w.wait_for(|s| s.error.is_none()))
        .await
        .unwrap();
    assert!(s.resource.is_some());
}

#[tokio::test(start_paused = true)]
async fn custom_timeouts_apply() {
    let f = Fixture::start(Mode::Withhold).await;
    let options = {
        let mut client_options = ClientOptions::default();
        client_options.does_not_exist_timeout = Duration::from_secs(3);
        client_options
    };
    let client = XdsClient::start_with(bootstrap(f.addr, NODE), options).unwrap();
    let mut w = client.watch(ResourceKind::Endpoints, "e");
    let t0 = Instant::now();
    wait(
        "does-not-exist",
        60,
        w.wait_for(|s| s.status == ResourceStatus::DoesNotExist),
    )
    .await;
    let took = (Instant::now() - t0).as_secs_f64();
    assert!((3.0..3.1).contains(&took), "{took}");
}

/// A server that accepts the TCP connection and closes it (a process dying
/// with its socket still open) fails the call locally; gRPC reports that as
/// UNAVAILABLE, whatever the transport calls it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_by_the_server_is_unavailable() {
    for read_first in [false, true] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            while let Ok((mut sock, _)) = listener.accept().await {
                if read_first {
                    // Take the client's preface, then hang up.
                    let mut buf = [0u8; 64];
                    let _ = sock.read(&mut buf).await;
                }
                drop(sock);
            }
        });
        let client = XdsClient::start(bootstrap(addr, NODE)).unwrap();
        let mut w = client.watch(ResourceKind::Listener, "a");
        let s = first_error(&mut w).await;
        let err = s.error.as_ref().unwrap();
        assert_connectivity(err, addr);
        // The transport's reason is kept in the message (its wording
        // depends on when the close was seen).
        assert!(err.to_string().contains("transport error"), "{err}");
        server.abort();
    }
}
