//! The tether plugin next to Envoy 1.40's own stateful_session filter:
//! cookies cross between them in both directions (with and without a ttl),
//! and wiring (b), where the plugin hands the session to Envoy's filter in
//! header mode, which adds `override_host_status` health filtering and
//! `strict`. The files of `envoy-configs/` run as they are, with the test's
//! addresses.

use serde_json::json;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;
use tether_core::cookie::{self, Format, SessionCookie};
use tether_core::AddressList;
use tether_testkit::wait_until;
use tether_wasm_tests::scenario::{
    self, backend, bootstrap, config_file, envoy_value, listener, minted, native_header_filter,
    now, plugin_config, plugin_filter, replace, route, start_envoy, static_cluster,
    with_plugin_config, Backends, Stage, OVERRIDE_HEADER,
};

const NATIVE: &str = "native-cookie.yaml";
const PLUGIN: &str = "plugin-override-host.yaml";
const WIRING_B: &str = "plugin-native-header.yaml";

/// One Envoy with Envoy's own cookie filter and one with the plugin, in front
/// of the same three backends; `ttl` false drops the ttl from both.
struct Pair {
    native: Stage,
    plugin: Stage,
}

async fn pair(ttl: bool) -> Pair {
    let backends = Backends::start(3).await;
    let addrs = backends.addrs();
    let port = tether_testkit::free_port();
    let mut yaml = config_file(NATIVE, port, &addrs);
    if !ttl {
        yaml = replace(&yaml, "                    ttl: 120s\n", "");
    }
    let native = Stage {
        envoy: start_envoy(&yaml).await,
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        backends,
    };
    let mut config = plugin_config();
    if !ttl {
        config["cookie"].as_object_mut().unwrap().remove("ttl");
    }
    // The same backends again, for the plugin's Envoy: the sessions name the
    // same addresses.
    let port = tether_testkit::free_port();
    let yaml = with_plugin_config(&config_file(PLUGIN, port, &addrs), &config);
    let plugin = Stage {
        envoy: start_envoy(&yaml).await,
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        backends: Backends(Vec::new()),
    };
    Pair { native, plugin }
}

async fn native_cookie_is_honoured_by_the_plugin(ttl: bool) {
    let p = pair(ttl).await;
    let r = p.native.get("/", &[]).await;
    let b = backend(&r).to_string();
    let m = minted(&r).expect("Envoy's filter sets a cookie");
    assert_eq!(m.decoded.format, Format::Envoy);
    assert_eq!(m.decoded.cookie.expires.is_some(), ttl, "{}", m.header);
    assert_eq!(m.attribute("Max-Age").is_some(), ttl);
    for _ in 0..20 {
        let r = p.plugin.get("/", &[("cookie", &m.cookie_header())]).await;
        assert_eq!(r.status, 200);
        assert_eq!(backend(&r), b, "pinned where Envoy's filter pinned it");
        // Envoy's cookie has no cluster; the plugin may add it (gRFC A60),
        // but only ever for the same host.
        if let Some(c) = minted(&r) {
            assert_eq!(c.address(), m.address());
        }
    }
}

async fn plugin_cookie_is_honoured_by_the_native_filter(ttl: bool) {
    let p = pair(ttl).await;
    let r = p.plugin.get("/", &[]).await;
    let b = backend(&r).to_string();
    let m = minted(&r).expect("the plugin sets a cookie");
    assert_eq!(m.decoded.cookie.expires.is_some(), ttl, "{}", m.header);
    assert_eq!(m.attribute("Max-Age").is_some(), ttl);
    for _ in 0..20 {
        let r = p.native.get("/", &[("cookie", &m.cookie_header())]).await;
        assert_eq!(r.status, 200);
        assert_eq!(backend(&r), b, "pinned where the plugin pinned it");
        assert!(
            minted(&r).is_none(),
            "Envoy's filter sees its own session: {:?}",
            r.headers
        );
    }
}

#[tokio::test]
async fn native_cookie_with_ttl_is_honoured_by_the_plugin() {
    native_cookie_is_honoured_by_the_plugin(true).await;
}

#[tokio::test]
async fn native_cookie_without_ttl_is_honoured_by_the_plugin() {
    native_cookie_is_honoured_by_the_plugin(false).await;
}

#[tokio::test]
async fn plugin_cookie_with_ttl_is_honoured_by_the_native_filter() {
    plugin_cookie_is_honoured_by_the_native_filter(true).await;
}

#[tokio::test]
async fn plugin_cookie_without_ttl_is_honoured_by_the_native_filter() {
    plugin_cookie_is_honoured_by_the_native_filter(false).await;
}

#[tokio::test]
async fn wiring_b_pins_through_the_native_header_filter() {
    let stage = Stage::config_file(WIRING_B, None).await;
    stage.wait_all_healthy("app").await;
    let first = stage.get("/", &[]).await;
    let b = backend(&first).to_string();
    let m = minted(&first).expect("a first cookie");
    assert_eq!(stage.backends.name_at(m.address()), b);
    assert!(
        first.header(OVERRIDE_HEADER).is_none(),
        "Envoy's echo is removed"
    );
    for _ in 0..50 {
        let r = stage.get("/", &[("cookie", &m.cookie_header())]).await;
        assert_eq!(backend(&r), b);
        assert!(minted(&r).is_none());
        assert!(r.header(OVERRIDE_HEADER).is_none());
    }
    // A client's own session header is removed before Envoy's filter reads it.
    let forced = scenario::legacy_value(stage.addr_of("backend-1"));
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        seen.insert(backend(&stage.get("/", &[(OVERRIDE_HEADER, &forced)]).await).to_string());
    }
    assert!(seen.len() > 1, "the client did not choose: {seen:?}");
}

