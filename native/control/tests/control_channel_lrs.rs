//! tether::Channel reporting load (LRS, gRFC A27) to tether-control: a
//! cluster with `lrs_server: self` (a service with `loadReporting`) gets an
//! LRS stream on the ADS connection; the channel reports per locality and,
//! as tether-control asks, per endpoint. A session pinned by its cookie to a
//! DRAINING endpoint makes the drain verdict `busy` with the channel named,
//! and `idle` once its calls stop while the channel stays connected.

mod control_support;

use std::time::Duration;

use control_support::{echo_drain_yaml, echo_with_cookie, session_cookie, Control, TempDir};
use tether_testkit::grpc::GrpcBackend;
use tether_testkit::prometheus::Prometheus;

/// One Echo call with `cookie`; the backend that answered.
async fn call(channel: &tether::Channel, cookie: &str) -> String {
    echo_with_cookie(channel, cookie)
        .await
        .unwrap_or_else(|e| panic!("call with {cookie}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_reports_load_so_a_draining_endpoint_turns_busy_then_idle() {
    let echo1 = GrpcBackend::start("echo-1").await;
    let echo2 = GrpcBackend::start("echo-2").await;
    let (a1, a2) = (echo1.addr(), echo2.addr());
    let yaml = echo_drain_yaml(a1, "us/a", a2, "us/a");
    let control = Control::start_with_admin(&yaml).await;
    let dir = TempDir::new("channel-lrs");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("tether-channel"));
    let channel = tether::Channel::builder()
        .bootstrap(tether_xds::Bootstrap::from_file(&bootstrap).unwrap())
        .connect("xds:///echo.tether.test")
        .unwrap();

    // A session pinned to echo-2, calling: busy, named, per endpoint (both
    // endpoints share a locality: only per-endpoint figures can tell).
    let on_2 = session_cookie(a2);
    let calling = {
        let channel = channel.clone();
        let cookie = on_2.clone();
        tokio::spawn(async move {
            let mut backends = Vec::new();
            for _ in 0..40 {
                backends.push(call(&channel, &cookie).await);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            backends
        })
    };
    let busy = control
        .until_drain(a2, "the channel's session on echo-2", |e| {
            e["verdict"] == "busy"
        })
        .await;
    let me = &busy["clients"][0];
    assert_eq!(me["node"], "tether-channel", "{busy}");
    assert_eq!(me["state"], "busy", "{busy}");
    assert_eq!(me["granularity"], "endpoint", "{busy}");
    assert!(me["requests"].as_u64() > Some(0), "{busy}");
    let backends = calling.await.unwrap();
    assert!(backends.iter().all(|b| b == "echo-2"), "{backends:?}");

    // Its calls stop; the channel stays connected and says so (one
    // all-zero report, as C-core), so echo-2 turns idle with it listed.
    let idle = control
        .until_drain(a2, "the channel's calls stopped", |e| {
            e["verdict"] == "idle"
        })
        .await;
    assert_eq!(idle["clients"][0]["node"], "tether-channel", "{idle}");
    assert_eq!(idle["clients"][0]["state"], "idle", "{idle}");

    // The status page's figures: echo-1's calls, per endpoint.
    let status = tether_testkit::client::get(control.admin.unwrap(), "/status", &[])
        .await
        .unwrap()
        .json();
    let clients = status["clients"].as_array().unwrap();
    assert_eq!(clients[0]["node"], "tether-channel", "{status}");
    assert_eq!(
        clients[0]["reports"],
        serde_json::json!(["echo"]),
        "{status}"
    );
}

/// The channel's `tether.sessions` metric: a session pinned to a DRAINING
/// endpoint is reported per endpoint as the sessions there, which the
/// drain status shows for the channel; with no calls left the endpoint
/// turns idle while the session stays counted (within its idle timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_reports_the_sessions_pinned_to_a_draining_endpoint() {
    let echo1 = GrpcBackend::start("echo-1").await;
    let echo2 = GrpcBackend::start("echo-2").await;
    let (a1, a2) = (echo1.addr(), echo2.addr());
    let yaml = echo_drain_yaml(a1, "us/a", a2, "us/a");
    let control = Control::start_with_admin(&yaml).await;
    let dir = TempDir::new("channel-lrs-sessions");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("tether-channel"));
    let channel = tether::Channel::builder()
        .bootstrap(tether_xds::Bootstrap::from_file(&bootstrap).unwrap())
        .connect("xds:///echo.tether.test")
        .unwrap();

    // One call pins one session to echo-2.
    assert_eq!(call(&channel, &session_cookie(a2)).await, "echo-2");
    let pinned = control
        .until_drain(a2, "the channel's session on echo-2 reported", |e| {
            e["clients"][0]["sessions"] == 1
        })
        .await;
    assert_eq!(pinned["clients"][0]["node"], "tether-channel", "{pinned}");
    assert_eq!(pinned["clients"][0]["granularity"], "endpoint", "{pinned}");

    // No more calls: idle, the session still shown.
    let idle = control
        .until_drain(a2, "the channel's calls stopped", |e| {
            e["verdict"] == "idle"
        })
        .await;
    assert_eq!(idle["clients"][0]["sessions"], 1, "{idle}");

    // What an operator's Prometheus sees: the session on the DRAINING
    // endpoint, and the drain idle.
    let prometheus =
        Prometheus::start(&[("tether-control", control.admin.expect("an admin listener"))]).await;
    prometheus
        .until(
            &format!("sum(tether_control_draining_sessions{{address=\"{a2}\",service=\"echo\"}})"),
            1.0,
        )
        .await;
    prometheus
        .until("tether_control_draining_endpoints{verdict=\"idle\"}", 1.0)
        .await;
    prometheus
        .until("tether_control_draining_endpoints{verdict=\"busy\"}", 0.0)
        .await;
}
