//! `weighted_round_robin` (gRFC A58) with ORCA load reports (gRFC A51) end
//! to end: three tonic Echo backends on loopback report the same 100 qps at
//! application utilization 0.2, 0.4 and 0.8, so their weights
//! (qps / utilization) are 500 : 250 : 125 and `tether::Channel` must send
//! them calls about 4 : 2 : 1. Once with per-call reports (the backends
//! behind `tether::orca::LoadReportLayer`, weights read from the
//! `endpoint-load-metrics-bin` trailer), once out of band (the backends
//! serve `tether::orca::OrcaService` and add no trailers). A backend that
//! does not serve the out-of-band service counts as the mean of the others.
//! The channel's parts are all real: subchannels, pickers, timers. Over
//! xDS, tether-control serves the cluster and gRPC C-core (grpcio) runs the
//! same calls against the same backends: it reads tether's per-call
//! trailers and out-of-band streams and sends the same 4 : 2 : 1. The
//! channel over xDS records gRFC A78's `grpc.lb.wrr.*` instruments with
//! the optional locality and backend-service labels.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;
#[path = "channel_support/telemetry.rs"]
mod telemetry_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use control_support::{Control, TempDir};
use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
use tether::lb::PolicyStats;
use tether::orca::{LoadReportLayer, OrcaService, ServerMetrics};
use tether::xds::lb_config::weighted_round_robin::Settings;
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio::{self, Client};
use tonic::service::Routes;

/// The utilizations the three backends report, at [`QPS`] each.
const UTILIZATIONS: [f64; 3] = [0.2, 0.4, 0.8];
const QPS: f64 = 100.0;
/// Calls counted once the weights are in use.
const CALLS: usize = 1400;
/// The issue's tolerance on each backend's share.
const TOLERANCE: f64 = 0.15;

/// How a backend reports its load.
#[derive(Clone, Copy, PartialEq)]
enum Reports {
    /// In every response's trailers.
    PerCall,
    /// On `OpenRcaService` streams only.
    OutOfBand,
    /// Not at all (no trailers, no service).
    Silent,
}

/// A backend reporting `utilization` at [`QPS`] as `reports` says.
async fn backend(name: &str, utilization: f64, reports: Reports) -> GrpcBackend {
    let metrics = ServerMetrics::new();
    metrics.set_application_utilization(utilization);
    metrics.set_qps(QPS);
    match reports {
        Reports::PerCall => {
            GrpcBackend::start_wrapped(name, move |routes: Routes| {
                tower_layer::Layer::layer(&LoadReportLayer::new(metrics), routes)
            })
            .await
        }
        Reports::OutOfBand => {
            GrpcBackend::start_wrapped(name, move |routes: Routes| {
                routes.add_service(
                    OrcaService::new(metrics).min_report_interval(Duration::from_millis(50)),
                )
            })
            .await
        }
        Reports::Silent => GrpcBackend::start(name).await,
    }
}

/// WRR settings for a test: no blackout, fast scheduler updates, and
/// out-of-band streams every 100 ms when `oob`.
fn settings(oob: bool) -> Settings {
    let mut s = Settings::default();
    s.enable_oob_load_report = oob;
    s.oob_reporting_period = Duration::from_millis(100);
    s.blackout_period = Duration::ZERO;
    s.weight_update_period = Duration::from_millis(100);
    s
}

/// A static channel running weighted_round_robin over `addrs`.
fn channel(addrs: &[SocketAddr], settings: Settings) -> Channel {
    Channel::from_static(
        StaticConfig::new(
            "wrr",
            addrs.iter().map(|&a| StaticEndpoint::new(a)).collect(),
        )
        .with_policy(EndpointPolicy::WeightedRoundRobin(settings)),
    )
    .expect("static channel")
}

/// The `weighted_round_robin` node of the channel's tree.
fn wrr_node(p: &PolicyStats) -> Option<&PolicyStats> {
    if p.policy == "weighted_round_robin" {
        return Some(p);
    }
    p.children.iter().find_map(wrr_node)
}

