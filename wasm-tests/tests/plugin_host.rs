//! The built plugin (`tether_plugin.wasm`), unit-level, in the in-process
//! proxy-wasm host: configuration, the request side (what Envoy is told),
//! the response side (what the client is sent), the shared test vectors, and
//! thousands of seeded random inputs that must never trap (a trap is a panic,
//! which in Envoy takes down the VM of a worker).
//!
//! The .wasm is built by the project's test command before `cargo test`:
//! `cargo build -p tether-plugin --target wasm32-wasip1 --profile wasm`
//! (`TETHER_PLUGIN_WASM` points elsewhere).

use std::time::Duration;

use serde_json::{json, Value};
use tether_core::address::AddressList;
use tether_core::cookie::{self, KeyRing, SessionCookie};
use tether_wasm_tests::host::{loaded_plugin, Host, HostError, LogLevel, StreamRecord};

/// The clock every test starts at (epoch seconds), below the expiry of the
/// vectors that carry one.
const NOW: u64 = 1_795_348_000;
const COOKIE: &str = "global-session-cookie";
const OVERRIDE: &str = "x-tether-override-host";
const A: &str = "127.0.0.1:19001";
const B: &str = "127.0.0.1:19002";
/// 16 bytes, base64.
const KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZg==";
/// `response.code_details` when the connection to the host was refused.
const CONNECT_FAILED: &str =
    "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_111}";

/// The lead's example configuration (cookie mode, list encoding), unsigned.
fn base() -> Value {
    json!({
        "cookie": { "name": COOKIE, "path": "/", "ttl": "120s",
                    "attributes": [ { "name": "SameSite", "value": "Lax" } ] },
        "strict": false,
        "format": "envoy",
        "override_header": OVERRIDE,
        "override_encoding": "list"
    })
}

/// `base()` with the top-level fields of `changes` replaced (null removes).
fn config(changes: Value) -> String {
    let mut c = base();
    if let (Some(obj), Some(ch)) = (c.as_object_mut(), changes.as_object()) {
        for (k, v) in ch {
            if v.is_null() {
                obj.remove(k);
            } else {
                obj.insert(k.clone(), v.clone());
            }
        }
    }
    c.to_string()
}

/// A fresh VM configured with `config`, its clock at [`NOW`].
fn plugin(config: &str) -> Host {
    let mut host = loaded_plugin()
        .instantiate()
        .unwrap_or_else(|e| panic!("{e}"));
    host.set_epoch_seconds(NOW);
    match host.configure(config) {
        Ok(true) => host,
        Ok(false) => panic!("configuration refused: {config}\n{}", host.log_text()),
        Err(e) => panic!("configure trapped: {e}\nconfig: {config}"),
    }
}

/// How Envoy says the request was served, through stream properties.
#[derive(Debug, Clone, Copy)]
enum Upstream<'a> {
    /// A host of cluster `backends` answered.
    Served(&'a str),
    /// Connecting to the host failed (Envoy answers 503 itself).
    ConnectFailed(&'a str),
    /// No host was picked at all.
    NoHost,
}

/// A GET of `path` with `extra` headers, as Envoy hands it to filters.
fn request<'a>(path: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "example.test"),
        (":path", path),
    ];
    h.extend_from_slice(extra);
    h
}

fn set_upstream(
    s: &mut tether_wasm_tests::host::Stream<'_>,
    upstream: Upstream<'_>,
) -> &'static str {
    match upstream {
        Upstream::Served(addr) => {
            s.set_upstream_address(addr);
            s.set_response_code(200);
            s.set_property(&["response", "code_details"], "via_upstream");
            s.set_property(&["xds", "cluster_name"], "backends");
            "200"
        }
        Upstream::ConnectFailed(addr) => {
            s.set_upstream_address(addr);
            s.set_response_code(503);
            s.set_property(&["response", "code_details"], CONNECT_FAILED);
            s.set_property(
                &["upstream", "transport_failure_reason"],
                "delayed connect error: 111",
            );
            s.set_property(&["xds", "cluster_name"], "backends");
            "503"
        }
        Upstream::NoHost => {
            s.set_response_code(503);
            s.set_property(&["response", "code_details"], "no_healthy_upstream");
            s.set_property(&["xds", "cluster_name"], "backends");
            "503"
        }
    }
}

/// One request/response exchange; panics (naming the input) on any failure.
fn exchange(host: &mut Host, req: &[(&str, &str)], upstream: Upstream<'_>) -> StreamRecord {
    let mut s = host.stream().unwrap_or_else(|e| panic!("{e}"));
    s.request_headers(req, true)
        .unwrap_or_else(|e| panic!("{e}\nrequest: {req:?}"));
    let status = set_upstream(&mut s, upstream);
    s.response_headers(&[(":status", status), ("content-length", "0")], true)
        .unwrap_or_else(|e| panic!("{e}\nrequest: {req:?}, upstream {upstream:?}"));
    let rec = s.finish().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        host.violations().is_empty(),
        "ABI misuse: {:?}",
        host.violations()
    );
    rec
}

/// The `name=value` part of the only Set-Cookie of `rec`.
fn only_set_cookie(rec: &StreamRecord) -> String {
    let all = rec.response_headers_named("set-cookie");
    assert_eq!(all.len(), 1, "expected one Set-Cookie, got {all:?}");
    let pair = all[0].split(';').next().unwrap_or_default().to_string();
    assert!(pair.starts_with(&format!("{COOKIE}=")), "{}", all[0]);
    pair
}

/// A new session: a first request (no cookie) to `/` served by `addr`;
/// returns the `name=value` pair of the cookie it got.
fn session_on(host: &mut Host, addr: &str) -> String {
    only_set_cookie(&exchange(host, &request("/", &[]), Upstream::Served(addr)))
}

/// The session a `name=value` pair names.
fn session_of(pair: &str) -> SessionCookie {
    let value = pair.split_once('=').map_or("", |(_, v)| v);
    cookie::decode(value, &KeyRing::empty())
        .unwrap_or_else(|e| panic!("{pair}: {e:?}"))
        .cookie
}

fn addresses(list: &[&str]) -> AddressList {
    AddressList::parse(&list.join(",")).unwrap_or_else(|e| panic!("{list:?}: {e:?}"))
}

// --- configuration ------------------------------------------------------------

#[test]
fn the_full_example_configuration_is_accepted() {
    let full = config(json!({ "keys": [KEY], "accept_unsigned": false }));
    let host = plugin(&full);
    assert!(
        !host.logs().iter().any(|l| l.level >= LogLevel::Warn),
        "{}",
        host.log_text()
    );
    // Header mode and the other encoding are accepted too.
    plugin(&json!({ "header": { "name": "x-session" } }).to_string());
    plugin(&config(
        json!({ "override_header": "x-tether-session", "override_encoding": "session_header" }),
    ));
}

