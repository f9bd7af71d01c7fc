//! `tether xds dump`: what the XdsClient holds for one listener, the way
//! operators read Envoy's `/config_dump` or gRPC's CSDS.
//!
//! The dump follows the graph a proxyless channel for `xds:///NAME` follows:
//! Listener → RouteConfiguration (RDS or inline) → the virtual host serving
//! NAME → every cluster its routes name → aggregate clusters down to their
//! leaves → ClusterLoadAssignment. Resources are printed as the client
//! validated them, each with its status (`acked`, `nacked`,
//! `does_not_exist`, `requested`) and the error a watcher sees.

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Map, Value};
use tether_core::http::set_cookie::CookieSpec;
use tokio::sync::broadcast;
use tokio::time::Instant;

use tether_xds::bootstrap::{BootstrapError, ENV_FILE};
use tether_xds::client::{ClientOptions, ResourceState, ResourceStatus, XdsClient};
use tether_xds::graph::{Graph, Resolution};
use tether_xds::resource::cluster::{ClusterResource, Discovery, LbPolicy};
use tether_xds::resource::endpoint::EndpointsResource;
use tether_xds::resource::fault::{
    AbortSource, DelaySource, FaultConfig, Fraction, ABORT_GRPC_STATUS_HEADER, DELAY_HEADER,
};
use tether_xds::resource::listener::{
    FilterConfig, FilterOverride, ListenerResource, RouteSource, SessionOverride, SessionState,
};
use tether_xds::resource::retry::RetryPolicy;
use tether_xds::resource::route::{
    Action, ClusterSpecifier, FilterOverrides, HashSource, HeaderMatch, PathMatcher,
    RouteConfigResource,
};
use tether_xds::{Bootstrap, Resource, ResourceKind};

pub use tether_xds::graph::MAX_AGGREGATE_DEPTH;
/// How long `dump` waits for a complete graph without `--timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Exit code when `--timeout` passed before the graph was complete.
pub const EXIT_INCOMPLETE: i32 = 3;

/// A burst of updates (one response touches many resources) is printed as
/// one dump: wait until the client has been quiet this long...
const SETTLE_QUIET: Duration = Duration::from_millis(25);
/// ...but never longer than this after the first update.
const SETTLE_MAX: Duration = Duration::from_millis(250);

/// xDS subcommands.
#[derive(Debug, Subcommand)]
pub enum XdsCommand {
    /// Follow a listener's resources through tether's XdsClient and print them as it validated
    /// them, each with its CSDS-like status; or, with --csds, ask a running process's CSDS
    /// service. See XDS_DUMP.md.
    Dump(DumpArgs),
}

/// Arguments of `tether xds dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// The gRPC xDS bootstrap file. Default: the file named by GRPC_XDS_BOOTSTRAP, or the JSON in
    /// GRPC_XDS_BOOTSTRAP_CONFIG.
    #[arg(long, value_name = "FILE")]
    bootstrap: Option<PathBuf>,
    /// The listener to start from: the NAME a gRPC client dials as xds:///NAME (it also picks the
    /// virtual host).
    #[arg(long, value_name = "NAME", required_unless_present = "csds")]
    listener: Option<String>,
    /// Instead of following a listener with a client of its own: ask the Client Status Discovery
    /// Service (gRFC A40) of a running process at ADDR (HOST:PORT) what its xDS clients hold.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["listener", "bootstrap", "watch"])]
    csds: Option<String>,
    /// Print the whole dump as one JSON line each time it changes, until interrupted (SIGINT
    /// exits 0).
    #[arg(long)]
    watch: bool,
    /// Without --watch: print the partial graph and exit 3 if it is not complete after SECONDS
    /// (default 30). With --watch: stop watching after SECONDS (exit 0); default never.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    timeout: Option<Duration>,
    /// gRFC A57's does-not-exist timer: a subscribed resource the server has not sent after
    /// SECONDS is reported as does_not_exist. Shorten it for tests.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "15")]
    does_not_exist_timeout: Duration,
}

/// Parses `2`, `0.5` or `1.5s` as a duration.
pub(super) fn seconds(text: &str) -> Result<Duration, String> {
    let number = text.strip_suffix('s').unwrap_or(text);
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1e9).contains(&v) => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!(
            "{text:?} is not a number of seconds between 0 and 1000000000"
        )),
    }
}

