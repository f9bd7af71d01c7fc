//! The scheduler's ratios, the weights' windows on a paused clock, per-call
//! reports through a pick's trackers, and the config parser.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::lb::{CallAttributes, PickArgs, PickResult, Picker, SubchannelPool};
use crate::orca::{trailer_value, OrcaLoadReport, PER_CALL_TRAILER};
use crate::subchannel::SubchannelOptions;

/// A report of `qps` at application utilization `utilization`.
fn report(qps: f64, utilization: f64) -> OrcaLoadReport {
    OrcaLoadReport {
        rps_fractional: qps,
        application_utilization: utilization,
        ..Default::default()
    }
}

/// How many of `picks` picks land on each index.
fn counts(s: &StaticStrideScheduler, picks: usize) -> Vec<usize> {
    let sequence = AtomicU64::new(12345);
    let mut counts = vec![0; s.weights().len()];
    for _ in 0..picks {
        counts[s.pick(&sequence)] += 1;
    }
    counts
}

/// Whether `actual` is within `tolerance` (a fraction) of `expected`.
fn near(actual: f64, expected: f64, tolerance: f64) -> bool {
    (actual - expected).abs() <= expected * tolerance
}

#[test]
fn utilization_weights_pick_four_two_one() {
    let weights: Vec<f64> = [0.2, 0.4, 0.8]
        .iter()
        .map(|&u| weight_of(&report(100.0, u), 1.0).unwrap())
        .collect();
    let s = StaticStrideScheduler::new(&weights).expect("weights differ");
    assert_eq!(s.weights(), &[MAX_WEIGHT, 32768, 16384]);
    let c = counts(&s, 70_000);
    let (a, b, d) = (c[0] as f64, c[1] as f64, c[2] as f64);
    assert!(near(a / d, 4.0, 0.02), "{c:?}");
    assert!(near(b / d, 2.0, 0.02), "{c:?}");
}

#[test]
fn endpoints_without_weights_get_the_mean() {
    // Usable weights 1 and 3 (mean 2); the unusable ones count as 2.
    let s = StaticStrideScheduler::new(&[1.0, 0.0, 3.0, -1.0, f64::NAN]).unwrap();
    let w = s.weights();
    assert_eq!(w[2], MAX_WEIGHT);
    assert_eq!(w[1], w[3]);
    assert_eq!(w[1], w[4]);
    assert!(near(
        f64::from(w[1]),
        f64::from(MAX_WEIGHT) * 2.0 / 3.0,
        0.001
    ));
    let c = counts(&s, 90_000);
    assert!(near(c[1] as f64 / c[0] as f64, 2.0, 0.03), "{c:?}");
    assert!(near(c[2] as f64 / c[0] as f64, 3.0, 0.03), "{c:?}");
}

#[test]
fn weights_that_cannot_tell_endpoints_apart_mean_round_robin() {
    assert_eq!(StaticStrideScheduler::new(&[]), None);
    assert_eq!(StaticStrideScheduler::new(&[5.0]), None);
    assert_eq!(StaticStrideScheduler::new(&[5.0, 0.0, 0.0]), None);
    assert_eq!(StaticStrideScheduler::new(&[2.0, 2.0, 2.0]), None);
    // One usable weight among unknown ones: all count as it.
    assert_eq!(StaticStrideScheduler::new(&[0.0, 7.0]), None);
}

#[test]
fn extreme_weights_are_clamped_around_the_mean() {
    // One huge weight among 19 small ones (mean about 50000): it counts as
    // 10x the mean (the scale's top), and the small ones as a hundredth of
    // the mean, however small they are.
    let mut weights = vec![1.0; 20];
    weights[0] = 1_000_000.0;
    weights[1] = 0.1;
    let s = StaticStrideScheduler::new(&weights).unwrap();
    let w = s.weights();
    assert_eq!(w[0], MAX_WEIGHT);
    let mean_scaled = f64::from(MAX_WEIGHT) / MAX_RATIO;
    assert!(
        near(f64::from(w[1]), mean_scaled * MIN_RATIO, 0.01),
        "{w:?}"
    );
    assert!(w[2..].iter().all(|&x| x == w[1]), "{w:?}");
    // Every index is picked, each draw loop bounded.
    let c = counts(&s, 20_000);
    assert!(c.iter().all(|&n| n > 0), "{c:?}");
}

