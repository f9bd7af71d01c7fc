//! `outlier_detection` (gRFC A50): ejects endpoints whose calls fail more
//! than their peers', in A75's place, `cds` → `outlier_detection` →
//! `xds_cluster_impl`, so it sees the whole cluster across priorities.
//!
//! Calls are counted per endpoint (all addresses of an endpoint share one
//! counter, A61) by a tracker its picker adds to each pick. Every
//! `interval` the timer, on the LB task, takes the counts, runs the
//! success-rate and failure-percentage algorithms ([`decide`]), and
//! un-ejects endpoints whose ejection time (base × multiplier, capped at
//! max(base, max)) has passed; an endpoint not ejected in a round loses one
//! multiplier step.
//!
//! gRPC wraps each subchannel so that an ejected one reports
//! TRANSIENT_FAILURE to the child and hides its real states until it is
//! un-ejected. Subchannels here are shared through the pool and policies
//! learn states from [`Event::Subchannel`], so the policy does the same
//! with events: on ejection it tells its subtree TRANSIENT_FAILURE for each
//! of the endpoint's addresses, turns every later state of those addresses
//! into TRANSIENT_FAILURE, and on un-ejection tells the subchannel's real
//! state. It also sends [`Event::Ejection`], which `xds_override_host`
//! reads so that a session never uses an ejected endpoint (it moves, and
//! the session filter writes a new cookie).

mod picker;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::time::Instant;

use crate::telemetry::OutlierRecorder;

pub use picker::{CallCounter, OutlierDetectionPicker};
// Public with `internals` (the benchmark's); the crate uses some of them.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use tether_xds::lb_config::outlier_detection::{
    FailurePercentageEjection, InvalidOutlierDetection, OutlierDetectionConfig,
    SuccessRateEjection, DEFAULT_BASE_EJECTION_TIME, DEFAULT_INTERVAL,
    DEFAULT_MAX_EJECTION_PERCENT, DEFAULT_MAX_EJECTION_TIME,
};

use super::{
    random, Child, ConnectivityState, Ctx, EndpointAddresses, Event, LbConfig, LbPolicy,
    PolicyStats, SharedPicker, Timer,
};

/// `outlier_detection`'s config.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The settings (from CDS `outlier_detection`).
    pub settings: OutlierDetectionConfig,
    /// Every endpoint of the cluster, in every priority.
    pub endpoints: Vec<EndpointAddresses>,
    /// The policy underneath (`xds_cluster_impl`).
    pub child: Box<LbConfig>,
}

/// Each address's endpoint counter, read by pickers.
pub type CounterMap = HashMap<SocketAddr, Arc<CallCounter>, foldhash::fast::RandomState>;

/// One endpoint's state: its counter and its ejection.
#[derive(Debug)]
struct EndpointState {
    addresses: Vec<SocketAddr>,
    counter: Arc<CallCounter>,
    /// When it was last ejected, while it is.
    ejected_at: Option<Instant>,
    multiplier: u32,
}

/// One endpoint's calls in the last interval, as the algorithms see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Calls that ended OK.
    pub successes: u64,
    /// Calls that ended with any other status.
    pub failures: u64,
    /// Whether it is ejected now.
    pub ejected: bool,
}

impl Sample {
    fn volume(&self) -> u64 {
        self.successes + self.failures
    }

    /// Success rate in percent; `None` without calls.
    fn success_rate(&self) -> Option<f64> {
        (self.volume() > 0).then(|| self.successes as f64 * 100.0 / self.volume() as f64)
    }
}

/// The algorithm that found an outlier (gRFC A91's
/// `grpc.lb.outlier_detection.detection_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DetectionMethod {
    /// Success rate below mean − stdev × factor.
    SuccessRate,
    /// Failure percentage above the threshold.
    FailurePercentage,
}

impl DetectionMethod {
    /// A91's label value.
    pub fn label(self) -> &'static str {
        match self {
            DetectionMethod::SuccessRate => "success_rate",
            DetectionMethod::FailurePercentage => "failure_percentage",
        }
    }
}

/// Why an outlier was not ejected (A91's
/// `grpc.lb.outlier_detection.unenforced_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unenforced {
    /// The draw against the algorithm's `enforcement_percentage` said no.
    EnforcementPercentage,
    /// `max_ejection_percent` of the endpoints were ejected already.
    MaxEjectionOverflow,
}

impl Unenforced {
    /// A91's label value.
    pub fn label(self) -> &'static str {
        match self {
            Unenforced::EnforcementPercentage => "enforcement_percentage",
            Unenforced::MaxEjectionOverflow => "max_ejection_overflow",
        }
    }
}

