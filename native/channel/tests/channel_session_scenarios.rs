//! Stateful session affinity in `tether::Channel`, scenario by scenario, as
//! gRPC C-core's override-host end-to-end tests check it (gRFCs A55, A60,
//! A61, A75): an UNHEALTHY endpoint losing its sessions, weighted clusters
//! with the cluster in the cookie, a cookie whose cluster left the route or
//! whose host left its cluster, a route's own session config, sessions
//! through an aggregate cluster, and session picks that queue while their
//! endpoint connects. ADS fixture, real tonic backends, a real channel.

mod channel_support;
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use channel_support::*;
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::google::protobuf::Any;
use tether_core::cookie::{Format, SessionCookie};
use tether_testkit::grpc::GrpcBackend;
use tokio::time::Instant;
use xds_support::{Fixture, Mode};

/// How long a test waits for an update to take effect.
const WAIT: Duration = Duration::from_secs(10);

/// A Set-Cookie's name and the session its value names.
fn session_of(set_cookie: &str) -> (String, SessionCookie) {
    let pair = pair(set_cookie);
    let (name, value) = pair.split_once('=').unwrap();
    let decoded = tether_core::cookie::decode(value, &tether_core::KeyRing::empty())
        .unwrap_or_else(|e| panic!("{set_cookie:?}: {e:?}"));
    (name.to_owned(), decoded.cookie)
}

/// C-core's cookie value (`addr;cluster` in base64) for `addr` in `cluster`.
fn c_core_value(addr: SocketAddr, cluster: &str) -> String {
    let mut c = SessionCookie::new(tether_core::address::AddressList::one(addr));
    c.cluster = Some(cluster.into());
    tether_core::cookie::encode(&c, Format::Grpc, None).unwrap()
}

/// Puts the session listener (cookie `grpc-session`, path `/`, ttl 60 s),
/// `routes`, `clusters` and `endpoints` in the fixture and pushes them.
fn serve_session(f: &Fixture, routes: Vec<rpb::Route>, clusters: Vec<Any>, endpoints: Vec<Any>) {
    f.set_resources(
        LDS,
        vec![session_listener(TARGET, "routes", "grpc-session", 60)],
    );
    f.set_resources(RDS, vec![route_config(routes)]);
    f.set_resources(CDS, clusters);
    f.set_resources(EDS, endpoints);
    for t in [LDS, RDS, CDS, EDS] {
        f.push(t);
    }
}

async fn backends(names: &[&str]) -> Vec<GrpcBackend> {
    let mut out = Vec::new();
    for n in names {
        out.push(GrpcBackend::start(n).await);
    }
    out
}

/// Serves the session listener with one route to cluster `c` over
/// `localities`.
fn serve_c(f: &Fixture, localities: Vec<Loc>) {
    serve_session(
        f,
        vec![route("/", "c")],
        vec![cluster("c")],
        vec![eds("c", localities, &[])],
    );
}

/// The ADS fixture serving the session listener with one route split 1:1
/// between clusters `c1` and `c2`, over those backends.
async fn serve_weighted(c1: &[GrpcBackend], c2: &[GrpcBackend]) -> Fixture {
    let f = Fixture::start(Mode::Serve).await;
    serve_session(
        &f,
        vec![route_weighted("/", &[("c1", 1), ("c2", 1)])],
        vec![cluster("c1"), cluster("c2")],
        vec![
            eds("c1", vec![Loc::of(&addrs(c1))], &[]),
            eds("c2", vec![Loc::of(&addrs(c2))], &[]),
        ],
    );
    f
}

fn addrs(bs: &[GrpcBackend]) -> Vec<SocketAddr> {
    bs.iter().map(|b| b.addr()).collect()
}

fn addr_of(bs: &[GrpcBackend], name: &str) -> SocketAddr {
    bs.iter().find(|b| b.name() == name).unwrap().addr()
}

/// Calls with `cookie` until a backend other than `from` answers (bounded
/// by [`WAIT`]): that backend and its Set-Cookie values.
async fn until_moved(ch: &tether::Channel, cookie: &str, from: &str) -> (String, Vec<String>) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (b, set) = echo_cookie(ch, Some(cookie)).await.unwrap();
        if b != from {
            return (b, set);
        }
        assert!(Instant::now() < deadline, "the session never left {from}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Calls without a cookie until `want` answers (bounded by [`WAIT`]): its
/// Set-Cookie values.
async fn session_on(ch: &tether::Channel, want: &str) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let (b, set) = echo_cookie(ch, None).await.unwrap();
        if b == want {
            return set;
        }
        assert!(Instant::now() < deadline, "no session landed on {want}");
    }
}

