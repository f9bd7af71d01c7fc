//! The channel benchmark, side by side in one run: `scripts/bench-channel.sh`
//! (`cargo bench -p tether --features internals --bench channel -- [--quick] [--only eds,updates,picker,throughput,rotation,instructions] [--kinds plain,...]`).
//!
//! 1. EDS: one update of a cluster with 10,000 endpoints (10 localities)
//!    applied to the LB tree's root (`xds_cluster_manager`) on a real
//!    `SubchannelPool`: time, and RSS growth with all 10,000 subchannels
//!    alive. Goals ≤ 50 ms, ≤ 50 MB.
//! 2. Update cost: 1,000 clusters x 100 endpoints, one endpoint's health
//!    changed in one of them (unchanged clusters are not updated: goal
//!    ≤ 1 ms), and one cluster of 100,000 endpoints in 1,000 localities
//!    (goals ≤ 500 ms, ≤ 300 MB once every subchannel tried).
//! 3. Picks (divan): through the picker chain the real policies build for
//!    round robin over three READY subchannels, and a bare round_robin
//!    picker; the same for least_request (gRFC A48) and with
//!    outlier_detection (gRFC A50) above the chain. Goal ≤ 100 ns.
//! 4. Unary Echo calls to in-process tonic servers at concurrency 1 and 64:
//!    plain tonic, tonic `balance_list`, `tether::Channel` static and over
//!    xDS (tether-control's library in-process). Goals: tether ≥ 0.95 ×
//!    plain tonic's calls/s, p99 within 10%; least_request and
//!    weighted_round_robin (the backends report per-call ORCA loads to
//!    every row) ≥ 0.95 × round robin's calls/s; round robin with outlier
//!    detection (over xDS) ≥
//!    0.95 × round robin without it. TLS rows: an mTLS backend, tonic with
//!    its own TLS (`tls-ring`) against the channel with `ChannelBuilder::tls`
//!    and with xDS mTLS (gRFC A29, `file_watcher` certificates), each held
//!    to ≥ 0.95 × tonic's calls/s and p99 within 10%. The Rust peer over
//!    xDS: tonic-xds (grpc-rust's xDS for tonic, 0.1.0-alpha.4) over the
//!    same tether-control ADS server and backends as the channel over xDS
//!    (goal: the channel ≥ 1.0 × its calls/s).
//! 5. A client certificate rotation under load: 64 tasks over xDS mTLS,
//!    the certificate files replaced midway (goal: no call fails).
//! 6. Instructions per unary call under callgrind, the client in a process
//!    of its own: plain tonic, the channel over the same endpoint, and with
//!    a session (goals ≤ 1.05 × tonic, sessions ≤ 1.05 × without); tonic
//!    with TLS, the channel with TLS and with xDS mTLS to the same backend;
//!    the channel over xDS and tonic-xds over the parent's ADS server (goal:
//!    the channel ≤ 1.0 × tonic-xds's instructions). `--kinds` selects the
//!    configurations of both sections.
//!
//! Everything is on loopback (127.0.0.0/8). Every loop is bounded by a count or a deadline.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use divan::{black_box, Bencher};
use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
use tether::lb::cds;
use tether::lb::cluster_manager::{self, ClusterManager};
use tether::lb::least_request::{LeastRequestPicker, Outstanding, ReadyEndpoint};
use tether::lb::outlier_detection::{
    FailurePercentageEjection, OutlierDetectionConfig, SuccessRateEjection,
};
use tether::lb::round_robin::RoundRobinPicker;
use tether::lb::{
    CallAttributes, ConnectivityState, Ctx, Event, LbConfig, LbPolicy, PickArgs, PickResult,
    Picker, SharedPicker, Subchannel, SubchannelPool,
};
use tether::session::{CookieJar, CookieJarLayer, CookieJarService, Layer};
use tether::subchannel::SubchannelOptions;
use tether_core::http::set_cookie::CookieSpec;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

const EDS_ENDPOINTS: usize = 10_000;
const EDS_LOCALITIES: u16 = 10;
/// The EDS update after the first replaces this many endpoints (1%).
const EDS_REPLACED: usize = 100;
const ECHO_PATH: &str = "/tether.demo.v1.Echo/Echo";
/// Bound on any wait for connections, resources or refusals.
const WAIT: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    // A child run under callgrind by the instructions section.
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some("--count") {
        return match count_calls(&raw[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench channel --count: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench channel: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let backends: Vec<GrpcBackend> = rt.block_on(async {
        let mut b = Vec::new();
        // Every backend reports its load in each response's trailers (the
        // same work for every row; weighted_round_robin reads it): nearly
        // equal loads, so its scheduler runs without starving anyone.
        for (name, utilization) in [("b0", 0.4), ("b1", 0.5), ("b2", 0.6)] {
            let metrics = tether::orca::ServerMetrics::new();
            metrics.set_application_utilization(utilization);
            metrics.set_qps(1000.0);
            b.push(
                GrpcBackend::start_wrapped(name, move |routes| {
                    let routes = tower_layer::Layer::layer(
                        &tether::orca::LoadReportLayer::new(metrics),
                        routes,
                    );
                    ForgetCookie(routes)
                })
                .await,
            );
        }
        b
    });
    let addrs: Vec<SocketAddr> = backends.iter().map(GrpcBackend::addr).collect();
    println!(
        "channel benchmark: {} cores, backends {addrs:?}{}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if args.quick {
            " (quick: a smoke run)"
        } else {
            ""
        }
    );
    let mut summary = Summary::default();
    // EDS first: its RSS growth is read in a process that has not yet
    // grown its heap with call load.
    if args.sections.contains("eds") {
        match eds_section(&rt, &args) {
            Ok(f) => summary.eds = Some(f),
            Err(e) => summary.fail(format!("EDS: {e}")),
        }
    }
    if args.sections.contains("updates") {
        match updates_section(&rt, &args) {
            Ok(f) => summary.updates = Some(f),
            Err(e) => summary.fail(format!("updates: {e}")),
        }
    }
    if args.sections.contains("picker") {
        match picker_section(&rt, &addrs, &args) {
            Ok(f) => summary.picks = Some(f),
            Err(e) => summary.fail(format!("picker: {e}")),
        }
    }
    if args.sections.contains("throughput") {
        match throughput_section(&rt, &addrs, &args) {
            Ok(rows) => summary.rows = rows,
            Err(e) => summary.fail(format!("throughput: {e}")),
        }
    }
    if args.sections.contains("rotation") {
        match rotation_section(&rt, &args) {
            Ok(f) => summary.rotation = Some(f),
            Err(e) => summary.fail(format!("rotation: {e}")),
        }
    }
    if args.sections.contains("instructions") {
        match instructions_section(&rt, &addrs, &args) {
            Ok(rows) => summary.instructions = rows,
            Err(e) => summary.fail(format!("instructions: {e}")),
        }
    }
    summary.print(&args);
    rt.block_on(async {
        for b in &backends {
            b.stop().await;
        }
    });
    // Subchannel and server tasks are not waited for.
    rt.shutdown_timeout(Duration::from_secs(1));
    if summary.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

const USAGE: &str = "options: --quick | --duration SECS | --warmup SECS | --rounds N | \
--eds-rounds N | --only eds,updates,picker,throughput,rotation,instructions | --kinds plain,balance,one,static,session,session_layer,sessions,xds,tonic_xds,least_request,weighted_round_robin,outlier_detection,tonic_tls,tls,xds_mtls";

/// The benchmark's sections, in the order they run.
const SECTIONS: [&str; 6] = [
    "eds",
    "updates",
    "picker",
    "throughput",
    "rotation",
    "instructions",
];

struct Args {
    quick: bool,
    warmup: Duration,
    duration: Duration,
    rounds: usize,
    eds_rounds: usize,
    sections: BTreeSet<String>,
    /// The configurations to run (throughput rows, and those of them the
    /// instructions section counts).
    kinds: Vec<Kind>,
}

impl Args {
    fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            quick: false,
            warmup: Duration::from_millis(500),
            duration: Duration::from_secs(3),
            rounds: 8,
            eds_rounds: 3,
            sections: SECTIONS.map(str::to_owned).into(),
            kinds: Kind::ALL.to_vec(),
        };
        let secs = |v: Option<String>| -> Result<Duration, String> {
            let v = v.ok_or("a value is missing")?;
            match v.parse::<f64>() {
                Ok(s) if s > 0.0 && s <= 60.0 => Ok(Duration::from_secs_f64(s)),
                _ => Err(format!("{v:?} is not a number of seconds in (0, 60]")),
            }
        };
        let count = |v: Option<String>| -> Result<usize, String> {
            let v = v.ok_or("a value is missing")?;
            match v.parse::<usize>() {
                Ok(n @ 1..=10) => Ok(n),
                _ => Err(format!("{v:?} is not a count in 1..=10")),
            }
        };
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--quick" => {
                    a.quick = true;
                    a.warmup = Duration::from_millis(100);
                    a.duration = Duration::from_millis(300);
                    a.rounds = 1;
                    a.eds_rounds = 1;
                }
                "--duration" => a.duration = secs(it.next())?,
                "--warmup" => a.warmup = secs(it.next())?,
                "--rounds" => a.rounds = count(it.next())?,
                "--eds-rounds" => a.eds_rounds = count(it.next())?,
                "--only" => {
                    let v = it.next().ok_or("--only needs a value")?;
                    a.sections = v.split(',').map(str::to_owned).collect();
                    if let Some(bad) = a.sections.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                        return Err(format!("unknown section {bad:?}"));
                    }
                }
                "--kinds" => {
                    let v = it.next().ok_or("--kinds needs a value")?;
                    a.kinds = v
                        .split(',')
                        .map(|k| {
                            Kind::ALL
                                .into_iter()
                                .find(|kind| kind.key() == k)
                                .ok_or(format!("unknown configuration {k:?}"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                // cargo bench passes it to every bench binary.
                "--bench" => {}
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        Ok(a)
    }
}

// --- 1. EDS update of 10,000 endpoints -------------------------------------

struct EdsFigures {
    endpoints: usize,
    /// Per round: the first update (creates every subchannel).
    first: Vec<Duration>,
    /// Per round: the next update, 1% of the endpoints replaced.
    next: Vec<Duration>,
    /// Per round: until every subchannel's one attempt was refused.
    settled: Vec<Duration>,
    /// Per round: the tree handling the 2 × 10,000 state changes
    /// (CONNECTING, TRANSIENT_FAILURE) of those attempts.
    absorb: Vec<Duration>,
    /// First round only: a fresh heap.
    rss_after_update: i64,
    rss_alive: i64,
    /// `SubchannelPool::get` alone for n new addresses: (n, time).
    pool_get: Vec<(usize, Duration)>,
}

/// The process's resident set size in bytes.
fn rss() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Ports of 127.0.0.1 that nothing listens on, below the ephemeral range:
/// a connect to them is refused at once, and (unlike a port in the
/// ephemeral range) can never be a TCP self-connect.
fn refused_ports(n: usize) -> Result<Vec<u16>, String> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .map_err(|e| format!("ip_local_port_range: {e}"))?;
    let low: u16 = range
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or("ip_local_port_range unreadable")?;
    let mut listening = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // State 0A is LISTEN; the local address ends in :PORT (hex).
            if f.len() > 3 && f[3] == "0A" {
                if let Some(p) = f[1].rsplit(':').next() {
                    if let Ok(p) = u16::from_str_radix(p, 16) {
                        listening.insert(p);
                    }
                }
            }
        }
    }
    let ports: Vec<u16> = (1024..low)
        .rev()
        .filter(|p| !listening.contains(p))
        .take(n)
        .collect();
    if ports.len() < n {
        return Err(format!(
            "only {} free ports below the ephemeral range ({low})",
            ports.len()
        ));
    }
    Ok(ports)
}

/// A cluster of round robin over `ports` on 127.0.0.1, each in locality
/// `zone-(port % localities)` so an endpoint keeps its locality across
/// updates; the same `cds` config the resolver makes from CDS + EDS.
fn cds_config(name: &str, ports: &[u16], localities: u16) -> Result<LbConfig, String> {
    cds_config_with(name, ports, localities, EndpointPolicy::RoundRobin)
}

/// As [`cds_config`], with `policy` in each locality.
fn cds_config_with(
    name: &str,
    ports: &[u16],
    localities: u16,
    policy: EndpointPolicy,
) -> Result<LbConfig, String> {
    let endpoints: Vec<(SocketAddr, usize)> = ports
        .iter()
        .map(|p| (SocketAddr::from(([127, 0, 0, 1], *p)), usize::from(*p)))
        .collect();
    let clusters = leaf_configs(name, &endpoints, usize::from(localities), policy)?;
    Ok(LbConfig::ClusterManager(cluster_manager::Config {
        clusters,
    }))
}

