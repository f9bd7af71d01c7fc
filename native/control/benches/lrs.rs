//! tether-control taking load reports (LRS, gRFC A27) from 1,000 clients
//! every second, and its admin listener answering meanwhile.
//!
//! The file: 10 services with `loadReporting: { interval: 1s }`, each of 6
//! endpoints in 2 localities (`us/a`, `us/b`), one of them DRAINING. Every
//! client is one HTTP/2 connection carrying two streams, as a proxyless
//! gRPC client's channel to its xDS server does:
//!
//! - ADS: CDS (every cluster, to learn each one's EDS service), then EDS
//!   for those services, each response ACKed; so the client holds every
//!   service's ClusterLoadAssignment, which the drain verdicts count;
//! - LRS: a first request with its node, tether-control's answer (clusters,
//!   interval, `report_endpoint_granularity`), then every interval a
//!   report per cluster, per locality and (when asked) per endpoint, with
//!   the interval it covers. The clients start spread over one interval,
//!   so their reports are too.
//!
//! What they report makes each DRAINING endpoint's verdict known in
//! advance: `svc-0`'s is used by every client, with as many requests as
//! the report's number (1 for a client's first report, 2 for its second,
//! ...), so `GET /drain` tells how many reports tether-control has taken in
//! from each client; `svc-1` to `svc-4`'s only by the first client (a
//! pinned session); the others' by nobody. The bench panics when `/drain`
//! does not list every DRAINING endpoint with every connected client, or
//! its verdicts and per-client states are not those.
//!
//! tether-control runs in this process as a library (the ADS and LRS port
//! and the admin listener, both on 127.0.0.1, and the file's watcher), the
//! clients in a child process (this program again, with `--clients-child`),
//! so that this process's CPU time (getrusage) is tether-control's alone.
//! The steady reporting is measured in two halves, from one interval after
//! the last client started:
//!
//! - reports only: tether-control's CPU time over the wall time (100% is
//!   one core), its resident memory (VmRSS: before the clients, the most
//!   during, and after they left), and the reports it took in per second
//!   (from `/drain`, as above, read between the halves);
//! - the same while `GET /status` and `GET /drain` are asked in turn, each
//!   on a new connection, one at a time, evenly over the half (every 50 ms
//!   by default; when one takes longer, the next follows at once and the
//!   half lasts longer, as shown): their latency, connect to last byte, as
//!   median, p99 and max against the goal of 10 ms, and tether-control's
//!   CPU time per request (its CPU time beyond the first half's rate,
//!   over the requests). They are asked from a thread of their own whose
//!   CPU time (getrusage of the thread) is taken out of tether-control's.
//!
//! The clients' process's CPU time (from /proc) is shown too.
//!
//! `cargo bench -p tether-control --bench lrs [-- --clients N --seconds S
//! --probes P]` (defaults: 1,000 clients, 20 s of steady reporting, 100
//! requests of each page) prints one table. The soft limit on open files
//! is raised to the hard one; clients that cannot set up are counted and
//! shown, and the checks then expect the ones that did. Every wait is
//! bounded.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::envoy::service::load_stats::v3::load_reporting_service_client::LoadReportingServiceClient;
use envoy_types::pb::envoy::service::load_stats::v3::{LoadStatsRequest, LoadStatsResponse};
use prost::Message;
use tether_control::{Reload, Reloader};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

const SERVICES: usize = 10;
/// Endpoints of a service: 3 in us/a, 3 in us/b, the last of us/a DRAINING.
const ENDPOINTS: u8 = 6;
const DRAINING: u8 = 3;
const PORT: u16 = 9000;
const INTERVAL: Duration = Duration::from_secs(1);
/// Services whose DRAINING endpoint only the first client uses.
const PINNED_BY_FIRST: std::ops::RangeInclusive<usize> = 1..=4;
/// The latency goal of the admin pages.
const GOAL: Duration = Duration::from_millis(10);
const BOUND: Duration = Duration::from_secs(30);
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn number(flag: &str, default: usize) -> usize {
    arg(flag).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn service(j: usize) -> String {
    format!("svc-{j}")
}

fn node(i: usize) -> String {
    format!("lrs-client-{i:04}")
}

fn address(j: usize, k: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, j as u8, k], PORT))
}

