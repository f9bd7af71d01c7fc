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

use control_support::Control;
use tether_testkit::backend::HttpBackend;
use tether_testkit::client;
use tether_testkit::envoy::Envoy;
use tether_testkit::free_port;
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

fn envoy_bootstrap(admin: u16, xds: SocketAddr) -> String {
    format!(
        r#"node: {{ id: envoy-under-test, cluster: tether-test }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services: [ {{ envoy_grpc: {{ cluster_name: xds }} }} ]
  lds_config: {{ ads: {{}}, resource_api_version: V3 }}
  cds_config: {{ ads: {{}}, resource_api_version: V3 }}
static_resources:
  clusters:
    - name: xds
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http2_protocol_options: {{}} }}
      load_assignment:
        cluster_name: xds
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}
"#,
        port = xds.port()
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
    let envoy = Envoy::start(&envoy_bootstrap(free_port(), control.addr))
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