/// One outlier found in an interval: the endpoint (its index in the
/// samples), by which algorithm, and why it was not ejected (`None`:
/// ejected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Detection {
    /// The endpoint's index in the samples.
    pub index: usize,
    /// The algorithm.
    pub method: DetectionMethod,
    /// `None` when ejected.
    pub unenforced: Option<Unenforced>,
}

/// Runs both algorithms over one interval's samples (one per endpoint, in
/// the policy's order) and returns the indices to eject, in order.
/// `roll` gives a number in `[0, 100)` for each enforcement draw.
///
/// As C-core runs them: an endpoint is a candidate of an algorithm with at
/// least its `request_volume` calls; an algorithm runs with at least its
/// `minimum_hosts` candidates; success rate's threshold is mean − stdev ×
/// `stdev_factor`/1000 over the candidates' rates (population stdev); an
/// ejection is allowed while none is in place or the ejected share is
/// below `max_ejection_percent`; failure percentage skips endpoints
/// already ejected.
// Public with `internals`; the tests use it.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn decide(
    config: &OutlierDetectionConfig,
    samples: &[Sample],
    roll: impl FnMut() -> u32,
) -> Vec<usize> {
    detect(config, samples, roll)
        .into_iter()
        .filter(|d| d.unenforced.is_none())
        .map(|d| d.index)
        .collect()
}

/// [`decide`], with the outliers not ejected too and why: as in C-core,
/// the enforcement draw comes first, then the `max_ejection_percent` cap.
pub fn detect(
    config: &OutlierDetectionConfig,
    samples: &[Sample],
    mut roll: impl FnMut() -> u32,
) -> Vec<Detection> {
    let total = samples.len();
    let mut ejected_count = samples.iter().filter(|s| s.ejected).count();
    let mut ejected: Vec<bool> = samples.iter().map(|s| s.ejected).collect();
    let mut out = Vec::new();
    let allowed = |ejected_count: usize| {
        ejected_count == 0
            || (ejected_count as f64 * 100.0 / total as f64)
                < f64::from(config.max_ejection_percent)
    };
    // An outlier found: ejected unless the draw or the cap says no.
    let mut found = |i: usize,
                     method: DetectionMethod,
                     enforcement: u32,
                     ejected: &mut Vec<bool>,
                     ejected_count: &mut usize| {
        let unenforced = if roll() >= enforcement {
            Some(Unenforced::EnforcementPercentage)
        } else if !allowed(*ejected_count) {
            Some(Unenforced::MaxEjectionOverflow)
        } else {
            ejected[i] = true;
            *ejected_count += 1;
            None
        };
        out.push(Detection {
            index: i,
            method,
            unenforced,
        });
    };
    if let Some(sr) = &config.success_rate {
        let candidates: Vec<(usize, f64)> = samples
            .iter()
            .enumerate()
            .filter(|(_, s)| s.volume() >= u64::from(sr.request_volume))
            .filter_map(|(i, s)| s.success_rate().map(|r| (i, r)))
            .collect();
        if !candidates.is_empty() && candidates.len() >= sr.minimum_hosts as usize {
            let n = candidates.len() as f64;
            let mean = candidates.iter().map(|(_, r)| r).sum::<f64>() / n;
            let variance = candidates
                .iter()
                .map(|(_, r)| (r - mean).powi(2))
                .sum::<f64>()
                / n;
            let threshold = mean - variance.sqrt() * f64::from(sr.stdev_factor) / 1000.0;
            for &(i, rate) in &candidates {
                if rate < threshold {
                    // C-core ejects an ejected candidate again (a longer
                    // ejection); it rarely has calls to count.
                    found(
                        i,
                        DetectionMethod::SuccessRate,
                        sr.enforcement_percentage,
                        &mut ejected,
                        &mut ejected_count,
                    );
                }
            }
        }
    }
    if let Some(fp) = &config.failure_percentage {
        let candidates: Vec<(usize, f64)> = samples
            .iter()
            .enumerate()
            .filter(|(_, s)| s.volume() >= u64::from(fp.request_volume))
            .filter_map(|(i, s)| s.success_rate().map(|r| (i, r)))
            .collect();
        if !candidates.is_empty() && candidates.len() >= fp.minimum_hosts as usize {
            for &(i, rate) in &candidates {
                if !ejected[i] && 100.0 - rate > f64::from(fp.threshold) {
                    found(
                        i,
                        DetectionMethod::FailurePercentage,
                        fp.enforcement_percentage,
                        &mut ejected,
                        &mut ejected_count,
                    );
                }
            }
        }
    }
    out
}

