//! ORCA load reports (gRFC A51): what a backend says about its own load,
//! for client-side policies such as `weighted_round_robin` (gRFC A58).
//!
//! - [`OrcaLoadReport`]: the `xds.data.orca.v3.OrcaLoadReport` message
//!   (Envoy's API crate does not carry the `xds.data.orca` package, so its
//!   fields are declared here by their proto tags).
//! - Per-call reports travel in the response trailer
//!   [`PER_CALL_TRAILER`] (`endpoint-load-metrics-bin`), the binary
//!   serialized message, base64 on the wire as every `-bin` metadata is;
//!   [`report_from_trailers`] reads one.
//! - [`LoadReportLayer`]: a tower `Layer` for a tonic server that adds the
//!   server's current [`ServerMetrics`] as that trailer to every response,
//!   so a tether user's backend can report its load.
//! - Out of band, a client opens
//!   `xds.service.orca.v3.OpenRcaService/StreamCoreMetrics` on a
//!   connection and the server streams reports at the interval asked:
//!   [`OrcaService`] serves it from [`ServerMetrics`], [`OobStream`] keeps
//!   one open on a subchannel for a client policy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use http::HeaderValue;
use prost::Message as _;

mod client;
mod layer;
mod service;

pub use client::OobStream;
pub use layer::{LoadReportBody, LoadReportFuture, LoadReportLayer, LoadReportService};
pub use service::{OrcaService, DEFAULT_MIN_REPORT_INTERVAL};

/// Base64 as gRPC's `-bin` metadata uses it: the standard alphabet, padded
/// by some senders and not by others, so decoding accepts both.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The response trailer that carries a per-call load report.
pub const PER_CALL_TRAILER: &str = "endpoint-load-metrics-bin";

/// `xds.data.orca.v3.OrcaLoadReport`: a backend's load, as gRFC A51 reports it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OrcaLoadReport {
    /// CPU utilization, usually in [0, 1] (may exceed 1 on a busy host).
    #[prost(double, tag = "1")]
    pub cpu_utilization: f64,
    /// Memory utilization in [0, 1].
    #[prost(double, tag = "2")]
    pub mem_utilization: f64,
    /// Deprecated integer queries per second; `rps_fractional` replaces it.
    #[prost(uint64, tag = "3")]
    pub rps: u64,
    /// Per-request costs by name.
    #[prost(map = "string, double", tag = "4")]
    pub request_cost: HashMap<String, f64>,
    /// Named utilizations in [0, 1].
    #[prost(map = "string, double", tag = "5")]
    pub utilization: HashMap<String, f64>,
    /// Queries per second the backend serves.
    #[prost(double, tag = "6")]
    pub rps_fractional: f64,
    /// Errors per second.
    #[prost(double, tag = "7")]
    pub eps: f64,
    /// Application-defined metrics.
    #[prost(map = "string, double", tag = "8")]
    pub named_metrics: HashMap<String, f64>,
    /// The application's own notion of utilization; preferred over
    /// `cpu_utilization` by `weighted_round_robin` when set.
    #[prost(double, tag = "9")]
    pub application_utilization: f64,
}

impl prost::Name for OrcaLoadReport {
    const NAME: &'static str = "OrcaLoadReport";
    const PACKAGE: &'static str = "xds.data.orca.v3";
}

/// `xds.service.orca.v3.OrcaLoadReportRequest`: what a client asks of an
/// out-of-band reporting stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OrcaLoadReportRequest {
    /// How often to report (the server may report less often).
    #[prost(message, optional, tag = "1")]
    pub report_interval: Option<envoy_types::pb::google::protobuf::Duration>,
    /// Request costs the client wants reported, by name.
    #[prost(string, repeated, tag = "2")]
    pub request_cost_names: Vec<String>,
}

impl prost::Name for OrcaLoadReportRequest {
    const NAME: &'static str = "OrcaLoadReportRequest";
    const PACKAGE: &'static str = "xds.service.orca.v3";
}

/// The gRPC service that streams out-of-band load reports.
pub const SERVICE_NAME: &str = "xds.service.orca.v3.OpenRcaService";
/// The path of its one method.
pub const STREAM_CORE_METRICS_PATH: &str = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics";

