//! `tether xds dump` as a user runs it: the real `tether` binary against a
//! real `tether-control` on 127.0.0.1 (the configured graph, aggregate
//! services resolved to their leaves, `--watch` following an endpoint change
//! and the server going away, a server that is down), and against the test
//! ADS fixture for what tether-control refuses to serve on purpose (an
//! aggregate cycle and a chain deeper than 16, a missing cluster, an invalid
//! cluster that is NACKed).

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateConfig;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::Value;
use tether::xds::resource::pack;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use control_support::{Control, TempDir};
use xds_support::make::{endpoints, route};
use xds_support::{make, Fixture, Mode, CDS, LDS};

const YAML: &str = include_str!("fixtures/xds_dump.yaml");
const AGGREGATE_YAML: &str = include_str!("fixtures/xds_dump_aggregate.yaml");
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Every wait on the binary is bounded by this.
const LIMIT: Duration = Duration::from_secs(20);

fn tether() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tether"));
    c.env_remove("GRPC_XDS_BOOTSTRAP")
        .env_remove("GRPC_XDS_BOOTSTRAP_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c
}

fn fixture_bootstrap(f: &Fixture, node: &str) -> String {
    format!(
        r#"{{"xds_servers":[{{"server_uri":"{}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"{node}"}}}}"#,
        f.addr
    )
}

/// Runs a one-shot dump; returns the exit status, the parsed document and
/// stderr.
async fn dump(bootstrap: &Path, listener: &str, extra: &[&str]) -> (ExitStatus, Value, String) {
    let child = tether()
        .args(["xds", "dump", "--bootstrap"])
        .arg(bootstrap)
        .args(["--listener", listener])
        .args(extra)
        .spawn()
        .expect("spawn tether");
    finish(child).await
}

async fn finish(child: Child) -> (ExitStatus, Value, String) {
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .expect("tether xds dump did not exit in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {stdout}\n{stderr}"));
    (out.status, doc, stderr)
}

/// The entry named `name` in the list `list` (`clusters`, `endpoints`, `route_clusters`).
fn find<'a>(doc: &'a Value, list: &str, name: &str) -> &'a Value {
    let key = if list == "route_clusters" {
        "cluster"
    } else {
        "name"
    };
    doc[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list} in {doc}"))
        .iter()
        .find(|e| e[key] == name)
        .unwrap_or_else(|| panic!("no {list} entry {name:?} in {doc:#}"))
}

/// A `tether xds dump --watch` whose lines arrive on a channel.
struct Watch {
    child: Child,
    lines: mpsc::UnboundedReceiver<Value>,
    seen: usize,
}

