//! The tether plugin in a real Envoy 1.40 (V8), wiring (a): the plugin sets
//! `x-tether-override-host` and Envoy's override_host policy routes by it.
//! Most scenarios run `envoy-configs/plugin-override-host.yaml` itself, with
//! the test's addresses; variants change only the plugin configuration.
//! Every assertion is on what a client sees: the backend that answered
//! (`x-backend`), status codes, and `Set-Cookie` decoded with tether-core.

use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;
use tether_core::cookie::{self, Format, Key, KeyRing, SessionCookie, Signature};
use tether_core::AddressList;
use tether_testkit::client::Connection;
use tether_wasm_tests::scenario::{
    self, backend, bootstrap, envoy_value, grpc_value, legacy_value, listener, minted, now,
    override_host_cluster, plugin_config, plugin_filter, plugin_filter_named, route, Stage,
    OVERRIDE_HEADER,
};

const FILE: &str = "plugin-override-host.yaml";
const CLUSTER: &str = "app";

async fn wiring_a() -> Stage {
    Stage::config_file(FILE, None).await
}

/// The first cookie-less request: a cookie naming the backend that answered.
async fn first_cookie(stage: &Stage) -> (String, scenario::Minted) {
    let r = stage.get("/", &[]).await;
    assert_eq!(r.status, 200, "{}", stage.envoy.log());
    let m = minted(&r).expect("a first request gets a session cookie");
    (backend(&r).to_string(), m)
}

/// Sends `value` `n` times; the set of backends that answered, and whether
/// any response carried a session cookie naming something else than the
/// backend that answered it.
async fn replay(
    stage: &Stage,
    path: &str,
    value: &str,
    n: usize,
) -> Vec<(String, Option<scenario::Minted>)> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let r = stage.get_with_cookie(path, value).await;
        assert_eq!(r.status, 200, "{}", stage.envoy.log());
        out.push((backend(&r).to_string(), minted(&r)));
    }
    out
}

fn names(answers: &[(String, Option<scenario::Minted>)]) -> BTreeSet<&str> {
    answers.iter().map(|(b, _)| b.as_str()).collect()
}

/// A bad cookie: load balanced like no cookie (round robin over 3 backends
/// shows more than one), and every answer re-pins to the backend that gave it.
async fn assert_falls_back_with_fresh_cookies(stage: &Stage, value: &str) {
    let answers = replay(stage, "/", value, 6).await;
    assert!(
        names(&answers).len() > 1,
        "load balanced, not pinned: {answers:?}"
    );
    for (b, m) in &answers {
        let m = m
            .as_ref()
            .unwrap_or_else(|| panic!("a fresh cookie from {b}"));
        assert_eq!(
            stage.backends.name_at(m.address()),
            b,
            "cookie names who answered"
        );
        assert!(m.decoded.cookie.expires.is_some_and(|e| e > now()), "{m:?}");
    }
}

#[tokio::test]
async fn first_request_gets_a_cookie_for_the_backend_that_answered() {
    let stage = wiring_a().await;
    let (b, m) = first_cookie(&stage).await;
    assert_eq!(stage.backends.name_at(m.address()), b);
    assert_eq!(m.decoded.format, Format::Envoy);
    assert!(
        m.decoded.quoted,
        "Envoy's style quotes the value: {}",
        m.header
    );
    assert_eq!(m.decoded.cookie.cluster.as_deref(), Some(CLUSTER));
    let expires = m.decoded.cookie.expires.expect("ttl 120s writes an expiry");
    assert!(expires.abs_diff(now() + 120) <= 3, "expires {expires}");
    assert_eq!(m.attribute("Max-Age"), Some("120"));
    assert_eq!(m.attribute("Path"), Some("/"));
    assert_eq!(m.attribute("SameSite"), Some("Lax"));
    assert_eq!(m.attribute("HttpOnly"), Some(""));
}

