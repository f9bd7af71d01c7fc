//! Endpoints written as `NAME:PORT`, resolved by tether-control from an
//! in-process DNS server (testkit's, UDP and TCP on 127.0.0.1) whose
//! records the tests change, and watched through tether's XdsClient as a
//! proxyless client sees them: the addresses arrive with the entry's
//! weight, locality and health; an address that leaves the answer is
//! DRAINING for `drainOnRemoval`, then gone, and HEALTHY again if it comes
//! back in time; NXDOMAIN counts once confirmed; a stopped or failing DNS
//! server changes nothing; only the changed ClusterLoadAssignment is
//! pushed; a name that never resolved is refused with its field. A real
//! Envoy keeps a pinned session on an address that left DNS while it
//! drains; with Envoy, `tether::Channel` and gRPC C-core on one name, each
//! keeps its session through a DNS outage and the drain, and moves once.
//!
//! Every wait is on a signal (an EDS update, the resolver's status, a
//! query counted by the DNS server), each bounded.

mod control_support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use control_support::{Control, TempDir};
use tether_control::dns::DnsStatus;
use tether_control::{ControlPlane, Reload, Reloader};
use tether_testkit::dns::{DnsServer, ResponseCode};
use tether_xds::bootstrap::Bootstrap;
use tether_xds::client::{ResourceState, Watcher, XdsClient};
use tether_xds::resource::endpoint::HealthStatus;
use tether_xds::resource::{Resource, ResourceKind};

const NAME: &str = "api.tether.test";
const PORT: u16 = 9000;
/// Long enough to see DRAINING and bring an address back inside it while
/// names refresh every 50 to 100 ms; short enough for a quick test.
const DRAIN: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(20);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A file with service `api` on the name and `fixed` on an IP.
fn yaml(dns: SocketAddr, name: &str) -> String {
    format!(
        r#"dns:
  servers: ["{dns}"]
  minRefresh: 0.05s
  maxRefresh: 0.1s
  drainOnRemoval: {drain}s
  timeout: 0.2s
services:
  - name: api
    localityWeights: {{ us/a: 2 }}
    endpoints:
      - address: {name}:{PORT}
        locality: us/a
        weight: 3
  - name: fixed
    endpoints:
      - address: 127.0.0.1:9001
"#,
        drain = DRAIN.as_secs()
    )
}

/// The endpoints of a watched ClusterLoadAssignment: address → (health,
/// weight, locality region/zone).
fn endpoints(s: &ResourceState) -> BTreeMap<SocketAddr, (HealthStatus, u32, String)> {
    let Some(Resource::Endpoints(eds)) = &s.resource else {
        return BTreeMap::new();
    };
    eds.endpoints()
        .map(|(_, l, e)| {
            (
                e.addresses[0],
                (
                    e.health,
                    e.weight,
                    format!("{}/{}", l.locality.region, l.locality.zone),
                ),
            )
        })
        .collect()
}

/// Just the health of each address.
fn health(s: &ResourceState) -> BTreeMap<String, HealthStatus> {
    endpoints(s)
        .into_iter()
        .map(|(a, (h, _, _))| (a.ip().to_string(), h))
        .collect()
}

fn expect(pairs: &[(&str, HealthStatus)]) -> BTreeMap<String, HealthStatus> {
    pairs.iter().map(|(a, h)| (a.to_string(), *h)).collect()
}

/// Waits until the watched resource's health map is `want`.
async fn until_health(w: &mut Watcher, want: &[(&str, HealthStatus)], what: &str) -> ResourceState {
    let want = expect(want);
    match tokio::time::timeout(WAIT, w.wait_for(|s| health(s) == want)).await {
        Ok(Some(s)) => s,
        _ => panic!("{what}: wanted {want:?}, have {:?}", health(&w.current())),
    }
}

/// Waits until the resolver's status of NAME satisfies `pred`.
async fn until_status(
    status: &mut tokio::sync::watch::Receiver<DnsStatus>,
    what: &str,
    pred: impl Fn(&tether_control::dns::NameReport) -> bool,
) {
    let done = tokio::time::timeout(WAIT, status.wait_for(|s| s.get(NAME).is_some_and(&pred)))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(done, "{what}: status {:?}", status.borrow().get(NAME));
}