/// The `cds` configs (one cluster) of `endpoints`, each `(address, n)` in
/// locality `zone-(n % localities)`.
fn leaf_configs(
    name: &str,
    endpoints: &[(SocketAddr, usize)],
    localities: usize,
    policy: EndpointPolicy,
) -> Result<BTreeMap<Arc<str>, LbConfig>, String> {
    let config = StaticConfig::new(
        name.to_owned(),
        endpoints
            .iter()
            .map(|(a, n)| {
                let mut e = StaticEndpoint::new(*a);
                e.locality = format!("zone-{}", n % localities);
                e
            })
            .collect(),
    )
    .with_policy(policy)
    .channel_config()
    .map_err(|e| e.to_string())?;
    Ok(config
        .clusters
        .into_iter()
        .map(|(n, c)| (n, LbConfig::Cds(c)))
        .collect())
}

/// The outlier detection the benchmark turns on: both algorithms with
/// gRPC's defaults, so every call is counted; the interval is a second so
/// that the timer also runs during a measured window.
fn bench_outlier_detection() -> OutlierDetectionConfig {
    let mut c = OutlierDetectionConfig::default();
    c.interval = Duration::from_secs(1);
    c.success_rate = Some(SuccessRateEjection::default());
    c.failure_percentage = Some(FailurePercentageEjection::default());
    c
}

/// `config` with [`bench_outlier_detection`] on every leaf cluster, as
/// CDS `outlier_detection` sets it (the static config has no such field).
fn with_outlier_detection(config: LbConfig) -> Result<LbConfig, String> {
    let LbConfig::ClusterManager(mut cm) = config else {
        return Err("not a cluster_manager config".into());
    };
    for cluster in cm.clusters.values_mut() {
        let LbConfig::Cds(cds::Config::Leaf(leaf)) = cluster else {
            return Err("not a leaf cluster".into());
        };
        Arc::make_mut(&mut leaf.cluster).outlier_detection = Some(bench_outlier_detection());
    }
    Ok(LbConfig::ClusterManager(cm))
}

/// A pool whose state changes are counted and queued for the tree.
struct CountingPool {
    pool: SubchannelPool,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    refused: Arc<AtomicUsize>,
}

impl CountingPool {
    /// Must run inside the runtime: subchannel tasks go there.
    fn new(options: SubchannelOptions) -> CountingPool {
        let (events_tx, events) = mpsc::unbounded_channel();
        let refused = Arc::new(AtomicUsize::new(0));
        let (tx, counter) = (events_tx.clone(), refused.clone());
        let pool = SubchannelPool::new(
            options,
            Arc::new(move |id, address, state| {
                if state == ConnectivityState::TransientFailure {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                let _ = tx.send(Event::Subchannel(id, address, state));
            }),
        );
        CountingPool {
            pool,
            events_tx,
            events,
            refused,
        }
    }

    /// Waits (polling, bounded) until `n` attempts were refused.
    fn wait_refused(&self, n: usize) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        while self.refused.load(Ordering::Relaxed) < n {
            if Instant::now() > deadline {
                return Err(format!(
                    "only {} of {n} connection attempts were refused within {WAIT:?}",
                    self.refused.load(Ordering::Relaxed)
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

fn eds_section(rt: &Runtime, args: &Args) -> Result<EdsFigures, String> {
    println!(
        "\n== 1. EDS update: {EDS_ENDPOINTS} endpoints in {EDS_LOCALITIES} localities, round robin"
    );
    let ports = refused_ports(EDS_ENDPOINTS + EDS_REPLACED)?;
    let first_config = cds_config("eds-bench", &ports[..EDS_ENDPOINTS], EDS_LOCALITIES)?;
    let next_config = cds_config("eds-bench", &ports[EDS_REPLACED..], EDS_LOCALITIES)?;
    // One attempt per address: a failed one backs off for a minute, longer
    // than a round, so the refused ports see no retry traffic.
    let mut options = SubchannelOptions::default();
    options.backoff.initial = Duration::from_secs(60);
    // Subchannel tasks and timers are spawned from this thread into `rt`;
    // the update itself runs here, as on the channel's LB task.
    let _entered = rt.enter();
    let mut f = EdsFigures {
        endpoints: EDS_ENDPOINTS,
        first: Vec::new(),
        next: Vec::new(),
        settled: Vec::new(),
        absorb: Vec::new(),
        rss_after_update: 0,
        rss_alive: 0,
        pool_get: Vec::new(),
    };
    for round in 0..args.eds_rounds {
        let mut p = CountingPool::new(options.clone());
        let mut next_timer = 0;
        let mut root = ClusterManager::new();
        let config = first_config.clone();
        let rss0 = rss();
        let started = Instant::now();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "eds-bench");
            root.update(&mut ctx, config);
        }
        let took = started.elapsed();
        let rss1 = rss();
        p.wait_refused(EDS_ENDPOINTS)?;
        let settled = started.elapsed();
        let rss2 = rss();
        let alive = p.pool.subchannels().len();
        if alive != EDS_ENDPOINTS {
            return Err(format!("{alive} subchannels alive, not {EDS_ENDPOINTS}"));
        }
        let mut queued = Vec::with_capacity(2 * EDS_ENDPOINTS);
        while let Ok(e) = p.events.try_recv() {
            queued.push(e);
        }
        let absorb_start = Instant::now();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "eds-bench");
            for e in &queued {
                root.event(&mut ctx, e);
            }
        }
        let absorb = absorb_start.elapsed();
        if root.state() != ConnectivityState::TransientFailure {
            return Err(format!(
                "after every attempt was refused the tree is {}, not TRANSIENT_FAILURE",
                root.state()
            ));
        }
        let config = next_config.clone();
        let next_start = Instant::now();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "eds-bench");
            root.update(&mut ctx, config);
        }
        let next = next_start.elapsed();
        p.wait_refused(EDS_ENDPOINTS + EDS_REPLACED)?;
        println!(
            "round {}: first update {} (RSS +{:.1} MB; +{:.1} MB once all {EDS_ENDPOINTS} attempts \
             were refused, after {}); {} state changes absorbed in {}; next update (1% replaced) {}",
            round + 1,
            fmt_dur(took),
            mb(rss1 - rss0),
            mb(rss2 - rss0),
            fmt_dur(settled),
            queued.len(),
            fmt_dur(absorb),
            fmt_dur(next),
        );
        if round == 0 {
            f.rss_after_update = rss1 - rss0;
            f.rss_alive = rss2 - rss0;
        }
        f.first.push(took);
        f.next.push(next);
        f.settled.push(settled);
        f.absorb.push(absorb);
        drop(root);
        drop(p);
        // Lets the runtime drop the aborted subchannel tasks.
        std::thread::sleep(Duration::from_millis(100));
    }
    // Where the first update's time goes: creating subchannels through the
    // pool alone (IDLE, never asked to connect: no traffic).
    let sizes: &[usize] = if args.quick {
        &[2_500, 10_000]
    } else {
        &[1_250, 2_500, 5_000, 10_000]
    };
    for &n in sizes {
        let p = CountingPool::new(SubchannelOptions::default());
        let started = Instant::now();
        let held: Vec<Subchannel> = ports[..n]
            .iter()
            .map(|port| p.pool.get(SocketAddr::from(([127, 0, 0, 1], *port))))
            .collect();
        let took = started.elapsed();
        drop(held);
        println!(
            "SubchannelPool::get for {n} new addresses: {}",
            fmt_dur(took)
        );
        f.pool_get.push((n, took));
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(f)
}

// --- 2. Picks -----------------------------------------------------------------

struct PickerFixture {
    /// The root picker of the real tree: cluster_manager → cluster_impl →
    /// (priority) → weighted_target → round_robin.
    chain: SharedPicker,
    /// A round_robin picker over the same three subchannels.
    bare: SharedPicker,
    /// The same tree with least_request (2 draws) in place of round_robin.
    least_request_chain: SharedPicker,
    /// A least_request picker over the same three subchannels.
    least_request_bare: SharedPicker,
    /// The round robin tree with outlier_detection above cluster_impl,
    /// both algorithms on (each pick adds the endpoint's call counter).
    outlier_detection_chain: SharedPicker,
    /// The same tree with weighted_round_robin (per-call reports: each
    /// pick adds the endpoint's weight as its tracker).
    weighted_round_robin_chain: SharedPicker,
    cluster: Arc<str>,
    headers: http::HeaderMap,
    /// A session's call attributes: its cookie names the first backend.
    session: CallAttributes,
}

static PICKER: OnceLock<PickerFixture> = OnceLock::new();

/// A `ring_hash` policy over 1,000 endpoints, every one READY (states fed
/// to the real policy: nothing listens on these addresses), and the
/// route's header hash policy the config selector evaluates per call.
struct RingFixture {
    picker: SharedPicker,
    policies: tether_core::hash::HashPolicies,
    keys: Vec<String>,
    next: AtomicUsize,
    headers: http::HeaderMap,
    /// Owns the subchannels the picker holds.
    _pool: SubchannelPool,
}

static RING: OnceLock<RingFixture> = OnceLock::new();

const RING_HOSTS: u16 = 1000;

fn ring_fixture() -> Result<RingFixture, String> {
    use tether::lb::ring_hash::{self, RingHash, Table};
    use tether::lb::wrr_locality::Locality;
    use tether::lb::EndpointAddresses;
    let (tx, mut rx) = mpsc::unbounded_channel();
    // No runtime around the pool: its subchannels never connect; the
    // states below are the only ones the policy sees.
    let pool = SubchannelPool::new(SubchannelOptions::default(), Arc::new(|_, _, _| {}));
    let mut next_timer = 0;
    let addrs: Vec<SocketAddr> = (0..RING_HOSTS)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], 20_000 + i)))
        .collect();
    let mut policy = RingHash::new();
    let mut ctx = Ctx::new(&pool, &tx, &mut next_timer, "ring-bench");
    policy.update(
        &mut ctx,
        LbConfig::RingHash(ring_hash::Config {
            localities: vec![Locality {
                name: Default::default(),
                weight: 1,
                endpoints: addrs
                    .iter()
                    .map(|a| EndpointAddresses::single(*a))
                    .collect(),
            }],
            table: Table::Ring {
                min_ring_size: 1024,
                max_ring_size: 4096,
            },
        }),
    );
    // Picks ask the policy to connect IDLE endpoints; the asks name it.
    let attributes = CallAttributes::default();
    let headers = http::HeaderMap::new();
    let args = PickArgs {
        path: ECHO_PATH,
        headers: &headers,
        attributes: &attributes,
    };
    let _ = policy.picker().pick(&args);
    let Ok(Event::ConnectEndpoint(id, _)) = rx.try_recv() else {
        return Err("a pick on an IDLE ring did not ask to connect".into());
    };
    for a in &addrs {
        policy.event(&mut ctx, &Event::ConnectEndpoint(id, *a));
        let sc = pool.peek(*a).ok_or("no subchannel made")?.id();
        policy.event(
            &mut ctx,
            &Event::Subchannel(sc, *a, ConnectivityState::Connecting),
        );
        policy.event(
            &mut ctx,
            &Event::Subchannel(sc, *a, ConnectivityState::Ready),
        );
    }
    if policy.state() != ConnectivityState::Ready {
        return Err(format!("the ring is {}, not READY", policy.state()));
    }
    let fixture = RingFixture {
        picker: policy.picker(),
        policies: tether_core::hash::HashPolicies::from_json(
            r#"[{"header":{"header_name":"x-user"}}]"#,
            tether_core::hash::Peer::GrpcExtended,
        )
        .map_err(|e| e.to_string())?,
        keys: (0..4096).map(|i| format!("user-{i}")).collect(),
        next: AtomicUsize::new(0),
        headers,
        _pool: pool,
    };
    // Every key lands on a READY endpoint, and the keys spread.
    let mut seen = HashSet::new();
    for _ in 0..fixture.keys.len() {
        seen.insert(ring_pick(&fixture).address());
    }
    if seen.len() < 900 {
        return Err(format!(
            "4,096 keys reached only {} of 1,000 hosts",
            seen.len()
        ));
    }
    Ok(fixture)
}

/// One ring pick as a call makes it: the route's header hash policy on the
/// next key, then the pick.
fn ring_pick(f: &RingFixture) -> Subchannel {
    let key = &f.keys[f.next.fetch_add(1, Ordering::Relaxed) % f.keys.len()];
    let hash = f
        .policies
        .evaluate(&tether_core::hash::HashRequest::new(
            &[("x-user", key.as_str())] as &[(&str, &str)],
        ))
        .hash
        .value();
    let attributes = CallAttributes {
        hash,
        ..Default::default()
    };
    let args = PickArgs {
        path: ECHO_PATH,
        headers: &f.headers,
        attributes: &attributes,
    };
    match f.picker.pick(black_box(&args)) {
        PickResult::Complete(pick) => pick.subchannel,
        other => panic!("a ring pick did not complete: {other:?}"),
    }
}

#[divan::bench]
fn pick_ring_hash_1000_hosts_with_header_hash(bencher: Bencher) {
    let f = RING.get().expect("ring fixture");
    bencher.bench_local(|| ring_pick(f).id());
}

struct PickFigures {
    chain_ns: f64,
    bare_ns: f64,
    least_request_chain_ns: f64,
    least_request_bare_ns: f64,
    outlier_detection_chain_ns: f64,
    weighted_round_robin_chain_ns: f64,
    override_ns: f64,
    ring_ns: f64,
}