/// Runs an xds subcommand: prints its output and returns the exit code.
pub fn run(cmd: XdsCommand) -> i32 {
    match cmd {
        XdsCommand::Dump(a) => dump(a),
    }
}

/// The bootstrap from `--bootstrap FILE`, else from the environment.
pub(super) fn read_bootstrap(path: Option<&Path>) -> Result<Bootstrap, BootstrapError> {
    match path {
        Some(path) => Bootstrap::from_file(path).map_err(|mut e| {
            // The reader names the variable; here the file came from the flag.
            if e.field == ENV_FILE {
                e.field = "--bootstrap".into();
            }
            e
        }),
        None => Bootstrap::from_env(),
    }
}

fn dump(a: DumpArgs) -> i32 {
    if let Some(addr) = &a.csds {
        let Some(runtime) = super::runtime() else {
            return 1;
        };
        return match runtime.block_on(super::csds::fetch(addr)) {
            Ok(doc) => emit(&pretty(&doc)).map_or_else(|code| code, |()| 0),
            Err(e) => {
                eprintln!("tether: {e}");
                1
            }
        };
    }
    let bootstrap = match read_bootstrap(a.bootstrap.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("tether: {e}");
            return 1;
        }
    };
    let Some(runtime) = super::runtime() else {
        return 1;
    };
    runtime.block_on(dump_async(a, bootstrap))
}

async fn dump_async(a: DumpArgs, bootstrap: Bootstrap) -> i32 {
    // Only a watch handles SIGINT (a one-shot dump keeps the default: it
    // dies). Registered before anything is printed, so a watcher
    // interrupted right after its first line still exits cleanly.
    let mut interrupted: Pin<Box<dyn Future<Output = ()>>> = if a.watch {
        match interrupts() {
            Ok(f) => Box::pin(f),
            Err(e) => {
                eprintln!("tether: cannot handle SIGINT: {e}");
                return 1;
            }
        }
    } else {
        Box::pin(std::future::pending())
    };
    let mut options = ClientOptions::default();
    options.does_not_exist_timeout = a.does_not_exist_timeout;
    let client = match XdsClient::start_with(bootstrap, options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tether: {e}");
            return 1;
        }
    };
    let mut events = client.events();
    let mut graph = Graph::new(client, a.listener.clone().unwrap_or_default());
    let timeout = match (a.timeout, a.watch) {
        (Some(t), _) => Some(t),
        (None, false) => Some(DEFAULT_TIMEOUT),
        (None, true) => None,
    };
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut last_line = String::new();
    loop {
        let (doc, complete) = dump_doc(&mut graph);
        if a.watch {
            let line = doc.to_string();
            if line != last_line {
                if let Err(code) = emit(&line) {
                    return code;
                }
                last_line = line;
            }
        } else if complete {
            return emit(&pretty(&doc)).map_or_else(|code| code, |()| 0);
        }
        tokio::select! {
            r = events.recv() => match r {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => settle(&mut events).await,
                Err(broadcast::error::RecvError::Closed) => {
                    eprintln!("tether: the xDS client stopped");
                    return 1;
                }
            },
            _ = sleep_until_opt(deadline) => {
                if a.watch {
                    return 0;
                }
                let (doc, _) = dump_doc(&mut graph);
                if let Err(code) = emit(&pretty(&doc)) {
                    return code;
                }
                eprintln!(
                    "tether: the resources of listener {:?} are not complete after {}",
                    a.listener.as_deref().unwrap_or_default(),
                    tether_core::duration::display(timeout.unwrap_or_default())
                );
                return EXIT_INCOMPLETE;
            }
            _ = &mut interrupted => return 0,
        }
    }
}

fn pretty(doc: &Value) -> String {
    serde_json::to_string_pretty(doc).unwrap_or_else(|_| doc.to_string())
}

/// Writes one line to stdout; a closed pipe ends the command quietly.
pub(super) fn emit(text: &str) -> Result<(), i32> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(0),
        Err(e) => {
            eprintln!("tether: cannot write to stdout: {e}");
            Err(1)
        }
    }
}

