//! The session decisions: what a request is pinned to and what its response
//! carries back.

use std::net::SocketAddr;
use std::time::Duration;
use tether_core::cookie::{self, Format, Key, KeyRing, SessionCookie};
use tether_core::http::set_cookie::{Attribute, CookieSpec};
use tether_core::session::{Emit, Lookup, Miss, Served, Session, SessionRequest};
use tether_core::{AddressList, SessionConfig};

const NOW: u64 = 1_800_000_000;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn cookie_session(path: &str, ttl: u64, format: Format) -> Session {
    let spec = CookieSpec::new(
        "global-session-cookie",
        path,
        Duration::from_secs(ttl),
        vec![Attribute::same_site("Lax").unwrap()],
    )
    .unwrap();
    let mut c = SessionConfig::cookie(spec);
    c.format = format;
    Session::new(c).unwrap()
}

fn signed_session(accept_unsigned: bool) -> Session {
    let spec = CookieSpec::new("s", "/", Duration::ZERO, vec![]).unwrap();
    let mut c = SessionConfig::cookie(spec);
    c.keys = KeyRing::new(vec![
        Key::from_secret(b"new-secret-0123456789").unwrap(),
        Key::from_secret(b"old-secret-0123456789").unwrap(),
    ]);
    c.accept_unsigned = accept_unsigned;
    Session::new(c).unwrap()
}

fn lookup(s: &Session, path: &str, cookies: &[&str]) -> Lookup {
    s.lookup(
        &SessionRequest {
            path,
            cookies,
            header: None,
        },
        NOW,
    )
}

fn served(a: &str) -> Served<'static> {
    Served {
        address: Some(addr(a)),
        ..Served::default()
    }
}

fn value_of(emit: Option<Emit>) -> String {
    match emit {
        Some(Emit::SetCookie(h)) => {
            let v = h.split(';').next().unwrap().split_once('=').unwrap().1;
            v.trim_matches('"').to_string()
        }
        other => panic!("expected a Set-Cookie, got {other:?}"),
    }
}

fn envoy_value(a: &str, expires: Option<u64>) -> String {
    let mut c = SessionCookie::new(AddressList::parse(a).unwrap());
    c.expires = expires;
    cookie::encode(&c, Format::Envoy, None).unwrap()
}

#[test]
fn first_request_gets_a_cookie_for_the_served_host() {
    let s = cookie_session("/", 120, Format::Envoy);
    let l = lookup(&s, "/x", &[]);
    assert_eq!(l, Lookup::Miss(Miss::Absent));
    assert_eq!(l.override_header_value(), None);
    let Some(Emit::SetCookie(h)) = s.respond(&l, &served("127.0.0.1:19002"), NOW) else {
        panic!()
    };
    let value = envoy_value("127.0.0.1:19002", Some(NOW + 120));
    assert_eq!(
        h,
        format!("global-session-cookie=\"{value}\"; Max-Age=120; Path=/; SameSite=Lax; HttpOnly")
    );
}

#[test]
fn pinned_replay_routes_there_and_sets_nothing() {
    let s = cookie_session("/", 0, Format::Envoy);
    let v = envoy_value("127.0.0.1:19001", None);
    let header = format!("a=b; global-session-cookie=\"{v}\"");
    let l = lookup(&s, "/", &[&header]);
    assert_eq!(
        l.override_header_value().as_deref(),
        Some("127.0.0.1:19001")
    );
    assert_eq!(s.respond(&l, &served("127.0.0.1:19001"), NOW), None);
    // Served elsewhere (the pinned host was gone): a new cookie for the new host.
    let moved = value_of(s.respond(&l, &served("127.0.0.1:19003"), NOW));
    assert_eq!(moved, envoy_value("127.0.0.1:19003", None));
}

#[test]
fn every_format_is_read_whatever_the_write_format() {
    let s = cookie_session("/", 0, Format::Envoy);
    for (value, want) in [
        ("MTI3LjAuMC4xOjQ0MztjbHVzdGVyXzE=", "127.0.0.1:443"), // grpc
        ("MTI3LjAuMC4xOjQ0Mw==", "127.0.0.1:443"),             // legacy
        (
            "MTAuMC4wLjE6ODAsWzIwMDE6ZGI4OjoxXTo4MDtjbHVzdGVyX2E=",
            "10.0.0.1:80,[2001:db8::1]:80",
        ),
    ] {
        let h = format!("global-session-cookie={value}");
        assert_eq!(
            lookup(&s, "/", &[&h]).override_header_value().as_deref(),
            Some(want)
        );
    }
}