#[test]
fn invalid_configurations_are_refused_and_the_log_names_the_field() {
    let cases: &[(String, &str)] = &[
        (
            config(json!({ "cookie": { "name": COOKIE, "ttl": "-5s" } })),
            "cookie.ttl",
        ),
        (config(json!({ "cookie": { "name": "" } })), "cookie.name"),
        (config(json!({ "format": "xml" })), "format"),
        (config(json!({ "stict": true })), "stict"),
        (config(json!({ "strict": "yes" })), "strict"),
        (
            config(json!({ "override_encoding": "base32" })),
            "override_encoding",
        ),
        (
            config(json!({ "override_header": "bad header" })),
            "override_header",
        ),
        (config(json!({ "keys": ["c2hvcnQ="] })), "keys[0]"),
        (config(json!({ "header": { "name": "x-s" } })), "header"),
        (
            config(json!({ "cookie": { "name": COOKIE, "attributes": [{ "name": "a b" }] } })),
            "cookie.attributes[0].name",
        ),
        (String::new(), "configuration"),
        ("{\"cookie\":".to_string(), "configuration"),
    ];
    for (text, field) in cases {
        let mut host = loaded_plugin().instantiate().unwrap();
        let accepted = host
            .configure(text)
            .unwrap_or_else(|e| panic!("{e}\nconfig: {text}"));
        assert!(!accepted, "accepted: {text}");
        let log = host.log_text();
        assert!(
            host.logs()
                .iter()
                .any(|l| l.level >= LogLevel::Error && l.message.contains(field)),
            "no error naming {field:?} for {text}:\n{log}"
        );
    }
}

// --- request and response -------------------------------------------------------

#[test]
fn a_first_request_is_load_balanced_and_gets_a_cookie_after_the_response() {
    let mut host = plugin(&config(json!({})));
    let rec = exchange(&mut host, &request("/", &[]), Upstream::Served(A));
    assert_eq!(rec.request_header(OVERRIDE), None, "nothing to pin yet");
    let all = rec.response_headers_named("set-cookie");
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(
        all[0].ends_with("; Max-Age=120; Path=/; SameSite=Lax; HttpOnly"),
        "{}",
        all[0]
    );
    // Envoy quotes its cookie value; tether writes it the same way.
    assert!(all[0].starts_with(&format!("{COOKIE}=\"")), "{}", all[0]);
    let session = session_of(&only_set_cookie(&rec));
    assert_eq!(session.addresses, addresses(&[A]));
    assert_eq!(session.expires, Some(NOW + 120));
    assert_eq!(session.cluster.as_deref(), Some("backends"));
}

#[test]
fn a_replayed_cookie_pins_fifty_requests_without_a_new_cookie() {
    let mut host = plugin(&config(json!({})));
    let first = exchange(&mut host, &request("/", &[]), Upstream::Served(A));
    let pair = only_set_cookie(&first);
    for i in 0..50 {
        host.advance(Duration::from_secs(1)).unwrap();
        let rec = exchange(
            &mut host,
            &request("/", &[("cookie", &pair)]),
            Upstream::Served(A),
        );
        assert_eq!(rec.request_headers_named(OVERRIDE), [A], "request {i}");
        assert!(
            rec.response_headers_named("set-cookie").is_empty(),
            "request {i}"
        );
    }
}

#[test]
fn a_pinned_request_served_elsewhere_gets_a_cookie_for_the_host_that_served() {
    let mut host = plugin(&config(json!({})));
    let pair = session_on(&mut host, A);
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &pair)]),
        Upstream::Served(B),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);
    assert_eq!(
        session_of(&only_set_cookie(&rec)).addresses,
        addresses(&[B])
    );
}

#[test]
fn a_client_sent_override_header_is_stripped() {
    let mut host = plugin(&config(json!({})));
    // No session: the client's header must not reach Envoy at all.
    let rec = exchange(
        &mut host,
        &request(
            "/",
            &[(OVERRIDE, B), ("X-Tether-Override-Host", "10.9.9.9:80")],
        ),
        Upstream::Served(A),
    );
    assert!(
        rec.request_headers_named(OVERRIDE).is_empty(),
        "{:?}",
        rec.request_headers
    );
    // With a session: only the session's host, once.
    let pair = only_set_cookie(&rec);
    let rec = exchange(
        &mut host,
        &request("/", &[(OVERRIDE, B), ("cookie", &pair), (OVERRIDE, B)]),
        Upstream::Served(A),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);

    // Wiring (b): the header Envoy's own filter reads is protected the same way.
    let mut host = plugin(&config(json!({
        "override_header": "x-tether-session", "override_encoding": "session_header"
    })));
    let rec = exchange(
        &mut host,
        &request("/", &[("x-tether-session", "MTI3LjAuMC4xOjE5MDAy")]),
        Upstream::Served(A),
    );
    assert!(rec.request_headers_named("x-tether-session").is_empty());
}

#[test]
fn the_path_gate_leaves_other_paths_alone() {
    let cfg = config(json!({ "cookie": { "name": COOKIE, "path": "/app", "ttl": "120s" } }));
    let mut host = plugin(&cfg);
    let pair = only_set_cookie(&exchange(
        &mut host,
        &request("/app", &[]),
        Upstream::Served(A),
    ));
    for path in ["/app", "/app/x", "/app?q=1", "/app#f"] {
        let rec = exchange(
            &mut host,
            &request(path, &[("cookie", &pair)]),
            Upstream::Served(A),
        );
        assert_eq!(rec.request_headers_named(OVERRIDE), [A], "{path}");
    }
    for path in ["/", "/application", "/ap", "/other/app"] {
        let rec = exchange(
            &mut host,
            &request(path, &[("cookie", &pair)]),
            Upstream::Served(B),
        );
        assert!(rec.request_headers_named(OVERRIDE).is_empty(), "{path}");
        assert!(
            rec.response_headers_named("set-cookie").is_empty(),
            "{path}"
        );
        let rec = exchange(&mut host, &request(path, &[]), Upstream::Served(B));
        assert!(
            rec.response_headers_named("set-cookie").is_empty(),
            "{path}"
        );
    }
}

#[test]
fn header_mode_reads_and_writes_the_session_header() {
    let mut host = plugin(&json!({ "header": { "name": "x-session" } }).to_string());
    let b64 = |a: &str| {
        cookie::encode(
            &SessionCookie::new(addresses(&[a])),
            cookie::Format::Legacy,
            None,
        )
        .unwrap()
    };
    // No session: the response names the host that served.
    let rec = exchange(&mut host, &request("/", &[]), Upstream::Served(A));
    assert_eq!(rec.response_headers_named("x-session"), [b64(A)]);
    assert!(rec.response_headers_named("set-cookie").is_empty());
    // Pinned and served there: nothing to say.
    let rec = exchange(
        &mut host,
        &request("/", &[("x-session", &b64(A))]),
        Upstream::Served(A),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);
    assert!(rec.response_headers_named("x-session").is_empty());
    // Pinned, served elsewhere: the new host.
    let rec = exchange(
        &mut host,
        &request("/", &[("x-session", &b64(A))]),
        Upstream::Served(B),
    );
    assert_eq!(rec.response_headers_named("x-session"), [b64(B)]);
    // No path gate in header mode.
    let rec = exchange(
        &mut host,
        &request("/anything", &[("x-session", &b64(B))]),
        Upstream::Served(B),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [B]);
}