#[cfg(unix)]
fn interrupts() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt())?;
    Ok(async move {
        sigint.recv().await;
    })
}

#[cfg(not(unix))]
fn interrupts() -> std::io::Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

async fn settle(events: &mut broadcast::Receiver<(ResourceKind, String)>) {
    let until = Instant::now() + SETTLE_MAX;
    loop {
        let quiet = (Instant::now() + SETTLE_QUIET).min(until);
        match tokio::time::timeout_at(quiet, events.recv()).await {
            Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            _ => return,
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The dump of one walk of the graph, and whether it is complete.
fn dump_doc(graph: &mut Graph) -> (Value, bool) {
    let w = graph.walk();
    let entries = |list: &[(String, ResourceState)]| -> Vec<Value> {
        list.iter().map(|(n, s)| entry(n, s)).collect()
    };
    let route_clusters: Vec<Value> = w
        .route_clusters
        .iter()
        .map(|rc| {
            let (leaves, error) = match &rc.resolution {
                Resolution::Pending => (Value::Null, None),
                Resolution::Leaves(l) => (json!(l), None),
                Resolution::Error(e) => (Value::Null, Some(e)),
            };
            json!({ "cluster": rc.name, "leaves": leaves, "error": error })
        })
        .collect();
    let doc = json!({
        "target": graph.target(),
        "xds_server": graph.client().server_uri(),
        "node_id": graph.client().node_id(),
        "complete": w.complete,
        "errors": w.errors,
        "listener": w.listener.as_ref().map_or(Value::Null, |s| entry(graph.target(), s)),
        "route_configuration": w.route_configuration.as_ref().map_or(Value::Null, |(n, s)| entry(n, s)),
        "virtual_host": w.virtual_host.as_ref().map(|v| v.name.clone()),
        "route_clusters": route_clusters,
        "clusters": entries(&w.clusters),
        "endpoints": entries(&w.endpoints),
    });
    (doc, w.complete)
}

/// One resource: name, CSDS-like status, versions, error and the
/// validated resource.
fn entry(name: &str, s: &ResourceState) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(name));
    let status = match &s.status {
        ResourceStatus::Requested => "requested",
        ResourceStatus::Acked { .. } => "acked",
        ResourceStatus::Nacked { .. } => "nacked",
        ResourceStatus::DoesNotExist => "does_not_exist",
        ResourceStatus::Timeout => "timeout",
        ResourceStatus::ReceivedError { .. } => "received_error",
        _ => "unknown",
    };
    m.insert("status".into(), json!(status));
    m.insert("version".into(), json!(s.resource_version));
    if let ResourceStatus::Nacked { version, error } = &s.status {
        m.insert("rejected_version".into(), json!(version));
        let fields: Vec<Value> = error
            .errors
            .iter()
            .map(|f| json!({ "field": f.field, "value": f.value, "problem": f.problem }))
            .collect();
        m.insert("field_errors".into(), Value::Array(fields));
    }
    m.insert(
        "error".into(),
        json!(s.error.as_ref().map(ToString::to_string)),
    );
    m.insert(
        "resource".into(),
        s.resource.as_ref().map_or(Value::Null, resource_json),
    );
    Value::Object(m)
}

/// A validated resource as `dump` prints it.
pub(crate) fn resource_json(r: &Resource) -> Value {
    match r {
        Resource::Listener(l) => listener_json(l),
        Resource::RouteConfiguration(rc) => route_config_json(rc),
        Resource::Cluster(c) => cluster_json(c),
        Resource::Endpoints(e) => endpoints_json(e),
    }
}

fn duration(d: Duration) -> Value {
    json!(tether_core::duration::display(d).to_string())
}

fn opt_duration(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, duration)
}

