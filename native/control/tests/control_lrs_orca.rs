//! Backend metrics in load reports (gRFC A85), end to end: two tonic
//! backends behind `tether::orca::LoadReportLayer` report fixed ORCA
//! figures in every response's trailer, `a` in `us/a` and `b` in `us/b`;
//! tether-control serves them as one service whose `loadReporting` asks
//! for `cpu_utilization`, `application_utilization` and
//! `named_metrics.foo` (CDS `lrs_report_endpoint_metrics`), so `a`'s
//! `mem_utilization` and `bar` must stay out of the reports. tether's
//! channel and gRPC C-core (grpcio, with
//! `GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION=true`: without it C-core
//! 1.85 keeps A64's behaviour, every named metric under its bare key, `bar`
//! included, and no utilization)
//! each make the same calls, pinned by C-core's session cookie: [`ON_A`]
//! to `a`, [`ON_B`] to `b`. The test reads each client's reports since the
//! calls began (`GET /load?node=`) until they count every call answered,
//! then checks each locality: `named_metrics.foo` and the two utilizations
//! number the calls and add up to calls × value, `b`'s absent application
//! utilization counting as 0 per call (as C-core does), and nothing else
//! (no `bar`, no memory). C-core 1.85 with the switch reports the same
//! figures as the channel, locality by locality.
//!
//! All values are multiples of 1/8, so every sum is exact and compared
//! with `==`.

mod control_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use control_support::{
    channel_and_grpcio, echo_session_yaml, echo_with_cookie, session_cookie, Control, TempDir,
};
use serde_json::Value;
use tether::orca::{LoadReportLayer, ServerMetrics};
use tether_testkit::grpc::GrpcBackend;
use tonic::service::{LayerExt, Routes};

const TARGET: &str = "xds:///echo.tether.test";
const TETHER: &str = "tether-orca";
const CORE: &str = "grpcio-orca";
/// C-core's switch for A85's propagation (off by default in 1.85).
const CORE_SWITCH: &str = "GRPC_EXPERIMENTAL_XDS_ORCA_LRS_PROPAGATION";
/// Calls to `a` and to `b`, from each client.
const ON_A: u64 = 12;
const ON_B: u64 = 7;
/// The wait after each call: the calls span more than one report.
const PACE: Duration = Duration::from_millis(100);
/// How long the reports may take to count every call.
const SETTLE: Duration = Duration::from_secs(30);
/// The channel's own per-locality gauge (sessions pinned), not an ORCA
/// figure: left out of the comparison.
const SESSIONS: &str = "tether.sessions";
const FOO: &str = "named_metrics.foo";

/// What a backend puts in every call's ORCA report.
#[derive(Clone, Copy)]
struct Orca {
    cpu: f64,
    application: Option<f64>,
    mem: Option<f64>,
    foo: f64,
    bar: Option<f64>,
}

const A: Orca = Orca {
    cpu: 0.25,
    application: Some(0.5),
    mem: Some(0.125),
    foo: 2.0,
    bar: Some(7.0),
};
const B: Orca = Orca {
    cpu: 0.75,
    application: None,
    mem: None,
    foo: 4.0,
    bar: None,
};

async fn backend(name: &str, orca: Orca) -> GrpcBackend {
    let metrics = ServerMetrics::new();
    metrics.set_cpu_utilization(orca.cpu);
    if let Some(v) = orca.application {
        metrics.set_application_utilization(v);
    }
    if let Some(v) = orca.mem {
        metrics.set_mem_utilization(v);
    }
    metrics.set_named_metric("foo", orca.foo);
    if let Some(v) = orca.bar {
        metrics.set_named_metric("bar", v);
    }
    let layer = LoadReportLayer::new(metrics);
    GrpcBackend::start_wrapped(name, move |routes: Routes| layer.named_layer(routes)).await
}

