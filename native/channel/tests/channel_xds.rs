//! `tether::Channel` over xDS, from the ADS test fixture, against real tonic
//! backends on loopback: routing, weighted clusters and localities,
//! priorities, aggregate clusters, drops, circuit breaking and A57 errors.

mod channel_support;
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::time::Duration;

use channel_support::*;
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use tether::lb::ConnectivityState;
use tether::xds::client::ClientOptions;
use tether::xds::{ResourceKind, ResourceState, XdsClient};
use tether_testkit::grpc::GrpcBackend;
use xds_support::{Fixture, Mode};

/// `count` within ±5 points of `percent` of `total`.
fn near(count: usize, total: usize, percent: f64) -> bool {
    let got = count as f64 * 100.0 / total as f64;
    (got - percent).abs() <= 5.0
}

#[tokio::test]
async fn routes_by_path_and_header() {
    let gold = GrpcBackend::start("gold").await;
    let plain = GrpcBackend::start("plain").await;
    let f = Fixture::start(Mode::Serve).await;
    serve(
        &f,
        vec![
            with_header(route("/tether.demo.v1.Echo/", "gold"), "x-tier", "gold"),
            route("/tether.demo.v1.Echo/", "plain"),
        ],
        vec![cluster("gold"), cluster("plain")],
        vec![
            eds("gold", vec![Loc::of(&[gold.addr()])], &[]),
            eds("plain", vec![Loc::of(&[plain.addr()])], &[]),
        ],
    );
    let ch = channel(&f);
    for _ in 0..10 {
        assert_eq!(
            echo_with(&ch, "x", &[("x-tier", "gold")]).await.unwrap(),
            "gold"
        );
        assert_eq!(
            echo_with(&ch, "x", &[("x-tier", "silver")]).await.unwrap(),
            "plain"
        );
        assert_eq!(echo(&ch).await.unwrap(), "plain");
    }
}

#[tokio::test]
async fn no_matching_route_is_unavailable() {
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    serve(
        &f,
        vec![route("/other.Service/", "c")],
        vec![cluster("c")],
        vec![eds("c", vec![Loc::of(&[b.addr()])], &[])],
    );
    let err = echo(&channel(&f)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(err.message(), "No matching route found in xDS route config");
}

#[tokio::test]
async fn weighted_clusters_split_calls_by_weight() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    serve(
        &f,
        vec![route_weighted("/", &[("ca", 75), ("cb", 25)])],
        vec![cluster("ca"), cluster("cb")],
        vec![
            eds("ca", vec![Loc::of(&[a.addr()])], &[]),
            eds("cb", vec![Loc::of(&[b.addr()])], &[]),
        ],
    );
    let ch = channel(&f);
    until_backend(&ch, "a").await;
    until_backend(&ch, "b").await;
    let counts = spread(&ch, 2000).await;
    assert!(near(counts["a"], 2000, 75.0), "{counts:?}");
    assert!(near(counts["b"], 2000, 25.0), "{counts:?}");
}

#[tokio::test]
async fn locality_weights_split_calls_by_weight() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    serve(
        &f,
        vec![route("/", "c")],
        vec![cluster("c")],
        vec![eds(
            "c",
            vec![
                Loc::of(&[a.addr()]).zone("za", 1),
                Loc::of(&[b.addr()]).zone("zb", 3),
            ],
            &[],
        )],
    );
    let ch = channel(&f);
    until_backend(&ch, "a").await;
    until_backend(&ch, "b").await;
    let counts = spread(&ch, 2000).await;
    assert!(near(counts["a"], 2000, 25.0), "{counts:?}");
    assert!(near(counts["b"], 2000, 75.0), "{counts:?}");
}