#[test]
fn bad_cookies_are_no_session_and_get_a_fresh_cookie() {
    let s = cookie_session("/", 0, Format::Envoy);
    let expired = envoy_value("127.0.0.1:1", Some(NOW - 1));
    for (value, miss) in [
        (expired.as_str(), Miss::Expired(NOW - 1)),
        ("garbage!", Miss::Invalid(cookie::DecodeError::Base64)),
        ("\"unbalanced", Miss::Invalid(cookie::DecodeError::Quotes)),
    ] {
        let h = format!("global-session-cookie={value}");
        let l = lookup(&s, "/", &[&h]);
        assert_eq!(l, Lookup::Miss(miss));
        assert!(s.respond(&l, &served("127.0.0.1:2"), NOW).is_some());
    }
    // Still valid during its expiry second.
    let edge = envoy_value("127.0.0.1:1", Some(NOW));
    assert!(matches!(
        lookup(&s, "/", &[&format!("global-session-cookie={edge}")]),
        Lookup::Pinned(_)
    ));
}

#[test]
fn path_gate_bypasses_request_and_response() {
    let s = cookie_session("/api", 0, Format::Envoy);
    let v = envoy_value("127.0.0.1:1", None);
    let h = format!("global-session-cookie={v}");
    assert_eq!(lookup(&s, "/other", &[&h]), Lookup::Bypass);
    assert_eq!(
        s.respond(&Lookup::Bypass, &served("127.0.0.1:2"), NOW),
        None
    );
    assert!(matches!(lookup(&s, "/api?q=1", &[&h]), Lookup::Pinned(_)));
    assert!(matches!(lookup(&s, "/api/x", &[&h]), Lookup::Pinned(_)));
}

#[test]
fn never_mints_for_a_failed_connection_or_an_unknown_host() {
    let s = cookie_session("/", 0, Format::Envoy);
    let l = lookup(&s, "/", &[]);
    let failed = Served {
        address: Some(addr("127.0.0.1:9")),
        connect_failed: true,
        ..Served::default()
    };
    assert_eq!(s.respond(&l, &failed, NOW), None);
    assert_eq!(s.respond(&l, &Served::default(), NOW), None);
}

#[test]
fn grpc_format_matches_c_core_and_tracks_cluster_and_addresses() {
    let s = cookie_session("/", 60, Format::Grpc);
    let l = lookup(&s, "/", &[]);
    let srv = Served {
        cluster: Some("cluster-ssa"),
        ..served("127.0.0.1:41271")
    };
    let Some(Emit::SetCookie(h)) = s.respond(&l, &srv, NOW) else {
        panic!()
    };
    assert_eq!(
        h,
        "global-session-cookie=MTI3LjAuMC4xOjQxMjcxO2NsdXN0ZXItc3Nh; HttpOnly; Path=/; Max-Age=60; SameSite=Lax"
    );
    // Pinned with the same cluster: nothing. A cookie without a cluster is rewritten once (A60).
    let same = lookup(
        &s,
        "/",
        &["global-session-cookie=MTI3LjAuMC4xOjQxMjcxO2NsdXN0ZXItc3Nh"],
    );
    assert_eq!(s.respond(&same, &srv, NOW), None);
    let legacy = lookup(&s, "/", &["global-session-cookie=MTI3LjAuMC4xOjQxMjcx"]);
    assert_eq!(
        value_of(s.respond(&legacy, &srv, NOW)),
        "MTI3LjAuMC4xOjQxMjcxO2NsdXN0ZXItc3Nh"
    );
    // The endpoint's address list changed (A61): rewritten with the new list.
    let others = [addr("[::1]:41271")];
    let multi = Served {
        other_addresses: &others,
        ..srv
    };
    let v = value_of(s.respond(&same, &multi, NOW));
    let d = cookie::decode(&v, &KeyRing::empty()).unwrap();
    assert_eq!(
        d.cookie.addresses.to_string(),
        "127.0.0.1:41271,[::1]:41271"
    );
}