/// Wiring (b) built in code: `strict` for Envoy's filter, one cluster per
/// `override_host_status` set, backend-3 reported DRAINING by its
/// `health_status`.
fn wiring_b_yaml(port: u16, backends: &[SocketAddr], strict: bool) -> String {
    let mut config = plugin_config();
    config["override_encoding"] = json!("session_header");
    let cluster = |name: &str, statuses: &[&str]| {
        let mut c = static_cluster(name, backends);
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][2]["health_status"] =
            json!("DRAINING");
        c["common_lb_config"] = json!({ "override_host_status": { "statuses": statuses } });
        c
    };
    bootstrap(
        vec![listener(
            "ingress",
            port,
            vec![
                plugin_filter(&config),
                native_header_filter(OVERRIDE_HEADER, strict),
            ],
            vec![route("/keep", "keep_draining"), route("/", "drop_draining")],
        )],
        vec![
            cluster("keep_draining", &["UNKNOWN", "HEALTHY", "DRAINING"]),
            cluster("drop_draining", &["UNKNOWN", "HEALTHY"]),
        ],
    )
}

fn session_for(addr: SocketAddr, cluster: &str) -> String {
    let mut c = SessionCookie::new(AddressList::one(addr));
    c.cluster = Some(cluster.into());
    cookie::encode(&c, Format::Envoy, None).unwrap()
}

#[tokio::test]
async fn wiring_b_draining_host_keeps_its_sessions_when_override_host_status_allows() {
    let stage = Stage::built(3, |port, b| wiring_b_yaml(port, b, false)).await;
    let value = session_for(stage.addr_of("backend-3"), "keep_draining");
    for _ in 0..30 {
        let r = stage.get_with_cookie("/keep", &value).await;
        assert_eq!(
            backend(&r),
            "backend-3",
            "a session stays on its draining host"
        );
        assert!(minted(&r).is_none());
    }
    // New sessions never land on a draining host.
    for _ in 0..12 {
        let r = stage.get("/keep", &[]).await;
        assert_ne!(backend(&r), "backend-3");
        assert_ne!(minted(&r).unwrap().address(), stage.addr_of("backend-3"));
    }
}

#[tokio::test]
async fn wiring_b_draining_host_loses_its_sessions_when_override_host_status_excludes_it() {
    let stage = Stage::built(3, |port, b| wiring_b_yaml(port, b, false)).await;
    let drained = stage.addr_of("backend-3");
    let value = session_for(drained, "drop_draining");
    let mut seen = BTreeSet::new();
    for _ in 0..8 {
        let r = stage.get_with_cookie("/", &value).await;
        assert_eq!(r.status, 200);
        assert_ne!(backend(&r), "backend-3");
        let m = minted(&r).expect("re-pinned");
        assert_eq!(stage.backends.name_at(m.address()), backend(&r));
        seen.insert(backend(&r).to_string());
    }
    assert_eq!(seen.len(), 2, "load balanced over the two others: {seen:?}");
}

#[tokio::test]
async fn wiring_b_strict_answers_503_before_any_backend_is_asked() {
    let stage = Stage::built(3, |port, b| wiring_b_yaml(port, b, true)).await;
    let before = stage.backends.hits();
    for value in [
        envoy_value("127.0.0.1:1".parse().unwrap(), None),
        session_for(stage.addr_of("backend-3"), "drop_draining"),
    ] {
        let r = stage.get_with_cookie("/", &value).await;
        assert_eq!(r.status, 503, "{:?}", r.headers);
        assert!(minted(&r).is_none());
    }
    assert_eq!(
        stage.backends.hits(),
        before,
        "Envoy refused before routing"
    );
    // A usable session is served.
    let r = stage
        .get_with_cookie(
            "/",
            &session_for(stage.addr_of("backend-1"), "drop_draining"),
        )
        .await;
    assert_eq!(backend(&r), "backend-1");
}

#[tokio::test]
async fn wiring_b_backend_failing_health_checks_loses_its_sessions() {
    // envoy-configs' wiring (b) health checks every second.
    let stage = Stage::config_file(WIRING_B, None).await;
    stage.wait_all_healthy("app").await;
    let value = session_for(stage.addr_of("backend-2"), "app");
    let r = stage.get_with_cookie("/", &value).await;
    assert_eq!(backend(&r), "backend-2");
    let dead = stage.backends.named("backend-2");
    let dead_addr = dead.addr();
    dead.stop().await;
    let flagged = wait_until(Duration::from_secs(10), || async {
        let clusters = stage.envoy.admin_get("/clusters").await.unwrap_or_default();
        clusters.lines().any(|l| {
            l.starts_with(&format!("app::{dead_addr}::health_flags::"))
                && l.contains("failed_active_hc")
        })
    })
    .await;
    assert!(
        flagged,
        "Envoy marked the stopped backend unhealthy:\n{}",
        stage.envoy.log()
    );
    for _ in 0..6 {
        let r = stage.get_with_cookie("/", &value).await;
        assert_eq!(r.status, 200);
        let m = minted(&r).expect("re-pinned");
        assert_ne!(m.address(), dead_addr, "never a cookie for the dead host");
        assert_eq!(stage.backends.name_at(m.address()), backend(&r));
        assert!(m.decoded.cookie.expires.is_some_and(|e| e > now()));
    }
}