/// The `outlier_detection` policy.
pub struct OutlierDetection {
    config: Option<OutlierDetectionConfig>,
    /// Endpoints by their sorted addresses (an endpoint is its address set).
    endpoints: BTreeMap<Vec<SocketAddr>, EndpointState>,
    counters: Arc<CounterMap>,
    /// Addresses of ejected endpoints.
    ejected: HashSet<SocketAddr>,
    child: Option<Child>,
    timer: Option<Timer>,
    /// When the interval timer last started (A50: a new config keeps the
    /// schedule).
    timer_start: Option<Instant>,
    picker: Option<SharedPicker>,
    /// Ejections made so far (as grpc-go's `ejections_enforced` counts).
    ejections: u64,
    /// Records each outlier found (gRFC A91), when the channel does.
    metrics: Option<OutlierRecorder>,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection::new()
    }
}

impl OutlierDetection {
    /// A policy with no config yet.
    pub fn new() -> Self {
        OutlierDetection {
            config: None,
            endpoints: BTreeMap::new(),
            counters: Arc::default(),
            ejected: HashSet::new(),
            child: None,
            timer: None,
            ejections: 0,
            timer_start: None,
            picker: None,
            metrics: None,
        }
    }

    /// The addresses of the endpoints ejected now, sorted.
    // Public with `internals`; used by the tests.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn ejected_addresses(&self) -> Vec<SocketAddr> {
        let mut v: Vec<_> = self.ejected.iter().copied().collect();
        v.sort();
        v
    }

    fn refresh(&mut self) -> bool {
        let (Some(config), Some(child)) = (&self.config, &self.child) else {
            return false;
        };
        self.picker = Some(Arc::new(OutlierDetectionPicker::new(
            child.get().picker(),
            config.counting().then(|| self.counters.clone()),
        )));
        true
    }

    /// Tells the subtree that `addr` is ejected (or not): the state its
    /// subchannel shows through this policy, and [`Event::Ejection`].
    fn tell(&mut self, ctx: &mut Ctx<'_>, addr: SocketAddr, ejected: bool) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        let mut changed = child.event(ctx, &Event::Ejection(addr, ejected));
        if let Some(sc) = ctx.existing_subchannel(addr) {
            let state = if ejected {
                ConnectivityState::TransientFailure
            } else {
                sc.state()
            };
            changed |= child.event(ctx, &Event::Subchannel(sc.id(), addr, state));
        }
        changed
    }

    fn eject(&mut self, ctx: &mut Ctx<'_>, key: &[SocketAddr], now: Instant) -> bool {
        let Some(e) = self.endpoints.get_mut(key) else {
            return false;
        };
        e.ejected_at = Some(now);
        e.multiplier = e.multiplier.saturating_add(1);
        self.ejections += 1;
        log::info!(
            "{}: outlier_detection: endpoint {:?} ejected (multiplier {})",
            ctx.target,
            e.addresses,
            e.multiplier
        );
        let addresses = e.addresses.clone();
        let mut changed = false;
        for a in addresses {
            self.ejected.insert(a);
            changed |= self.tell(ctx, a, true);
        }
        changed
    }

    fn uneject(&mut self, ctx: &mut Ctx<'_>, key: &[SocketAddr]) -> bool {
        let Some(e) = self.endpoints.get_mut(key) else {
            return false;
        };
        e.ejected_at = None;
        log::info!(
            "{}: outlier_detection: endpoint {:?} un-ejected",
            ctx.target,
            e.addresses
        );
        let addresses = e.addresses.clone();
        let mut changed = false;
        for a in addresses {
            self.ejected.remove(&a);
            changed |= self.tell(ctx, a, false);
        }
        changed
    }

    /// One run of the interval timer (A50's steps).
    fn run_timer(&mut self, ctx: &mut Ctx<'_>) -> bool {
        let Some(config) = self.config else {
            return false;
        };
        let now = ctx.now();
        self.timer_start = Some(now);
        let keys: Vec<Vec<SocketAddr>> = self.endpoints.keys().cloned().collect();
        let samples: Vec<Sample> = self
            .endpoints
            .values()
            .map(|e| {
                let (successes, failures) = e.counter.take();
                Sample {
                    successes,
                    failures,
                    ejected: e.ejected_at.is_some(),
                }
            })
            .collect();
        let found = detect(&config, &samples, || random::below(100) as u32);
        let mut changed = false;
        for d in found {
            if let Some(m) = &self.metrics {
                m.detected(d.method.label(), d.unenforced.map(Unenforced::label));
            }
            if d.unenforced.is_none() {
                changed |= self.eject(ctx, &keys[d.index], now);
            }
        }
        for key in &keys {
            let Some(e) = self.endpoints.get_mut(key) else {
                continue;
            };
            match e.ejected_at {
                None => e.multiplier = e.multiplier.saturating_sub(1),
                Some(at) if now > at + config.ejection_time(e.multiplier) => {
                    changed |= self.uneject(ctx, key);
                }
                Some(_) => {}
            }
        }
        self.timer = Some(ctx.timer(config.interval));
        changed && self.refresh()
    }
}

