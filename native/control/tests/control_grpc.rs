//! tether-control against gRPC C-core: a Python `grpcio` client with an
//! `xds:///` target and a bootstrap pointing at the `tether-control` binary
//! reaches tonic Echo backends through tether-control's proxyless resources
//! (ApiListener, routes, clusters, endpoints), and C-core's stateful session
//! cookie (A55/A60) pins calls to one backend. Through aggregate services on
//! two levels C-core fails over from the primary to the fallback to the spare.
//! Session cookies crossing between C-core, `tether::Channel` and Envoy (its
//! own filter and the tether plugin) are `wasm-tests/tests/interop_matrix.rs`.
//!
//! The client is testkit's `grpcio` peer: python3's grpcio when it has one,
//! else grpcio installed with pip into a virtual environment under the
//! target directory the first time (one download), then reused.

mod control_support;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use control_support::{grpcio_client, session_cookie, Control, TempDir};
use tether_proto::demo::v1::echo_server::{Echo, EchoServer};
use tether_proto::demo::v1::{EchoReply, EchoRequest};
use tether_testkit::grpcio::{Call, Client};

struct Backend {
    name: String,
    addr: SocketAddr,
    served: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl Echo for Backend {
    async fn echo(
        &self,
        request: tonic::Request<EchoRequest>,
    ) -> Result<tonic::Response<EchoReply>, tonic::Status> {
        let served = self.served.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(tonic::Response::new(EchoReply {
            message: request.into_inner().message,
            backend: self.name.clone(),
            address: self.addr.to_string(),
            served,
        }))
    }
}

async fn start_backend(name: &str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let (addr, task, _) = start_counting_backend(name).await;
    (addr, task)
}

/// A backend, with the count of calls it answered.
async fn start_counting_backend(
    name: &str,
) -> (SocketAddr, tokio::task::JoinHandle<()>, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicU64::new(0));
    let svc = EchoServer::new(Backend {
        name: name.to_owned(),
        addr,
        served: served.clone(),
    });
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .serve_with_incoming(
                svc,
                tokio_stream::wrappers::TcpListenerStream::new(listener),
            )
            .await;
    });
    (addr, task, served)
}

/// `calls` calls to `target` through `client` (after warming up to `warm`
/// distinct backends), each with `cookie`; panics when the client fails.
async fn run(
    client: &Client,
    target: &str,
    warm: usize,
    calls: usize,
    cookie: Option<&str>,
) -> Vec<Call> {
    client
        .calls_warmed(target, warm, calls, cookie)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The route to the service `echo` behind C-core's session cookie, kept
/// on DRAINING endpoints (A55).
const ECHO_SESSION_ROUTE: &str = "virtualhosts:
  - name: echo.tether.test
    routes:
      - services:
          - name: echo
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: { name: grpc-session, path: /, ttl: 60s }
            overrideHostStatus: [UNKNOWN, HEALTHY, DRAINING]
            idleTimeout: 300s
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_client_reaches_backends_through_tether_control() {
    let (a1, t1) = start_backend("echo-1").await;
    let (a2, t2) = start_backend("echo-2").await;
    let yaml = format!(
        r#"{ECHO_SESSION_ROUTE}services:
  - name: echo
    protocol: h2c
    endpoints:
      - address: {a1}
      - address: {a2}
"#
    );
    let control = Control::start(&yaml).await;
    let dir = TempDir::new("grpc-bootstrap");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("grpcio-client"));
    let client = grpcio_client(&bootstrap).await;
    let target = "xds:///echo.tether.test";

    // Without a cookie: round robin over both, each reply brings a cookie.
    let calls = run(&client, target, 2, 6, None).await;
    assert_eq!(calls.len(), 6);
    let backends: HashSet<&str> = calls.iter().map(|c| c.backend.as_str()).collect();
    assert_eq!(backends, HashSet::from(["echo-1", "echo-2"]), "{calls:?}");
    let first = &calls[0];
    assert_eq!(first.set_cookie.len(), 1, "{first:?}");
    let set = &first.set_cookie[0];
    assert!(set.starts_with("grpc-session="), "{set}");
    assert!(set.ends_with("; HttpOnly; Path=/; Max-Age=60"), "{set}");
    let value = set
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("grpc-session=")
        .to_owned();
    let decoded = tether_core::cookie::decode(&value, &tether_core::KeyRing::empty())
        .expect("C-core's cookie decodes");
    assert_eq!(
        decoded.cookie.cluster.as_deref(),
        Some("echo/session"),
        "A60: the cluster is in the cookie"
    );
    assert_eq!(decoded.cookie.addresses.to_string(), first.address);
    assert!(!control.stderr().contains("NACK"), "{}", control.stderr());

    // With it: every call goes to that backend and no new cookie is set.
    let cookie = format!("grpc-session={value}");
    let pinned = run(&client, target, 0, 6, Some(&cookie)).await;
    for c in &pinned {
        assert_eq!(c.backend, first.backend, "{pinned:?}");
        assert!(c.set_cookie.is_empty(), "{c:?}");
    }
    t1.abort();
    t2.abort();
}

