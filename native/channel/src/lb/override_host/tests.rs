//! The idle sweep on a paused clock, with a real pool (the subchannel's
//! address refuses connections; nothing here needs one to succeed).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::lb::round_robin;
use crate::lb::test_harness::{self, refused};

type Harness = test_harness::Harness<OverrideHost>;

fn config(addr: SocketAddr) -> LbConfig {
    LbConfig::OverrideHost(Config {
        override_host_status: HealthSet::default_override(),
        idle_timeout: Duration::from_secs(60),
        endpoints: vec![EndpointAddresses {
            addresses: vec![addr],
            weight: 1,
            health: HealthStatus::Draining,
        }],
        load: None,
        child: Box::new(LbConfig::RoundRobin(round_robin::Config::default())),
    })
}

#[tokio::test(start_paused = true)]
async fn the_sweep_keeps_a_used_subchannel_and_lets_go_one_idle_timeout_after_its_last_use() {
    let a = refused();
    let mut h = Harness::new(OverrideHost::new());
    let start = Instant::now();
    h.with(|p, ctx| p.update(ctx, config(a)));
    // A session needs the DRAINING endpoint: the policy makes and owns it.
    h.with(|p, ctx| p.event(ctx, &Event::SessionConnect(a)));
    assert!(h.pool.peek(a).is_some());
    // A session uses it at +30 s.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let entry = h.policy.map[&a].clone();
    entry
        .last_used_ms
        .store(h.policy.clock.now_ms(), Ordering::Relaxed);
    // First sweep idle_timeout after the first update: used 30 s ago, kept;
    // the next one when it would expire.
    let first = h.next_timer().await;
    assert_eq!(first - start, Duration::from_secs(60));
    assert!(
        h.pool.peek(a).is_some(),
        "a subchannel used 30 s ago is kept"
    );
    let second = h.next_timer().await;
    assert_eq!(second - start, Duration::from_secs(90));
    assert!(
        h.pool.peek(a).is_none(),
        "released one idle_timeout after its last use"
    );
    assert!(!entry.owned.load(Ordering::Relaxed));
    // Nothing owned: the next sweep is an idle_timeout later.
    let third = h.next_timer().await;
    assert_eq!(third - second, Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn sweeps_are_at_least_5_s_apart_and_none_runs_with_an_empty_map() {
    let a = refused();
    let mut h = Harness::new(OverrideHost::new());
    let start = Instant::now();
    h.with(|p, ctx| p.update(ctx, config(a)));
    h.with(|p, ctx| p.event(ctx, &Event::SessionConnect(a)));
    // Used at +1 s: at the first sweep (+60 s) it would expire 1 s later,
    // but sweeps are at least 5 s apart.
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.policy.map[&a]
        .last_used_ms
        .store(h.policy.clock.now_ms(), Ordering::Relaxed);
    let first = h.next_timer().await;
    assert_eq!(first - start, Duration::from_secs(60));
    let second = h.next_timer().await;
    assert_eq!(second - first, MIN_SWEEP_INTERVAL);
    // An update that empties the map: no sweep is armed after this one.
    h.with(|p, ctx| {
        p.update(
            ctx,
            LbConfig::OverrideHost(Config {
                override_host_status: HealthSet::default_override(),
                idle_timeout: Duration::from_secs(60),
                endpoints: Vec::new(),
                load: None,
                child: Box::new(LbConfig::RoundRobin(round_robin::Config::default())),
            }),
        )
    });
    assert!(h.policy.sweep.is_none(), "no sweep with an empty map");
}

fn config_of(addrs: &[SocketAddr]) -> LbConfig {
    LbConfig::OverrideHost(Config {
        override_host_status: HealthSet::default_override(),
        idle_timeout: Duration::from_secs(60),
        endpoints: addrs
            .iter()
            .map(|a| EndpointAddresses {
                addresses: vec![*a],
                weight: 1,
                health: HealthStatus::Healthy,
            })
            .collect(),
        load: None,
        child: Box::new(LbConfig::RoundRobin(round_robin::Config::default())),
    })
}

impl Harness {
    /// A session uses `addr` now: the policy owns its subchannel.
    fn use_now(&mut self, addr: SocketAddr) {
        self.with(|p, ctx| p.event(ctx, &Event::SessionConnect(addr)));
        self.policy.map[&addr]
            .last_used_ms
            .store(self.policy.clock.now_ms(), Ordering::Relaxed);
    }

    fn sweep_due(&self) -> Duration {
        let t = self.policy.sweep.as_ref().expect("a sweep is armed");
        t.deadline() - Instant::now()
    }
}

/// INTEROP.md section 4's timer vector for C-core's idle sweep
/// (idle_timeout 60 s): 60 s after the first update; 55 s after an update
/// at +5 s (a session used an address at 0 s); a sweep that finds one
/// expiring in 1 s re-arms 5 s; then 55 s for an address used at the
/// sweep before.
#[tokio::test(start_paused = true)]
async fn the_sweep_timers_follow_c_cores_vector() {
    let (a, b, c) = (refused(), refused(), refused());
    let mut h = Harness::new(OverrideHost::new());
    let start = Instant::now();
    h.with(|p, ctx| p.update(ctx, config_of(&[a, b, c])));
    assert_eq!(h.sweep_due(), Duration::from_secs(60));
    h.use_now(a);
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.use_now(b);
    tokio::time::sleep(Duration::from_secs(4)).await;
    h.with(|p, ctx| p.update(ctx, config_of(&[a, b, c])));
    assert_eq!(
        h.sweep_due(),
        Duration::from_secs(55),
        "re-armed by the update"
    );
    let first = h.next_timer().await;
    assert_eq!(first - start, Duration::from_secs(60));
    assert!(h.pool.peek(a).is_none(), "a, unused for 60 s, released");
    assert!(h.pool.peek(b).is_some(), "b, used 59 s ago, kept");
    assert_eq!(h.sweep_due(), MIN_SWEEP_INTERVAL, "b expires in 1 s: 5 s");
    h.use_now(c);
    let second = h.next_timer().await;
    assert_eq!(second - start, Duration::from_secs(65));
    assert!(h.pool.peek(b).is_none(), "b released at its turn");
    assert!(h.pool.peek(c).is_some());
    assert_eq!(h.sweep_due(), Duration::from_secs(55), "c, used 5 s ago");
    let third = h.next_timer().await;
    assert_eq!(third - start, Duration::from_secs(120));
    assert!(h.pool.peek(c).is_none());
    assert_eq!(
        h.sweep_due(),
        Duration::from_secs(60),
        "nothing used: idle_timeout"
    );
}

/// C-core re-arms the sweep on every update, from the update: an update at
/// +5 s with nothing used moves the sweep from +60 s to +65 s.
#[tokio::test(start_paused = true)]
async fn an_update_re_arms_the_sweep_from_the_update() {
    let a = refused();
    let mut h = Harness::new(OverrideHost::new());
    let start = Instant::now();
    h.with(|p, ctx| p.update(ctx, config_of(&[a])));
    tokio::time::sleep(Duration::from_secs(5)).await;
    h.with(|p, ctx| p.update(ctx, config_of(&[a])));
    let fired = h.next_timer().await;
    assert_eq!(fired - start, Duration::from_secs(65));
}

/// An update costs what changed: an address whose endpoint is unchanged
/// keeps its entry (sessions and all, nothing copied); one whose health
/// changed gets a new entry that shares the same session ledger.
#[tokio::test(start_paused = true)]
async fn updates_keep_unchanged_entries_and_never_copy_session_ledgers() {
    let a = refused();
    let mut h = Harness::new(OverrideHost::new());
    h.with(|p, ctx| p.update(ctx, config(a)));
    let first = h.policy.map[&a].clone();
    first.record_session(7, h.policy.clock.now_ms());
    // The same endpoint again: the same entry.
    h.with(|p, ctx| p.update(ctx, config(a)));
    assert!(Arc::ptr_eq(&first, &h.policy.map[&a]));
    // Its health changes (DRAINING -> HEALTHY): a new entry, the same ledger.
    let mut healthy = config(a);
    if let LbConfig::OverrideHost(c) = &mut healthy {
        c.endpoints[0].health = HealthStatus::Healthy;
    }
    h.with(|p, ctx| p.update(ctx, healthy));
    let second = h.policy.map[&a].clone();
    assert!(!Arc::ptr_eq(&first, &second));
    assert_eq!(second.health, HealthStatus::Healthy);
    assert!(Arc::ptr_eq(&first.ledger, &second.ledger));
    assert_eq!(second.sessions().map(|s| s.len()), Some(1));
}

/// A cluster that reports load counts its sessions in the reports
/// (`tether.sessions`): per address what `sessions()` counts, read when the
/// report is made; sessions idle for `idle_timeout` no longer count, and
/// a new map (an update) is what the next report reads.
#[tokio::test(start_paused = true)]
async fn a_reporting_cluster_counts_its_sessions_in_the_load_report() {
    use crate::xds::load_report::{BackendMetricPropagation, LoadStore, SESSIONS_METRIC};
    use crate::xds::resource::endpoint::LocalityName;

    let (a, b) = (refused(), refused());
    let store = LoadStore::new();
    let handle = LoadHandle::new(
        store.cluster("echo", None),
        BackendMetricPropagation::default(),
    );
    // cluster_impl's picker holds the endpoints' counters.
    let locality = LocalityName::default();
    let _counters = [a, b].map(|addr| handle.load.endpoint(&locality, addr, &handle.propagation));
    let with_load = |addrs: &[SocketAddr]| {
        let mut c = config_of(addrs);
        if let LbConfig::OverrideHost(c) = &mut c {
            c.load = Some(handle.clone());
        }
        c
    };
    let mut h = Harness::new(OverrideHost::new());
    h.with(|p, ctx| p.update(ctx, with_load(&[a, b])));
    let now = h.policy.clock.now_ms();
    for id in [1, 2, 3] {
        h.policy.map[&a].record_session(id, now);
    }
    h.policy.map[&b].record_session(4, now);
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::config::endpoint::v3 as epb;
    let gauge = |m: &[epb::EndpointLoadMetricStats]| {
        m.iter()
            .find(|m| m.metric_name == SESSIONS_METRIC)
            .map(|m| m.total_metric_value)
    };
    let port = |e: &epb::UpstreamEndpointStats| match e
        .address
        .as_ref()
        .and_then(|a| a.address.as_ref())
    {
        Some(core::address::Address::SocketAddress(s)) => match s.port_specifier {
            Some(core::socket_address::PortSpecifier::PortValue(p)) => p as u16,
            _ => 0,
        },
        _ => 0,
    };
    // The locality's gauge, and each endpoint's by port.
    let sessions = |report: &epb::ClusterStats| {
        let l = &report.upstream_locality_stats[0];
        let per_endpoint: HashMap<u16, Option<f64>> = l
            .upstream_endpoint_stats
            .iter()
            .map(|e| (port(e), gauge(&e.load_metric_stats)))
            .collect();
        (gauge(&l.load_metric_stats), per_endpoint)
    };
    let report = handle.load.take_report(true);
    assert_eq!(
        sessions(&report),
        (
            Some(4.0),
            HashMap::from([(a.port(), Some(3.0)), (b.port(), Some(1.0))])
        ),
        "{report:?}"
    );
    let counted: HashMap<u16, usize> = h
        .policy
        .sessions()
        .iter()
        .map(|s| (s.address.port(), s.sessions))
        .collect();
    assert_eq!(
        counted,
        HashMap::from([(a.port(), 3), (b.port(), 1)]),
        "the same counts as the channel's stats"
    );

    // b's session goes idle (a's are used again): only a's count.
    tokio::time::sleep(Duration::from_secs(61)).await;
    let now = h.policy.clock.now_ms();
    for id in [1, 2] {
        h.policy.map[&a].record_session(id, now);
    }
    let report = handle.load.take_report(true);
    assert_eq!(
        sessions(&report),
        (Some(2.0), HashMap::from([(a.port(), Some(2.0))])),
        "{report:?}"
    );

    // An update without a: its sessions are no longer reported.
    h.with(|p, ctx| p.update(ctx, with_load(&[b])));
    let report = handle.load.take_report(true);
    assert!(report.upstream_locality_stats.is_empty(), "{report:?}");

    // The policy gone: the cluster reports no sessions at all.
    h.with(|p, ctx| p.update(ctx, with_load(&[a])));
    h.policy.map[&a].record_session(9, h.policy.clock.now_ms());
    assert_eq!(sessions(&handle.load.take_report(true)).0, Some(1.0));
    drop(h);
    assert!(handle
        .load
        .take_report(true)
        .upstream_locality_stats
        .is_empty());
}