fn yaml() -> String {
    let mut y = String::from("services:\n");
    for j in 0..SERVICES {
        y.push_str(&format!(
            "  - name: {}\n    loadReporting: {{ interval: 1s }}\n    endpoints:\n",
            service(j)
        ));
        for k in 1..=ENDPOINTS {
            let locality = if k <= ENDPOINTS / 2 { "us/a" } else { "us/b" };
            y.push_str(&format!(
                "      - address: {}\n        locality: {locality}\n",
                address(j, k)
            ));
            if k == DRAINING {
                y.push_str("        health: DRAINING\n");
            }
        }
    }
    y
}

/// Requests client `i`'s report number `seq` (from 1) shows to service
/// `j`'s DRAINING endpoint.
fn draining_requests(j: usize, i: usize, seq: u64) -> u64 {
    if j == 0 {
        seq
    } else if PINNED_BY_FIRST.contains(&j) && i == 0 {
        1
    } else {
        0
    }
}

/// Raises the soft limit on open files to the hard one; returns it.
fn raise_nofile() -> libc::rlim_t {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes an rlimit into the pointer it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the rlimit it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    limit.rlim_cur
}

/// CPU time (user + system) of this process, or of the calling thread.
fn cpu(who: libc::c_int) -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a rusage into the pointer it is given.
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    // SAFETY: initialised by getrusage (and zeroed before).
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU time (user + system) of process `pid`, from /proc.
fn cpu_of(pid: u32) -> Duration {
    // SAFETY: sysconf only reads a setting.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime is the 12th
    // of them, stime the 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<f64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let t = fields.get(11).copied().unwrap_or(0.0) + fields.get(12).copied().unwrap_or(0.0);
    Duration::from_secs_f64(t / ticks)
}

/// VmRSS of process `pid` (`self` for this one), in MiB.
fn rss_mib(pid: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    raise_nofile();
    if std::env::args().any(|a| a == "--clients-child") {
        clients_child();
    } else {
        control_plane();
    }
}

// ---------------------------------------------------------------------------
// The clients' process.

/// One service's endpoints as the client got them: per locality, each
/// endpoint's address and whether it is DRAINING.
type Assignment = Vec<(Option<core::Locality>, Vec<(core::Address, bool)>)>;

struct Held {
    /// Cluster name -> its EDS service.
    services: BTreeMap<String, String>,
    /// EDS service -> its endpoints.
    assignments: BTreeMap<String, Assignment>,
}

fn ack(node: Option<core::Node>, r: &DiscoveryResponse, names: Vec<String>) -> DiscoveryRequest {
    DiscoveryRequest {
        node,
        version_info: r.version_info.clone(),
        resource_names: names,
        type_url: r.type_url.clone(),
        response_nonce: r.nonce.clone(),
        ..Default::default()
    }
}