#[tokio::test]
async fn replay_stays_pinned_for_60_requests() {
    let stage = wiring_a().await;
    // Without a cookie the load balancer spreads requests...
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        seen.insert(backend(&stage.get("/", &[]).await).to_string());
    }
    assert!(seen.len() > 1, "round robin: {seen:?}");
    // ...with one, every request goes to the session's backend and no new
    // cookie is set: 30 on fresh connections, 30 on one kept-alive connection.
    let (b, m) = first_cookie(&stage).await;
    let answers = replay(&stage, "/any/path?q=1", &m.value, 30).await;
    assert!(
        answers.iter().all(|(x, c)| *x == b && c.is_none()),
        "{answers:?}"
    );
    let mut conn = Connection::open(stage.listen).await.unwrap();
    let header = m.cookie_header();
    for _ in 0..30 {
        let r = conn.get("/", &[("cookie", &header)]).await.unwrap();
        assert_eq!(backend(&r), b);
        assert!(minted(&r).is_none());
    }
}

#[tokio::test]
async fn grpc_format_cookie_is_honoured() {
    let stage = wiring_a().await;
    let value = grpc_value(stage.addr_of("backend-2"), CLUSTER);
    let answers = replay(&stage, "/", &value, 10).await;
    // Same host, same cluster: nothing to rewrite.
    assert!(
        answers.iter().all(|(b, c)| b == "backend-2" && c.is_none()),
        "{answers:?}"
    );
}

#[tokio::test]
async fn legacy_cookie_is_honoured() {
    let stage = wiring_a().await;
    let value = legacy_value(stage.addr_of("backend-3"));
    let answers = replay(&stage, "/", &value, 10).await;
    assert_eq!(names(&answers), BTreeSet::from(["backend-3"]));
    // A legacy cookie carries no cluster; tether rewrites it in its own format
    // with the cluster (gRFC A60), still pinned to the same host.
    let m = answers[0]
        .1
        .as_ref()
        .expect("rewritten once with the cluster");
    assert_eq!(m.address(), stage.addr_of("backend-3"));
    assert_eq!(m.decoded.cookie.cluster.as_deref(), Some(CLUSTER));
    let again = replay(&stage, "/", &m.value, 5).await;
    assert!(
        again.iter().all(|(b, c)| b == "backend-3" && c.is_none()),
        "{again:?}"
    );
}

#[tokio::test]
async fn expired_cookie_falls_back_with_a_fresh_cookie() {
    let stage = wiring_a().await;
    let value = envoy_value(stage.addr_of("backend-2"), Some(now() - 60));
    assert_falls_back_with_fresh_cookies(&stage, &value).await;
}

#[tokio::test]
async fn garbage_cookie_falls_back_with_a_fresh_cookie() {
    let stage = wiring_a().await;
    for value in ["%%%not-base64", "\"unbalanced", "aGVsbG8=", "Cg8xMjcuMC4w"] {
        assert_falls_back_with_fresh_cookies(&stage, value).await;
    }
}

#[tokio::test]
async fn unpadded_cookie_is_honoured_as_grpc_c_core_does() {
    // tether-core reads unpadded base64 (as gRPC C-core does; Envoy's own
    // filter ignores such a cookie), so the session holds, and each response
    // re-issues it padded, which stock Envoy reads too.
    let stage = wiring_a().await;
    let mut c = SessionCookie::new(AddressList::one(stage.addr_of("backend-2")));
    c.cluster = Some(CLUSTER.into());
    let padded = cookie::encode(&c, Format::Envoy, None).unwrap();
    let unpadded = padded.trim_end_matches('=');
    assert_ne!(padded, unpadded, "the value needs padding");
    let answers = replay(&stage, "/", unpadded, 10).await;
    assert!(
        answers.iter().all(|(b, c)| b == "backend-2"
            && c.as_ref().is_some_and(|c| {
                let d = &c.decoded;
                d.padded
                    && !d.envoy_misreads
                    && d.cookie.addresses.primary() == stage.addr_of("backend-2")
            })),
        "{answers:?}"
    );
}