fn bootstrap(addr: SocketAddr) -> Bootstrap {
    Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{addr}","channel_creds":[{{"type":"insecure"}}],"server_features":["xds_v3"]}}],"node":{{"id":"dns-test","cluster":"tether-test"}}}}"#
    ))
    .unwrap()
}

/// tether-control in this process: the file at `path` served over ADS on
/// a free port, its reloader running; returns the plane, the address and
/// the resolver's status.
async fn serve(
    path: &Path,
) -> (
    ControlPlane,
    SocketAddr,
    tokio::sync::watch::Receiver<DnsStatus>,
) {
    let p = path.to_owned();
    // The first resolution waits on a thread of its own; keep this
    // runtime's workers free for the DNS server.
    let (plane, reloader) = tokio::task::spawn_blocking(move || Reloader::start(&p))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("start: {e}"));
    let status = reloader.dns_status();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = plane.clone();
    tokio::spawn(async move { served.serve(listener, std::future::pending()).await });
    tokio::spawn(reloader.run(Duration::from_millis(50), |r| {
        if let Reload::Rejected(e) = r {
            log::warn!("rejected: {e}");
        }
    }));
    (plane, addr, status)
}

fn write(dir: &TempDir, text: &str) -> PathBuf {
    let path = dir.0.join("tether.yaml");
    let tmp = dir.0.join("tether.yaml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_is_served_drains_comes_back_and_outlives_dns_trouble() {
    tether_testkit::init_logging();
    let mut dns = DnsServer::start().await;
    dns.set(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    let dir = TempDir::new("dns");
    let path = write(&dir, &yaml(dns.addr(), NAME));
    let (plane, addr, mut status) = serve(&path).await;
    let client = XdsClient::start(bootstrap(addr)).unwrap();
    let mut api = client.watch(ResourceKind::Endpoints, "api");
    let mut fixed = client.watch(ResourceKind::Endpoints, "fixed");

    // Both addresses, each with the entry's weight, locality and health.
    let s = until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Healthy),
            ("127.0.0.3", HealthStatus::Healthy),
        ],
        "first answer",
    )
    .await;
    let e = endpoints(&s);
    assert!(e.values().all(|(_, w, l)| *w == 3 && l == "us/a"), "{e:?}");
    assert!(e.keys().all(|a| a.port() == PORT), "{e:?}");
    let Some(Resource::Endpoints(eds)) = &s.resource else {
        unreachable!()
    };
    assert_eq!(eds.priorities[0].localities[0].weight, 2);
    let fixed_version = fixed
        .wait_for(|s| s.resource.is_some())
        .await
        .unwrap()
        .resource_version;

    // 127.0.0.3 leaves the answer: DRAINING for drainOnRemoval, then gone.
    dns.set(NAME, &[ip("127.0.0.2")]);
    until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Healthy),
            ("127.0.0.3", HealthStatus::Draining),
        ],
        "127.0.0.3 draining",
    )
    .await;
    let draining_since = Instant::now();
    until_health(
        &mut api,
        &[("127.0.0.2", HealthStatus::Healthy)],
        "127.0.0.3 removed",
    )
    .await;
    let drained = draining_since.elapsed();
    assert!(
        drained >= DRAIN - Duration::from_millis(300),
        "removed {drained:?} after DRAINING, before drainOnRemoval"
    );

    // Back in the answer: a new endpoint. Leaves, comes back in the
    // window: HEALTHY again.
    dns.set(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Healthy),
            ("127.0.0.3", HealthStatus::Healthy),
        ],
        "127.0.0.3 back",
    )
    .await;
    dns.set(NAME, &[ip("127.0.0.2")]);
    until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Healthy),
            ("127.0.0.3", HealthStatus::Draining),
        ],
        "127.0.0.3 draining again",
    )
    .await;
    let left = Instant::now();
    dns.set(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Healthy),
            ("127.0.0.3", HealthStatus::Healthy),
        ],
        "127.0.0.3 back within the window",
    )
    .await;
    assert!(
        left.elapsed() < DRAIN,
        "the test was too slow to come back within the window"
    );

    // Only the changed ClusterLoadAssignment was pushed: `fixed` keeps the
    // version it first came in.
    assert_eq!(fixed.current().resource_version, fixed_version);
    assert!(plane.snapshot().version >= 5);

    // The DNS server stops answering (sockets closed), then answers
    // SERVFAIL: the addresses stay, the failures are counted, and the
    // resource keeps its version.
    let before = api.current();
    let mut history = api.receiver();
    history.borrow_and_update();
    dns.stop().await;
    until_status(&mut status, "an outage of 3 failed resolutions", |n| {
        n.in_outage && n.failures >= 3
    })
    .await;
    dns.resume().await.unwrap();
    dns.fail(Some(ResponseCode::ServFail));
    assert!(dns.wait_queries(4, WAIT).await, "no SERVFAIL answered");
    let failures = status.borrow().get(NAME).map_or(0, |n| n.failures);
    until_status(&mut status, "SERVFAILs counted", |n| {
        n.failures >= failures + 2
    })
    .await;
    assert!(
        !history.has_changed().unwrap(),
        "the endpoints changed during DNS trouble: {:?}",
        health(&api.current())
    );
    assert_eq!(api.current().resource_version, before.resource_version);
    dns.fail(None);
    until_status(&mut status, "answers again", |n| !n.in_outage).await;
    assert_eq!(health(&api.current()), health(&before));

    // NXDOMAIN once changes nothing; confirmed, every address drains;
    // back in time, HEALTHY again.
    dns.remove(NAME);
    until_status(&mut status, "NXDOMAIN awaiting confirmation", |n| {
        n.awaits_confirmation
    })
    .await;
    until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Draining),
            ("127.0.0.3", HealthStatus::Draining),
        ],
        "NXDOMAIN confirmed",
    )
    .await;
    dns.set(NAME, &[ip("127.0.0.3")]);
    until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Draining),
            ("127.0.0.3", HealthStatus::Healthy),
        ],
        "127.0.0.3 back after NXDOMAIN",
    )
    .await;
    until_health(
        &mut api,
        &[("127.0.0.3", HealthStatus::Healthy)],
        "127.0.0.2 removed",
    )
    .await;
    assert!(plane.nacks().is_empty(), "{:?}", plane.nacks());
}

