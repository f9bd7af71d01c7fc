//! One endpoint's weight from its load reports (gRFC A58):
//! `qps / (utilization + eps / qps * error_utilization_penalty)`, the
//! utilization being `application_utilization` when set, else
//! `cpu_utilization`. A weight is usable only after reports have come in
//! for `blackout_period` (a fresh endpoint's first numbers are noisy) and
//! until none has come in for `weight_expiration_period`; after such a
//! gap, or a reconnection, the blackout starts again. An unusable weight reads as 0, which the
//! scheduler replaces by the mean of the others.
//!
//! Reports arrive from calls ending on any thread (per call) or from the
//! out-of-band stream; the LB task reads the weights every
//! `weight_update_period`. A short mutex guards the few fields: picks never
//! touch it. A server usually sends the same trailer call after call (its
//! metrics change more slowly than calls end), so the last trailer's bytes
//! and weight are kept and an equal trailer is not decoded again.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::lb::CallTracker;
use http::HeaderValue;

use crate::orca::{report_from_value, OrcaLoadReport, PER_CALL_TRAILER};

/// Why an endpoint's weight is not used (gRFC A78 counts each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// No report yet, or reports for less than the blackout period.
    NotYetUsable,
    /// The last report is older than the expiration period.
    Stale,
}

/// An endpoint's weight and the times that make it usable.
#[derive(Debug)]
pub struct EndpointWeight {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The weight of the last usable report.
    weight: f64,
    /// When the current run of reports began (reset by a gap longer than
    /// the expiration period, or by a reconnection).
    non_empty_since: Option<Instant>,
    /// When the last usable report came in.
    last_updated: Option<Instant>,
    /// The config's `error_utilization_penalty`, applied as reports come in.
    error_utilization_penalty: f64,
    /// Whether the endpoint is READY, and whether it ever was.
    ready: bool,
    ever_ready: bool,
    /// The last per-call trailer decoded, and its weight (`None`:
    /// unusable) under the current penalty.
    last_trailer: Option<(Box<[u8]>, Option<f64>)>,
}

impl State {
    /// A report's weight (`None`: unusable) received at `now`.
    fn take(&mut self, weight: Option<f64>, now: Instant) -> bool {
        let Some(weight) = weight else {
            return false;
        };
        self.weight = weight;
        self.non_empty_since.get_or_insert(now);
        self.last_updated = Some(now);
        true
    }
}