fn listener_json(l: &ListenerResource) -> Value {
    let mut hcm = Map::new();
    match &l.http.routes {
        RouteSource::Rds(name) => hcm.insert("rds".into(), json!(name)),
        RouteSource::Inline(rc) => hcm.insert("route_config".into(), route_config_json(rc)),
    };
    let filters: Vec<Value> = l
        .http
        .http_filters
        .iter()
        .map(|f| match &f.config {
            FilterConfig::Router => json!({ "name": f.name, "type": "router" }),
            FilterConfig::StatefulSession(s) => json!({
                "name": f.name,
                "type": "stateful_session",
                "session": session_json(s),
            }),
            FilterConfig::Fault(config) => json!({
                "name": f.name,
                "type": "fault",
                "fault": fault_json(config),
            }),
            _ => json!({ "name": f.name }),
        })
        .collect();
    hcm.insert("http_filters".into(), Value::Array(filters));
    hcm.insert(
        "max_stream_duration".into(),
        opt_duration(l.http.max_stream_duration),
    );
    json!({ "name": l.name, "http_connection_manager": hcm })
}

fn fraction_json(f: &Fraction) -> Value {
    json!({ "numerator": f.numerator, "denominator": f.denominator })
}

fn fault_json(f: &FaultConfig) -> Value {
    let delay = f.delay.map_or(Value::Null, |d| {
        let source = match d.source {
            DelaySource::Fixed(t) => json!({ "fixed": duration(t) }),
            DelaySource::Header => json!({ "header": DELAY_HEADER }),
        };
        json!({ "source": source, "percentage": fraction_json(&d.percentage) })
    });
    let abort = f.abort.map_or(Value::Null, |a| {
        let source = match a.source {
            AbortSource::Status(code) => {
                json!({ "status": code.map_or_else(|| "OK".to_owned(), |c| format!("{c:?}")) })
            }
            AbortSource::Header => json!({ "header": ABORT_GRPC_STATUS_HEADER }),
        };
        json!({ "source": source, "percentage": fraction_json(&a.percentage) })
    });
    json!({ "delay": delay, "abort": abort, "max_active_faults": f.max_active_faults })
}

fn session_json(s: &SessionState) -> Value {
    json!({
        "cookie": s.cookie.as_ref().map_or(Value::Null, cookie_json),
        "strict": s.strict,
    })
}

fn cookie_json(c: &CookieSpec) -> Value {
    let attributes: Vec<Value> = c
        .attributes()
        .iter()
        .map(|a| json!({ "name": a.name(), "value": a.value() }))
        .collect();
    json!({
        "name": c.name(),
        "path": c.path(),
        "ttl": duration(c.ttl()),
        "attributes": attributes,
    })
}

fn overrides_json(o: &FilterOverrides) -> Value {
    let m: Map<String, Value> = o
        .iter()
        .map(|(name, o)| {
            let v = match o {
                FilterOverride::Disabled => json!({ "disabled": true }),
                FilterOverride::Session(SessionOverride::Disabled) => {
                    json!({ "session": { "disabled": true } })
                }
                FilterOverride::Session(SessionOverride::Enabled(s)) => {
                    json!({ "session": session_json(s) })
                }
                FilterOverride::Fault(f) => json!({ "fault": fault_json(f) }),
                _ => json!({}),
            };
            (name.clone(), v)
        })
        .collect();
    Value::Object(m)
}

fn route_config_json(rc: &RouteConfigResource) -> Value {
    let vhs: Vec<Value> = rc
        .virtual_hosts
        .iter()
        .map(|vh| {
            let routes: Vec<Value> = vh.routes.iter().map(route_json).collect();
            json!({
                "name": vh.name,
                "domains": vh.domains,
                "filter_overrides": overrides_json(&vh.filter_overrides),
                "retry_policy": vh.retry_policy.as_ref().map_or(Value::Null, retry_json),
                "routes": routes,
            })
        })
        .collect();
    json!({ "name": rc.name, "virtual_hosts": vhs })
}