impl LbPolicy for OutlierDetection {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::OutlierDetection(config) = config else {
            return false;
        };
        let settings = config.settings;
        self.metrics = ctx.outlier_recorder();
        // Endpoints that stay keep their counter, ejection and multiplier.
        let mut old = std::mem::take(&mut self.endpoints);
        for e in &config.endpoints {
            let mut key = e.addresses.clone();
            key.sort();
            key.dedup();
            if self.endpoints.contains_key(&key) {
                continue;
            }
            let state = old.remove(&key).unwrap_or_else(|| EndpointState {
                addresses: key.clone(),
                counter: Arc::default(),
                ejected_at: None,
                multiplier: 0,
            });
            self.endpoints.insert(key, state);
        }
        let mut counters = CounterMap::with_capacity_and_hasher(
            self.endpoints.len(),
            foldhash::fast::RandomState::default(),
        );
        for e in self.endpoints.values() {
            for a in &e.addresses {
                counters.insert(*a, e.counter.clone());
            }
        }
        self.counters = Arc::new(counters);
        if settings.counting() {
            let now = ctx.now();
            let delay = match self.timer_start {
                None => {
                    self.timer_start = Some(now);
                    for e in self.endpoints.values() {
                        e.counter.take();
                    }
                    settings.interval
                }
                Some(start) => settings
                    .interval
                    .saturating_sub(now.saturating_duration_since(start)),
            };
            self.timer = Some(ctx.timer(delay));
        } else {
            // Nothing counted: no timer, nothing ejected, multipliers reset.
            self.timer = None;
            self.timer_start = None;
            for e in self.endpoints.values_mut() {
                e.ejected_at = None;
                e.multiplier = 0;
            }
        }
        self.config = Some(settings);
        let before = std::mem::take(&mut self.ejected);
        self.ejected = self
            .endpoints
            .values()
            .filter(|e| e.ejected_at.is_some())
            .flat_map(|e| e.addresses.iter().copied())
            .collect();
        Child::update_in(&mut self.child, ctx, (*config.child).clone());
        // The child may have made subchannels for ejected addresses from
        // their real states: show them ejected; and show the real state of
        // addresses no longer ejected.
        let now_ejected: Vec<SocketAddr> = self.ejected.iter().copied().collect();
        for a in now_ejected {
            self.tell(ctx, a, true);
        }
        for a in before
            .difference(&self.ejected)
            .copied()
            .collect::<Vec<_>>()
        {
            self.tell(ctx, a, false);
        }
        self.refresh()
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        if let Event::Timer(token) = *event {
            if self.timer.as_ref().is_some_and(|t| t.token() == token) {
                return self.run_timer(ctx);
            }
        }
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        let changed = match *event {
            // An ejected endpoint's subchannel shows TRANSIENT_FAILURE
            // whatever it does, until it is un-ejected.
            Event::Subchannel(id, addr, _) if self.ejected.contains(&addr) => child.event(
                ctx,
                &Event::Subchannel(id, addr, ConnectivityState::TransientFailure),
            ),
            _ => child.event(ctx, event),
        };
        changed && self.refresh()
    }

    fn state(&self) -> ConnectivityState {
        self.child
            .as_ref()
            .map_or(ConnectivityState::Connecting, |c| c.get().state())
    }

    fn picker(&self) -> SharedPicker {
        self.picker.clone().unwrap_or_else(super::queue_picker)
    }

    fn stats(&self) -> PolicyStats {
        let mut facts = vec![(
            "ejected".to_owned(),
            format!(
                "{}/{}",
                self.endpoints
                    .values()
                    .filter(|e| e.ejected_at.is_some())
                    .count(),
                self.endpoints.len()
            ),
        )];
        facts.push(("ejections".to_owned(), self.ejections.to_string()));
        if let Some(c) = &self.config {
            facts.push(("interval_ms".to_owned(), c.interval.as_millis().to_string()));
            facts.push((
                "max_ejection_percent".to_owned(),
                c.max_ejection_percent.to_string(),
            ));
        }
        for e in self.endpoints.values().filter(|e| e.ejected_at.is_some()) {
            facts.push((
                format!("ejected {:?}", e.addresses),
                format!("multiplier {}", e.multiplier),
            ));
        }
        PolicyStats {
            policy: "outlier_detection",
            name: None,
            state: self.state(),
            facts,
            endpoints: Vec::new(),
            sessions: Vec::new(),
            children: self.child.iter().map(|c| c.get().stats()).collect(),
        }
    }
}

#[cfg(test)]
mod tests;
