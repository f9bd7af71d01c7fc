//! tether's channel and gRPC C-core (grpcio) report the same load (LRS,
//! gRFC A27) for the same calls: one tether-control, one service in two
//! localities and a second service whose EDS drops every call
//! (`dropOverloads`, category `test`), both reporting every second, and a
//! client of each kind making the same calls in phases (calls answered in
//! one locality, calls failed in the other, then both, then calls dropped,
//! alone and beside answered ones), paced so that a phase spans several
//! reports. After each phase the test reads each client's reports since the
//! phase began (`GET /load?node=`) until they account for every call and a
//! quiet report follows, then compares them locality by locality (issued,
//! succeeded, failed, and what is still in progress at the end) and cluster
//! by cluster (dropped, in all and per category).
//!
//! Circuit-breaker drops are not exercised: tether-control serves no
//! circuit breaker.

mod control_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use control_support::{
    channel_and_grpcio, echo_session_yaml, echo_with_cookie, session_cookie, Control, TempDir,
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

/// The cookie (sent as the `cookie` metadata, as the session cookies are)
/// whose calls go to the `dropped` service.
const DROP_COOKIE: &str = "tether-drop=1";
/// The `dropped` service, and its cluster (round robin) as reported.
const DROP_CLUSTER: &str = "dropped";
/// The `dropped` service's one drop category, at 100%.
const DROP_CATEGORY: &str = "test";

/// `x` in `us/a`, `y` in `us/b`, behind C-core's session cookie so that a
/// call goes where its cookie says, for both clients alike; calls with
/// [`DROP_COOKIE`] go to the service `dropped` (`x` again, in `us/c`),
/// whose EDS drops all of them under [`DROP_CATEGORY`].
fn yaml(x: SocketAddr, y: SocketAddr) -> String {
    let echo = echo_session_yaml("1s", &[(x, "us/a", "HEALTHY"), (y, "us/b", "HEALTHY")]);
    // The drop route goes first: the session route matches every call.
    let routes = "    routes:\n";
    let drop_route = format!(
        "{routes}      - conditions: [{{ header: {{ name: cookie, exact: \"{DROP_COOKIE}\" }} }}]\n        \
         services: [{{ name: {DROP_CLUSTER} }}]\n"
    );
    assert!(echo.contains(routes), "{echo}");
    format!(
        "{}  - name: {DROP_CLUSTER}\n    protocol: h2c\n    loadReporting: {{ interval: 1s }}\n    \
         dropOverloads: [{{ category: {DROP_CATEGORY}, percent: 100 }}]\n    endpoints:\n      \
         - address: {x}\n        locality: us/c\n",
        echo.replacen(routes, &drop_route, 1)
    )
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

/// One cluster's drops, added up over reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Drops {
    /// `total_dropped_requests`: every category and none.
    total: u64,
    /// `dropped_requests` per category.
    categories: BTreeMap<String, u64>,
}

impl Drops {
    /// `n` drops, all in `category`.
    fn of(category: &str, n: u64) -> Drops {
        Drops {
            total: n,
            categories: BTreeMap::from([(category.to_owned(), n)]),
        }
    }

    fn is_zero(&self) -> bool {
        self.total == 0 && self.categories.values().all(|&n| n == 0)
    }

