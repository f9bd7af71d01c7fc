//! tether-control against a real Envoy 1.40: Envoy is bootstrapped with only
//! an ADS cluster pointing at the `tether-control` binary, gets its
//! listener, routes, clusters and endpoints from it, routes traffic to real
//! backends with a stateful session cookie, and follows endpoint changes
//! (add, DRAINING, remove) within a second of the file being rewritten. It
//! also fails over through aggregate services on two levels: the primary's
//! backends, the fallback's when the primary has no healthy endpoint, then
//! the spare's.

mod control_support;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use control_support::{status_client, Control};
use tether_testkit::backend::HttpBackend;
use tether_testkit::client;
use tether_testkit::client::status_load;
use tether_testkit::envoy::{ads_bootstrap, Envoy};
use tether_testkit::free_port;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tokio::time::Instant;

fn config(listen: u16, endpoints: &[(SocketAddr, &str)]) -> String {
    let mut eps = String::new();
    for (addr, health) in endpoints {
        eps.push_str(&format!(
            "      - address: {addr}\n        health: {health}\n"
        ));
    }
    format!(
        r#"listener:
  port: {listen}
virtualhosts:
  - name: web
    domains: ["*"]
    routes:
      - conditions:
          - prefix: /
        services:
          - name: web
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie:
              name: session
              path: /
              ttl: 60s
            overrideHostStatus: [UNKNOWN, HEALTHY, DRAINING]
services:
  - name: web
    endpoints:
{eps}"#
    )
}

async fn backend_of(
    listener: SocketAddr,
    cookie: Option<&str>,
) -> Option<(String, Option<String>)> {
    let headers: Vec<(&str, &str)> = cookie.map(|c| vec![("cookie", c)]).unwrap_or_default();
    let r = client::get(listener, "/", &headers).await.ok()?;
    if r.status != 200 {
        return None;
    }
    let set = r.header("set-cookie").map(str::to_owned);
    r.header("x-backend").map(|b| (b.to_owned(), set))
}