/// A gRPC cookie (A61) naming two addresses of one endpoint.
const TWO_ADDRESSES: &str = "MTAuMC4wLjE6ODAsWzIwMDE6ZGI4OjoxXTo4MDtjbHVzdGVyX2E=";

#[test]
fn override_encoding_list_names_every_address_in_order() {
    let mut host = plugin(&config(json!({ "override_encoding": "list" })));
    let cookie = format!("{COOKIE}={TWO_ADDRESSES}");
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &cookie)]),
        Upstream::Served("10.0.0.1:80"),
    );
    assert_eq!(
        rec.request_headers_named(OVERRIDE),
        ["10.0.0.1:80,[2001:db8::1]:80"]
    );
}

#[test]
fn override_encoding_session_header_writes_base64_of_the_primary_and_hides_the_echo() {
    let mut host = plugin(&config(json!({
        "override_header": "x-tether-session", "override_encoding": "session_header"
    })));
    let cookie = format!("{COOKIE}={TWO_ADDRESSES}");
    let mut s = host.stream().unwrap();
    s.request_headers(&request("/", &[("cookie", &cookie)]), true)
        .unwrap();
    assert_eq!(
        s.record().request_headers_named("x-tether-session"),
        // base64("10.0.0.1:80"): what Envoy's header-mode filter reads.
        ["MTAuMC4wLjE6ODA="]
    );
    set_upstream(&mut s, Upstream::Served("10.0.0.1:80"));
    // Envoy's header-mode filter answers with the served host in the same
    // header; the client gets the plugin's cookie instead.
    s.response_headers(
        &[(":status", "200"), ("x-tether-session", "MTAuMC4wLjE6ODA=")],
        false,
    )
    .unwrap();
    let rec = s.finish().unwrap();
    assert!(rec.response_headers_named("x-tether-session").is_empty());
}

#[test]
fn no_cookie_is_set_for_a_host_that_failed_to_connect() {
    let mut host = plugin(&config(json!({})));
    let rec = exchange(&mut host, &request("/", &[]), Upstream::ConnectFailed(A));
    assert!(
        rec.response_headers_named("set-cookie").is_empty(),
        "{:?}",
        rec.response_headers
    );
    let rec = exchange(&mut host, &request("/", &[]), Upstream::NoHost);
    assert!(rec.response_headers_named("set-cookie").is_empty());
    // Pinned to a host that is now down: no cookie for it, nor for anything.
    let pair = session_on(&mut host, A);
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &pair)]),
        Upstream::ConnectFailed(B),
    );
    assert!(rec.response_headers_named("set-cookie").is_empty());
    // Once another host answers, the session moves there.
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &pair)]),
        Upstream::Served(B),
    );
    assert_eq!(
        session_of(&only_set_cookie(&rec)).addresses,
        addresses(&[B])
    );
}

#[test]
fn strict_answers_503_instead_of_moving_the_session() {
    let mut host = plugin(&config(json!({ "strict": true })));
    let pair = session_on(&mut host, A);
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &pair)]),
        Upstream::Served(B),
    );
    let local = rec.local_response.clone().expect("a local 503");
    assert_eq!(local.status, 503);
    assert!(rec.response_headers_named("set-cookie").is_empty());
    // Served where pinned: untouched.
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &pair)]),
        Upstream::Served(A),
    );
    assert!(rec.local_response.is_none());
}

#[test]
fn signed_cookies_pin_and_unsigned_or_forged_ones_do_not() {
    let mut host = plugin(&config(json!({ "keys": [KEY] })));
    let pair = session_on(&mut host, A);
    let value = pair
        .split_once('=')
        .unwrap()
        .1
        .trim_matches('"')
        .to_string();
    let keys = KeyRing::from_base64([KEY]).unwrap();
    let decoded = cookie::decode(&value, &keys).unwrap();
    assert!(
        matches!(decoded.signature, cookie::Signature::Valid { .. }),
        "{decoded:?}"
    );
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &pair)]),
        Upstream::Served(A),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);
    // A stock Envoy cookie for B carries no MAC: ignored without accept_unsigned.
    let unsigned = format!("{COOKIE}=Cg8xMjcuMC4wLjE6MTkwMDI=");
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &unsigned)]),
        Upstream::Served(A),
    );
    assert!(rec.request_headers_named(OVERRIDE).is_empty());
    only_set_cookie(&rec);
    // The signed cookie re-encoded with B instead of A (MAC now wrong).
    let mut forged = decoded.cookie.clone();
    forged.addresses = addresses(&[B]);
    let forged_value = cookie::encode(
        &forged,
        cookie::Format::Envoy,
        KeyRing::from_base64(["ZmVkY2JhOTg3NjU0MzIxMA=="])
            .unwrap()
            .signer(),
    )
    .unwrap();
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &format!("{COOKIE}={forged_value}"))]),
        Upstream::Served(A),
    );
    assert!(
        rec.request_headers_named(OVERRIDE).is_empty(),
        "a forged MAC was honoured"
    );
    // With accept_unsigned, a stock cookie pins and is upgraded to a signed one.
    let mut host = plugin(&config(json!({ "keys": [KEY], "accept_unsigned": true })));
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &unsigned)]),
        Upstream::Served(B),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [B]);
    let upgraded = only_set_cookie(&rec);
    let value = upgraded.split_once('=').unwrap().1.trim_matches('"');
    assert!(matches!(
        cookie::decode(value, &keys).unwrap().signature,
        cookie::Signature::Valid { .. }
    ));
}

/// Hostcalls of one pinned request served where it points, request side and
/// response side.
fn hot_path_calls(cfg: &str, header: &str) -> (u64, u64, String) {
    let mut host = plugin(cfg);
    let pair = session_on(&mut host, A);
    let mut s = host.stream().unwrap();
    s.host_mut().clear_call_counts();
    s.request_headers(&request("/", &[("cookie", &pair)]), true)
        .unwrap();
    assert_eq!(
        s.record().request_headers_named(header).len(),
        1,
        "not pinned"
    );
    let on_request: u64 = s.host().call_counts().values().sum();
    let mut shown = format!("request {:?}", s.host().call_counts());
    s.host_mut().clear_call_counts();
    set_upstream(&mut s, Upstream::Served(A));
    s.response_headers(&[(":status", "200")], false).unwrap();
    let on_response: u64 = s.host().call_counts().values().sum();
    shown += &format!(", response {:?}", s.host().call_counts());
    (on_request, on_response, shown)
}

