//! Outlier detection (gRFC A50) end to end: real tonic backends on
//! loopback, `tether-control` serving a YAML file with `outlierDetection`,
//! and `tether::Channel` over xDS. A backend whose handler answers
//! UNAVAILABLE is ejected within two intervals and gets no calls, returns
//! after the ejection time, and is ejected for longer on a repeat; by
//! failure percentage and by success rate; `maxEjectionPercent` holds; a
//! session pinned to the failing backend moves with a new cookie. gRPC
//! C-core (grpcio) over the same file ejects the failing backend too. The
//! channel records gRFC A91's ejections, enforced and held back by the cap.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;
#[path = "channel_support/telemetry.rs"]
mod telemetry_support;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use control_support::{Control, TempDir};
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tokio::time::Instant;

const INTERVAL_MS: u64 = 300;

/// Three backends (the first failing while its switch is on) behind one
/// service with `outlier` as its `outlierDetection` block; a route with
/// sessions when `session`.
async fn setup(outlier: &str, session: bool, healthy: usize) -> Setup {
    setup_recorded(outlier, session, healthy, None).await
}

/// The backends, the failing switch, tether-control, its files and the
/// channel.
type Setup = (
    Vec<GrpcBackend>,
    Arc<AtomicBool>,
    Control,
    TempDir,
    tether::Channel,
);

/// [`setup`], the channel recording with `telemetry` when given.
async fn setup_recorded(
    outlier: &str,
    session: bool,
    healthy: usize,
    telemetry: Option<tether::Telemetry>,
) -> Setup {
    let failing = Arc::new(AtomicBool::new(true));
    let mut backends = vec![GrpcBackend::start_failing("bad", failing.clone()).await];
    for i in 0..healthy {
        backends.push(GrpcBackend::start(&format!("good-{i}")).await);
    }
    let endpoints: String = backends
        .iter()
        .map(|b| format!("      - address: {}\n", b.addr()))
        .collect();
    let policy = if session {
        "        loadBalancerPolicy:\n          strategy: Session\n          session:\n            cookie: { name: grpc-session, path: /, ttl: 60s }\n"
    } else {
        ""
    };
    let yaml = format!(
        "virtualhosts:\n  - name: od.tether.test\n    routes:\n      - services:\n          - name: echo\n{policy}services:\n  - name: echo\n    protocol: h2c\n    outlierDetection:\n{outlier}    endpoints:\n{endpoints}"
    );
    let control = Control::start(&yaml).await;
    let dir = TempDir::new("od-bootstrap");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("od-channel"));
    let mut builder = tether::Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&bootstrap).unwrap());
    if let Some(t) = telemetry {
        builder = builder.telemetry(t);
    }
    let channel = builder.connect("xds:///od.tether.test").unwrap();
    (backends, failing, control, dir, channel)
}

/// One call: the backend's name, or the error.
async fn call(client: &mut EchoClient<tether::Channel>) -> Result<String, tonic::Status> {
    let mut request = tonic::Request::new(EchoRequest {
        message: "x".into(),
    });
    request.set_timeout(Duration::from_secs(10));
    client.echo(request).await.map(|r| r.into_inner().backend)
}

