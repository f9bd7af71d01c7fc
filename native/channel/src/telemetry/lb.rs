//! What the LB policies record (gRFC A79's non-per-call instruments):
//! A78's `weighted_round_robin` instruments and A91's outlier-detection
//! ones. Each is labelled with `grpc.target` and, when the user turned them
//! on ([`super::TelemetryBuilder::add_optional_label`]), with
//! `grpc.lb.locality` and `grpc.lb.backend_service` of the subtree the
//! policy runs in (empty where there is none, as gRPC records it).
//!
//! A policy takes its recorder when it is updated, from the LB context:
//! `cds` names the backend service (the cluster) for its subtree and
//! `weighted_target` the locality for each child. Recording happens on the
//! LB task only (a scheduler rebuild, an ejection sweep), never on a pick.
//! `xds_override_host` registers its session map here too, which
//! `tether.client.sessions` reads when the meter collects; and
//! `xds_cluster_impl` puts [`CallLabels`] on its picks for the attempts'
//! optional labels.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use opentelemetry::metrics::Counter;
use opentelemetry::KeyValue;

use super::{or_empty, Instruments, OptionalLabels};

/// The labels of the LB subtree being updated or told of an event.
#[derive(Debug, Clone, Default)]
pub(crate) struct LbLabels {
    /// The xDS cluster (gRFC A89), set by `cds`.
    pub(crate) backend_service: Option<Arc<str>>,
    /// The locality (A78), set by `weighted_target` for its children.
    pub(crate) locality: Option<Arc<str>>,
}

/// The optional labels of an attempt's metrics that its pick knows: the
/// cluster (gRFC A89's `grpc.lb.backend_service`) and the picked
/// endpoint's locality (A78's `grpc.lb.locality`). `xds_cluster_impl`'s
/// picker sets them on its picks when the channel records either label.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallLabels {
    /// The cluster's name.
    pub backend_service: Arc<str>,
    /// The locality, as gRPC prints it (`{region="…", zone="…",
    /// sub_zone="…"}`).
    pub locality: Arc<str>,
}

impl CallLabels {
    /// Labels of a pick in `locality` of `backend_service`.
    pub fn new(backend_service: Arc<str>, locality: Arc<str>) -> Self {
        CallLabels {
            backend_service,
            locality,
        }
    }
}

/// One channel's recorder for its LB policies.
#[derive(Debug)]
pub(crate) struct LbMetrics {
    instruments: Arc<Instruments>,
    target: KeyValue,
}

impl LbMetrics {
    pub(super) fn new(instruments: Arc<Instruments>, target: KeyValue) -> Self {
        LbMetrics {
            instruments,
            target,
        }
    }

    /// `grpc.target`, then the optional labels turned on, with `labels`'
    /// values (empty where unset); the locality only for instruments that
    /// take it.
    fn labels(&self, labels: &LbLabels, locality: bool) -> Vec<KeyValue> {
        let on = OptionalLabels {
            locality: locality && self.instruments.optional_labels.locality,
            ..self.instruments.optional_labels
        };
        let mut out = vec![self.target.clone()];
        on.append(
            &mut out,
            labels.backend_service.as_ref(),
            labels.locality.as_ref(),
        );
        out
    }

    /// Whether attempts record an optional label their pick knows.
    pub(crate) fn call_labels(&self) -> bool {
        self.instruments.optional_labels.any()
    }

    /// Has `source`'s sessions observed by `tether.client.sessions`, with
    /// this channel's target and `labels`' backend service, until it is
    /// dropped.
    pub(crate) fn watch_sessions(&self, labels: &LbLabels, source: Weak<dyn SessionSource>) {
        let base = [
            self.target.clone(),
            KeyValue::new(
                "grpc.lb.backend_service",
                or_empty(labels.backend_service.as_ref()),
            ),
        ];
        self.instruments.session_sources.add(base, source);
    }

    /// What a `weighted_round_robin` policy under `labels` records, if any
    /// of its instruments is on.
    pub(crate) fn weighted_round_robin(&self, labels: &LbLabels) -> Option<WrrRecorder> {
        let i = &self.instruments;
        let any = i.wrr_rr_fallback.is_some()
            || i.wrr_not_yet_usable.is_some()
            || i.wrr_stale.is_some()
            || i.wrr_weights.is_some();
        any.then(|| WrrRecorder {
            labels: self.labels(labels, true),
            instruments: i.clone(),
        })
    }