/// weighted_round_robin as the benchmark runs it: weights used at once,
/// rebuilt every 100 ms.
fn wrr_settings() -> tether::lb::weighted_round_robin::Settings {
    let mut s = tether::lb::weighted_round_robin::Settings::default();
    s.blackout_period = Duration::ZERO;
    s.weight_update_period = Duration::from_millis(100);
    s
}

/// Builds the tree for round robin over the backends with the real
/// policies and drives it with its subchannels' events until all three
/// are READY.
fn picker_fixture(rt: &Runtime, addrs: &[SocketAddr]) -> Result<PickerFixture, String> {
    let ports: Vec<u16> = addrs.iter().map(SocketAddr::port).collect();
    // One locality: weighted_target then has one child, as for the
    // channel's static and tether-control configurations below.
    let config = cds_config("picker-bench", &ports, 1)?;
    // The same cluster with least_request: a second tree on the same pool.
    let least_request_config = cds_config_with(
        "picker-bench",
        &ports,
        1,
        EndpointPolicy::LeastRequest { choice_count: 2 },
    )?;
    // And with outlier detection: a third tree.
    let outlier_detection_config = with_outlier_detection(config.clone())?;
    // And with weighted_round_robin: a fourth.
    let weighted_round_robin_config = cds_config_with(
        "picker-bench",
        &ports,
        1,
        EndpointPolicy::WeightedRoundRobin(wrr_settings()),
    )?;
    rt.block_on(async {
        let mut p = CountingPool::new(SubchannelOptions::default());
        let mut next_timer = 0;
        let mut root = ClusterManager::new();
        let mut least_request_root = ClusterManager::new();
        let mut outlier_detection_root = ClusterManager::new();
        let mut weighted_round_robin_root = ClusterManager::new();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "picker-bench");
            root.update(&mut ctx, config);
            least_request_root.update(&mut ctx, least_request_config);
            outlier_detection_root.update(&mut ctx, outlier_detection_config);
            weighted_round_robin_root.update(&mut ctx, weighted_round_robin_config);
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut ready = HashSet::new();
        while ready.len() < addrs.len() {
            let e = tokio::time::timeout_at(deadline, p.events.recv())
                .await
                .map_err(|_| format!("only {} of 3 subchannels READY", ready.len()))?
                .ok_or("event queue closed")?;
            if let Event::Subchannel(id, _, ConnectivityState::Ready) = e {
                ready.insert(id);
            }
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "picker-bench");
            root.event(&mut ctx, &e);
            least_request_root.event(&mut ctx, &e);
            outlier_detection_root.event(&mut ctx, &e);
            weighted_round_robin_root.event(&mut ctx, &e);
        }
        if root.state() != ConnectivityState::Ready {
            return Err(format!("the tree is {}, not READY", root.state()));
        }
        if least_request_root.state() != ConnectivityState::Ready {
            return Err(format!(
                "the least_request tree is {}, not READY",
                least_request_root.state()
            ));
        }
        if outlier_detection_root.state() != ConnectivityState::Ready {
            return Err(format!(
                "the outlier_detection tree is {}, not READY",
                outlier_detection_root.state()
            ));
        }
        if weighted_round_robin_root.state() != ConnectivityState::Ready {
            return Err(format!(
                "the weighted_round_robin tree is {}, not READY",
                weighted_round_robin_root.state()
            ));
        }
        let subchannels = p.pool.subchannels();
        let fixture = PickerFixture {
            weighted_round_robin_chain: weighted_round_robin_root.picker(),
            chain: root.picker(),
            least_request_chain: least_request_root.picker(),
            outlier_detection_chain: outlier_detection_root.picker(),
            least_request_bare: Arc::new(LeastRequestPicker::new(
                subchannels
                    .iter()
                    .map(|sc| ReadyEndpoint {
                        subchannel: sc.clone(),
                        outstanding: Arc::new(Outstanding::new()),
                    })
                    .collect(),
                2,
            )),
            bare: Arc::new(RoundRobinPicker::new(subchannels)),
            cluster: "picker-bench".into(),
            headers: http::HeaderMap::new(),
            session: CallAttributes {
                cluster: "picker-bench".into(),
                override_addresses: Some(Arc::from([addrs[0]])),
                session_id: Some(1),
                ..Default::default()
            },
        };
        // The chain must spread over all three, in turn.
        let mut seen = BTreeMap::new();
        for _ in 0..300 {
            *seen
                .entry(pick_once(&*fixture.chain, &fixture).address())
                .or_insert(0) += 1;
        }
        if seen.len() != 3 || seen.values().any(|n| *n != 100) {
            return Err(format!("300 picks went {seen:?}, not 100 to each of 3"));
        }
        // With outlier detection (nothing fails, nothing is ejected): the
        // same turns.
        let mut seen = BTreeMap::new();
        for _ in 0..300 {
            *seen
                .entry(pick_once(&*fixture.outlier_detection_chain, &fixture).address())
                .or_insert(0) += 1;
        }
        if seen.len() != 3 || seen.values().any(|n| *n != 100) {
            return Err(format!(
                "300 outlier_detection picks went {seen:?}, not 100 to each of 3"
            ));
        }
        // least_request's calls end at once here: equal counters, random
        // draws, every backend reached.
        let mut seen = BTreeMap::new();
        for _ in 0..300 {
            *seen
                .entry(pick_once(&*fixture.least_request_chain, &fixture).address())
                .or_insert(0) += 1;
        }
        if seen.len() != 3 || seen.values().any(|n| *n < 50) {
            return Err(format!(
                "300 least_request picks went {seen:?}, not about 100 to each of 3"
            ));
        }
        // A session's picks all go to its backend.
        for _ in 0..30 {
            let a = pick_with(&*fixture.chain, &fixture, &fixture.session).address();
            if a != addrs[0] {
                return Err(format!("a session pick went to {a}, not {}", addrs[0]));
            }
        }
        Ok(fixture)
    })
}

/// One pick as a call makes it: the subchannel, and the pick's trackers
/// told the call ended (cluster_impl counts calls in flight).
fn pick_once(picker: &dyn Picker, f: &PickerFixture) -> Subchannel {
    let attributes = CallAttributes {
        cluster: f.cluster.clone(),
        ..Default::default()
    };
    pick_with(picker, f, &attributes)
}

/// One pick with `attributes`, as [`pick_once`].
fn pick_with(picker: &dyn Picker, f: &PickerFixture, attributes: &CallAttributes) -> Subchannel {
    let args = PickArgs {
        path: ECHO_PATH,
        headers: &f.headers,
        attributes,
    };
    match picker.pick(black_box(&args)) {
        PickResult::Complete(pick) => {
            pick.trackers.finished(true);
            pick.subchannel
        }
        other => panic!("a pick did not complete: {other:?}"),
    }
}

#[divan::bench]
fn pick_xds_chain(bencher: Bencher) {
    let f = PICKER.get().expect("picker fixture");
    bencher.bench_local(|| pick_once(&*f.chain, f).id());
}

#[divan::bench]
fn pick_session_override(bencher: Bencher) {
    let f = PICKER.get().expect("picker fixture");
    bencher.bench_local(|| pick_with(&*f.chain, f, &f.session).id());
}

#[divan::bench]
fn pick_round_robin(bencher: Bencher) {
    let f = PICKER.get().expect("picker fixture");
    bencher.bench_local(|| pick_once(&*f.bare, f).id());
}

#[divan::bench]
fn pick_xds_chain_least_request(bencher: Bencher) {
    let f = PICKER.get().expect("picker fixture");
    bencher.bench_local(|| pick_once(&*f.least_request_chain, f).id());
}

#[divan::bench]
fn pick_xds_chain_outlier_detection(bencher: Bencher) {
    let f = PICKER.get().expect("picker fixture");
    bencher.bench_local(|| pick_once(&*f.outlier_detection_chain, f).id());
}

#[divan::bench]
fn pick_xds_chain_weighted_round_robin(bencher: Bencher) {
    let f = PICKER.get().expect("picker fixture");
    bencher.bench_local(|| pick_once(&*f.weighted_round_robin_chain, f).id());
}

#[divan::bench]
fn pick_least_request(bencher: Bencher) {
    let f = PICKER.get().expect("picker fixture");
    bencher.bench_local(|| pick_once(&*f.least_request_bare, f).id());
}

/// The median over batches of the time of one `pick`, for the summary.
fn median_ns<T>(batches: usize, size: u32, mut pick: impl FnMut() -> T) -> f64 {
    let mut per_pick: Vec<f64> = (0..batches)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..size {
                black_box(pick());
            }
            started.elapsed().as_nanos() as f64 / f64::from(size)
        })
        .collect();
    per_pick.sort_by(f64::total_cmp);
    per_pick[per_pick.len() / 2]
}

fn picker_section(rt: &Runtime, addrs: &[SocketAddr], args: &Args) -> Result<PickFigures, String> {
    println!("\n== 3. Picks (divan; each pick also tells its trackers the call ended)");
    let fixture = picker_fixture(rt, addrs)?;
    let _ = PICKER.set(fixture);
    let _ = RING.set(ring_fixture()?);
    let ring = RING.get().ok_or("ring fixture")?;
    let f = PICKER.get().ok_or("picker fixture")?;
    // A fixed sample size: divan's tuning stops at one pick per sample when
    // its first sample is slowed down (a shared machine), and then reports
    // mostly timer overhead.
    let (count, size) = if args.quick {
        (20, 5_000)
    } else {
        (100, 10_000)
    };
    divan::Divan::default()
        .sample_count(count)
        .sample_size(size)
        .run_benches();
    let (batches, size) = if args.quick {
        (5, 20_000)
    } else {
        (21, 200_000)
    };
    let plain = CallAttributes {
        cluster: f.cluster.clone(),
        ..Default::default()
    };
    Ok(PickFigures {
        chain_ns: median_ns(batches, size, || pick_with(&*f.chain, f, &plain).id()),
        bare_ns: median_ns(batches, size, || pick_with(&*f.bare, f, &plain).id()),
        least_request_chain_ns: median_ns(batches, size, || {
            pick_with(&*f.least_request_chain, f, &plain).id()
        }),
        least_request_bare_ns: median_ns(batches, size, || {
            pick_with(&*f.least_request_bare, f, &plain).id()
        }),
        outlier_detection_chain_ns: median_ns(batches, size, || {
            pick_with(&*f.outlier_detection_chain, f, &plain).id()
        }),
        weighted_round_robin_chain_ns: median_ns(batches, size, || {
            pick_with(&*f.weighted_round_robin_chain, f, &plain).id()
        }),
        override_ns: median_ns(batches, size, || pick_with(&*f.chain, f, &f.session).id()),
        ring_ns: median_ns(batches, size, || ring_pick(ring).id()),
    })
}

// --- 3. Throughput and latency ---------------------------------------------

#[derive(Clone)]
enum Client {
    Tonic(EchoClient<tonic::transport::Channel>),
    Tether(EchoClient<tether::Channel>),
    /// grpc-rust's xDS for tonic (tonic-xds).
    TonicXds(EchoClient<tonic_xds::XdsChannelGrpc>),
    Session(EchoClient<CookieJarService<tether::Channel>>),
    /// A jar per calling task over one channel (in a handle of its own):
    /// each task is a session.
    Sessions(tether::Channel),
}

impl Client {
    /// The client one calling task uses: a clone, or for
    /// [`Client::Sessions`] a channel handle with a jar of its own.
    fn for_task(&self) -> Client {
        match self {
            Client::Sessions(ch) => {
                Client::Tether(EchoClient::new(ch.with_cookie_jar(CookieJar::new())))
            }
            other => other.clone(),
        }
    }

    /// One unary call; the backend that answered.
    async fn echo(&mut self) -> Result<String, tonic::Status> {
        let request = EchoRequest {
            message: "bench".into(),
        };
        let reply = match self {
            Client::Tonic(c) => c.echo(request).await?,
            Client::Tether(c) => c.echo(request).await?,
            Client::TonicXds(c) => tonic_xds_echo(c, request).await?,
            Client::Session(c) => c.echo(request).await?,
            Client::Sessions(ch) => EchoClient::new(ch.clone()).echo(request).await?,
        };
        Ok(reply.into_inner().backend)
    }
}

/// A tonic-xds call as a boxed `Send` future: rustc cannot prove the
/// generated client's future `Send` for every lifetime of its boxed error
/// inside `Client::echo` (spawned by [`load`]); checked here, where the
/// lifetimes are concrete.
#[allow(clippy::type_complexity)]
fn tonic_xds_echo(
    c: &mut EchoClient<tonic_xds::XdsChannelGrpc>,
    request: EchoRequest,
) -> std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = Result<tonic::Response<tether_testkit::grpc::EchoReply>, tonic::Status>,
            > + Send
            + '_,
    >,
> {
    Box::pin(c.echo(request))
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    Plain,
    Balance,
    TetherOne,
    /// A `dns:` target (pick_first) whose name the in-process DNS server
    /// resolves to the one endpoint.
    TetherDns,
    TetherStatic,
    TetherSession,
    TetherSessionLayer,
    TetherSessions,
    /// The one endpoint recording gRPC's metrics (A66) into the
    /// OpenTelemetry SDK, read by its Prometheus exporter.
    TetherOtel,
    TetherXds,
    /// The same xDS cluster reporting load (LRS every second).
    TetherXdsLrs,
    TonicXds,
    TetherLeastRequest,
    TetherWeightedRoundRobin,
    TetherOutlierDetection,
    TonicTls,
    TetherTls,
    TetherXdsMtls,
}