#[test]
fn a_pinned_request_costs_the_documented_hostcalls() {
    // Every hostcall costs in Envoy (see the README's benchmark); the plugin's
    // README promises, for a replayed cookie served where it points: all
    // request headers at once + the override header; then upstream.address
    // in wiring (a), or in wiring (b) one read of the header Envoy's own
    // filter would echo had another host answered.
    let (req, resp, shown) = hot_path_calls(&config(json!({})), OVERRIDE);
    assert_eq!((req, resp), (2, 1), "wiring (a): {shown}");
    let cfg = config(
        json!({ "override_header": "x-tether-session", "override_encoding": "session_header" }),
    );
    let (req, resp, shown) = hot_path_calls(&cfg, "x-tether-session");
    assert_eq!((req, resp), (2, 1), "wiring (b): {shown}");
}

#[test]
fn cookie_expiry_follows_the_clock_the_plugin_reads_from_its_timer() {
    let mut host = plugin(&config(json!({})));
    assert!(
        host.tick_period_ms() > 0,
        "the plugin reads the clock from a timer"
    );
    let pair = session_on(&mut host, A);
    assert_eq!(session_of(&pair).expires, Some(NOW + 120));
    // 100 s later: still pinned; a new cookie expires 120 s after then.
    host.advance(Duration::from_secs(100)).unwrap();
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &pair)]),
        Upstream::Served(A),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);
    let rec = exchange(&mut host, &request("/", &[]), Upstream::Served(B));
    assert_eq!(session_of(&only_set_cookie(&rec)).expires, Some(NOW + 220));
    // Past its expiry the first cookie is ignored and replaced.
    host.advance(Duration::from_secs(21)).unwrap();
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &pair)]),
        Upstream::Served(B),
    );
    assert!(
        rec.request_headers_named(OVERRIDE).is_empty(),
        "an expired cookie pinned"
    );
    let fresh = session_of(&only_set_cookie(&rec));
    assert_eq!(
        (fresh.addresses, fresh.expires),
        (addresses(&[B]), Some(NOW + 241))
    );
}

// --- counters in the host's stats ---------------------------------------------------

/// The plugin's counters, as it names them (Envoy shows them under
/// `wasmcustom.`), in its README's order.
const COUNTERS: [&str; 11] = [
    "tether.session_cookie_pinned_total",
    "tether.session_cookie_refused_invalid_total",
    "tether.session_cookie_refused_unverified_total",
    "tether.session_cookie_refused_expired_total",
    "tether.session_cookie_written_new_total",
    "tether.session_cookie_written_moved_total",
    "tether.session_cookie_written_reissued_total",
    "tether.session_cookie_envoy_misreads",
    "tether.path_gate_bypassed_requests_total",
    "tether.config_errors_total",
    "tether.host_call_failures_total",
];

/// Every counter's value in `host`, in [`COUNTERS`]' order (all must be
/// defined, as counters).
fn counters(host: &Host) -> [u64; 11] {
    COUNTERS.map(|name| {
        let m = host
            .metrics()
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} not defined: {:?}", host.metrics()));
        assert_eq!(m.kind, 0, "{name} is not a counter");
        m.value
    })
}

/// The counters as (name, value), those not zero, for messages and checks.
fn moved(values: [u64; 11]) -> Vec<(&'static str, u64)> {
    COUNTERS
        .into_iter()
        .zip(values)
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// An `envoy` value for `addr` with `cluster` and `expires`, signed by `key`.
fn envoy_pair(
    addr: &str,
    cluster: Option<&str>,
    expires: Option<u64>,
    key: Option<&str>,
) -> String {
    let mut c = SessionCookie::new(addresses(&[addr]));
    c.cluster = cluster.map(String::from);
    c.expires = expires;
    let ring = KeyRing::from_base64(key).unwrap();
    let value = cookie::encode(&c, cookie::Format::Envoy, ring.signer()).unwrap();
    format!("{COOKIE}={value}")
}

#[test]
fn every_counter_is_defined_at_zero_by_the_first_configuration() {
    let host = plugin(&config(json!({})));
    assert_eq!(counters(&host), [0; 11]);
    assert_eq!(host.metrics().len(), COUNTERS.len(), "{:?}", host.metrics());
    // A second configuration defines nothing more.
    let mut host = host;
    assert_eq!(host.configure(&config(json!({ "strict": true }))), Ok(true));
    assert_eq!(host.metrics().len(), COUNTERS.len());
}

/// Each decision of the plugin moves its counter, in the VM's memory: the
/// request and response callbacks make no metric call (each would cost Envoy
/// a host call per request), and the timer hands the deltas over, one call
/// per counter that moved.
#[test]
fn requests_count_in_vm_memory_and_the_timer_hands_the_counts_over() {
    let cfg = config(json!({
        "cookie": { "name": COOKIE, "path": "/app", "ttl": "120s" }
    }));
    let mut host = plugin(&cfg);
    host.clear_call_counts();
    let get = |host: &mut Host, cookie: Option<&str>, path: &str, served: &str| {
        let extra: Vec<(&str, &str)> = cookie.map(|c| ("cookie", c)).into_iter().collect();
        exchange(host, &request(path, &extra), Upstream::Served(served))
    };
    // A new session, pinned twice; then answered by another host (moved).
    let pair = only_set_cookie(&get(&mut host, None, "/app", A));
    for _ in 0..2 {
        let rec = get(&mut host, Some(&pair), "/app/x", A);
        assert!(rec.response_headers_named("set-cookie").is_empty());
    }
    only_set_cookie(&get(&mut host, Some(&pair), "/app", B));
    // The session's host answered a cookie without the cluster: re-issued.
    let bare = envoy_pair(A, None, None, None);
    only_set_cookie(&get(&mut host, Some(&bare), "/app", A));
    // Refused: not a cookie, expired; each a new session.
    only_set_cookie(&get(&mut host, Some(&format!("{COOKIE}=%%%")), "/app", A));
    let expired = envoy_pair(A, Some("backends"), Some(NOW - 1), None);
    only_set_cookie(&get(&mut host, Some(&expired), "/app", A));
    // A plain legacy text stock Envoy misreads: pinned, counted, respelled.
    let plain = format!("{COOKIE}=MTAuMC4wLjE6ODA4MA==");
    only_set_cookie(&get(&mut host, Some(&plain), "/app", "10.0.0.1:8080"));
    // Outside the cookie path, twice: left alone.
    for _ in 0..2 {
        let rec = get(&mut host, Some(&pair), "/other", B);
        assert!(rec.request_headers_named(OVERRIDE).is_empty());
        assert!(rec.response_headers_named("set-cookie").is_empty());
    }

    let calls = |host: &Host, name: &str| host.call_counts().get(name).copied().unwrap_or(0);
    assert_eq!(calls(&host, "proxy_increment_metric"), 0);
    assert_eq!(calls(&host, "proxy_define_metric"), 0);
    assert_eq!(counters(&host), [0; 11], "nothing before the timer");
    host.tick().unwrap();
    let want = [
        ("tether.session_cookie_pinned_total", 5),
        ("tether.session_cookie_refused_invalid_total", 1),
        ("tether.session_cookie_refused_expired_total", 1),
        ("tether.session_cookie_written_new_total", 3),
        ("tether.session_cookie_written_moved_total", 1),
        ("tether.session_cookie_written_reissued_total", 2),
        ("tether.session_cookie_envoy_misreads", 1),
        ("tether.path_gate_bypassed_requests_total", 2),
    ];
    assert_eq!(moved(counters(&host)), want);
    assert_eq!(calls(&host, "proxy_increment_metric"), want.len() as u64);
    // Nothing new: a tick hands nothing over.
    host.clear_call_counts();
    host.tick().unwrap();
    assert_eq!(calls(&host, "proxy_increment_metric"), 0);
    assert_eq!(moved(counters(&host)), want);

    // A configuration refused: counted at once (it may never tick); the
    // one before keeps serving.
    assert_eq!(host.configure(&config(json!({ "stict": true }))), Ok(false));
    let mut now = counters(&host);
    assert_eq!(now[9], 1, "{:?}", moved(now));
    // The clock read as zero at a tick: a failed host call (the reading
    // before stays in use).
    host.set_epoch_seconds(0);
    host.tick().unwrap();
    let rec = get(&mut host, Some(&pair), "/app", A);
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);
    host.set_epoch_seconds(NOW);
    host.tick().unwrap();
    now[0] += 1;
    now[10] += 1;
    assert_eq!(counters(&host), now);
}

