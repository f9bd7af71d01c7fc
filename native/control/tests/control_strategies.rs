//! The `WeightedRoundRobin`, `PickFirst` and `Custom` strategies against a
//! real Envoy 1.40 bootstrapped with only an ADS cluster pointing at the
//! `tether-control` binary: Envoy ACKs the clusters (the weighted round
//! robin one with Envoy's `client_side_weighted_round_robin` policy; pick
//! first and custom as round robin, since Envoy has neither) and every
//! route reaches the backends.

mod control_support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use control_support::Control;
use tether_testkit::backend::HttpBackend;
use tether_testkit::client;
use tether_testkit::envoy::{ads_bootstrap, Envoy};
use tether_testkit::free_port;

fn config(listen: u16, backends: &[SocketAddr]) -> String {
    let endpoints: String = backends
        .iter()
        .map(|a| format!("      - address: {a}\n"))
        .collect();
    format!(
        r#"listener:
  port: {listen}
virtualhosts:
  - name: web
    domains: ["*"]
    routes:
      - conditions: [{{ prefix: /wrr }}]
        services: [{{ name: web }}]
        loadBalancerPolicy:
          strategy: WeightedRoundRobin
          weightedRoundRobin:
            blackoutPeriod: 1s
            weightUpdatePeriod: 0.5s
            errorUtilizationPenalty: 0.5
      - conditions: [{{ prefix: /pf }}]
        services: [{{ name: web }}]
        loadBalancerPolicy:
          strategy: PickFirst
          shuffleAddressList: true
      - conditions: [{{ prefix: /custom }}]
        services: [{{ name: web }}]
        loadBalancerPolicy:
          strategy: Custom
          custom: {{ policy: example.fewest_failures, config: {{ threshold: 0.5 }} }}
services:
  - name: web
    endpoints:
{endpoints}"#
    )
}

/// The backend that answered `path` through Envoy, if one did.
async fn backend_of(listener: SocketAddr, path: &str) -> Option<String> {
    let r = client::get(listener, path, &[]).await.ok()?;
    if r.status != 200 {
        return None;
    }
    r.header("x-backend").map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_acks_and_routes_the_new_strategies() {
    let b1 = HttpBackend::start("b1").await;
    let b2 = HttpBackend::start("b2").await;
    let port = free_port();
    let listener: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let control = Control::start(&config(port, &[b1.addr(), b2.addr()])).await;
    let envoy = Envoy::start(&ads_bootstrap(control.addr, "envoy-strategies"))
        .await
        .expect("envoy starts");
    let logs = |envoy: &Envoy| {
        format!(
            "--- tether-control:\n{}\n--- envoy:\n{}",
            control.stderr(),
            envoy.log()
        )
    };
    let up = tether_testkit::wait_until(Duration::from_secs(20), || async {
        backend_of(listener, "/wrr").await.is_some()
    })
    .await;
    assert!(up, "Envoy did not serve /wrr\n{}", logs(&envoy));

    // Every cluster ACKed and active, the weighted round robin one with
    // Envoy's own policy.
    let dump = envoy.admin_get("/config_dump").await.unwrap();
    for needle in [
        "\"web/weighted-round-robin\"",
        "\"web/pick-first\"",
        "\"web/custom\"",
        "envoy.load_balancing_policies.client_side_weighted_round_robin",
    ] {
        assert!(
            dump.contains(needle),
            "{needle} missing from Envoy's config dump\n{}",
            logs(&envoy)
        );
    }
    assert!(
        !dump.contains("dynamic_warming_clusters"),
        "clusters still warming\n{}",
        logs(&envoy)
    );
    assert_eq!(
        envoy.stat("cluster_manager.cds.update_rejected").await,
        Some(0),
        "{}",
        logs(&envoy)
    );
    assert!(control.nacks_none(), "{}", logs(&envoy));

    // Each route reaches the backends. Without load reports weighted round
    // robin weighs all endpoints alike; Envoy's pick first and custom
    // clusters are round robin.
    let both = BTreeSet::from(["b1".to_owned(), "b2".to_owned()]);
    for path in ["/wrr", "/pf", "/custom"] {
        let mut seen = BTreeSet::new();
        for _ in 0..20 {
            let b = backend_of(listener, path)
                .await
                .unwrap_or_else(|| panic!("{path} not served\n{}", logs(&envoy)));
            seen.insert(b);
        }
        assert_eq!(seen, both, "{path}");
    }
    assert!(control.nacks_none(), "{}", logs(&envoy));
}