impl Kind {
    const ALL: [Kind; 18] = [
        Kind::Plain,
        Kind::Balance,
        Kind::TetherOne,
        Kind::TetherDns,
        Kind::TetherStatic,
        Kind::TetherSession,
        Kind::TetherSessionLayer,
        Kind::TetherSessions,
        Kind::TetherOtel,
        Kind::TetherXds,
        Kind::TetherXdsLrs,
        Kind::TonicXds,
        Kind::TetherLeastRequest,
        Kind::TetherWeightedRoundRobin,
        Kind::TetherOutlierDetection,
        Kind::TonicTls,
        Kind::TetherTls,
        Kind::TetherXdsMtls,
    ];

    fn label(self) -> &'static str {
        match self {
            Kind::Plain => "plain tonic Channel, 1 endpoint",
            Kind::Balance => "tonic Channel::balance_list, 3 endpoints",
            Kind::TetherOne => "tether::Channel static, 1 endpoint",
            Kind::TetherDns => "tether::Channel dns: target (pick_first), 1 endpoint",
            Kind::TetherStatic => "tether::Channel static, round robin over 3",
            Kind::TetherSession => {
                "tether::Channel static + sessions, one jar in the handle: pinned to 1"
            }
            Kind::TetherSessionLayer => {
                "tether::Channel static + sessions, one jar as a layer: pinned to 1"
            }
            Kind::TetherSessions => "tether::Channel static + sessions, a jar per task over 3",
            Kind::TetherOtel => {
                "tether::Channel static, 1 endpoint, A66 metrics (OpenTelemetry SDK, Prometheus exporter)"
            }
            Kind::TetherXds => "tether::Channel xDS (tether-control), round robin over 3",
            Kind::TetherXdsLrs => {
                "tether::Channel xDS + load reports (LRS every 1 s), round robin over 3"
            }
            Kind::TonicXds => "tonic-xds 0.1.0-alpha.4 (tether-control), p2c over 3",
            Kind::TetherLeastRequest => "tether::Channel static, least_request over 3",
            Kind::TetherWeightedRoundRobin => {
                "tether::Channel static, weighted_round_robin (per-call ORCA) over 3"
            }
            Kind::TetherOutlierDetection => {
                "tether::Channel xDS + outlier detection, round robin over 3"
            }
            Kind::TonicTls => "plain tonic Channel, mTLS (tls-ring), 1 endpoint",
            Kind::TetherTls => "tether::Channel static, mTLS (ChannelBuilder::tls), 1 endpoint",
            Kind::TetherXdsMtls => "tether::Channel xDS mTLS (A29, file_watcher), 1 endpoint",
        }
    }

    /// A short name for `--kinds`.
    fn key(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Balance => "balance",
            Kind::TetherOne => "one",
            Kind::TetherDns => "dns",
            Kind::TetherStatic => "static",
            Kind::TetherSession => "session",
            Kind::TetherSessionLayer => "session_layer",
            Kind::TetherSessions => "sessions",
            Kind::TetherOtel => "otel",
            Kind::TetherXds => "xds",
            Kind::TetherXdsLrs => "xds_lrs",
            Kind::TonicXds => "tonic_xds",
            Kind::TetherLeastRequest => "least_request",
            Kind::TetherWeightedRoundRobin => "weighted_round_robin",
            Kind::TetherOutlierDetection => "outlier_detection",
            Kind::TonicTls => "tonic_tls",
            Kind::TetherTls => "tls",
            Kind::TetherXdsMtls => "xds_mtls",
        }
    }

    fn is_tether(self) -> bool {
        !matches!(
            self,
            Kind::Plain | Kind::Balance | Kind::TonicXds | Kind::TonicTls
        )
    }

    /// The configuration that differs from this one only in what is
    /// measured: tonic over the same endpoints for the channels, the same
    /// channel without the session filter and jar for sessions, round robin
    /// for least_request, round robin over xDS without it for outlier
    /// detection.
    fn like_for_like(self, concurrency: usize) -> Option<Kind> {
        match self {
            Kind::Plain => None,
            Kind::Balance | Kind::TetherOne | Kind::TetherDns => Some(Kind::Plain),
            Kind::TetherStatic | Kind::TetherXds | Kind::TonicXds => Some(Kind::Balance),
            Kind::TetherSession | Kind::TetherSessionLayer | Kind::TetherOtel => {
                Some(Kind::TetherOne)
            }
            // One calling task is one session, pinned to one endpoint: its
            // calls take the path of the channel over one endpoint, not
            // round robin's over three.
            Kind::TetherSessions if concurrency == 1 => Some(Kind::TetherOne),
            Kind::TetherSessions => Some(Kind::TetherStatic),
            Kind::TetherLeastRequest | Kind::TetherWeightedRoundRobin => Some(Kind::TetherStatic),
            // The same tether-control file without `outlierDetection`
            // (without `loadReporting`).
            Kind::TetherOutlierDetection | Kind::TetherXdsLrs => Some(Kind::TetherXds),
            Kind::TonicTls => None,
            // tonic with the same TLS to the same backend.
            Kind::TetherTls | Kind::TetherXdsMtls => Some(Kind::TonicTls),
        }
    }
}

/// One configuration at one concurrency, one round.
#[derive(Clone, Copy)]
struct Run {
    calls_per_s: f64,
    p50: Duration,
    p99: Duration,
    errors: usize,
}

/// The median of the rounds of one configuration at one concurrency.
struct Row {
    kind: Kind,
    concurrency: usize,
    calls_per_s: f64,
    p50: Duration,
    p99: Duration,
    errors: usize,
    /// Each round's run, in order: ratios pair runs of the same round.
    runs: Vec<Run>,
}

/// The benchmark's backends answer a call with a cookie exactly as one
/// without: the test backend otherwise reflects the `cookie` it saw in its
/// answer (`x-seen-cookie`, for tests), and decoding that header would be
/// counted against the session rows although no real server sends it.
#[derive(Clone)]
struct ForgetCookie<S>(S);

impl<S, B> tower_service::Service<http::Request<B>> for ForgetCookie<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        request.headers_mut().remove(http::header::COOKIE);
        self.0.call(request)
    }
}

/// Set for the callgrind child: the address of its parent's ADS server
/// (the xDS rows' tether-control), so that the child counts the client alone.
const ADS_ENV: &str = "TETHER_BENCH_ADS";

/// The ADS server of the xDS rows (`xds` and `tonic_xds`): one per process,
/// serving the bench's tether-control file over `addrs`; in the callgrind
/// child, its parent's.
async fn shared_ads(addrs: &[SocketAddr]) -> Result<SocketAddr, String> {
    static ADS: tokio::sync::OnceCell<Result<SocketAddr, String>> =
        tokio::sync::OnceCell::const_new();
    ADS.get_or_init(|| async {
        match std::env::var(ADS_ENV) {
            Ok(a) => a.parse().map_err(|e| format!("{ADS_ENV}={a:?}: {e}")),
            Err(_) => serve_control(addrs, "").await,
        }
    })
    .await
    .clone()
}

/// The ADS server and its bootstrap for the xDS configuration.
async fn control_plane(addrs: &[SocketAddr]) -> Result<tether::xds::Bootstrap, String> {
    bootstrap_for(shared_ads(addrs).await?)
}

/// The environment variable of [`shared_ads_lrs`], as [`ADS_ENV`].
const ADS_LRS_ENV: &str = "TETHER_BENCH_ADS_LRS";

/// As [`shared_ads`], with the service reporting load every second.
async fn shared_ads_lrs(addrs: &[SocketAddr]) -> Result<SocketAddr, String> {
    static ADS: tokio::sync::OnceCell<Result<SocketAddr, String>> =
        tokio::sync::OnceCell::const_new();
    ADS.get_or_init(|| async {
        match std::env::var(ADS_LRS_ENV) {
            Ok(a) => a.parse().map_err(|e| format!("{ADS_LRS_ENV}={a:?}: {e}")),
            Err(_) => serve_control(addrs, "    loadReporting: { interval: 1s }\n").await,
        }
    })
    .await
    .clone()
}

/// A bootstrap naming the ADS server at `ads`.
fn bootstrap_for(ads: SocketAddr) -> Result<tether::xds::Bootstrap, String> {
    tether::xds::Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{ads}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"bench"}}}}"#
    ))
    .map_err(|e| e.to_string())
}

/// tonic-xds over the same ADS server as [`control_plane`]: its bootstrap
/// spells the server `http://` (a scheme-less `server_uri` makes it try
/// TLS).
async fn tonic_xds_channel(addrs: &[SocketAddr]) -> Result<tonic_xds::XdsChannelGrpc, String> {
    let ads = shared_ads(addrs).await?;
    let bootstrap = tonic_xds::BootstrapConfig::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"http://{ads}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"bench-tonic-xds"}}}}"#
    ))
    .map_err(|e| e.to_string())?;
    let target = tonic_xds::XdsUri::parse("xds:///echo.bench").map_err(|e| e.to_string())?;
    tonic_xds::XdsChannelBuilder::new(
        tonic_xds::XdsChannelConfig::new(target).with_bootstrap(bootstrap),
    )
    .build_grpc_channel()
    .map_err(|e| e.to_string())
}

/// As [`control_plane`], with `service` (YAML lines indented for the
/// service, e.g. an `outlierDetection` block) added to the service.
async fn control_plane_with(
    addrs: &[SocketAddr],
    service: &str,
) -> Result<tether::xds::Bootstrap, String> {
    let ads = serve_control(addrs, service).await?;
    tether::xds::Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{ads}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"bench"}}}}"#
    ))
    .map_err(|e| e.to_string())
}

/// Serves the bench's tether-control file (one service over `addrs`, with
/// `service` lines added) in-process; the ADS address.
async fn serve_control(addrs: &[SocketAddr], service: &str) -> Result<SocketAddr, String> {
    let endpoints: String = addrs
        .iter()
        .map(|a| format!("      - address: \"{a}\"\n"))
        .collect();
    let yaml = format!(
        "virtualhosts:\n  - name: echo.bench\n    routes:\n      - services:\n          - name: echo\n\
         services:\n  - name: echo\n    protocol: h2c\n{service}    endpoints:\n{endpoints}"
    );
    let model = tether_control::Config::parse(&yaml).map_err(|e| e.to_string())?;
    let plane = tether_control::ControlPlane::new(tether_control::translate(&model));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let ads = listener.local_addr().map_err(|e| e.to_string())?;
    // Serves until the runtime shuts down.
    tokio::spawn(async move { plane.serve(listener, std::future::pending()).await });
    Ok(ads)
}

/// The TLS rows' stage: an mTLS backend (the same Echo service), the
/// certificates the tests' CA issued, written where an xDS bootstrap's
/// `file_watcher` reads them. One per process.
struct TlsStage {
    /// The mTLS backend's address.
    addr: SocketAddr,
    /// The backend itself, in the process that started it (the callgrind
    /// child uses its parent's: only the client is counted).
    _backend: Option<GrpcBackend>,
    dir: std::path::PathBuf,
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

const TLS_SAN: &str = "spiffe://tether.bench/sa/echo";

/// Set for the callgrind child: `ADDR DIR` of its parent's TLS stage.
const TLS_STAGE_ENV: &str = "TETHER_BENCH_TLS_STAGE";

/// The parent's TLS stage, from `ADDR DIR` (the certificates are files in
/// DIR).
fn shared_tls_stage(shared: &str) -> Result<TlsStage, String> {
    let (addr, dir) = shared
        .split_once(' ')
        .ok_or_else(|| format!("{TLS_STAGE_ENV}={shared:?}: expected ADDR DIR"))?;
    let dir = std::path::PathBuf::from(dir);
    let read = |n: &str| std::fs::read_to_string(dir.join(n)).map_err(|e| format!("{n}: {e}"));
    Ok(TlsStage {
        addr: addr.parse().map_err(|e| format!("{addr:?}: {e}"))?,
        _backend: None,
        ca_pem: read("ca.pem")?,
        client_cert_pem: read("client.pem")?,
        client_key_pem: read("client.key")?,
        dir,
    })
}

async fn tls_stage() -> Result<&'static TlsStage, String> {
    static STAGE: tokio::sync::OnceCell<Result<TlsStage, String>> =
        tokio::sync::OnceCell::const_new();
    STAGE
        .get_or_init(|| async {
            use tether_testkit::tls::{server_config, Ca};
            if let Ok(shared) = std::env::var(TLS_STAGE_ENV) {
                return shared_tls_stage(&shared);
            }
            let servers = Ca::new("bench server CA");
            let clients = Ca::new("bench client CA");
            let client = clients.issue(&["spiffe://tether.bench/sa/client"]);
            let backend = GrpcBackend::start_tls(
                "tls",
                server_config(&servers.issue(&[TLS_SAN, "127.0.0.1"]), Some(&clients)),
            )
            .await;
            let dir = std::env::temp_dir().join(format!("tether-bench-tls-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            std::fs::write(dir.join("ca.pem"), servers.pem()).map_err(|e| e.to_string())?;
            client.write(&dir, "client");
            Ok(TlsStage {
                addr: backend.addr(),
                _backend: Some(backend),
                dir,
                ca_pem: servers.pem(),
                client_cert_pem: client.cert_pem.clone(),
                client_key_pem: client.key_pem.clone(),
            })
        })
        .await
        .as_ref()
        .map_err(Clone::clone)
}

/// xDS mTLS (gRFC A29) to the TLS stage's backend: tether-control's `tls`
/// naming the bootstrap's `file_watcher` instances.
async fn control_plane_mtls(t: &TlsStage) -> Result<tether::xds::Bootstrap, String> {
    let ads = serve_control(
        &[t.addr],
        &format!(
            "    tls:\n      caInstance: roots\n      identityInstance: identity\n      subjectAltNames:\n        - exact: \"{TLS_SAN}\"\n"
        ),
    )
    .await?;
    let file = |n: &str| t.dir.join(n).display().to_string();
    tether::xds::Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{ads}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"bench-mtls"}},
            "certificate_providers":{{
              "roots":{{"plugin_name":"file_watcher","config":{{"ca_certificate_file":"{}"}}}},
              "identity":{{"plugin_name":"file_watcher","config":{{"certificate_file":"{}","private_key_file":"{}"}}}}}}}}"#,
        file("ca.pem"),
        file("client.pem"),
        file("client.key")
    ))
    .map_err(|e| e.to_string())
}

