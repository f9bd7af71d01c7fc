//! Stateful session affinity in `tether::Channel` (gRFCs A55, A60, A61, A75)
//! over xDS from the ADS fixture, against real tonic backends: the stateful
//! session filter reads the cookie, `xds_override_host` keeps the session on
//! its endpoint, and the response carries C-core's cookie when it changed.

mod channel_support;
#[path = "channel_support/telemetry.rs"]
mod telemetry_support;
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::collections::HashSet;
use std::time::Duration;

use channel_support::*;
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use tether_testkit::grpc::GrpcBackend;
use xds_support::{Fixture, Mode};

fn serve_session(
    f: &Fixture,
    clusters: Vec<envoy_types::pb::google::protobuf::Any>,
    endpoints: Vec<envoy_types::pb::google::protobuf::Any>,
) {
    f.set_resources(
        LDS,
        vec![session_listener(TARGET, "routes", "grpc-session", 60)],
    );
    f.set_resources(RDS, vec![route_config(vec![route("/", "c")])]);
    f.set_resources(CDS, clusters);
    f.set_resources(EDS, endpoints);
    for t in [LDS, RDS, CDS, EDS] {
        f.push(t);
    }
}

/// A channel through the fixture writing session cookies in `format`.
fn channel_writing(f: &Fixture, format: tether_core::cookie::Format) -> tether::Channel {
    tether::Channel::builder()
        .bootstrap(xds_support::bootstrap(f.addr, NODE))
        .session_options(tether::channel::SessionOptions::new(format))
        .connect(&format!("xds:///{TARGET}"))
        .unwrap()
}

async fn three() -> [GrpcBackend; 3] {
    [
        GrpcBackend::start("b1").await,
        GrpcBackend::start("b2").await,
        GrpcBackend::start("b3").await,
    ]
}

/// Three backends in one locality of cluster `c` behind the session
/// listener, a channel, and its first call: (backends, channel, the backend
/// that answered, the Set-Cookie values).
async fn first_session(
    f: &Fixture,
    cluster: envoy_types::pb::google::protobuf::Any,
) -> ([GrpcBackend; 3], tether::Channel, String, Vec<String>) {
    let bs = three().await;
    let addrs: Vec<_> = bs.iter().map(|b| b.addr()).collect();
    serve_session(f, vec![cluster], vec![eds("c", vec![Loc::of(&addrs)], &[])]);
    let ch = channel(f);
    let (first, set) = echo_cookie(&ch, None).await.unwrap();
    (bs, ch, first, set)
}

/// The three backends' assignment with `backend`'s endpoint DRAINING.
fn draining(bs: &[GrpcBackend; 3], backend: &str) -> envoy_types::pb::google::protobuf::Any {
    let addrs: Vec<_> = bs.iter().map(|b| b.addr()).collect();
    let mut loc = Loc::of(&addrs);
    for (e, b) in loc.endpoints.iter_mut().zip(bs) {
        if b.name() == backend {
            e.1 = HealthStatus::Draining;
        }
    }
    eds("c", vec![loc], &[])
}

#[tokio::test]
async fn a_session_stays_on_its_backend_with_c_cores_cookie() {
    let f = Fixture::start(Mode::Serve).await;
    let (bs, ch, first, set) = first_session(&f, cluster("c")).await;
    assert_eq!(set.len(), 1, "{set:?}");
    let served = bs.iter().find(|b| b.name() == first).unwrap().addr();
    // C-core's cookie, byte for byte: `addr;cluster` in base64, HttpOnly,
    // Path, Max-Age from the ttl.
    let value = tether_core::cookie::encode(
        &{
            let mut c = tether_core::cookie::SessionCookie::new(
                tether_core::address::AddressList::one(served),
            );
            c.cluster = Some("c".into());
            c
        },
        tether_core::cookie::Format::Grpc,
        None,
    )
    .unwrap();
    assert_eq!(
        set[0],
        format!("grpc-session={value}; HttpOnly; Path=/; Max-Age=60")
    );
    let cookie = pair(&set[0]);
    for _ in 0..100 {
        let (backend, set) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        assert_eq!(backend, first);
        assert!(set.is_empty(), "a pinned call gets no cookie: {set:?}");
    }
    // Without the cookie calls are spread again.
    let mut seen = HashSet::new();
    for _ in 0..30 {
        seen.insert(echo_cookie(&ch, None).await.unwrap().0);
    }
    assert!(seen.len() > 1, "{seen:?}");
}

