//! tether's channel and gRPC C-core (grpcio) report the same load (LRS,
//! gRFC A27) for the same calls: one tether-control, one service in two
//! localities reporting every second, and a client of each kind making the
//! same calls in phases (calls answered in one locality, calls failed in
//! the other, then both), paced so that a phase spans several reports.
//! After each phase the test reads each client's
//! reports since the phase began (`GET /load?node=`) until they account
//! for every call and a quiet report follows, then compares them locality
//! by locality: issued, succeeded, failed, dropped, and what is still in
//! progress at the end.
//!
//! Drops are not exercised: tether-control serves no EDS `drop_overloads`
//! and no circuit breaker, so neither client drops a call here; the
//! figures are still compared (0 on both sides).

mod control_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use control_support::{
    echo_session_yaml, echo_with_cookie, grpcio_client, session_cookie, Control, TempDir,
};
use serde_json::Value;
use tether_testkit::grpc::GrpcBackend;

const TARGET: &str = "xds:///echo.tether.test";
const TETHER: &str = "tether-parity";
const CORE: &str = "grpcio-parity";
/// How long a phase's reports may take to account for its calls.
const SETTLE: Duration = Duration::from_secs(30);
/// The wait after each call, on both sides: a phase's calls span more
/// than one report interval, so its figures are split over reports.
const PACE: Duration = Duration::from_millis(60);

/// `x` in `us/a`, `y` in `us/b`, behind C-core's session cookie so that a
/// call goes where its cookie says, for both clients alike.
fn yaml(x: SocketAddr, y: SocketAddr) -> String {
    echo_session_yaml("1s", &[(x, "us/a", "HEALTHY"), (y, "us/b", "HEALTHY")])
}

/// Calls as LRS counts them, added up over reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Figures {
    issued: u64,
    succeeded: u64,
    failed: u64,
    /// Added up over the reports: a gauge at each report, not a count.
    in_progress: u64,
}

impl Figures {
    fn of(v: &Value) -> Figures {
        let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
        Figures {
            issued: n("issued"),
            succeeded: n("succeeded"),
            failed: n("failed"),
            in_progress: n("in_progress"),
        }
    }

    fn add(&mut self, o: Figures) {
        self.issued += o.issued;
        self.succeeded += o.succeeded;
        self.failed += o.failed;
        self.in_progress += o.in_progress;
    }

    /// The calls: issued, succeeded, failed (in progress aside).
    fn calls(&self) -> (u64, u64, u64) {
        (self.issued, self.succeeded, self.failed)
    }
}

/// What one client's reports since a phase began add up to.
#[derive(Debug, Default)]
struct Phase {
    /// Per locality.
    localities: BTreeMap<String, Figures>,
    /// Per locality, its endpoints' figures added up (clients that report
    /// per endpoint).
    endpoint_sums: BTreeMap<String, Figures>,
    dropped: u64,
    reports: usize,
    /// The latest report's calls issued and in progress (0 and 0: the
    /// client had nothing more to say).
    last: Option<(u64, u64)>,
    /// Each report's locality figures and stated interval, for the log.
    each: Vec<String>,
}

/// `node`'s reports numbered above `after` in `/load?node=`.
fn phase_of(page: &Value, node: &str, after: u64) -> Phase {
    let mut out = Phase::default();
    let Some(client) = page["clients"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["node"] == node))
    else {
        return out;
    };
    for report in client["reports"].as_array().into_iter().flatten() {
        if report["seq"].as_u64().unwrap_or(0) <= after {
            continue;
        }
        out.reports += 1;
        let mut issued = 0;
        let mut in_progress = 0;
        let mut line = format!("#{}", report["seq"]);
        for cluster in report["clusters"].as_array().into_iter().flatten() {
            out.dropped += cluster["total_dropped_requests"].as_u64().unwrap_or(0);
            line += &format!(" [{} every {}s:", cluster["cluster"], cluster["interval_s"]);
            for l in cluster["localities"].as_array().into_iter().flatten() {
                let key = l["locality"].as_str().unwrap_or_default().to_owned();
                let f = Figures::of(l);
                issued += f.issued;
                in_progress += f.in_progress;
                line += &format!(
                    " {key} {}/{}/{}/{}",
                    f.issued, f.succeeded, f.failed, f.in_progress
                );
                out.localities.entry(key.clone()).or_default().add(f);
                for e in l["endpoints"].as_array().into_iter().flatten() {
                    out.endpoint_sums
                        .entry(key.clone())
                        .or_default()
                        .add(Figures::of(e));
                }
            }
            line += "]";
        }
        out.each.push(line);
        out.last = Some((issued, in_progress));
    }
    out
}

/// `GET /load` (`path` with its query).
async fn get_load(control: &Control, path: &str) -> Value {
    let admin = control.admin.expect("started with --admin");
    tether_testkit::client::get(admin, path, &[])
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .json()
}

async fn load_page(control: &Control, node: &str) -> Value {
    get_load(control, &format!("/load?node={node}")).await
}

/// The latest report number tether-control gave (read from the page of
/// every client).
async fn last_seq(control: &Control) -> u64 {
    let page = get_load(control, "/load").await;
    assert_eq!(page["reports_kept"], 32, "{page}");
    page["last_seq"].as_u64().expect("last_seq")
}

