//! The algorithms on fixed samples, and the policy's timer on a paused
//! clock with a real pool (the addresses refuse connections; nothing here
//! needs a call to succeed: outcomes are fed to the endpoints' counters).

use std::net::SocketAddr;
use std::time::Duration;

use super::*;
use crate::lb::test_harness::{self, refused};
use crate::lb::{round_robin, CallTracker};

fn sample(successes: u64, failures: u64) -> Sample {
    Sample {
        successes,
        failures,
        ejected: false,
    }
}

fn failure_percentage(minimum_hosts: u32, request_volume: u32) -> OutlierDetectionConfig {
    {
        let mut od_config = OutlierDetectionConfig::default();
        od_config.max_ejection_percent = 100;
        od_config.failure_percentage = Some({
            let mut failure_percentage = FailurePercentageEjection::default();
            failure_percentage.minimum_hosts = minimum_hosts;
            failure_percentage.request_volume = request_volume;
            failure_percentage
        });
        od_config
    }
}

fn always() -> impl FnMut() -> u32 {
    || 0
}

#[test]
fn failure_percentage_ejects_endpoints_above_the_threshold_with_enough_volume() {
    let c = failure_percentage(3, 50);
    // 100% and 90% failures are above 85; 85% is not (strictly above);
    // the fourth has too few calls to be a candidate.
    let samples = [
        sample(0, 100),
        sample(10, 90),
        sample(15, 85),
        sample(0, 49),
    ];
    assert_eq!(decide(&c, &samples, always()), vec![0, 1]);
    // Fewer candidates than minimum_hosts: nothing runs.
    let c = failure_percentage(4, 50);
    assert!(decide(&c, &samples, always()).is_empty());
}

#[test]
fn enforcement_percentage_is_a_draw_below_it() {
    let mut c = failure_percentage(1, 1);
    c.failure_percentage
        .as_mut()
        .unwrap()
        .enforcement_percentage = 30;
    let samples = [sample(0, 10)];
    assert_eq!(decide(&c, &samples, || 29), vec![0]);
    assert!(decide(&c, &samples, || 30).is_empty());
    c.failure_percentage
        .as_mut()
        .unwrap()
        .enforcement_percentage = 0;
    assert!(decide(&c, &samples, || 0).is_empty());
}

#[test]
fn outliers_not_ejected_are_told_with_a91_reasons() {
    let mut c = failure_percentage(1, 1);
    c.max_ejection_percent = 50;
    c.failure_percentage
        .as_mut()
        .unwrap()
        .enforcement_percentage = 50;
    let samples = [sample(0, 10), sample(0, 10), sample(0, 10), sample(10, 0)];
    // Draws 10, 90, 10: the first is ejected, the second loses its draw
    // (50 %), the third is ejected (1 of 4 ejected, 25 %, is under the cap).
    let mut draws = [10, 90, 10].into_iter();
    let found = detect(&c, &samples, move || draws.next().unwrap());
    let got: Vec<(usize, &str, Option<&str>)> = found
        .iter()
        .map(|d| {
            (
                d.index,
                d.method.label(),
                d.unenforced.map(Unenforced::label),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "failure_percentage", None),
            (1, "failure_percentage", Some("enforcement_percentage")),
            (2, "failure_percentage", None),
        ]
    );
    // With 2 of 4 ejected already (50 %), a draw that passes meets the cap.
    let mut two = samples;
    two[3].ejected = true;
    two[1].ejected = true;
    let found = detect(&c, &two, always());
    assert_eq!(
        found
            .iter()
            .map(|d| (d.index, d.unenforced))
            .collect::<Vec<_>>(),
        vec![
            (0, Some(Unenforced::MaxEjectionOverflow)),
            (2, Some(Unenforced::MaxEjectionOverflow))
        ],
        "ejected endpoints are skipped by failure percentage"
    );
    assert_eq!(decide(&c, &two, always()), Vec::<usize>::new());
}