fn assignment(cla: &epb::ClusterLoadAssignment) -> Assignment {
    cla.endpoints
        .iter()
        .map(|group| {
            let endpoints = group
                .lb_endpoints
                .iter()
                .filter_map(|e| {
                    let Some(epb::lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier
                    else {
                        return None;
                    };
                    let draining = e.health_status == core::HealthStatus::Draining as i32;
                    Some((ep.address.clone()?, draining))
                })
                .collect();
            (group.locality.clone(), endpoints)
        })
        .collect()
}

/// Client `i`'s report number `seq` of what `asked` asks for, covering
/// `covered`.
fn report(
    i: usize,
    seq: u64,
    held: &Held,
    asked: &LoadStatsResponse,
    covered: Duration,
) -> LoadStatsRequest {
    let mut cluster_stats = Vec::new();
    for cluster in &asked.clusters {
        let Some(svc) = held.services.get(cluster) else {
            continue;
        };
        let Some(assignment) = held.assignments.get(svc) else {
            continue;
        };
        let j: usize = svc
            .strip_prefix("svc-")
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX);
        let upstream_locality_stats = assignment
            .iter()
            .map(|(locality, endpoints)| {
                let per_endpoint: Vec<epb::UpstreamEndpointStats> = endpoints
                    .iter()
                    .enumerate()
                    .map(|(k, (a, draining))| {
                        let issued = if *draining {
                            draining_requests(j, i, seq)
                        } else {
                            // Some traffic, varying from client to client.
                            5 + (i as u64 + seq + k as u64) % 7
                        };
                        epb::UpstreamEndpointStats {
                            address: Some(a.clone()),
                            total_successful_requests: issued,
                            total_issued_requests: issued,
                            ..Default::default()
                        }
                    })
                    .collect();
                let issued = per_endpoint.iter().map(|e| e.total_issued_requests).sum();
                epb::UpstreamLocalityStats {
                    locality: locality.clone(),
                    total_successful_requests: issued,
                    total_issued_requests: issued,
                    upstream_endpoint_stats: if asked.report_endpoint_granularity {
                        per_endpoint
                    } else {
                        Vec::new()
                    },
                    ..Default::default()
                }
            })
            .collect();
        cluster_stats.push(epb::ClusterStats {
            cluster_name: cluster.clone(),
            cluster_service_name: svc.clone(),
            upstream_locality_stats,
            load_report_interval: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: covered.as_secs() as i64,
                nanos: covered.subsec_nanos() as i32,
            }),
            ..Default::default()
        });
    }
    LoadStatsRequest {
        node: None,
        cluster_stats,
    }
}