#[test]
fn picks_continue_the_shared_sequence() {
    let s = StaticStrideScheduler::new(&[1.0, 2.0]).unwrap();
    let sequence = AtomicU64::new(u64::MAX - 10);
    // Near the counter's end nothing overflows and picks stay in range.
    for _ in 0..40 {
        assert!(s.pick(&sequence) < 2);
    }
}

#[test]
fn weight_prefers_application_utilization_and_penalizes_errors() {
    let mut r = report(100.0, 0.0);
    assert_eq!(weight_of(&r, 1.0), None, "no utilization");
    r.cpu_utilization = 0.5;
    assert_eq!(weight_of(&r, 1.0), Some(200.0));
    r.application_utilization = 0.25;
    assert_eq!(weight_of(&r, 1.0), Some(400.0));
    // 10 errors per 100 queries at penalty 1.5 add 0.15 utilization.
    r.eps = 10.0;
    assert!(near(weight_of(&r, 1.5).unwrap(), 100.0 / 0.4, 1e-9));
    assert_eq!(weight_of(&report(0.0, 0.5), 1.0), None, "no qps");
}

#[tokio::test(start_paused = true)]
async fn weight_waits_out_the_blackout_and_expires() {
    let blackout = Duration::from_secs(10);
    let expiration = Duration::from_secs(180);
    let w = EndpointWeight::new(1.0);
    let t0 = Instant::now();
    assert_eq!(w.weight(t0, expiration, blackout), 0.0, "no report yet");
    assert!(!w.report(&report(0.0, 0.5), t0), "unusable report");
    assert_eq!(w.weight(t0, expiration, blackout), 0.0);

    assert!(w.report(&report(100.0, 0.5), Instant::now()));
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(
        w.weight(Instant::now(), expiration, blackout),
        0.0,
        "in blackout"
    );
    assert_eq!(
        w.weight(Instant::now(), expiration, Duration::ZERO),
        200.0,
        "no blackout"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        w.weight(Instant::now(), expiration, blackout),
        200.0,
        "blackout over"
    );
    assert!(w.report(&report(100.0, 0.25), Instant::now()));
    assert_eq!(
        w.weight(Instant::now(), expiration, blackout),
        400.0,
        "latest report"
    );

    // 3 minutes without a report: expired, and the blackout starts again.
    tokio::time::advance(expiration).await;
    assert_eq!(
        w.weight(Instant::now(), expiration, blackout),
        0.0,
        "expired"
    );
    assert!(w.report(&report(100.0, 0.5), Instant::now()));
    assert_eq!(
        w.weight(Instant::now(), expiration, blackout),
        0.0,
        "new blackout"
    );
    tokio::time::advance(blackout).await;
    assert_eq!(w.weight(Instant::now(), expiration, blackout), 200.0);

    // Leaving READY keeps the weight; coming back starts a new blackout
    // (C-core), the first READY does not.
    w.set_ready(true);
    assert_eq!(w.weight(Instant::now(), expiration, blackout), 200.0);
    w.set_ready(false);
    assert_eq!(w.weight(Instant::now(), expiration, blackout), 200.0);
    w.set_ready(true);
    assert_eq!(
        w.weight(Instant::now(), expiration, blackout),
        0.0,
        "back to READY"
    );
    assert!(w.report(&report(100.0, 0.25), Instant::now()));
    tokio::time::advance(blackout).await;
    assert_eq!(w.weight(Instant::now(), expiration, blackout), 400.0);
    let fresh = EndpointWeight::new(1.0);
    assert!(fresh.report(&report(100.0, 0.5), Instant::now()));
    fresh.set_ready(true);
    assert_eq!(
        fresh.weight(Instant::now(), expiration, Duration::ZERO),
        200.0
    );
}

#[tokio::test(start_paused = true)]
async fn penalty_changes_apply_to_later_reports() {
    let w = EndpointWeight::new(0.0);
    let mut r = report(100.0, 0.5);
    r.eps = 50.0;
    w.report(&r, Instant::now());
    let weight =
        |w: &EndpointWeight| w.weight(Instant::now(), Duration::from_secs(60), Duration::ZERO);
    assert_eq!(weight(&w), 200.0);
    w.set_error_utilization_penalty(1.0);
    assert_eq!(weight(&w), 200.0, "until the next report");
    w.report(&r, Instant::now());
    assert_eq!(weight(&w), 100.0);
}

