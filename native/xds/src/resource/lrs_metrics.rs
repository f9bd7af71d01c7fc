//! CDS `lrs_report_endpoint_metrics` (gRFC A85) as a cluster resource
//! carries it: which fields of a call's ORCA per-call report the cluster's
//! load reports carry ([`crate::load_report`] sums them).

use std::collections::BTreeSet;

/// What `lrs_report_endpoint_metrics` and the reports put before a key of
/// the ORCA `named_metrics` map (gRFC A85).
pub const NAMED_METRICS_PREFIX: &str = "named_metrics.";

/// Which fields of a call's ORCA per-call report (gRFC A51) a cluster's
/// load reports carry (gRFC A85), as CDS `lrs_report_endpoint_metrics`
/// names them. The default (the field unset or empty) propagates nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct BackendMetricPropagation {
    /// `cpu_utilization`: into the locality's `cpu_utilization`.
    pub cpu_utilization: bool,
    /// `mem_utilization`: into the locality's `mem_utilization`.
    pub mem_utilization: bool,
    /// `application_utilization`: into the locality's
    /// `application_utilization`.
    pub application_utilization: bool,
    /// `named_metrics.*`: every key of `named_metrics`.
    pub all_named_metrics: bool,
    /// `named_metrics.<key>`: these keys (empty when all are propagated).
    pub named_metrics: BTreeSet<String>,
}

impl BackendMetricPropagation {
    /// The propagation `lrs_report_endpoint_metrics` asks for. A string
    /// that names no field gRPC propagates (another ORCA field, a later
    /// one, `named_metrics.` without a key) is ignored, for forward
    /// compatibility (A85).
    pub fn from_names<I>(names: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut p = BackendMetricPropagation::default();
        for name in names {
            match name.as_ref() {
                "cpu_utilization" => p.cpu_utilization = true,
                "mem_utilization" => p.mem_utilization = true,
                "application_utilization" => p.application_utilization = true,
                "named_metrics.*" => p.all_named_metrics = true,
                other => match other.strip_prefix(NAMED_METRICS_PREFIX) {
                    Some(key) if !key.is_empty() => {
                        p.named_metrics.insert(key.to_owned());
                    }
                    _ => log::debug!(
                        "lrs_report_endpoint_metrics {other:?} ignored: not a field gRPC propagates"
                    ),
                },
            }
        }
        if p.all_named_metrics {
            // Equal configs compare equal however they were spelled.
            p.named_metrics.clear();
        }
        p
    }

    /// Whether nothing is propagated.
    pub fn is_empty(&self) -> bool {
        !(self.cpu_utilization
            || self.mem_utilization
            || self.application_utilization
            || self.all_named_metrics)
            && self.named_metrics.is_empty()
    }

    /// Whether the named metric `key` is propagated.
    pub fn propagates_named(&self, key: &str) -> bool {
        self.all_named_metrics || self.named_metrics.contains(key)
    }
}