#[tokio::test]
async fn forged_mac_cookie_falls_back_with_a_fresh_signed_cookie() {
    // base64 of "tether-test-secret-0123456789"
    let secret = "dGV0aGVyLXRlc3Qtc2VjcmV0LTAxMjM0NTY3ODk=";
    let ring = KeyRing::new(vec![Key::from_base64(secret).unwrap()]);
    let mut config = plugin_config();
    config["keys"] = json!([secret]);
    let stage = Stage::config_file(FILE, Some(&config)).await;
    // Signed with another key: a forgery.
    let forger = Key::from_secret(b"someone-elses-secret-0123456").unwrap();
    let mut c = SessionCookie::new(AddressList::one(stage.addr_of("backend-2")));
    c.cluster = Some(CLUSTER.into());
    let forged = cookie::encode(&c, Format::Envoy, Some(&forger)).unwrap();
    assert_falls_back_with_fresh_cookies(&stage, &forged).await;
    // The fresh cookies carry a MAC of the configured key, and pin.
    let (b, m) = first_cookie(&stage).await;
    let checked = cookie::decode(&m.value, &ring).unwrap();
    assert_eq!(checked.signature, Signature::Valid { key: 0 });
    let answers = replay(&stage, "/", &m.value, 5).await;
    assert!(
        answers.iter().all(|(x, c)| *x == b && c.is_none()),
        "{answers:?}"
    );
    // An unsigned cookie is no session when keys are configured.
    let unsigned = cookie::encode(&c, Format::Envoy, None).unwrap();
    assert_falls_back_with_fresh_cookies(&stage, &unsigned).await;
}

#[tokio::test]
async fn unknown_host_cookie_falls_back_with_a_fresh_cookie() {
    let stage = wiring_a().await;
    let value = envoy_value("127.0.0.1:1".parse().unwrap(), None);
    assert_falls_back_with_fresh_cookies(&stage, &value).await;
}

#[tokio::test]
async fn client_sent_override_header_is_ignored() {
    let stage = wiring_a().await;
    let target = stage.addr_of("backend-1").to_string();
    // Alone: the plugin removes it and the load balancer picks.
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        let r = stage.get("/", &[(OVERRIDE_HEADER, &target)]).await;
        let body = r.json();
        assert!(
            body["headers"].get(OVERRIDE_HEADER).is_none(),
            "not forwarded: {body}"
        );
        seen.insert(backend(&r).to_string());
    }
    assert!(seen.len() > 1, "the client did not choose: {seen:?}");
    // With a session: the session wins, and the header the backend sees is the plugin's.
    let c = scenario::cookie(&grpc_value(stage.addr_of("backend-2"), CLUSTER));
    for _ in 0..6 {
        let r = stage
            .get("/", &[(OVERRIDE_HEADER, &target), ("cookie", &c)])
            .await;
        assert_eq!(backend(&r), "backend-2");
        assert_eq!(
            r.json()["headers"][OVERRIDE_HEADER],
            stage.addr_of("backend-2").to_string()
        );
    }
}

/// The plugin reads one `Cookie` header first (Envoy returns the first of
/// several): a session cookie in a later header must still pin, and other
/// cookies before it must not hide it.
#[tokio::test]
async fn a_session_cookie_in_a_second_cookie_header_pins() {
    let stage = wiring_a().await;
    let c = scenario::cookie(&grpc_value(stage.addr_of("backend-3"), CLUSTER));
    for _ in 0..6 {
        let r = stage
            .get("/", &[("cookie", "theme=dark; lang=en"), ("cookie", &c)])
            .await;
        assert_eq!(r.status, 200, "{}", stage.envoy.log());
        assert_eq!(backend(&r), "backend-3", "{}", r.json());
        let r = stage
            .get("/", &[("cookie", &format!("theme=dark; {c}"))])
            .await;
        assert_eq!(backend(&r), "backend-3", "{}", r.json());
    }
    // An empty override header from a client is removed too.
    let r = stage.get("/", &[(OVERRIDE_HEADER, "")]).await;
    assert!(
        r.json()["headers"].get(OVERRIDE_HEADER).is_none(),
        "not forwarded: {}",
        r.json()
    );
}