/// The session-cookie service over `a` (`us/a`) and `b` (`us/b`),
/// reporting every second with the three figures propagated.
fn yaml(a: SocketAddr, b: SocketAddr) -> String {
    let plain = "loadReporting: { interval: 1s }";
    let yaml = echo_session_yaml("1s", &[(a, "us/a", "HEALTHY"), (b, "us/b", "HEALTHY")]);
    assert!(yaml.contains(plain), "{yaml}");
    yaml.replacen(
        plain,
        "loadReporting: { interval: 1s, endpointMetrics: \
         [cpu_utilization, application_utilization, named_metrics.foo] }",
        1,
    )
}

/// A metric's calls and their values' sum.
type Metric = (u64, f64);

fn add(to: &mut Metric, m: &Value) {
    to.0 += m["num"].as_u64().unwrap_or_else(|| panic!("no num in {m}"));
    to.1 += m["total"]
        .as_f64()
        .unwrap_or_else(|| panic!("no total in {m}"));
}

/// One locality's figures, added up over reports.
#[derive(Debug, Default, Clone, PartialEq)]
struct Locality {
    issued: u64,
    succeeded: u64,
    failed: u64,
    /// `load_metric_stats` by name ([`SESSIONS`] aside).
    named: BTreeMap<String, Metric>,
    /// `cpu_utilization`, `application_utilization`, `mem_utilization`
    /// when present in any report.
    utilizations: BTreeMap<&'static str, Metric>,
    /// The endpoints' `load_metric_stats` ([`SESSIONS`] aside), added up
    /// (clients that report per endpoint).
    endpoint_named: BTreeMap<String, Metric>,
}

/// `node`'s reports numbered above `after` in `/load?node=`, per
/// locality; and each report in a line, for the log.
fn sums(page: &Value, node: &str, after: u64) -> (BTreeMap<String, Locality>, Vec<String>) {
    let mut out: BTreeMap<String, Locality> = BTreeMap::new();
    let mut each = Vec::new();
    let client = page["clients"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["node"] == node));
    let reports = client.and_then(|c| c["reports"].as_array());
    for report in reports.into_iter().flatten() {
        if report["seq"].as_u64().unwrap_or(0) <= after {
            continue;
        }
        each.push(report["clusters"].to_string());
        for cluster in report["clusters"].as_array().into_iter().flatten() {
            for l in cluster["localities"].as_array().into_iter().flatten() {
                let key = l["locality"].as_str().unwrap_or_default().to_owned();
                let sum = out.entry(key).or_default();
                let n = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("no {k} in {l}"));
                sum.issued += n("issued");
                sum.succeeded += n("succeeded");
                sum.failed += n("failed");
                for (name, m) in l["load_metric_stats"].as_object().into_iter().flatten() {
                    if name != SESSIONS {
                        add(sum.named.entry(name.clone()).or_default(), m);
                    }
                }
                for u in [
                    "cpu_utilization",
                    "application_utilization",
                    "mem_utilization",
                ] {
                    if !l[u].is_null() {
                        add(sum.utilizations.entry(u).or_default(), &l[u]);
                    }
                }
                for e in l["endpoints"].as_array().into_iter().flatten() {
                    for (name, m) in e["load_metric_stats"].as_object().into_iter().flatten() {
                        if name != SESSIONS {
                            add(sum.endpoint_named.entry(name.clone()).or_default(), m);
                        }
                    }
                }
            }
        }
    }
    (out, each)
}