fn interval_of(asked: &LoadStatsResponse) -> Duration {
    asked
        .load_reporting_interval
        .as_ref()
        .map(|d| Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
        .filter(|d| !d.is_zero())
        .unwrap_or(INTERVAL)
}

/// Client `i`: connects at `start`, holds every service's endpoints, then
/// reports until `stop`. Says on `ready` when it holds them and has
/// tether-control's LRS answer (or why not).
async fn client(
    i: usize,
    server: SocketAddr,
    start: tokio::time::Instant,
    ready: mpsc::Sender<(usize, Result<(), String>)>,
    mut stop: watch::Receiver<bool>,
    sent: Arc<AtomicU64>,
) {
    tokio::time::sleep_until(start).await;
    let me = core::Node {
        id: node(i),
        user_agent_name: "tether-bench".into(),
        ..Default::default()
    };
    let setup = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{server}"))
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| format!("connect: {e}"))?;
        // ADS: every cluster, then their endpoints.
        let (ads_tx, ads_rx) = mpsc::channel::<DiscoveryRequest>(4);
        let _ = ads_tx
            .send(DiscoveryRequest {
                node: Some(me.clone()),
                type_url: CDS.into(),
                ..Default::default()
            })
            .await;
        let mut ads = AggregatedDiscoveryServiceClient::new(channel.clone())
            .stream_aggregated_resources(ReceiverStream::new(ads_rx))
            .await
            .map_err(|e| format!("ADS: {e}"))?
            .into_inner();
        let cds = ads
            .message()
            .await
            .map_err(|e| format!("ADS: {e}"))?
            .ok_or("ADS ended before CDS")?;
        let mut services = BTreeMap::new();
        for any in &cds.resources {
            let c = cpb::Cluster::decode(any.value.as_slice()).map_err(|e| e.to_string())?;
            if let Some(eds) = c.eds_cluster_config {
                let svc = if eds.service_name.is_empty() {
                    c.name.clone()
                } else {
                    eds.service_name
                };
                services.insert(c.name, svc);
            }
        }
        let mut names: Vec<String> = services.values().cloned().collect();
        names.sort();
        names.dedup();
        let _ = ads_tx.send(ack(None, &cds, Vec::new())).await;
        let _ = ads_tx
            .send(DiscoveryRequest {
                type_url: EDS.into(),
                resource_names: names.clone(),
                ..Default::default()
            })
            .await;
        let mut assignments = BTreeMap::new();
        while assignments.len() < names.len() {
            let r = ads
                .message()
                .await
                .map_err(|e| format!("ADS: {e}"))?
                .ok_or("ADS ended before EDS")?;
            let names = if r.type_url == EDS {
                for any in &r.resources {
                    let cla = epb::ClusterLoadAssignment::decode(any.value.as_slice())
                        .map_err(|e| e.to_string())?;
                    assignments.insert(cla.cluster_name.clone(), assignment(&cla));
                }
                names.clone()
            } else {
                Vec::new()
            };
            let _ = ads_tx.send(ack(None, &r, names)).await;
        }
        // LRS: the node, then tether-control's answer.
        let (lrs_tx, lrs_rx) = mpsc::channel::<LoadStatsRequest>(4);
        let _ = lrs_tx
            .send(LoadStatsRequest {
                node: Some(me.clone()),
                cluster_stats: Vec::new(),
            })
            .await;
        let mut lrs = LoadReportingServiceClient::new(channel)
            .stream_load_stats(ReceiverStream::new(lrs_rx))
            .await
            .map_err(|e| format!("LRS: {e}"))?
            .into_inner();
        let asked = lrs
            .message()
            .await
            .map_err(|e| format!("LRS: {e}"))?
            .ok_or("LRS ended before its answer")?;
        let held = Held {
            services,
            assignments,
        };
        Ok::<_, String>((ads_tx, ads, lrs_tx, lrs, asked, held, names))
    };
    let (ads_tx, mut ads, lrs_tx, mut lrs, mut asked, held, names) =
        match tokio::time::timeout(BOUND, setup).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let _ = ready.send((i, Err(e))).await;
                return;
            }
            Err(_) => {
                let _ = ready.send((i, Err("set-up timed out".into()))).await;
                return;
            }
        };
    let _ = ready.send((i, Ok(()))).await;
    drop(ready);
    let mut every = interval_of(&asked);
    let mut last = tokio::time::Instant::now();
    let mut next = last + every;
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            () = tokio::time::sleep_until(next) => {
                seq += 1;
                let now = tokio::time::Instant::now();
                let r = report(i, seq, &held, &asked, now - last);
                last = now;
                next += every;
                if lrs_tx.send(r).await.is_err() {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
            answer = lrs.message() => match answer {
                Ok(Some(a)) => {
                    every = interval_of(&a);
                    asked = a;
                }
                _ => break,
            },
            pushed = ads.message() => match pushed {
                Ok(Some(r)) => {
                    let names = if r.type_url == EDS { names.clone() } else { Vec::new() };
                    let _ = ads_tx.send(ack(None, &r, names)).await;
                }
                _ => break,
            },
        }
    }
}