/// `shop` fails over from the aggregate `web` (primary, then fallback) to
/// `spare`, behind a stateful session.
fn aggregate_yaml(
    primary: &str,
    fallback: &str,
    (p1, p2, f1, s1): (SocketAddr, SocketAddr, SocketAddr, SocketAddr),
) -> String {
    format!(
        r#"virtualhosts:
  - name: echo.tether.test
    routes:
      - services:
          - name: shop
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: grpc-session, path: /, ttl: 60s }}
services:
  - name: shop
    aggregate: [web, spare]
  - name: web
    aggregate: [primary, fallback]
  - name: primary
    protocol: h2c
    endpoints:
      - {{ address: "{p1}", health: {primary} }}
      - {{ address: "{p2}", health: {primary} }}
  - name: fallback
    protocol: h2c
    endpoints:
      - {{ address: "{f1}", health: {fallback} }}
  - name: spare
    protocol: h2c
    endpoints:
      - address: "{s1}"
"#
    )
}

/// The `name=value` part of a call's Set-Cookie.
fn cookie_of(call: &Call) -> String {
    let set = call
        .set_cookie
        .first()
        .unwrap_or_else(|| panic!("no cookie: {call:?}"));
    set.split(';').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_client_fails_over_through_aggregate_services() {
    let (p1, t1) = start_backend("primary-1").await;
    let (p2, t2) = start_backend("primary-2").await;
    let (f1, t3) = start_backend("fallback").await;
    let (s1, t4) = start_backend("spare").await;
    let addrs = (p1, p2, f1, s1);
    let mut version = 1;
    let control = Control::start(&aggregate_yaml("HEALTHY", "HEALTHY", addrs)).await;
    let set = async |control: &Control, version: &mut u32, primary: &str, fallback: &str| {
        control.write(&aggregate_yaml(primary, fallback, addrs));
        *version += 1;
        assert!(
            control
                .wait_log(
                    &format!("serving version {version}"),
                    Duration::from_secs(5)
                )
                .await,
            "{}",
            control.stderr()
        );
    };
    let dir = TempDir::new("grpc-aggregate");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("grpcio-aggregate"));
    let client = grpcio_client(&bootstrap).await;
    let target = "xds:///echo.tether.test";
    let backends =
        |calls: &[Call]| -> HashSet<String> { calls.iter().map(|c| c.backend.clone()).collect() };

    // C-core accepts the nested aggregate clusters and uses the primary's
    // backends, round robin.
    let calls = run(&client, target, 2, 6, None).await;
    assert_eq!(
        backends(&calls),
        HashSet::from(["primary-1".to_owned(), "primary-2".to_owned()]),
        "{calls:?}"
    );
    assert!(control.nacks_none(), "{}", control.stderr());
    // The session cookie names the route's cluster, the aggregate (A60), and
    // pins calls to one primary backend.
    let cookie = cookie_of(&calls[0]);
    let value = cookie.trim_start_matches("grpc-session=");
    let decoded = tether_core::cookie::decode(value, &tether_core::KeyRing::empty())
        .expect("C-core's cookie decodes");
    assert_eq!(decoded.cookie.cluster.as_deref(), Some("shop/session"));
    let pinned = run(&client, target, 0, 6, Some(&cookie)).await;
    assert_eq!(
        backends(&pinned),
        HashSet::from([calls[0].backend.clone()]),
        "{pinned:?}"
    );

    // No healthy primary endpoint: the fallback, then one level up the spare.
    set(&control, &mut version, "UNHEALTHY", "HEALTHY").await;
    let calls = run(&client, target, 0, 4, Some(&cookie)).await;
    assert_eq!(
        backends(&calls),
        HashSet::from(["fallback".to_owned()]),
        "{calls:?}"
    );
    let on_fallback = cookie_of(&calls[0]);
    set(&control, &mut version, "UNHEALTHY", "UNHEALTHY").await;
    let calls = run(&client, target, 0, 4, None).await;
    assert_eq!(
        backends(&calls),
        HashSet::from(["spare".to_owned()]),
        "{calls:?}"
    );

    // Observed in grpcio 1.85: once the primary is back, a session on the
    // fallback does not stay there (the session is kept inside the cluster
    // the aggregate picks, not across its clusters).
    set(&control, &mut version, "HEALTHY", "HEALTHY").await;
    let calls = run(&client, target, 0, 4, Some(&on_fallback)).await;
    assert!(
        calls.iter().all(|c| c.backend.starts_with("primary-")),
        "{calls:?}"
    );
    assert!(control.nacks_none(), "{}", control.stderr());
    t1.abort();
    t2.abort();
    t3.abort();
    t4.abort();
}