#[tokio::test]
async fn per_route_disable_leaves_the_route_alone() {
    // envoy-configs' `/static/` route: FilterConfig { disabled: true } for the
    // plugin, and the override header removed by the route.
    let stage = wiring_a().await;
    let value = grpc_value(stage.addr_of("backend-2"), CLUSTER);
    let answers = replay(&stage, "/static/app.js", &value, 6).await;
    assert!(names(&answers).len() > 1, "not pinned: {answers:?}");
    assert!(
        answers.iter().all(|(_, c)| c.is_none()),
        "no cookie on the route: {answers:?}"
    );
    let r = stage.get("/static/app.js", &[]).await;
    assert!(minted(&r).is_none());
    let target = stage.addr_of("backend-1").to_string();
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        seen.insert(
            backend(&stage.get("/static/x", &[(OVERRIDE_HEADER, &target)]).await).to_string(),
        );
    }
    assert!(
        seen.len() > 1,
        "a client cannot pick a backend there either: {seen:?}"
    );
    // The other routes still have sessions.
    let pinned = replay(&stage, "/app", &value, 5).await;
    assert!(pinned.iter().all(|(b, _)| b == "backend-2"), "{pinned:?}");
}

#[tokio::test]
async fn per_route_settings_come_from_a_second_instance_enabled_on_the_route() {
    // Envoy 1.40 takes no per-route configuration for a wasm filter, but any
    // filter can be off by default and switched on per route: a second
    // instance with its own settings serves `/cart/`, the first the rest.
    let mut cart = plugin_config();
    cart["cookie"] = json!({ "name": "cart-session", "path": "/cart/", "ttl": "30s" });
    let stage = Stage::built(3, |port, backends| {
        let mut second = plugin_filter_named("tether-cart", &cart);
        second["disabled"] = json!(true);
        let mut cart_route = route("/cart/", CLUSTER);
        cart_route["typed_per_filter_config"] = json!({
            "tether": { "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": true },
            "tether-cart": { "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {} }
        });
        bootstrap(
            vec![listener(
                "ingress",
                port,
                vec![plugin_filter(&plugin_config()), second],
                vec![cart_route, route("/", CLUSTER)],
            )],
            vec![override_host_cluster(CLUSTER, backends)],
        )
    })
    .await;
    let r = stage.get("/cart/items", &[]).await;
    let set: Vec<&str> = r.headers_named("set-cookie");
    assert_eq!(set.len(), 1, "{set:?}");
    assert!(
        set[0].starts_with("cart-session=") && set[0].contains("Max-Age=30"),
        "{set:?}"
    );
    assert!(set[0].contains("Path=/cart/"), "{set:?}");
    let pinned = backend(&r).to_string();
    let cart_cookie = set[0].split(';').next().unwrap().to_string();
    for _ in 0..10 {
        let r = stage.get("/cart/items", &[("cookie", &cart_cookie)]).await;
        assert_eq!(backend(&r), pinned);
        assert!(r.headers_named("set-cookie").is_empty());
    }
    let r = stage.get("/", &[]).await;
    let m = minted(&r).expect("the first instance serves the other routes");
    assert_eq!(m.attribute("Max-Age"), Some("120"));
    assert!(r
        .headers_named("set-cookie")
        .iter()
        .all(|c| !c.starts_with("cart-session")));
}

#[tokio::test]
async fn path_gate_limits_sessions_to_the_cookie_path() {
    let mut config = plugin_config();
    config["cookie"]["path"] = json!("/app");
    let stage = Stage::config_file(FILE, Some(&config)).await;
    let value = grpc_value(stage.addr_of("backend-2"), CLUSTER);
    for path in ["/app", "/app/cart", "/app?x=1"] {
        let answers = replay(&stage, path, &value, 4).await;
        assert!(
            answers.iter().all(|(b, c)| b == "backend-2" && c.is_none()),
            "{path}: {answers:?}"
        );
    }
    for path in ["/application", "/other", "/"] {
        let answers = replay(&stage, path, &value, 6).await;
        assert!(
            names(&answers).len() > 1,
            "{path} is outside the cookie path: {answers:?}"
        );
        assert!(
            answers.iter().all(|(_, c)| c.is_none()),
            "{path}: {answers:?}"
        );
    }
    let r = stage.get("/app/first", &[]).await;
    let m = minted(&r).expect("a cookie inside the path");
    assert_eq!(m.attribute("Path"), Some("/app"));
}

#[tokio::test]
async fn header_mode_pins_by_the_session_header() {
    let config = json!({ "header": { "name": "x-session" } });
    let stage = Stage::config_file(FILE, Some(&config)).await;
    let first = stage.get("/", &[]).await;
    let b = backend(&first).to_string();
    let value = first
        .header("x-session")
        .expect("the session header")
        .to_string();
    assert!(first.header("set-cookie").is_none());
    // The default header-mode format is Envoy's: base64 of ip:port.
    assert_eq!(value, legacy_value(stage.addr_of(&b)));
    for _ in 0..20 {
        let r = stage.get("/", &[("x-session", &value)]).await;
        assert_eq!(backend(&r), b);
        assert!(r.header("x-session").is_none(), "nothing to update");
    }
}

#[tokio::test]
async fn strict_answers_503_when_the_session_host_is_not_usable() {
    let mut config = plugin_config();
    config["strict"] = json!(true);
    let stage = Stage::config_file(FILE, Some(&config)).await;
    let before = stage.backends.hits();
    let r = stage
        .get_with_cookie("/", &envoy_value("127.0.0.1:1".parse().unwrap(), None))
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.body, "no healthy upstream");
    assert!(minted(&r).is_none());
    // Wiring (a) can only judge after the fact: the fallback host did get the
    // request (wiring b refuses before routing).
    assert_eq!(stage.backends.hits(), before + 1);
    // A usable session and a request without one are served as usual.
    let value = grpc_value(stage.addr_of("backend-3"), CLUSTER);
    let answers = replay(&stage, "/", &value, 5).await;
    assert!(answers.iter().all(|(b, _)| b == "backend-3"), "{answers:?}");
    let (_, m) = first_cookie(&stage).await;
    assert!(m.decoded.cookie.expires.is_some());
}

