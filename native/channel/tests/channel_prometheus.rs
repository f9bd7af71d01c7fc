//! The `prometheus_metrics` example scraped by a real Prometheus (Debian's
//! `prometheus`, one-second scrapes on 127.0.0.1): the example's channels
//! call real tonic backends (a session pinned to one of two, and a target
//! where nothing listens), and PromQL returns the calls by status, the
//! attempts, the session calls the example made and the session it keeps
//! pinned.

use std::process::Stdio;
use std::time::Duration;

use tether_testkit::grpc::GrpcBackend;
use tether_testkit::prometheus::Prometheus;
use tether_testkit::{free_port, workspace_example};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_example_programs_grpc_and_session_metrics() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let nobody = format!("127.0.0.1:{}", free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let serving = format!("ipv4:{},{}", a.addr(), b.addr());
    let refused = format!("ipv4:{nobody}");
    let mut example = Command::new(workspace_example("tether", "prometheus_metrics"))
        .args(["--listen", &listen, "--calls", "4", &serving, &refused])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the example");
    // Its calls are over when it says so.
    let mut lines = BufReader::new(example.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    let done = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let last = line.starts_with("calls done");
            said.push(line);
            if last {
                return;
            }
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "the example did not finish its calls: {said:?}"
    );
    assert_eq!(
        said.iter().filter(|l| l.contains("Unavailable")).count(),
        4,
        "{said:?}"
    );

    let prometheus = Prometheus::start(&[("example", listen.parse().unwrap())]).await;
    let calls = |target: &str, status: &str| {
        format!(
            "sum(grpc_client_call_duration_seconds_count{{grpc_target=\"{target}\",grpc_status=\"{status}\"}})"
        )
    };
    prometheus.until(&calls(&serving, "OK"), 4.0).await;
    prometheus.until(&calls(&refused, "UNAVAILABLE"), 4.0).await;
    prometheus
        .until(
            &format!("sum(grpc_client_attempt_started_total{{grpc_target=\"{serving}\"}})"),
            4.0,
        )
        .await;
    // The session: one new, then pinned.
    for (call, n) in [("new", 1.0), ("pinned", 3.0)] {
        prometheus
            .until(
                &format!(
                    "sum(tether_client_session_calls_total{{tether_session_call=\"{call}\"}})"
                ),
                n,
            )
            .await;
    }
    prometheus
        .until(
            "sum(tether_client_session_cookies_total{tether_session_cookie=\"new\"})",
            1.0,
        )
        .await;
    // The session stays pinned to one endpoint of the two (static
    // endpoints have no EDS health: UNKNOWN, as gRPC reads them).
    prometheus
        .until(
            &format!(
                "count(tether_client_sessions{{grpc_target=\"{serving}\",tether_endpoint_health=\"UNKNOWN\"}} == 1)"
            ),
            1.0,
        )
        .await;
    let _ = example.start_kill();
}