/// The endpoints `plane` serves for `service` (its proxyless
/// ClusterLoadAssignment), by IP, with their EDS health.
fn served(plane: &ControlPlane, service: &str) -> BTreeMap<String, i32> {
    use envoy_types::pb::envoy::config::core::v3::address::Address;
    use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
    use prost::Message;
    let snapshot = plane.snapshot();
    let Some(any) = snapshot
        .resources
        .proxyless
        .get(&ResourceKind::Endpoints)
        .and_then(|r| r.get(service))
    else {
        return BTreeMap::new();
    };
    let cla = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
    cla.endpoints
        .iter()
        .flat_map(|g| &g.lb_endpoints)
        .filter_map(|e| {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                return None;
            };
            let Some(Address::SocketAddress(a)) = ep.address.as_ref()?.address.as_ref() else {
                return None;
            };
            Some((a.address.clone(), e.health_status))
        })
        .collect()
}

/// Polls `f` every 20 ms until it gives something (bounded by WAIT).
async fn until<T>(what: &str, f: impl Fn() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(start.elapsed() < WAIT, "{what}: not within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `drain: {removeWhenIdle}` ends a DNS drain early: an address that left
/// the answer, idle (no client holds `api`, so nobody can use it), leaves
/// EDS removeWhenIdle into its drain while the name still lists it as
/// draining for drainOnRemoval; when that window ends nothing is served
/// again (the version stays). Back in the answer, it is served HEALTHY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_removal_ends_the_drain_of_an_address_that_left_dns() {
    const REMOVE_WHEN_IDLE: Duration = Duration::from_millis(500);
    use envoy_types::pb::envoy::config::core::v3::HealthStatus as Eds;
    const HEALTHY: i32 = Eds::Healthy as i32;
    const DRAINING: i32 = Eds::Draining as i32;
    tether_testkit::init_logging();
    let dns = DnsServer::start().await;
    dns.set(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    let dir = TempDir::new("dns-idle");
    let path = write(
        &dir,
        &format!(
            r#"dns:
  servers: ["{}"]
  minRefresh: 0.05s
  maxRefresh: 0.1s
  drainOnRemoval: 3s
  timeout: 0.2s
services:
  - name: api
    loadReporting: {{ interval: 0.2s }}
    drain: {{ removeWhenIdle: 0.5s }}
    endpoints:
      - address: {NAME}:{PORT}
"#,
            dns.addr()
        ),
    );
    let (plane, _, mut status) = serve(&path).await;
    let both = BTreeMap::from([
        ("127.0.0.2".to_owned(), HEALTHY),
        ("127.0.0.3".to_owned(), HEALTHY),
    ]);
    assert_eq!(served(&plane, "api"), both);

    let left = Instant::now();
    dns.set(NAME, &[ip("127.0.0.2")]);
    until("127.0.0.3 DRAINING", || {
        (served(&plane, "api").get("127.0.0.3") == Some(&DRAINING)).then_some(())
    })
    .await;
    let removed = until("127.0.0.3 removed", || {
        plane
            .drain_status()
            .endpoints
            .into_iter()
            .find(|e| e.address == format!("127.0.0.3:{PORT}") && e.removed)
    })
    .await;
    let removed_after = left.elapsed();
    assert!(removed_after >= REMOVE_WHEN_IDLE, "{removed_after:?}");
    assert_eq!(removed.removed_because.as_deref(), Some("idle for 0.500s"));
    assert_eq!(removed.verdict, "idle");
    // The status says removed as the removal is decided; the snapshot
    // without it is published right after.
    let healthy_only = BTreeMap::from([("127.0.0.2".to_owned(), HEALTHY)]);
    until("127.0.0.3 out of EDS", || {
        (served(&plane, "api") == healthy_only).then_some(())
    })
    .await;
    let version = plane.snapshot().version;
    // The name still lists it draining: the removal ended the drain early.
    let draining_in_dns = |n: &tether_control::dns::NameReport| {
        n.addresses
            .iter()
            .any(|a| a.ip == ip("127.0.0.3") && a.draining)
    };
    assert!(
        status.borrow().get(NAME).is_some_and(draining_in_dns),
        "{:?}",
        status.borrow().get(NAME)
    );
    // drainOnRemoval ends: the name drops it, nothing is served anew.
    until_status(&mut status, "127.0.0.3 gone from the name", |n| {
        !n.addresses.iter().any(|a| a.ip == ip("127.0.0.3"))
    })
    .await;
    assert_eq!(plane.snapshot().version, version);
    assert!(
        plane.drain_status().endpoints[0].removed,
        "still shown as removed"
    );

    // Back in the answer: served HEALTHY, no longer shown as removed.
    dns.set(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    until("127.0.0.3 back", || {
        (served(&plane, "api") == both).then_some(())
    })
    .await;
    assert!(plane.drain_status().endpoints.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_never_resolved_is_refused_with_its_field_and_answer() {
    tether_testkit::init_logging();
    let mut dns = DnsServer::start().await;
    dns.set(NAME, &[ip("127.0.0.2")]);
    let dir = TempDir::new("dns-refused");
    let unknown = yaml(dns.addr(), "nowhere.tether.test");
    let path = write(&dir, &unknown);
    let p = path.clone();
    let e = tokio::task::spawn_blocking(move || Reloader::start(&p))
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with(&format!(
            "tether.yaml: services[0].endpoints[0].address: \"nowhere.tether.test:{PORT}\" does \
             not resolve: {} answered NXDOMAIN (no such name) at line 11 column 18",
            dns.addr()
        )),
        "{e}"
    );

    // A name without address records, and a server that does not answer.
    dns.set("empty.tether.test", &[]);
    let path = write(&dir, &yaml(dns.addr(), "empty.tether.test"));
    let p = path.clone();
    let e = tokio::task::spawn_blocking(move || Reloader::start(&p))
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"empty.tether.test:9000\" does not resolve: "),
        "{e}"
    );
    assert!(
        e.contains(" answered no A or AAAA records at line 11"),
        "{e}"
    );
    let addr = dns.addr();
    dns.stop().await;
    let path = write(&dir, &yaml(addr, NAME));
    let p = path.clone();
    let e = tokio::task::spawn_blocking(move || Reloader::start(&p))
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "\"{NAME}:9000\" does not resolve: {addr} answered no answer: "
        )),
        "{e}"
    );
    dns.resume().await.unwrap();

    // Served, then a new file with an unknown name: rejected, the last
    // good version still served.
    let p = path.clone();
    let (plane, mut reloader) = tokio::task::spawn_blocking(move || Reloader::start(&p))
        .await
        .unwrap()
        .unwrap();
    let version = plane.snapshot().version;
    write(&dir, &unknown);
    let (outcome, _) = tokio::task::spawn_blocking(move || (reloader.reload(), reloader))
        .await
        .unwrap();
    let Reload::Rejected(e) = outcome else {
        panic!("accepted a name that does not resolve: {outcome:?}")
    };
    assert!(
        e.to_string()
            .contains("\"nowhere.tether.test:9000\" does not resolve"),
        "{e}"
    );
    assert_eq!(plane.snapshot().version, version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_a_name_and_exits_on_one_that_never_resolved() {
    tether_testkit::init_logging();
    let dns = DnsServer::start().await;
    dns.set(NAME, &[ip("127.0.0.2"), ip("::1")]);
    let control = Control::start(&yaml(dns.addr(), NAME)).await;
    let client = XdsClient::start(bootstrap(control.addr)).unwrap();
    let mut api = client.watch(ResourceKind::Endpoints, "api");
    until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Healthy),
            ("::1", HealthStatus::Healthy),
        ],
        "A and AAAA through the binary",
    )
    .await;
    dns.set(NAME, &[ip("127.0.0.2")]);
    until_health(
        &mut api,
        &[
            ("127.0.0.2", HealthStatus::Healthy),
            ("::1", HealthStatus::Draining),
        ],
        "::1 draining",
    )
    .await;
    assert!(
        control
            .wait_log(
                &format!("DNS name \"{NAME}\": ::1 left the answer: DRAINING for 2s"),
                WAIT
            )
            .await,
        "{}",
        control.stderr()
    );

    let dir = TempDir::new("dns-exit");
    let path = write(&dir, &yaml(dns.addr(), "nowhere.tether.test"));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tether-control"))
        .arg("--config")
        .arg(&path)
        .args(["--listen", "127.0.0.1:0"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(WAIT, out).await.unwrap().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "services[0].endpoints[0].address: \"nowhere.tether.test:9000\" does not resolve"
        ),
        "{stderr}"
    );
}