/// Starts an Envoy bootstrapped with only `control` as its ADS server and
/// waits until its listener on `listener` answers; on failure the message
/// says what Envoy did not `do`, with both logs.
async fn envoy_serving(control: &Control, listener: SocketAddr, what: &str) -> Envoy {
    let envoy = Envoy::start(&ads_bootstrap(control.addr, "envoy-under-test"))
        .await
        .expect("envoy starts");
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        backend_of(listener, None).await.is_some()
    })
    .await;
    assert!(
        up,
        "Envoy did not {what}\n--- tether-control:\n{}\n--- envoy:\n{}",
        control.stderr(),
        envoy
            .log()
            .lines()
            .filter(|l| !l.contains("statically linked extensions") && !l.contains("server.cc:467"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    envoy
}

/// Polls until `cond` holds; returns how long it took.
async fn within(limit: Duration, what: &str, mut cond: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_follows_tether_control() {
    let b1 = HttpBackend::start("b1").await;
    let b2 = HttpBackend::start("b2").await;
    let b3 = HttpBackend::start("b3").await;
    let port = free_port();
    let listener: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let control = Control::start(&config(
        port,
        &[(b1.addr(), "HEALTHY"), (b2.addr(), "HEALTHY")],
    ))
    .await;
    // Listener, routes, clusters and endpoints arrive over ADS and route traffic.
    let envoy = envoy_serving(&control, listener, "serve the listener from tether-control").await;
    let dump = envoy.admin_get("/config_dump").await.unwrap();
    for name in ["tether-ingress", "tether-routes", "web/session"] {
        assert!(
            dump.contains(name),
            "{name} missing from Envoy's config dump"
        );
    }
    let clusters = envoy.admin_get("/clusters").await.unwrap();
    assert!(clusters.contains(&b1.addr().to_string()) && clusters.contains(&b2.addr().to_string()));
    assert!(control.nacks_none(), "{}", control.stderr());

    // A stateful session: the cookie pins every request to one backend.
    let mut seen = HashSet::new();
    let mut cookie = None;
    for _ in 0..10 {
        let (b, set) = backend_of(listener, None).await.expect("served");
        seen.insert(b.clone());
        if cookie.is_none() {
            let set = set.expect("a Set-Cookie on a cookie-less request");
            assert!(set.starts_with("session=\""), "{set}");
            assert!(
                set.contains("Max-Age=60") && set.contains("Path=/"),
                "{set}"
            );
            let value = set.split(';').next().unwrap().to_owned();
            cookie = Some((b, value));
        }
    }
    assert_eq!(
        seen,
        HashSet::from(["b1".to_owned(), "b2".to_owned()]),
        "round robin over both"
    );
    let (pinned, cookie) = cookie.unwrap();
    for _ in 0..10 {
        let (b, set) = backend_of(listener, Some(&cookie)).await.unwrap();
        assert_eq!(b, pinned);
        assert!(set.is_none(), "no new cookie for a pinned request");
    }
    let (pinned_addr, other_addr, other) = if pinned == "b1" {
        (b1.addr(), b2.addr(), "b2")
    } else {
        (b2.addr(), b1.addr(), "b1")
    };

    // Add an endpoint: new traffic reaches it within a second.
    control.write(&config(
        port,
        &[
            (b1.addr(), "HEALTHY"),
            (b2.addr(), "HEALTHY"),
            (b3.addr(), "HEALTHY"),
        ],
    ));
    let took = within(
        Duration::from_secs(1),
        "the added endpoint gets traffic",
        async || {
            backend_of(listener, None)
                .await
                .is_some_and(|(b, _)| b == "b3")
        },
    )
    .await;
    eprintln!("endpoint add followed in {took:?}");

    // DRAINING: no new sessions on it, the pinned session stays.
    control.write(&config(
        port,
        &[
            (pinned_addr, "DRAINING"),
            (other_addr, "HEALTHY"),
            (b3.addr(), "HEALTHY"),
        ],
    ));
    let took = within(
        Duration::from_secs(1),
        "new traffic avoids the DRAINING endpoint",
        async || {
            for _ in 0..6 {
                match backend_of(listener, None).await {
                    Some((b, _)) if b != pinned => {}
                    _ => return false,
                }
            }
            true
        },
    )
    .await;
    eprintln!("DRAINING followed in {took:?}");
    for _ in 0..10 {
        let (b, _) = backend_of(listener, Some(&cookie)).await.unwrap();
        assert_eq!(b, pinned, "a session on a DRAINING endpoint stays");
    }
    let mut new_sessions = HashSet::new();
    for _ in 0..10 {
        new_sessions.insert(backend_of(listener, None).await.unwrap().0);
    }
    assert!(
        !new_sessions.contains(&pinned),
        "no new session lands on the DRAINING endpoint"
    );

    // Remove an endpoint: it gets no traffic within a second.
    control.write(&config(
        port,
        &[(pinned_addr, "DRAINING"), (b3.addr(), "HEALTHY")],
    ));
    let took = within(
        Duration::from_secs(1),
        "the removed endpoint gets no traffic",
        async || {
            for _ in 0..6 {
                match backend_of(listener, None).await {
                    Some((b, _)) if b == "b3" => {}
                    _ => return false,
                }
            }
            true
        },
    )
    .await;
    eprintln!("endpoint removal followed in {took:?}");
    let hits = if other == "b1" { b1.hits() } else { b2.hits() };
    for _ in 0..5 {
        backend_of(listener, None).await.unwrap();
    }
    let hits_after = if other == "b1" { b1.hits() } else { b2.hits() };
    assert_eq!(hits, hits_after, "{other} was removed");

    // A bad file is rejected and the last good snapshot keeps serving.
    control.write("services:\n  - name: web\n    endpoints:\n      - address: not-an-address\n");
    assert!(
        control.wait_log("rejected", Duration::from_secs(2)).await,
        "{}",
        control.stderr()
    );
    let log = control.stderr();
    assert!(log.contains("services[0].endpoints[0].address"), "{log}");
    assert!(log.contains("line 4"), "{log}");
    let (b, _) = backend_of(listener, None).await.expect("still served");
    assert_eq!(b, "b3");
    drop(envoy);
}

/// `shop` fails over from the aggregate `web` (primary, then fallback) to
/// `spare`: two levels of aggregate services.
fn aggregate_config(
    listen: u16,
    primary: &[(SocketAddr, &str)],
    fallback: &[(SocketAddr, &str)],
    spare: SocketAddr,
) -> String {
    let eps = |list: &[(SocketAddr, &str)]| {
        list.iter()
            .map(|(a, h)| format!("      - address: {a}\n        health: {h}\n"))
            .collect::<String>()
    };
    format!(
        r#"listener:
  port: {listen}
virtualhosts:
  - name: shop
    domains: ["*"]
    routes:
      - services:
          - name: shop
services:
  - name: shop
    aggregate: [web, spare]
  - name: web
    aggregate: [primary, fallback]
  - name: primary
    endpoints:
{p}  - name: fallback
    endpoints:
{f}  - name: spare
    endpoints:
      - address: {spare}
"#,
        p = eps(primary),
        f = eps(fallback),
    )
}

/// The backends that answered `n` requests without a cookie.
async fn answering(listener: SocketAddr, n: usize) -> HashSet<String> {
    let mut seen = HashSet::new();
    for _ in 0..n {
        match backend_of(listener, None).await {
            Some((b, _)) => seen.insert(b),
            None => seen.insert("no answer".to_owned()),
        };
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_fails_over_through_aggregate_services() {
    let p1 = HttpBackend::start("p1").await;
    let p2 = HttpBackend::start("p2").await;
    let f1 = HttpBackend::start("f1").await;
    let s1 = HttpBackend::start("s1").await;
    let port = free_port();
    let listener: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let write = |control: &Control, p: &str, f: &str| {
        control.write(&aggregate_config(
            port,
            &[(p1.addr(), p), (p2.addr(), p)],
            &[(f1.addr(), f)],
            s1.addr(),
        ))
    };
    let control = Control::start(&aggregate_config(
        port,
        &[(p1.addr(), "HEALTHY"), (p2.addr(), "HEALTHY")],
        &[(f1.addr(), "HEALTHY")],
        s1.addr(),
    ))
    .await;
    let envoy = envoy_serving(&control, listener, "route through the aggregate").await;
    assert!(control.nacks_none(), "{}", control.stderr());
    let dump = envoy.admin_get("/config_dump").await.unwrap();
    assert!(
        dump.contains("envoy.clusters.aggregate"),
        "no aggregate cluster in Envoy's config dump"
    );

    // Everything healthy: the primary's backends only, round robin.
    assert_eq!(
        answering(listener, 12).await,
        HashSet::from(["p1".to_owned(), "p2".to_owned()])
    );

    // No healthy primary endpoint: the fallback.
    write(&control, "UNHEALTHY", "HEALTHY");
    let took = within(
        Duration::from_secs(2),
        "traffic moves to the fallback",
        async || answering(listener, 6).await == HashSet::from(["f1".to_owned()]),
    )
    .await;
    eprintln!("failover to the fallback in {took:?}");

    // Neither: one level up, the spare.
    write(&control, "UNHEALTHY", "UNHEALTHY");
    let took = within(
        Duration::from_secs(2),
        "traffic moves to the spare",
        async || answering(listener, 6).await == HashSet::from(["s1".to_owned()]),
    )
    .await;
    eprintln!("failover to the spare in {took:?}");

    // The primary back: all traffic returns to it.
    write(&control, "HEALTHY", "UNHEALTHY");
    within(
        Duration::from_secs(2),
        "traffic returns to the primary",
        async || {
            answering(listener, 6)
                .await
                .iter()
                .all(|b| b == "p1" || b == "p2")
        },
    )
    .await;
    assert!(control.nacks_none(), "{}", control.stderr());
    drop(envoy);
}

/// SIGHUP reloads the file at once, without waiting for the next poll; a bad
/// file sent the same way is rejected and the last good version kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_file_without_waiting_for_the_poll() {
    let a: SocketAddr = "127.0.0.1:18001".parse().unwrap();
    let b: SocketAddr = "127.0.0.1:18002".parse().unwrap();
    // An hour between polls: only the signal can cause a reload here.
    let control = Control::start_polling(&config(free_port(), &[(a, "HEALTHY")]), 3_600_000).await;
    control.write(&config(free_port(), &[(a, "HEALTHY"), (b, "HEALTHY")]));
    // A bounded observation window, kept: only tether-control's own poll
    // timer (another process) could reload here, and a poll that finds
    // nothing to do says nothing. 300 ms is past the default poll (250 ms),
    // which a lost --poll-ms would give; the SIGHUP below is the positive
    // control: a reload shows in the log within milliseconds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !control.stderr().contains("serving version 2"),
        "reloaded before the signal: {}",
        control.stderr()
    );
    control.hangup().await;
    assert!(
        control
            .wait_log("serving version 2", Duration::from_secs(5))
            .await,
        "no reload after SIGHUP: {}",
        control.stderr()
    );

    control.write("services: [ {name: broken\n");
    control.hangup().await;
    assert!(
        control
            .wait_log(
                "still serving the last good version",
                Duration::from_secs(5)
            )
            .await,
        "a bad file after SIGHUP was not rejected: {}",
        control.stderr()
    );
    assert!(!control.stderr().contains("serving version 3"));
}

// --- Hash affinity: tether::Channel and Envoy over one tether-control file ---

/// A tether-control file with an Envoy listener on `listen` and one
/// virtual host `hash.tether.test` (every domain) sending everything to the
/// h2c service `hashed` with `policy` (a `loadBalancerPolicy` body), its
/// endpoints `(address, weight)` in one locality.
fn hash_config(listen: u16, policy: &str, endpoints: &[(SocketAddr, u32)]) -> String {
    let mut eps = String::new();
    for (addr, weight) in endpoints {
        eps.push_str(&format!(
            "      - {{ address: \"{addr}\", weight: {weight} }}\n"
        ));
    }
    format!(
        r#"listener:
  port: {listen}
virtualhosts:
  - name: hash.tether.test
    domains: ["*"]
    routes:
      - services:
          - name: hashed
        loadBalancerPolicy:
{policy}
services:
  - name: hashed
    protocol: h2c
    endpoints:
{eps}"#
    )
}

/// Three named gRPC backends, tether-control serving `config(listen,
/// backends)`, Envoy following it on `listen`, and a `tether::Channel`
/// following the same file.
async fn hash_setup(
    config: impl Fn(u16, &[SocketAddr]) -> String,
) -> (Vec<GrpcBackend>, Control, Envoy, u16, tether::Channel) {
    let backends = vec![
        GrpcBackend::start("h1").await,
        GrpcBackend::start("h2").await,
        GrpcBackend::start("h3").await,
    ];
    let addrs: Vec<SocketAddr> = backends.iter().map(GrpcBackend::addr).collect();
    let listen = free_port();
    let control = Control::start(&config(listen, &addrs)).await;
    let envoy = Envoy::start(&ads_bootstrap(control.addr, "envoy-under-test"))
        .await
        .expect("envoy starts");
    let bootstrap = tether_xds::Bootstrap::from_json(&control.bootstrap_json("hash-channel"))
        .expect("bootstrap");
    let channel = tether::Channel::builder()
        .bootstrap(bootstrap)
        .connect("xds:///hash.tether.test")
        .expect("channel");
    // Envoy serves once it has its listener, routes and endpoints.
    let listener: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        grpc_call(&envoy_channel(listener).await, &[]).await.is_ok()
    })
    .await;
    assert!(up, "Envoy did not serve gRPC\n{}", envoy.log());
    (backends, control, envoy, listen, channel)
}

/// A tonic channel to Envoy's listener (a new connection).
async fn envoy_channel(listener: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{listener}"))
        .unwrap()
        .connect_lazy()
}

/// One Echo call with `metadata` over `service`: the backend and the
/// response's Set-Cookie values.
async fn grpc_call<S>(
    service: &S,
    metadata: &[(&'static str, &str)],
) -> Result<(String, Vec<String>), tonic::Status>
where
    S: tonic::client::GrpcService<tonic::body::Body> + Clone,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut client = EchoClient::new(service.clone());
    let mut request = tonic::Request::new(EchoRequest {
        message: "x".into(),
    });
    request.set_timeout(Duration::from_secs(10));
    for (k, v) in metadata {
        request.metadata_mut().insert(*k, v.parse().unwrap());
    }
    let response = client.echo(request).await?;
    let set = response
        .metadata()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    Ok((response.into_inner().backend, set))
}

/// RequestHash on `x-user`, unequal endpoint weights, one locality: for
/// 1,000 keys `tether::Channel` reaches the backend Envoy reaches (with one
/// locality and a ring within gRPC's 4,096-entry cap, gRPC's ring is
/// Envoy's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tether_channel_and_envoy_hash_each_key_to_the_same_backend() {
    let policy = "          strategy: RequestHash\n          requestHashPolicies:\n            - headerHashOptions: { headerName: x-user }";
    let (_backends, control, envoy, listen, channel) = hash_setup(|listen, addrs| {
        let weighted: Vec<(SocketAddr, u32)> = addrs.iter().copied().zip([1, 2, 3]).collect();
        hash_config(listen, policy, &weighted)
    })
    .await;
    let through_envoy = envoy_channel(format!("127.0.0.1:{listen}").parse().unwrap()).await;
    let mut mismatches = Vec::new();
    let mut seen = HashSet::new();
    for i in 0..1000 {
        let key = format!("user-{i}-{}", i * 7919);
        let (by_envoy, _) = grpc_call(&through_envoy, &[("x-user", &key)])
            .await
            .unwrap();
        let (by_channel, _) = grpc_call(&channel, &[("x-user", &key)]).await.unwrap();
        seen.insert(by_channel.clone());
        if by_envoy != by_channel {
            mismatches.push(format!("{key}: envoy {by_envoy}, channel {by_channel}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of 1000 keys differ: {:?}\n{}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)],
        envoy.log()
    );
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(control.nacks_none(), "{}", control.stderr());
}

/// The `name="value"` pair of Contour's affinity cookie in `set_cookie`.
fn affinity_pair(set_cookie: &[String]) -> Option<String> {
    set_cookie
        .iter()
        .find(|c| c.starts_with("X-Contour-Session-Affinity="))
        .map(|c| c.split(';').next().unwrap().to_owned())
}

/// Contour's `Cookie` strategy natively: the channel generates the
/// affinity cookie on a first response, a jar-holding client keeps its
/// backend over 50 calls; a cookie Envoy generated reaches, through the
/// channel, the backend it reaches through Envoy, and one the channel
/// generated reaches through Envoy the channel's backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contours_cookie_strategy_works_in_the_channel_and_crosses_with_envoy() {
    use tether::session::{CookieJar, CookieJarLayer, Layer};
    let policy = "          strategy: Cookie";
    let (_backends, control, envoy, listen, channel) = hash_setup(|listen, addrs| {
        let equal: Vec<(SocketAddr, u32)> = addrs.iter().map(|a| (*a, 1)).collect();
        hash_config(listen, policy, &equal)
    })
    .await;
    let listener: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();

    // A jar keeps the generated cookie and the backend.
    let mut backends_of_jars = HashSet::new();
    for _ in 0..4 {
        let jar = CookieJar::new();
        let client = CookieJarLayer::new(jar.clone()).layer(channel.clone());
        let (first, set) = grpc_call(&client, &[]).await.unwrap();
        assert!(
            affinity_pair(&set).is_some(),
            "the first response sets it: {set:?}"
        );
        for _ in 0..50 {
            let (b, set) = grpc_call(&client, &[]).await.unwrap();
            assert_eq!(b, first, "a jar's calls keep their backend");
            assert!(
                set.is_empty(),
                "nothing new once the cookie is sent: {set:?}"
            );
        }
        backends_of_jars.insert(first);
    }

    // Envoy's generated cookies (one per connection) through the channel.
    for _ in 0..6 {
        let (by_envoy, set) = grpc_call(&envoy_channel(listener).await, &[])
            .await
            .unwrap();
        let cookie = affinity_pair(&set)
            .unwrap_or_else(|| panic!("Envoy generates the cookie: {set:?}\n{}", envoy.log()));
        for _ in 0..5 {
            let (b, set) = grpc_call(&channel, &[("cookie", &cookie)]).await.unwrap();
            assert_eq!(b, by_envoy, "the channel honours Envoy's {cookie}");
            assert!(set.is_empty());
        }
    }
    // The channel's generated cookies through Envoy.
    let through_envoy = envoy_channel(listener).await;
    for _ in 0..6 {
        let (by_channel, set) = grpc_call(&channel, &[]).await.unwrap();
        let cookie = affinity_pair(&set).expect("the channel generates the cookie");
        let (b, set) = grpc_call(&through_envoy, &[("cookie", &cookie)])
            .await
            .unwrap();
        assert_eq!(b, by_channel, "Envoy honours the channel's {cookie}");
        assert!(set.is_empty());
    }
    assert!(control.nacks_none(), "{}", control.stderr());
}

/// `config` with load reports every half second on `web`.
fn reporting_config(listen: u16, endpoints: &[(SocketAddr, &str)]) -> String {
    config(listen, endpoints).replace(
        "  - name: web\n    endpoints:\n",
        "  - name: web\n    loadReporting: { interval: 0.5s }\n    endpoints:\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_load_reports_tell_when_a_draining_backend_is_idle() {
    let b1 = HttpBackend::start("b1").await;
    let b2 = HttpBackend::start("b2").await;
    let port = free_port();
    let listener: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let healthy = [(b1.addr(), "HEALTHY"), (b2.addr(), "HEALTHY")];
    let control = Control::start_with_admin(&reporting_config(port, &healthy)).await;
    // Envoy reports load when its bootstrap has a load stats config.
    let mut bootstrap: serde_json::Value =
        serde_json::from_str(&ads_bootstrap(control.addr, "envoy-under-test")).unwrap();
    bootstrap["cluster_manager"] = serde_json::json!({ "load_stats_config": {
        "api_type": "GRPC",
        "transport_api_version": "V3",
        "grpc_services": [ { "envoy_grpc": { "cluster_name": "xds" } } ]
    } });
    let envoy = Envoy::start(&bootstrap.to_string())
        .await
        .expect("envoy starts");
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        backend_of(listener, None).await.is_some()
    })
    .await;
    assert!(up, "Envoy did not serve: {}", envoy.log());
    let (pinned, set) = backend_of(listener, None).await.unwrap();
    let cookie = set
        .expect("a session cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let pinned_addr = if pinned == "b1" { b1.addr() } else { b2.addr() };

    // The session's backend drains while the session keeps calling it.
    control.write(&reporting_config(
        port,
        &healthy.map(|(a, h)| (a, if a == pinned_addr { "DRAINING" } else { h })),
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let caller = {
        let (stop, cookie) = (stop.clone(), cookie.clone());
        tokio::spawn(async move {
            let mut served = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && served.len() < 2000 {
                served.push(backend_of(listener, Some(&cookie)).await.map(|(b, _)| b));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            served
        })
    };
    let busy = control
        .until_drain(pinned_addr, "the session on it", |e| e["verdict"] == "busy")
        .await;
    let client = &busy["clients"][0];
    assert_eq!(client["node"], "envoy-under-test", "{busy}");
    assert_eq!(client["granularity"], "endpoint", "{busy}");
    assert!(client["requests"].as_u64() > Some(0), "{busy}");
    // The status page shows Envoy's node and its load on the endpoint.
    let status = control
        .until_status("Envoy's load on the DRAINING endpoint", |s| {
            status_load(s, "web", pinned_addr, "envoy-under-test")["requests"].as_u64() > Some(0)
        })
        .await;
    let load = status_load(&status, "web", pinned_addr, "envoy-under-test");
    assert_eq!(load["granularity"], "endpoint", "{status}");
    let envoy_client = status_client(&status, "envoy-under-test");
    assert_eq!(
        envoy_client["streams"],
        serde_json::json!(["ADS", "LRS"]),
        "{status}"
    );
    assert_eq!(
        envoy_client["reports"],
        serde_json::json!(["web"]),
        "{status}"
    );

    // The session ends: Envoy's next reports show no request to it.
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let served = caller.await.unwrap();
    assert!(
        served.iter().all(|b| b.as_deref() == Some(pinned.as_str())),
        "the session stayed on {pinned} while it drained: {served:?}"
    );
    let idle = control
        .until_drain(pinned_addr, "the session ended", |e| e["verdict"] == "idle")
        .await;
    assert_eq!(idle["clients"][0]["state"], "idle", "{idle}");
    assert!(idle["idle_for_s"].as_f64().is_some(), "{idle}");
    drop(envoy);
}