#[test]
fn cookies_the_keys_do_not_verify_count_as_refused_unverified() {
    let other = "b3RoZXItc2lnbmluZy1rZXk=";
    let mut host = plugin(&config(json!({ "keys": [KEY] })));
    for pair in [
        envoy_pair(A, Some("backends"), None, Some(other)),
        envoy_pair(A, Some("backends"), None, None),
    ] {
        let rec = exchange(
            &mut host,
            &request("/", &[("cookie", &pair)]),
            Upstream::Served(A),
        );
        assert!(rec.request_headers_named(OVERRIDE).is_empty(), "{pair}");
        only_set_cookie(&rec);
    }
    let signed = envoy_pair(A, Some("backends"), None, Some(KEY));
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &signed)]),
        Upstream::Served(A),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);
    host.tick().unwrap();
    assert_eq!(
        moved(counters(&host)),
        [
            ("tether.session_cookie_pinned_total", 1),
            ("tether.session_cookie_refused_unverified_total", 2),
            ("tether.session_cookie_written_new_total", 2),
        ]
    );
}

// --- shared vectors ----------------------------------------------------------------

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/vectors.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn every_decode_vector_pins_or_falls_back_with_a_fresh_cookie() {
    let all = vectors();
    let list = all["decode"].as_array().expect("decode vectors");
    assert!(list.len() >= 20, "{} vectors", list.len());
    let mut host = plugin(&config(json!({})));
    for v in list {
        let name = v["name"].as_str().unwrap_or("?");
        let value = v["value"].as_str().expect("value");
        let expect = &v["expect"];
        let now = v["now"].as_u64().unwrap_or(NOW);
        host.set_epoch_seconds(now);
        host.tick().unwrap();
        let header = format!("{COOKIE}={value}");
        let expired = expect["expires"].as_u64().is_some_and(|e| now > e);
        if let Some(list) = expect["addresses"].as_array().filter(|_| !expired) {
            assert_eq!(
                expect["signature"], "unsigned",
                "{name}: a signed vector needs keys in this test"
            );
            let want: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
            let rec = exchange(
                &mut host,
                &request("/", &[("cookie", &header)]),
                Upstream::Served(want[0]),
            );
            assert_eq!(
                rec.request_headers_named(OVERRIDE),
                [want.join(",")],
                "{name}"
            );
        } else {
            let rec = exchange(
                &mut host,
                &request("/", &[("cookie", &header)]),
                Upstream::Served(A),
            );
            assert!(
                rec.request_headers_named(OVERRIDE).is_empty(),
                "{name}: pinned"
            );
            assert_eq!(
                session_of(&only_set_cookie(&rec)).addresses,
                addresses(&[A]),
                "{name}: no fresh cookie"
            );
        }
    }
}

/// A `sealed` configuration under the base64 secrets `keys` (the first seals).
fn sealed_config(keys: &[&str]) -> String {
    config(json!({ "format": "sealed", "keys": keys }))
}

/// The key ring of `vectors.json`'s `sealed` section and its base64 secrets.
fn sealed_ring() -> (Vec<String>, KeyRing) {
    let v = vectors();
    let keys: Vec<String> = v["sealed"]["keys"]
        .as_array()
        .expect("sealed.keys")
        .iter()
        .filter_map(|k| k.as_str().map(String::from))
        .collect();
    let ring = KeyRing::from_base64(keys.iter().map(String::as_str)).expect("sealed keys");
    (keys, ring)
}

/// The session a sealed `name=value` pair names, and the index of the key
/// that opened it.
fn sealed_session_of(pair: &str, ring: &KeyRing) -> (SessionCookie, usize) {
    let value = pair.split_once('=').map_or("", |(_, v)| v);
    let d = cookie::decode(value, ring).unwrap_or_else(|e| panic!("{pair}: {e:?}"));
    assert_eq!(d.format, cookie::Format::Sealed, "{pair}");
    match d.signature {
        cookie::Signature::Valid { key } => (d.cookie, key),
        other => panic!("{pair}: {other:?}"),
    }
}

#[test]
fn every_sealed_vector_pins_or_falls_back_with_a_fresh_sealed_cookie() {
    let all = vectors();
    let (keys, ring) = sealed_ring();
    let list = all["sealed"]["open"].as_array().expect("sealed.open");
    assert!(list.len() >= 10, "{} vectors", list.len());
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut host = plugin(&sealed_config(&keys));
    host.set_epoch_seconds(all["sealed"]["now"].as_u64().expect("sealed.now"));
    host.tick().unwrap();
    for v in list {
        let name = v["name"].as_str().unwrap_or("?");
        let header = format!("{COOKIE}={}", v["value"].as_str().expect("value"));
        let expect = &v["expect"];
        let pinned = expect["addresses"]
            .as_array()
            .filter(|_| expect["expired"] == false);
        if let Some(list) = pinned {
            let want: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
            let rec = exchange(
                &mut host,
                &request("/", &[("cookie", &header)]),
                Upstream::Served(want[0]),
            );
            assert_eq!(
                rec.request_headers_named(OVERRIDE),
                [want.join(",")],
                "{name}"
            );
            // Served where pinned: left alone when the first key sealed
            // it, re-sealed under the first when an older key did.
            if expect["key"] == 0 {
                assert!(
                    rec.response_headers_named("set-cookie").is_empty(),
                    "{name}"
                );
            } else {
                let (session, key) = sealed_session_of(&only_set_cookie(&rec), &ring);
                assert_eq!((session.addresses, key), (addresses(&want), 0), "{name}");
            }
        } else {
            let rec = exchange(
                &mut host,
                &request("/", &[("cookie", &header)]),
                Upstream::Served(A),
            );
            assert!(
                rec.request_headers_named(OVERRIDE).is_empty(),
                "{name}: pinned"
            );
            let (session, key) = sealed_session_of(&only_set_cookie(&rec), &ring);
            assert_eq!(
                session.addresses,
                addresses(&[A]),
                "{name}: no fresh cookie"
            );
            assert_eq!(key, 0, "{name}: sealed by the first key");
        }
    }
}