#[test]
fn legacy_format_writes_only_the_address() {
    let s = cookie_session("/", 30, Format::Legacy);
    let others = [addr("[::1]:1")];
    let srv = Served {
        other_addresses: &others,
        cluster: Some("c"),
        ..served("127.0.0.1:1")
    };
    let v = value_of(s.respond(&lookup(&s, "/", &[]), &srv, NOW));
    assert_eq!(v, "MTI3LjAuMC4xOjE=");
}

#[test]
fn signed_cookies_verify_with_any_key_and_reject_forgeries() {
    let s = signed_session(false);
    let v = value_of(s.respond(&lookup(&s, "/", &[]), &served("127.0.0.1:7"), NOW));
    let h = format!("s={v}");
    assert!(matches!(lookup(&s, "/", &[&h]), Lookup::Pinned(_)));

    // Signed by the old key (second in the ring): still honoured (rotation).
    let old = KeyRing::new(vec![Key::from_secret(b"old-secret-0123456789").unwrap()]);
    let c = SessionCookie::new(AddressList::parse("127.0.0.1:7").unwrap());
    let by_old = cookie::encode(&c, Format::Envoy, old.signer()).unwrap();
    assert!(matches!(
        lookup(&s, "/", &[&format!("s={by_old}")]),
        Lookup::Pinned(_)
    ));

    // Signed by a key not in the ring, or tampered: no session.
    let other = KeyRing::new(vec![Key::from_secret(b"attacker-key-0123456789").unwrap()]);
    let forged = cookie::encode(&c, Format::Envoy, other.signer()).unwrap();
    assert_eq!(
        lookup(&s, "/", &[&format!("s={forged}")]),
        Lookup::Miss(Miss::BadMac)
    );
    // Unsigned cookies are refused unless accept_unsigned.
    let plain = envoy_value("127.0.0.1:7", None);
    assert_eq!(
        lookup(&s, "/", &[&format!("s={plain}")]),
        Lookup::Miss(Miss::Unsigned)
    );
    let lenient = signed_session(true);
    let l = lookup(&lenient, "/", &[&format!("s={plain}")]);
    assert!(matches!(l, Lookup::Pinned(_)));
    // ... and are upgraded to a signed cookie on the way back.
    let up = value_of(lenient.respond(&l, &served("127.0.0.1:7"), NOW));
    assert!(matches!(
        lookup(&s, "/", &[&format!("s={up}")]),
        Lookup::Pinned(_)
    ));
}

#[test]
fn header_mode_reads_and_writes_the_header() {
    let s = Session::new(SessionConfig::header("X-Session").unwrap()).unwrap();
    assert_eq!(s.header_name(), Some("x-session"));
    let req = SessionRequest {
        path: "/anything",
        cookies: &[],
        header: Some("MTI3LjAuMC4xOjQ0Mw=="),
    };
    let l = s.lookup(&req, NOW);
    assert_eq!(l.override_header_value().as_deref(), Some("127.0.0.1:443"));
    assert_eq!(s.respond(&l, &served("127.0.0.1:443"), NOW), None);
    assert_eq!(
        s.respond(&l, &served("127.0.0.1:444"), NOW),
        Some(Emit::Header {
            name: "x-session".into(),
            value: "MTI3LjAuMC4xOjQ0NA==".into()
        })
    );
}

#[test]
fn first_cookie_of_the_name_wins() {
    let s = cookie_session("/", 0, Format::Envoy);
    let a = envoy_value("127.0.0.1:1", None);
    let b = envoy_value("127.0.0.1:2", None);
    let h1 = format!("global-session-cookie={a}");
    let h2 = format!("global-session-cookie={b}");
    assert_eq!(
        lookup(&s, "/", &[&h1, &h2])
            .override_header_value()
            .as_deref(),
        Some("127.0.0.1:1")
    );
}

#[test]
fn signing_needs_the_envoy_format() {
    let spec = CookieSpec::new("s", "", Duration::ZERO, vec![]).unwrap();
    let mut c = SessionConfig::cookie(spec);
    c.format = Format::Grpc;
    c.keys = KeyRing::new(vec![Key::from_secret(b"0123456789abcdef").unwrap()]);
    let err = Session::new(c).unwrap_err();
    assert_eq!(
        err.to_string(),
        "format: \"grpc\" cannot carry a MAC; signing keys need format \"envoy\""
    );
}