/// `node`'s reports since `after`, once they account for `want` (calls
/// per locality: issued, succeeded, failed) and a quiet report (nothing
/// issued, nothing in progress) came after the last call. Panics when a
/// figure goes beyond what was called (a call counted twice) or after
/// [`SETTLE`].
async fn settled(
    control: &Control,
    node: &str,
    after: u64,
    want: &BTreeMap<&str, (u64, u64, u64)>,
) -> Phase {
    let start = std::time::Instant::now();
    loop {
        let phase = phase_of(&load_page(control, node).await, node, after);
        let calls = |l: &str| phase.localities.get(l).map_or((0, 0, 0), Figures::calls);
        for (l, f) in &phase.localities {
            let w = want.get(l.as_str()).copied().unwrap_or((0, 0, 0));
            assert!(
                f.issued <= w.0 && f.succeeded <= w.1 && f.failed <= w.2,
                "{node}: {l} counted {f:?}, more than the calls made {w:?}: {:#?}",
                phase.each
            );
        }
        let complete = want.iter().all(|(l, w)| calls(l) == *w);
        if complete && phase.last == Some((0, 0)) {
            return phase;
        }
        assert!(
            start.elapsed() < SETTLE,
            "{node}: the reports since #{after} do not account for {want:?} with a quiet report \
             last: {phase:#?}"
        );
        // Reports come every second.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` Echo calls over `channel` with `cookie`, one after another,
/// [`PACE`] apart; how many were answered.
async fn tether_calls(channel: &tether::Channel, n: usize, cookie: &str) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if echo_with_cookie(channel, cookie).await.is_ok() {
            ok += 1;
        }
        tokio::time::sleep(PACE).await;
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_and_c_core_report_the_same_calls_alike_per_locality() {
    let failing = Arc::new(AtomicBool::new(false));
    let x = GrpcBackend::start("echo-x").await;
    let y = GrpcBackend::start_failing("echo-y", failing.clone()).await;
    let (to_x, to_y) = (session_cookie(x.addr()), session_cookie(y.addr()));
    let control = Control::start_with_admin(&yaml(x.addr(), y.addr())).await;
    let dir = TempDir::new("lrs-parity");
    let tether_bootstrap = dir.0.join("tether.json");
    std::fs::write(&tether_bootstrap, control.bootstrap_json(TETHER)).unwrap();
    let channel = tether::Channel::builder()
        .bootstrap(tether_xds::Bootstrap::from_file(&tether_bootstrap).unwrap())
        .connect(TARGET)
        .unwrap();
    let core = grpcio_client(&dir.bootstrap(&control.bootstrap_json(CORE))).await;
    let mut core = core.batches(TARGET, PACE).unwrap_or_else(|e| panic!("{e}"));

    // (name, calls to us/a, calls to us/b, whether us/b fails them)
    let phases = [
        ("answered in us/a", 20, 0, false),
        ("failed in us/b", 0, 10, true),
        ("answered in both", 8, 8, false),
    ];
    for (name, on_x, on_y, y_fails) in phases {
        failing.store(y_fails, Ordering::SeqCst);
        let after = last_seq(&control).await;
        let mut want = BTreeMap::new();
        for (locality, n) in [("us/a/", on_x), ("us/b/", on_y)] {
            let failed = if locality == "us/b/" && y_fails { n } else { 0 };
            if n > 0 {
                want.insert(locality, (n, n - failed, failed));
            }
        }
        // The same calls from each client, both at once.
        let tether_side = async {
            let ok = tether_calls(&channel, on_x as usize, &to_x).await
                + tether_calls(&channel, on_y as usize, &to_y).await;
            assert_eq!(ok as u64, want.values().map(|w| w.1).sum::<u64>(), "{name}");
        };
        let core_side = async {
            let mut calls = core.run(on_x as usize, Some(&to_x)).await.unwrap();
            calls.extend(core.run(on_y as usize, Some(&to_y)).await.unwrap());
            let ok = calls.iter().filter(|c| c.ok()).count();
            assert_eq!(
                ok as u64,
                want.values().map(|w| w.1).sum::<u64>(),
                "{calls:?}"
            );
        };
        tokio::join!(tether_side, core_side);

        let (ours, theirs) = tokio::join!(
            settled(&control, TETHER, after, &want),
            settled(&control, CORE, after, &want)
        );
        eprintln!("phase {name:?} (reports after #{after}; issued/succeeded/failed/in progress):");
        eprintln!("  tether: {:?}\n    {:#?}", ours.localities, ours.each);
        eprintln!("  C-core: {:?}\n    {:#?}", theirs.localities, theirs.each);
        let calls = |p: &Phase| -> BTreeMap<String, (u64, u64, u64)> {
            p.localities
                .iter()
                .map(|(l, f)| (l.clone(), f.calls()))
                .filter(|(_, c)| *c != (0, 0, 0))
                .collect()
        };
        assert_eq!(calls(&ours), calls(&theirs), "{name}");
        assert_eq!((ours.dropped, theirs.dropped), (0, 0), "{name}");
        // Nothing left in progress once the calls ended, on either side.
        assert_eq!(ours.last, theirs.last, "{name}");
        // The channel also reports per endpoint (one per locality here):
        // its endpoints add up to their locality; C-core reports none.
        for (l, f) in &ours.localities {
            if f.calls() != (0, 0, 0) {
                assert_eq!(ours.endpoint_sums.get(l), Some(f), "{name}: {l}");
            }
        }
        assert!(theirs.endpoint_sums.is_empty(), "{name}: {theirs:?}");
    }
    core.finish().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(control.nacks_none(), "{}", control.stderr());
}