impl EndpointWeight {
    /// An endpoint without reports yet, weighing errors by `penalty`.
    pub fn new(error_utilization_penalty: f32) -> Self {
        EndpointWeight {
            state: Mutex::new(State {
                weight: 0.0,
                non_empty_since: None,
                last_updated: None,
                error_utilization_penalty: f64::from(error_utilization_penalty),
                ready: false,
                ever_ready: false,
                last_trailer: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The fields stay consistent whatever panicked: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new config's penalty, for the reports to come.
    pub fn set_error_utilization_penalty(&self, penalty: f32) {
        let mut s = self.lock();
        s.error_utilization_penalty = f64::from(penalty);
        // Its weight was under the old penalty.
        s.last_trailer = None;
    }

    /// Takes a load report received at `now`. Returns whether it was
    /// usable: a report without qps or without utilization says nothing
    /// about weight and is ignored.
    pub fn report(&self, report: &OrcaLoadReport, now: Instant) -> bool {
        let mut s = self.lock();
        let weight = usable_weight(report, s.error_utilization_penalty);
        s.take(weight, now)
    }

    /// Takes a per-call trailer value (a serialized report, base64)
    /// received at `now`, as [`EndpointWeight::report`] takes the report;
    /// the same bytes as the last trailer's are not decoded again.
    pub fn report_trailer(&self, value: &HeaderValue, now: Instant) -> bool {
        let mut s = self.lock();
        let weight = match &s.last_trailer {
            Some((last, weight)) if **last == *value.as_bytes() => *weight,
            _ => {
                let weight = report_from_value(value)
                    .and_then(|r| usable_weight(&r, s.error_utilization_penalty));
                // A copy: the value may share a larger received buffer.
                s.last_trailer = Some((value.as_bytes().into(), weight));
                weight
            }
        };
        s.take(weight, now)
    }

    /// The weight to schedule with at `now`: 0 (unknown) before the first
    /// report, within `blackout` of the first report of the current run,
    /// and once the last report is `expiration` old; an expired weight
    /// also restarts the blackout for the reports to come.
    pub fn weight(&self, now: Instant, expiration: Duration, blackout: Duration) -> f64 {
        self.reading(now, expiration, blackout).0
    }

    /// [`EndpointWeight::weight`], and why it is 0 when A78 counts it:
    /// [`Unusable::Stale`] once expired, [`Unusable::NotYetUsable`] before
    /// the blackout is over (no report at all included, when there is a
    /// blackout), as C-core's counts tell them apart.
    pub fn reading(
        &self,
        now: Instant,
        expiration: Duration,
        blackout: Duration,
    ) -> (f64, Option<Unusable>) {
        let mut s = self.lock();
        if let Some(last) = s.last_updated {
            if now.saturating_duration_since(last) >= expiration {
                s.non_empty_since = None;
                return (0.0, Some(Unusable::Stale));
            }
        }
        if blackout.is_zero() {
            // No blackout: the last weight as soon as there is one (0
            // before any report), a reconnection notwithstanding.
            return (s.weight, None);
        }
        match s.non_empty_since {
            Some(since) if now.saturating_duration_since(since) >= blackout => (s.weight, None),
            // No report yet, or a run too young (a reconnection, an expiry).
            _ => (0.0, Some(Unusable::NotYetUsable)),
        }
    }

    /// The endpoint became READY or left it. Coming back to READY after
    /// a disconnection starts the blackout again, as the new connection may
    /// reach another process (C-core keeps the last weight and its time
    /// for expiry; grpc-go forgets both, which picks the same).
    pub fn set_ready(&self, ready: bool) {
        let mut s = self.lock();
        if ready && !s.ready && s.ever_ready {
            s.non_empty_since = None;
        }
        s.ready = ready;
        s.ever_ready |= ready;
    }
}

/// [`weight_of`], logging a report it cannot use.
fn usable_weight(report: &OrcaLoadReport, penalty: f64) -> Option<f64> {
    let weight = weight_of(report, penalty);
    if weight.is_none() {
        log::trace!(
            "load report without qps ({}) or utilization (application {}, cpu {}): ignored",
            report.rps_fractional,
            report.application_utilization,
            report.cpu_utilization
        );
    }
    weight
}

/// A report's weight under `penalty`, if it has both qps and utilization.
pub fn weight_of(report: &OrcaLoadReport, penalty: f64) -> Option<f64> {
    let utilization = if report.application_utilization > 0.0 {
        report.application_utilization
    } else {
        report.cpu_utilization
    };
    let qps = report.rps_fractional;
    if !qps.is_finite() || !utilization.is_finite() || qps <= 0.0 || utilization <= 0.0 {
        return None;
    }
    let error_rate = if report.eps > 0.0 {
        report.eps / qps
    } else {
        0.0
    };
    let weight = qps / (utilization + error_rate * penalty);
    (weight.is_finite() && weight > 0.0).then_some(weight)
}

/// As a pick's tracker (when out-of-band reporting is off), the endpoint
/// takes the per-call load report of the call's trailers.
impl CallTracker for EndpointWeight {
    fn finished(&self, _ok: bool) {}

    fn finished_with_trailers(&self, _ok: bool, trailers: Option<&http::HeaderMap>) {
        if let Some(value) = trailers.and_then(|t| t.get(PER_CALL_TRAILER)) {
            self.report_trailer(value, Instant::now());
        }
    }
}