/// The clients' process: `--server ADDR --clients N`. Prints `ready OK
/// FAILED FIRST` once every client holds its clusters and has its LRS
/// answer (or failed; FIRST: 1 when the first client did not), then
/// reports until its standard input closes, and prints `done SENT`.
fn clients_child() {
    let server: SocketAddr = arg("--server")
        .and_then(|s| s.parse().ok())
        .expect("--server ADDR");
    let clients = number("--clients", 1000).max(1);
    let limit = Duration::from_secs(number("--limit", 300) as u64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    // The parent closes our standard input to stop us.
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::stdin().lock().read_line(&mut line).unwrap_or(0) > 0 {
            line.clear();
        }
        let _ = closed_tx.send(());
    });
    rt.block_on(async move {
        let (ready_tx, mut ready_rx) = mpsc::channel(clients);
        let (stop_tx, stop_rx) = watch::channel(false);
        let sent = Arc::new(AtomicU64::new(0));
        let t0 = tokio::time::Instant::now();
        let mut tasks = Vec::with_capacity(clients);
        for i in 0..clients {
            let start = t0 + INTERVAL.mul_f64(i as f64 / clients as f64);
            tasks.push(tokio::spawn(client(
                i,
                server,
                start,
                ready_tx.clone(),
                stop_rx.clone(),
                sent.clone(),
            )));
        }
        drop(ready_tx);
        let (mut ok, mut failed, mut first) = (0, 0, 0);
        let collected = tokio::time::timeout(BOUND * 2, async {
            while let Some((i, r)) = ready_rx.recv().await {
                match r {
                    Ok(()) => {
                        ok += 1;
                        first |= u8::from(i == 0);
                    }
                    Err(e) => {
                        if failed == 0 {
                            eprintln!("first client that failed: {e}");
                        }
                        failed += 1;
                    }
                }
            }
        })
        .await;
        if collected.is_err() {
            eprintln!("clients still setting up after {:?}", BOUND * 2);
        }
        println!("ready {ok} {} {first}", clients - ok);
        let _ = std::io::stdout().flush();
        let _ = tokio::time::timeout(limit, closed_rx).await;
        let _ = stop_tx.send(true);
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        println!("done {}", sent.load(Ordering::Relaxed));
        let _ = std::io::stdout().flush();
    });
    // Connections and tasks left are the process's end's business.
    std::process::exit(0);
}

// ---------------------------------------------------------------------------
// tether-control's process.

/// `/drain` now, parsed.
async fn drain(admin: SocketAddr) -> serde_json::Value {
    let page = tether_testkit::client::get(admin, "/drain", &[])
        .await
        .unwrap_or_else(|e| panic!("GET /drain: {e}"));
    assert_eq!(page.status, 200, "GET /drain: {}", page.body);
    page.json()
}

/// Reports taken in so far: the sum of `svc-0`'s DRAINING endpoint's
/// requests over its clients (each the number of its client's latest
/// report).
fn reports_taken(drain: &serde_json::Value) -> u64 {
    let want = address(0, DRAINING).to_string();
    drain["endpoints"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["address"] == want.as_str()))
        .and_then(|e| e["clients"].as_array())
        .map_or(0, |c| c.iter().filter_map(|c| c["requests"].as_u64()).sum())
}

/// What is wrong with `/drain` (`d`) with `clients` connected, the first
/// one among them or not, if anything.
fn check(d: &serde_json::Value, clients: usize, first_connected: bool) -> Result<(), String> {
    if d["clients_connected"].as_u64() != Some(clients as u64) {
        return Err(format!(
            "clients_connected is {}, not {clients}",
            d["clients_connected"]
        ));
    }
    let endpoints = d["endpoints"].as_array().ok_or("no endpoints list")?;
    if endpoints.len() != SERVICES {
        return Err(format!(
            "{} DRAINING endpoints listed, not {SERVICES}",
            endpoints.len()
        ));
    }
    for j in 0..SERVICES {
        let at = address(j, DRAINING).to_string();
        let e = endpoints
            .iter()
            .find(|e| e["address"] == at.as_str() && e["cluster"] == service(j).as_str())
            .ok_or_else(|| format!("{} {at} is not listed", service(j)))?;
        let list = e["clients"].as_array().ok_or("no clients list")?;
        if list.len() != clients {
            return Err(format!(
                "{} {at}: {} clients listed, not {clients}",
                service(j),
                list.len()
            ));
        }
        let mut busy = 0;
        for c in list {
            let name = c["node"].as_str().unwrap_or_default();
            let i: usize = name
                .strip_prefix("lrs-client-")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("{} {at}: unknown client {name:?}", service(j)))?;
            let requests = c["requests"].as_u64().unwrap_or(0);
            // svc-0's figure is a report's number: any figure from 1 on.
            let want = if j == 0 {
                requests.max(1)
            } else {
                draining_requests(j, i, 1)
            };
            let state = if want > 0 { "busy" } else { "idle" };
            if c["state"] != state || requests != want || c["granularity"] != "endpoint" {
                return Err(format!(
                    "{} {at}: client {name} is {c}, not {state} with {want} requests per endpoint",
                    service(j)
                ));
            }
            busy += usize::from(want > 0);
        }
        let verdict = if busy > 0 { "busy" } else { "idle" };
        if e["verdict"] != verdict {
            return Err(format!(
                "{} {at}: verdict {}, not {verdict} ({busy} clients busy)",
                service(j),
                e["verdict"]
            ));
        }
        let want_busy = match j {
            0 => clients,
            j if PINNED_BY_FIRST.contains(&j) => usize::from(first_connected),
            _ => 0,
        };
        if busy != want_busy {
            return Err(format!(
                "{} {at}: {busy} clients busy, not {want_busy}",
                service(j)
            ));
        }
    }
    Ok(())
}