/// One fact of the WRR node.
async fn fact(channel: &Channel, name: &str) -> String {
    let stats = channel.stats().await.expect("stats");
    let node = wrr_node(&stats.tree).expect("a weighted_round_robin node");
    node.facts
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// Calls until the scheduler has as many distinct weights as `distinct`
/// (per-call reports need calls to arrive), or fails after 10 s.
async fn until_weighted(channel: &Channel, distinct: usize) {
    let mut client = EchoClient::new(channel.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for _ in 0..20 {
            let _ = client
                .echo(EchoRequest {
                    message: "warm".into(),
                })
                .await;
        }
        let scheduled = fact(channel, "scheduled").await;
        let mut weights: Vec<&str> = scheduled.split(' ').collect();
        weights.sort();
        weights.dedup();
        if scheduled != "round robin" && weights.len() == distinct {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "weights not in use after 10 s: scheduled {scheduled:?}, weights {:?}",
            fact(channel, "weights").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`CALLS`] calls from 4 tasks: calls per backend name.
async fn spread(channel: &Channel) -> BTreeMap<String, usize> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let mut client = EchoClient::new(channel.clone());
        tasks.spawn(async move {
            let mut counts: BTreeMap<String, usize> = BTreeMap::new();
            for _ in 0..CALLS / 4 {
                let reply = client
                    .echo(EchoRequest {
                        message: "x".into(),
                    })
                    .await
                    .expect("call")
                    .into_inner();
                *counts.entry(reply.backend).or_default() += 1;
            }
            counts
        });
    }
    let mut total = BTreeMap::new();
    while let Some(counts) = tasks.join_next().await {
        for (k, v) in counts.expect("caller") {
            *total.entry(k).or_default() += v;
        }
    }
    total
}

/// Asserts each backend's share is within [`TOLERANCE`] of `expected`
/// (relative weights by backend name).
fn assert_shares(counts: &BTreeMap<String, usize>, expected: &[(&str, f64)]) {
    let total: usize = counts.values().sum();
    let weight_sum: f64 = expected.iter().map(|(_, w)| w).sum();
    for &(name, w) in expected {
        let want = w / weight_sum;
        let got = counts.get(name).copied().unwrap_or(0) as f64 / total as f64;
        assert!(
            (got - want).abs() <= want * TOLERANCE,
            "{name}: share {got:.3}, expected {want:.3} ±{:.0}% ({counts:?})",
            TOLERANCE * 100.0
        );
    }
    println!("calls {counts:?}");
}

/// Three backends reporting as `reports`, a channel over them: the spread
/// of [`CALLS`] calls once the weights are in use.
async fn run(reports: Reports) -> BTreeMap<String, usize> {
    let mut backends = Vec::new();
    for (i, &u) in UTILIZATIONS.iter().enumerate() {
        backends.push(backend(&format!("u{i}"), u, reports).await);
    }
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr()).collect();
    let channel = channel(&addrs, settings(reports == Reports::OutOfBand));
    until_weighted(&channel, 3).await;
    let before = fact(&channel, "weights").await;
    let counts = spread(&channel).await;
    // Shown with a failed share: whether a weight changed during the calls.
    println!(
        "weights before the calls {before:?}, after {:?}",
        fact(&channel, "weights").await
    );
    assert!(
        fact(&channel, "reports").await.contains(match reports {
            Reports::OutOfBand => "out-of-band",
            _ => "per call",
        }),
        "{:?}",
        channel.stats().await
    );
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_call_reports_weight_calls_four_two_one() {
    let counts = run(Reports::PerCall).await;
    assert_shares(&counts, &[("u0", 4.0), ("u1", 2.0), ("u2", 1.0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_reports_weight_calls_four_two_one() {
    let counts = run(Reports::OutOfBand).await;
    assert_shares(&counts, &[("u0", 4.0), ("u1", 2.0), ("u2", 1.0)]);
}

/// Out of band, a backend without the service answers UNIMPLEMENTED: the
/// channel stops asking it and counts it as the mean of the others
/// (weights 500 and 250, so 375: shares 4 : 3 : 2), and its calls succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_out_of_band_reports_counts_as_the_mean() {
    let a = backend("u0", 0.2, Reports::OutOfBand).await;
    let b = backend("u1", 0.4, Reports::OutOfBand).await;
    let silent = backend("silent", 0.8, Reports::Silent).await;
    let channel = channel(&[a.addr(), b.addr(), silent.addr()], settings(true));
    until_weighted(&channel, 3).await;
    let counts = spread(&channel).await;
    assert_shares(&counts, &[("u0", 4.0), ("silent", 3.0), ("u1", 2.0)]);
}

/// Without reports (per call, from backends that send none) the policy is
/// plain round robin: equal shares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reports_calls_go_round_robin() {
    let mut backends = Vec::new();
    for i in 0..3 {
        backends.push(backend(&format!("u{i}"), 0.5, Reports::Silent).await);
    }
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr()).collect();
    let channel = channel(&addrs, settings(false));
    let counts = spread(&channel).await;
    assert_eq!(fact(&channel, "scheduled").await, "round robin");
    assert_shares(&counts, &[("u0", 1.0), ("u1", 1.0), ("u2", 1.0)]);
}

// ---------- over xDS, beside gRPC C-core ----------

/// Two virtual hosts over tether-control: per-call reports (`echo`, whose
/// backends add trailers) and out-of-band (`echo-oob`, whose backends serve
/// the ORCA service), no blackout and fast weight updates.
fn yaml(per_call: &[SocketAddr], oob: &[SocketAddr]) -> String {
    let endpoints = |addrs: &[SocketAddr]| -> String {
        addrs
            .iter()
            .map(|a| format!("      - address: \"{a}\"\n"))
            .collect()
    };
    format!(
        r#"virtualhosts:
  - name: wrr.tether.test
    routes:
      - services: [{{ name: echo }}]
        loadBalancerPolicy:
          strategy: WeightedRoundRobin
          weightedRoundRobin:
            blackoutPeriod: 0s
            weightUpdatePeriod: 0.1s
  - name: oob.tether.test
    routes:
      - services: [{{ name: echo-oob }}]
        loadBalancerPolicy:
          strategy: WeightedRoundRobin
          weightedRoundRobin:
            enableOobLoadReport: true
            oobReportingPeriod: 0.1s
            blackoutPeriod: 0s
            weightUpdatePeriod: 0.1s
services:
  - name: echo
    protocol: h2c
    endpoints:
{}  - name: echo-oob
    protocol: h2c
    endpoints:
{}"#,
        endpoints(per_call),
        endpoints(oob)
    )
}

/// Calls per backend of grpcio's `calls` printed calls to `target`, after
/// it warmed up for a second and a half (C-core learns per-call weights
/// from calls, as tether does).
async fn grpcio_spread(client: &Client, target: &str) -> BTreeMap<String, usize> {
    let args: Vec<String> = ["--warm", "3", "--warm-seconds", "1.5", target, "700"]
        .map(str::to_owned)
        .to_vec();
    let calls = client
        .run(&args, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(calls.len(), 700);
    let mut counts = BTreeMap::new();
    for c in calls {
        *counts.entry(c.backend).or_default() += 1;
    }
    counts
}

/// A78's `grpc.lb.wrr.*` instruments of a channel to `target` whose
/// weights are in use: every label set carries the target, the locality
/// and the cluster; the weights were recorded, no endpoint was stale or
/// waited out a blackout (there is none), and the first scheduler, before
/// any report, fell back to round robin. The attempts and the three
/// subchannels' connections carry the same locality and cluster.
fn wrr_metrics_recorded(recorder: &telemetry_support::Recorder, target: &str) {
    let read = recorder.read();
    let get = |name: &str| {
        read.get(name)
            .unwrap_or_else(|| panic!("{name} not recorded: {:?}", read.keys()))
    };
    let weights = get("grpc.lb.wrr.endpoint_weights");
    assert_eq!(weights.unit, "{weight}");
    let (labels, (count, sum)) = weights.points.iter().next().expect("a point");
    assert_eq!(
        weights.points.len(),
        1,
        "one locality: {:?}",
        weights.points
    );
    let keys: Vec<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        ["grpc.lb.backend_service", "grpc.lb.locality", "grpc.target"]
    );
    let value = |key: &str| labels.iter().find(|(k, _)| k == key).unwrap().1.clone();
    assert_eq!(value("grpc.target"), target);
    assert!(
        value("grpc.lb.locality").starts_with("{region="),
        "{labels:?}"
    );
    assert!(!value("grpc.lb.backend_service").is_empty(), "{labels:?}");
    assert!(*count >= 3 && *sum > 0.0, "{count} weights, sum {sum}");
    for name in [
        "grpc.lb.wrr.endpoint_weight_not_yet_usable",
        "grpc.lb.wrr.endpoint_weight_stale",
    ] {
        let i = get(name);
        assert_eq!(i.unit, "{endpoint}");
        assert_eq!(i.points.get(labels).map(|p| p.0), Some(0), "{name}");
    }
    let fallback = get("grpc.lb.wrr.rr_fallback");
    assert_eq!(fallback.unit, "{update}");
    assert!(fallback.points.get(labels).is_some_and(|p| p.0 >= 1));
    // The attempts carry the same locality and cluster (A78, A89).
    let attempts = &get("grpc.client.attempt.duration").points;
    let ok = telemetry_support::labels(&[
        ("grpc.target", target),
        ("grpc.method", telemetry_support::METHOD),
        ("grpc.status", "OK"),
        ("grpc.lb.locality", &value("grpc.lb.locality")),
        ("grpc.lb.backend_service", &value("grpc.lb.backend_service")),
    ]);
    assert!(attempts.get(&ok).is_some_and(|p| p.0 > 0), "{attempts:?}");
    // So do the subchannels' connections (A94), made under that locality.
    let connected = &get("grpc.subchannel.connection_attempts_succeeded").points;
    assert_eq!(connected.get(labels).map(|p| p.0), Some(3), "{connected:?}");
}

/// The same cluster from tether-control: tether's channel and gRPC C-core
/// (grpcio) both send 4 : 2 : 1, per call and out of band, and `tether
/// call`'s source (the response's `PickedPeer`) names the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_xds_tether_and_c_core_weigh_the_same_reports_alike() {
    let mut per_call = Vec::new();
    let mut oob = Vec::new();
    for (i, &u) in UTILIZATIONS.iter().enumerate() {
        per_call.push(backend(&format!("u{i}"), u, Reports::PerCall).await);
        oob.push(backend(&format!("u{i}"), u, Reports::OutOfBand).await);
    }
    let addrs = |bs: &[GrpcBackend]| bs.iter().map(|b| b.addr()).collect::<Vec<_>>();
    let control = Control::start(&yaml(&addrs(&per_call), &addrs(&oob))).await;
    let dir = TempDir::new("wrr");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("wrr"));
    let expected = [("u0", 4.0), ("u1", 2.0), ("u2", 1.0)];

    for target in ["xds:///wrr.tether.test", "xds:///oob.tether.test"] {
        let recorder = telemetry_support::Recorder::new();
        let mut telemetry = tether::Telemetry::builder(&recorder.provider);
        for name in tether::telemetry::OPTIONAL_METRICS
            .iter()
            .filter(|m| m.starts_with("grpc.lb.wrr.") || m.starts_with("grpc.subchannel."))
        {
            telemetry = telemetry.enable_metric(name).unwrap();
        }
        for label in tether::telemetry::OPTIONAL_LABELS {
            telemetry = telemetry.add_optional_label(label).unwrap();
        }
        let channel = Channel::builder()
            .bootstrap(tether::xds::Bootstrap::from_file(&bootstrap).unwrap())
            .telemetry(telemetry.build())
            .connect(target)
            .unwrap();
        until_weighted(&channel, 3).await;
        wrr_metrics_recorded(&recorder, target);
        let counts = spread(&channel).await;
        println!("tether {target}:");
        assert_shares(&counts, &expected);
        let reply = EchoClient::new(channel.clone())
            .echo(EchoRequest {
                message: "who".into(),
            })
            .await
            .unwrap();
        let picked = reply
            .extensions()
            .get::<tether::channel::PickedPeer>()
            .expect("the pick");
        assert_eq!(picked.2, "weighted_round_robin", "{picked:?}");
    }
    assert!(control.nacks_none(), "tether NACKed: {}", control.stderr());

    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-grpcio");
    let py = grpcio::python_or_install(Some(&venv))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = Client::new(py, &bootstrap);
    for target in ["xds:///wrr.tether.test", "xds:///oob.tether.test"] {
        let counts = grpcio_spread(&client, target).await;
        println!("grpcio (C-core) {target}:");
        assert_shares(&counts, &expected);
    }
    assert!(control.nacks_none(), "C-core NACKed: {}", control.stderr());
}
