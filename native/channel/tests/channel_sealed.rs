//! Sealed session cookies in `tether::Channel` over xDS from the ADS
//! fixture, against real tonic backends: the value shows nothing of the
//! backend, every value has its own nonce, anything modified or sealed
//! under a foreign key is no cookie (a new pick, never an error), and keys
//! rotate on a live channel under load without losing a session.

mod channel_support;
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use channel_support::*;
use tether_core::cookie::{self, sealed, Format, Key, KeyRing};
use tether_testkit::grpc::GrpcBackend;
use xds_support::{Fixture, Mode};

const COOKIE: &str = "grpc-session";

fn key(byte: u8) -> Key {
    Key::from_secret(&[byte; 32]).unwrap()
}

fn sealing(keys: Vec<Key>) -> tether::channel::SessionOptions {
    let mut options = tether::channel::SessionOptions::new(Format::Sealed);
    options.keys = KeyRing::new(keys);
    options
}

/// Three backends behind the fixture's session listener and a channel
/// sealing with `keys`.
async fn sealed_setup(f: &Fixture, keys: Vec<Key>) -> ([GrpcBackend; 3], tether::Channel) {
    let bs = [
        GrpcBackend::start("b1").await,
        GrpcBackend::start("b2").await,
        GrpcBackend::start("b3").await,
    ];
    let addrs: Vec<_> = bs.iter().map(|b| b.addr()).collect();
    f.set_resources(LDS, vec![session_listener(TARGET, "routes", COOKIE, 600)]);
    f.set_resources(RDS, vec![route_config(vec![route("/", "c")])]);
    f.set_resources(CDS, vec![cluster("c")]);
    f.set_resources(EDS, vec![eds("c", vec![Loc::of(&addrs)], &[])]);
    for t in [LDS, RDS, CDS, EDS] {
        f.push(t);
    }
    let ch = tether::Channel::builder()
        .bootstrap(xds_support::bootstrap(f.addr, NODE))
        .session_options(sealing(keys))
        .connect(&format!("xds:///{TARGET}"))
        .unwrap();
    (bs, ch)
}

/// The value of the one `Set-Cookie` in `set`.
fn value(set: &[String]) -> String {
    assert_eq!(set.len(), 1, "{set:?}");
    pair(&set[0]).trim_start_matches("grpc-session=").to_owned()
}

#[tokio::test]
async fn a_sealed_cookie_pins_its_session_and_shows_nothing_of_the_backend() {
    let f = Fixture::start(Mode::Serve).await;
    let (bs, ch) = sealed_setup(&f, vec![key(1)]).await;
    let keys = KeyRing::new(vec![key(1)]);
    // Fresh sessions until one backend answered twice: its two values.
    let mut minted: HashMap<String, Vec<String>> = HashMap::new();
    for _ in 0..4 {
        let (b, set) = echo_cookie(&ch, None).await.unwrap();
        minted.entry(b).or_default().push(value(&set));
    }
    let (first, values) = minted.iter().find(|(_, v)| v.len() > 1).unwrap();
    let backend = bs.iter().find(|b| b.name() == first).unwrap();
    // Random nonces: the same session sealed twice is two values.
    assert_ne!(values[0], values[1]);
    for v in values {
        let d = cookie::decode(v, &keys).unwrap();
        assert_eq!(d.format, Format::Sealed);
        assert_eq!(d.cookie.addresses.primary(), backend.addr());
        assert_eq!(d.cookie.cluster.as_deref(), Some("c"));
        // Nothing readable without the key: no address, port or cluster.
        assert!(cookie::decode(v, &KeyRing::empty()).is_err(), "{v}");
        assert!(!v.contains(&backend.addr().to_string()), "{v}");
        assert_eq!(sealed::key_id(v), Some(key(1).sealing_id()));
    }
    let pinned = format!("{COOKIE}={}", values[0]);
    for _ in 0..20 {
        let (b, set) = echo_cookie(&ch, Some(&pinned)).await.unwrap();
        assert_eq!(&b, first);
        assert!(set.is_empty(), "{set:?}");
    }
    // Modified, truncated or another key's: no cookie, a call answered
    // and a fresh cookie, never an error.
    let mut flipped = base64_decode(&values[0]);
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let foreign = {
        let d = cookie::decode(&values[0], &keys).unwrap();
        sealed::seal(&d.cookie, &key(9), &[7; sealed::NONCE_LEN]).unwrap()
    };
    for bad in [
        base64_encode(&flipped),
        values[0][..values[0].len() - 4].to_owned(),
        foreign,
    ] {
        let (_, set) = echo_cookie(&ch, Some(&format!("{COOKIE}={bad}")))
            .await
            .unwrap();
        let fresh = value(&set);
        assert!(cookie::decode(&fresh, &keys).is_ok(), "{fresh}");
    }
}