/// gRPC C-core's ring hash (gRFC A42) over tether-control's resources picks,
/// for every key, the backend `tether_core::hash` picks with gRPC's rules,
/// and `tether::Channel` over the same file reaches it too (two localities
/// with weights, where Envoy's ring differs): a
/// header hash policy, endpoint weight × locality weight (not Envoy's
/// per-locality normalisation), localities in name order (not the order EDS
/// lists them in), and C-core's 4096-entry cap. Observed with grpcio 1.85.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_ring_hash_picks_what_core_picks_with_grpc_rules_and_so_does_the_channel() {
    use tether_core::hash::{HashPolicies, HashRequest, Host, Locality, Peer, Ring, RingConfig};

    // (name, locality, endpoint weight); us/b comes first in the file, so
    // the file's order is not the localities' name order.
    let spec = [
        ("b0", "us/b", 3),
        ("b1", "us/a", 3),
        ("b2", "us/b", 4),
        ("b3", "us/a", 2),
    ];
    // Products 3, 6, 4, 4: entries per host are not whole numbers, so the
    // host order decides which hosts get a rounded-up entry (a difference of
    // one entry in about 1,030; these 4,000 fixed keys hit it: in the file's
    // order 2 of them go elsewhere than C-core sends them).
    let locality_weight = |l: &str| if l == "us/a" { 2 } else { 1 };
    let mut endpoints = String::new();
    let mut backends = Vec::new();
    for (name, locality, weight) in spec {
        let (addr, task) = start_backend(name).await;
        endpoints.push_str(&format!(
            "      - {{ address: \"{addr}\", locality: {locality}, weight: {weight} }}\n"
        ));
        backends.push((name, locality, weight, addr, task));
    }
    let yaml = format!(
        r#"virtualhosts:
  - name: hash.tether.test
    routes:
      - services:
          - name: hashed
        loadBalancerPolicy:
          strategy: RequestHash
          requestHashPolicies:
            - headerHashOptions: {{ headerName: x-user }}
services:
  - name: hashed
    protocol: h2c
    localityWeights: {{ us/a: 2, us/b: 1 }}
    endpoints:
{endpoints}"#
    );
    let control = Control::start(&yaml).await;
    let dir = TempDir::new("grpc-ring-hash");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("grpcio-ring-hash"));
    let client = grpcio_client(&bootstrap).await;

    // Core's side, with gRPC's rules; tether-control names the localities
    // region "us", zones "a" and "b".
    let localities: Vec<Locality> = ["us/b", "us/a"]
        .iter()
        .map(|name| {
            let hosts = backends
                .iter()
                .filter(|(_, locality, ..)| locality == name)
                .map(|(_, _, weight, addr, _)| Host::from_addr(*addr, *weight));
            let (region, zone) = name.split_once('/').unwrap();
            Locality::new(locality_weight(name), hosts).named(region, zone, "")
        })
        .collect();
    let hosts = Locality::grpc_hosts(&localities).unwrap();
    let names: std::collections::HashMap<String, &str> = backends
        .iter()
        .map(|(name, _, _, addr, _)| (addr.to_string(), *name))
        .collect();
    let ring = Ring::build(hosts, &RingConfig::grpc()).unwrap();
    let policies =
        HashPolicies::from_json(r#"[{"header":{"header_name":"x-user"}}]"#, Peer::Grpc).unwrap();

    let keys: Vec<String> = (0..4000)
        .map(|i| format!("user-{i}-{}", i * 7919))
        .collect();
    let calls = client
        .keys("xds:///hash.tether.test", "x-user", &keys)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(calls.len(), keys.len());
    let mut mismatches = Vec::new();
    let mut seen = HashSet::new();
    for c in &calls {
        let key = c.key.as_deref().expect("a key per call");
        let h = policies
            .evaluate(&HashRequest::new(&[("x-user", key)]))
            .hash
            .value()
            .expect("the header hashes");
        let ours = names[ring.pick_host(h).key()];
        seen.insert(c.backend.clone());
        if c.backend != ours {
            mismatches.push(format!("{key}: grpcio {} core {ours}", c.backend));
        }
    }
    assert!(control.nacks_none(), "{}", control.stderr());
    assert!(
        mismatches.is_empty(),
        "{} of {} calls went elsewhere than core picks: {:?}",
        mismatches.len(),
        calls.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    assert_eq!(seen.len(), 4, "every backend gets keys: {seen:?}");

    // tether::Channel, same file, the first 1,000 keys: grpcio's backends.
    let channel = tether::Channel::builder()
        .bootstrap(tether_xds::Bootstrap::from_file(&bootstrap).unwrap())
        .connect("xds:///hash.tether.test")
        .unwrap();
    let mut differ = Vec::new();
    for c in calls.iter().take(1000) {
        let key = c.key.as_deref().unwrap();
        let mut client = tether_proto::demo::v1::echo_client::EchoClient::new(channel.clone());
        let mut request = tonic::Request::new(EchoRequest {
            message: "x".into(),
        });
        request
            .metadata_mut()
            .insert("x-user", key.parse().unwrap());
        request.set_timeout(Duration::from_secs(10));
        let got = client.echo(request).await.unwrap().into_inner().backend;
        if got != c.backend {
            differ.push(format!("{key}: grpcio {} channel {got}", c.backend));
        }
    }
    assert!(
        differ.is_empty(),
        "{} of 1000 keys: {:?}",
        differ.len(),
        &differ[..differ.len().min(10)]
    );
    for (.., task) in backends {
        task.abort();
    }
}

/// The backends `calls` Echo calls through `tether::Channel` reached.
async fn channel_backends(channel: &tether::Channel, calls: usize) -> HashSet<String> {
    let mut client = tether_proto::demo::v1::echo_client::EchoClient::new(channel.clone());
    let mut seen = HashSet::new();
    for _ in 0..calls {
        let mut request = tonic::Request::new(EchoRequest {
            message: "x".into(),
        });
        request.set_timeout(Duration::from_secs(10));
        match client.echo(request).await {
            Ok(r) => seen.insert(r.into_inner().backend),
            Err(e) => seen.insert(format!("{:?}: {}", e.code(), e.message())),
        };
    }
    seen
}

/// Calls through the channel until `want` is all it reaches (bounded).
async fn channel_settles_on(channel: &tether::Channel, want: &HashSet<String>) -> HashSet<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = channel_backends(channel, 8).await;
        if &seen == want || tokio::time::Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Over the same tether-control file, tether's channel and gRPC C-core reach
/// the same backends at every step of a failover through aggregate services
/// on two levels (primary → fallback → spare, and back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tether_channel_fails_over_like_grpcio_through_aggregate_services() {
    let (p1, t1) = start_backend("primary-1").await;
    let (p2, t2) = start_backend("primary-2").await;
    let (f1, t3) = start_backend("fallback").await;
    let (s1, t4) = start_backend("spare").await;
    let addrs = (p1, p2, f1, s1);
    let control = Control::start(&aggregate_yaml("HEALTHY", "HEALTHY", addrs)).await;
    let dir = TempDir::new("channel-vs-grpcio");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("channel-vs-grpcio"));
    let client = grpcio_client(&bootstrap).await;
    let target = "xds:///echo.tether.test";
    let channel = tether::Channel::builder()
        .bootstrap(tether_xds::Bootstrap::from_file(&bootstrap).unwrap())
        .connect(target)
        .unwrap();
    let set =
        |names: &[&str]| -> HashSet<String> { names.iter().map(|n| (*n).to_owned()).collect() };
    let mut version = 1;
    for (primary, fallback, want) in [
        ("HEALTHY", "HEALTHY", set(&["primary-1", "primary-2"])),
        ("UNHEALTHY", "HEALTHY", set(&["fallback"])),
        ("UNHEALTHY", "UNHEALTHY", set(&["spare"])),
        ("HEALTHY", "HEALTHY", set(&["primary-1", "primary-2"])),
    ] {
        if version > 1 || primary != "HEALTHY" {
            control.write(&aggregate_yaml(primary, fallback, addrs));
            version += 1;
            assert!(
                control
                    .wait_log(
                        &format!("serving version {version}"),
                        Duration::from_secs(5)
                    )
                    .await,
                "{}",
                control.stderr()
            );
        }
        let grpcio: HashSet<String> = run(&client, target, want.len(), 6, None)
            .await
            .into_iter()
            .map(|c| c.backend)
            .collect();
        let tether = channel_settles_on(&channel, &want).await;
        assert_eq!(
            grpcio, want,
            "grpcio with primary {primary}, fallback {fallback}"
        );
        assert_eq!(
            tether, grpcio,
            "tether with primary {primary}, fallback {fallback}"
        );
    }
    assert!(control.nacks_none(), "{}", control.stderr());
    for t in [t1, t2, t3, t4] {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_load_reports_make_a_draining_endpoint_busy_then_idle() {
    let (a1, t1) = start_backend("echo-1").await;
    let (a2, t2) = start_backend("echo-2").await;
    // echo-2 drains in a locality of its own: C-core reports per locality,
    // so its figures for us/b are echo-2's alone.
    let yaml = format!(
        r#"{ECHO_SESSION_ROUTE}services:
  - name: echo
    protocol: h2c
    loadReporting: {{ interval: 0.5s }}
    endpoints:
      - address: {a1}
        locality: us/a
      - address: {a2}
        locality: us/b
        health: DRAINING
"#
    );
    let control = Control::start_with_admin(&yaml).await;
    let dir = TempDir::new("grpc-drain");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("grpcio-drain"));
    let client = grpcio_client(&bootstrap).await;

    // Before any client: nobody can use it.
    control
        .until_drain(a2, "no client", |e| e["verdict"] == "idle")
        .await;

    // A session pinned to echo-2 keeps calling it while it drains (A55).
    let mut pinned = tether_core::cookie::SessionCookie::new(tether_core::AddressList::one(a2));
    pinned.cluster = Some("echo/session".to_owned());
    let value = tether_core::cookie::encode(&pinned, tether_core::Format::Grpc, None).unwrap();
    let cookie = format!("grpc-session={value}");
    let calls = {
        let client = client.clone();
        tokio::spawn(async move {
            let args: Vec<String> = [
                "--pace",
                "100",
                "xds:///echo.tether.test",
                "40",
                cookie.as_str(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            client.run(&args, None).await
        })
    };
    let busy = control
        .until_drain(a2, "C-core's session on it", |e| e["verdict"] == "busy")
        .await;
    let reporter = &busy["clients"][0];
    assert_eq!(reporter["node"], "grpcio-drain", "{busy}");
    assert_eq!(reporter["granularity"], "locality", "{busy}");
    assert!(reporter["requests"].as_u64() > Some(0), "{busy}");
    assert_eq!(busy["cluster"], "echo");
    assert_eq!(busy["health"], "DRAINING");

    let calls = calls.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(calls.len(), 40);
    assert!(calls.iter().all(|c| c.backend == "echo-2"), "{calls:?}");

    // The client is gone (its streams ended): dropped from the verdict.
    control
        .until_drain(a2, "the client left", |e| {
            e["verdict"] == "idle" && e["clients"].as_array().is_some_and(|c| c.is_empty())
        })
        .await;

    // A client that holds the cluster but does not report: unknown, never idle.
    let holder = tether_xds::XdsClient::start(
        tether_xds::bootstrap::Bootstrap::from_json(&control.bootstrap_json("tether-holder"))
            .unwrap(),
    )
    .unwrap();
    let endpoints = holder.watch(tether_xds::resource::ResourceKind::Endpoints, "echo");
    let unknown = control
        .until_drain(a2, "a holder without LRS", |e| e["verdict"] == "unknown")
        .await;
    assert_eq!(unknown["clients"][0]["node"], "tether-holder", "{unknown}");
    assert_eq!(unknown["clients"][0]["state"], "not reporting", "{unknown}");
    drop(endpoints);
    drop(holder);
    control
        .until_drain(a2, "the holder left", |e| e["verdict"] == "idle")
        .await;
    t1.abort();
    t2.abort();
}

/// The endpoints of a watched ClusterLoadAssignment and their health.
fn eds_health(
    s: &tether_xds::client::ResourceState,
) -> BTreeMap<SocketAddr, tether_xds::resource::endpoint::HealthStatus> {
    let Some(tether_xds::resource::Resource::Endpoints(eds)) = &s.resource else {
        return BTreeMap::new();
    };
    eds.endpoints()
        .map(|(_, _, e)| (e.addresses[0], e.health))
        .collect()
}

/// Waits (30 s at most) until the watched ClusterLoadAssignment satisfies
/// `want`.
async fn until_eds(
    w: &mut tether_xds::client::Watcher,
    what: &str,
    want: impl Fn(&BTreeMap<SocketAddr, tether_xds::resource::endpoint::HealthStatus>) -> bool,
) {
    let done = tokio::time::timeout(
        Duration::from_secs(30),
        w.wait_for(|s| want(&eds_health(s))),
    )
    .await
    .is_ok_and(|s| s.is_some());
    assert!(done, "{what}: EDS holds {:?}", eds_health(&w.current()));
}

/// A file with `echo` (echo-1 at `a1` in us/a, echo-2 at `a2` in us/b
/// with `health`) reporting load every 0.5 s with `drain`, and `other`.
fn drain_yaml(a1: SocketAddr, a2: SocketAddr, health: &str, drain: &str) -> String {
    format!(
        r#"{ECHO_SESSION_ROUTE}services:
  - name: echo
    protocol: h2c
    loadReporting: {{ interval: 0.5s }}
    drain: {drain}
    endpoints:
      - address: {a1}
        locality: us/a
      - address: {a2}
        locality: us/b
        health: {health}
  - name: other
    endpoints:
      - address: 127.0.0.1:9
"#
    )
}

/// `drain: {removeWhenIdle: 2s}` with C-core: a session pinned to echo-2
/// keeps it busy once the file sets it DRAINING; when the client's calls
/// go to echo-1 only (it still holds the cluster and reports), the verdict
/// turns idle, and echo-2 leaves EDS removeWhenIdle later, never sooner.
/// No call fails, every call of echo-2's session reached it, the client
/// goes on calling after the removal, and only echo's
/// ClusterLoadAssignment is pushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_idle_draining_endpoint_leaves_eds_after_remove_when_idle() {
    use tether_xds::resource::endpoint::HealthStatus;
    const REMOVE_WHEN_IDLE: Duration = Duration::from_secs(2);
    let (a1, t1, served1) = start_counting_backend("echo-1").await;
    let (a2, t2, served2) = start_counting_backend("echo-2").await;
    let drain = "{ removeWhenIdle: 2s }";
    let control = Control::start_with_admin(&drain_yaml(a1, a2, "HEALTHY", drain)).await;
    let dir = TempDir::new("grpc-remove-idle");
    let node = "grpcio-remove-idle";
    let bootstrap = dir.bootstrap(&control.bootstrap_json(node));
    let client = grpcio_client(&bootstrap).await;
    // The test watches EDS as the same node: to the verdict a node is one
    // client, whose reports (the grpcio process's) speak for it.
    let watcher = tether_xds::XdsClient::start(
        tether_xds::bootstrap::Bootstrap::from_json(&control.bootstrap_json(node)).unwrap(),
    )
    .unwrap();
    let mut echo = watcher.watch(tether_xds::resource::ResourceKind::Endpoints, "echo");
    let mut other = watcher.watch(tether_xds::resource::ResourceKind::Endpoints, "other");
    until_eds(&mut echo, "both served", |e| e.len() == 2).await;
    let other_version = other
        .wait_for(|s| s.resource.is_some())
        .await
        .unwrap()
        .resource_version;

    // 60 calls in echo-2's session, then 80 in echo-1's, 100 ms apart,
    // every failure listed.
    let keys: Vec<String> = std::iter::repeat_n(session_cookie(a2), 60)
        .chain(std::iter::repeat_n(session_cookie(a1), 80))
        .collect();
    let calls = {
        let client = client.clone();
        tokio::spawn(async move {
            let args: Vec<String> = [
                "--failures-ok",
                "--pace",
                "100",
                "--keys-header",
                "cookie",
                "xds:///echo.tether.test",
                "0",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            client.run(&args, Some(&(keys.join("\n") + "\n"))).await
        })
    };

    // While echo-2 serves the session, the file sets it DRAINING: busy.
    let start = std::time::Instant::now();
    while served2.load(Ordering::SeqCst) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no call reached echo-2"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    control.write(&drain_yaml(a1, a2, "DRAINING", drain));
    until_eds(&mut echo, "echo-2 DRAINING", |e| {
        e.get(&a2) == Some(&HealthStatus::Draining)
    })
    .await;
    control
        .until_drain(a2, "the session on echo-2", |e| e["verdict"] == "busy")
        .await;

    // The session's calls end; the client's go on to echo-1. Until echo-2
    // leaves EDS: when was it last seen busy, and was it seen idle?
    let mut last_busy = std::time::Instant::now();
    let mut idle_seen = false;
    let start = std::time::Instant::now();
    let removed_at = loop {
        let asked = std::time::Instant::now();
        let status = control.drain_of(a2).await;
        if status["removed"] == false {
            match status["verdict"].as_str() {
                Some("busy") => last_busy = asked,
                Some("idle") => idle_seen = true,
                _ => {}
            }
        }
        if !eds_health(&echo.current()).contains_key(&a2) {
            break std::time::Instant::now();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "echo-2 still in EDS: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let served_then = served1.load(Ordering::SeqCst);
    assert!(idle_seen, "echo-2 left EDS without being seen idle");
    assert!(
        removed_at - last_busy >= REMOVE_WHEN_IDLE,
        "echo-2 left EDS {:?} after it was last seen busy",
        removed_at - last_busy
    );
    let status = control.drain_of(a2).await;
    assert_eq!(status["removed"], true, "{status}");
    assert_eq!(status["removed_because"], "idle for 2s", "{status}");
    assert_eq!(status["verdict"], "idle", "{status}");
    assert!(status["idle_for_s"].as_f64() >= Some(2.0), "{status}");
    assert_eq!(status["clients"][0]["node"], node, "{status}");
    assert_eq!(
        eds_health(&echo.current()),
        BTreeMap::from([(a1, HealthStatus::Healthy)])
    );

    let calls = calls.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(calls.len(), 140);
    let failed: Vec<&Call> = calls.iter().filter(|c| !c.ok()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        calls[..60].iter().all(|c| c.backend == "echo-2"),
        "a call of echo-2's session went elsewhere: {calls:?}"
    );
    assert!(
        calls[60..].iter().all(|c| c.backend == "echo-1"),
        "{calls:?}"
    );
    assert!(
        served1.load(Ordering::SeqCst) > served_then,
        "the client stopped calling before echo-2 left EDS"
    );

    // Only echo's ClusterLoadAssignment was pushed; logged and counted.
    assert_eq!(other.current().resource_version, other_version);
    assert!(
        control.stderr().contains(&format!(
            "service \"echo\": DRAINING endpoint {a2} removed from EDS (idle for 2s)"
        )),
        "{}",
        control.stderr()
    );
    let metrics = control.metrics().await;
    assert!(
        metrics.contains("tether_control_drain_removals_total{reason=\"idle\"} 1\n"),
        "{metrics}"
    );
    assert!(control.nacks_none(), "{}", control.stderr());
    t1.abort();
    t2.abort();
}

/// `drain: {removeWhenIdle: 1s, maxDrain: 3s}` with a client that holds
/// the cluster but does not report (tether's XdsClient): the verdict stays
/// unknown, never idle, so only maxDrain removes echo-2, 3 s into its
/// drain; HEALTHY again in the file, it is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_holder_keeps_a_draining_endpoint_until_max_drain() {
    use tether_xds::resource::endpoint::HealthStatus;
    const MAX_DRAIN: Duration = Duration::from_secs(3);
    // Nobody calls them: addresses are enough.
    let a1: SocketAddr = "127.0.0.1:9101".parse().unwrap();
    let a2: SocketAddr = "127.0.0.1:9102".parse().unwrap();
    let drain = "{ removeWhenIdle: 1s, maxDrain: 3s }";
    let control = Control::start_with_admin(&drain_yaml(a1, a2, "HEALTHY", drain)).await;
    let holder = tether_xds::XdsClient::start(
        tether_xds::bootstrap::Bootstrap::from_json(&control.bootstrap_json("tether-holder"))
            .unwrap(),
    )
    .unwrap();
    let mut echo = holder.watch(tether_xds::resource::ResourceKind::Endpoints, "echo");
    until_eds(&mut echo, "both served", |e| e.len() == 2).await;

    let written = std::time::Instant::now();
    control.write(&drain_yaml(a1, a2, "DRAINING", drain));
    until_eds(&mut echo, "echo-2 DRAINING", |e| {
        e.get(&a2) == Some(&HealthStatus::Draining)
    })
    .await;
    let removed_at = loop {
        let status = control.drain_of(a2).await;
        if status["removed"] == false {
            assert_eq!(status["verdict"], "unknown", "{status}");
        }
        if !eds_health(&echo.current()).contains_key(&a2) {
            break std::time::Instant::now();
        }
        assert!(
            written.elapsed() < Duration::from_secs(30),
            "echo-2 still in EDS: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        removed_at - written >= MAX_DRAIN,
        "echo-2 left EDS {:?} after the file set it DRAINING",
        removed_at - written
    );
    let status = control.drain_of(a2).await;
    assert_eq!(status["removed"], true, "{status}");
    assert_eq!(status["removed_because"], "maxDrain 3s reached", "{status}");
    assert_eq!(status["verdict"], "unknown", "{status}");
    assert_eq!(status["clients"][0]["state"], "not reporting", "{status}");
    assert!(status["draining_for_s"].as_f64() >= Some(3.0), "{status}");
    let metrics = control.metrics().await;
    assert!(
        metrics.contains("tether_control_drain_removals_total{reason=\"max_drain\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tether_control_drain_removals_total{reason=\"idle\"} 0\n"),
        "{metrics}"
    );

    // HEALTHY in the file again: served again, no longer listed.
    control.write(&drain_yaml(a1, a2, "HEALTHY", drain));
    until_eds(&mut echo, "echo-2 back", |e| {
        e.get(&a2) == Some(&HealthStatus::Healthy)
    })
    .await;
    assert_eq!(control.drain_of(a2).await, serde_json::Value::Null);
    assert!(control.nacks_none(), "{}", control.stderr());
}
