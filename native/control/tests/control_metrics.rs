//! tether-control's `/metrics` (the admin listener, `--admin`), read by a
//! real Prometheus (Debian's `prometheus`, started here on 127.0.0.1 with a
//! one-second scrape): a proxyless client's stream, its ACKs, a NACK sent
//! by a raw ADS client, a rejected and a published file, and a DNS name's
//! addresses, each asked for with PromQL until Prometheus has scraped what
//! the test did.

mod control_support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use control_support::{Control, TempDir};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tether_testkit::client;
use tether_testkit::dns::DnsServer;
use tether_testkit::prometheus::Prometheus;
use tether_xds::bootstrap::Bootstrap;
use tether_xds::resource::ResourceKind;
use tether_xds::XdsClient;
use tokio::process::Command;

const NAME: &str = "api.metrics.test";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(30);

fn yaml(dns: SocketAddr, extra: &str) -> String {
    format!(
        r#"dns:
  servers: ["{dns}"]
  minRefresh: 0.1s
  timeout: 0.5s
services:
  - name: api
    endpoints:
      - address: {NAME}:9000
{extra}"#
    )
}

fn bootstrap(addr: SocketAddr, node: &str) -> Bootstrap {
    Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{addr}","channel_creds":[{{"type":"insecure"}}],"server_features":["xds_v3"]}}],"node":{{"id":"{node}"}}}}"#
    ))
    .unwrap()
}

/// The two ends of a raw ADS stream, held open.
type RawStream = (
    tokio::sync::mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>,
);

/// One CDS response to a raw ADS stream, NACKed; the stream stays open
/// while the caller holds it.
async fn nack_clusters(addr: SocketAddr) -> RawStream {
    let mut ads = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let node = envoy_types::pb::envoy::config::core::v3::Node {
        id: "nacker".into(),
        ..Default::default()
    };
    tx.send(DiscoveryRequest {
        node: Some(node),
        type_url: CDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut inbound = ads
        .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(WAIT, inbound.message())
        .await
        .expect("a CDS response")
        .unwrap()
        .unwrap();
    tx.send(DiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: first.nonce.clone(),
        error_detail: Some(RpcStatus {
            code: 3,
            message: "refused by the test".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    (tx, inbound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_clients_acks_nacks_reloads_and_dns_names() {
    tether_testkit::init_logging();
    let dns = DnsServer::start().await;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    dns.set(NAME, &[ip("127.0.0.2"), ip("127.0.0.3")]);
    let control = Control::start_with_admin(&yaml(dns.addr(), "")).await;
    let admin = control.admin.expect("admin address");

    // The page itself, before any client.
    let page = client::get(admin, "/metrics", &[]).await.unwrap();
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{:?}",
        page.headers
    );
    assert!(
        page.body.contains("tether_control_dns_addresses 2"),
        "{}",
        page.body
    );
    assert!(page.body.ends_with("# EOF\n"), "{}", page.body);
    assert_eq!(
        client::get(admin, "/nothing", &[]).await.unwrap().status,
        404
    );

    let prometheus = Prometheus::start(&[("tether-control", admin)]).await;
    let xds = XdsClient::start(bootstrap(control.addr, "metrics-client")).unwrap();
    // Its ACK of the endpoints shows in the metrics below.
    let api = xds.watch(ResourceKind::Endpoints, "api");
    let _nacker = nack_clusters(control.addr).await;

    prometheus
        .until(
            r#"tether_control_clients{node="metrics-client",kind="ads",flavor="proxyless"}"#,
            1.0,
        )
        .await;
    prometheus
        .until(
            r#"tether_control_acked_version{node="metrics-client",resource_type="endpoint"}"#,
            1.0,
        )
        .await;
    prometheus
        .until(
            r#"tether_control_nacks_total{resource_type="cluster"}"#,
            1.0,
        )
        .await;
    prometheus.until("tether_control_dns_addresses", 2.0).await;
    prometheus
        .until("tether_control_snapshot_version", 1.0)
        .await;

    // A file that does not validate, then a good one.
    control.write("services: [{ name: api, endpoints: [{ address: nonsense }] }]\n");
    prometheus
        .until(r#"tether_control_reloads_total{result="rejected"}"#, 1.0)
        .await;
    control.write(&yaml(
        dns.addr(),
        "  - name: more\n    endpoints:\n      - address: 127.0.0.1:9001\n",
    ));
    prometheus
        .until(r#"tether_control_reloads_total{result="published"}"#, 1.0)
        .await;
    prometheus
        .until("tether_control_snapshot_version", 2.0)
        .await;

    // An address leaves the name: DRAINING, counted.
    dns.set(NAME, &[ip("127.0.0.2")]);
    prometheus
        .until("tether_control_dns_draining_addresses", 1.0)
        .await;
    // The client leaves: its series go.
    drop(api);
    drop(xds);
    prometheus
        .until(
            r#"count(tether_control_clients{node="metrics-client"}) or vector(0)"#,
            0.0,
        )
        .await;
}

#[tokio::test]
async fn the_admin_listener_stays_on_loopback_unless_asked() {
    let dir = TempDir::new("admin-remote");
    let config = dir.0.join("tether.yaml");
    std::fs::write(&config, "services: []\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tether-control"))
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--admin", "0.0.0.0:0"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--admin 0.0.0.0:0") && err.contains("--admin-allow-remote"),
        "{err}"
    );
}