#[tokio::test]
async fn priority_fails_over_when_its_endpoints_are_removed_and_back() {
    let p0 = GrpcBackend::start("p0").await;
    let p1 = GrpcBackend::start("p1").await;
    let f = Fixture::start(Mode::Serve).await;
    let both = |with_p0: bool| {
        let p0_addrs = if with_p0 { vec![p0.addr()] } else { vec![] };
        let locs = vec![
            Loc::of(&p0_addrs).zone("z0", 1),
            Loc::of(&[p1.addr()]).priority(1).zone("z1", 1),
        ];
        eds("c", locs, &[])
    };
    serve(
        &f,
        vec![route("/", "c")],
        vec![cluster("c")],
        vec![both(true)],
    );
    let ch = channel(&f);
    for _ in 0..10 {
        assert_eq!(echo(&ch).await.unwrap(), "p0");
    }
    // Priority 0 loses its endpoints: priority 1 serves, no call fails.
    f.set_resources(EDS, vec![both(false)]);
    f.push(EDS);
    until_backend(&ch, "p1").await;
    let counts = spread(&ch, 20).await;
    assert_eq!(counts.get("p1"), Some(&20), "{counts:?}");
    // They come back: priority 0 takes the traffic back.
    f.set_resources(EDS, vec![both(true)]);
    f.push(EDS);
    until_backend(&ch, "p0").await;
    assert_eq!(spread(&ch, 20).await.get("p0"), Some(&20));
}

#[tokio::test]
async fn aggregate_clusters_fail_over_through_two_levels() {
    let b1 = GrpcBackend::start("b1").await;
    let b2 = GrpcBackend::start("b2").await;
    let b3 = GrpcBackend::start("b3").await;
    let f = Fixture::start(Mode::Serve).await;
    // top -> [mid, c3]; mid -> [c1, c2]: c1 first, then c2, then c3.
    serve(
        &f,
        vec![route("/", "top")],
        vec![
            aggregate("top", &["mid", "c3"]),
            aggregate("mid", &["c1", "c2"]),
            cluster("c1"),
            cluster("c2"),
            cluster("c3"),
        ],
        vec![
            eds("c1", vec![Loc::of(&[b1.addr()])], &[]),
            eds("c2", vec![Loc::of(&[b2.addr()])], &[]),
            eds("c3", vec![Loc::of(&[b3.addr()])], &[]),
        ],
    );
    let ch = channel(&f);
    assert_eq!(spread(&ch, 10).await.get("b1"), Some(&10));
    b1.stop().await;
    until_backend(&ch, "b2").await;
    assert_eq!(spread(&ch, 10).await.get("b2"), Some(&10));
    b2.stop().await;
    until_backend(&ch, "b3").await;
    assert_eq!(spread(&ch, 10).await.get("b3"), Some(&10));
    let stats = ch.stats().await.unwrap();
    let text = serde_json::to_string(&stats).unwrap();
    assert!(
        text.contains("\"c3\"") && text.contains("\"priority\""),
        "{text}"
    );
}

#[tokio::test]
async fn circuit_breaking_drops_calls_above_max_requests() {
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    serve(
        &f,
        vec![route("/", "c")],
        vec![cluster_max_requests("c", 2)],
        vec![eds("c", vec![Loc::of(&[b.addr()])], &[])],
    );
    let ch = channel(&f);
    until_backend(&ch, "b").await;
    let served = b.hits();
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let ch = ch.clone();
            tokio::spawn(async move { echo_with(&ch, "sleep:800", &[]).await })
        })
        .collect();
    // Both are in flight once the backend has counted them.
    b.until_hits(served + 2, Duration::from_secs(10)).await;
    let err = echo(&ch).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(err.message(), "circuit breaker drop");
    for s in slow {
        assert_eq!(s.await.unwrap().unwrap(), "b");
    }
    // The two have ended: calls go again.
    assert_eq!(echo(&ch).await.unwrap(), "b");
}