/// Calls for `d`, a few ms apart; how many answers each backend gave
/// (failures counted under `"error"`).
async fn calls_for(channel: &tether::Channel, d: Duration) -> HashMap<String, usize> {
    let mut client = EchoClient::new(channel.clone());
    let mut seen = HashMap::new();
    let end = Instant::now() + d;
    for _ in 0..100_000 {
        if Instant::now() >= end {
            break;
        }
        let key = call(&mut client)
            .await
            .unwrap_or_else(|_| "error".to_owned());
        *seen.entry(key).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    seen
}

/// Calls in a row that miss `bad` before it counts as ejected: round robin
/// over three endpoints reaches each one every third call.
const QUIET_CALLS: usize = 12;

/// Calls until `bad`'s handler has stopped being reached for a whole
/// interval and at least [`QUIET_CALLS`] calls (time alone is not enough: a
/// slow machine can make few calls in an interval); returns when that
/// quiet stretch began (bounded).
async fn until_ejected(channel: &tether::Channel, bad: &GrpcBackend, limit: Duration) -> Instant {
    let start = Instant::now();
    let mut client = EchoClient::new(channel.clone());
    let mut last_seen = bad.hits();
    let mut quiet_since = Instant::now();
    let mut quiet_calls = 0;
    for _ in 0..100_000 {
        assert!(
            start.elapsed() < limit,
            "the failing backend was not ejected within {limit:?}"
        );
        let _ = call(&mut client).await;
        let now_seen = bad.hits();
        if now_seen != last_seen {
            last_seen = now_seen;
            quiet_since = Instant::now();
            quiet_calls = 0;
        } else {
            quiet_calls += 1;
            if quiet_calls >= QUIET_CALLS
                && quiet_since.elapsed() >= Duration::from_millis(INTERVAL_MS)
            {
                return quiet_since;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("no ejection within 100,000 calls");
}

/// Calls until `bad` is reached again; how long that took from `from`.
async fn until_back(channel: &tether::Channel, bad: &GrpcBackend, limit: Duration) -> Duration {
    let from = Instant::now();
    let mut client = EchoClient::new(channel.clone());
    let before = bad.hits();
    for _ in 0..100_000 {
        assert!(from.elapsed() < limit, "not back within {limit:?}");
        let _ = call(&mut client).await;
        if bad.hits() != before {
            return from.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("not back within 100,000 calls");
}

fn failure_percentage(base_ms: u64) -> String {
    format!(
        "      interval: {}s\n      baseEjectionTime: {}s\n      maxEjectionTime: 10s\n      maxEjectionPercent: 50\n      failurePercentage: {{ minimumHosts: 3, requestVolume: 5 }}\n",
        INTERVAL_MS as f64 / 1000.0,
        base_ms as f64 / 1000.0
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backend_is_ejected_returns_after_the_ejection_time_and_longer_on_a_repeat() {
    let (backends, _failing, control, _dir, channel) =
        setup(&failure_percentage(1200), false, 2).await;
    let bad = &backends[0];
    // Calls succeed or fail; the failing backend is reached until ejected,
    // within two intervals of enough calls (plus the channel's start).
    let t0 = Instant::now();
    let quiet = until_ejected(&channel, bad, Duration::from_secs(10)).await;
    let ejected_after = quiet - t0;
    // Ejected: no call reaches it, and every call succeeds.
    let seen = calls_for(&channel, Duration::from_millis(600)).await;
    assert_eq!(seen.get("bad"), None, "{seen:?}");
    assert_eq!(seen.get("error"), None, "{seen:?}");
    assert!(seen.len() == 2, "both healthy backends serve: {seen:?}");
    // It returns after base × 1 = 1.2 s (and at most one interval later),
    // measured from the quiet interval's start.
    let first = until_back(&channel, bad, Duration::from_secs(10)).await + quiet.elapsed();
    // Ejected again at once (it still fails): this time for 2 × 1.2 s.
    let quiet2 = until_ejected(&channel, bad, Duration::from_secs(10)).await;
    let second = until_back(&channel, bad, Duration::from_secs(15)).await + quiet2.elapsed();
    eprintln!("ejected after {ejected_after:?}; out {first:?}, then {second:?}");
    assert!(
        first >= Duration::from_millis(1200 - INTERVAL_MS),
        "back after {first:?}"
    );
    assert!(
        first <= Duration::from_millis(1200 + 3 * INTERVAL_MS),
        "back after {first:?}"
    );
    assert!(
        second >= Duration::from_millis(2400 - INTERVAL_MS),
        "the repeat lasted {second:?}, not 2 × base"
    );
    assert!(second > first, "{first:?} then {second:?}");
    assert!(control.nacks_none(), "{}", control.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_rate_ejects_the_outlier() {
    // Three hosts: with the default factor 1.9 one at 0% is within the
    // spread, so the factor is 1.0 (threshold mean − 1 stdev).
    let outlier = format!(
        "      interval: {}s\n      baseEjectionTime: 5s\n      successRate: {{ stdevFactor: 1000, minimumHosts: 3, requestVolume: 5 }}\n      maxEjectionPercent: 50\n",
        INTERVAL_MS as f64 / 1000.0
    );
    let (backends, _failing, control, _dir, channel) = setup(&outlier, false, 2).await;
    until_ejected(&channel, &backends[0], Duration::from_secs(10)).await;
    let seen = calls_for(&channel, Duration::from_millis(600)).await;
    assert_eq!(seen.get("bad"), None, "{seen:?}");
    assert_eq!(seen.get("error"), None, "{seen:?}");
    assert!(control.nacks_none(), "{}", control.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_ejection_percent_keeps_the_second_failing_backend_in() {
    // Two of three failing, at most 30%: one is ejected (one always may
    // be), then 1 of 3 is 33% and the other stays
    // (calls to it keep failing).
    let outlier = format!(
        "      interval: {}s\n      baseEjectionTime: 5s\n      maxEjectionPercent: 30\n      failurePercentage: {{ minimumHosts: 3, requestVolume: 5 }}\n",
        INTERVAL_MS as f64 / 1000.0
    );
    // gRFC A91's instruments, with the backend service.
    let recorder = telemetry_support::Recorder::new();
    let telemetry = tether::Telemetry::builder(&recorder.provider)
        .enable_metric("grpc.lb.outlier_detection.ejections_enforced")
        .and_then(|t| t.enable_metric("grpc.lb.outlier_detection.ejections_unenforced"))
        .and_then(|t| t.add_optional_label("grpc.lb.backend_service"))
        .unwrap()
        .build();
    let (backends, failing, control, _dir, channel) =
        setup_recorded(&outlier, false, 1, Some(telemetry)).await;
    let bad2 = GrpcBackend::start_failing("bad-2", failing.clone()).await;
    // Add the second failing backend to the file.
    let yaml = std::fs::read_to_string(&control.config).unwrap();
    control.write(&format!("{yaml}      - address: {}\n", bad2.addr()));
    // Wait until both failing backends were reached, then several intervals.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client = EchoClient::new(channel.clone());
    while bad2.hits() == 0 || backends[0].hits() == 0 {
        assert!(Instant::now() < deadline, "bad-2 never reached");
        let _ = call(&mut client).await;
    }
    let _ = calls_for(&channel, Duration::from_millis(5 * INTERVAL_MS)).await;
    let seen = calls_for(&channel, Duration::from_millis(4 * INTERVAL_MS)).await;
    let bad_reached = seen.get("error").copied().unwrap_or(0);
    assert!(
        bad_reached > 0,
        "one failing backend stays in (30% of 3 allows one ejection): {seen:?}"
    );
    assert!(seen.contains_key("good-0"), "{seen:?}");
    assert!(control.nacks_none(), "{}", control.stderr());
    // One ejection enforced, the other outlier held back by the cap, each
    // by failure percentage, in the cluster tether-control named.
    let read = recorder.read();
    let points = |name: &str| {
        let i = read
            .get(name)
            .unwrap_or_else(|| panic!("{name} not recorded: {:?}", read.keys()));
        assert_eq!(i.unit, "{ejection}");
        i.points.clone()
    };
    let enforced = points("grpc.lb.outlier_detection.ejections_enforced");
    let unenforced = points("grpc.lb.outlier_detection.ejections_unenforced");
    let (labels, (n, _)) = enforced.iter().next().unwrap();
    let cluster = &labels
        .iter()
        .find(|(k, _)| k == "grpc.lb.backend_service")
        .expect("the backend service")
        .1;
    assert!(!cluster.is_empty());
    assert_eq!(
        labels,
        &telemetry_support::labels(&[
            ("grpc.target", "xds:///od.tether.test"),
            ("grpc.lb.backend_service", cluster),
            (
                "grpc.lb.outlier_detection.detection_method",
                "failure_percentage"
            ),
        ])
    );
    assert!(*n >= 1, "{enforced:?}");
    let overflow = telemetry_support::labels(&[
        ("grpc.target", "xds:///od.tether.test"),
        ("grpc.lb.backend_service", cluster),
        (
            "grpc.lb.outlier_detection.detection_method",
            "failure_percentage",
        ),
        (
            "grpc.lb.outlier_detection.unenforced_reason",
            "max_ejection_overflow",
        ),
    ]);
    assert!(
        unenforced.get(&overflow).is_some_and(|p| p.0 >= 1),
        "{unenforced:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_an_ejected_backend_moves_with_a_new_cookie() {
    use tether::session::{CookieJar, CookieJarLayer, Layer};
    let (backends, failing, control, _dir, channel) =
        setup(&failure_percentage(5000), true, 2).await;
    let bad = &backends[0];
    // Pin a session on the bad backend while it still answers.
    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    let jar = CookieJar::new();
    let mut session = EchoClient::new(CookieJarLayer::new(jar.clone()).layer(channel.clone()));
    let mut pinned = None;
    for _ in 0..200 {
        jar.clear();
        let mut request = tonic::Request::new(EchoRequest {
            message: "x".into(),
        });
        request.set_timeout(Duration::from_secs(10));
        if let Ok(r) = session.echo(request).await {
            if r.get_ref().backend == "bad" {
                pinned = jar.get("grpc-session");
                break;
            }
        }
    }
    let cookie = pinned.expect("a session lands on the bad backend");
    // Now it fails; other clients' calls get it ejected.
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    until_ejected(&channel, bad, Duration::from_secs(10)).await;
    // The session's next call goes elsewhere, with a new cookie, and stays.
    let mut request = tonic::Request::new(EchoRequest {
        message: "x".into(),
    });
    request.set_timeout(Duration::from_secs(10));
    let r = session
        .echo(request)
        .await
        .expect("the session's call succeeds");
    let moved_to = r.get_ref().backend.clone();
    assert_ne!(moved_to, "bad");
    assert_eq!(r.metadata().get_all("set-cookie").iter().count(), 1);
    let new_cookie = jar.get("grpc-session").unwrap();
    assert_ne!(new_cookie, cookie);
    for _ in 0..10 {
        let mut request = tonic::Request::new(EchoRequest {
            message: "x".into(),
        });
        request.set_timeout(Duration::from_secs(10));
        let r = session.echo(request).await.unwrap();
        assert_eq!(r.get_ref().backend, moved_to);
        assert_eq!(r.metadata().get_all("set-cookie").iter().count(), 0);
    }
    assert!(control.nacks_none(), "{}", control.stderr());
}

/// What one call came to: the backend that answered, or
/// `failed: MESSAGE` (the failing backend says `bad is failing`), written
/// the same for both clients.
fn outcome(answered: Result<String, &str>) -> String {
    match answered {
        Ok(backend) => backend,
        Err(message) => format!("failed: {message}"),
    }
}

/// How many of `outcomes` are each outcome.
fn tally(outcomes: &[String]) -> std::collections::BTreeMap<&str, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for o in outcomes {
        *counts.entry(o.as_str()).or_default() += 1;
    }
    counts
}

/// The same bounded, paced run by gRPC C-core (grpcio, the peer) and by
/// `tether::Channel` over one tether-control file: each reaches the failing
/// backend at first (its calls fail), ejects it within a few intervals, and
/// in the last third of the run (seconds after that, well inside the 30 s
/// ejection) sends it nothing while both healthy backends serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_ejects_the_failing_backend_like_the_channel() {
    const CALLS: usize = 450;
    const PACE: Duration = Duration::from_millis(10);
    let (backends, _failing, control, dir, channel) =
        setup(&failure_percentage(30_000), false, 2).await;
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-grpcio");
    let py = tether_testkit::grpcio::python_or_install(Some(&venv))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let grpcio = tether_testkit::grpcio::Client::new(py, dir.0.join("bootstrap.json"));
    let grpcio: Vec<String> = grpcio
        .calls_paced("xds:///od.tether.test", CALLS, PACE)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|c| {
            outcome(if c.ok() {
                Ok(c.backend)
            } else {
                Err(&c.message)
            })
        })
        .collect();
    let mut client = EchoClient::new(channel.clone());
    let mut tether = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        tether.push(match call(&mut client).await {
            Ok(backend) => outcome(Ok(backend)),
            Err(status) => outcome(Err(status.message())),
        });
        tokio::time::sleep(PACE).await;
    }
    let last = CALLS - CALLS / 3;
    for (client, outcomes) in [("grpcio", &grpcio), ("tether", &tether)] {
        eprintln!(
            "{client}: whole run {:?}; last third {:?}",
            tally(outcomes),
            tally(&outcomes[last..])
        );
    }
    for (client, outcomes) in [("grpcio", &grpcio), ("tether", &tether)] {
        assert_eq!(outcomes.len(), CALLS, "{client}");
        let whole = tally(outcomes);
        assert!(
            whole.get("failed: bad is failing").copied().unwrap_or(0) > 0,
            "{client} reached the failing backend before ejecting it: {whole:?}"
        );
        let end = tally(&outcomes[last..]);
        assert_eq!(
            end.keys().copied().collect::<Vec<_>>(),
            ["good-0", "good-1"],
            "{client}: only the healthy backends in the last third: {end:?}"
        );
    }
    // Every call the failing backend's handler saw failed at a client.
    let failed = |o: &[String]| o.iter().filter(|o| o.starts_with("failed: ")).count();
    assert_eq!(
        backends[0].hits() as usize,
        failed(&grpcio) + failed(&tether)
    );
    assert!(control.nacks_none(), "{}", control.stderr());
}