#[tokio::test]
async fn backend_stopped_mid_session_falls_back_and_repins() {
    let stage = wiring_a().await;
    let (b, m) = first_cookie(&stage).await;
    let dead = stage.backends.named(&b);
    let dead_addr = dead.addr();
    dead.stop().await;
    // The route retries a refused connection; the retry falls back to a live
    // host and the response re-pins the session there.
    let answers = replay(&stage, "/", &m.value, 5).await;
    for (x, c) in &answers {
        assert_ne!(*x, b, "the stopped backend cannot answer");
        let c = c.as_ref().expect("a new cookie");
        assert_ne!(c.address(), dead_addr, "never a cookie for the dead host");
        assert_eq!(stage.backends.name_at(c.address()), x);
    }
    let moved = answers[0].1.as_ref().unwrap();
    let after = replay(&stage, "/", &moved.value, 10).await;
    assert!(
        after.iter().all(|(x, c)| *x == answers[0].0 && c.is_none()),
        "{after:?}"
    );
}

#[tokio::test]
async fn no_cookie_for_a_host_that_failed_to_connect() {
    // No retries here: a request sent to the stopped host fails with 503, and
    // its response must not pin the client to that host (Envoy's own filter does).
    let stage = Stage::built(3, |port, backends| {
        bootstrap(
            vec![listener(
                "ingress",
                port,
                vec![plugin_filter(&plugin_config())],
                vec![route("/", CLUSTER)],
            )],
            vec![override_host_cluster(CLUSTER, backends)],
        )
    })
    .await;
    let dead = stage.backends.named("backend-2");
    let dead_addr = dead.addr();
    dead.stop().await;
    let mut failures = 0;
    for _ in 0..9 {
        let r = stage.get("/", &[]).await;
        match r.status {
            503 => {
                failures += 1;
                assert!(
                    minted(&r).is_none(),
                    "a cookie for a failed connection: {:?}",
                    r.headers
                );
            }
            200 => assert_ne!(minted(&r).expect("a cookie").address(), dead_addr),
            s => panic!("status {s}"),
        }
    }
    assert!(failures > 0, "round robin reached the stopped host");
    // A session on the dead host: 503 (no retry), and still no cookie for it.
    let r = stage
        .get_with_cookie("/", &envoy_value(dead_addr, None))
        .await;
    assert_eq!(r.status, 503);
    assert!(minted(&r).is_none());
}