/// Asserts `n` calls with `cookie` all land on `backend` without a new
/// cookie.
async fn assert_pinned(ch: &tether::Channel, cookie: &str, backend: &str, n: usize) {
    for i in 0..n {
        let (b, set) = echo_cookie(ch, Some(cookie)).await.unwrap();
        assert_eq!(b, backend, "call {i} with {cookie}");
        assert!(set.is_empty(), "a pinned call gets no cookie: {set:?}");
    }
}

/// Calls without a cookie until every one of `want` has answered
/// (bounded by [`WAIT`]), none but them.
async fn spread_over(ch: &tether::Channel, want: &[&str]) {
    let deadline = Instant::now() + WAIT;
    let mut seen = HashSet::new();
    while seen.len() < want.len() {
        let (b, _) = echo_cookie(ch, None).await.unwrap();
        assert!(
            want.contains(&b.as_str()),
            "{b} answered, not one of {want:?}"
        );
        seen.insert(b);
        assert!(
            Instant::now() < deadline,
            "only {seen:?} of {want:?} answered"
        );
    }
}

#[tokio::test]
async fn an_unhealthy_endpoint_loses_its_session_to_another_with_one_new_cookie() {
    let bs = backends(&["b1", "b2", "b3"]).await;
    let f = Fixture::start(Mode::Serve).await;
    serve_session(
        &f,
        vec![route("/", "c")],
        vec![cluster("c")],
        vec![eds("c", vec![Loc::of(&addrs(&bs))], &[])],
    );
    let ch = channel(&f);
    let (first, set) = echo_cookie(&ch, None).await.unwrap();
    assert_eq!(set.len(), 1, "{set:?}");
    let cookie = pair(&set[0]);
    assert_pinned(&ch, &cookie, &first, 5).await;
    // Its endpoint goes UNHEALTHY: out of the cluster's usable endpoints
    // and out of the default override_host_status {UNKNOWN, HEALTHY}.
    let mut loc = Loc::of(&addrs(&bs));
    for (e, b) in loc.endpoints.iter_mut().zip(&bs) {
        if b.name() == first {
            e.1 = HealthStatus::Unhealthy;
        }
    }
    f.set_resources(EDS, vec![eds("c", vec![loc], &[])]);
    f.push(EDS);
    let (moved, set) = until_moved(&ch, &cookie, &first).await;
    assert_eq!(set.len(), 1, "exactly one new cookie: {set:?}");
    let (name, session) = session_of(&set[0]);
    assert_eq!(name, "grpc-session");
    assert_eq!(session.addresses.as_slice(), &[addr_of(&bs, &moved)]);
    assert_eq!(session.cluster.as_deref(), Some("c"));
    // The new cookie holds; new sessions avoid the UNHEALTHY endpoint.
    assert_pinned(&ch, &pair(&set[0]), &moved, 20).await;
    for _ in 0..20 {
        assert_ne!(echo_cookie(&ch, None).await.unwrap().0, first);
    }
}