#[test]
fn sealed_cookies_take_random_nonces_and_rotate_with_a_configuration_update() {
    let (keys, ring) = sealed_ring();
    let (new, old) = (keys[0].as_str(), keys[1].as_str());
    let mut host = plugin(&sealed_config(&[old]));
    let first = session_on(&mut host, A);
    let second = session_on(&mut host, A);
    // The same session, sealed twice with nonces from random_get.
    assert_ne!(first, second);
    assert_eq!(
        sealed_session_of(&first, &ring),
        sealed_session_of(&second, &ring)
    );
    assert_eq!(
        sealed_session_of(&first, &ring).1,
        1,
        "sealed by the old key"
    );

    // The new key is prepended without a restart: old cookies still pin,
    // new ones are sealed with the new key.
    assert!(host.configure(&sealed_config(&[new, old])).unwrap());
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &first)]),
        Upstream::Served(A),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);
    // ... and re-sealed under the new key where they are, so withdrawing
    // the old key later loses no session that came back meanwhile.
    let resealed = only_set_cookie(&rec);
    let (session, key) = sealed_session_of(&resealed, &ring);
    assert_eq!((session.addresses, key), (addresses(&[A]), 0));
    assert_eq!(sealed_session_of(&session_on(&mut host, B), &ring).1, 0);

    // The old key dropped: its cookies are no session any more.
    assert!(host.configure(&sealed_config(&[new])).unwrap());
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &first)]),
        Upstream::Served(B),
    );
    assert!(rec.request_headers_named(OVERRIDE).is_empty());
    let (session, key) = sealed_session_of(&only_set_cookie(&rec), &ring);
    assert_eq!((session.addresses, key), (addresses(&[B]), 0));
    let rec = exchange(
        &mut host,
        &request("/", &[("cookie", &resealed)]),
        Upstream::Served(A),
    );
    assert_eq!(rec.request_headers_named(OVERRIDE), [A]);
}

#[test]
fn a_sealed_configuration_without_usable_keys_is_refused_naming_the_field() {
    for (keys, says) in [
        (json!(null), r#"format: "sealed" needs keys"#),
        (
            json!([KEY]),
            r#"keys[0]: "<not shown>" decodes to 16 bytes; a sealing key needs at least 32"#,
        ),
    ] {
        let mut host = loaded_plugin().instantiate().unwrap();
        let c = config(json!({ "format": "sealed", "keys": keys }));
        assert!(!host.configure(&c).unwrap(), "{c}");
        assert!(host.log_text().contains(says), "{}", host.log_text());
        assert!(!host.log_text().contains(KEY), "a key in the log");
    }
}

// --- random and garbage inputs ------------------------------------------------------

/// SplitMix64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    /// Bytes a header value can carry through Envoy: anything but NUL, CR, LF.
    fn header_bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n)
            .map(|_| match self.next() as u8 {
                0 | b'\r' | b'\n' => b' ',
                b => b,
            })
            .collect()
    }
    fn ascii(&mut self, max: usize) -> String {
        let n = self.below(max + 1);
        (0..n)
            .map(|_| (0x20 + self.below(95)) as u8 as char)
            .collect()
    }
}

/// The test's seed: fixed, or `TETHER_FUZZ_SEED` to explore.
fn seed(salt: u64) -> u64 {
    std::env::var("TETHER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7e7e_5eed)
        ^ salt
}

fn b64(bytes: &[u8], pad: bool) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
        if pad {
            out.push_str(&"=".repeat(3 - chunk.len()));
        }
    }
    out
}

/// A cookie value: mostly near-misses of real ones, some pure noise.
fn cookie_value(rng: &mut Rng, seeds: &[String]) -> Vec<u8> {
    match rng.below(7) {
        0 => rng.header_bytes(48),
        1 => {
            let n = rng.below(40);
            let raw: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            b64(&raw, rng.chance(50)).into_bytes()
        }
        2 => {
            // Protobuf-shaped: tags, varints and lengths, some absurd.
            let mut raw = Vec::new();
            for _ in 0..rng.below(6) {
                let field = *rng.pick(&[1u8, 2, 3, 15, 100, 101, 127]);
                let wire = rng.below(6) as u8;
                raw.push(field << 3 | wire);
                match wire {
                    0 => raw.extend((0..rng.below(11)).map(|_| 0x80 | rng.next() as u8)),
                    2 => {
                        let len = *rng.pick(&[0u8, 1, 5, 15, 16, 0x7f, 0xff]);
                        raw.push(len);
                        raw.extend(rng.ascii(20).bytes());
                    }
                    _ => raw.extend((0..rng.below(8)).map(|_| rng.next() as u8)),
                }
            }
            b64(&raw, rng.chance(80)).into_bytes()
        }
        3 => {
            // gRPC-shaped text: addresses (some bad) and a cluster.
            let addrs = [
                A,
                B,
                "[::1]:8080",
                "10.0.0.1:80",
                "127.0.0.1",
                "127.0.0.1:99999",
                "::1:80",
                "[::1]",
                "",
                "999.0.0.1:1",
                "[2001:db8::1]:443",
                "a:b",
            ];
            let n = rng.below(5) + usize::from(rng.chance(5)) * 60;
            let list: Vec<&str> = (0..n).map(|_| *rng.pick(&addrs)).collect();
            let mut text = list.join(",");
            if rng.chance(70) {
                text.push(';');
                text.push_str(&rng.ascii(12));
            }
            b64(text.as_bytes(), rng.chance(70)).into_bytes()
        }
        4 | 5 => {
            // A real value, mutated.
            let mut v = rng.pick(seeds).clone().into_bytes();
            for _ in 0..=rng.below(3) {
                let at = rng.below(v.len() + 1);
                match rng.below(5) {
                    0 if at < v.len() => v[at] = *rng.pick(b"A/+=\"-_ ;,\x80\xff"),
                    1 => v.truncate(at),
                    2 => v.insert(at, *rng.pick(b"=\"A;, \t")),
                    3 if at < v.len() => {
                        v.remove(at);
                    }
                    _ => {
                        let tail = v[at..].to_vec();
                        v.extend_from_slice(&tail);
                    }
                }
            }
            v
        }
        _ => {
            // Long (a few KB: the interpreter is slow on long inputs, and
            // the cost is linear, so longer proves nothing more).
            let unit = rng.pick(seeds).clone();
            let max = if rng.chance(10) { 150 } else { 20 };
            unit.repeat(1 + rng.below(max)).into_bytes()
        }
    }
}