/// Envoy's listener on `listen` and service `web` on the name's `port`
/// behind a session cookie kept on DRAINING endpoints, the name refreshed
/// every 0.05 s to 0.1 s from `dns` and drained for `drain_s` seconds.
fn web_yaml(dns: SocketAddr, listen: u16, port: u16, drain_s: u64, ttl_s: u64) -> String {
    format!(
        r#"dns:
  servers: ["{dns}"]
  minRefresh: 0.05s
  maxRefresh: 0.1s
  drainOnRemoval: {drain_s}s
  timeout: 0.2s
listener:
  port: {listen}
virtualhosts:
  - name: web
    domains: ["*"]
    routes:
      - services: [{{ name: web }}]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: session, path: /, ttl: {ttl_s}s }}
            overrideHostStatus: [UNKNOWN, HEALTHY, DRAINING]
services:
  - name: web
    endpoints:
      - address: {NAME}:{port}
"#
    )
}

/// Waits until Envoy's `listener` answers; panics with both logs after
/// [`WAIT`].
async fn until_envoy_serves(
    listener: SocketAddr,
    control: &Control,
    envoy: &tether_testkit::envoy::Envoy,
) {
    let up = tether_testkit::wait_until(WAIT, || async {
        through_envoy(listener, None).await.is_some()
    })
    .await;
    assert!(
        up,
        "Envoy did not serve\n{}\n{}",
        control.stderr(),
        envoy.log()
    );
}