#[tokio::test]
async fn cookie_expiry_follows_the_clock() {
    // The plugin reads the clock once a second (a timer), not per request.
    let stage = wiring_a().await;
    let (_, first) = first_cookie(&stage).await;
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let (_, later) = first_cookie(&stage).await;
    let (e1, e2) = (
        first.decoded.cookie.expires.unwrap(),
        later.decoded.cookie.expires.unwrap(),
    );
    assert!(e2 >= e1 + 2, "expiry moved with the clock: {e1} then {e2}");
    assert!(e2.abs_diff(now() + 120) <= 3);
}

/// The value of the session cookie a response sets, if any (raw: a sealed
/// value opens only with the keys).
fn set_cookie_value(r: &tether_testkit::client::Response) -> Option<String> {
    r.headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .filter_map(|(_, v)| tether_core::http::set_cookie::parse(v))
        .find(|c| c.name == scenario::COOKIE)
        .map(|c| c.value.to_string())
}

#[tokio::test]
async fn a_sealed_cookie_pins_through_envoy_and_a_tampered_one_gets_a_fresh_pick() {
    // base64 of "tether-sealing-secret-0123456789", 32 bytes.
    let secret = "dGV0aGVyLXNlYWxpbmctc2VjcmV0LTAxMjM0NTY3ODk=";
    let ring = KeyRing::from_base64([secret]).unwrap();
    let mut config = plugin_config();
    config["format"] = json!("sealed");
    config["keys"] = json!([secret]);
    let stage = Stage::config_file(FILE, Some(&config)).await;

    let r = stage.get("/", &[]).await;
    assert_eq!(r.status, 200, "{}", stage.envoy.log());
    let b = backend(&r).to_string();
    let value = set_cookie_value(&r).expect("a first request gets a sealed cookie");
    let d = cookie::decode(&value, &ring).unwrap();
    assert_eq!(d.format, Format::Sealed);
    assert_eq!(stage.backends.name_at(d.cookie.addresses.primary()), b);
    assert_eq!(d.cookie.cluster.as_deref(), Some(CLUSTER));
    assert!(cookie::decode(&value, &KeyRing::empty()).is_err());

    // Pinned: every request to the same backend, no new cookie.
    let header = format!("{}={value}", scenario::COOKIE);
    for _ in 0..10 {
        let r = stage.get("/", &[("cookie", &header)]).await;
        assert_eq!(backend(&r), b, "{}", stage.envoy.log());
        assert_eq!(set_cookie_value(&r), None);
    }

    // One character changed: load balanced, each answer re-pins with a
    // fresh sealed cookie naming who answered.
    let mut bytes = value.clone().into_bytes();
    bytes[24] = if bytes[24] == b'A' { b'B' } else { b'A' };
    let tampered = format!("{}={}", scenario::COOKIE, String::from_utf8(bytes).unwrap());
    let mut seen = BTreeSet::new();
    let mut fresh_values = BTreeSet::new();
    for _ in 0..6 {
        let r = stage.get("/", &[("cookie", &tampered)]).await;
        assert_eq!(r.status, 200, "{}", stage.envoy.log());
        let answered = backend(&r).to_string();
        let fresh = set_cookie_value(&r).expect("a fresh cookie for a tampered one");
        let d = cookie::decode(&fresh, &ring).unwrap();
        assert_eq!(d.format, Format::Sealed);
        assert_eq!(
            stage.backends.name_at(d.cookie.addresses.primary()),
            answered
        );
        seen.insert(answered);
        fresh_values.insert(fresh);
    }
    assert!(seen.len() > 1, "load balanced, not pinned: {seen:?}");
    // Nonces from Envoy's random_get: no two values alike.
    assert_eq!(fresh_values.len(), 6);
}