fn route_json(r: &tether_xds::resource::route::Route) -> Value {
    let mut matcher = Map::new();
    let (key, value) = match &r.matcher.path {
        PathMatcher::Prefix(p) => ("prefix", p.as_str()),
        PathMatcher::Path(p) => ("path", p.as_str()),
        PathMatcher::Regex(p) => ("safe_regex", p.source.as_str()),
    };
    matcher.insert(key.into(), json!(value));
    matcher.insert("case_sensitive".into(), json!(r.matcher.case_sensitive));
    let headers: Vec<Value> = r
        .matcher
        .headers
        .iter()
        .map(|h| {
            let mut m = Map::new();
            m.insert("name".into(), json!(h.name));
            let text = |m: &mut Map<String, Value>, k: &str, v: &str, ic: bool| {
                m.insert(k.into(), json!(v));
                m.insert("ignore_case".into(), json!(ic));
            };
            match &h.kind {
                HeaderMatch::Exact(v, ic) => text(&mut m, "exact", v, *ic),
                HeaderMatch::Prefix(v, ic) => text(&mut m, "prefix", v, *ic),
                HeaderMatch::Suffix(v, ic) => text(&mut m, "suffix", v, *ic),
                HeaderMatch::Contains(v, ic) => text(&mut m, "contains", v, *ic),
                HeaderMatch::Regex(p) => {
                    m.insert("safe_regex".into(), json!(p.source));
                }
                HeaderMatch::Range(start, end) => {
                    m.insert("range".into(), json!({ "start": start, "end": end }));
                }
                HeaderMatch::Present(p) => {
                    m.insert("present".into(), json!(p));
                }
            }
            m.insert("invert".into(), json!(h.invert));
            Value::Object(m)
        })
        .collect();
    matcher.insert("headers".into(), Value::Array(headers));
    matcher.insert(
        "runtime_fraction_per_million".into(),
        json!(r.matcher.fraction_per_million),
    );
    let mut out = Map::new();
    out.insert("name".into(), json!(r.name));
    out.insert("match".into(), Value::Object(matcher));
    match &r.action {
        Action::NonForwarding => {
            out.insert("non_forwarding".into(), json!(true));
        }
        Action::Route(a) => {
            let mut route = Map::new();
            match &a.clusters {
                ClusterSpecifier::Cluster(n) => {
                    route.insert("cluster".into(), json!(n));
                }
                ClusterSpecifier::Weighted(ws) => {
                    let ws: Vec<Value> = ws
                        .iter()
                        .map(|cw| {
                            json!({
                                "name": cw.name,
                                "weight": cw.weight,
                                "filter_overrides": overrides_json(&cw.filter_overrides),
                            })
                        })
                        .collect();
                    route.insert("weighted_clusters".into(), Value::Array(ws));
                }
            }
            let hashes: Vec<Value> = a
                .hash_policies
                .iter()
                .map(|h| {
                    let source = match &h.source {
                        HashSource::Header { name, rewrite } => json!({ "header": {
                            "name": name,
                            "regex_rewrite": rewrite.as_ref().map(|(p, s)| json!({
                                "pattern": p.source, "substitution": s,
                            })),
                        }}),
                        HashSource::Cookie { name, ttl, path } => json!({ "cookie": {
                            "name": name, "ttl": opt_duration(*ttl), "path": path,
                        }}),
                        HashSource::SourceIp => json!({ "source_ip": true }),
                        HashSource::QueryParameter(n) => json!({ "query_parameter": n }),
                        HashSource::FilterState(k) => json!({ "filter_state": k }),
                    };
                    let mut m = match source {
                        Value::Object(m) => m,
                        _ => Map::new(),
                    };
                    m.insert("terminal".into(), json!(h.terminal));
                    Value::Object(m)
                })
                .collect();
            route.insert("hash_policies".into(), Value::Array(hashes));
            route.insert(
                "max_stream_duration".into(),
                opt_duration(a.max_stream_duration),
            );
            route.insert(
                "retry_policy".into(),
                a.retry_policy.as_ref().map_or(Value::Null, retry_json),
            );
            out.insert("route".into(), Value::Object(route));
        }
    }
    out.insert(
        "filter_overrides".into(),
        overrides_json(&r.filter_overrides),
    );
    Value::Object(out)
}

fn retry_json(p: &RetryPolicy) -> Value {
    let codes: Vec<String> = p.retry_on.iter().map(|c| format!("{c:?}")).collect();
    json!({
        "retry_on": codes,
        "num_retries": p.num_retries,
        "base_interval": duration(p.base_interval),
        "max_interval": duration(p.max_interval),
    })
}