impl Watch {
    fn start(bootstrap: &Path, listener: &str, extra: &[&str]) -> Watch {
        let mut child = tether()
            .args(["xds", "dump", "--watch", "--bootstrap"])
            .arg(bootstrap)
            .args(["--listener", listener])
            .args(extra)
            .spawn()
            .expect("spawn tether");
        let (tx, rx) = mpsc::unbounded_channel();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("a --watch line is not JSON ({e}): {line}"));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        Watch {
            child,
            lines: rx,
            seen: 0,
        }
    }

    /// The first line from now on for which `pred` holds.
    async fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let found = tokio::time::timeout(LIMIT, async {
            while let Some(v) = self.lines.recv().await {
                self.seen += 1;
                if pred(&v) {
                    return Some(v);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(v)) => v,
            Ok(None) => panic!("tether exited before {what} ({} lines)", self.seen),
            Err(_) => panic!("no line with {what} in {LIMIT:?} ({} lines)", self.seen),
        }
    }

    /// Sends SIGINT and returns the exit status.
    async fn interrupt(mut self) -> ExitStatus {
        let pid = self.child.id().expect("tether is running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success());
        tokio::time::timeout(LIMIT, self.child.wait())
            .await
            .expect("tether did not exit on SIGINT")
            .unwrap()
    }
}

fn statuses(doc: &Value) -> Vec<(String, String)> {
    let mut out = vec![(
        doc["listener"]["name"].as_str().unwrap_or("").to_owned(),
        doc["listener"]["status"].as_str().unwrap_or("").to_owned(),
    )];
    if !doc["route_configuration"].is_null() {
        out.push((
            doc["route_configuration"]["name"]
                .as_str()
                .unwrap()
                .to_owned(),
            doc["route_configuration"]["status"]
                .as_str()
                .unwrap()
                .to_owned(),
        ));
    }
    for list in ["clusters", "endpoints"] {
        for e in doc[list].as_array().unwrap() {
            out.push((
                e["name"].as_str().unwrap().to_owned(),
                e["status"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_shows_what_tether_control_configured() {
    let control = Control::start(YAML).await;
    let dir = TempDir::new("dump");
    let boot = dir.bootstrap(&control.bootstrap_json("dump-node"));
    let started = Instant::now();
    let (status, doc, stderr) = dump(&boot, "shop.example", &["--timeout", "15"]).await;
    let took = started.elapsed();
    assert!(status.success(), "{status}: {stderr}\n{doc:#}");
    assert_eq!(doc["complete"], true);
    assert_eq!(doc["errors"], serde_json::json!([]));
    assert_eq!(doc["node_id"], "dump-node");
    assert_eq!(doc["xds_server"], control.addr.to_string());
    // Every resource ACKed, in tether-control's first version.
    let all = statuses(&doc);
    assert_eq!(all.len(), 1 + 1 + 3 + 3, "{all:?}");
    for (name, s) in &all {
        assert_eq!(s, "acked", "{name}");
    }
    for e in doc["clusters"].as_array().unwrap() {
        assert_eq!(e["version"], "1", "{e}");
    }

    // The listener: RDS, the stateful session filter with no cookie at
    // this level, then the router.
    let hcm = &doc["listener"]["resource"]["http_connection_manager"];
    assert_eq!(hcm["rds"], "tether-routes");
    let filters = hcm["http_filters"].as_array().unwrap();
    assert_eq!(filters.len(), 2);
    assert_eq!(filters[0]["name"], "envoy.filters.http.stateful_session");
    assert_eq!(filters[0]["type"], "stateful_session");
    assert_eq!(filters[0]["session"]["cookie"], Value::Null);
    assert_eq!(filters[1]["type"], "router");

    // The routes: hash policy, weighted clusters, the per-route override.
    assert_eq!(doc["route_configuration"]["name"], "tether-routes");
    assert_eq!(doc["virtual_host"], "shop.example");
    let vh = &doc["route_configuration"]["resource"]["virtual_hosts"][0];
    assert_eq!(vh["domains"], serde_json::json!(["shop.example"]));
    let api = &vh["routes"][0];
    assert_eq!(api["match"]["prefix"], "/api");
    assert_eq!(api["match"]["headers"][0]["name"], "x-canary");
    assert_eq!(api["route"]["cluster"], "api/ring-hash");
    assert_eq!(
        api["route"]["hash_policies"],
        serde_json::json!([{ "header": { "name": "x-user", "regex_rewrite": null }, "terminal": true }])
    );
    assert_eq!(api["filter_overrides"], serde_json::json!({}));
    let weighted = &vh["routes"][1];
    assert_eq!(weighted["match"]["prefix"], "/");
    let wc = weighted["route"]["weighted_clusters"].as_array().unwrap();
    assert_eq!(
        wc.iter()
            .map(|c| (c["name"].as_str().unwrap(), c["weight"].as_u64().unwrap()))
            .collect::<Vec<_>>(),
        [("web/session", 90), ("web-canary/session", 10)]
    );
    let over = &weighted["filter_overrides"]["envoy.filters.http.stateful_session"];
    assert_eq!(
        over["session"]["cookie"],
        serde_json::json!({
            "name": "session", "path": "/", "ttl": "3600s",
            "attributes": [{ "name": "SameSite", "value": "Lax" }],
        }),
        "{over}"
    );
    assert_eq!(over["session"]["strict"], false);

    // Clusters: each route cluster is its own leaf.
    for (name, eds) in [
        ("api/ring-hash", "api"),
        ("web/session", "web"),
        ("web-canary/session", "web-canary"),
    ] {
        let rc = find(&doc, "route_clusters", name);
        assert_eq!(rc["leaves"], serde_json::json!([name]));
        assert_eq!(rc["error"], Value::Null);
        let c = &find(&doc, "clusters", name)["resource"];
        assert_eq!(c["type"], "EDS");
        assert_eq!(c["eds_service_name"], eds);
    }
    let ring = &find(&doc, "clusters", "api/ring-hash")["resource"];
    assert_eq!(
        ring["lb_policy"],
        serde_json::json!({ "ring_hash": { "minimum_ring_size": 1024, "maximum_ring_size": 8388608 } })
    );
    assert_eq!(
        ring["override_host_status"],
        serde_json::json!(["UNKNOWN", "HEALTHY"])
    );
    assert_eq!(ring["idle_timeout"], "3600s");
    assert_eq!(
        ring["policy_chain"],
        "cds > xds_cluster_impl > xds_override_host > priority > ring_hash"
    );
    let session = &find(&doc, "clusters", "web/session")["resource"];
    assert_eq!(
        session["lb_policy"],
        serde_json::json!({ "round_robin": {} })
    );
    assert_eq!(
        session["policy_chain"],
        "cds > xds_cluster_impl > xds_override_host > priority > xds_wrr_locality > weighted_target > round_robin"
    );
    assert_eq!(
        session["override_host_status"],
        serde_json::json!(["UNKNOWN", "HEALTHY", "DRAINING"])
    );
    assert_eq!(session["idle_timeout"], "600s");

    // Endpoints: two priorities, locality weight, the DRAINING endpoint
    // with its two addresses and weight.
    let web = &find(&doc, "endpoints", "web")["resource"];
    let prios = web["priorities"].as_array().unwrap();
    assert_eq!(prios.len(), 2, "{web:#}");
    let p0 = &prios[0]["localities"][0];
    assert_eq!(
        p0["locality"],
        serde_json::json!({ "region": "us", "zone": "a", "sub_zone": "" })
    );
    assert_eq!(p0["weight"], 3);
    assert_eq!(
        p0["endpoints"],
        serde_json::json!([
            { "addresses": ["10.0.0.1:8080"], "health": "HEALTHY", "weight": 1, "hostname": "" },
            { "addresses": ["10.0.0.2:8080", "[2001:db8::2]:8080"], "health": "DRAINING",
              "weight": 2, "hostname": "" },
        ])
    );
    let p1 = &prios[1];
    assert_eq!(p1["priority"], 1);
    assert_eq!(p1["localities"][0]["locality"]["zone"], "b");
    assert_eq!(
        p1["localities"][0]["endpoints"][0]["addresses"],
        serde_json::json!(["10.0.1.1:8080"])
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(control.nacks_none(), "{}", control.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_an_endpoint_change_and_the_server_going_away() {
    let mut control = Control::start(YAML).await;
    let dir = TempDir::new("dump-watch");
    let boot = dir.bootstrap(&control.bootstrap_json("watch-node"));
    let mut w = Watch::start(&boot, "shop.example", &[]);
    let canary = |doc: &Value| -> Option<String> {
        let e = doc["endpoints"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == "web-canary")?;
        e["resource"]["priorities"][0]["localities"][0]["endpoints"][0]["addresses"][0]
            .as_str()
            .map(str::to_owned)
    };
    let first = w
        .until("the complete graph", |d| d["complete"] == true)
        .await;
    assert_eq!(canary(&first).as_deref(), Some("10.0.2.1:8080"));
    let v1 = find(&first, "endpoints", "web-canary")["version"].clone();

    control.write(&YAML.replace("10.0.2.1:8080", "10.0.2.7:8080"));
    let changed = w
        .until("the new web-canary address", |d| {
            canary(d).as_deref() == Some("10.0.2.7:8080")
        })
        .await;
    let e = find(&changed, "endpoints", "web-canary");
    assert_eq!(e["status"], "acked");
    assert_ne!(e["version"], v1, "the change comes in a new version");
    assert_eq!(changed["complete"], true);
    assert_eq!(changed["errors"], serde_json::json!([]));

    // The server stops: the resources stay, with the A57 connectivity error
    // naming the server and the node beside them.
    control.kill().await;
    let down = w
        .until("a connectivity error", |d| {
            d["listener"]["error"].as_str().is_some()
        })
        .await;
    let err = down["listener"]["error"].as_str().unwrap();
    assert!(
        err.starts_with(&format!(
            "xDS channel for server {}: xDS call failed with no responses received; status: UNAVAILABLE:",
            control.addr
        )),
        "{err}"
    );
    assert!(err.ends_with("(node ID:watch-node)"), "{err}");
    assert_eq!(down["listener"]["status"], "acked");
    assert_eq!(canary(&down).as_deref(), Some("10.0.2.7:8080"));
    assert_eq!(down["errors"], serde_json::json!([err]));

    let status = w.interrupt().await;
    assert_eq!(status.code(), Some(0), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_a_connectivity_error_and_the_timeout_exits_3() {
    let addr = Fixture::unused_addr().await;
    let dir = TempDir::new("dump-down");
    let boot = dir.bootstrap(&format!(
            r#"{{"xds_servers":[{{"server_uri":"{addr}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"down-node"}}}}"#
        ),
    );
    // The bootstrap from GRPC_XDS_BOOTSTRAP, as gRPC reads it.
    let started = Instant::now();
    let child = tether()
        .env("GRPC_XDS_BOOTSTRAP", &boot)
        .args([
            "xds",
            "dump",
            "--listener",
            "shop.example",
            "--timeout",
            "1",
        ])
        .spawn()
        .unwrap();
    let (status, doc, stderr) = finish(child).await;
    let took = started.elapsed();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("not complete after 1s"), "{stderr}");
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(10));
    assert_eq!(doc["complete"], false);
    let l = &doc["listener"];
    assert_eq!(l["status"], "requested");
    assert_eq!(l["resource"], Value::Null);
    let err = l["error"].as_str().expect("a connectivity error");
    assert!(
        err.starts_with(&format!(
            "xDS channel for server {addr}: xDS call failed with no responses received; status: UNAVAILABLE:"
        )),
        "{err}"
    );
    assert!(err.ends_with("(node ID:down-node)"), "{err}");
    assert_eq!(doc["errors"], serde_json::json!([err]));
    assert_eq!(doc["clusters"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_bootstrap_is_an_error_naming_the_field() {
    let dir = TempDir::new("dump-bad");
    let boot = dir.bootstrap(r#"{"xds_servers":[],"node":{"id":"n"}}"#);
    let out = tether()
        .args(["xds", "dump", "--listener", "x", "--bootstrap"])
        .arg(&boot)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "tether: bootstrap xds_servers: [] is empty"
    );
    // Neither the flag nor the variables: says which variable to set.
    let out = tether()
        .args(["xds", "dump", "--listener", "x"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GRPC_XDS_BOOTSTRAP"), "{err}");
    let out = tether()
        .args(["xds", "dump", "--listener", "x", "--timeout", "soon"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--timeout") && err.contains("\"soon\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregate_services_from_tether_control_resolve_to_their_leaves() {
    let control = Control::start(AGGREGATE_YAML).await;
    let dir = TempDir::new("dump-agg-control");
    let boot = dir.bootstrap(&control.bootstrap_json("agg-control-node"));
    let (status, doc, stderr) = dump(&boot, "agg.example", &["--timeout", "15"]).await;
    assert!(status.success(), "{status}: {stderr}\n{doc:#}");
    assert_eq!(doc["complete"], true);
    assert_eq!(doc["errors"], serde_json::json!([]));
    for (name, s) in statuses(&doc) {
        assert_eq!(s, "acked", "{name}");
    }

    // Two levels: shop → (web → primary, fallback), spare; each route's
    // cluster resolved to its leaves in priority order.
    let leaves = |cluster: &str| find(&doc, "route_clusters", cluster)["leaves"].clone();
    assert_eq!(
        leaves("shop/session"),
        serde_json::json!(["primary/session", "fallback/session", "spare/session"])
    );
    assert_eq!(leaves("web"), serde_json::json!(["primary", "fallback"]));
    // The longest chain tether-control accepts is one the client follows.
    assert_eq!(leaves("chain-0"), serde_json::json!(["chain-15"]));
    for rc in doc["route_clusters"].as_array().unwrap() {
        assert_eq!(rc["error"], Value::Null, "{rc}");
    }

    // The aggregate clusters as served, one level each.
    for (name, children) in [
        ("shop/session", ["web/session", "spare/session"]),
        ("web/session", ["primary/session", "fallback/session"]),
        ("web", ["primary", "fallback"]),
    ] {
        let c = &find(&doc, "clusters", name)["resource"];
        assert_eq!(c["type"], "AGGREGATE", "{name}: {c}");
        assert_eq!(c["children"], serde_json::json!(children), "{name}");
    }
    // The leaves carry the route's session settings and read their own
    // endpoints: two priorities, a DRAINING endpoint.
    for leaf in ["primary", "fallback", "spare"] {
        let c = &find(&doc, "clusters", &format!("{leaf}/session"))["resource"];
        assert_eq!(c["type"], "EDS");
        assert_eq!(c["eds_service_name"], leaf);
        assert_eq!(
            c["override_host_status"],
            serde_json::json!(["UNKNOWN", "HEALTHY", "DRAINING"]),
            "{leaf}"
        );
    }
    let primary = &find(&doc, "endpoints", "primary")["resource"];
    assert_eq!(
        primary["priorities"].as_array().unwrap().len(),
        2,
        "{primary}"
    );
    assert_eq!(
        find(&doc, "endpoints", "fallback")["resource"]["priorities"][0]["localities"][0]
            ["endpoints"][0]["health"],
        "DRAINING"
    );
    // No endpoints are asked for an aggregate.
    let eds: Vec<&str> = doc["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        !eds.iter()
            .any(|n| ["shop", "web"].contains(n) || n.starts_with("chain-") && *n != "chain-15"),
        "{eds:?}"
    );
    assert!(control.nacks_none(), "{}", control.stderr());
}

// ---- The ADS fixture: what tether-control refuses to serve on purpose ----
// (aggregate cycles, chains deeper than gRPC follows, missing clusters,
// invalid resources), so the dump's answers to them are tested here.

const AGG: &str = "agg.example";
/// chain-0 → chain-1 → … → chain-15 (an EDS cluster): 16 levels, the most
/// gRPC follows.
const CHAIN: usize = 16;

fn aggregate(name: &str, children: &[&str]) -> cpb::Cluster {
    cpb::Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::ClusterType(
            cpb::cluster::CustomClusterType {
                name: "envoy.clusters.aggregate".into(),
                typed_config: Some(pack(&AggregateConfig {
                    clusters: children.iter().map(|c| (*c).to_owned()).collect(),
                })),
            },
        )),
        ..Default::default()
    }
}

fn invalid_ring_hash(name: &str) -> cpb::Cluster {
    let mut c = make::cluster(name);
    c.lb_policy = cpb::cluster::LbPolicy::RingHash as i32;
    c.lb_config = Some(cpb::cluster::LbConfig::RingHashLbConfig(
        cpb::cluster::RingHashLbConfig {
            minimum_ring_size: Some(UInt64Value { value: 0 }),
            ..Default::default()
        },
    ));
    c
}

fn clusters(primary: cpb::Cluster) -> Vec<envoy_types::pb::google::protobuf::Any> {
    let mut out = vec![
        pack(&aggregate("agg", &["primary", "fallback"])),
        pack(&primary),
        pack(&make::cluster("fallback")),
        pack(&aggregate("loop-a", &["loop-b"])),
        pack(&aggregate("loop-b", &["loop-a"])),
        pack(&aggregate("deep", &["chain-0"])),
        pack(&aggregate("empty", &["missing"])),
        pack(&invalid_ring_hash("bad")),
    ];
    for i in 0..CHAIN {
        let name = format!("chain-{i}");
        out.push(if i + 1 == CHAIN {
            pack(&make::cluster(&name))
        } else {
            pack(&aggregate(&name, &[&format!("chain-{}", i + 1)]))
        });
    }
    out
}

/// Serves listener `agg.example` whose routes name `agg` (primary then
/// fallback), `missing` (never served), `loop-a` (a cycle), `chain-0` (16
/// levels), `deep` (17 levels), `bad` (NACKed) and `empty` (an aggregate
/// whose only child is missing). Listener `stray.example` reads the same
/// routes, which have no virtual host for it.
async fn aggregate_fixture() -> Fixture {
    let f = Fixture::start(Mode::Serve).await;
    f.set_resources(
        LDS,
        vec![
            make::listener(AGG, "agg-routes"),
            make::listener("stray.example", "agg-routes"),
        ],
    );
    let rc = rpb::RouteConfiguration {
        name: "agg-routes".into(),
        virtual_hosts: vec![rpb::VirtualHost {
            name: "agg-vh".into(),
            domains: vec![AGG.into()],
            routes: vec![
                route("/agg", "agg"),
                route("/missing", "missing"),
                route("/loop", "loop-a"),
                route("/chain", "chain-0"),
                route("/deep", "deep"),
                route("/bad", "bad"),
                route("/empty", "empty"),
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    f.set_resources(RDS, vec![pack(&rc)]);
    f.set_resources(CDS, clusters(make::cluster("primary")));
    f.set_resources(
        EDS,
        vec![
            pack(&endpoints("primary", "10.1.0.1:80")),
            pack(&endpoints("fallback", "10.1.0.2:80")),
            pack(&endpoints(&format!("chain-{}", CHAIN - 1), "10.1.0.3:80")),
        ],
    );
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregate_cycle_and_depth_errors_missing_and_nacked_clusters() {
    let f = aggregate_fixture().await;
    let version = f.version().to_string();
    let dir = TempDir::new("dump-agg");
    let boot = dir.bootstrap(&fixture_bootstrap(&f, "agg-node"));
    let started = Instant::now();
    let (status, doc, stderr) = dump(
        &boot,
        AGG,
        &["--does-not-exist-timeout", "1", "--timeout", "15"],
    )
    .await;
    let took = started.elapsed();
    // Complete: every resource has its answer, errors included.
    assert!(status.success(), "{status}: {stderr}\n{doc:#}");
    assert_eq!(doc["complete"], true);
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // (An aggregate resolving to its leaves is tested against
    // tether-control above; `agg` is here for the NACK test below.)

    // A cycle.
    let cycle = "aggregate cluster graph of \"loop-a\" has a cycle: loop-a -> loop-b -> loop-a";
    assert_eq!(find(&doc, "route_clusters", "loop-a")["error"], cycle);
    assert_eq!(find(&doc, "clusters", "loop-b")["status"], "acked");

    // 16 levels resolve (as from tether-control above); 17 do not, and the
    // 17th level is not even fetched through that path.
    let last = format!("chain-{}", CHAIN - 1);
    assert_eq!(
        find(&doc, "route_clusters", "chain-0")["leaves"],
        serde_json::json!([last])
    );
    let depth = format!("aggregate cluster graph of \"deep\" exceeds max depth 16 (at \"{last}\")");
    let d = find(&doc, "route_clusters", "deep");
    assert_eq!(d["error"], depth.as_str());
    assert_eq!(d["leaves"], Value::Null);

    // A cluster the server never sends: does-not-exist after the timer.
    let dne = "Cluster resource \"missing\" does not exist (node ID:agg-node)";
    let missing = find(&doc, "clusters", "missing");
    assert_eq!(missing["status"], "does_not_exist");
    assert_eq!(missing["error"], dne);
    assert_eq!(missing["resource"], Value::Null);
    assert_eq!(find(&doc, "route_clusters", "missing")["error"], dne);
    // An aggregate left without any leaf.
    let empty = "aggregate cluster dependency graph for \"empty\" has no leaf clusters";
    assert_eq!(find(&doc, "route_clusters", "empty")["error"], empty);

    // An invalid cluster: NACKed with the field named, no good version.
    let bad = find(&doc, "clusters", "bad");
    assert_eq!(bad["status"], "nacked");
    assert_eq!(bad["version"], Value::Null);
    assert_eq!(bad["rejected_version"], version.as_str());
    assert_eq!(
        bad["field_errors"],
        serde_json::json!([{
            "field": "ring_hash_lb_config.minimum_ring_size",
            "value": "0",
            "problem": "must be in the range of 1 to 8388608",
        }])
    );
    let nack = format!(
        "version \"{version}\" rejected: Cluster \"bad\": ring_hash_lb_config.minimum_ring_size: 0 must be in the range of 1 to 8388608"
    );
    assert_eq!(bad["error"], nack.as_str());
    assert_eq!(find(&doc, "route_clusters", "bad")["error"], nack.as_str());

    let mut errors: Vec<&str> = doc["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    errors.sort_unstable();
    let mut expected = vec![cycle, depth.as_str(), dne, nack.as_str(), empty];
    expected.sort_unstable();
    assert_eq!(errors, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_keeps_the_last_good_version_and_resource() {
    let f = aggregate_fixture().await;
    let good = f.version().to_string();
    let dir = TempDir::new("dump-nack");
    let boot = dir.bootstrap(&fixture_bootstrap(&f, "nack-node"));
    let mut w = Watch::start(&boot, AGG, &["--does-not-exist-timeout", "1"]);
    let first = w
        .until("the complete graph", |d| d["complete"] == true)
        .await;
    let primary = find(&first, "clusters", "primary");
    assert_eq!(primary["status"], "acked");
    assert_eq!(primary["version"], good.as_str());

    f.set_resources(CDS, clusters(invalid_ring_hash("primary")));
    let rejected = f.version().to_string();
    f.push(CDS);
    let nacked = w
        .until("primary NACKed", |d| {
            d["clusters"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|c| c["name"] == "primary" && c["status"] == "nacked")
            })
        })
        .await;
    let p = find(&nacked, "clusters", "primary");
    assert_eq!(p["version"], good.as_str(), "the last good version: {p}");
    assert_eq!(p["rejected_version"], rejected.as_str());
    assert_eq!(
        p["field_errors"][0]["field"],
        "ring_hash_lb_config.minimum_ring_size"
    );
    // Still the good resource, still a leaf of the aggregate.
    assert_eq!(
        p["resource"]["lb_policy"],
        serde_json::json!({ "round_robin": {} })
    );
    assert_eq!(
        find(&nacked, "route_clusters", "agg")["leaves"],
        serde_json::json!(["primary", "fallback"])
    );

    let status = w.interrupt().await;
    assert_eq!(status.code(), Some(0), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_a_virtual_host_is_an_error() {
    let f = aggregate_fixture().await;
    let dir = TempDir::new("dump-stray");
    let boot = dir.bootstrap(&fixture_bootstrap(&f, "stray-node"));
    let (status, doc, stderr) = dump(&boot, "stray.example", &["--timeout", "15"]).await;
    assert!(status.success(), "{status}: {stderr}\n{doc:#}");
    assert_eq!(doc["complete"], true);
    assert_eq!(doc["route_configuration"]["status"], "acked");
    assert_eq!(doc["virtual_host"], Value::Null);
    assert_eq!(
        doc["errors"],
        serde_json::json!([
            "could not find VirtualHost for \"stray.example\" in RouteConfiguration \"agg-routes\""
        ])
    );
    // Nothing below the routes is fetched.
    assert_eq!(doc["route_clusters"], serde_json::json!([]));
    assert_eq!(doc["clusters"], serde_json::json!([]));
}

/// Runs `tether xds dump --csds ADDR`.
async fn dump_csds(addr: &str) -> (ExitStatus, Value, String) {
    let child = tether()
        .args(["xds", "dump", "--csds", addr])
        .spawn()
        .expect("spawn tether");
    finish(child).await
}

/// `(client scope, type, name) -> (status, version, has error_state,
/// has resource)`.
type CsdsView = std::collections::BTreeMap<(String, String, String), (String, Value, bool, bool)>;

/// The resources of every client of node `csds-node` in a CSDS document
/// (other tests of this file run clients in the same process).
fn csds_view(doc: &Value) -> CsdsView {
    let mut out = CsdsView::new();
    for c in doc["clients"]
        .as_array()
        .expect("clients")
        .iter()
        .filter(|c| c["node_id"] == "csds-node")
    {
        let scope = c["client_scope"].as_str().unwrap();
        for r in c["resources"].as_array().unwrap() {
            out.insert(
                (
                    scope.to_owned(),
                    r["type"].as_str().unwrap().to_owned(),
                    r["name"].as_str().unwrap().to_owned(),
                ),
                (
                    r["status"].as_str().unwrap().to_owned(),
                    r["version"].clone(),
                    r.get("error").is_some(),
                    !r["resource"].is_null(),
                ),
            );
        }
    }
    out
}

/// Routes `routes` (every host to cluster `good`), cluster `good` and its
/// endpoint `backend`, on `f`.
fn serve_good(f: &Fixture, backend: &tether_testkit::grpc::GrpcBackend) {
    let rc = rpb::RouteConfiguration {
        name: "routes".into(),
        virtual_hosts: vec![rpb::VirtualHost {
            name: "all".into(),
            domains: vec!["*".into()],
            routes: vec![route("/", "good")],
            ..Default::default()
        }],
        ..Default::default()
    };
    f.set_resources(RDS, vec![pack(&rc)]);
    f.set_resources(CDS, vec![pack(&make::cluster("good"))]);
    f.set_resources(
        EDS,
        vec![pack(&endpoints("good", &backend.addr().to_string()))],
    );
}

/// CSDS (gRFC A40) beside grpcio's: the same control plane serves a good
/// target, one whose listener is refused and one whose listener is then
/// removed; a process of channels serving `tether::csds::service()` and a
/// grpcio process serving `grpc_csds` are asked the same question by
/// `tether xds dump --csds`, and report the same statuses and versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csds_reports_what_the_clients_hold_beside_c_core() {
    use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
    let Ok(python) = tether_testkit::grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let backend = GrpcBackend::start("good").await;
    let f = Fixture::start(Mode::Serve).await;
    let unknown_filter = envoy_types::pb::google::protobuf::Any {
        type_url: "type.googleapis.com/example.NoSuchFilter".into(),
        value: Vec::new(),
    };
    f.set_resources(
        LDS,
        vec![
            make::listener("good.example", "routes"),
            make::listener_with(
                "bad.example",
                "routes",
                vec![("nope", unknown_filter.clone())],
            ),
            make::listener("gone.example", "routes"),
        ],
    );
    serve_good(&f, &backend);
    let dir = TempDir::new("csds");
    let boot = dir.bootstrap(&fixture_bootstrap(&f, "csds-node"));
    let targets = [
        "xds:///good.example",
        "xds:///bad.example",
        "xds:///gone.example",
    ];

    // tether: channels of one process, and its CSDS service.
    let channels: Vec<tether::Channel> = targets
        .iter()
        .map(|t| {
            tether::Channel::builder()
                .bootstrap(tether::xds::Bootstrap::from_file(&boot).unwrap())
                .connect(t)
                .unwrap()
        })
        .collect();
    let call = |c: &tether::Channel| {
        let c = c.clone();
        async move {
            let mut r = tonic::Request::new(EchoRequest {
                message: "hi".into(),
            });
            r.set_timeout(Duration::from_secs(5));
            EchoClient::new(c)
                .echo(r)
                .await
                .map(|_| ())
                .map_err(|s| s.code())
        }
    };
    assert_eq!(call(&channels[0]).await, Ok(()));
    assert_eq!(call(&channels[2]).await, Ok(()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ours = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(tether::csds::service())
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    // grpcio: the same targets, and grpc_csds.
    let mut peer = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testkit/peers/grpc_csds_peer.py"))
        .args(targets)
        .env("GRPC_XDS_BOOTSTRAP", &boot)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("run the grpcio CSDS peer");
    let mut lines = BufReader::new(peer.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(LIMIT, lines.next_line())
        .await
        .expect("the grpcio peer did not start")
        .unwrap()
        .expect("the grpcio peer printed nothing");
    let started: Value = serde_json::from_str(&first).unwrap();
    let theirs = started["csds"].as_str().unwrap().to_owned();
    println!("grpcio: {started}");
    assert_eq!(started["calls"]["xds:///good.example"], "OK", "{started}");

    let settled = |doc: &Value| {
        csds_view(doc)
            .values()
            .all(|(status, ..)| status != "requested")
    };
    let both = || async {
        let mut views = Vec::new();
        for addr in [&ours, &theirs] {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (status, doc, stderr) = dump_csds(addr).await;
                assert!(status.success(), "{status}: {stderr}");
                if settled(&doc) || Instant::now() > deadline {
                    views.push((csds_view(&doc), doc));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        views
    };
    let compare = |views: &[(CsdsView, Value)]| {
        println!("tether: {:#?}\nC-core: {:#?}", views[0].0, views[1].0);
        assert_eq!(
            views[0].0, views[1].0,
            "tether {:#}\nC-core {:#}",
            views[0].1, views[1].1
        );
    };
    let before = both().await;
    compare(&before);
    // One client a target, as C-core since A71.
    let scopes: std::collections::BTreeSet<&str> =
        before[0].0.keys().map(|k| k.0.as_str()).collect();
    assert_eq!(
        scopes.into_iter().collect::<Vec<_>>(),
        ["xds:/bad.example", "xds:/gone.example", "xds:/good.example"]
    );
    let key = |s: &str, t: &str, n: &str| (format!("xds:/{s}"), t.to_owned(), n.to_owned());
    let (status, _, error, resource) = &before[0].0[&key("bad.example", "Listener", "bad.example")];
    assert_eq!(
        (status.as_str(), *error, *resource),
        ("nacked", true, false)
    );
    assert_eq!(
        before[0].0[&key("good.example", "Listener", "good.example")].0,
        "acked"
    );
    // The NACK's details name the filter, in tether's words.
    let bad = before[0].1["clients"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["resources"].as_array().unwrap())
        .find(|r| r["name"] == "bad.example")
        .unwrap();
    assert!(
        bad["error"]["details"]
            .as_str()
            .unwrap()
            .contains("example.NoSuchFilter"),
        "{bad:#}"
    );

    // The server removes gone.example from its state of the world.
    f.set_resources(
        LDS,
        vec![
            make::listener("good.example", "routes"),
            make::listener_with("bad.example", "routes", vec![("nope", unknown_filter)]),
        ],
    );
    // Every client has handled the push once it has answered it; what
    // follows from it (a removal's unsubscriptions) settles at each
    // side's pace, so the views are read again (bounded) until they agree.
    f.until_answered(&f.push(LDS)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let views = both().await;
        if views[0].0 == views[1].0 || Instant::now() > deadline {
            break views;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    compare(&after);
    println!(
        "after the deletion: tether {:?}, C-core {:?}",
        after[0].0[&key("gone.example", "Listener", "gone.example")],
        after[1].0[&key("gone.example", "Listener", "gone.example")]
    );
    drop(peer.stdin.take());
    let _ = peer.wait().await;
    drop(channels);
}

/// A grpcio process of `grpc_csds_peer.py`: its CSDS address, and a way to
/// make one more call on each of its channels.
struct CcorePeer {
    child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    csds: String,
}

impl CcorePeer {
    async fn start(python: &Path, bootstrap: &Path, targets: &[&str], a88: bool) -> CcorePeer {
        let mut cmd = Command::new(python);
        cmd.arg(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testkit/peers/grpc_csds_peer.py"),
        )
        .args(targets)
        .env("GRPC_XDS_BOOTSTRAP", bootstrap)
        .env_remove("GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
        if a88 {
            cmd.env("GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING", "true");
        }
        let mut child = cmd.spawn().expect("run the grpcio CSDS peer");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first: Value = serde_json::from_str(
            &tokio::time::timeout(LIMIT, lines.next_line())
                .await
                .expect("the grpcio peer did not start")
                .unwrap()
                .expect("the grpcio peer printed nothing"),
        )
        .unwrap();
        CcorePeer {
            child,
            lines,
            csds: first["csds"].as_str().unwrap().to_owned(),
        }
    }

    /// One call on each channel: target -> code name.
    async fn call(&mut self) -> Value {
        use tokio::io::AsyncWriteExt;
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"call\n").await.unwrap();
        stdin.flush().await.unwrap();
        let line = tokio::time::timeout(LIMIT, self.lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str::<Value>(&line).unwrap()["calls"].clone()
    }
}

/// Data errors (a NACK of a cached cluster, then the listener removed) beside
/// grpcio 1.85, whose A88 handling is behind
/// GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING (tether: `ClientOptions::
/// data_error_handling`, which reads the same variable): without it and
/// with `ignore_resource_deletion`, with it alone, and with it and
/// `fail_on_data_errors`. Calls and CSDS (status, resource kept or not)
/// agree after each error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_errors_as_c_core_handles_them_with_and_without_a88() {
    use tether::channel::Channel;
    use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
    let Ok(python) = tether_testkit::grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let backend = GrpcBackend::start("good").await;
    let f = Fixture::start(Mode::Serve).await;
    let target = "xds:///good.example";
    f.set_resources(LDS, vec![make::listener("good.example", "routes")]);
    serve_good(&f, &backend);
    let dir = TempDir::new("data-errors");
    // (name, server features, A88 on)
    let variants: [(&str, &str, bool); 3] = [
        ("ignore-deletion", r#""ignore_resource_deletion""#, false),
        ("a88", "", true),
        ("a88-fail", r#""fail_on_data_errors""#, true),
    ];
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for (name, features, a88) in variants {
        let boot = dir.bootstrap(&format!(
            r#"{{"xds_servers":[{{"server_uri":"{}","channel_creds":[{{"type":"insecure"}}],"server_features":["xds_v3"{}{features}]}}],"node":{{"id":"{name}"}}}}"#,
            f.addr,
            if features.is_empty() { "" } else { "," }
        ));
        let boot = {
            let path = dir.0.join(format!("bootstrap-{name}.json"));
            std::fs::copy(&boot, &path).unwrap();
            path
        };
        let mut options = tether::xds::client::ClientOptions::default();
        options.data_error_handling = a88;
        let channel = Channel::builder()
            .bootstrap(tether::xds::Bootstrap::from_file(&boot).unwrap())
            .xds_client_options(options)
            .connect(target)
            .unwrap();
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        ours.push((name, channel, server.local_addr().unwrap().to_string()));
        if ours.len() == 1 {
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(tether::csds::service())
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(server)),
            );
        }
        theirs.push(CcorePeer::start(&python, &boot, &[target], a88).await);
    }
    let csds_addr = ours[0].2.clone();
    async fn call(c: &Channel) -> String {
        let mut r = tonic::Request::new(EchoRequest {
            message: "hi".into(),
        });
        r.set_timeout(Duration::from_secs(5));
        match EchoClient::new(c.clone()).echo(r).await {
            Ok(_) => "OK".to_owned(),
            Err(s) => format!("{:?}", s.code()).to_uppercase(),
        }
    }
    /// A node's resources in a CSDS document, each as "type name" and its entry.
    fn resources<'a>(doc: &'a Value, node: &'a str) -> impl Iterator<Item = (String, &'a Value)> {
        doc["clients"]
            .as_array()
            .unwrap()
            .iter()
            .filter(move |c| c["node_id"] == node)
            .flat_map(|c| c["resources"].as_array().unwrap().iter())
            .map(|r| {
                let key = format!(
                    "{} {}",
                    r["type"].as_str().unwrap(),
                    r["name"].as_str().unwrap()
                );
                (key, r)
            })
    }
    /// A node's resources: "type name" -> (status, has resource).
    fn look(doc: &Value, node: &str) -> std::collections::BTreeMap<String, (String, bool)> {
        resources(doc, node)
            .map(|(k, r)| {
                (
                    k,
                    (
                        r["status"].as_str().unwrap().to_owned(),
                        !r["resource"].is_null(),
                    ),
                )
            })
            .collect()
    }
    /// A node's resources the server reported an error for: "type name" ->
    /// (the response's version, the server's message).
    fn reported(doc: &Value, node: &str) -> std::collections::BTreeMap<String, (Value, Value)> {
        resources(doc, node)
            .filter(|(_, r)| r["status"] == "received_error")
            .map(|(k, r)| {
                let e = &r["error"];
                (k, (e["rejected_version"].clone(), e["details"].clone()))
            })
            .collect()
    }
    /// One variant's call and CSDS view as tether and C-core give them.
    struct Sides {
        name: String,
        mine: String,
        theirs: String,
        my_view: std::collections::BTreeMap<String, (String, bool)>,
        their_view: std::collections::BTreeMap<String, (String, bool)>,
        my_errors: std::collections::BTreeMap<String, (Value, Value)>,
        their_errors: std::collections::BTreeMap<String, (Value, Value)>,
    }
    impl Sides {
        fn agree(&self) -> bool {
            self.mine == self.theirs
                && self.my_view == self.their_view
                && self.my_errors == self.their_errors
        }
    }
    /// After the server's latest response (every client has handled it):
    /// each variant's call and CSDS view, the channel's and C-core's,
    /// equal. What follows from a response (a cluster dropped, a removal's
    /// unsubscriptions) settles at each side's pace: both are read again
    /// (bounded) until they agree, then compared.
    async fn stage(
        label: &str,
        ours: &[(&str, Channel, String)],
        theirs: &mut [CcorePeer],
        csds_addr: &str,
        target: &str,
    ) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let sides = loop {
            let (_, doc, _) = dump_csds(csds_addr).await;
            let mut sides = Vec::new();
            for (i, (name, channel, _)) in ours.iter().enumerate() {
                let mine = call(channel).await;
                let peer_calls = theirs[i].call().await;
                let (_, their_doc, _) = dump_csds(&theirs[i].csds).await;
                sides.push(Sides {
                    name: (*name).to_owned(),
                    mine,
                    theirs: peer_calls[target].as_str().unwrap().to_owned(),
                    my_view: look(&doc, name),
                    their_view: look(&their_doc, name),
                    my_errors: reported(&doc, name),
                    their_errors: reported(&their_doc, name),
                });
            }
            if sides.iter().all(Sides::agree) || Instant::now() > deadline {
                break sides;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for s in sides {
            let name = &s.name;
            println!(
                "{label} / {name}: tether {} {:?}\n{label} / {name}: C-core {} {:?}",
                s.mine, s.my_view, s.theirs, s.their_view
            );
            assert_eq!(s.mine, s.theirs, "{label} / {name}: calls");
            assert_eq!(s.my_view, s.their_view, "{label} / {name}: CSDS");
            assert_eq!(
                s.my_errors, s.their_errors,
                "{label} / {name}: reported errors"
            );
        }
    }
    // Every client has read its whole chain (endpoints come last).
    let clients = ours.len() + theirs.len();
    let deadline = Instant::now() + LIMIT;
    loop {
        let acked: std::collections::HashSet<usize> = f
            .requests()
            .iter()
            .filter(|r| {
                r.request.type_url == EDS
                    && !r.request.response_nonce.is_empty()
                    && r.request.error_detail.is_none()
            })
            .map(|r| r.stream)
            .collect();
        if acked.len() >= clients {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {clients} clients read their endpoints",
            acked.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stage("before", &ours, &mut theirs, &csds_addr, target).await;
    // A NACK of the cached cluster.
    let mut bad = make::cluster("good");
    bad.lb_policy = cpb::cluster::LbPolicy::RingHash as i32;
    bad.lb_config = Some(cpb::cluster::LbConfig::RingHashLbConfig(
        cpb::cluster::RingHashLbConfig {
            minimum_ring_size: Some(UInt64Value { value: 0 }),
            ..Default::default()
        },
    ));
    f.set_resources(CDS, vec![pack(&bad)]);
    f.until_answered(&f.push(CDS)).await;
    stage("cluster NACKed", &ours, &mut theirs, &csds_addr, target).await;
    f.set_resources(CDS, vec![pack(&make::cluster("good"))]);
    f.until_answered(&f.push(CDS)).await;
    stage("cluster fixed", &ours, &mut theirs, &csds_addr, target).await;
    // xRFC TP3: the server leaves the cluster out and reports NOT_FOUND for
    // it (and for a cluster nobody asked for). Without A88 the errors are
    // not read and this is a deletion; with A88 an error beside the cached
    // cluster, which fail_on_data_errors drops.
    f.set_resources(CDS, vec![]);
    f.set_errors(
        CDS,
        &[
            ("good", 5, "withdrawn for now"),
            ("unasked", 5, "never there"),
        ],
    );
    f.until_answered(&f.push(CDS)).await;
    stage(
        "cluster reported NOT_FOUND",
        &ours,
        &mut theirs,
        &csds_addr,
        target,
    )
    .await;
    // UNAVAILABLE for the route: kept everywhere, RECEIVED_ERROR with A88.
    f.set_resources(CDS, vec![pack(&make::cluster("good"))]);
    f.set_errors(CDS, &[]);
    let clusters = f.push(CDS);
    f.set_errors(RDS, &[("routes", 14, "route store is down")]);
    let routes = f.push(RDS);
    f.until_answered(&clusters).await;
    f.until_answered(&routes).await;
    stage(
        "route reported UNAVAILABLE",
        &ours,
        &mut theirs,
        &csds_addr,
        target,
    )
    .await;
    f.set_errors(RDS, &[]);
    // The listener removed.
    f.set_resources(LDS, vec![]);
    f.until_answered(&f.push(LDS)).await;
    stage("listener removed", &ours, &mut theirs, &csds_addr, target).await;
    for mut p in theirs {
        drop(p.child.stdin.take());
        let _ = p.child.wait().await;
    }
}

/// The resource timer beside grpcio 1.85: a listener the server never
/// sends is `does_not_exist` after 15 s without A88 (its
/// `resource_timer_is_transient_error` ignored), and with A88 and that
/// server feature `timeout` (a transient error) after the same 15 s:
/// grpcio 1.85 does not lengthen the timer to A88's 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resource_timer_as_c_core_runs_it_with_and_without_a88() {
    use tether::channel::Channel;
    let Ok(python) = tether_testkit::grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let f = Fixture::start(Mode::Serve).await;
    let target = "xds:///missing.example";
    let dir = TempDir::new("resource-timer");
    let started = Instant::now();
    let mut sides = Vec::new();
    for (name, a88) in [("timer-a88-off", false), ("timer-a88", true)] {
        let path = dir.0.join(format!("bootstrap-{name}.json"));
        std::fs::write(
            &path,
            format!(
                r#"{{"xds_servers":[{{"server_uri":"{}","channel_creds":[{{"type":"insecure"}}],"server_features":["xds_v3","resource_timer_is_transient_error"]}}],"node":{{"id":"{name}"}}}}"#,
                f.addr
            ),
        )
        .unwrap();
        let mut options = tether::xds::client::ClientOptions::default();
        options.data_error_handling = a88;
        let channel = Channel::builder()
            .bootstrap(tether::xds::Bootstrap::from_file(&path).unwrap())
            .xds_client_options(options)
            .connect(target)
            .unwrap();
        let peer = CcorePeer::start(&python, &path, &[target], a88).await;
        sides.push((name, channel, peer));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ours = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(tether::csds::service())
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let status = |doc: &Value, node: &str| -> String {
        doc["clients"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["node_id"] == node)
            .flat_map(|c| c["resources"].as_array().unwrap().iter())
            .find(|r| r["name"] == "missing.example")
            .map_or("absent".into(), |r| {
                r["status"].as_str().unwrap().to_owned()
            })
    };
    // (after, variant, status both must show)
    let checks = [(Duration::from_secs(20), "timer-a88-off", "does_not_exist")];
    for (after, variant, want) in checks {
        if let Some(wait) = after.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let (_, doc, _) = dump_csds(&ours).await;
        let side = sides.iter().find(|s| s.0 == variant).unwrap();
        let (_, theirs, _) = dump_csds(&side.2.csds).await;
        println!(
            "{variant} at {:?}: tether {}, C-core {}",
            started.elapsed(),
            status(&doc, variant),
            status(&theirs, variant)
        );
        assert_eq!(
            (status(&doc, variant), status(&theirs, variant)),
            (want.to_owned(), want.to_owned()),
            "{variant} after {after:?}"
        );
    }
    // The A88 side flips to timeout 15 s after it subscribed, on both.
    let side = sides.iter().find(|s| s.0 == "timer-a88").unwrap();
    let (mut mine_at, mut theirs_at) = (None, None);
    while started.elapsed() < Duration::from_secs(50) && (mine_at.is_none() || theirs_at.is_none())
    {
        let (_, doc, _) = dump_csds(&ours).await;
        let (_, theirs, _) = dump_csds(&side.2.csds).await;
        if mine_at.is_none() && status(&doc, "timer-a88") == "timeout" {
            mine_at = Some(started.elapsed());
        }
        if theirs_at.is_none() && status(&theirs, "timer-a88") == "timeout" {
            theirs_at = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("timeout reported: tether at {mine_at:?}, C-core at {theirs_at:?}");
    let (mine_at, theirs_at) = (
        mine_at.expect("tether never timed out"),
        theirs_at.expect("C-core never timed out"),
    );
    let gap = mine_at.abs_diff(theirs_at);
    assert!(
        gap < Duration::from_secs(3),
        "tether at {mine_at:?}, C-core at {theirs_at:?}"
    );
    for (_, _, mut peer) in sides {
        drop(peer.child.stdin.take());
        let _ = peer.child.wait().await;
    }
}