#[test]
fn success_rate_ejects_below_mean_minus_stdev_times_factor() {
    let c = {
        let mut od_config = OutlierDetectionConfig::default();
        od_config.max_ejection_percent = 100;
        od_config.success_rate = Some({
            let mut success_rate = SuccessRateEjection::default();
            success_rate.minimum_hosts = 5;
            success_rate.request_volume = 100;
            success_rate
        });
        od_config
    };
    // Five hosts, one at 0%: mean 80, stdev 40, threshold 80 − 76 = 4.
    let mut samples = vec![sample(100, 0); 4];
    samples.push(sample(0, 100));
    assert_eq!(decide(&c, &samples, always()), vec![4]);
    // Four hosts with volume: below minimum_hosts.
    samples[0] = sample(50, 0);
    assert!(decide(&c, &samples, always()).is_empty());
    // Three hosts and factor 1.9: one at 0% is within 1.9 stdev of the
    // mean (66.7 − 1.9 × 47.1 < 0), so nothing is ejected; at factor 1.0
    // it is.
    let mut c3 = c;
    c3.success_rate.as_mut().unwrap().minimum_hosts = 3;
    let samples = [sample(100, 0), sample(100, 0), sample(0, 100)];
    assert!(decide(&c3, &samples, always()).is_empty());
    c3.success_rate.as_mut().unwrap().stdev_factor = 1000;
    assert_eq!(decide(&c3, &samples, always()), vec![2]);
}

#[test]
fn max_ejection_percent_stops_ejections_but_always_allows_one() {
    let mut c = failure_percentage(1, 1);
    // 4 endpoints at 25% each: with 50%, two of the three failing go.
    c.max_ejection_percent = 50;
    let samples = [sample(0, 10), sample(0, 10), sample(0, 10), sample(10, 0)];
    assert_eq!(decide(&c, &samples, always()), vec![0, 1]);
    // One already ejected counts against the limit.
    let mut with_one = samples;
    with_one[3].ejected = true;
    assert_eq!(decide(&c, &with_one, always()), vec![0]);
    // Below one endpoint's share, C-core still ejects the first.
    c.max_ejection_percent = 10;
    assert_eq!(decide(&c, &samples, always()), vec![0]);
    c.max_ejection_percent = 0;
    assert_eq!(decide(&c, &samples, always()), vec![0]);
}

#[test]
fn counter_takes_both_counts_at_once_and_restarts() {
    let c = CallCounter::default();
    for _ in 0..3 {
        c.finished(true);
    }
    c.finished(false);
    assert_eq!(c.take(), (3, 1));
    assert_eq!(c.take(), (0, 0));
}

type Harness = test_harness::Harness<OutlierDetection>;

impl test_harness::Harness<OutlierDetection> {
    /// Runs the policy until its interval timer fires; the time since
    /// `start`.
    async fn next_run(&mut self, start: Instant) -> Duration {
        self.next_timer().await - start
    }

    fn fail(&self, addr: SocketAddr, calls: usize) {
        let c = self.policy.counters[&addr].clone();
        for _ in 0..calls {
            c.finished(false);
        }
    }

    fn succeed(&self, addr: SocketAddr, calls: usize) {
        let c = self.policy.counters[&addr].clone();
        for _ in 0..calls {
            c.finished(true);
        }
    }

    fn multiplier(&self, addr: SocketAddr) -> u32 {
        self.policy.endpoints[&vec![addr]].multiplier
    }
}

fn config(endpoints: &[SocketAddr], settings: OutlierDetectionConfig) -> LbConfig {
    let endpoints: Vec<EndpointAddresses> = endpoints
        .iter()
        .map(|a| EndpointAddresses::single(*a))
        .collect();
    LbConfig::OutlierDetection(Config {
        settings,
        endpoints: endpoints.clone(),
        child: Box::new(LbConfig::RoundRobin(round_robin::Config { endpoints })),
    })
}

fn settings() -> OutlierDetectionConfig {
    {
        let mut od_config = OutlierDetectionConfig::default();
        od_config.interval = Duration::from_secs(10);
        od_config.base_ejection_time = Duration::from_secs(30);
        od_config.max_ejection_time = Duration::from_secs(300);
        od_config.max_ejection_percent = 50;
        od_config.success_rate = None;
        od_config.failure_percentage = Some({
            let mut failure_percentage = FailurePercentageEjection::default();
            failure_percentage.minimum_hosts = 2;
            failure_percentage.request_volume = 10;
            failure_percentage
        });
        od_config
    }
}