/// The per-call load report in a call's trailers (or trailers-only
/// headers), if it carries a valid one. A malformed trailer is logged and
/// ignored: the call itself is unaffected.
pub fn report_from_trailers(trailers: &http::HeaderMap) -> Option<OrcaLoadReport> {
    report_from_value(trailers.get(PER_CALL_TRAILER)?)
}

/// The load report of one [`PER_CALL_TRAILER`] value, if it is one.
pub fn report_from_value(value: &HeaderValue) -> Option<OrcaLoadReport> {
    let bytes = match BASE64.decode(value.as_bytes()) {
        Ok(b) => b,
        Err(e) => {
            log::debug!("{PER_CALL_TRAILER} {value:?} is not base64: {e}");
            return None;
        }
    };
    match OrcaLoadReport::decode(bytes.as_slice()) {
        Ok(r) => Some(r),
        Err(e) => {
            log::debug!("{PER_CALL_TRAILER} is not an OrcaLoadReport: {e}");
            None
        }
    }
}

/// The trailer value for `report`: the serialized message, base64.
pub fn trailer_value(report: &OrcaLoadReport) -> HeaderValue {
    let encoded = BASE64.encode(report.encode_to_vec());
    // Base64 is always a valid header value.
    HeaderValue::from_str(&encoded).expect("base64 is a valid header value")
}

/// A server's current load as it reports it, shared between the code that
/// measures it and [`LoadReportLayer`]. Cloning shares the same values.
#[derive(Debug, Clone, Default)]
pub struct ServerMetrics {
    inner: Arc<Mutex<OrcaLoadReport>>,
}

impl ServerMetrics {
    /// Metrics with nothing set (an empty report).
    pub fn new() -> Self {
        ServerMetrics::default()
    }

    fn set(&self, f: impl FnOnce(&mut OrcaLoadReport)) {
        // A panic while holding the lock cannot leave a report half-made
        // in a way that matters: keep serving the last values.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard);
    }

    /// Sets the CPU utilization.
    pub fn set_cpu_utilization(&self, v: f64) {
        self.set(|r| r.cpu_utilization = v);
    }

    /// Sets the application utilization (preferred over CPU by
    /// `weighted_round_robin`).
    pub fn set_application_utilization(&self, v: f64) {
        self.set(|r| r.application_utilization = v);
    }

    /// Sets the memory utilization.
    pub fn set_mem_utilization(&self, v: f64) {
        self.set(|r| r.mem_utilization = v);
    }

    /// Sets the queries per second.
    pub fn set_qps(&self, v: f64) {
        self.set(|r| r.rps_fractional = v);
    }

    /// Sets the errors per second.
    pub fn set_eps(&self, v: f64) {
        self.set(|r| r.eps = v);
    }

    /// Sets one named metric.
    pub fn set_named_metric(&self, name: impl Into<String>, v: f64) {
        self.set(|r| {
            r.named_metrics.insert(name.into(), v);
        });
    }

    /// A copy of the current report.
    pub fn snapshot(&self) -> OrcaLoadReport {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailer_round_trips_padded_or_not() {
        let report = OrcaLoadReport {
            cpu_utilization: 0.5,
            application_utilization: 0.25,
            rps_fractional: 12.5,
            eps: 1.0,
            ..Default::default()
        };
        let mut h = http::HeaderMap::new();
        h.insert(PER_CALL_TRAILER, trailer_value(&report));
        assert_eq!(report_from_trailers(&h), Some(report.clone()));
        let padded = base64::engine::general_purpose::STANDARD.encode(report.encode_to_vec());
        h.insert(PER_CALL_TRAILER, HeaderValue::from_str(&padded).unwrap());
        assert_eq!(report_from_trailers(&h), Some(report));
        h.insert(PER_CALL_TRAILER, HeaderValue::from_static("!!!"));
        assert_eq!(report_from_trailers(&h), None);
        assert_eq!(report_from_trailers(&http::HeaderMap::new()), None);
    }
}