/// `node`'s reports since `after` once every locality of `want` counts
/// its calls answered (a call's metrics are added as it ends, with its
/// success, so they are in the same report). Panics when a figure goes
/// beyond the calls made, or after [`SETTLE`].
async fn settled(
    control: &Control,
    node: &str,
    after: u64,
    want: &BTreeMap<&str, u64>,
) -> (BTreeMap<String, Locality>, usize) {
    let start = Instant::now();
    loop {
        let page = control.admin_json(&format!("/load?node={node}")).await;
        let (got, each) = sums(&page, node, after);
        for (l, f) in &got {
            let w = want.get(l.as_str()).copied().unwrap_or(0);
            assert!(
                f.issued <= w && f.succeeded <= w && f.failed == 0,
                "{node}: {l} counted {f:?}, beyond the {w} calls made: {each:#?}"
            );
        }
        let counted = |l: &str| got.get(l).map_or((0, 0), |f| (f.issued, f.succeeded));
        if want.iter().all(|(l, &n)| counted(l) == (n, n)) {
            return (got, each.len());
        }
        assert!(
            start.elapsed() < SETTLE,
            "{node}: the reports since #{after} do not count {want:?} after {SETTLE:?}: \
             {got:#?} {each:#?}"
        );
        // Reports come every second.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the reports must add up to for `calls` calls that each ended with
/// `orca`.
fn expected(calls: u64, orca: Orca) -> (BTreeMap<String, Metric>, BTreeMap<&'static str, Metric>) {
    let n = calls as f64;
    let named = BTreeMap::from([(FOO.to_owned(), (calls, n * orca.foo))]);
    let utilizations = BTreeMap::from([
        ("cpu_utilization", (calls, n * orca.cpu)),
        // Absent from the report: 0 for each call that had one.
        (
            "application_utilization",
            (calls, n * orca.application.unwrap_or(0.0)),
        ),
    ]);
    (named, utilizations)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_metrics_reach_the_load_reports_alike_from_the_channel_and_c_core() {
    let a = backend("orca-a", A).await;
    let b = backend("orca-b", B).await;
    let (to_a, to_b) = (session_cookie(a.addr()), session_cookie(b.addr()));
    let control = Control::start_with_admin(&yaml(a.addr(), b.addr())).await;
    let dir = TempDir::new("lrs-orca");
    let (channel, core) = channel_and_grpcio(&control, &dir, TARGET, TETHER, CORE).await;
    let core = core.with_env(CORE_SWITCH, "true");
    let mut core = core.batches(TARGET, PACE).unwrap_or_else(|e| panic!("{e}"));

    let after = control.admin_json("/load").await["last_seq"]
        .as_u64()
        .expect("last_seq");
    let tether_side = async {
        for (n, cookie, name) in [(ON_A, &to_a, "orca-a"), (ON_B, &to_b, "orca-b")] {
            for _ in 0..n {
                let answered = echo_with_cookie(&channel, cookie).await;
                assert_eq!(answered.as_deref().ok(), Some(name), "{answered:?}");
                tokio::time::sleep(PACE).await;
            }
        }
    };
    let core_side = async {
        for (n, cookie, name) in [(ON_A, &to_a, "orca-a"), (ON_B, &to_b, "orca-b")] {
            let calls = core.run(n as usize, Some(cookie)).await.unwrap();
            assert_eq!(calls.len() as u64, n, "{calls:?}");
            assert!(
                calls.iter().all(|c| c.ok() && c.backend == name),
                "{calls:?}"
            );
        }
    };
    tokio::join!(tether_side, core_side);

    let want = BTreeMap::from([("us/a/", ON_A), ("us/b/", ON_B)]);
    let ((ours, our_reports), (theirs, their_reports)) = tokio::join!(
        settled(&control, TETHER, after, &want),
        settled(&control, CORE, after, &want)
    );
    eprintln!(
        "tether ({our_reports} reports): {ours:#?}\nC-core ({their_reports} reports): {theirs:#?}"
    );
    // Equal maps: `named_metrics.bar`, the bare keys and memory are absent.
    for (locality, calls, orca) in [("us/a/", ON_A, A), ("us/b/", ON_B, B)] {
        let (named, utilizations) = expected(calls, orca);
        let l = &ours[locality];
        assert_eq!(l.named, named, "tether, {locality}");
        assert_eq!(l.utilizations, utilizations, "tether, {locality}");
        // One endpoint per locality: its named metrics are the locality's.
        assert_eq!(l.endpoint_named, named, "tether, {locality}");
    }
    // The same figures from C-core, which reports per locality only.
    let per_locality = |m: &BTreeMap<String, Locality>| -> BTreeMap<String, Locality> {
        m.iter()
            .map(|(k, l)| {
                let mut l = l.clone();
                l.endpoint_named.clear();
                (k.clone(), l)
            })
            .collect()
    };
    assert_eq!(per_locality(&ours), per_locality(&theirs));
    assert!(
        theirs.values().all(|l| l.endpoint_named.is_empty()),
        "{theirs:?}"
    );
    core.finish().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(control.nacks_none(), "{}", control.stderr());
}