#[tokio::test]
async fn drop_categories_drop_their_share() {
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    serve(
        &f,
        vec![route("/", "c")],
        vec![cluster("c")],
        vec![eds(
            "c",
            vec![Loc::of(&[b.addr()])],
            &[("throttle", 300_000)],
        )],
    );
    let ch = channel(&f);
    until_backend(&ch, "b").await;
    let counts = spread(&ch, 1000).await;
    let dropped = counts
        .get("Unavailable: EDS-configured drop: throttle")
        .copied()
        .unwrap_or(0);
    assert!(near(dropped, 1000, 30.0), "{counts:?}");
    // A category dropping everything: every call fails, even wait_for_ready
    // ones would (a drop is final).
    f.set_resources(
        EDS,
        vec![eds("c", vec![Loc::of(&[b.addr()])], &[("all", 1_000_000)])],
    );
    f.push(EDS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match echo(&ch).await {
            Err(e) if e.message() == "EDS-configured drop: all" => break,
            _ if tokio::time::Instant::now() > deadline => panic!("never dropped all"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_listener_that_does_not_exist_fails_calls_naming_it_after_15_s() {
    let f = Fixture::start(Mode::Serve).await;
    // The server has no listener at all.
    let ch = channel(&f);
    let started = tokio::time::Instant::now();
    let err = echo(&ch).await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message()
            .contains("Listener resource \"shop.example\" does not exist")
            && err.message().contains(&format!("(node ID:{NODE})")),
        "{err:?}"
    );
    assert!(
        waited >= Duration::from_secs(15) && waited < Duration::from_secs(17),
        "{waited:?}"
    );
}

#[tokio::test]
async fn a_nacked_update_keeps_the_previous_config_serving() {
    let a = GrpcBackend::start("a").await;
    let f = Fixture::start(Mode::Serve).await;
    serve_one(&f, &[a.addr()]);
    let ch = channel(&f);
    assert_eq!(echo(&ch).await.unwrap(), "a");
    // An invalid cluster (no discovery type): NACKed, the old one serves.
    let mut bad = xds_support::make::cluster("c");
    bad.cluster_discovery_type = None;
    f.set_resources(CDS, vec![tether::xds::resource::pack(&bad)]);
    f.push(CDS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !f
        .requests()
        .iter()
        .any(|r| r.request.error_detail.is_some())
    {
        assert!(tokio::time::Instant::now() < deadline, "no NACK");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(spread(&ch, 20).await.get("a"), Some(&20));
    assert_eq!(ch.state(), ConnectivityState::Ready);
}

#[tokio::test]
async fn an_endpoint_removed_while_calls_run_lets_them_complete() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    serve_one(&f, &[a.addr()]);
    let ch = channel(&f);
    until_backend(&ch, "a").await;
    let served = a.hits();
    let running: Vec<_> = (0..5)
        .map(|_| {
            let ch = ch.clone();
            tokio::spawn(async move { echo_with(&ch, "sleep:500", &[]).await })
        })
        .collect();
    // All five are in flight once a has counted them.
    a.until_hits(served + 5, Duration::from_secs(10)).await;
    // a is replaced by b while its five calls run.
    f.set_resources(EDS, vec![eds("c", vec![Loc::of(&[b.addr()])], &[])]);
    f.push(EDS);
    until_backend(&ch, "b").await;
    for r in running {
        assert_eq!(r.await.unwrap().unwrap(), "a");
    }
    assert_eq!(spread(&ch, 10).await.get("b"), Some(&10));
}

#[tokio::test]
async fn draining_endpoints_get_no_new_calls() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    let mut loc = Loc::of(&[a.addr(), b.addr()]);
    loc.endpoints[0].1 = HealthStatus::Draining;
    serve(
        &f,
        vec![route("/", "c")],
        vec![cluster("c")],
        vec![eds("c", vec![loc], &[])],
    );
    let ch = channel(&f);
    assert_eq!(spread(&ch, 20).await.get("b"), Some(&20));
}

/// The names of the clusters in the channel's tree.
async fn clusters_in_tree(ch: &tether::Channel) -> Vec<String> {
    let stats = ch.stats().await.unwrap();
    stats
        .tree
        .children
        .iter()
        .filter_map(|c| c.name.clone())
        .collect()
}

#[tokio::test]
async fn a_cluster_the_routes_drop_stays_while_calls_use_it() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    let endpoints = vec![
        eds("ca", vec![Loc::of(&[a.addr()])], &[]),
        eds("cb", vec![Loc::of(&[b.addr()])], &[]),
    ];
    serve(
        &f,
        vec![route("/", "ca")],
        vec![cluster("ca"), cluster("cb")],
        endpoints,
    );
    let ch = channel(&f);
    until_backend(&ch, "a").await;
    let served = a.hits();
    let slow = tokio::spawn({
        let ch = ch.clone();
        async move { echo_with(&ch, "sleep:1500", &[]).await }
    });
    // In flight on ca once a has counted it.
    a.until_hits(served + 1, Duration::from_secs(10)).await;
    // The routes now name cb only.
    f.set_resources(RDS, vec![route_config(vec![route("/", "cb")])]);
    f.push(RDS);
    until_backend(&ch, "b").await;
    assert_eq!(clusters_in_tree(&ch).await, ["ca", "cb"]);
    assert_eq!(slow.await.unwrap().unwrap(), "a");
    // Its last call ended: ca leaves the tree.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while clusters_in_tree(&ch).await != ["cb"] {
        assert!(tokio::time::Instant::now() < deadline, "ca stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn max_stream_duration_is_the_call_deadline() {
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    serve(
        &f,
        vec![with_max_stream_duration(
            route("/", "c"),
            Duration::from_millis(300),
        )],
        vec![cluster("c")],
        vec![eds("c", vec![Loc::of(&[b.addr()])], &[])],
    );
    let ch = channel(&f);
    assert_eq!(echo(&ch).await.unwrap(), "b");
    let started = std::time::Instant::now();
    let err = echo_with(&ch, "sleep:3000", &[]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_millis(2500),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_route_that_does_not_forward_fails_calls() {
    let f = Fixture::start(Mode::Serve).await;
    serve(&f, vec![redirect("/")], vec![], vec![]);
    let err = echo(&channel(&f)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(err.message(), "Matching route has inappropriate action");
}

#[tokio::test]
async fn no_control_plane_fails_calls_with_the_connectivity_error() {
    let addr = Fixture::unused_addr().await;
    let ch = tether::Channel::builder()
        .bootstrap(xds_support::bootstrap(addr, NODE))
        .connect(&format!("xds:///{TARGET}"))
        .unwrap();
    let err = echo(&ch).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message()
            .starts_with(&format!("xDS channel for server {addr}: xDS call failed"))
            && err.message().ends_with(&format!("(node ID:{NODE})")),
        "{err:?}"
    );
}

#[tokio::test]
async fn losing_the_control_plane_does_not_break_working_calls() {
    let b = GrpcBackend::start("b").await;
    let f = Fixture::start(Mode::Serve).await;
    serve_one(&f, &[b.addr()]);
    // The channel's own client, to see what it holds.
    let client = XdsClient::for_target(
        xds_support::bootstrap(f.addr, NODE),
        ClientOptions::default(),
        &format!("xds:///{TARGET}"),
    )
    .unwrap();
    let ch = tether::Channel::builder()
        .xds_client(client.clone())
        .connect(&format!("xds:///{TARGET}"))
        .unwrap();
    assert_eq!(echo(&ch).await.unwrap(), "b");
    let mut listener = client.watch(ResourceKind::Listener, TARGET);
    // The server dies: an ambient error for cached resources.
    f.kill();
    tokio::time::timeout(
        Duration::from_secs(10),
        listener.wait_for(ResourceState::is_ambient_error),
    )
    .await
    .expect("the client never saw the server go")
    .expect("the client stopped");
    assert_eq!(spread(&ch, 20).await.get("b"), Some(&20));
}

#[tokio::test]
async fn no_virtual_host_for_the_target_fails_calls_naming_it() {
    let f = Fixture::start(Mode::Serve).await;
    serve(&f, vec![route("/", "c")], vec![cluster("c")], vec![]);
    let mut rc = route_config(vec![route("/", "c")]);
    // The same routes, for another domain only.
    let mut decoded: envoy_types::pb::envoy::config::route::v3::RouteConfiguration =
        prost::Message::decode(rc.value.as_slice()).unwrap();
    decoded.virtual_hosts[0].domains = vec!["other.example".into()];
    rc = tether::xds::resource::pack(&decoded);
    f.set_resources(RDS, vec![rc]);
    f.push(RDS);
    let err = echo(&channel(&f)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(
        err.message(),
        "could not find VirtualHost for \"shop.example\" in RouteConfiguration \"routes\""
    );
}

#[tokio::test]
async fn an_aggregate_cycle_fails_its_calls_with_the_reason() {
    let f = Fixture::start(Mode::Serve).await;
    serve(
        &f,
        vec![route("/", "a")],
        vec![aggregate("a", &["b"]), aggregate("b", &["a"])],
        vec![],
    );
    let err = echo(&channel(&f)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("has a cycle: a -> b -> a"),
        "{err:?}"
    );
}