#[tokio::test]
async fn weighted_clusters_keep_a_session_in_the_cluster_its_cookie_names() {
    let c1 = backends(&["c1-a", "c1-b"]).await;
    let c2 = backends(&["c2-a", "c2-b"]).await;
    let f = serve_weighted(&c1, &c2).await;
    let ch = channel(&f);
    let all: Vec<&GrpcBackend> = c1.iter().chain(&c2).collect();
    let addr = |name: &str| all.iter().find(|b| b.name() == name).unwrap().addr();
    // A session in each cluster: its cookie names the backend and the
    // cluster; 50 calls with it stay there (without A60 half would go to
    // the other cluster).
    for want in ["c1-a", "c2-b"] {
        let set = session_on(&ch, want).await;
        assert_eq!(set.len(), 1, "{set:?}");
        let (_, session) = session_of(&set[0]);
        assert_eq!(session.addresses.as_slice(), &[addr(want)]);
        assert_eq!(session.cluster.as_deref(), Some(&want[..2]));
        assert_pinned(&ch, &pair(&set[0]), want, 50).await;
    }
    // A cookie naming a cluster the route does not list: a weighted pick,
    // and a new cookie naming the cluster picked. In c1 the cookie's host
    // is still honoured (C-core's ClusterGoneHostStays).
    let stale = format!("grpc-session={}", c_core_value(addr("c1-a"), "gone"));
    let mut clusters = HashSet::new();
    for _ in 0..40 {
        let (b, set) = echo_cookie(&ch, Some(&stale)).await.unwrap();
        assert_eq!(set.len(), 1, "{b}: {set:?}");
        let (_, session) = session_of(&set[0]);
        assert_eq!(session.addresses.as_slice(), &[addr(&b)]);
        assert_eq!(session.cluster.as_deref(), Some(&b[..2]));
        if b.starts_with("c1") {
            assert_eq!(b, "c1-a", "the host is kept in the cluster picked");
        }
        clusters.insert(b[..2].to_owned());
    }
    assert_eq!(clusters.len(), 2, "a weighted pick: {clusters:?}");
}

#[tokio::test]
async fn a_session_whose_cluster_leaves_the_route_moves_to_the_routes_cluster() {
    let bs = backends(&["x", "y1", "y2"]).await;
    let f = Fixture::start(Mode::Serve).await;
    let endpoints = vec![
        eds("c1", vec![Loc::of(&[bs[0].addr()])], &[]),
        eds("c2", vec![Loc::of(&[bs[1].addr(), bs[2].addr()])], &[]),
    ];
    serve_session(
        &f,
        vec![route("/", "c1")],
        vec![cluster("c1"), cluster("c2")],
        endpoints,
    );
    let ch = channel(&f);
    let (first, set) = echo_cookie(&ch, None).await.unwrap();
    assert_eq!(first, "x");
    let (_, session) = session_of(&set[0]);
    assert_eq!(session.cluster.as_deref(), Some("c1"));
    let cookie = pair(&set[0]);
    // The route now sends everything to c2; x still runs, but not in c2.
    f.set_resources(RDS, vec![route_config(vec![route("/", "c2")])]);
    f.push(RDS);
    let (moved, set) = until_moved(&ch, &cookie, "x").await;
    assert!(moved.starts_with('y'), "{moved}");
    assert_eq!(set.len(), 1, "{set:?}");
    let (_, session) = session_of(&set[0]);
    assert_eq!(session.addresses.as_slice(), &[addr_of(&bs, &moved)]);
    assert_eq!(session.cluster.as_deref(), Some("c2"));
    assert_pinned(&ch, &pair(&set[0]), &moved, 20).await;
    assert_ne!(pair(&set[0]), cookie);
}

#[tokio::test]
async fn a_cookies_cluster_is_kept_when_its_host_leaves_that_cluster() {
    let c1 = backends(&["c1-a"]).await;
    let c2 = backends(&["c2-a", "c2-b"]).await;
    let f = serve_weighted(&c1, &c2).await;
    let ch = channel(&f);
    let set = session_on(&ch, "c2-a").await;
    let cookie = pair(&set[0]);
    // c2-a leaves c2 (C-core's ClusterOverrideHonoredButHostGone).
    f.set_resources(
        EDS,
        vec![
            eds("c1", vec![Loc::of(&addrs(&c1))], &[]),
            eds("c2", vec![Loc::of(&[c2[1].addr()])], &[]),
        ],
    );
    f.push(EDS);
    until_moved(&ch, &cookie, "c2-a").await;
    // Every call with the old cookie stays in c2 (the weighted pick would
    // send half to c1), on c2-b, the one host c2 still has, each with a
    // new cookie naming it.
    for _ in 0..30 {
        let (b, set) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        assert_eq!(b, "c2-b");
        assert_eq!(set.len(), 1, "{set:?}");
        let (_, session) = session_of(&set[0]);
        assert_eq!(session.addresses.as_slice(), &[c2[1].addr()]);
        assert_eq!(session.cluster.as_deref(), Some("c2"));
    }
}