fn lb_json(p: &LbPolicy) -> Value {
    match p {
        LbPolicy::RoundRobin => json!({ "round_robin": {} }),
        LbPolicy::RingHash {
            min_ring_size,
            max_ring_size,
        } => json!({ "ring_hash": {
            "minimum_ring_size": min_ring_size,
            "maximum_ring_size": max_ring_size,
        }}),
        LbPolicy::Maglev { table_size } => json!({ "maglev": { "table_size": table_size } }),
        LbPolicy::LeastRequest { choice_count } => {
            json!({ "least_request": { "choice_count": choice_count } })
        }
        LbPolicy::PickFirst { shuffle } => {
            json!({ "pick_first": { "shuffle_address_list": shuffle } })
        }
        LbPolicy::WeightedRoundRobin(s) => json!({ "weighted_round_robin": {
            "enable_oob_load_report": s.enable_oob_load_report,
            "oob_reporting_period": duration(s.oob_reporting_period),
            "blackout_period": duration(s.blackout_period),
            "weight_expiration_period": duration(s.weight_expiration_period),
            "weight_update_period": duration(s.weight_update_period),
            "error_utilization_penalty": s.error_utilization_penalty,
        }}),
        LbPolicy::Custom(p) => json!({ p.name(): p.config }),
        LbPolicy::WrrLocality(child) => {
            json!({ "wrr_locality": { "endpoint_picking_policy": lb_json(child) } })
        }
    }
}

fn cluster_json(c: &ClusterResource) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(c.name));
    match &c.discovery {
        Discovery::Eds { service_name } => {
            m.insert("type".into(), json!("EDS"));
            m.insert("eds_service_name".into(), json!(service_name));
        }
        Discovery::LogicalDns { target } => {
            m.insert("type".into(), json!("LOGICAL_DNS"));
            m.insert("dns_target".into(), json!(target));
        }
        Discovery::Aggregate { clusters } => {
            m.insert("type".into(), json!("AGGREGATE"));
            m.insert("children".into(), json!(clusters));
        }
    }
    m.insert("lb_policy".into(), lb_json(&c.lb_policy));
    // The tree a channel builds for it, top down.
    m.insert(
        "policy_chain".into(),
        match tether::lb::policy_chain(c) {
            Ok(chain) => json!(chain.join(" > ")),
            Err(e) => json!(format!("not supported by the channel: {e}")),
        },
    );
    let statuses: Vec<&str> = c.override_host_status.iter().map(|h| h.as_str()).collect();
    m.insert("override_host_status".into(), json!(statuses));
    m.insert("idle_timeout".into(), duration(c.idle_timeout));
    if let Some(od) = &c.outlier_detection {
        // Durations in milliseconds: `interval`, `base_ejection_time`, ...
        m.insert(
            "outlier_detection".into(),
            serde_json::to_value(od).unwrap_or(Value::Null),
        );
    }
    Value::Object(m)
}

fn endpoints_json(e: &EndpointsResource) -> Value {
    let priorities: Vec<Value> = e
        .priorities
        .iter()
        .enumerate()
        .map(|(p, prio)| {
            let localities: Vec<Value> = prio
                .localities
                .iter()
                .map(|l| {
                    let endpoints: Vec<Value> = l
                        .endpoints
                        .iter()
                        .map(|ep| {
                            let addresses: Vec<String> =
                                ep.addresses.iter().map(ToString::to_string).collect();
                            json!({
                                "addresses": addresses,
                                "health": ep.health.as_str(),
                                "weight": ep.weight,
                                "hostname": ep.hostname,
                            })
                        })
                        .collect();
                    json!({
                        "locality": {
                            "region": l.locality.region,
                            "zone": l.locality.zone,
                            "sub_zone": l.locality.sub_zone,
                        },
                        "weight": l.weight,
                        "endpoints": endpoints,
                    })
                })
                .collect();
            json!({ "priority": p, "localities": localities })
        })
        .collect();
    json!({ "cluster_name": e.cluster_name, "priorities": priorities })
}

#[cfg(test)]
mod tests {
    use super::seconds;
    use std::time::Duration;

    #[test]
    fn seconds_accepts_plain_and_suffixed_numbers() {
        assert_eq!(seconds("2"), Ok(Duration::from_secs(2)));
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(seconds("-1").unwrap_err().contains("\"-1\""));
        assert!(seconds("soon").is_err());
        assert!(seconds("NaN").is_err());
    }
}