/// The latencies of `GET /status` and `GET /drain`, `probes` of each,
/// asked in turn evenly over `span` from a thread of its own; and that
/// thread's CPU time.
fn probe(admin: SocketAddr, span: Duration, probes: usize) -> std::thread::JoinHandle<Probed> {
    std::thread::spawn(move || {
        let cpu0 = cpu(libc::RUSAGE_THREAD);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let mut probed = rt.block_on(async move {
            let mut out = Probed::default();
            let every = span.div_f64((2 * probes) as f64);
            let t0 = tokio::time::Instant::now();
            for n in 0..2 * probes {
                tokio::time::sleep_until(t0 + every * n as u32).await;
                let page = if n % 2 == 0 { "/status" } else { "/drain" };
                let asked = Instant::now();
                let got = tether_testkit::client::get(admin, page, &[]).await;
                let took = asked.elapsed();
                match got {
                    Ok(r) if r.status == 200 => {
                        if n % 2 == 0 {
                            out.status.push(took);
                            out.status_bytes = r.body.len();
                        } else {
                            out.drain.push(took);
                            out.drain_bytes = r.body.len();
                        }
                    }
                    Ok(r) => panic!("GET {page}: {} {}", r.status, r.body),
                    Err(e) => panic!("GET {page}: {e}"),
                }
            }
            out
        });
        drop(rt);
        probed.cpu = cpu(libc::RUSAGE_THREAD).saturating_sub(cpu0);
        probed
    })
}

#[derive(Default)]
struct Probed {
    status: Vec<Duration>,
    drain: Vec<Duration>,
    status_bytes: usize,
    drain_bytes: usize,
    cpu: Duration,
}

/// Median, p99 and max.
fn spread(v: &mut [Duration]) -> (Duration, Duration, Duration) {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    (at(0.5), at(0.99), v[v.len() - 1])
}

/// A phase's figures.
struct Phase {
    wall: Duration,
    cpu: Duration,
    clients_cpu: Duration,
    reports: u64,
    rss_max: f64,
}

impl Phase {
    fn share(&self, cpu: Duration) -> f64 {
        cpu.as_secs_f64() / self.wall.as_secs_f64() * 100.0
    }
}

