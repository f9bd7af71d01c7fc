//! How stock Envoy computes and judges its session cookie's `expires`, and
//! what that makes of tether's `envoy`-format cookies, with two Envoy
//! processes of the version under test (`ENVOY_BIN`; see
//! `scripts/envoy-versions.sh`).
//!
//! Envoy 1.36 to 1.38 stamp `expires` from the monotonic clock (seconds
//! since the host booted) and judge it against the same clock; 1.39 and
//! later use wall-clock epoch seconds. So, with a ttl:
//! - a cookie one Envoy mints is honoured by another on the same host (and
//!   after a restart) in every version;
//! - tether reads an Envoy cookie of any version (an expiry below
//!   `WALL_CLOCK_FLOOR` counts from boot and is not judged);
//! - tether's cookies carry wall-clock expiries: 1.39 and later judge them as
//!   tether does; 1.36 to 1.38 never find them expired (only the client's
//!   `Max-Age` bounds them).

use std::net::SocketAddr;

use tether_core::cookie::WALL_CLOCK_FLOOR;
use tether_core::http::set_cookie::CookieSpec;
use tether_core::session::{Lookup, Session, SessionRequest};
use tether_core::{Format, SessionConfig};
use tether_testkit::envoy::Envoy;
use tether_wasm_tests::scenario::{
    bootstrap, cookie, envoy_value, listener, minted, native_cookie_filter, now, route,
    start_envoy, static_cluster, Backends, COOKIE,
};

const TTL: u64 = 120;

fn yaml(port: u16, backends: &[SocketAddr]) -> String {
    bootstrap(
        vec![listener(
            "session",
            port,
            vec![native_cookie_filter(Some("120s"), false)],
            vec![route("/", "backends")],
        )],
        vec![static_cluster("backends", backends)],
    )
}

async fn envoy(backends: &Backends) -> (Envoy, SocketAddr) {
    let port = tether_testkit::free_port();
    let e = start_envoy(&yaml(port, &backends.addrs())).await;
    (e, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// `n` requests carrying `value` through `listen`: the backends that
/// answered, and how many responses set a new cookie.
async fn replay(listen: SocketAddr, value: &str, n: usize) -> (Vec<String>, usize) {
    let c = cookie(value);
    let mut served = Vec::new();
    let mut fresh = 0;
    for _ in 0..n {
        let r = tether_testkit::client::get(listen, "/", &[("cookie", &c)])
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        served.push(r.header("x-backend").unwrap_or_default().to_owned());
        fresh += usize::from(minted(&r).is_some());
    }
    (served, fresh)
}

fn uptime() -> u64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split('.').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_stamps_and_judges_expires_as_the_readme_says() {
    let version = tether_testkit::envoy::version().unwrap();
    let boot_clock = version < (1, 39, 0);
    let backends = Backends::start(3).await;
    let (a, listen_a) = envoy(&backends).await;
    let (b, listen_b) = envoy(&backends).await;
    let label = format!("Envoy {}.{}.{}", version.0, version.1, version.2);

    // What A stamps.
    let first = tether_testkit::client::get(listen_a, "/", &[])
        .await
        .unwrap();
    let m = minted(&first).unwrap_or_else(|| panic!("{label}: no cookie\n{}", a.log()));
    let served = first.header("x-backend").unwrap_or_default().to_owned();
    let expires = m.decoded.cookie.expires.expect("a ttl gives an expiry");
    if boot_clock {
        assert!(expires < WALL_CLOCK_FLOOR, "{label}: {expires}");
        let up = uptime();
        assert!(
            expires >= up + TTL - 2 && expires <= up + TTL + 2,
            "{label}: expires {expires}, uptime {up}"
        );
    } else {
        let want = now() + TTL;
        assert!(
            expires + 2 >= want && expires <= want + 2,
            "{label}: expires {expires}, wall clock + ttl {want}"
        );
    }

    // B, another process, honours A's cookie.
    let (at_b, fresh) = replay(listen_b, m.value.trim_matches('"'), 10).await;
    assert!(at_b.iter().all(|s| *s == served), "{label}: {at_b:?}");
    assert_eq!(fresh, 0, "{label}");

    // tether reads it, whichever clock stamped it.
    let spec = CookieSpec::new(COOKIE, "/", std::time::Duration::from_secs(TTL), vec![]).unwrap();
    let mut config = SessionConfig::cookie(spec);
    config.format = Format::Envoy;
    let session = Session::new(config).unwrap();
    let header = m.cookie_header();
    let lookup = session.lookup(
        &SessionRequest {
            path: "/",
            cookies: &[&header],
            header: None,
        },
        now(),
    );
    assert!(matches!(lookup, Lookup::Pinned(_)), "{label}: {lookup:?}");

    // tether's own cookies: a wall-clock expiry in the future is honoured
    // by every version; one in the past only by 1.36 to 1.38, which compare
    // it with seconds since boot.
    let target = backends.0[2].addr();
    let name = backends.name_at(target).to_owned();
    let future = envoy_value(target, Some(now() + TTL));
    let (at, fresh) = replay(listen_a, &future, 5).await;
    assert!(
        at.iter().all(|s| *s == name) && fresh == 0,
        "{label}: {at:?}"
    );
    let past = envoy_value(target, Some(now() - 60));
    let (at, fresh) = replay(listen_b, &past, 9).await;
    if boot_clock {
        assert!(
            at.iter().all(|s| *s == name) && fresh == 0,
            "{label}: {at:?}"
        );
    } else {
        assert_eq!(fresh, 9, "{label}: an expired cookie is replaced: {at:?}");
        assert!(at.iter().any(|s| *s != name), "{label}: balanced: {at:?}");
    }
    drop((a, b));
}