/// A trailer equal to the last one counts again without a decode, and
/// reads as the report it carries; a new penalty, other bytes or a
/// malformed trailer are read afresh.
#[tokio::test(start_paused = true)]
async fn repeated_trailers_count_as_their_report() {
    let weight =
        |w: &EndpointWeight| w.weight(Instant::now(), Duration::from_secs(60), Duration::ZERO);
    let w = EndpointWeight::new(0.0);
    let mut r = report(100.0, 0.5);
    r.eps = 50.0;
    let value = trailer_value(&r);
    assert!(w.report_trailer(&value, Instant::now()));
    assert_eq!(weight(&w), 200.0);
    // The same bytes keep the run going: the blackout counts from the
    // first of them, the expiry from the last.
    tokio::time::advance(Duration::from_secs(50)).await;
    assert!(w.report_trailer(&value, Instant::now()));
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(weight(&w), 200.0, "the repeat moved the expiry");
    assert_eq!(
        w.weight(
            Instant::now(),
            Duration::from_secs(60),
            Duration::from_secs(90)
        ),
        200.0,
        "the run began 100 s ago"
    );
    // The penalty applies to the same bytes once it changes.
    w.set_error_utilization_penalty(1.0);
    assert!(w.report_trailer(&value, Instant::now()));
    assert_eq!(weight(&w), 100.0);
    // Other bytes are decoded.
    assert!(w.report_trailer(&trailer_value(&report(300.0, 0.5)), Instant::now()));
    assert_eq!(weight(&w), 600.0);
    // A trailer that is not a report, or a report without utilization, is
    // ignored, repeated or not: the weight stays.
    let garbage = http::HeaderValue::from_static("not base64!");
    let useless = trailer_value(&report(300.0, 0.0));
    for v in [&garbage, &garbage, &useless, &useless] {
        assert!(!w.report_trailer(v, Instant::now()));
    }
    assert_eq!(weight(&w), 600.0);
}

struct Endpoints {
    pool: SubchannelPool,
}

impl Endpoints {
    fn new() -> Self {
        Endpoints {
            pool: SubchannelPool::new(SubchannelOptions::default(), Arc::new(|_, _, _| {})),
        }
    }

    fn ready(&self, addresses: &[SocketAddr], penalty: f32) -> Vec<ReadyEndpoint> {
        addresses
            .iter()
            .map(|&a| ReadyEndpoint {
                subchannel: self.pool.get(a),
                weight: Arc::new(EndpointWeight::new(penalty)),
            })
            .collect()
    }
}

fn addresses(n: u16) -> Vec<SocketAddr> {
    (1..=n)
        .map(|i| SocketAddr::from(([10, 0, 0, i as u8], 80)))
        .collect()
}

/// Picks `n` calls; each call ends with the trailers `trailers` gives its
/// endpoint's address. Returns the picks per address.
fn run(
    picker: &WeightedRoundRobinPicker,
    n: usize,
    trailers: impl Fn(SocketAddr) -> Option<http::HeaderMap>,
) -> HashMap<SocketAddr, usize> {
    let headers = http::HeaderMap::new();
    let attributes = CallAttributes::default();
    let args = PickArgs {
        path: "/test.Echo/Echo",
        headers: &headers,
        attributes: &attributes,
    };
    let mut counts = HashMap::new();
    for _ in 0..n {
        let PickResult::Complete(pick) = picker.pick(&args) else {
            panic!("expected a completed pick");
        };
        let address = pick.subchannel.address();
        *counts.entry(address).or_default() += 1;
        pick.trackers
            .finished_with_trailers(true, trailers(address).as_ref());
    }
    counts
}