#[tokio::test]
async fn an_endpoint_removed_moves_its_sessions_with_a_new_cookie() {
    let f = Fixture::start(Mode::Serve).await;
    let (bs, ch, first, set) = first_session(&f, cluster("c")).await;
    let cookie = pair(&set[0]);
    let rest: Vec<_> = bs
        .iter()
        .filter(|b| b.name() != first)
        .map(|b| b.addr())
        .collect();
    f.set_resources(EDS, vec![eds("c", vec![Loc::of(&rest)], &[])]);
    f.push(EDS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (moved, set) = loop {
        let (b, set) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        if b != first {
            break (b, set);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session never moved"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(set.len(), 1, "the moved session gets a new cookie: {set:?}");
    let new_cookie = pair(&set[0]);
    for _ in 0..20 {
        let (b, set) = echo_cookie(&ch, Some(&new_cookie)).await.unwrap();
        assert_eq!(b, moved);
        assert!(set.is_empty());
    }
}

#[tokio::test]
async fn draining_keeps_its_sessions_when_in_the_status_set_and_takes_no_new_ones() {
    let f = Fixture::start(Mode::Serve).await;
    let statuses = [
        HealthStatus::Unknown,
        HealthStatus::Healthy,
        HealthStatus::Draining,
    ];
    let (bs, ch, first, set) = first_session(&f, cluster_override_status("c", &statuses)).await;
    let cookie = pair(&set[0]);
    // Its endpoint goes DRAINING.
    f.set_resources(EDS, vec![draining(&bs, &first)]);
    f.push(EDS);
    // New sessions avoid it once the update is in.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut seen = HashSet::new();
        for _ in 0..20 {
            seen.insert(echo_cookie(&ch, None).await.unwrap().0);
        }
        if !seen.contains(&first) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "new sessions still land on {first}"
        );
    }
    for _ in 0..30 {
        let (b, set) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        assert_eq!(
            b, first,
            "the pinned session stays on the DRAINING endpoint"
        );
        assert!(set.is_empty());
    }
}

/// `tether.client.sessions` follows the session's endpoint from HEALTHY
/// to DRAINING: one session, on the endpoint that served it, in the
/// cluster `c`; the other endpoints have none and no series.
#[tokio::test]
async fn the_sessions_gauge_shows_the_session_on_its_draining_endpoint() {
    let f = Fixture::start(Mode::Serve).await;
    let statuses = [
        HealthStatus::Unknown,
        HealthStatus::Healthy,
        HealthStatus::Draining,
    ];
    let bs = three().await;
    let addrs: Vec<_> = bs.iter().map(|b| b.addr()).collect();
    serve_session(
        &f,
        vec![cluster_override_status("c", &statuses)],
        vec![eds("c", vec![Loc::of(&addrs)], &[])],
    );
    let recorder = telemetry_support::Recorder::new();
    let ch = tether::Channel::builder()
        .bootstrap(xds_support::bootstrap(f.addr, NODE))
        .telemetry(tether::Telemetry::builder(&recorder.provider).build())
        .connect(&format!("xds:///{TARGET}"))
        .unwrap();
    let (first, set) = echo_cookie(&ch, None).await.unwrap();
    let cookie = pair(&set[0]);
    let served = bs.iter().find(|b| b.name() == first).unwrap().addr();
    let gauge = |health: &str| {
        let read = recorder.read();
        let sessions = read.get("tether.client.sessions").expect("the gauge");
        assert_eq!(sessions.unit, "{session}");
        let expected = telemetry_support::labels(&[
            ("grpc.target", &format!("xds:///{TARGET}")),
            ("grpc.lb.backend_service", "c"),
            ("tether.endpoint", &served.to_string()),
            ("tether.endpoint.health", health),
        ]);
        (
            sessions.points.len(),
            sessions.points.get(&expected).map(|p| p.0),
        )
    };
    // A session counts from its first call with the cookie.
    assert_eq!(echo_cookie(&ch, Some(&cookie)).await.unwrap().0, first);
    assert_eq!(gauge("HEALTHY"), (1, Some(1)));
    f.set_resources(EDS, vec![draining(&bs, &first)]);
    f.push(EDS);
    // The session's next calls still land there; the update is in once the
    // gauge reads DRAINING (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gauge("DRAINING") != (1, Some(1)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            gauge("DRAINING")
        );
        let (b, _) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        assert_eq!(b, first);
    }
}