#[test]
fn strict_refuses_only_a_fallback_host() {
    let mut c = SessionConfig::cookie(CookieSpec::new("s", "/", Duration::ZERO, vec![]).unwrap());
    c.strict = true;
    let strict = Session::new(c).unwrap();
    let loose = cookie_session("/", 0, Format::Envoy);
    let pinned_value = envoy_value("127.0.0.1:1,127.0.0.1:2", None);
    let cookie = format!("s={pinned_value}");
    let pinned = lookup(&strict, "/", &[&cookie]);
    assert!(matches!(pinned, Lookup::Pinned(_)));
    // Another host answered: the load balancer fell back.
    assert!(strict.strict_refuses(&pinned, &served("127.0.0.1:9")));
    assert!(!loose.strict_refuses(&pinned, &served("127.0.0.1:9")));
    // Any of the session's addresses is the session's endpoint.
    assert!(!strict.strict_refuses(&pinned, &served("127.0.0.1:1")));
    assert!(!strict.strict_refuses(&pinned, &served("127.0.0.1:2")));
    // A failed connection is an error already; an unknown host is not judged.
    let failed = Served {
        connect_failed: true,
        ..served("127.0.0.1:9")
    };
    assert!(!strict.strict_refuses(&pinned, &failed));
    assert!(!strict.strict_refuses(&pinned, &Served::default()));
    // Without a session there is nothing to be strict about.
    let miss = lookup(&strict, "/", &[]);
    assert!(!strict.strict_refuses(&miss, &served("127.0.0.1:9")));
}

/// A plain `legacy` cookie for an address whose text stock Envoy takes for
/// a protobuf (10.0.0.1:8080) still pins, and is re-issued once in a form
/// Envoy reads: guarded in `legacy`, Envoy's own in `envoy`; `grpc` (never
/// Envoy's) and header mode leave it alone.
#[test]
fn a_cookie_stock_envoy_misreads_is_respelled_once() {
    let plain = "MTAuMC4wLjE6ODA4MA==";
    let a = "10.0.0.1:8080";
    for format in [Format::Legacy, Format::Envoy] {
        let s = cookie_session("/", 0, format);
        let l = lookup(&s, "/", &[&format!("global-session-cookie={plain}")]);
        assert_eq!(l.override_header_value().as_deref(), Some(a), "{format}");
        let value = value_of(s.respond(&l, &served(a), NOW));
        let again = cookie::decode(&value, &KeyRing::empty()).unwrap();
        assert!(!again.envoy_misreads, "{format}: {value}");
        assert_eq!(again.cookie.addresses.primary(), addr(a));
        // The respelled cookie is honoured as it is.
        let l = lookup(&s, "/", &[&format!("global-session-cookie={value}")]);
        assert_eq!(s.respond(&l, &served(a), NOW), None, "{format}");
    }
    // An address Envoy reads as text: nothing to respell.
    let s = cookie_session("/", 0, Format::Legacy);
    let l = lookup(&s, "/", &["global-session-cookie=MTI3LjAuMC4xOjQ0Mw=="]);
    assert_eq!(s.respond(&l, &served("127.0.0.1:443"), NOW), None);
    // Header mode: Envoy's header reader takes the plain text.
    let s = Session::new(SessionConfig::header("x-session").unwrap()).unwrap();
    let req = SessionRequest {
        path: "/",
        cookies: &[],
        header: Some(plain),
    };
    let l = s.lookup(&req, NOW);
    assert_eq!(s.respond(&l, &served(a), NOW), None);
}

/// Envoy 1.36 to 1.38 wrote `expires` as seconds since their host booted:
/// tether cannot judge such a value and keeps the session; a wall-clock
/// expiry is judged as before.
#[test]
fn an_expiry_counted_from_boot_is_not_judged() {
    let s = cookie_session("/", 0, Format::Envoy);
    let since_boot = envoy_value("10.0.0.2:80", Some(1_122));
    let l = lookup(&s, "/", &[&format!("global-session-cookie={since_boot}")]);
    assert_eq!(l.override_header_value().as_deref(), Some("10.0.0.2:80"));
    let past = envoy_value("10.0.0.2:80", Some(NOW - 1));
    let l = lookup(&s, "/", &[&format!("global-session-cookie={past}")]);
    assert!(matches!(l, Lookup::Miss(Miss::Expired(_))), "{l:?}");
}

