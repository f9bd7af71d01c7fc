//! gRFC A78's XdsClient instruments from a channel's telemetry, read back
//! from the OpenTelemetry SDK's in-memory exporter, against the ADS test
//! fixture: resources received valid and invalid (a NACKed listener), the
//! cache states of the watched resources, and the server failing once it
//! is gone. (grpcio-observability 1.85 records none of A78's instruments,
//! so there is no C-core side to compare here.)

mod channel_support;
#[path = "channel_support/telemetry.rs"]
mod telemetry_support;
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::collections::BTreeMap;
use std::time::Duration;

use channel_support::*;
use telemetry_support::{Instrument, Recorder};
use tether::telemetry::OPTIONAL_METRICS;
use tether::{Channel, Telemetry};
use tether_testkit::grpc::GrpcBackend;
use xds_support::{Fixture, Mode, LDS};

/// The points of `name` as label value of `key` → value, where the other
/// labels are the channel's target and the fixture's server.
fn by(got: &BTreeMap<String, Instrument>, name: &str, key: &str) -> BTreeMap<String, u64> {
    let Some(i) = got.get(name) else {
        return BTreeMap::new();
    };
    i.points
        .iter()
        .map(|(labels, (n, _))| {
            let v = labels
                .iter()
                .find(|(k, _)| k == key)
                .map_or("", |(_, v)| v.as_str());
            (v.to_owned(), *n)
        })
        .collect()
}

/// Reads until `done` holds of what was recorded (bounded: 20 s).
async fn until(
    recorder: &Recorder,
    what: &str,
    done: impl Fn(&BTreeMap<String, Instrument>) -> bool,
) -> BTreeMap<String, Instrument> {
    let start = std::time::Instant::now();
    loop {
        let got = recorder.read();
        if done(&got) {
            return got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: {got:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_client_instruments_count_updates_nacks_cache_states_and_failures() {
    let backend = GrpcBackend::start("a").await;
    let f = Fixture::start(Mode::Serve).await;
    serve_one(&f, &[backend.addr()]);
    let recorder = Recorder::new();
    let mut telemetry = Telemetry::builder(&recorder.provider);
    for m in OPTIONAL_METRICS
        .iter()
        .filter(|m| m.starts_with("grpc.xds_client."))
    {
        telemetry = telemetry.enable_metric(m).unwrap();
    }
    let channel = Channel::builder()
        .bootstrap(xds_support::bootstrap(f.addr, NODE))
        .telemetry(telemetry.build())
        .connect(&format!("xds:///{TARGET}"))
        .unwrap();
    until_backend(&channel, "a").await;

    let server = format!("{}", f.addr);
    let got = recorder.read();
    let connected = &got["grpc.xds_client.connected"];
    assert_eq!(connected.unit, "{bool}");
    let labels = connected.points.keys().next().unwrap();
    assert_eq!(
        labels,
        &telemetry_support::labels(&[
            ("grpc.target", &format!("xds:///{TARGET}")),
            ("grpc.xds.server", &server)
        ])
    );
    assert_eq!(connected.points.values().next().unwrap().0, 1);
    let types = [
        "envoy.config.cluster.v3.Cluster",
        "envoy.config.endpoint.v3.ClusterLoadAssignment",
        "envoy.config.listener.v3.Listener",
        "envoy.config.route.v3.RouteConfiguration",
    ];
    let valid = by(
        &got,
        "grpc.xds_client.resource_updates_valid",
        "grpc.xds.resource_type",
    );
    assert_eq!(valid.keys().collect::<Vec<_>>(), types, "{valid:?}");
    assert!(valid.values().all(|n| *n >= 1), "{valid:?}");
    let invalid = by(
        &got,
        "grpc.xds_client.resource_updates_invalid",
        "grpc.xds.resource_type",
    );
    assert!(invalid.values().all(|n| *n == 0), "{invalid:?}");
    let states = by(&got, "grpc.xds_client.resources", "grpc.xds.cache_state");
    assert_eq!(
        states,
        BTreeMap::from([("acked".to_owned(), 1)]),
        "{got:#?}"
    );
    assert_eq!(got["grpc.xds_client.resources"].points.len(), 4);

    // A listener without an API listener: NACKed, the old one kept.
    let before = valid["envoy.config.listener.v3.Listener"];
    let invalid_listener = envoy_types::pb::envoy::config::listener::v3::Listener {
        name: TARGET.into(),
        ..Default::default()
    };
    f.set_resources(LDS, vec![tether::xds::resource::pack(&invalid_listener)]);
    f.push(LDS);
    // The count comes as the response is read, the cache state once the
    // watchers are told: wait for both.
    let got = until(&recorder, "the NACK counted and the state nacked", |got| {
        by(
            got,
            "grpc.xds_client.resource_updates_invalid",
            "grpc.xds.resource_type",
        )
        .get("envoy.config.listener.v3.Listener")
            == Some(&1)
            && by(got, "grpc.xds_client.resources", "grpc.xds.cache_state")
                .contains_key("nacked_but_cached")
    })
    .await;
    assert_eq!(
        by(
            &got,
            "grpc.xds_client.resource_updates_valid",
            "grpc.xds.resource_type"
        )["envoy.config.listener.v3.Listener"],
        before
    );
    let listener_state = got["grpc.xds_client.resources"]
        .points
        .iter()
        .find(|(l, _)| {
            l.contains(&(
                "grpc.xds.resource_type".to_owned(),
                "envoy.config.listener.v3.Listener".to_owned(),
            ))
        })
        .map(|(l, n)| (l.clone(), n.0))
        .unwrap();
    assert!(
        listener_state.0.contains(&(
            "grpc.xds.cache_state".to_owned(),
            "nacked_but_cached".to_owned()
        )) && listener_state
            .0
            .contains(&("grpc.xds.authority".to_owned(), "#old".to_owned()))
            && listener_state.1 == 1,
        "{listener_state:?}"
    );
    assert!(
        !got.contains_key("grpc.xds_client.server_failure") || {
            by(&got, "grpc.xds_client.server_failure", "grpc.xds.server")[&server] == 0
        }
    );

    // The server goes away: the stream that had responses ends, the next
    // cannot connect: one failure, no longer connected.
    f.kill();
    let got = until(&recorder, "the server failure counted", |got| {
        by(got, "grpc.xds_client.server_failure", "grpc.xds.server").get(&server) == Some(&1)
    })
    .await;
    assert_eq!(
        by(&got, "grpc.xds_client.connected", "grpc.xds.server")[&server],
        0
    );
}