async fn client(kind: Kind, addrs: &[SocketAddr]) -> Result<Client, String> {
    let endpoint = |a: &SocketAddr| {
        tonic::transport::Endpoint::from_shared(format!("http://{a}")).map_err(|e| e.to_string())
    };
    let all = |policy, session| -> Result<StaticConfig, String> {
        Ok(StaticConfig::new(
            "echo",
            addrs.iter().map(|a| StaticEndpoint::new(*a)).collect(),
        )
        .with_policy(policy)
        .with_session(session))
    };
    let client = match kind {
        Kind::Plain => Client::Tonic(EchoClient::new(
            endpoint(&addrs[0])?
                .connect()
                .await
                .map_err(|e| e.to_string())?,
        )),
        Kind::Balance => Client::Tonic(EchoClient::new(tonic::transport::Channel::balance_list(
            addrs
                .iter()
                .map(endpoint)
                .collect::<Result<Vec<_>, _>>()?
                .into_iter(),
        ))),
        Kind::TetherStatic => Client::Tether(EchoClient::new(
            tether::Channel::from_static(all(EndpointPolicy::RoundRobin, None)?)
                .map_err(|e| e.to_string())?,
        )),
        Kind::TetherDns => {
            // One DNS server for the process, answering the bench's name
            // with the first endpoint's address.
            static DNS: tokio::sync::OnceCell<tether_testkit::dns::DnsServer> =
                tokio::sync::OnceCell::const_new();
            let dns = DNS
                .get_or_init(|| async { tether_testkit::dns::DnsServer::start().await })
                .await;
            dns.set("echo.bench.tether.test", &[addrs[0].ip()]);
            Client::Tether(EchoClient::new(
                tether::Channel::builder()
                    .connect(&format!(
                        "dns://{}/echo.bench.tether.test:{}",
                        dns.addr(),
                        addrs[0].port()
                    ))
                    .map_err(|e| e.to_string())?,
            ))
        }
        Kind::TetherOne => Client::Tether(EchoClient::new(
            tether::Channel::from_static({
                let mut one = all(EndpointPolicy::RoundRobin, None)?;
                one.endpoints = vec![StaticEndpoint::new(addrs[0])];
                one
            })
            .map_err(|e| e.to_string())?,
        )),
        Kind::TetherOtel => Client::Tether(EchoClient::new(
            tether::Channel::builder()
                .telemetry(bench_telemetry())
                .connect_static({
                    let mut one = all(EndpointPolicy::RoundRobin, None)?;
                    one.endpoints = vec![StaticEndpoint::new(addrs[0])];
                    one
                })
                .map_err(|e| e.to_string())?,
        )),
        Kind::TetherSession | Kind::TetherSessionLayer | Kind::TetherSessions => {
            let cookie =
                CookieSpec::new("grpc-session", "/", Duration::from_secs(3600), Vec::new())
                    .map_err(|e| e.to_string())?;
            let channel =
                tether::Channel::from_static(all(EndpointPolicy::RoundRobin, Some(cookie))?)
                    .map_err(|e| e.to_string())?;
            match kind {
                Kind::TetherSessions => Client::Sessions(channel),
                Kind::TetherSessionLayer => Client::Session(EchoClient::new(
                    CookieJarLayer::new(CookieJar::new()).layer(channel),
                )),
                _ => Client::Tether(EchoClient::new(channel.with_cookie_jar(CookieJar::new()))),
            }
        }
        Kind::TetherLeastRequest => Client::Tether(EchoClient::new(
            tether::Channel::from_static(all(
                EndpointPolicy::LeastRequest { choice_count: 2 },
                None,
            )?)
            .map_err(|e| e.to_string())?,
        )),
        Kind::TetherWeightedRoundRobin => Client::Tether(EchoClient::new(
            tether::Channel::from_static(all(
                EndpointPolicy::WeightedRoundRobin(wrr_settings()),
                None,
            )?)
            .map_err(|e| e.to_string())?,
        )),
        Kind::TetherXds => Client::Tether(EchoClient::new(
            tether::Channel::builder()
                .bootstrap(control_plane(addrs).await?)
                .connect("xds:///echo.bench")
                .map_err(|e| e.to_string())?,
        )),
        Kind::TetherXdsLrs => Client::Tether(EchoClient::new(
            tether::Channel::builder()
                .bootstrap(bootstrap_for(shared_ads_lrs(addrs).await?)?)
                .connect("xds:///echo.bench")
                .map_err(|e| e.to_string())?,
        )),
        // The same ADS server as `xds`.
        Kind::TonicXds => Client::TonicXds(EchoClient::new(tonic_xds_channel(addrs).await?)),
        // Its own control plane: the same file plus outlier detection, both
        // algorithms on, so every call is counted and the timer runs each
        // second (nothing fails, so nothing is ejected).
        Kind::TetherOutlierDetection => Client::Tether(EchoClient::new(
            tether::Channel::builder()
                .bootstrap(
                    control_plane_with(
                        addrs,
                        "    outlierDetection:\n      interval: 1s\n      successRate: {}\n      failurePercentage: {}\n",
                    )
                    .await?,
                )
                .connect("xds:///echo.bench")
                .map_err(|e| e.to_string())?,
        )),
        Kind::TonicTls => {
            let t = tls_stage().await?;
            use tonic::transport::{Certificate, ClientTlsConfig, Identity};
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&t.ca_pem))
                .identity(Identity::from_pem(&t.client_cert_pem, &t.client_key_pem))
                .domain_name("127.0.0.1");
            Client::Tonic(EchoClient::new(
                tonic::transport::Endpoint::from_shared(format!("https://{}", t.addr))
                    .map_err(|e| e.to_string())?
                    .tls_config(tls)
                    .map_err(|e| e.to_string())?
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?,
            ))
        }
        Kind::TetherTls => {
            let t = tls_stage().await?;
            let tls = tether::credentials::TlsConfig::from_ca_pem(&t.ca_pem)
                .and_then(|c| c.with_identity_pem(&t.client_cert_pem, &t.client_key_pem))
                .map_err(|e| e.to_string())?;
            Client::Tether(EchoClient::new(
                tether::Channel::builder()
                    .tls(tls)
                    .connect_static(StaticConfig::new(
                        "echo",
                        vec![StaticEndpoint::new(t.addr)],
                    ))
                    .map_err(|e| e.to_string())?,
            ))
        }
        Kind::TetherXdsMtls => {
            let t = tls_stage().await?;
            Client::Tether(EchoClient::new(
                tether::Channel::builder()
                    .bootstrap(control_plane_mtls(t).await?)
                    .connect("xds:///echo.bench")
                    .map_err(|e| e.to_string())?,
            ))
        }
    };
    // Connected to every endpoint it balances over before any measurement.
    // (A session's calls all go to one.)
    let want = match kind {
        Kind::Plain
        | Kind::TetherOne
        | Kind::TetherDns
        | Kind::TetherSession
        | Kind::TetherSessionLayer
        | Kind::TetherOtel
        | Kind::TonicTls
        | Kind::TetherTls
        | Kind::TetherXdsMtls => 1,
        _ => addrs.len(),
    };
    let mut c = client.clone();
    let mut seen = HashSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < want {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{}: only {seen:?} answered", kind.label()));
        }
        match tokio::time::timeout_at(deadline, c.echo()).await {
            Ok(Ok(backend)) => {
                seen.insert(backend);
            }
            Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(_) => return Err(format!("{}: a call hung", kind.label())),
        }
    }
    Ok(client)
}

/// `concurrency` tasks calling in a loop: warm-up, then the measured window.
async fn load(client: &Client, concurrency: usize, warmup: Duration, window: Duration) -> Run {
    let start = tokio::time::Instant::now();
    let measured_from = start + warmup;
    let end = measured_from + window;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let mut c = client.for_task();
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(4096);
            let mut errors = 0;
            // Bounded by the deadline; the count is a second bound.
            for _ in 0..100_000_000u64 {
                let t0 = tokio::time::Instant::now();
                if t0 >= end {
                    break;
                }
                let ok = c.echo().await.is_ok();
                if t0 >= measured_from {
                    if ok {
                        latencies.push(t0.elapsed().as_nanos() as u64);
                    } else {
                        errors += 1;
                    }
                }
            }
            (latencies, errors)
        });
    }
    let mut all = Vec::new();
    let mut errors = 0;
    // A hung call counts as errors of its whole task.
    let joined = tokio::time::timeout_at(end + Duration::from_secs(10), async {
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok((l, e)) => {
                    all.extend(l);
                    errors += e;
                }
                Err(_) => errors += 1,
            }
        }
    })
    .await;
    if joined.is_err() {
        errors += tasks.len();
        tasks.abort_all();
    }
    all.sort_unstable();
    let pct = |q: f64| -> Duration {
        if all.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((q * all.len() as f64).ceil() as usize).clamp(1, all.len());
        Duration::from_nanos(all[rank - 1])
    };
    Run {
        calls_per_s: all.len() as f64 / window.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        errors,
    }
}

fn throughput_section(rt: &Runtime, addrs: &[SocketAddr], args: &Args) -> Result<Vec<Row>, String> {
    println!(
        "\n== 4. Unary Echo calls: {} rounds x {:?} per configuration after {:?} of warm-up",
        args.rounds, args.duration, args.warmup
    );
    rt.block_on(async {
        let mut clients = BTreeMap::new();
        for &kind in &args.kinds {
            clients.insert(kind, client(kind, addrs).await?);
        }
        let mut runs: BTreeMap<(usize, Kind), Vec<Run>> = BTreeMap::new();
        // Rounds interleave the configurations, so drift in the machine's
        // load spreads over all of them.
        for round in 1..=args.rounds {
            for concurrency in [1, 64] {
                for &kind in &args.kinds {
                    let run = load(&clients[&kind], concurrency, args.warmup, args.duration).await;
                    println!(
                        "round {round}  c={concurrency:<3} {:<58} {:>9.0} calls/s  p50 {:>9}  p99 {:>9}{}",
                        kind.label(),
                        run.calls_per_s,
                        fmt_dur(run.p50),
                        fmt_dur(run.p99),
                        if run.errors > 0 {
                            format!("  {} errors", run.errors)
                        } else {
                            String::new()
                        }
                    );
                    runs.entry((concurrency, kind)).or_default().push(run);
                }
            }
        }
        Ok(runs
            .into_iter()
            .map(|((concurrency, kind), rs)| Row {
                kind,
                concurrency,
                calls_per_s: median(rs.iter().map(|r| r.calls_per_s).collect()),
                p50: Duration::from_secs_f64(median(
                    rs.iter().map(|r| r.p50.as_secs_f64()).collect(),
                )),
                p99: Duration::from_secs_f64(median(
                    rs.iter().map(|r| r.p99.as_secs_f64()).collect(),
                )),
                errors: rs.iter().map(|r| r.errors).sum(),
                runs: rs,
            })
            .collect())
    })
}

// --- Summary -----------------------------------------------------------------

#[derive(Default)]
struct Summary {
    eds: Option<EdsFigures>,
    picks: Option<PickFigures>,
    rows: Vec<Row>,
    /// Instructions per call, by configuration.
    instructions: Vec<(Kind, f64)>,
    updates: Option<UpdateFigures>,
    rotation: Option<RotationFigures>,
    failures: Vec<String>,
}

impl Summary {
    fn fail(&mut self, why: String) {
        eprintln!("FAILED: {why}");
        self.failures.push(why);
    }