#[tokio::test(start_paused = true)]
async fn per_call_reports_weight_the_picks() {
    let endpoints = Endpoints::new();
    let a = addresses(3);
    let utilization: HashMap<SocketAddr, f64> = a.iter().copied().zip([0.2, 0.4, 0.8]).collect();
    let settings = {
        let mut wrr_settings = Settings::default();
        wrr_settings.blackout_period = Duration::ZERO;
        wrr_settings
    };
    let (picker, _) =
        WeightedRoundRobinPicker::new(endpoints.ready(&a, 1.0), &settings, Instant::now());
    assert_eq!(picker.scheduled_weights(), None, "no reports yet");
    let with_report = |addr: SocketAddr| {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", http::HeaderValue::from_static("0"));
        h.insert(
            PER_CALL_TRAILER,
            trailer_value(&report(100.0, utilization[&addr])),
        );
        Some(h)
    };
    // Without weights: round robin, each endpoint in turn.
    let first = run(&picker, 300, with_report);
    assert!(first.values().all(|&n| n == 100), "{first:?}");

    picker.update_scheduler(&settings, Instant::now());
    assert_eq!(
        picker.scheduled_weights(),
        Some(vec![MAX_WEIGHT, 32768, 16384])
    );
    let c = run(&picker, 7000, with_report);
    let ratio = |i: usize| c[&a[i]] as f64 / c[&a[2]] as f64;
    assert!(near(ratio(0), 4.0, 0.05), "{c:?}");
    assert!(near(ratio(1), 2.0, 0.05), "{c:?}");
}

#[tokio::test(start_paused = true)]
async fn out_of_band_pickers_ignore_trailers() {
    let endpoints = Endpoints::new();
    let a = addresses(2);
    let settings = {
        let mut wrr_settings = Settings::default();
        wrr_settings.blackout_period = Duration::ZERO;
        wrr_settings.enable_oob_load_report = true;
        wrr_settings
    };
    let ready = endpoints.ready(&a, 1.0);
    let (picker, _) = WeightedRoundRobinPicker::new(ready.clone(), &settings, Instant::now());
    run(&picker, 10, |_| {
        let mut h = http::HeaderMap::new();
        h.insert(PER_CALL_TRAILER, trailer_value(&report(100.0, 0.5)));
        Some(h)
    });
    for e in &ready {
        assert_eq!(
            e.weight
                .weight(Instant::now(), Duration::from_secs(60), Duration::ZERO),
            0.0
        );
    }
}

#[tokio::test(start_paused = true)]
async fn scheduler_updates_count_endpoints_not_yet_usable_and_stale_as_c_core_does() {
    let endpoints = Endpoints::new();
    let a = addresses(3);
    let settings = Settings::default();
    let (blackout, expiration) = (settings.blackout_period, settings.weight_expiration_period);
    let ready = endpoints.ready(&a, 1.0);
    // No reports: all three not yet usable (there is a blackout), round robin.
    let (picker, first) = WeightedRoundRobinPicker::new(ready.clone(), &settings, Instant::now());
    assert_eq!(first.weights, vec![0.0; 3]);
    assert_eq!((first.not_yet_usable, first.stale), (3, 0));
    assert!(first.fallback);
    // Two report; after the blackout they are usable, the third is not.
    ready[0].weight.report(&report(100.0, 0.5), Instant::now());
    ready[1].weight.report(&report(100.0, 0.25), Instant::now());
    tokio::time::advance(blackout).await;
    let update = picker.update_scheduler(&settings, Instant::now());
    assert_eq!(update.weights, vec![200.0, 400.0, 0.0]);
    assert_eq!((update.not_yet_usable, update.stale), (1, 0));
    assert!(!update.fallback);
    // The first keeps reporting, the second stops: it goes stale.
    tokio::time::advance(expiration - blackout).await;
    ready[0].weight.report(&report(100.0, 0.5), Instant::now());
    tokio::time::advance(blackout).await;
    let update = picker.update_scheduler(&settings, Instant::now());
    assert_eq!(update.weights, vec![200.0, 0.0, 0.0]);
    assert_eq!((update.not_yet_usable, update.stale), (1, 1));
    assert!(update.fallback, "one usable weight: round robin");
    // Without a blackout an endpoint without reports is counted in neither.
    let mut no_blackout = settings;
    no_blackout.blackout_period = Duration::ZERO;
    let update = picker.update_scheduler(&no_blackout, Instant::now());
    assert_eq!((update.not_yet_usable, update.stale), (0, 1));
}