/// Runs a phase of `span`: `/drain` is read before (already in hand:
/// `before`) and after; the CPU times are taken between the two reads,
/// the resident memory sampled every 100 ms.
async fn phase(
    admin: SocketAddr,
    child: u32,
    span: Duration,
    before: &serde_json::Value,
    during: impl std::future::Future<Output = Duration>,
) -> (Phase, serde_json::Value) {
    let (cpu0, child0, t0) = (cpu(libc::RUSAGE_SELF), cpu_of(child), Instant::now());
    let sampling = async {
        let mut max = rss_mib("self");
        let end = tokio::time::Instant::now() + span;
        while tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(100)).await;
            max = max.max(rss_mib("self"));
        }
        max
    };
    let (rss_max, not_ours) = tokio::join!(sampling, during);
    let (cpu1, child1, wall) = (cpu(libc::RUSAGE_SELF), cpu_of(child), t0.elapsed());
    let after = drain(admin).await;
    let phase = Phase {
        wall,
        cpu: (cpu1 - cpu0).saturating_sub(not_ours),
        clients_cpu: child1.saturating_sub(child0),
        reports: reports_taken(&after).saturating_sub(reports_taken(before)),
        rss_max,
    };
    (phase, after)
}

fn control_plane() {
    let clients = number("--clients", 1000).max(1);
    let seconds = number("--seconds", 20).max(2) as u64;
    let probes = number("--probes", 100).max(1);
    let nofile = raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let dir = std::env::temp_dir().join(format!("tether-bench-lrs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a work folder");
        let path: PathBuf = dir.join("tether.yaml");
        std::fs::write(&path, yaml()).expect("the file");
        let p = path.clone();
        let (plane, reloader) = tokio::task::spawn_blocking(move || Reloader::start(&p))
            .await
            .expect("the start task")
            .unwrap_or_else(|e| panic!("tether-control refused the file: {e}"));
        let dns = reloader.dns_status();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let served = plane.clone();
        tokio::spawn(async move { served.serve(listener, std::future::pending()).await });
        let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let admin = admin_listener.local_addr().expect("its address");
        tokio::spawn(
            tether_control::admin::Admin::new(plane.clone(), Some(dns))
                .serve(admin_listener, std::future::pending()),
        );
        // The file is polled as tether-control's binary does by default.
        tokio::spawn(reloader.run(Duration::from_millis(250), |r| {
            if let Reload::Rejected(e) = r {
                eprintln!("rejected: {e}");
            }
        }));
        let rss_before = rss_mib("self");

        let limit = 120 + 4 * seconds;
        let mut child =
            tokio::process::Command::new(std::env::current_exe().expect("this program"))
                .args(["--clients-child", "--server", &addr.to_string()])
                .args([
                    "--clients",
                    &clients.to_string(),
                    "--limit",
                    &limit.to_string(),
                ])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("the clients' process");
        let pid = child.id().expect("its pid");
        let stdin = child.stdin.take();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("its output")).lines();
        let started = Instant::now();
        let ready = tokio::time::timeout(BOUND * 3, lines.next_line())
            .await
            .expect("the clients set up within 90 s")
            .expect("the clients' output")
            .expect("the clients' ready line");
        let set_up = started.elapsed();
        let counts: Vec<usize> = ready
            .split_whitespace()
            .skip(1)
            .filter_map(|n| n.parse().ok())
            .collect();
        assert_eq!(counts.len(), 3, "the clients' ready line: {ready:?}");
        let (connected, failed, first_connected) = (counts[0], counts[1], counts[2] == 1);
        assert!(connected > 0, "no client could set up: {ready}");
        // One interval and a bit: every client has reported once.
        tokio::time::sleep(INTERVAL * 2).await;

        let half = Duration::from_secs(seconds / 2);
        let start = drain(admin).await;
        let (quiet, middle) = phase(admin, pid, half, &start, async { Duration::ZERO }).await;
        let mut probed = Probed::default();
        let (asked, end) = phase(admin, pid, half, &middle, async {
            let handle = probe(admin, half, probes);
            let done = tokio::task::spawn_blocking(move || handle.join())
                .await
                .expect("the probe's join")
                .unwrap_or_else(|_| panic!("the admin requests failed"));
            let cpu = done.cpu;
            probed = done;
            cpu
        })
        .await;
        let verdicts = check(&end, connected, first_connected);

        drop(stdin);
        let done = tokio::time::timeout(BOUND, lines.next_line())
            .await
            .ok()
            .and_then(|l| l.ok().flatten())
            .unwrap_or_default();
        let sent: u64 = done
            .strip_prefix("done ")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let _ = tokio::time::timeout(BOUND, child.wait()).await;
        drop(child);
        tokio::time::sleep(INTERVAL * 2).await;
        let rss_after = rss_mib("self");
        let left = plane.drain_status().clients_connected;

        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        let requests = probed.status.len() + probed.drain.len();
        let per_request = asked
            .cpu
            .saturating_sub(
                quiet
                    .cpu
                    .mul_f64(asked.wall.as_secs_f64() / quiet.wall.as_secs_f64()),
            )
            .div_f64(requests as f64);
        println!();
        println!(
            "tether-control LRS: {connected} clients of {clients}, each one HTTP/2 connection \
             (ADS holding every service's endpoints, LRS reporting every {} s per cluster, \
             locality and endpoint); {SERVICES} services of {ENDPOINTS} endpoints in 2 \
             localities, one DRAINING each; open files limit {nofile}",
            INTERVAL.as_secs(),
        );
        if failed > 0 {
            println!("{failed} clients could not set up (the first error is above)");
        }
        println!(
            "clients set up in {:.1} s (started over {} s); {sent} reports sent",
            set_up.as_secs_f64(),
            INTERVAL.as_secs()
        );
        println!("{:52} {:>13} {:>19}", "", "reports only", "+ admin pages");
        let row = |what: &str, a: String, b: String| println!("{what:52} {a:>13} {b:>19}");
        let secs = |p: &Phase| format!("{:.1} s", p.wall.as_secs_f64());
        row("steady reporting measured", secs(&quiet), secs(&asked));
        let share = |p: &Phase, cpu: Duration| format!("{:.1}%", p.share(cpu));
        row(
            "tether-control CPU (100% = one core; 2 cores)",
            share(&quiet, quiet.cpu),
            share(&asked, asked.cpu),
        );
        let rate = |p: &Phase| format!("{:.0}", p.reports as f64 / p.wall.as_secs_f64());
        row("reports taken in per second", rate(&quiet), rate(&asked));
        row(
            &format!("tether-control memory, most (VmRSS; {rss_before:.1} MiB before)"),
            format!("{:.1} MiB", quiet.rss_max),
            format!("{:.1} MiB", asked.rss_max),
        );
        row(
            "the clients' process CPU (100% = one core)",
            share(&quiet, quiet.clients_cpu),
            share(&asked, asked.clients_cpu),
        );
        row(
            "admin requests, one at a time",
            "-".into(),
            format!("{requests}"),
        );
        row(
            "tether-control CPU per admin request (both pages)",
            "-".into(),
            ms(per_request),
        );
        let page = |name: &str, v: &mut Vec<Duration>, bytes: usize| {
            let (median, p99, max) = spread(v);
            row(
                &format!("GET {name} ({:.1} MB): median / p99", bytes as f64 / 1e6),
                "-".into(),
                format!("{} / {}", ms(median), ms(p99)),
            );
            row(
                &format!("GET {name}: max; p99 within {} ms?", GOAL.as_millis()),
                "-".into(),
                format!("{} {}", ms(max), if p99 <= GOAL { "yes" } else { "NO" }),
            );
        };
        page("/status", &mut probed.status, probed.status_bytes);
        page("/drain", &mut probed.drain, probed.drain_bytes);
        println!(
            "tether-control memory {} s after the clients left: {rss_after:.1} MiB ({left} clients \
             still counted)",
            2 * INTERVAL.as_secs()
        );
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(e) = verdicts {
            panic!("GET /drain is not what the reports say: {e}");
        }
    });
}
