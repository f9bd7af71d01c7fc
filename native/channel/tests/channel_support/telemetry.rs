//! Reading back what a channel recorded: an OpenTelemetry SDK meter
//! provider whose exports land in memory, flattened per instrument.
#![allow(dead_code)]

use std::collections::BTreeMap;

use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

/// The Echo method as `grpc.method` records it.
pub const METHOD: &str = "tether.demo.v1.Echo/Echo";

/// A meter provider whose exports land in memory.
pub struct Recorder {
    pub provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
}

/// One instrument's points: label set → (count or sum, histogram sum).
#[derive(Debug, Default)]
pub struct Instrument {
    pub unit: String,
    pub points: BTreeMap<Vec<(String, String)>, (u64, f64)>,
    pub bounds: Vec<f64>,
}

impl Recorder {
    pub fn new() -> Recorder {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Recorder { provider, exporter }
    }

    /// What was recorded so far, by instrument name (cumulative).
    pub fn read(&self) -> BTreeMap<String, Instrument> {
        self.exporter.reset();
        self.provider.force_flush().expect("flush");
        let exported = self.exporter.get_finished_metrics().expect("metrics");
        let mut out = BTreeMap::new();
        for rm in exported.iter().rev().take(1) {
            for scope in rm.scope_metrics() {
                assert_eq!(scope.scope().name(), "tether");
                for m in scope.metrics() {
                    let mut i = Instrument {
                        unit: m.unit().to_owned(),
                        ..Default::default()
                    };
                    let labels = |attrs: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
                        let mut l: Vec<(String, String)> = attrs
                            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                            .collect();
                        l.sort();
                        l
                    };
                    match m.data() {
                        AggregatedMetrics::U64(MetricData::Sum(s)) => {
                            for p in s.data_points() {
                                i.points
                                    .insert(labels(&mut p.attributes()), (p.value(), 0.0));
                            }
                        }
                        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                            for p in h.data_points() {
                                i.bounds = p.bounds().collect();
                                i.points
                                    .insert(labels(&mut p.attributes()), (p.count(), p.sum()));
                            }
                        }
                        AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                            for p in h.data_points() {
                                i.bounds = p.bounds().collect();
                                i.points.insert(
                                    labels(&mut p.attributes()),
                                    (p.count(), p.sum() as f64),
                                );
                            }
                        }
                        // Up-down counters (never below 0 here).
                        AggregatedMetrics::I64(MetricData::Sum(s)) => {
                            for p in s.data_points() {
                                let n = u64::try_from(p.value()).expect("not below 0");
                                i.points.insert(labels(&mut p.attributes()), (n, 0.0));
                            }
                        }
                        AggregatedMetrics::U64(MetricData::Gauge(g)) => {
                            for p in g.data_points() {
                                i.points
                                    .insert(labels(&mut p.attributes()), (p.value(), 0.0));
                            }
                        }
                        other => panic!("{}: unexpected data {other:?}", m.name()),
                    }
                    out.insert(m.name().to_owned(), i);
                }
            }
        }
        out
    }
}

/// A label set as `Recorder::read` keys it.
pub fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut l: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    l
}