const NEW_KEY: &[u8; 32] = b"new-sealing-secret-0123456789abc";
const OLD_KEY: &[u8; 32] = b"old-sealing-secret-0123456789abc";

fn sealed_session(keys: &[&[u8]], accept_unsigned: bool) -> Session {
    let spec = CookieSpec::new("s", "/", Duration::from_secs(60), vec![]).unwrap();
    let mut c = SessionConfig::cookie(spec);
    c.format = Format::Sealed;
    c.keys = KeyRing::new(keys.iter().map(|k| Key::from_secret(k).unwrap()).collect());
    c.accept_unsigned = accept_unsigned;
    Session::new(c).unwrap()
}

#[test]
fn a_sealed_cookie_pins_and_a_tampered_one_gets_a_fresh_pick() {
    let s = sealed_session(&[NEW_KEY], false);
    let nonce = [9; cookie::sealed::NONCE_LEN];
    let first = s.respond_with(&lookup(&s, "/", &[]), &served("10.0.0.1:80"), NOW, &nonce);
    let v = value_of(first);
    let pinned = lookup(&s, "/", &[&format!("s={v}")]);
    let Lookup::Pinned(pin) = &pinned else {
        panic!("{pinned:?}")
    };
    assert_eq!(pin.format, Format::Sealed);
    assert_eq!(pin.cookie.expires, Some(NOW + 60));
    // Served where it is pinned: nothing to send back.
    assert_eq!(s.respond(&pinned, &served("10.0.0.1:80"), NOW), None);

    // Each nonce gives another value for the same session.
    let again = value_of(s.respond_with(
        &lookup(&s, "/", &[]),
        &served("10.0.0.1:80"),
        NOW,
        &[10; cookie::sealed::NONCE_LEN],
    ));
    assert_ne!(again, v);

    // One character changed: no session, a fresh pick, a new cookie.
    let mut tampered = v.clone().into_bytes();
    tampered[10] = if tampered[10] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let l = lookup(&s, "/", &[&format!("s={tampered}")]);
    assert_eq!(l, Lookup::Miss(Miss::Invalid(cookie::DecodeError::Sealed)));
    let fresh = value_of(s.respond_with(&l, &served("10.0.0.2:80"), NOW, &nonce));
    assert!(matches!(
        lookup(&s, "/", &[&format!("s={fresh}")]),
        Lookup::Pinned(p) if p.cookie.addresses.primary() == addr("10.0.0.2:80")
    ));

    // Expired: no session.
    let late = s.lookup(
        &SessionRequest {
            path: "/",
            cookies: &[&format!("s={v}")],
            header: None,
        },
        NOW + 61,
    );
    assert_eq!(late, Lookup::Miss(Miss::Expired(NOW + 60)));
}

#[test]
fn sealed_rotation_old_key_reads_new_key_writes() {
    let before = sealed_session(&[OLD_KEY], false);
    let old = value_of(before.respond(&lookup(&before, "/", &[]), &served("10.0.0.1:80"), NOW));
    let after = sealed_session(&[NEW_KEY, OLD_KEY], false);
    let l = lookup(&after, "/", &[&format!("s={old}")]);
    assert!(
        matches!(&l, Lookup::Pinned(p) if p.signature == tether_core::Signature::Valid { key: 1 })
    );
    // Still pinned where it is, and re-sealed under the writing key, so
    // the session outlives the old key's withdrawal.
    let resealed = value_of(after.respond(&l, &served("10.0.0.1:80"), NOW));
    let new_only = sealed_session(&[NEW_KEY], false);
    assert!(matches!(
        lookup(&new_only, "/", &[&format!("s={resealed}")]),
        Lookup::Pinned(p) if p.cookie.addresses.primary() == addr("10.0.0.1:80")
    ));
    let moved = value_of(after.respond(&l, &served("10.0.0.2:80"), NOW));
    assert!(matches!(
        lookup(&new_only, "/", &[&format!("s={moved}")]),
        Lookup::Pinned(_)
    ));
    // Once the old key is dropped, its cookies are no session.
    assert_eq!(
        lookup(&new_only, "/", &[&format!("s={old}")]),
        Lookup::Miss(Miss::Invalid(cookie::DecodeError::Sealed))
    );
}