    /// What an `outlier_detection` policy under `labels` records, if either
    /// of its instruments is on. A91 gives it no locality label.
    pub(crate) fn outlier_detection(&self, labels: &LbLabels) -> Option<OutlierRecorder> {
        let i = &self.instruments;
        (i.od_enforced.is_some() || i.od_unenforced.is_some()).then(|| OutlierRecorder {
            labels: self.labels(labels, false),
            instruments: i.clone(),
        })
    }
}

/// Records A78's `grpc.lb.wrr.*` for one policy.
#[derive(Debug, Clone)]
pub(crate) struct WrrRecorder {
    labels: Vec<KeyValue>,
    instruments: Arc<Instruments>,
}

impl WrrRecorder {
    /// Records one scheduler rebuild: each READY endpoint's weight (0:
    /// unusable), the endpoints not yet usable and stale, and whether it
    /// fell back to round robin.
    pub(crate) fn scheduler_update(
        &self,
        weights: &[f64],
        not_yet_usable: u64,
        stale: u64,
        fallback: bool,
    ) {
        let i = &self.instruments;
        if let Some(h) = &i.wrr_weights {
            for w in weights {
                h.record(*w, &self.labels);
            }
        }
        // As C-core: both counts on every rebuild (0 included), so that
        // the series exist; the fallback only when it happened.
        add(&i.wrr_not_yet_usable, not_yet_usable, &self.labels);
        add(&i.wrr_stale, stale, &self.labels);
        if fallback {
            add(&i.wrr_rr_fallback, 1, &self.labels);
        }
    }
}

/// Records A91's `grpc.lb.outlier_detection.*` for one policy.
#[derive(Debug, Clone)]
pub(crate) struct OutlierRecorder {
    labels: Vec<KeyValue>,
    instruments: Arc<Instruments>,
}

impl OutlierRecorder {
    /// An outlier detected by `method` (A91's
    /// `grpc.lb.outlier_detection.detection_method`), ejected (`None`) or
    /// not (A91's `unenforced_reason`).
    pub(crate) fn detected(&self, method: &'static str, unenforced: Option<&'static str>) {
        let i = &self.instruments;
        let mut labels = self.labels.clone();
        labels.push(KeyValue::new(
            "grpc.lb.outlier_detection.detection_method",
            method,
        ));
        match unenforced {
            None => add(&i.od_enforced, 1, &labels),
            Some(why) => {
                labels.push(KeyValue::new(
                    "grpc.lb.outlier_detection.unenforced_reason",
                    why,
                ));
                add(&i.od_unenforced, 1, &labels);
            }
        }
    }
}

/// Adds `n` to `counter`, when it is on.
fn add(counter: &Option<Counter<u64>>, n: u64, labels: &[KeyValue]) {
    if let Some(c) = counter {
        c.add(n, labels);
    }
}

/// What `xds_override_host` tells of its sessions when the meter collects:
/// each endpoint address with sessions pinned to it, its EDS health and
/// how many.
pub(crate) trait SessionSource: Send + Sync {
    /// The pinned sessions now, by address.
    fn pinned(&self) -> Vec<(SocketAddr, &'static str, u64)>;
}

/// The session sources of the channels that record with one telemetry,
/// each with its labels (`grpc.target`, `grpc.lb.backend_service`); one
/// that was dropped is forgotten when next read.
#[derive(Default)]
pub(crate) struct SessionSources(Mutex<Vec<Watched>>);

/// A session source and its labels.
type Watched = ([KeyValue; 2], Weak<dyn SessionSource>);

impl std::fmt::Debug for SessionSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionSources").finish_non_exhaustive()
    }
}

impl SessionSources {
    fn add(&self, labels: [KeyValue; 2], source: Weak<dyn SessionSource>) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Sources of policies gone are dropped here too, so that a meter
        // that never collects does not keep them all.
        all.retain(|(_, s)| s.strong_count() > 0);
        all.push((labels, source));
    }

    /// Calls `f` with each live source's labels and pinned sessions.
    pub(super) fn each(&self, mut f: impl FnMut(&[KeyValue; 2], SocketAddr, &'static str, u64)) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|(labels, source)| match source.upgrade() {
            Some(s) => {
                for (address, health, n) in s.pinned() {
                    f(labels, address, health, n);
                }
                true
            }
            None => false,
        });
    }
}