#[tokio::test]
async fn draining_outside_the_status_set_moves_the_session() {
    let f = Fixture::start(Mode::Serve).await;
    let (bs, ch, first, set) = first_session(&f, cluster("c")).await;
    let cookie = pair(&set[0]);
    f.set_resources(EDS, vec![draining(&bs, &first)]);
    f.push(EDS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (b, set) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        if b != first {
            assert_eq!(set.len(), 1, "{set:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the session stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_session_keeps_its_endpoint_when_it_moves_to_another_priority() {
    let bs = three().await;
    let f = Fixture::start(Mode::Serve).await;
    // b1 in priority 0; b2 and b3 in priority 1.
    let p0 = |addrs: &[std::net::SocketAddr]| Loc::of(addrs).zone("z0", 1);
    let p1 = |addrs: &[std::net::SocketAddr]| Loc::of(addrs).priority(1).zone("z1", 1);
    serve_session(
        &f,
        vec![cluster("c")],
        vec![eds(
            "c",
            vec![p0(&[bs[0].addr()]), p1(&[bs[1].addr(), bs[2].addr()])],
            &[],
        )],
    );
    let ch = channel(&f);
    let (first, set) = echo_cookie(&ch, None).await.unwrap();
    assert_eq!(first, "b1");
    let cookie = pair(&set[0]);
    // b1 moves to priority 1 and b2 to priority 0: non-session calls go to
    // b2, the session stays on b1.
    f.set_resources(
        EDS,
        vec![eds(
            "c",
            vec![p0(&[bs[1].addr()]), p1(&[bs[0].addr(), bs[2].addr()])],
            &[],
        )],
    );
    f.push(EDS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while echo_cookie(&ch, None).await.unwrap().0 != "b2" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "priority 0 never moved to b2"
        );
    }
    for _ in 0..20 {
        let (b, set) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        assert_eq!(b, "b1");
        assert!(set.is_empty());
    }
}

#[tokio::test]
async fn a_route_can_turn_the_session_filter_off() {
    let bs = three().await;
    let addrs: Vec<_> = bs.iter().map(|b| b.addr()).collect();
    let f = Fixture::start(Mode::Serve).await;
    f.set_resources(
        LDS,
        vec![session_listener(TARGET, "routes", "grpc-session", 60)],
    );
    f.set_resources(
        RDS,
        vec![route_config(vec![
            session_disabled(route("/tether.demo.v1.Echo/", "c"), "session"),
            route("/", "c"),
        ])],
    );
    f.set_resources(CDS, vec![cluster("c")]);
    f.set_resources(EDS, vec![eds("c", vec![Loc::of(&addrs)], &[])]);
    for t in [LDS, RDS, CDS, EDS] {
        f.push(t);
    }
    let ch = channel(&f);
    // Echo calls take the first route, where the filter is off: no cookie,
    // and calls spread over every backend.
    let mut seen = HashSet::new();
    for _ in 0..30 {
        let (b, set) = echo_cookie(&ch, None).await.unwrap();
        assert!(set.is_empty(), "{set:?}");
        seen.insert(b);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

#[tokio::test]
async fn a_channel_can_write_envoys_format_and_still_reads_c_cores() {
    use tether_core::cookie::Format;
    let bs = three().await;
    let addrs: Vec<_> = bs.iter().map(|b| b.addr()).collect();
    let f = Fixture::start(Mode::Serve).await;
    serve_session(
        &f,
        vec![cluster("c")],
        vec![eds("c", vec![Loc::of(&addrs)], &[])],
    );
    let ch = channel_writing(&f, Format::Envoy);
    let (first, set) = echo_cookie(&ch, None).await.unwrap();
    // Envoy's Set-Cookie: quoted value, Max-Age, Path, HttpOnly last.
    assert!(set[0].starts_with("grpc-session=\""), "{set:?}");
    assert!(
        set[0].ends_with("\"; Max-Age=60; Path=/; HttpOnly"),
        "{set:?}"
    );
    let cookie = pair(&set[0]);
    let value = cookie.trim_start_matches("grpc-session=");
    let decoded = tether_core::cookie::decode(value, &tether_core::KeyRing::empty()).unwrap();
    assert_eq!(decoded.format, Format::Envoy);
    assert_eq!(decoded.cookie.cluster.as_deref(), Some("c"));
    for _ in 0..20 {
        let (b, set) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        assert_eq!(b, first);
        assert!(set.is_empty(), "{set:?}");
    }
    // A C-core cookie for another backend is honoured too (and, written in
    // another format, left alone: no new cookie).
    let other = bs.iter().find(|b| b.name() != first).unwrap();
    let mut c = tether_core::cookie::SessionCookie::new(tether_core::address::AddressList::one(
        other.addr(),
    ));
    c.cluster = Some("c".into());
    let grpc = tether_core::cookie::encode(&c, Format::Grpc, None).unwrap();
    let (b, set) = echo_cookie(&ch, Some(&format!("grpc-session={grpc}")))
        .await
        .unwrap();
    assert_eq!(b, other.name());
    assert!(set.is_empty(), "{set:?}");
}

#[tokio::test]
async fn a_session_survives_its_endpoint_changing_address_when_it_keeps_another() {
    // One endpoint, backend "e", listening on two addresses; another, "o".
    let e1 = GrpcBackend::start("e").await;
    let e2 = GrpcBackend::start("e").await;
    let e3 = GrpcBackend::start("e").await;
    let o = GrpcBackend::start("o").await;
    let f = Fixture::start(Mode::Serve).await;
    serve_session(
        &f,
        vec![cluster("c")],
        vec![eds_multi("c", &[&[e1.addr(), e2.addr()], &[o.addr()]])],
    );
    let ch = channel(&f);
    // Start sessions until one lands on "e": its cookie lists both addresses.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let set = loop {
        let (b, set) = echo_cookie(&ch, None).await.unwrap();
        if b == "e" {
            break set;
        }
        assert!(tokio::time::Instant::now() < deadline, "no session on e");
    };
    let cookie = pair(&set[0]);
    let value = cookie.trim_start_matches("grpc-session=");
    let decoded = tether_core::cookie::decode(value, &tether_core::KeyRing::empty()).unwrap();
    assert_eq!(
        decoded.cookie.addresses.as_slice(),
        &[e1.addr(), e2.addr()],
        "A61: the used address first, then the endpoint's others"
    );
    // The endpoint drops its first address and gains a new one.
    f.set_resources(
        EDS,
        vec![eds_multi("c", &[&[e2.addr(), e3.addr()], &[o.addr()]])],
    );
    f.push(EDS);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let set = loop {
        let (b, set) = echo_cookie(&ch, Some(&cookie)).await.unwrap();
        assert_eq!(b, "e", "the session stays on its endpoint");
        if !set.is_empty() {
            break set;
        }
        assert!(tokio::time::Instant::now() < deadline, "no new cookie");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The new cookie names the endpoint's new address list.
    let value = pair(&set[0]);
    let decoded = tether_core::cookie::decode(
        value.trim_start_matches("grpc-session="),
        &tether_core::KeyRing::empty(),
    )
    .unwrap();
    assert_eq!(decoded.cookie.addresses.as_slice(), &[e2.addr(), e3.addr()]);
    for _ in 0..10 {
        let (b, set) = echo_cookie(&ch, Some(&value)).await.unwrap();
        assert_eq!(b, "e");
        assert!(set.is_empty(), "{set:?}");
    }
}

/// One session of the drain test: its jar's client and every call's
/// (phase when sent, backend or error, Set-Cookie count).
struct DrainSession {
    jar: tether::session::CookieJar,
    client: DrainClient,
}

/// A session's client: the jar as a layer around the channel, or inside a
/// channel handle; the channel counts both kinds by their jar.
enum DrainClient {
    Layer(tether_testkit::grpc::EchoClient<tether::session::CookieJarService<tether::Channel>>),
    Handle(tether_testkit::grpc::EchoClient<tether::Channel>),
}

impl DrainSession {
    /// A session; `in_handle`: the jar inside a channel handle.
    fn new(ch: &tether::Channel, in_handle: bool) -> Self {
        use tether::session::{CookieJar, CookieJarLayer, Layer};
        use tether_testkit::grpc::EchoClient;
        let jar = CookieJar::new();
        let client = if in_handle {
            DrainClient::Handle(EchoClient::new(ch.with_cookie_jar(jar.clone())))
        } else {
            DrainClient::Layer(EchoClient::new(
                CookieJarLayer::new(jar.clone()).layer(ch.clone()),
            ))
        };
        DrainSession { jar, client }
    }

    /// One call: the backend (or the error) and how many Set-Cookie came.
    async fn call(&mut self) -> (Result<String, String>, usize) {
        let mut request = tonic::Request::new(tether_testkit::grpc::EchoRequest {
            message: "x".into(),
        });
        request.set_timeout(Duration::from_secs(20));
        let reply = match &mut self.client {
            DrainClient::Layer(c) => c.echo(request).await,
            DrainClient::Handle(c) => c.echo(request).await,
        };
        match reply {
            Ok(r) => {
                let set = r.metadata().get_all("set-cookie").iter().count();
                (Ok(r.into_inner().backend), set)
            }
            Err(e) => (Err(format!("{:?}: {}", e.code(), e.message())), 0),
        }
    }
}

/// The drain-readiness entry of `addr`, if the channel lists it.
async fn readiness(
    ch: &tether::Channel,
    addr: std::net::SocketAddr,
) -> Option<tether::channel::ClusterSessions> {
    let stats = ch.stats().await.expect("the channel answers");
    stats
        .sessions()
        .into_iter()
        .find(|s| s.sessions.address == addr)
}

/// Polls `ch`'s drain readiness until `done` holds (bounded: 10 s).
async fn readiness_until(
    ch: &tether::Channel,
    addr: std::net::SocketAddr,
    what: &str,
    done: impl Fn(Option<&tether::channel::ClusterSessions>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = readiness(ch, addr).await;
        if done(r.as_ref()) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The drain: 200 sessions, each with its own jar (half of them inside a
/// channel handle), call continuously. One
/// endpoint goes DRAINING: its sessions stay, no new session lands on it,
/// and its drain readiness counts exactly its sessions. Then it is
/// removed: its sessions move, each with one new cookie, other sessions
/// never move, no call fails, and the address leaves the readiness list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_of_200_sessions_loses_no_call() {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
    use std::sync::Arc;

    const SESSIONS: usize = 200;
    const MAX_CALLS: usize = 400;
    let bs = three().await;
    let addrs: Vec<_> = bs.iter().map(|b| b.addr()).collect();
    let f = Fixture::start(Mode::Serve).await;
    let statuses = [
        HealthStatus::Unknown,
        HealthStatus::Healthy,
        HealthStatus::Draining,
    ];
    serve_session(
        &f,
        vec![cluster_override_status("c", &statuses)],
        vec![eds("c", vec![Loc::of(&addrs)], &[])],
    );
    let ch = channel(&f);

    // Every session's first call pins it.
    let mut sessions = Vec::new();
    let mut pinned: HashMap<String, usize> = HashMap::new();
    for i in 0..SESSIONS {
        // Half the sessions keep their jar in a channel handle.
        let mut s = DrainSession::new(&ch, i % 2 == 1);
        let (backend, set) = s.call().await;
        let backend = backend.expect("first calls succeed");
        assert_eq!(set, 1, "a new session gets its cookie");
        *pinned.entry(backend.clone()).or_default() += 1;
        sessions.push((s, backend));
    }
    let (target, on_target) = pinned
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(b, n)| (b.clone(), *n))
        .unwrap();
    let target_addr = bs.iter().find(|b| b.name() == target).unwrap().addr();
    assert!(on_target > 0 && pinned.len() == 3, "{pinned:?}");

    // phase 0: all healthy; 1: target DRAINING; 2: target removed.
    let phase = Arc::new(AtomicU8::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Calls each session has completed so far.
    let made: Arc<Vec<AtomicUsize>> =
        Arc::new((0..SESSIONS).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for (i, (mut s, first)) in sessions.into_iter().enumerate() {
        let (phase, stop, made) = (phase.clone(), stop.clone(), made.clone());
        tasks.push(tokio::spawn(async move {
            let mut log = Vec::new();
            while !stop.load(Ordering::Relaxed) && log.len() < MAX_CALLS {
                let p = phase.load(Ordering::Relaxed);
                let (backend, set) = s.call().await;
                log.push((p, backend, set));
                made[i].fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (first, s.jar, log)
        }));
    }
    // Waits (bounded) until every session has completed two more calls
    // than it had when `since` was taken: one of them started after.
    let count = || -> Vec<usize> { made.iter().map(|n| n.load(Ordering::SeqCst)).collect() };
    let two_more = |since: Vec<usize>, what: &'static str| {
        let made = made.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while made
                .iter()
                .zip(&since)
                .any(|(n, s)| n.load(Ordering::SeqCst) < s + 2)
            {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: not every session made two calls"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };

    // The sessions are calling before anything changes.
    two_more(count(), "all healthy").await;
    // DRAINING: the readiness list shows it with exactly its sessions.
    f.set_resources(EDS, vec![draining(&bs, &target)]);
    f.push(EDS);
    phase.store(1, Ordering::Relaxed);
    readiness_until(&ch, target_addr, "target DRAINING", |r| {
        r.is_some_and(|r| {
            r.sessions.health == tether::lb::HealthStatus::Draining
                && r.sessions.sessions == on_target
        })
    })
    .await;
    // The channel has published the update: calls started from here see it.
    let draining = count();
    // New sessions avoid it.
    for _ in 0..30 {
        let (backend, _) = DrainSession::new(&ch, false).call().await;
        assert_ne!(backend.unwrap(), target, "a new session landed on DRAINING");
    }
    // Every session has called while its endpoint was DRAINING.
    two_more(draining, "target DRAINING").await;

    // Removed: its sessions move; it leaves the readiness list.
    let rest: Vec<_> = bs
        .iter()
        .filter(|b| b.name() != target)
        .map(|b| b.addr())
        .collect();
    f.set_resources(EDS, vec![eds("c", vec![Loc::of(&rest)], &[])]);
    f.push(EDS);
    phase.store(2, Ordering::Relaxed);
    readiness_until(&ch, target_addr, "target removed", |r| r.is_none()).await;
    // Every session has called since the channel published the removal.
    two_more(count(), "target removed").await;
    stop.store(true, Ordering::Relaxed);

    let mut moved = 0;
    for t in tasks {
        let (first, jar, log) = t.await.unwrap();
        let failed: Vec<_> = log.iter().filter(|(_, b, _)| b.is_err()).collect();
        assert!(
            failed.is_empty(),
            "session on {first}: failed calls {failed:?}"
        );
        let backends: Vec<&str> = log.iter().map(|(_, b, _)| b.as_deref().unwrap()).collect();
        let cookies: usize = log.iter().map(|(_, _, n)| n).sum();
        if first != target {
            assert!(
                backends.iter().all(|b| *b == first),
                "{first}: {backends:?}"
            );
            assert_eq!(cookies, 0, "{first}: a session that stays gets no cookie");
            continue;
        }
        // Before the removal: on the target. After: one move, for good.
        for (p, b, _) in &log {
            if *p < 2 {
                assert_eq!(b.as_deref().unwrap(), target, "DRAINING kept its session");
            }
        }
        let at = backends
            .iter()
            .position(|b| *b != target)
            .unwrap_or_else(|| panic!("a session on {target} never moved: {backends:?}"));
        let new = backends[at];
        assert!(
            backends[at..].iter().all(|b| *b == new),
            "moved once, for good: {backends:?}"
        );
        assert_eq!(cookies, 1, "one new cookie for the move");
        assert!(jar.get("grpc-session").is_some());
        moved += 1;
    }
    assert_eq!(moved, on_target);
    // Every session lives on the two that stay.
    let stats = ch.stats().await.unwrap();
    let total: usize = stats.sessions().iter().map(|s| s.sessions.sessions).sum();
    assert_eq!(total, SESSIONS + 30);
}

/// A plain `legacy` cookie for an endpoint whose text stock Envoy parses as
/// a protobuf (tether_core::cookie::readers): the channel writing `legacy`
/// pins it, answers with the guarded spelling every peer reads, counts each
/// such call in its stats and logs the address once.
#[tokio::test]
async fn a_legacy_cookie_stock_envoy_misreads_is_respelled_and_counted() {
    use tether_core::cookie::{self, readers, Format, KeyRing, SessionCookie};
    let f = Fixture::start(Mode::Serve).await;
    let flagged = GrpcBackend::start_on_listener(
        "flagged",
        tether_testkit::loopback_listener(|a| !readers::legacy_text_read_by_envoy(a)).await,
    )
    .await;
    let [b2, b3, _] = three().await;
    let addrs = [flagged.addr(), b2.addr(), b3.addr()];
    serve_session(
        &f,
        vec![cluster("c")],
        vec![eds("c", vec![Loc::of(&addrs)], &[])],
    );
    let ch = channel_writing(&f, Format::Legacy);
    let one = SessionCookie::new(tether_core::AddressList::one(flagged.addr()));
    let plain = cookie::encode_header(&one, Format::Legacy, None).unwrap();
    for i in 1..=3u64 {
        let (backend, set) = echo_cookie(&ch, Some(&format!("grpc-session={plain}")))
            .await
            .unwrap();
        assert_eq!(backend, "flagged");
        assert_eq!(set.len(), 1, "{set:?}");
        let value = pair(&set[0]).split_once('=').unwrap().1.to_owned();
        let d = cookie::decode(&value, &KeyRing::empty()).unwrap();
        assert_eq!(
            (d.format, d.envoy_misreads),
            (Format::Legacy, false),
            "{value}"
        );
        assert!(readers::honours(
            readers::Reader::EnvoyCookie,
            &value,
            flagged.addr(),
            0
        ));
        assert_eq!(ch.stats().await.unwrap().session_cookies_envoy_misreads, i);
        // The respelled cookie pins with no new one and is not counted.
        let (backend, set) = echo_cookie(&ch, Some(&format!("grpc-session={value}")))
            .await
            .unwrap();
        assert_eq!((backend.as_str(), set.len()), ("flagged", 0));
    }
    assert_eq!(ch.stats().await.unwrap().session_cookies_envoy_misreads, 3);
}