#[test]
fn under_sealed_an_unsealed_cookie_is_refused_or_upgraded() {
    let plain = envoy_value("10.0.0.1:80", None);
    let signed = {
        let ring = KeyRing::new(vec![Key::from_secret(NEW_KEY).unwrap()]);
        let c = SessionCookie::new(AddressList::parse("10.0.0.1:80").unwrap());
        cookie::encode(&c, Format::Envoy, ring.signer()).unwrap()
    };
    let strict = sealed_session(&[NEW_KEY], false);
    assert_eq!(
        lookup(&strict, "/", &[&format!("s={plain}")]),
        Lookup::Miss(Miss::Unsigned)
    );
    // Signed by the same key, yet readable by anyone: not sealed.
    assert_eq!(
        lookup(&strict, "/", &[&format!("s={signed}")]),
        Lookup::Miss(Miss::Unsealed)
    );
    let migrating = sealed_session(&[NEW_KEY], true);
    for v in [plain, signed] {
        let l = lookup(&migrating, "/", &[&format!("s={v}")]);
        assert!(matches!(l, Lookup::Pinned(_)), "{v}: {l:?}");
        // Re-issued sealed, for the same host.
        let up = value_of(migrating.respond(&l, &served("10.0.0.1:80"), NOW));
        assert!(matches!(
            lookup(&strict, "/", &[&format!("s={up}")]),
            Lookup::Pinned(p) if p.format == Format::Sealed
        ));
    }
}

#[test]
fn sealed_header_mode_and_config_errors() {
    let mut c = SessionConfig::header("x-session").unwrap();
    c.format = Format::Sealed;
    assert_eq!(
        Session::new(c.clone()).unwrap_err().to_string(),
        r#"format: "sealed" needs keys (base64 secrets of at least 32 bytes; the first seals, all open)"#
    );
    c.keys = KeyRing::new(vec![
        Key::from_secret(NEW_KEY).unwrap(),
        Key::from_secret(b"only-sixteen-b16").unwrap(),
    ]);
    assert_eq!(
        Session::new(c.clone()).unwrap_err().to_string(),
        r#"keys[1]: "<not shown>" decodes to 16 bytes; a sealing key needs at least 32"#
    );
    c.keys = KeyRing::new(vec![Key::from_secret(NEW_KEY).unwrap()]);
    let s = Session::new(c).unwrap();
    let emit = s.respond(
        &Lookup::Miss(Miss::Absent),
        &served("[2001:db8::1]:80"),
        NOW,
    );
    let Some(Emit::Header { name, value }) = emit else {
        panic!("{emit:?}")
    };
    assert_eq!(name, "x-session");
    let l = s.lookup(
        &SessionRequest {
            path: "/",
            cookies: &[],
            header: Some(&value),
        },
        NOW,
    );
    assert_eq!(
        l.override_header_value().as_deref(),
        Some("[2001:db8::1]:80")
    );
}

#[test]
fn key_files_name_the_line_never_the_secret() {
    let good = "# sealing keys, newest first\n\nbmV3LXNlYWxpbmctc2VjcmV0LTAxMjM0NTY3ODlhYmM=\n  b2xkLXNlYWxpbmctc2VjcmV0LTAxMjM0NTY3ODlhYmM=  \n";
    let ring = KeyRing::from_key_file(good).unwrap();
    assert_eq!(ring.len(), 2);
    assert_eq!(
        ring.signer().unwrap().sealing_id(),
        Key::from_secret(NEW_KEY).unwrap().sealing_id()
    );
    let bad = "bmV3LXNlYWxpbmctc2VjcmV0LTAxMjM0NTY3ODlhYmM=\nc2hvcnQ=\n";
    let e = KeyRing::from_key_file(bad).unwrap_err().to_string();
    assert_eq!(
        e,
        r#"line 2: "<8 characters>" decodes to 5 bytes; a key needs at least 16"#
    );
    assert!(!e.contains("c2hvcnQ"));
    assert_eq!(
        KeyRing::from_key_file("# none yet\n\n")
            .unwrap_err()
            .to_string(),
        "keys: holds no key"
    );
}