/// `route` with the session filter `filter` overridden by its own cookie
/// `cookie` (no path) with `ttl_secs` (`StatefulSessionPerRoute`).
fn own_session(mut route: rpb::Route, filter: &str, cookie: &str, ttl_secs: i64) -> rpb::Route {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::{
        stateful_session_per_route::Override, StatefulSession, StatefulSessionPerRoute,
    };
    use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
    use envoy_types::pb::envoy::r#type::http::v3::Cookie;
    use tether::xds::resource::pack;
    let session = StatefulSession {
        session_state: Some(TypedExtensionConfig {
            name: "envoy.http.stateful_session.cookie".into(),
            typed_config: Some(pack(&CookieBasedSessionState {
                cookie: Some(Cookie {
                    name: cookie.to_owned(),
                    ttl: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: ttl_secs,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
            })),
        }),
        ..Default::default()
    };
    route.typed_per_filter_config.insert(
        filter.to_owned(),
        pack(&StatefulSessionPerRoute {
            r#override: Some(Override::StatefulSession(session)),
        }),
    );
    route
}

#[tokio::test]
async fn a_routes_own_session_config_wins_over_the_listeners() {
    let bs = backends(&["b1", "b2", "b3"]).await;
    let f = Fixture::start(Mode::Serve).await;
    // Calls with `x-route: own` take the route with its own cookie
    // (`route-session`, no path, ttl 42 s); the others the listener's
    // `grpc-session` (path `/`, ttl 60 s).
    serve_session(
        &f,
        vec![
            own_session(
                with_header(route("/", "c"), "x-route", "own"),
                "session",
                "route-session",
                42,
            ),
            route("/", "c"),
        ],
        vec![cluster("c")],
        vec![eds("c", vec![Loc::of(&addrs(&bs))], &[])],
    );
    let ch = channel(&f);
    let own = Some("own");
    // C-core's Set-Cookie for each, byte for byte: the route's ttl as
    // Max-Age, and no Path where the route's cookie has none.
    let (r_backend, set) = echo_cookie_routed(&ch, None, own).await.unwrap();
    let value = c_core_value(addr_of(&bs, &r_backend), "c");
    assert_eq!(
        set,
        [format!("route-session={value}; HttpOnly; Max-Age=42")]
    );
    let route_cookie = pair(&set[0]);
    let (g_backend, set) = echo_cookie_routed(&ch, None, None).await.unwrap();
    let value = c_core_value(addr_of(&bs, &g_backend), "c");
    assert_eq!(
        set,
        [format!(
            "grpc-session={value}; HttpOnly; Path=/; Max-Age=60"
        )]
    );
    // The route's cookie pins on its route.
    for _ in 0..20 {
        let (b, set) = echo_cookie_routed(&ch, Some(&route_cookie), own)
            .await
            .unwrap();
        assert_eq!(b, r_backend);
        assert!(set.is_empty(), "{set:?}");
    }
    // A listener cookie for another backend, for the cross checks.
    let deadline = Instant::now() + WAIT;
    let listener_cookie = loop {
        let (b, set) = echo_cookie_routed(&ch, None, None).await.unwrap();
        if b != r_backend {
            assert!(set[0].starts_with("grpc-session="), "{set:?}");
            break (b, pair(&set[0]));
        }
        assert!(Instant::now() < deadline, "every call on {r_backend}");
    };
    // Each route reads only its own cookie: the other one is no session
    // (round robin, and its own cookie is set).
    for (x_route, foreign, want) in [
        (own, &listener_cookie.1, "route-session="),
        (None, &route_cookie, "grpc-session="),
    ] {
        let mut seen = HashSet::new();
        for _ in 0..9 {
            let (b, set) = echo_cookie_routed(&ch, Some(foreign), x_route)
                .await
                .unwrap();
            assert_eq!(set.len(), 1, "{set:?}");
            assert!(set[0].starts_with(want), "{set:?}");
            seen.insert(b);
        }
        assert!(seen.len() > 1, "{x_route:?} honoured {foreign}: {seen:?}");
    }
    // With both cookies, each route follows its own.
    let both = format!("{}; {route_cookie}", listener_cookie.1);
    for _ in 0..10 {
        let (b, set) = echo_cookie_routed(&ch, Some(&both), own).await.unwrap();
        assert_eq!((b.as_str(), set.len()), (r_backend.as_str(), 0));
        let (b, set) = echo_cookie_routed(&ch, Some(&both), None).await.unwrap();
        assert_eq!((b.as_str(), set.len()), (listener_cookie.0.as_str(), 0));
    }
}

#[tokio::test]
async fn a_session_through_an_aggregate_cluster_follows_its_failover_with_the_aggregates_name() {
    let bs = backends(&["p1", "s1", "s2"]).await;
    let f = Fixture::start(Mode::Serve).await;
    let primary = |health: HealthStatus| {
        let mut loc = Loc::of(&[bs[0].addr()]);
        loc.endpoints[0].1 = health;
        eds("p", vec![loc], &[])
    };
    let secondary = eds("s", vec![Loc::of(&[bs[1].addr(), bs[2].addr()])], &[]);
    serve_session(
        &f,
        vec![route("/", "agg")],
        vec![aggregate("agg", &["p", "s"]), cluster("p"), cluster("s")],
        vec![primary(HealthStatus::Healthy), secondary.clone()],
    );
    let ch = channel(&f);
    // The session starts in p. Its cookie names the route's cluster, the
    // aggregate, as C-core's filter writes it (not the leaf that served).
    let (first, set) = echo_cookie(&ch, None).await.unwrap();
    assert_eq!(first, "p1");
    let (_, session) = session_of(&set[0]);
    assert_eq!(session.addresses.as_slice(), &[bs[0].addr()]);
    assert_eq!(session.cluster.as_deref(), Some("agg"));
    let cookie = pair(&set[0]);
    // p's only endpoint goes UNHEALTHY: the aggregate fails over to s, and
    // the session moves there with one new cookie.
    f.set_resources(
        EDS,
        vec![primary(HealthStatus::Unhealthy), secondary.clone()],
    );
    f.push(EDS);
    let (moved, set) = until_moved(&ch, &cookie, "p1").await;
    assert!(moved.starts_with('s'), "{moved}");
    assert_eq!(set.len(), 1, "{set:?}");
    let (_, session) = session_of(&set[0]);
    assert_eq!(session.addresses.as_slice(), &[addr_of(&bs, &moved)]);
    assert_eq!(session.cluster.as_deref(), Some("agg"));
    let s_cookie = pair(&set[0]);
    // In s the session keeps its endpoint while other calls spread over
    // both of s's.
    assert_pinned(&ch, &s_cookie, &moved, 20).await;
    spread_over(&ch, &["s1", "s2"]).await;
    // p recovers and takes the traffic back. As in C-core (A75: one
    // xds_override_host per underlying cluster, under the aggregate's
    // priority policy), p's policy does not know s's endpoints, so the
    // session follows the traffic back to p, with a new cookie.
    f.set_resources(EDS, vec![primary(HealthStatus::Healthy), secondary.clone()]);
    f.push(EDS);
    until_backend(&ch, "p1").await;
    let (b, set) = echo_cookie(&ch, Some(&s_cookie)).await.unwrap();
    assert_eq!(b, "p1");
    assert_eq!(set.len(), 1, "{set:?}");
    let (_, session) = session_of(&set[0]);
    assert_eq!(session.addresses.as_slice(), &[bs[0].addr()]);
    assert_eq!(session.cluster.as_deref(), Some("agg"));
    assert_pinned(&ch, &pair(&set[0]), "p1", 10).await;
}

/// A TCP front for a backend that accepts connections at once but relays
/// nothing until opened: a subchannel to it stays CONNECTING (TCP up, no
/// HTTP/2 SETTINGS yet) for as long as the test keeps it shut.
struct Gate {
    addr: SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    async fn start(backend: SocketAddr) -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, rx) = tokio::sync::watch::channel(false);
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            // Dropped with the task: every relayed connection closes.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut rx = rx.clone();
                conns.spawn(async move {
                    if rx.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Gate {
            addr,
            open,
            accepted,
            task,
        }
    }

    fn open(&self) {
        self.open.send_replace(true);
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits (bounded by [`WAIT`]) until a connection to it is held.
    async fn until_accepted(&self) {
        let deadline = Instant::now() + WAIT;
        while self.accepted() == 0 {
            assert!(Instant::now() < deadline, "nothing connected to the gate");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A call running in its own task: the backend and its Set-Cookie values.
type PendingCall = tokio::task::JoinHandle<Result<(String, Vec<String>), tonic::Status>>;

/// `n` calls with `cookie` started at once, each in its own task.
fn spawn_calls(ch: &tether::Channel, cookie: &str, n: usize) -> Vec<PendingCall> {
    (0..n)
        .map(|_| {
            let (ch, cookie) = (ch.clone(), cookie.to_owned());
            tokio::spawn(async move { echo_cookie(&ch, Some(&cookie)).await })
        })
        .collect()
}

/// Calls in flight on the channel's subchannels.
async fn in_flight(ch: &tether::Channel) -> u64 {
    fn walk(p: &tether::lb::PolicyStats) -> u64 {
        p.endpoints.iter().map(|e| e.calls_in_flight).sum::<u64>()
            + p.children.iter().map(walk).sum::<u64>()
    }
    walk(&ch.stats().await.expect("stats").tree)
}

/// Checks the session calls are still queued while the channel serves
/// others, opens the gate, and checks they all complete on `backend`
/// with no new cookie.
async fn held_then_released(
    ch: &tether::Channel,
    calls: Vec<PendingCall>,
    gate: &Gate,
    backend: &GrpcBackend,
) {
    // Until a pick that went elsewhere has finished (one that failed did at
    // once). Stats are answered by the channel's LB task: by the time this
    // task runs again, the session calls, woken by every picker published
    // before, have picked again (one-thread runtime: woken tasks run in
    // order), so the next looks count any call they sent.
    in_flight(ch).await;
    let deadline = Instant::now() + WAIT;
    while in_flight(ch).await > 0 {
        assert!(Instant::now() < deadline, "calls still in flight");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for c in &calls {
        assert!(
            !c.is_finished(),
            "a session call did not wait for its endpoint"
        );
    }
    assert_eq!(backend.hits(), 0);
    gate.open();
    let n = calls.len();
    for c in calls {
        let (b, set) = tokio::time::timeout(WAIT, c)
            .await
            .expect("a queued session call never resumed")
            .unwrap()
            .unwrap();
        assert_eq!(b, backend.name());
        assert!(set.is_empty(), "the cookie still names it: {set:?}");
    }
    assert_eq!(backend.hits(), n as u64);
}

#[tokio::test]
async fn session_picks_queued_while_their_endpoint_connects_resume_there() {
    let bs = backends(&["b1", "b2", "b3"]).await;
    let gate = Gate::start(bs[1].addr()).await;
    let f = Fixture::start(Mode::Serve).await;
    serve_c(&f, vec![Loc::of(&[bs[0].addr(), gate.addr, bs[2].addr()])]);
    // A fresh channel whose first calls carry a cookie for b2 (behind the
    // gate, so its subchannel stays CONNECTING).
    let ch = channel(&f);
    let cookie = format!("grpc-session={}", c_core_value(gate.addr, "c"));
    let calls = spawn_calls(&ch, &cookie, 5);
    // Meanwhile round robin serves calls without a session on b1 and b3:
    // the session calls could have been picked, had they not queued.
    spread_over(&ch, &["b1", "b3"]).await;
    gate.until_accepted().await;
    held_then_released(&ch, calls, &gate, &bs[1]).await;
}

#[tokio::test]
async fn a_session_on_an_endpoint_without_a_subchannel_has_one_made_and_waits_for_it() {
    let bs = backends(&["b1", "b2"]).await;
    let gate = Gate::start(bs[1].addr()).await;
    let f = Fixture::start(Mode::Serve).await;
    // b2 (behind the gate) is in priority 1, which never starts while b1 in
    // priority 0 is READY: no policy makes a subchannel for it but the
    // session's (A75).
    serve_c(
        &f,
        vec![
            Loc::of(&[bs[0].addr()]).zone("z0", 1),
            Loc::of(&[gate.addr]).priority(1).zone("z1", 1),
        ],
    );
    let ch = channel(&f);
    let cookie = format!("grpc-session={}", c_core_value(gate.addr, "c"));
    let calls = spawn_calls(&ch, &cookie, 5);
    for _ in 0..10 {
        assert_eq!(echo_cookie(&ch, None).await.unwrap().0, "b1");
    }
    // The session asked for the connection.
    gate.until_accepted().await;
    held_then_released(&ch, calls, &gate, &bs[1]).await;
    // Calls without a session still stay in priority 0.
    for _ in 0..10 {
        assert_eq!(echo_cookie(&ch, None).await.unwrap().0, "b1");
    }
}
