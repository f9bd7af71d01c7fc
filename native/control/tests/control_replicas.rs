//! Two tether-control replicas serving one file, as people run control
//! planes for availability, with a gRPC C-core (grpcio) client on each:
//! each replica's `GET /drain` covers its own clients only, and
//! `tether-control drain status` given both admin listeners merges them:
//! busy while either replica's client uses the DRAINING endpoint, idle (it
//! can be stopped) only once both are idle, unknown when a replica does not
//! answer.

mod control_support;

use std::net::SocketAddr;

use std::time::{Duration, Instant};

use control_support::{control_binary, echo_drain_yaml, grpcio_client, Control, TempDir};
use tether_testkit::grpc::GrpcBackend;

/// `tether-control drain status` over `replicas`: exit code and stdout.
async fn drain_status(replicas: &[&Control], json: bool) -> (i32, String) {
    let mut args = vec!["drain".to_owned(), "status".to_owned()];
    for r in replicas {
        args.push("--admin".into());
        args.push(r.admin.expect("started with --admin").to_string());
    }
    if json {
        args.push("--json".into());
    }
    let out = tokio::process::Command::new(control_binary())
        .args(&args)
        .output()
        .await
        .expect("run tether-control drain status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The merged JSON's entry for `address`, once `want` holds (30 s at most).
async fn until_merged(
    replicas: &[&Control],
    address: SocketAddr,
    what: &str,
    want: impl Fn(i32, &serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let (code, out) = drain_status(replicas, true).await;
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let entry = doc["endpoints"]
            .as_array()
            .and_then(|l| l.iter().find(|e| e["address"] == address.to_string()))
            .cloned()
            .unwrap_or_default();
        if want(code, &entry) {
            return entry;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: exit {code}, {out}"
        );
        // Reports come every 0.5 s.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET /status` of `replica` once `want` holds (30 s at most).
async fn until_status(
    replica: &Control,
    what: &str,
    want: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let status = tether_testkit::client::get(replica.admin.unwrap(), "/status", &[])
            .await
            .map(|p| p.json())
            .unwrap_or_default();
        if want(&status) {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The endpoint `address` of the cluster `echo` in a `GET /status`.
fn endpoint_of(status: &serde_json::Value, address: SocketAddr) -> serde_json::Value {
    status["clusters"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == "echo"))
        .and_then(|c| c["endpoints"].as_array())
        .and_then(|l| l.iter().find(|e| e["address"] == address.to_string()))
        .cloned()
        .unwrap_or_default()
}

fn nodes(status: &serde_json::Value) -> Vec<String> {
    status["clients"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|c| c["node"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_status_merges_replicas_that_each_know_their_own_clients() {
    let echo1 = GrpcBackend::start("echo-1").await;
    let echo2 = GrpcBackend::start("echo-2").await;
    let (a1, a2) = (echo1.addr(), echo2.addr());
    // echo-2 drains in a locality of its own: C-core reports per locality.
    let yaml = echo_drain_yaml(a1, "us/a", a2, "us/b");
    let replica_a = Control::start_with_admin(&yaml).await;
    let mut replica_b = Control::start_with_admin(&yaml).await;
    let (dir_a, dir_b) = (TempDir::new("replica-a"), TempDir::new("replica-b"));
    let client_a = grpcio_client(&dir_a.bootstrap(&replica_a.bootstrap_json("core-on-a"))).await;
    let client_b = grpcio_client(&dir_b.bootstrap(&replica_b.bootstrap_json("core-on-b"))).await;

    // On A, a session pinned to echo-2 calls it for 6 s (A55 keeps it
    // there while it drains); on B, new sessions, which avoid echo-2.
    let mut pinned = tether_core::cookie::SessionCookie::new(tether_core::AddressList::one(a2));
    pinned.cluster = Some("echo/session".to_owned());
    let value = tether_core::cookie::encode(&pinned, tether_core::Format::Grpc, None).unwrap();
    let cookie = format!("grpc-session={value}");
    let pinned_calls = {
        let args: Vec<String> = ["--pace", "100", "xds:///echo.tether.test", "60", &cookie]
            .iter()
            .map(|s| s.to_string())
            .collect();
        tokio::spawn(async move { client_a.run(&args, None).await })
    };
    let other_calls = {
        let args: Vec<String> = ["--pace", "100", "xds:///echo.tether.test", "60"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        tokio::spawn(async move { client_b.run(&args, None).await })
    };

    // Each replica's status covers the client connected to it, not the other's.
    let on_a = replica_a
        .until_drain(a2, "A's client uses echo-2", |e| e["verdict"] == "busy")
        .await;
    assert_eq!(nodes(&on_a), ["core-on-a"], "{on_a}");
    // The status page's JSON on A: every endpoint of echo, echo-2 DRAINING
    // with its verdict and A's client's figures (per locality: C-core's).
    let status = until_status(&replica_a, "A's client's load on echo-2", |s| {
        endpoint_of(s, a2)["load"][0]["requests"].as_u64() > Some(0)
    })
    .await;
    let e2 = endpoint_of(&status, a2);
    assert_eq!(e2["health"], "DRAINING", "{status}");
    assert_eq!(e2["drain"]["verdict"], "busy", "{status}");
    assert_eq!(e2["locality"], "us/b/", "{status}");
    assert_eq!(e2["load"][0]["node"], "core-on-a", "{status}");
    assert_eq!(e2["load"][0]["granularity"], "locality", "{status}");
    let e1 = endpoint_of(&status, a1);
    assert_eq!(e1["health"], "HEALTHY", "{status}");
    assert!(e1["drain"].is_null(), "{status}");
    let clients = status["clients"].as_array().expect("clients");
    assert_eq!(clients.len(), 1, "{status}");
    assert_eq!(clients[0]["node"], "core-on-a", "{status}");
    assert_eq!(
        clients[0]["streams"],
        serde_json::json!(["ADS", "LRS"]),
        "{status}"
    );
    assert_eq!(clients[0]["holds"], serde_json::json!(["echo"]), "{status}");
    assert_eq!(
        clients[0]["reports"],
        serde_json::json!(["echo"]),
        "{status}"
    );
    // The page itself: one HTML file that loads nothing from elsewhere.
    let page = tether_testkit::client::get(replica_a.admin.unwrap(), "/", &[])
        .await
        .expect("GET /");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("fetch(\"/status\""), "{}", page.body);
    assert!(!page.body.contains("http://") && !page.body.contains("https://"));

    let on_b = replica_b
        .until_drain(a2, "B's client reported", |e| {
            e["clients"][0]["state"] == "idle"
        })
        .await;
    assert_eq!(nodes(&on_b), ["core-on-b"], "{on_b}");
    assert_eq!(on_b["verdict"], "idle", "{on_b}");
    // And says so.
    for replica in [&replica_a, &replica_b] {
        let page = tether_testkit::client::get(replica.admin.unwrap(), "/drain", &[])
            .await
            .expect("GET /drain")
            .json();
        assert_eq!(
            page["scope"], "the clients connected to this tether-control replica",
            "{page}"
        );
        assert_eq!(page["clients_connected"], 1, "{page}");
    }

    // Merged: busy, naming A's client, not to be stopped.
    let busy = until_merged(&[&replica_a, &replica_b], a2, "merged busy", |code, e| {
        code == 0 && e["verdict"] == "busy"
    })
    .await;
    assert_eq!(busy["can_stop"], false, "{busy}");
    let reason = busy["reason"].as_str().unwrap_or("");
    assert!(reason.contains("core-on-a (on "), "{busy}");
    let mut both = nodes(&busy);
    both.sort();
    assert_eq!(both, ["core-on-a", "core-on-b"], "{busy}");
    let (code, table) = drain_status(&[&replica_a, &replica_b], false).await;
    assert_eq!(code, 0, "{table}");
    let admin_a = replica_a.admin.unwrap();
    assert!(
        table.contains(&format!("core-on-a via {admin_a}: busy")),
        "{table}"
    );
    assert!(table.contains("do not stop it yet"), "{table}");

    // Both clients done (their streams end): idle on both, so it can go.
    let pinned_calls = pinned_calls
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        pinned_calls.iter().all(|c| c.backend == "echo-2"),
        "{pinned_calls:?}"
    );
    let other_calls = other_calls.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        other_calls.iter().all(|c| c.backend == "echo-1"),
        "{other_calls:?}"
    );
    let idle = until_merged(&[&replica_a, &replica_b], a2, "merged idle", |code, e| {
        code == 0 && e["verdict"] == "idle"
    })
    .await;
    assert_eq!(idle["can_stop"], true, "{idle}");
    let (_, table) = drain_status(&[&replica_a, &replica_b], false).await;
    assert!(table.contains("it can be stopped"), "{table}");

    // A replica that does not answer: unknown, and the command says so.
    replica_b.kill().await;
    let unknown = until_merged(&[&replica_a, &replica_b], a2, "B gone", |code, e| {
        code == 1 && e["verdict"] == "unknown"
    })
    .await;
    assert_eq!(unknown["can_stop"], false, "{unknown}");
    let (code, table) = drain_status(&[&replica_a, &replica_b], false).await;
    assert_eq!(code, 1);
    assert!(table.contains("did not answer"), "{table}");
}