    fn print(&mut self, args: &Args) {
        println!("\n== Summary (medians of the rounds; ratios: the median of each round's)");
        if !self.rows.is_empty() {
            println!(
                "\n| configuration | concurrency | calls/s | p50 | p99 | calls/s × plain | p99 × plain | like for like: against | calls/s × | p99 × |"
            );
            println!("|---|---|---|---|---|---|---|---|---|---|");
            let mut misses = Vec::new();
            let mut goals = Vec::new();
            // The median of the rounds' ratios: each round runs every
            // configuration back to back, so a ratio within a round leaves
            // out the machine's drift between rounds.
            let ratios = |r: &Row, base: Option<Kind>| -> (f64, f64) {
                self.rows
                    .iter()
                    .find(|p| Some(p.kind) == base && p.concurrency == r.concurrency)
                    .map_or((f64::NAN, f64::NAN), |p| {
                        let pairs = || r.runs.iter().zip(&p.runs);
                        (
                            median(
                                pairs()
                                    .map(|(a, b)| a.calls_per_s / b.calls_per_s)
                                    .collect(),
                            ),
                            median(
                                pairs()
                                    .map(|(a, b)| a.p99.as_secs_f64() / b.p99.as_secs_f64())
                                    .collect(),
                            ),
                        )
                    })
            };
            for r in &self.rows {
                let (tput, p99) = ratios(r, Some(Kind::Plain));
                let like = r.kind.like_for_like(r.concurrency);
                let (like_tput, like_p99) = ratios(r, like);
                println!(
                    "| {} | {} | {:.0} | {} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} |",
                    r.kind.label(),
                    r.concurrency,
                    r.calls_per_s,
                    fmt_dur(r.p50),
                    fmt_dur(r.p99),
                    tput,
                    p99,
                    like.map_or("", Kind::key),
                    like_tput,
                    like_p99
                );
                if r.errors > 0 || r.calls_per_s == 0.0 {
                    misses.push(format!(
                        "{} c={}: {} failed calls, {:.0} calls/s",
                        r.kind.label(),
                        r.concurrency,
                        r.errors,
                        r.calls_per_s
                    ));
                }
                if !r.kind.is_tether() {
                    continue;
                }
                let who = format!("{}, c={}", r.kind.label(), r.concurrency);
                if r.kind == Kind::TetherXds {
                    // Against the Rust peer over the same resources.
                    let (vs_tput, vs_p99) = ratios(r, Some(Kind::TonicXds));
                    if !vs_tput.is_nan() {
                        goals.push(goal_line(
                            &format!(
                                "  tether::Channel over xDS ÷ tonic-xds, c={}: calls/s, goal ≥ 1.0",
                                r.concurrency
                            ),
                            vs_tput >= 1.0,
                            &format!("{vs_tput:.2} (p99 ÷ tonic-xds's: {vs_p99:.2})"),
                        ));
                    }
                }
                if matches!(
                    r.kind,
                    Kind::TetherSession | Kind::TetherSessionLayer | Kind::TetherSessions
                ) {
                    // The sessions goal: against the same channel without them.
                    goals.push(goal_line(
                        &format!(
                            "  {who}: calls/s ≥ 0.95 × without sessions ({})",
                            like.map_or("", Kind::key)
                        ),
                        like_tput >= 0.95,
                        &format!("{like_tput:.2}"),
                    ));
                    continue;
                }
                if matches!(
                    r.kind,
                    Kind::TetherLeastRequest
                        | Kind::TetherWeightedRoundRobin
                        | Kind::TetherOutlierDetection
                ) {
                    // Its goal: against round robin over the same endpoints
                    // (for outlier detection: the same xDS config without it).
                    goals.push(goal_line(
                        &format!(
                            "  {who}: calls/s ≥ 0.95 × round robin ({})",
                            like.map_or("", Kind::key)
                        ),
                        like_tput >= 0.95,
                        &format!("{like_tput:.2}"),
                    ));
                    continue;
                }
                // TLS rows are held to tonic with the same TLS, not to
                // plaintext tonic.
                let tls = matches!(r.kind, Kind::TetherTls | Kind::TetherXdsMtls);
                if !tls {
                    goals.push(goal_line(
                        &format!("  {who}: calls/s ≥ 0.95 × plain tonic, 1 endpoint"),
                        tput >= 0.95,
                        &format!("{tput:.2}"),
                    ));
                    goals.push(goal_line(
                        &format!("  {who}: p99 ≤ 1.10 × plain tonic, 1 endpoint"),
                        p99 <= 1.10,
                        &format!("{p99:.2}"),
                    ));
                }
                if like != Some(Kind::Plain) {
                    let base = like.map_or("", Kind::key);
                    goals.push(goal_line(
                        &format!(
                            "  {who}: calls/s ≥ 0.95 × tonic over the same endpoints ({base})"
                        ),
                        like_tput >= 0.95,
                        &format!("{like_tput:.2}"),
                    ));
                    goals.push(goal_line(
                        &format!("  {who}: p99 ≤ 1.10 × tonic over the same endpoints ({base})"),
                        like_p99 <= 1.10,
                        &format!("{like_p99:.2}"),
                    ));
                }
            }
            println!("\ngoals:");
            for g in goals {
                println!("{g}");
            }
            for m in misses {
                self.fail(m);
            }
        }
        if let Some(p) = &self.picks {
            println!("\npicks (median of batches; divan's figures above):");
            println!(
                "{}",
                goal_line(
                    "  pick through cluster_manager → cluster_impl → priority → weighted_target → round_robin, goal ≤ 100 ns",
                    p.chain_ns <= 100.0,
                    &format!("{:.0} ns", p.chain_ns)
                )
            );
            println!(
                "{}",
                goal_line(
                    "  a session's pick through the same chain (xds_override_host finds its READY endpoint), goal ≤ 100 ns",
                    p.override_ns <= 100.0,
                    &format!("{:.0} ns", p.override_ns)
                )
            );
            println!(
                "{}",
                goal_line(
                    "  ring_hash over 1,000 hosts, header hash included, goal ≤ 100 ns",
                    p.ring_ns <= 100.0,
                    &format!("{:.0} ns", p.ring_ns)
                )
            );
            println!(
                "{}",
                goal_line(
                    "  pick through the same chain with least_request (2 draws; its counter up, and down as the call ends), goal ≤ 100 ns",
                    p.least_request_chain_ns <= 100.0,
                    &format!("{:.0} ns", p.least_request_chain_ns)
                )
            );
            println!(
                "{}",
                goal_line(
                    "  pick through the same chain with outlier_detection above it (the endpoint's call counter added; counted as the call ends), goal ≤ 100 ns",
                    p.outlier_detection_chain_ns <= 100.0,
                    &format!("{:.0} ns", p.outlier_detection_chain_ns)
                )
            );
            println!(
                "{}",
                goal_line(
                    "  pick through the same chain with weighted_round_robin (the endpoint's weight added as the call's tracker), goal ≤ 100 ns",
                    p.weighted_round_robin_chain_ns <= 100.0,
                    &format!("{:.0} ns", p.weighted_round_robin_chain_ns)
                )
            );
            println!("  bare round_robin pick: {:.0} ns", p.bare_ns);
            println!(
                "  bare least_request pick: {:.0} ns",
                p.least_request_bare_ns
            );
        }
        if let Some(u) = &self.updates {
            println!("\nupdate cost (median of the rounds):");
            println!(
                "{}",
                goal_line(
                    &format!(
                        "  {} clusters x {} endpoints, one endpoint's health changed: the update, goal ≤ 1 ms",
                        UPDATE_CLUSTERS, UPDATE_CLUSTER_SIZE
                    ),
                    median_dur(&u.one_health) <= Duration::from_millis(1),
                    &fmt_dur(median_dur(&u.one_health))
                )
            );
            println!(
                "{}",
                goal_line(
                    &format!(
                        "  one cluster of {} endpoints in {} localities: the first update, goal ≤ 500 ms",
                        BIG_CLUSTER, BIG_LOCALITIES
                    ),
                    median_dur(&u.big) <= Duration::from_millis(500),
                    &fmt_dur(median_dur(&u.big))
                )
            );
            println!(
                "{}",
                goal_line(
                    "  its memory once every subchannel's attempt was refused (RSS growth), goal ≤ 300 MB",
                    u.big_rss <= 300 << 20,
                    &format!("{:.0} MB", mb(u.big_rss))
                )
            );
            let mut p99s: Vec<Duration> = u.big_picks.iter().map(|w| w.p99).collect();
            p99s.sort();
            let worst = u.big_picks.iter().map(|w| w.max).max().unwrap_or_default();
            let not_complete: usize = u.big_picks.iter().map(|w| w.not_complete).sum();
            let picks: usize = u.big_picks.iter().map(|w| w.picks).sum();
            println!(
                "{}",
                goal_line(
                    "  meanwhile, picks of another cluster on another thread: all complete (p99, worst)",
                    not_complete == 0 && picks > 0,
                    &format!(
                        "{picks} picks, p99 {}, worst {}",
                        fmt_dur(median_dur(&p99s)),
                        fmt_dur(worst)
                    )
                )
            );
            let per_event: Vec<Duration> = u
                .events
                .iter()
                .map(|(n, d)| *d / (*n).max(1) as u32)
                .collect();
            println!(
                "  {} clusters: a subchannel's state change reaches the cluster holding it: {} each",
                UPDATE_CLUSTERS,
                fmt_dur(median_dur(&per_event))
            );
        }
        if let Some(r) = &self.rotation {
            println!(
                "\nclient certificate rotation under load (xDS mTLS, {ROTATION_TASKS} tasks):"
            );
            println!(
                "{}",
                goal_line(
                    "  calls failed across the rotation, goal 0",
                    r.failed == 0 && r.presented_after.is_some(),
                    &format!(
                        "{} of {}; calls/s after ÷ before {:.2}; new certificate presented after {}",
                        r.failed,
                        r.calls,
                        r.after / r.before.max(1.0),
                        r.presented_after.map_or("never".to_owned(), fmt_dur)
                    )
                )
            );
        }
        if !self.instructions.is_empty() {
            let per = |k: Kind| {
                self.instructions
                    .iter()
                    .find(|(kind, _)| *kind == k)
                    .map(|(_, n)| *n)
            };
            println!("\ninstructions per unary call (callgrind, the client process alone):");
            println!("| configuration | instructions/call | × plain tonic |");
            println!("|---|---|---|");
            let plain = per(Kind::Plain).unwrap_or(f64::NAN);
            for (kind, n) in &self.instructions {
                println!("| {} | {n:.0} | {:.3} |", kind.label(), n / plain);
            }
            if let (Some(one), Some(session)) = (per(Kind::TetherOne), per(Kind::TetherSession)) {
                println!(
                    "{}",
                    goal_line(
                        "  tether::Channel over one endpoint ≤ 1.05 × plain tonic's instructions",
                        one <= 1.05 * plain,
                        &format!("{:.3}", one / plain)
                    )
                );
                println!(
                    "{}",
                    goal_line(
                        "  with sessions (one jar in the handle) ≤ 1.05 × the same channel without",
                        session <= 1.05 * one,
                        &format!("{:.3}", session / one)
                    )
                );
                if let Some(layer) = per(Kind::TetherSessionLayer) {
                    println!(
                        "  with sessions, the jar as a layer ÷ the same channel without: {:.3}",
                        layer / one
                    );
                }
            }
            if let (Some(one), Some(otel)) = (per(Kind::TetherOne), per(Kind::TetherOtel)) {
                println!(
                    "{}",
                    goal_line(
                        "  with gRPC's metrics (A66, OpenTelemetry SDK + Prometheus exporter) ≤ 1.10 × without",
                        otel <= 1.10 * one,
                        &format!("{:.3}", otel / one)
                    )
                );
            }
            if let (Some(xds), Some(lrs)) = (per(Kind::TetherXds), per(Kind::TetherXdsLrs)) {
                println!(
                    "{}",
                    goal_line(
                        "  reporting load (LRS) ≤ 1.02 × the same xDS cluster without, instructions/call",
                        lrs <= 1.02 * xds,
                        &format!("{:.3}", lrs / xds)
                    )
                );
            }
            if let (Some(xds), Some(tonic_xds)) = (per(Kind::TetherXds), per(Kind::TonicXds)) {
                println!(
                    "{}",
                    goal_line(
                        "  tether::Channel over xDS ÷ tonic-xds, instructions/call, goal ≤ 1.0",
                        xds <= tonic_xds,
                        &format!("{:.3}", xds / tonic_xds)
                    )
                );
            }
            if let Some(tonic_tls) = per(Kind::TonicTls) {
                for kind in [Kind::TetherTls, Kind::TetherXdsMtls] {
                    if let Some(n) = per(kind) {
                        println!("  {} ÷ tonic with TLS: {:.3}", kind.label(), n / tonic_tls);
                    }
                }
            }
        }
        if let Some(e) = &self.eds {
            let first = median_dur(&e.first);
            println!(
                "\nEDS, {} endpoints ({} rounds):",
                e.endpoints,
                e.first.len()
            );
            println!(
                "{}",
                goal_line(
                    "  first update (every subchannel created), goal ≤ 50 ms",
                    first <= Duration::from_millis(50),
                    &fmt_dur(first)
                )
            );
            println!(
                "{}",
                goal_line(
                    "  RSS growth with all subchannels alive (first round), goal ≤ 50 MB",
                    e.rss_alive <= 50 << 20,
                    &format!(
                        "{:.1} MB ({:.1} MB right after the update)",
                        mb(e.rss_alive),
                        mb(e.rss_after_update)
                    )
                )
            );
            println!(
                "  next update, 1% of endpoints replaced: {}",
                fmt_dur(median_dur(&e.next))
            );
            println!(
                "  until every attempt was refused: {}; the tree absorbing their {} state changes: {}",
                fmt_dur(median_dur(&e.settled)),
                2 * e.endpoints,
                fmt_dur(median_dur(&e.absorb))
            );
            let gets: Vec<String> = e
                .pool_get
                .iter()
                .map(|(n, d)| format!("{n}: {}", fmt_dur(*d)))
                .collect();
            println!(
                "  SubchannelPool::get alone, new addresses: {}",
                gets.join(", ")
            );
        }
        if args.quick {
            println!("\n(quick mode: figures from a fraction of a second prove the wiring, not the speed)");
        }
        for f in &self.failures {
            println!("FAILED: {f}");
        }
    }
}