/// Request headers around a random cookie, with a random path and stray
/// override or session headers.
fn garbage_request(rng: &mut Rng, seeds: &[String]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let paths: &[&[u8]] = &[
        b"/",
        b"/app",
        b"/app/x",
        b"",
        b"?",
        b"/%zz",
        b"/\xff\xfe",
        b"//",
        b"/app?x#y",
    ];
    let mut h: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b":method".to_vec(), b"GET".to_vec()),
        (b":authority".to_vec(), b"example.test".to_vec()),
    ];
    let path = if rng.chance(10) {
        rng.header_bytes(64)
    } else {
        rng.pick(paths).to_vec()
    };
    if !rng.chance(3) {
        h.push((b":path".to_vec(), path));
    }
    for _ in 0..rng.below(4) {
        let mut line = Vec::new();
        for j in 0..rng.below(5) {
            if j > 0 {
                let seps: &[&[u8]] = &[b"; ", b";", b", ", b" ;  "];
                let sep: &[u8] = rng.pick::<&[u8]>(seps);
                line.extend_from_slice(sep);
            }
            let names: &[&[u8]] = &[
                COOKIE.as_bytes(),
                b"other",
                b"Global-Session-Cookie",
                b"",
                b"grpc-session",
            ];
            let name: &[u8] = rng.pick::<&[u8]>(names);
            line.extend_from_slice(name);
            if !rng.chance(5) {
                line.push(b'=');
            }
            let quoted = rng.chance(15);
            if quoted {
                line.push(b'"');
            }
            line.extend(cookie_value(rng, seeds));
            if quoted && rng.chance(80) {
                line.push(b'"');
            }
        }
        h.push((b"cookie".to_vec(), line));
    }
    for name in [OVERRIDE, "x-tether-session", "x-session"] {
        if rng.chance(20) {
            let value = if rng.chance(50) {
                cookie_value(rng, seeds)
            } else {
                rng.header_bytes(30)
            };
            h.push((name.as_bytes().to_vec(), value));
        }
    }
    h
}

fn garbage_upstream(rng: &mut Rng, s: &mut tether_wasm_tests::host::Stream<'_>) {
    let addrs: &[&[u8]] = &[
        A.as_bytes(),
        B.as_bytes(),
        b"[::1]:8080",
        b"",
        b"127.0.0.1",
        b"127.0.0.1:99999",
        b"\xff\xfe",
        b"unix:/tmp/s",
        b"10.0.0.1:80",
    ];
    if !rng.chance(10) {
        let a = if rng.chance(10) {
            rng.header_bytes(40)
        } else {
            rng.pick(addrs).to_vec()
        };
        s.set_property(&["upstream", "address"], a);
    }
    if !rng.chance(10) {
        let details: &[&[u8]] = &[
            b"via_upstream",
            CONNECT_FAILED.as_bytes(),
            b"",
            b"\xff",
            b"no_healthy_upstream",
        ];
        s.set_property(&["response", "code_details"], rng.pick(details).to_vec());
    }
    if !rng.chance(10) {
        let c = if rng.chance(30) {
            rng.header_bytes(40)
        } else {
            b"backends".to_vec()
        };
        s.set_property(&["xds", "cluster_name"], c);
    }
    if !rng.chance(10) {
        let code: Vec<u8> = if rng.chance(80) {
            200u64.to_le_bytes().to_vec()
        } else {
            rng.header_bytes(9)
        };
        s.set_property(&["response", "code"], code);
    }
}

/// The configurations the request fuzzing runs under, with the header each
/// one writes for Envoy and whether it holds a list (else base64 of one).
fn fuzz_configs() -> Vec<(String, &'static str, bool)> {
    vec![
        (config(json!({})), OVERRIDE, true),
        (
            config(json!({ "cookie": { "name": COOKIE, "path": "/app", "ttl": "0s" } })),
            OVERRIDE,
            true,
        ),
        (
            config(
                json!({ "override_header": "x-tether-session", "override_encoding": "session_header" }),
            ),
            "x-tether-session",
            false,
        ),
        (
            config(json!({ "strict": true, "format": "grpc" })),
            OVERRIDE,
            true,
        ),
        (
            config(json!({ "keys": [KEY], "accept_unsigned": true })),
            OVERRIDE,
            true,
        ),
        (
            config(
                json!({ "format": "legacy", "cookie": { "name": COOKIE, "ttl": "315576000000s" } }),
            ),
            OVERRIDE,
            true,
        ),
        (
            json!({ "header": { "name": "x-session" }, "override_header": OVERRIDE }).to_string(),
            OVERRIDE,
            true,
        ),
    ]
}

/// Whether `value` is what Envoy can read from the override header.
fn well_formed_override(value: &str, list: bool) -> bool {
    if list {
        AddressList::parse(value).is_ok()
    } else {
        cookie::decode(value, &KeyRing::empty())
            .is_ok_and(|d| d.format == cookie::Format::Legacy && d.cookie.addresses.len() == 1)
    }
}

/// Runs `cases` garbage exchanges over every fuzz configuration; any trap,
/// ABI misuse or malformed override header fails with the input.
fn fuzz_requests(salt: u64, cases: usize) {
    let seed = seed(salt);
    let mut rng = Rng(seed);
    let seeds: Vec<String> = vectors()["decode"]
        .as_array()
        .expect("decode vectors")
        .iter()
        .filter_map(|v| v["value"].as_str().map(String::from))
        .collect();
    let configs = fuzz_configs();
    let per = cases / configs.len() + 1;
    for (cfg, header, list) in &configs {
        let mut host = plugin(cfg);
        for i in 0..per {
            let req = garbage_request(&mut rng, &seeds);
            let time = match rng.below(20) {
                0 => 0,
                1 => u64::MAX / 1_000_000_000,
                _ => NOW + rng.below(1000) as u64,
            };
            host.set_epoch_seconds(time);
            let resp: Vec<(Vec<u8>, Vec<u8>)> = if rng.chance(20) {
                vec![
                    (b"set-cookie".to_vec(), rng.header_bytes(30)),
                    (b"x-tether-session".to_vec(), rng.header_bytes(30)),
                ]
            } else {
                vec![(b":status".to_vec(), b"200".to_vec())]
            };
            let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
                panic!(
                    "seed {seed:#x} case {i} ({what}): {e}\nconfig: {cfg}\nclock: {time}\nrequest: {:?}",
                    req.iter()
                        .map(|(k, v)| (String::from_utf8_lossy(k), String::from_utf8_lossy(v)))
                        .collect::<Vec<_>>()
                )
            };
            let pairs: Vec<(&[u8], &[u8])> = req.iter().map(|(k, v)| (&k[..], &v[..])).collect();
            let resp_pairs: Vec<(&[u8], &[u8])> =
                resp.iter().map(|(k, v)| (&k[..], &v[..])).collect();
            // The plugin reads the clock from its timer.
            host.tick().unwrap_or_else(|e| fail("tick", &e));
            let mut s = host.stream().unwrap_or_else(|e| fail("stream", &e));
            s.request_headers_bytes(&pairs, rng.chance(90))
                .unwrap_or_else(|e| fail("request", &e));
            let written = s.record().request_headers_named(header);
            if written.len() > 1 || written.iter().any(|v| !well_formed_override(v, *list)) {
                fail("override header", &format!("{header}: {written:?}"));
            }
            garbage_upstream(&mut rng, &mut s);
            s.response_headers_bytes(&resp_pairs, false)
                .unwrap_or_else(|e| fail("response", &e));
            s.finish().unwrap_or_else(|e| fail("finish", &e));
            if let Some(v) = host.violations().first() {
                fail("ABI misuse", v);
            }
        }
    }
}

