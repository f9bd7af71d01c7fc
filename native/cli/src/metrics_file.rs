//! `tether call --metrics FILE`: what the channel recorded (gRPC's metrics,
//! gRFC A66), written as the OpenTelemetry file exporter writes metrics:
//! OTLP JSON, one `ExportMetricsServiceRequest` per line. One line is
//! written when the channel's calls are over (cumulative figures).

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};

/// An exporter appending each export to a file as one JSON line.
#[derive(Debug, Clone)]
struct JsonLines {
    file: Arc<Mutex<File>>,
    path: PathBuf,
}

impl PushMetricExporter for JsonLines {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let request = ExportMetricsServiceRequest::from(metrics);
        let mut line = serde_json::to_string(&request)
            .map_err(|e| OTelSdkError::InternalFailure(format!("OTLP JSON: {e}")))?;
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.write_all(line.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| {
                OTelSdkError::InternalFailure(format!("--metrics {}: {e}", self.path.display()))
            })
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// The meter provider of `--metrics FILE`.
#[derive(Debug)]
pub struct MetricsFile {
    provider: SdkMeterProvider,
}

impl MetricsFile {
    /// Creates (or truncates) `path` now, so that a path that cannot be
    /// written fails before any call is made.
    pub fn create(path: &Path) -> Result<MetricsFile, String> {
        let file = File::create(path).map_err(|e| format!("--metrics {}: {e}", path.display()))?;
        let exporter = JsonLines {
            file: Arc::new(Mutex::new(file)),
            path: path.to_owned(),
        };
        // Exported once, at the end: the interval only has to outlast a run.
        let reader = PeriodicReader::builder(exporter)
            .with_interval(Duration::from_secs(24 * 3600))
            .build();
        Ok(MetricsFile {
            provider: SdkMeterProvider::builder().with_reader(reader).build(),
        })
    }

    /// The channel's telemetry, recording into this file's provider.
    pub fn telemetry(&self) -> tether::Telemetry {
        tether::Telemetry::builder(&self.provider).build()
    }

    /// Writes what was recorded as one line.
    pub fn write(self) -> Result<(), String> {
        self.provider
            .shutdown()
            .map_err(|e| format!("--metrics: {e}"))
    }
}