/// The backend that answered, and its Set-Cookie, through Envoy.
async fn through_envoy(
    listener: SocketAddr,
    cookie: Option<&str>,
) -> Option<(String, Option<String>)> {
    let headers: Vec<(&str, &str)> = cookie.map(|c| vec![("cookie", c)]).unwrap_or_default();
    let r = tether_testkit::client::get(listener, "/", &headers)
        .await
        .ok()?;
    if r.status != 200 {
        return None;
    }
    let set = r.header("set-cookie").map(str::to_owned);
    r.header("x-backend").map(|b| (b.to_owned(), set))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_keeps_a_session_on_an_address_that_left_dns_while_it_drains() {
    use tether_testkit::backend::HttpBackend;
    tether_testkit::init_logging();
    // A scaled service: two backends on one port, on two loopback addresses.
    let port = tether_testkit::free_port();
    let b2 = HttpBackend::start_on("b2", SocketAddr::new(ip("127.0.0.2"), port)).await;
    let b3 = HttpBackend::start_on("b3", SocketAddr::new(ip("127.0.0.3"), port)).await;
    let dns = DnsServer::start().await;
    dns.set(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    let listen = tether_testkit::free_port();
    let listener: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let control = Control::start(&web_yaml(dns.addr(), listen, port, 5, 60)).await;
    let envoy = tether_testkit::envoy::Envoy::start(&tether_testkit::envoy::ads_bootstrap(
        control.addr,
        "envoy-dns",
    ))
    .await
    .expect("envoy starts");
    until_envoy_serves(listener, &control, &envoy).await;

    // A session pinned to one backend.
    let (pinned, set) = through_envoy(listener, None).await.unwrap();
    let cookie = set
        .expect("a Set-Cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let (pinned_ip, other) = if pinned == "b2" {
        ("127.0.0.2", "b3")
    } else {
        ("127.0.0.3", "b2")
    };
    let other_ip = if pinned_ip == "127.0.0.2" {
        "127.0.0.3"
    } else {
        "127.0.0.2"
    };

    // Its address leaves DNS: DRAINING for 5 s. New sessions avoid it, the
    // pinned one keeps going, without a new cookie.
    dns.set(NAME, &[ip(other_ip)]);
    assert!(
        control
            .wait_log(&format!("{pinned_ip} left the answer: DRAINING"), WAIT)
            .await,
        "{}",
        control.stderr()
    );
    let avoided = tether_testkit::wait_until(Duration::from_secs(2), || async {
        let mut all = true;
        for _ in 0..6 {
            all &= through_envoy(listener, None)
                .await
                .is_some_and(|(b, _)| b == other);
        }
        all
    })
    .await;
    assert!(avoided, "new sessions still reach the draining {pinned}");
    for _ in 0..10 {
        let (b, set) = through_envoy(listener, Some(&cookie)).await.unwrap();
        assert_eq!(b, pinned, "the session left its draining backend");
        assert!(set.is_none(), "a new cookie while draining: {set:?}");
    }
    assert!(
        !control.stderr().contains(&format!("{pinned_ip} removed")),
        "the drain window ended before the pinned requests were made"
    );

    // Removed after the window: the session moves, with a fresh cookie.
    assert!(
        control
            .wait_log(&format!("{pinned_ip} removed"), WAIT)
            .await,
        "{}",
        control.stderr()
    );
    let moved = tether_testkit::wait_until(Duration::from_secs(5), || async {
        through_envoy(listener, Some(&cookie))
            .await
            .is_some_and(|(b, set)| b == other && set.is_some())
    })
    .await;
    assert!(
        moved,
        "the session did not move after its backend was removed"
    );
    assert!(control.nacks_none(), "{}", control.stderr());
    drop((b2, b3));
}

/// The `name=value` part of the first `Set-Cookie` in `set`.
fn pair_of(set: &[String]) -> Option<String> {
    set.first()
        .and_then(|s| s.split(';').next())
        .map(str::to_owned)
}

/// One Echo call through `channel` with `cookie`: the backend that
/// answered and the session cookie it set.
async fn through_channel(
    channel: &tether::Channel,
    cookie: Option<&str>,
) -> (String, Option<String>) {
    use tether_testkit::grpc::{EchoClient, EchoRequest};
    let mut request = tonic::Request::new(EchoRequest {
        message: "dns".into(),
    });
    request.set_timeout(Duration::from_secs(10));
    if let Some(c) = cookie {
        request.metadata_mut().insert("cookie", c.parse().unwrap());
    }
    let response = EchoClient::new(channel.clone())
        .echo(request)
        .await
        .unwrap_or_else(|e| panic!("the channel's call failed: {e}"));
    let set: Vec<String> = response
        .metadata()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    (response.into_inner().backend, pair_of(&set))
}

/// Envoy, `tether::Channel` and gRPC C-core, all fed by one tether-control
/// resolving one name from one DNS server, each keep a session on an
/// address while the DNS server is unreachable and while the address, left
/// out of the answer, drains; new sessions avoid it meanwhile; a new address
/// gets new sessions; once removed, each session moves once, with a fresh
/// cookie. The outage lasts 20 failed resolutions (counted by
/// tether-control's metrics): with refreshes 0.05 s to 0.1 s apart here,
/// that is as many attempts as a minute and more holds at the default
/// refresh bounds, without the test waiting a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_the_channel_and_grpcio_keep_sessions_through_dns_trouble_and_a_drain() {
    use tether_testkit::grpc::DualBackend;
    tether_testkit::init_logging();
    let port = tether_testkit::free_port();
    let backend = |name: &'static str, last: u8| async move {
        let addr = SocketAddr::new(IpAddr::from([127, 0, 0, last]), port);
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        DualBackend::start_on(name, listener)
    };
    let (b2, b3, b4) = (
        backend("b2", 2).await,
        backend("b3", 3).await,
        backend("b4", 4).await,
    );
    let mut dns = DnsServer::start().await;
    dns.set(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    let listen = tether_testkit::free_port();
    let listener: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let drain_s = 6;
    let control =
        Control::start_with_admin(&web_yaml(dns.addr(), listen, port, drain_s, 600)).await;
    let envoy = tether_testkit::envoy::Envoy::start(&tether_testkit::envoy::ads_bootstrap(
        control.addr,
        "envoy-dns-three",
    ))
    .await
    .expect("envoy starts");
    let channel = tether::Channel::builder()
        .bootstrap(Bootstrap::from_json(&control.bootstrap_json("channel-dns-three")).unwrap())
        .wait_for_ready(true)
        .connect("xds:///web")
        .unwrap();
    let dir = TempDir::new("dns-three");
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-grpcio");
    let python = tether_testkit::grpcio::python_or_install(Some(&venv))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let grpcio = tether_testkit::grpcio::Client::new(
        python,
        dir.bootstrap(&control.bootstrap_json("grpcio-dns-three")),
    );
    let ccore = async |warm: usize, calls: usize, cookie: Option<&str>| {
        grpcio
            .calls_warmed("xds:///web", warm, calls, cookie)
            .await
            .unwrap_or_else(|e| panic!("grpcio: {e}"))
    };
    until_envoy_serves(listener, &control, &envoy).await;

    // Three sessions on b2 (127.0.0.2), one per client: new sessions until
    // one lands there (round robin over two).
    let mut envoy_cookie = None;
    for _ in 0..6 {
        if let Some((b, set)) = through_envoy(listener, None).await {
            if b == "b2" {
                envoy_cookie = set.map(|s| s.split(';').next().unwrap().to_owned());
                break;
            }
        }
    }
    let envoy_cookie = envoy_cookie.expect("an Envoy session on b2");
    let mut channel_cookie = None;
    for _ in 0..6 {
        let (b, set) = through_channel(&channel, None).await;
        if b == "b2" {
            channel_cookie = set;
            break;
        }
    }
    let channel_cookie = channel_cookie.expect("a channel session on b2");
    let ccore_cookie = ccore(2, 6, None)
        .await
        .iter()
        .find(|c| c.backend == "b2")
        .and_then(|c| pair_of(&c.set_cookie))
        .expect("a C-core session on b2");
    // Every client keeps its session: `calls` requests each reach `want`
    // with no new cookie.
    let all_on = async |want: &str, calls: usize, what: &str| {
        for _ in 0..calls {
            let (b, set) = through_envoy(listener, Some(&envoy_cookie)).await.unwrap();
            assert_eq!((b.as_str(), set), (want, None), "Envoy, {what}");
            let (b, set) = through_channel(&channel, Some(&channel_cookie)).await;
            assert_eq!((b.as_str(), set), (want, None), "the channel, {what}");
        }
        for c in ccore(0, calls, Some(&ccore_cookie)).await {
            assert_eq!(c.backend, want, "C-core, {what}");
        }
    };
    all_on("b2", 5, "at the start").await;

    // The DNS server unreachable for over 20 failed resolutions: nothing
    // changes (the last good addresses stay, nobody's session moves, new
    // sessions still spread over both).
    dns.stop().await;
    let failures = async || -> u64 {
        let page = tether_testkit::client::get(control.admin.unwrap(), "/metrics", &[])
            .await
            .unwrap();
        page.body
            .lines()
            .find_map(|l| l.strip_prefix("tether_control_dns_resolution_failures "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    };
    let before = failures().await;
    let mut outage_spread = std::collections::BTreeSet::new();
    let started = Instant::now();
    while failures().await < before + 20 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "failures stay at {}",
            failures().await
        );
        let (b, set) = through_envoy(listener, Some(&envoy_cookie)).await.unwrap();
        assert_eq!(
            (b.as_str(), set),
            ("b2", None),
            "Envoy, while DNS is unreachable"
        );
        let (b, set) = through_channel(&channel, Some(&channel_cookie)).await;
        assert_eq!(
            (b.as_str(), set),
            ("b2", None),
            "the channel, while DNS is unreachable"
        );
        if let Some((b, _)) = through_envoy(listener, None).await {
            outage_spread.insert(b);
        }
    }
    all_on("b2", 3, "after 20 failed resolutions").await;
    assert_eq!(
        outage_spread.into_iter().collect::<Vec<_>>(),
        ["b2", "b3"],
        "new sessions during the outage"
    );
    assert!(
        control.stderr().contains("last good"),
        "{}",
        control.stderr()
    );

    // DNS answers again, without 127.0.0.2 and with a new 127.0.0.4: b2
    // drains (its sessions stay), new sessions go to b3 and b4 only.
    dns.set(NAME, &[ip("127.0.0.3"), ip("127.0.0.4")]);
    dns.resume().await.unwrap();
    assert!(
        control
            .wait_log("127.0.0.2 left the answer: DRAINING", WAIT)
            .await,
        "{}",
        control.stderr()
    );
    let fresh = tether_testkit::wait_until(Duration::from_secs(5), || async {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..6 {
            if let Some((b, _)) = through_envoy(listener, None).await {
                seen.insert(b);
            }
        }
        seen.into_iter().collect::<Vec<_>>() == ["b3", "b4"]
    })
    .await;
    assert!(
        fresh,
        "new Envoy sessions do not spread over b3 and b4 alone"
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        seen.insert(through_channel(&channel, None).await.0);
    }
    for c in ccore(2, 6, None).await {
        seen.insert(c.backend);
    }
    assert!(
        !seen.contains("b2"),
        "a new proxyless session on the draining b2: {seen:?}"
    );
    assert!(
        seen.contains("b4"),
        "no new proxyless session on the new b4: {seen:?}"
    );
    all_on("b2", 5, "while b2 drains").await;
    assert!(
        !control.stderr().contains("127.0.0.2 removed"),
        "the drain window ended before the sessions were checked"
    );

    // Removed: each session moves once, with a fresh cookie, to b3 or b4.
    assert!(
        control.wait_log("127.0.0.2 removed", WAIT).await,
        "{}",
        control.stderr()
    );
    let moved = tether_testkit::wait_until(Duration::from_secs(5), || async {
        through_envoy(listener, Some(&envoy_cookie))
            .await
            .is_some_and(|(b, set)| b != "b2" && set.is_some())
    })
    .await;
    assert!(moved, "the Envoy session did not move");
    let (b, set) = through_channel(&channel, Some(&channel_cookie)).await;
    assert!(
        b != "b2" && set.is_some(),
        "the channel's session: {b} {set:?}"
    );
    for c in ccore(0, 3, Some(&ccore_cookie)).await {
        assert!(
            c.backend != "b2" && !c.set_cookie.is_empty(),
            "C-core: {c:?}"
        );
    }
    assert!(control.nacks_none(), "{}", control.stderr());
    drop((b2, b3, b4));
}