#[test]
fn garbage_cookies_and_headers_never_trap_part_1() {
    fuzz_requests(1, 1000);
}

#[test]
fn garbage_cookies_and_headers_never_trap_part_2() {
    fuzz_requests(2, 1000);
}

/// A configuration: mostly the example with one field changed to something
/// odd, some broken JSON text, some raw bytes.
fn garbage_config(rng: &mut Rng) -> Vec<u8> {
    let odd_values = [
        json!(null),
        json!(true),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(1e300),
        json!(""),
        json!(" "),
        json!("120s"),
        json!("-0s"),
        json!("1e9s"),
        json!("0.000000001s"),
        json!("315576000001s"),
        json!("99999999999999999999s"),
        json!("\u{0}"),
        json!("é"),
        json!([]),
        json!([1, "a"]),
        json!({}),
        json!({ "name": "" }),
        json!([KEY, KEY]),
        json!("list"),
        json!("session_header"),
        json!("envoy"),
        json!("grpc"),
        json!("legacy"),
        json!({ "name": "x-s" }),
        json!({ "name": COOKIE, "attributes": [{ "name": "Secure" }, { "name": "Max-Age", "value": "1" }] }),
        json!({ "name": COOKIE, "path": "\u{7f}", "ttl": "1s" }),
        json!("a b"),
        json!("x-ok"),
    ];
    let fields = [
        "cookie",
        "header",
        "strict",
        "format",
        "keys",
        "accept_unsigned",
        "override_header",
        "override_encoding",
        "unknown",
        "",
    ];
    match rng.below(10) {
        0 => (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
        1 | 2 => {
            let mut text = config(json!({ "keys": [KEY] })).into_bytes();
            for _ in 0..=rng.below(4) {
                let at = rng.below(text.len() + 1);
                match rng.below(3) {
                    0 => text.truncate(at),
                    1 => text.insert(at, *rng.pick(b"{}[]\",:\\0e-")),
                    _ if at < text.len() => {
                        text.remove(at);
                    }
                    _ => {}
                }
            }
            text
        }
        3 => {
            // Deep nesting.
            let depth = 1 + rng.below(300);
            format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()
        }
        _ => {
            let mut c = base();
            for _ in 0..=rng.below(3) {
                let field = *rng.pick(&fields);
                let value = rng.pick(&odd_values).clone();
                if let Some(obj) = c.as_object_mut() {
                    obj.insert(field.to_string(), value);
                }
            }
            c.to_string().into_bytes()
        }
    }
}

#[test]
fn garbage_configurations_never_trap() {
    let seed = seed(3);
    let mut rng = Rng(seed);
    let mut host = loaded_plugin().instantiate().unwrap();
    host.set_epoch_seconds(NOW);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..600 {
        if i % 100 == 0 {
            // A fresh VM now and then, as Envoy makes one per worker.
            host = loaded_plugin().instantiate().unwrap();
            host.set_epoch_seconds(NOW);
        }
        let text = garbage_config(&mut rng);
        // The host passes bytes; the plugin must cope with non-UTF-8 too.
        let shown = String::from_utf8_lossy(&text).into_owned();
        let fail =
            |e: &HostError| -> ! { panic!("seed {seed:#x} config {i}: {e}\nconfig: {shown:?}") };
        let ok = host.configure_bytes(&text).unwrap_or_else(|e| fail(&e));
        if ok {
            accepted += 1;
            let cookie = format!("{COOKIE}=Cg8xMjcuMC4wLjE6MTkwMDE=");
            let mut s = host.stream().unwrap_or_else(|e| fail(&e));
            s.request_headers(
                &request("/", &[("cookie", &cookie), ("x-s", "MTI3LjAuMC4xOjE5MDAx")]),
                true,
            )
            .unwrap_or_else(|e| fail(&e));
            set_upstream(&mut s, Upstream::Served(B));
            s.response_headers(&[(":status", "200")], false)
                .unwrap_or_else(|e| fail(&e));
            s.finish().unwrap_or_else(|e| fail(&e));
        } else {
            refused += 1;
            // A refusal says why.
            let said = host.logs().iter().any(|l| l.level >= LogLevel::Error);
            assert!(
                said,
                "seed {seed:#x} config {i} refused silently: {shown:?}"
            );
        }
        host.clear_logs();
        if let Some(v) = host.violations().first() {
            panic!("seed {seed:#x} config {i}: ABI misuse {v}\nconfig: {shown:?}");
        }
    }
    // The generator must exercise both outcomes.
    assert!(
        accepted >= 10 && refused >= 100,
        "accepted {accepted}, refused {refused}"
    );
}

/// A plain `legacy` cookie for 10.0.0.1:8080 (text stock Envoy parses as a
/// protobuf without an address) pins the request; its response re-issues
/// it guarded, which every peer reads; each such request is counted in
/// `tether.session_cookie_envoy_misreads` (handed to the host by the timer),
/// and the address is logged once.
#[test]
fn a_cookie_stock_envoy_misreads_is_counted_logged_once_and_respelled() {
    let flagged = "10.0.0.1:8080";
    let plain = format!("{COOKIE}=MTAuMC4wLjE6ODA4MA==");
    let mut host = plugin(&config(json!({ "format": "legacy" })));
    for i in 1..=3u64 {
        let rec = exchange(
            &mut host,
            &request("/", &[("cookie", &plain)]),
            Upstream::Served(flagged),
        );
        assert_eq!(rec.request_headers_named(OVERRIDE), [flagged]);
        let pair = only_set_cookie(&rec);
        let value = pair.split_once('=').unwrap().1;
        let d = cookie::decode(value, &KeyRing::empty()).unwrap();
        assert_eq!(d.format, tether_core::Format::Legacy);
        assert!(!d.envoy_misreads, "{pair}");
        host.tick().unwrap();
        let count = host
            .metrics()
            .iter()
            .find(|m| m.name == "tether.session_cookie_envoy_misreads")
            .map(|m| (m.kind, m.value));
        assert_eq!(count, Some((0, i)), "request {i}");
        // The respelled cookie pins without a new one, and is not counted.
        let rec = exchange(
            &mut host,
            &request("/", &[("cookie", &pair)]),
            Upstream::Served(flagged),
        );
        assert!(rec.response_headers_named("set-cookie").is_empty());
    }
    let said: Vec<_> = host
        .logs()
        .iter()
        .filter(|l| {
            l.message
                .contains("stock Envoy's cookie session state does not read")
        })
        .collect();
    assert_eq!(said.len(), 1, "{}", host.log_text());
    assert!(said[0].message.contains(flagged), "{}", said[0].message);
}