    /// Whether no figure goes beyond `want`'s.
    fn within(&self, want: &Drops) -> bool {
        self.total <= want.total
            && self
                .categories
                .iter()
                .all(|(c, &n)| n <= want.categories.get(c).copied().unwrap_or(0))
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
    /// Per cluster (every cluster reported, drops or not).
    drops: BTreeMap<String, Drops>,
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
            let name = cluster["cluster"].as_str().unwrap_or_default().to_owned();
            let drops = out.drops.entry(name).or_default();
            let total = cluster["total_dropped_requests"]
                .as_u64()
                .unwrap_or_else(|| panic!("no total_dropped_requests in {cluster}"));
            drops.total += total;
            for (category, n) in cluster["dropped"].as_object().into_iter().flatten() {
                *drops.categories.entry(category.clone()).or_default() += n
                    .as_u64()
                    .unwrap_or_else(|| panic!("a drop count in {cluster}"));
            }
            line += &format!(" [{} every {}s:", cluster["cluster"], cluster["interval_s"]);
            if total > 0 {
                line += &format!(" dropped {total} {}", cluster["dropped"]);
            }
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

async fn load_page(control: &Control, node: &str) -> Value {
    control.admin_json(&format!("/load?node={node}")).await
}

/// The latest report number tether-control gave (read from the page of
/// every client).
async fn last_seq(control: &Control) -> u64 {
    let page = control.admin_json("/load").await;
    assert_eq!(page["reports_kept"], 32, "{page}");
    page["last_seq"].as_u64().expect("last_seq")
}

/// `node`'s reports since `after`, once they account for `want` (calls
/// per locality: issued, succeeded, failed) and `want_drops` (per cluster)
/// and a quiet report (nothing issued, nothing in progress) came after the
/// last call. Panics when a figure goes beyond what was called (a call
/// counted twice, a drop counted as issued) or after [`SETTLE`].
async fn settled(
    control: &Control,
    node: &str,
    after: u64,
    want: &BTreeMap<&str, (u64, u64, u64)>,
    want_drops: &BTreeMap<&str, Drops>,
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
        let no_drops = Drops::default();
        for (c, d) in &phase.drops {
            let w = want_drops.get(c.as_str()).unwrap_or(&no_drops);
            assert!(
                d.within(w),
                "{node}: {c} counted drops {d:?}, more than the calls dropped {w:?}: {:#?}",
                phase.each
            );
        }
        let dropped = |c: &str| phase.drops.get(c).unwrap_or(&no_drops);
        let complete = want.iter().all(|(l, w)| calls(l) == *w)
            && want_drops.iter().all(|(c, w)| dropped(c) == w);
        if complete && phase.last == Some((0, 0)) {
            return phase;
        }
        assert!(
            start.elapsed() < SETTLE,
            "{node}: the reports since #{after} do not account for {want:?} and drops \
             {want_drops:?} with a quiet report last: {phase:#?}"
        );
        // Reports come every second.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` Echo calls over `channel` with `cookie`, one after another,
/// [`PACE`] apart; how each ended.
async fn tether_calls(
    channel: &tether::Channel,
    n: usize,
    cookie: &str,
) -> Vec<Result<String, tonic::Status>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(echo_with_cookie(channel, cookie).await);
        tokio::time::sleep(PACE).await;
    }
    out
}

/// What a dropped call ends with, on both clients: UNAVAILABLE, naming the
/// category (gRPC's wording).
fn drop_message() -> String {
    format!("EDS-configured drop: {DROP_CATEGORY}")
}

/// The drops of a phase per cluster, clusters without any left out.
fn dropped(p: &Phase) -> BTreeMap<String, Drops> {
    p.drops
        .iter()
        .filter(|(_, d)| !d.is_zero())
        .map(|(c, d)| (c.clone(), d.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_and_c_core_report_the_same_calls_alike_per_locality() {
    let failing = Arc::new(AtomicBool::new(false));
    let x = GrpcBackend::start("echo-x").await;
    let y = GrpcBackend::start_failing("echo-y", failing.clone()).await;
    let (to_x, to_y) = (session_cookie(x.addr()), session_cookie(y.addr()));
    let control = Control::start_with_admin(&yaml(x.addr(), y.addr())).await;
    let dir = TempDir::new("lrs-parity");
    let (channel, core) = channel_and_grpcio(&control, &dir, TARGET, TETHER, CORE).await;
    let mut core = core.batches(TARGET, PACE).unwrap_or_else(|e| panic!("{e}"));

    // (name, calls to us/a, calls to us/b, whether us/b fails them, calls
    // to the dropping service)
    let phases = [
        ("answered in us/a", 20, 0, false, 0),
        ("failed in us/b", 0, 10, true, 0),
        ("answered in both", 8, 8, false, 0),
        ("dropped", 0, 0, false, 20),
        ("answered in us/a and dropped", 6, 0, false, 6),
    ];
    for (name, on_x, on_y, y_fails, drop) in phases {
        failing.store(y_fails, Ordering::SeqCst);
        let after = last_seq(&control).await;
        let mut want = BTreeMap::new();
        for (locality, n) in [("us/a/", on_x), ("us/b/", on_y)] {
            let failed = if locality == "us/b/" && y_fails { n } else { 0 };
            if n > 0 {
                want.insert(locality, (n, n - failed, failed));
            }
        }
        let mut want_drops = BTreeMap::new();
        if drop > 0 {
            want_drops.insert(DROP_CLUSTER, Drops::of(DROP_CATEGORY, drop));
        }
        let answered = want.values().map(|w| w.1).sum::<u64>();
        // The same calls from each client, both at once. A dropped call
        // fails at the pick, before reaching a backend or a locality.
        let tether_side = async {
            let mut calls = tether_calls(&channel, on_x as usize, &to_x).await;
            calls.extend(tether_calls(&channel, on_y as usize, &to_y).await);
            let ok = calls.iter().filter(|c| c.is_ok()).count();
            assert_eq!(ok as u64, answered, "{name}: {calls:?}");
            for c in tether_calls(&channel, drop as usize, DROP_COOKIE).await {
                let e = c.expect_err("a dropped call");
                assert_eq!(
                    (e.code(), e.message()),
                    (tonic::Code::Unavailable, drop_message().as_str()),
                    "{name}"
                );
            }
        };
        let core_side = async {
            let mut calls = core.run(on_x as usize, Some(&to_x)).await.unwrap();
            calls.extend(core.run(on_y as usize, Some(&to_y)).await.unwrap());
            let ok = calls.iter().filter(|c| c.ok()).count();
            assert_eq!(ok as u64, answered, "{name}: {calls:?}");
            if drop > 0 {
                let calls = core.run(drop as usize, Some(DROP_COOKIE)).await.unwrap();
                assert_eq!(calls.len() as u64, drop, "{name}: {calls:?}");
                for c in &calls {
                    assert_eq!(
                        (c.code.as_str(), c.message.as_str()),
                        ("UNAVAILABLE", drop_message().as_str()),
                        "{name}: {calls:?}"
                    );
                }
            }
        };
        tokio::join!(tether_side, core_side);

        let (ours, theirs) = tokio::join!(
            settled(&control, TETHER, after, &want, &want_drops),
            settled(&control, CORE, after, &want, &want_drops)
        );
        eprintln!("phase {name:?} (reports after #{after}; issued/succeeded/failed/in progress):");
        eprintln!(
            "  tether: {:?} drops {:?}\n    {:#?}",
            ours.localities,
            dropped(&ours),
            ours.each
        );
        eprintln!(
            "  C-core: {:?} drops {:?}\n    {:#?}",
            theirs.localities,
            dropped(&theirs),
            theirs.each
        );
        let calls = |p: &Phase| -> BTreeMap<String, (u64, u64, u64)> {
            p.localities
                .iter()
                .map(|(l, f)| (l.clone(), f.calls()))
                .filter(|(_, c)| *c != (0, 0, 0))
                .collect()
        };
        assert_eq!(calls(&ours), calls(&theirs), "{name}");
        // Drops per cluster, in all and per category: the calls dropped,
        // alike on both sides (none in the phases without).
        let want_drops: BTreeMap<String, Drops> = want_drops
            .into_iter()
            .map(|(c, d)| (c.to_owned(), d))
            .collect();
        assert_eq!(dropped(&ours), want_drops, "{name}: tether");
        assert_eq!(dropped(&theirs), want_drops, "{name}: C-core");
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