#[tokio::test(start_paused = true)]
async fn an_ejection_lasts_base_times_multiplier_and_grows_on_a_repeat() {
    let (a, b) = (refused(), refused());
    let mut h = Harness::new(OutlierDetection::new());
    let start = Instant::now();
    h.with(|p, ctx| p.update(ctx, config(&[a, b], settings())));
    h.fail(a, 20);
    h.succeed(b, 20);
    assert_eq!(h.next_run(start).await, Duration::from_secs(10));
    assert_eq!(h.policy.ejected_addresses(), vec![a]);
    assert_eq!(h.multiplier(a), 1);
    // Ejected at 10 s for 30 s: un-ejected at the first run after 40 s.
    for t in [20, 30, 40] {
        assert_eq!(h.next_run(start).await, Duration::from_secs(t));
        assert_eq!(h.policy.ejected_addresses(), vec![a], "still at {t} s");
    }
    assert_eq!(h.next_run(start).await, Duration::from_secs(50));
    assert!(h.policy.ejected_addresses().is_empty());
    // It fails again at once: ejected for 2 × 30 s.
    h.fail(a, 20);
    h.succeed(b, 20);
    assert_eq!(h.next_run(start).await, Duration::from_secs(60));
    assert_eq!(h.policy.ejected_addresses(), vec![a]);
    assert_eq!(h.multiplier(a), 2);
    for t in (70..=120).step_by(10) {
        assert_eq!(h.next_run(start).await, Duration::from_secs(t));
        assert_eq!(h.policy.ejected_addresses(), vec![a], "still at {t} s");
    }
    assert_eq!(h.next_run(start).await, Duration::from_secs(130));
    assert!(h.policy.ejected_addresses().is_empty());
    // Healthy rounds bring the multiplier back down, one per interval.
    assert_eq!(h.multiplier(a), 2);
    h.next_run(start).await;
    assert_eq!(h.multiplier(a), 1);
    h.next_run(start).await;
    assert_eq!(h.multiplier(a), 0);
}

#[tokio::test(start_paused = true)]
async fn an_ejected_endpoint_shows_transient_failure_to_the_child_until_un_ejected() {
    let (a, b) = (refused(), refused());
    let mut h = Harness::new(OutlierDetection::new());
    let start = Instant::now();
    h.with(|p, ctx| p.update(ctx, config(&[a, b], settings())));
    h.fail(a, 20);
    h.succeed(b, 20);
    h.next_run(start).await;
    assert_eq!(h.policy.ejected_addresses(), vec![a]);
    // Whatever the subchannel reports, the child sees TRANSIENT_FAILURE.
    let sc = h.pool.peek(a).expect("the child made the subchannel");
    h.with(|p, ctx| {
        p.event(
            ctx,
            &Event::Subchannel(sc.id(), a, ConnectivityState::Ready),
        )
    });
    let stats = h.policy.stats();
    let rr = &stats.children[0];
    let seen: Vec<_> = rr.endpoints.iter().map(|e| e.address.clone()).collect();
    assert!(seen.contains(&a.to_string()));
    assert_eq!(rr.state, h.policy.state());
    assert_ne!(
        h.policy.state(),
        ConnectivityState::Ready,
        "round_robin saw READY through an ejection"
    );
    assert!(stats
        .facts
        .iter()
        .any(|(k, v)| k == "ejected" && v == "1/2"));
}

#[tokio::test(start_paused = true)]
async fn a_new_config_keeps_the_schedule_and_endpoints_keep_their_ejection() {
    let (a, b, c) = (refused(), refused(), refused());
    let mut h = Harness::new(OutlierDetection::new());
    let start = Instant::now();
    h.with(|p, ctx| p.update(ctx, config(&[a, b], settings())));
    h.fail(a, 20);
    h.succeed(b, 20);
    h.next_run(start).await;
    assert_eq!(h.policy.ejected_addresses(), vec![a]);
    // 4 s into the interval, an endpoint is added: the next run stays at
    // 20 s, and `a` stays ejected with its multiplier.
    tokio::time::sleep(Duration::from_secs(4)).await;
    h.with(|p, ctx| p.update(ctx, config(&[a, b, c], settings())));
    assert_eq!(h.policy.ejected_addresses(), vec![a]);
    assert_eq!(h.next_run(start).await, Duration::from_secs(20));
    // A config without algorithms un-ejects everything and stops the timer.
    let mut off = settings();
    off.failure_percentage = None;
    h.with(|p, ctx| p.update(ctx, config(&[a, b, c], off)));
    assert!(h.policy.ejected_addresses().is_empty());
    assert!(h.policy.timer.is_none());
    assert_eq!(h.multiplier(a), 0);
}

#[tokio::test(start_paused = true)]
async fn the_picker_counts_only_with_an_algorithm_on() {
    let a = refused();
    let mut h = Harness::new(OutlierDetection::new());
    h.with(|p, ctx| p.update(ctx, config(&[a], settings())));
    assert!(h.policy.counters.contains_key(&a));
    let mut off = settings();
    off.failure_percentage = None;
    h.with(|p, ctx| p.update(ctx, config(&[a], off)));
    let picker = h.policy.picker();
    assert!(format!("{picker:?}").contains("counters: None"));
}