fn goal_line(what: &str, met: bool, value: &str) -> String {
    format!("{what}: {value} {}", if met { "met" } else { "NOT MET" })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn median_dur(v: &[Duration]) -> Duration {
    Duration::from_secs_f64(median(v.iter().map(Duration::as_secs_f64).collect()))
}

fn mb(bytes: i64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1.0 {
        format!("{} ns", d.as_nanos())
    } else if us < 10.0 {
        format!("{us:.1} µs")
    } else if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000_000.0 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.1} s", us / 1e6)
    }
}

/// The configurations whose instructions per call are counted: plain tonic,
/// the channel over the same one endpoint, and the same with a session (its
/// jar in the channel handle, and as a layer).
const COUNTED: [Kind; 5] = [
    Kind::Plain,
    Kind::TetherOne,
    Kind::TetherSession,
    Kind::TetherSessionLayer,
    Kind::TetherOtel,
];

/// gRPC's metrics for the `otel` configuration: the OpenTelemetry SDK with
/// the Prometheus exporter (a pull exporter: what a call costs is the SDK's
/// aggregation, as in a served process between scrapes). One provider for
/// the process, kept for its life.
fn bench_telemetry() -> tether::Telemetry {
    static PROVIDER: OnceLock<opentelemetry_sdk::metrics::SdkMeterProvider> = OnceLock::new();
    let provider = PROVIDER.get_or_init(|| {
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(prometheus::Registry::new())
            .build()
            .expect("the Prometheus exporter");
        opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(exporter)
            .build()
    });
    tether::Telemetry::builder(provider).build()
}

/// The same over xDS: tether::Channel and tonic-xds over the same
/// tether-control resources (the parent's ADS server) and backends.
const COUNTED_XDS: [Kind; 3] = [Kind::TetherXds, Kind::TetherXdsLrs, Kind::TonicXds];

/// The same for the mTLS rows: tonic with its own TLS, the channel with
/// `ChannelBuilder::tls` and with xDS mTLS, all to the TLS stage's backend
/// (in the parent process).
const COUNTED_TLS: [Kind; 3] = [Kind::TonicTls, Kind::TetherTls, Kind::TetherXdsMtls];

