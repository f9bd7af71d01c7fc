//! The picker's load counting: each call, and the backend metrics of its
//! trailers (gRFC A85) when the cluster propagates them.

use std::collections::HashMap;

use super::*;
use crate::lb::{round_robin, CallAttributes, Pick, PickArgs, PickResult, Picker, Subchannel};
use crate::lb::{SharedPicker, SubchannelPool};
use crate::orca::{trailer_value, OrcaLoadReport, PER_CALL_TRAILER};
use crate::subchannel::SubchannelOptions;
use crate::xds::load_report::LoadStore;

/// A child that picks one subchannel.
#[derive(Debug)]
struct Always(Subchannel);

impl Picker for Always {
    fn pick(&self, _args: &PickArgs<'_>) -> PickResult {
        PickResult::Complete(Pick::by("test", self.0.clone()))
    }
}

/// A picker over one endpoint of a cluster reporting to `handle`.
fn picker(handle: &LoadHandle) -> ClusterImplPicker {
    let pool = SubchannelPool::new(SubchannelOptions::default(), Arc::new(|_, _, _| {}));
    let address: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let config = Config {
        cluster: "echo".into(),
        eds_service_name: None,
        max_requests: 1024,
        drops: Vec::new(),
        load: Some(handle.clone()),
        localities: [(address, LocalityName::default())].into(),
        child: Box::new(LbConfig::RoundRobin(round_robin::Config::default())),
    };
    let child: SharedPicker = Arc::new(Always(pool.get(address)));
    ClusterImplPicker::new(&config, Arc::new(AtomicU64::new(0)), child)
}

/// One call, ended OK with `trailers`.
fn call(picker: &ClusterImplPicker, trailers: Option<&http::HeaderMap>) {
    let headers = http::HeaderMap::new();
    let attributes = CallAttributes::default();
    let args = PickArgs {
        path: "/test.Echo/Echo",
        headers: &headers,
        attributes: &attributes,
    };
    let PickResult::Complete(pick) = picker.pick(&args) else {
        panic!("expected a completed pick");
    };
    pick.trackers.finished_with_trailers(true, trailers);
}

/// Trailers carrying a per-call ORCA report.
fn orca_trailers(cpu: f64, named: &[(&str, f64)]) -> http::HeaderMap {
    let report = OrcaLoadReport {
        cpu_utilization: cpu,
        mem_utilization: 0.9,
        named_metrics: named
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect::<HashMap<_, _>>(),
        ..Default::default()
    };
    let mut trailers = http::HeaderMap::new();
    trailers.insert(PER_CALL_TRAILER, trailer_value(&report));
    trailers
}

#[tokio::test]
async fn a_calls_orca_trailers_are_summed_into_the_report() {
    let store = LoadStore::new();
    let handle = LoadHandle::new(
        store.cluster("echo", None),
        BackendMetricPropagation::from_names(["cpu_utilization", "named_metrics.queue"]),
    );
    let picker = picker(&handle);
    call(
        &picker,
        Some(&orca_trailers(0.5, &[("queue", 3.0), ("other", 1.0)])),
    );
    call(&picker, Some(&orca_trailers(0.25, &[("queue", 1.0)])));
    // No trailers, or trailers without a report: counted, no metric.
    call(&picker, None);
    call(&picker, Some(&http::HeaderMap::new()));

    let report = handle.load.take_report(true);
    let l = &report.upstream_locality_stats[0];
    assert_eq!(l.total_successful_requests, 4);
    let cpu = l.cpu_utilization.unwrap();
    assert_eq!(
        (
            cpu.num_requests_finished_with_metric,
            cpu.total_metric_value
        ),
        (2, 0.75)
    );
    assert_eq!(l.mem_utilization, None, "not propagated");
    let named: Vec<(&str, u64, f64)> = l
        .load_metric_stats
        .iter()
        .map(|m| {
            (
                m.metric_name.as_str(),
                m.num_requests_finished_with_metric,
                m.total_metric_value,
            )
        })
        .collect();
    assert_eq!(named, [("named_metrics.queue", 2, 4.0)]);
    assert_eq!(
        l.upstream_endpoint_stats[0].load_metric_stats, l.load_metric_stats,
        "per endpoint too"
    );
}

#[tokio::test]
async fn a_cluster_that_propagates_nothing_ignores_the_trailers() {
    let store = LoadStore::new();
    let handle = LoadHandle::new(
        store.cluster("echo", None),
        BackendMetricPropagation::default(),
    );
    let picker = picker(&handle);
    call(&picker, Some(&orca_trailers(0.5, &[("queue", 3.0)])));
    let report = handle.load.take_report(true);
    let l = &report.upstream_locality_stats[0];
    assert_eq!(l.total_successful_requests, 1);
    assert_eq!(l.cpu_utilization, None);
    assert!(l.load_metric_stats.is_empty());
}