#[tokio::test]
async fn sealed_cookies_need_keys_of_32_bytes_at_build_and_at_rotation() {
    let f = Fixture::start(Mode::Serve).await;
    let build = |options| {
        tether::Channel::builder()
            .bootstrap(xds_support::bootstrap(f.addr, NODE))
            .session_options(options)
            .connect(&format!("xds:///{TARGET}"))
    };
    let e = build(sealing(vec![])).unwrap_err().to_string();
    assert!(e.contains("session_options") && e.contains("sealed"), "{e}");
    let short = Key::from_secret(&[1; 16]).unwrap();
    let e = build(sealing(vec![short.clone()])).unwrap_err().to_string();
    assert!(e.contains("session_options") && e.contains("32"), "{e}");
    let ch = build(sealing(vec![key(1)])).unwrap();
    let e = ch
        .set_session_keys(KeyRing::new(vec![short]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("set_session_keys") && e.contains("32"), "{e}");
    // A key is never shown.
    assert!(!e.contains("AQEB"), "{e}");
    ch.set_session_keys(KeyRing::new(vec![key(2), key(1)]))
        .unwrap();
}

/// Sessions calling concurrently while the keys rotate (1) → (2, 1) → (2):
/// every call of every session reaches its backend, and every session is
/// re-sealed under key 2 before key 1 is withdrawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_under_load_with_no_session_lost() {
    const SESSIONS: usize = 24;
    const MAX_CALLS: usize = 400;
    let f = Fixture::start(Mode::Serve).await;
    let (_bs, ch) = sealed_setup(&f, vec![key(1)]).await;
    let (k1, k2) = (key(1).sealing_id(), key(2).sealing_id());
    // Each session's current cookie value; calls made; phase (0: key 1
    // alone, 1: both, 2: key 2 alone).
    let cookies = Arc::new(Mutex::new(vec![String::new(); SESSIONS]));
    let calls = Arc::new(AtomicUsize::new(0));
    let (phase_tx, phase_rx) = tokio::sync::watch::channel(0u8);
    let progress = Arc::new(tokio::sync::Notify::new());
    let mut tasks = Vec::new();
    for i in 0..SESSIONS {
        let (ch, cookies, calls, progress) =
            (ch.clone(), cookies.clone(), calls.clone(), progress.clone());
        let phase = phase_rx.clone();
        tasks.push(tokio::spawn(async move {
            let (backend, set) = echo_cookie(&ch, None).await.unwrap();
            let mut current = value(&set);
            let mut after = 0;
            for n in 0..MAX_CALLS {
                cookies.lock().unwrap()[i] = current.clone();
                calls.fetch_add(1, Ordering::Relaxed);
                progress.notify_one();
                if *phase.borrow() == 2 {
                    after += 1;
                    if after > 10 {
                        return backend;
                    }
                }
                let (b, set) = echo_cookie(&ch, Some(&format!("{COOKIE}={current}")))
                    .await
                    .unwrap_or_else(|e| panic!("session {i}, call {n}: {e}"));
                assert_eq!(b, backend, "session {i} moved at call {n}");
                if !set.is_empty() {
                    current = value(&set);
                }
            }
            panic!("session {i}: {MAX_CALLS} calls and key 1 never withdrawn");
        }));
    }
    let all = |ids: &[u8; 4]| {
        let c = cookies.lock().unwrap();
        c.iter().all(|v| sealed::key_id(v).as_ref() == Some(ids))
    };
    // Every session under way with key 1, then key 2 writes. (A session
    // that fails ends its task: the bound below turns that into a failure.)
    wait(&progress, "key 1, three calls each", || {
        all(&k1) && calls.load(Ordering::Relaxed) >= SESSIONS * 3
    })
    .await;
    ch.set_session_keys(KeyRing::new(vec![key(2), key(1)]))
        .unwrap();
    phase_tx.send(1).unwrap();
    // The signal: every session's cookie re-sealed under key 2.
    wait(&progress, "every cookie re-sealed under key 2", || all(&k2)).await;
    let first_cookie = sealed::seal(
        &cookie::SessionCookie::new(tether_core::address::AddressList::one(
            "127.0.0.1:1".parse().unwrap(),
        )),
        &key(1),
        &[3; sealed::NONCE_LEN],
    )
    .unwrap();
    ch.set_session_keys(KeyRing::new(vec![key(2)])).unwrap();
    phase_tx.send(2).unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    // Key 1 is gone: a cookie only it opens is no cookie now.
    let (_, set) = echo_cookie(&ch, Some(&format!("{COOKIE}={first_cookie}")))
        .await
        .unwrap();
    assert_eq!(sealed::key_id(&value(&set)), Some(k2));
}

/// Until `cond` holds, woken by `progress`; a test failure after a minute.
async fn wait(progress: &tokio::sync::Notify, what: &str, cond: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !cond() {
            progress.notified().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("sessions never reached: {what}"))
}

fn base64_decode(v: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(v).unwrap()
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}