/// Child mode, `--count KIND --calls N ADDR...`: `N` sequential calls of
/// configuration KIND to the parent's backends, on a current-thread runtime,
/// so that callgrind counts the client alone.
fn count_calls(args: &[String]) -> Result<(), String> {
    let [kind, flag, calls, addrs @ ..] = args else {
        return Err("usage: --count KIND --calls N ADDR...".into());
    };
    if flag != "--calls" {
        return Err(format!("{flag:?}: expected --calls"));
    }
    let kind = Kind::ALL
        .into_iter()
        .find(|k| k.key() == kind)
        .ok_or_else(|| format!("{kind:?} is not a configuration"))?;
    let calls: usize = calls
        .parse()
        .map_err(|_| format!("--calls {calls:?} is not a count"))?;
    let addrs: Vec<SocketAddr> = addrs
        .iter()
        .map(|a| a.parse().map_err(|e| format!("{a:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut c = client(kind, &addrs).await?;
        for i in 0..calls {
            c.echo()
                .await
                .map_err(|e| format!("call {i} failed: {e}"))?;
        }
        Ok(())
    })
}

/// Total instructions (callgrind's `summary:`) of one child run; `tls`:
/// the TLS stage it shares; `ads`: the ADS server it shares.
fn callgrind_total(
    kind: Kind,
    calls: usize,
    addrs: &[SocketAddr],
    tls: Option<&TlsStage>,
    ads: Option<(&str, SocketAddr)>,
) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::env::temp_dir().join(format!(
        "tether-bench-callgrind-{}-{}-{calls}.out",
        std::process::id(),
        kind.key()
    ));
    let mut command = std::process::Command::new("valgrind");
    if let Some(t) = tls {
        command.env(TLS_STAGE_ENV, format!("{} {}", t.addr, t.dir.display()));
    }
    if let Some((var, a)) = ads {
        command.env(var, a.to_string());
    }
    let status = command
        .args(["--tool=callgrind", "--quiet"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .args(["--count", kind.key(), "--calls", &calls.to_string()])
        .args(addrs.iter().map(ToString::to_string))
        .status()
        .map_err(|e| format!("run valgrind (apt-get install valgrind): {e}"))?;
    let text = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if !status.success() {
        return Err(format!(
            "{}: {calls} calls under callgrind: {status}",
            kind.key()
        ));
    }
    let text = text.map_err(|e| format!("read {}: {e}", out.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no summary line in {}", out.display()))
}

/// Instructions per unary call of each [`COUNTED`], [`COUNTED_XDS`] and
/// [`COUNTED_TLS`] configuration in `--kinds`, from two
/// runs with different call counts (their difference leaves out start-up
/// and connecting), the median of three such pairs; the backends (and the
/// xDS rows' ADS server) stay in this process, so only the client is
/// counted.
fn instructions_section(
    rt: &Runtime,
    addrs: &[SocketAddr],
    args: &Args,
) -> Result<Vec<(Kind, f64)>, String> {
    let (few, many) = if args.quick { (50, 150) } else { (300, 1300) };
    println!(
        "\n== 5. Instructions per unary call under callgrind: ({many} calls − {few} calls) / {}",
        many - few
    );
    let mut rows = Vec::new();
    let kinds = COUNTED
        .into_iter()
        .chain(COUNTED_XDS)
        .chain(COUNTED_TLS)
        .filter(|k| args.kinds.contains(k));
    for kind in kinds {
        let tls = if COUNTED_TLS.contains(&kind) {
            Some(rt.block_on(tls_stage())?)
        } else {
            None
        };
        let ads = match kind {
            Kind::TetherXdsLrs => Some((ADS_LRS_ENV, rt.block_on(shared_ads_lrs(addrs))?)),
            k if COUNTED_XDS.contains(&k) => Some((ADS_ENV, rt.block_on(shared_ads(addrs))?)),
            _ => None,
        };
        // Three pairs, the median kept: how the backend's answers meet
        // the client's polls moves a run by a few hundred instructions.
        let mut pairs = Vec::new();
        for _ in 0..3 {
            let a = callgrind_total(kind, few, addrs, tls, ads)?;
            let b = callgrind_total(kind, many, addrs, tls, ads)?;
            pairs.push(b.saturating_sub(a) as f64 / (many - few) as f64);
        }
        let runs = pairs
            .iter()
            .map(|p| format!("{p:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let per = median(pairs);
        println!(
            "{}: {per:.0} instructions/call (median of {runs})",
            kind.label()
        );
        rows.push((kind, per));
    }
    Ok(rows)
}

/// What the certificate rotation row measured.
struct RotationFigures {
    calls: usize,
    failed: usize,
    first_failure: Option<String>,
    /// Calls/s before the new certificate was written, and after.
    before: f64,
    after: f64,
    /// From writing the new certificate to the first call the backend
    /// answered over a connection presenting it.
    presented_after: Option<Duration>,
    goaways: u64,
}

/// Calling tasks of the rotation row, and its phases.
const ROTATION_TASKS: usize = 64;

/// The cost of a client certificate rotation under load (gRFC A29): 64
/// tasks calling an mTLS backend over xDS mTLS (`file_watcher`, read every
/// 100 ms) that ends each connection after 500 ms (GOAWAY, as servers'
/// `max_connection_age`: new connections are what present a rotated
/// certificate); midway the client certificate files are replaced by a new
/// certificate of the same CA. Goal: no call fails.
fn rotation_section(rt: &Runtime, args: &Args) -> Result<RotationFigures, String> {
    use tether_testkit::tls::{fingerprint, server_config, Ca};
    // Long enough for a connection made after the rotation (connections
    // live 500 ms) to present the new certificate.
    let phase = if args.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(2)
    };
    println!(
        "\n== Rotation: {ROTATION_TASKS} tasks calling over xDS mTLS, the client certificate replaced after {}, \
         {} more of calls; the backend ends each connection after 500 ms",
        fmt_dur(phase),
        fmt_dur(phase)
    );
    rt.block_on(async {
        let servers = Ca::new("rotation server CA");
        let clients = Ca::new("rotation client CA");
        let first = clients.issue(&["spiffe://tether.bench/sa/client"]);
        let second = clients.issue(&["spiffe://tether.bench/sa/client"]);
        let (backend, goaways) = GrpcBackend::start_tls_rotating(
            "rotation",
            server_config(&servers.issue(&[TLS_SAN, "127.0.0.1"]), Some(&clients)),
            Duration::from_millis(500),
        )
        .await;
        let dir = std::env::temp_dir().join(format!("tether-bench-rotation-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("ca.pem"), servers.pem()).map_err(|e| e.to_string())?;
        first.write(&dir, "client");
        let ads = serve_control(
            &[backend.addr()],
            &format!(
                "    tls:\n      caInstance: roots\n      identityInstance: identity\n      subjectAltNames:\n        - exact: \"{TLS_SAN}\"\n"
            ),
        )
        .await?;
        let file = |n: &str| dir.join(n).display().to_string();
        let bootstrap = tether::xds::Bootstrap::from_json(&format!(
            r#"{{"xds_servers":[{{"server_uri":"{ads}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"bench-rotation"}},
                "certificate_providers":{{
                  "roots":{{"plugin_name":"file_watcher","config":{{"ca_certificate_file":"{}","refresh_interval":"0.1s"}}}},
                  "identity":{{"plugin_name":"file_watcher","config":{{"certificate_file":"{}","private_key_file":"{}","refresh_interval":"0.1s"}}}}}}}}"#,
            file("ca.pem"),
            file("client.pem"),
            file("client.key")
        ))
        .map_err(|e| e.to_string())?;
        let channel = tether::Channel::builder()
            .bootstrap(bootstrap)
            .connect("xds:///echo.bench")
            .map_err(|e| e.to_string())?;
        let mut warm = EchoClient::new(channel.clone());
        tokio::time::timeout(WAIT, warm.echo(EchoRequest::default()))
            .await
            .map_err(|_| "no answer over mTLS within 30 s")?
            .map_err(|e| format!("the first call: {e}"))?;
        let (old_print, new_print) = (fingerprint(&first.cert_der), fingerprint(&second.cert_der));
        let started = Instant::now();
        let rotate_at = started + phase;
        let end = rotate_at + phase;
        let mut tasks = Vec::new();
        for _ in 0..ROTATION_TASKS {
            let mut client = EchoClient::new(channel.clone());
            tasks.push(tokio::spawn(async move {
                // (when it ended, ok, the certificate the backend saw)
                let mut seen: Vec<(Instant, Result<String, String>)> = Vec::new();
                while Instant::now() < end && seen.len() < 1_000_000 {
                    let result = match client.echo(EchoRequest::default()).await {
                        Ok(reply) => Ok(reply
                            .metadata()
                            .get("x-client-cert")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned()),
                        Err(status) => Err(status.to_string()),
                    };
                    seen.push((Instant::now(), result));
                }
                seen
            }));
        }
        tokio::time::sleep_until(rotate_at.into()).await;
        // Written beside, then renamed over: a reader never sees half a file.
        for (name, text) in [("client.key", &second.key_pem), ("client.pem", &second.cert_pem)] {
            let tmp = dir.join(format!("{name}.new"));
            std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
            std::fs::rename(&tmp, dir.join(name)).map_err(|e| e.to_string())?;
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.map_err(|e| e.to_string())?);
        }
        let _ = std::fs::remove_dir_all(&dir);
        let failed: Vec<&String> = all.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
        let unknown = all
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok())
            .find(|c| **c != old_print && **c != new_print);
        if let Some(c) = unknown {
            return Err(format!("the backend saw a client certificate {c:?}, neither the first nor the second"));
        }
        let presented_after = all
            .iter()
            .filter(|(_, r)| r.as_ref().is_ok_and(|c| *c == new_print))
            .map(|(t, _)| t.saturating_duration_since(rotate_at))
            .min();
        let rate = |from: Instant, to: Instant| {
            all.iter().filter(|(t, _)| *t >= from && *t < to).count() as f64
                / to.duration_since(from).as_secs_f64()
        };
        let f = RotationFigures {
            calls: all.len(),
            failed: failed.len(),
            first_failure: failed.first().map(|s| s.to_string()),
            before: rate(started, rotate_at),
            after: rate(rotate_at, end),
            presented_after,
            goaways: goaways.load(Ordering::Relaxed),
        };
        println!(
            "{} calls, {} failed{}; {:.0} calls/s before the rotation, {:.0} after; the new certificate presented {} after it was written; {} GOAWAYs",
            f.calls,
            f.failed,
            f.first_failure.as_deref().map_or(String::new(), |e| format!(" (the first: {e})")),
            f.before,
            f.after,
            f.presented_after.map_or("never".to_owned(), fmt_dur),
            f.goaways
        );
        Ok(f)
    })
}

/// Clusters in the many-clusters update row, and endpoints in each.
const UPDATE_CLUSTERS: usize = 1_000;
const UPDATE_CLUSTER_SIZE: usize = 100;
/// Endpoints and localities of the one big cluster.
const BIG_CLUSTER: usize = 100_000;
const BIG_LOCALITIES: usize = 1_000;

/// What the update-cost rows measured.
struct UpdateFigures {
    /// Per round: one endpoint's health changed in one of the clusters.
    one_health: Vec<Duration>,
    /// Per round: the first update of the big cluster.
    big: Vec<Duration>,
    /// First round: RSS growth once the big cluster's attempts settled.
    big_rss: i64,
    /// Per round: picks of another cluster while the big cluster's first
    /// update was applied.
    big_picks: Vec<PickWindow>,
    /// Per round: the many clusters' subchannel state changes (how many,
    /// and how long the tree took for all of them).
    events: Vec<(usize, Duration)>,
}

/// Picks made on another thread during a window, as calls do: each loads
/// the published picker and picks.
#[derive(Clone, Debug, Default)]
struct PickWindow {
    picks: usize,
    /// Picks that did not complete (a call would have waited or failed).
    not_complete: usize,
    /// The first of those.
    first_not_complete: Option<String>,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

/// A thread picking one cluster from the published picker, timing the
/// picks made while `measuring` is set.
struct PickProbe {
    published: Arc<arc_swap::ArcSwap<SharedPicker>>,
    measuring: Arc<std::sync::atomic::AtomicBool>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(Vec<u32>, usize, Option<String>)>,
}

/// At most this many picks are timed in one window (memory bound).
const PROBE_PICKS: usize = 20_000_000;

impl PickProbe {
    fn start(picker: SharedPicker, cluster: &str) -> PickProbe {
        use std::sync::atomic::AtomicBool;
        let published = Arc::new(arc_swap::ArcSwap::from_pointee(picker));
        let measuring = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let cluster: Arc<str> = Arc::from(cluster);
        let thread = {
            let (published, measuring, stop) = (published.clone(), measuring.clone(), stop.clone());
            std::thread::spawn(move || {
                let attributes = CallAttributes {
                    cluster,
                    ..Default::default()
                };
                let headers = http::HeaderMap::new();
                let mut times = Vec::new();
                let mut not_complete = 0;
                let mut first = None;
                while !stop.load(Ordering::Relaxed) {
                    let on = measuring.load(Ordering::Relaxed);
                    let started = Instant::now();
                    let picker = published.load();
                    let result = picker.pick(&PickArgs {
                        path: ECHO_PATH,
                        headers: &headers,
                        attributes: &attributes,
                    });
                    // The call ends at once (circuit breaking counts
                    // calls in flight).
                    if let PickResult::Complete(pick) = &result {
                        pick.trackers.finished(true);
                    }
                    let took = started.elapsed();
                    if on && times.len() < PROBE_PICKS {
                        times.push(took.as_nanos().min(u32::MAX as u128) as u32);
                        if !matches!(result, PickResult::Complete(_)) {
                            not_complete += 1;
                            first.get_or_insert_with(|| format!("{result:?}"));
                        }
                    }
                    black_box(result);
                }
                (times, not_complete, first)
            })
        };
        PickProbe {
            published,
            measuring,
            stop,
            thread,
        }
    }

    fn publish(&self, picker: SharedPicker) {
        self.published.store(Arc::new(picker));
    }

    fn measure(&self, on: bool) {
        self.measuring.store(on, Ordering::SeqCst);
    }

    fn finish(self) -> Result<PickWindow, String> {
        self.stop.store(true, Ordering::SeqCst);
        let (mut times, not_complete, first_not_complete) =
            self.thread.join().map_err(|_| "the pick thread panicked")?;
        times.sort_unstable();
        let at = |q: f64| {
            times
                .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
                .map_or(Duration::ZERO, |n| Duration::from_nanos(u64::from(*n)))
        };
        Ok(PickWindow {
            picks: times.len(),
            not_complete,
            first_not_complete,
            p50: at(0.50),
            p99: at(0.99),
            max: times
                .last()
                .map_or(Duration::ZERO, |n| Duration::from_nanos(u64::from(*n))),
        })
    }
}

/// Feeds the pool's queued events to `root` until `ready` holds, bounded.
fn feed_until(
    p: &mut CountingPool,
    root: &mut ClusterManager,
    next_timer: &mut u64,
    ready: impl Fn(&ClusterManager) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + WAIT;
    while !ready(root) {
        match p.events.try_recv() {
            Ok(e) => {
                let mut ctx = Ctx::new(&p.pool, &p.events_tx, next_timer, "updates-bench");
                root.event(&mut ctx, &e);
            }
            Err(_) if Instant::now() > deadline => {
                return Err(format!("not ready within {WAIT:?}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    Ok(())
}

/// Whether `root` picks `cluster` to a subchannel (the call ends at once).
fn picks_cluster(root: &ClusterManager, cluster: &str) -> bool {
    let attributes = CallAttributes {
        cluster: Arc::from(cluster),
        ..Default::default()
    };
    let headers = http::HeaderMap::new();
    match root.picker().pick(&PickArgs {
        path: ECHO_PATH,
        headers: &headers,
        attributes: &attributes,
    }) {
        PickResult::Complete(pick) => {
            pick.trackers.finished(true);
            true
        }
        _ => false,
    }
}

/// `n` addresses on 127.1.0.0/16 and up, port 1 (nothing listens: each
/// connection attempt is refused at once), numbered from `from`.
fn loopback_addresses(from: usize, n: usize) -> Vec<(SocketAddr, usize)> {
    (from..from + n)
        .map(|i| {
            let ip = [
                127,
                1 + (i / 62_500) as u8,
                ((i / 250) % 250) as u8,
                (i % 250 + 1) as u8,
            ];
            (SocketAddr::from((ip, 1)), i)
        })
        .collect()
}

/// The update cost rows: an update's work follows what changed.
fn updates_section(rt: &Runtime, args: &Args) -> Result<UpdateFigures, String> {
    println!(
        "\n== 2. Update cost: {UPDATE_CLUSTERS} clusters x {UPDATE_CLUSTER_SIZE} endpoints with one \
         endpoint's health changed; one cluster of {BIG_CLUSTER} endpoints in {BIG_LOCALITIES} localities"
    );
    let mut options = SubchannelOptions::default();
    options.backoff.initial = Duration::from_secs(60);
    let _entered = rt.enter();
    let mut f = UpdateFigures {
        one_health: Vec::new(),
        big: Vec::new(),
        big_rss: 0,
        big_picks: Vec::new(),
        events: Vec::new(),
    };
    // Calls of another cluster go on meanwhile: one READY endpoint, a real
    // server, picked from another thread.
    let other_backend = rt.block_on(GrpcBackend::start("other"));
    let other = leaf_configs(
        "other",
        &[(other_backend.addr(), 0)],
        1,
        EndpointPolicy::RoundRobin,
    )?;
    // The big cluster first: its memory is read before the heap grew.
    let big = leaf_configs(
        "big",
        &loopback_addresses(0, BIG_CLUSTER),
        BIG_LOCALITIES,
        EndpointPolicy::RoundRobin,
    )?;
    let mut both = big.clone();
    both.extend(other.clone());
    for round in 0..args.eds_rounds {
        let mut p = CountingPool::new(options.clone());
        let mut next_timer = 0;
        let mut root = ClusterManager::new();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "updates-bench");
            root.update(
                &mut ctx,
                LbConfig::ClusterManager(cluster_manager::Config {
                    clusters: other.clone(),
                }),
            );
        }
        feed_until(&mut p, &mut root, &mut next_timer, |r| {
            picks_cluster(r, "other")
        })?;
        let probe = PickProbe::start(root.picker(), "other");
        let config = LbConfig::ClusterManager(cluster_manager::Config {
            clusters: both.clone(),
        });
        let rss0 = rss();
        probe.measure(true);
        let started = Instant::now();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "updates-bench");
            root.update(&mut ctx, config);
        }
        probe.publish(root.picker());
        let took = started.elapsed();
        probe.measure(false);
        let picks = probe.finish()?;
        p.wait_refused(BIG_CLUSTER)?;
        let grown = rss() - rss0;
        println!(
            "round {}: one cluster of {BIG_CLUSTER} endpoints: first update {} (RSS +{:.0} MB once every attempt was refused); \
             meanwhile {} picks of another cluster, {} not completed{}, p50 {}, p99 {}, max {}",
            round + 1,
            fmt_dur(took),
            mb(grown),
            picks.picks,
            picks.not_complete,
            picks
                .first_not_complete
                .as_deref()
                .map_or(String::new(), |f| format!(" (the first: {f})")),
            fmt_dur(picks.p50),
            fmt_dur(picks.p99),
            fmt_dur(picks.max)
        );
        if round == 0 {
            f.big_rss = grown;
        }
        f.big.push(took);
        f.big_picks.push(picks);
        drop(root);
        drop(p);
    }
    drop(other_backend);
    // The many clusters, as the resolver hands them over: an unchanged
    // cluster keeps its resources (the same allocations).
    let mut clusters = BTreeMap::new();
    for c in 0..UPDATE_CLUSTERS {
        let endpoints = loopback_addresses(c * UPDATE_CLUSTER_SIZE, UPDATE_CLUSTER_SIZE);
        clusters.extend(leaf_configs(
            &format!("cluster-{c}"),
            &endpoints,
            10,
            EndpointPolicy::RoundRobin,
        )?);
    }
    let changed = {
        let mut next = clusters.clone();
        let key: Arc<str> = Arc::from(format!("cluster-{}", UPDATE_CLUSTERS / 2).as_str());
        let Some(LbConfig::Cds(cds::Config::Leaf(leaf))) = next.get_mut(&key) else {
            return Err(format!("no leaf {key}"));
        };
        let mut endpoints = (*leaf.endpoints).clone();
        let first = endpoints
            .priorities
            .first_mut()
            .and_then(|p| p.localities.first_mut())
            .and_then(|l| l.endpoints.first_mut())
            .ok_or("a cluster without endpoints")?;
        first.health = tether::lb::HealthStatus::Draining;
        leaf.endpoints = Arc::new(endpoints);
        next
    };
    for round in 0..args.eds_rounds {
        let mut p = CountingPool::new(options.clone());
        let mut next_timer = 0;
        let mut root = ClusterManager::new();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "updates-bench");
            root.update(
                &mut ctx,
                LbConfig::ClusterManager(cluster_manager::Config {
                    clusters: clusters.clone(),
                }),
            );
        }
        // Every subchannel tried and refused: their state changes, each
        // to the one cluster holding it.
        p.wait_refused(UPDATE_CLUSTERS * UPDATE_CLUSTER_SIZE)?;
        // As the LB task does: batches of up to 256 events, the picker
        // published after each.
        let mut events = 0;
        let started = Instant::now();
        loop {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "updates-bench");
            let mut batch = 0;
            while batch < 256 {
                let Ok(e) = p.events.try_recv() else {
                    break;
                };
                root.event(&mut ctx, &e);
                batch += 1;
            }
            if batch == 0 {
                break;
            }
            events += batch;
            black_box((root.state(), root.picker()));
        }
        let delivered = started.elapsed();
        f.events.push((events, delivered));
        // The same clusters again: nothing to do but compare.
        let same = LbConfig::ClusterManager(cluster_manager::Config {
            clusters: clusters.clone(),
        });
        let started = Instant::now();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "updates-bench");
            root.update(&mut ctx, same);
        }
        let unchanged = started.elapsed();
        let config = LbConfig::ClusterManager(cluster_manager::Config {
            clusters: changed.clone(),
        });
        let started = Instant::now();
        {
            let mut ctx = Ctx::new(&p.pool, &p.events_tx, &mut next_timer, "updates-bench");
            root.update(&mut ctx, config);
        }
        let took = started.elapsed();
        println!(
            "round {}: {UPDATE_CLUSTERS} x {UPDATE_CLUSTER_SIZE}, one endpoint DRAINING: {} (the same clusters again: {}); \
             the {} subchannel state changes before it: {} ({} each)",
            round + 1,
            fmt_dur(took),
            fmt_dur(unchanged),
            events,
            fmt_dur(delivered),
            fmt_dur(delivered / events.max(1) as u32)
        );
        f.one_health.push(took);
        drop(root);
        drop(p);
    }
    drop(clusters);
    drop(changed);
    Ok(f)
}
