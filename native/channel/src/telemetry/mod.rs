//! gRPC's standard metrics over OpenTelemetry (gRFC A66): the instruments
//! every gRPC client has, with their names, units, label keys and bucket
//! boundaries, recorded by [`crate::Channel`] when it is given a
//! [`Telemetry`].
//!
//! | Instrument | Kind | Unit | Labels |
//! |---|---|---|---|
//! | `grpc.client.attempt.started` | counter | `{attempt}` | `grpc.method`, `grpc.target` |
//! | `grpc.client.attempt.duration` | histogram (latency) | `s` | `grpc.method`, `grpc.target`, `grpc.status` |
//! | `grpc.client.attempt.sent_total_compressed_message_size` | histogram (size) | `By` | `grpc.method`, `grpc.target`, `grpc.status` |
//! | `grpc.client.attempt.rcvd_total_compressed_message_size` | histogram (size) | `By` | `grpc.method`, `grpc.target`, `grpc.status` |
//! | `grpc.client.call.duration` | histogram (latency) | `s` | `grpc.method`, `grpc.target`, `grpc.status` |
//! | `grpc.client.call.retries` (A96, off by default) | histogram (1..5) | `{retry}` | `grpc.method`, `grpc.target` |
//! | `grpc.client.call.transparent_retries` (A96, off by default) | histogram (1..10) | `{transparent_retry}` | `grpc.method`, `grpc.target` |
//! | `grpc.client.call.retry_delay` (A96, off by default) | histogram (latency) | `s` | `grpc.method`, `grpc.target` |
//!
//! | `grpc.xds_client.connected` (A78, off by default) | gauge | `{bool}` | `grpc.target`, `grpc.xds.server` |
//! | `grpc.xds_client.server_failure` (A78, off by default) | counter | `{failure}` | `grpc.target`, `grpc.xds.server` |
//! | `grpc.xds_client.resource_updates_valid` (A78, off by default) | counter | `{resource}` | `grpc.target`, `grpc.xds.server`, `grpc.xds.resource_type` |
//! | `grpc.xds_client.resource_updates_invalid` (A78, off by default) | counter | `{resource}` | `grpc.target`, `grpc.xds.server`, `grpc.xds.resource_type` |
//! | `grpc.xds_client.resources` (A78, off by default) | gauge | `{resource}` | `grpc.target`, `grpc.xds.authority`, `grpc.xds.cache_state`, `grpc.xds.resource_type` |
//! | `grpc.lb.wrr.rr_fallback` (A78, off by default) | counter | `{update}` | `grpc.target`, `grpc.lb.locality`\*, `grpc.lb.backend_service`\* |
//! | `grpc.lb.wrr.endpoint_weight_not_yet_usable` (A78, off by default) | counter | `{endpoint}` | the same |
//! | `grpc.lb.wrr.endpoint_weight_stale` (A78, off by default) | counter | `{endpoint}` | the same |
//! | `grpc.lb.wrr.endpoint_weights` (A78, off by default) | histogram | `{weight}` | the same |
//! | `grpc.lb.outlier_detection.ejections_enforced` (A91, off by default) | counter | `{ejection}` | `grpc.target`, `grpc.lb.backend_service`\*, `grpc.lb.outlier_detection.detection_method` |
//! | `grpc.lb.outlier_detection.ejections_unenforced` (A91, off by default) | counter | `{ejection}` | the same, `grpc.lb.outlier_detection.unenforced_reason` |
//! | `grpc.subchannel.connection_attempts_succeeded`, `_failed` (A94, off by default) | counter | `{attempt}` | `grpc.target`, `grpc.lb.backend_service`\*, `grpc.lb.locality`\* |
//! | `grpc.subchannel.disconnections` (A94, off by default) | counter | `{disconnection}` | the same, `grpc.disconnect_error` |
//! | `grpc.subchannel.open_connections` (A94, off by default) | up-down counter | `{connection}` | the same |
//! | `tether.client.session.calls` | counter | `{call}` | `grpc.target`, `tether.session.call` |
//! | `tether.client.session.cookies` | counter | `{cookie}` | `grpc.target`, `tether.session.cookie` |
//! | `tether.client.session.envoy_misreads` | counter | `{call}` | `grpc.target` |
//! | `tether.client.sessions` | gauge | `{session}` | `grpc.target`, `grpc.lb.backend_service`, `tether.endpoint`, `tether.endpoint.health` |
//!
//! \* Optional labels, recorded only when named in
//! [`TelemetryBuilder::add_optional_label`] (gRFC A79), as in gRPC; empty
//! where the channel has no value (a locality outside xDS).
//!
//! A78's `weighted_round_robin` instruments are recorded on every scheduler
//! rebuild (each `weight_update_period`): each READY endpoint's weight (0
//! when unusable), how many endpoints had no usable weight yet (no report,
//! or within the blackout) and how many had a stale one, and a fallback to
//! round robin when fewer than two weights were usable. A91's are recorded
//! on each outlier-detection interval, for each outlier found: ejected, or
//! not for `enforcement_percentage` (the draw said no) or
//! `max_ejection_overflow` (the cap), the draw coming first as in C-core.
//! `tether.client.sessions` is observed when the meter collects, from
//! `xds_override_host`'s session map: one series per endpoint with pinned
//! sessions (bounded by the cluster's endpoints), so an operator sees the
//! sessions still on DRAINING endpoints.
//!
//! The `tether.` instruments are tether's own (no gRPC implementation
//! has sessions to count): each call through a stateful session, by what
//! became of it (`pinned`: the cookie's endpoint answered; `moved`: another
//! did; `new`: no cookie; `refused`: a cookie that was invalid, expired or
//! not verified); each cookie a response set, by why (`new`, `moved`,
//! `reissued`); and each call pinned by a cookie stock Envoy would misread.
//!
//! A78's XdsClient instruments are polled from the channel's XdsClient
//! when the meter collects (`tether_xds::client::XdsClientMetrics`): a
//! client shared by channels of one target is read once; one that stopped
//! is forgotten. `grpc.xds.resource_type` is the type URL without
//! `type.googleapis.com/`, `grpc.xds.authority` is `#old` for names that
//! are not `xdstp:`, and `grpc.xds.cache_state` takes C-core's values with
//! A88's (`requested`, `acked`, `nacked`, `nacked_but_cached`,
//! `does_not_exist`, `does_not_exist_but_cached`, `received_error`,
//! `received_error_but_cached`, `timeout`).
//!
//! A96's instruments are experimental in gRPC, so off until named in
//! [`TelemetryBuilder::enable_metric`] (gRFC A79). They are recorded when a
//! call ends, for calls that retried only (0 is not recorded); the delay is
//! the time between its attempts. tether makes no hedged attempts, so it
//! has no `grpc.client.call.hedges`.
//!
//! Wiring as in gRPC: the user builds a [`Telemetry`] from a
//! `MeterProvider` of the `opentelemetry` crate (the exporter is theirs:
//! OTLP, Prometheus, stdout) and hands it to
//! [`crate::ChannelBuilder::telemetry`], or registers it for every channel
//! made afterwards ([`Telemetry::register_global`]). OpenTelemetry's own
//! global provider is never used, as A66 says. A channel without one
//! records nothing and its calls pay one branch.
//!
//! Cardinality: `grpc.status` is one of the 17 codes; `grpc.target` is the
//! channel's canonical target, or `other` where
//! [`TelemetryBuilder::target_attribute_filter`] says so; `grpc.method` is
//! the call's method (`package.Service/Method`), or `other` where
//! [`TelemetryBuilder::method_attribute_filter`] says so, and for every
//! method past the first [`MAX_METHODS`] distinct ones of a channel
//! (tonic has no registered methods to tell generic ones by, so the bound
//! stands in for A66's rule).

mod call;
mod lb;
mod messages;
mod subchannel;

use std::fmt;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwapOption;
use opentelemetry::metrics::{
    Counter, Histogram, Meter, MeterProvider, ObservableCounter, ObservableGauge,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use tether_xds::client::{XdsClientFigures, XdsClientMetrics};

pub(crate) use call::{
    end_attempt, status_of, AttemptKind, AttemptMetrics, BodyMetrics, CallMetrics, ChannelMetrics,
};
pub use lb::CallLabels;
pub(crate) use lb::{LbLabels, LbMetrics, OutlierRecorder, SessionSource, WrrRecorder};
pub(crate) use messages::MessageBytes;
pub(crate) use subchannel::SubchannelMetrics;

/// The meter's name: the library, as gRPC's are named `grpc-c++`, `grpc-go`.
pub const METER_NAME: &str = "tether";

/// How many distinct `grpc.method` values a channel records; later methods
/// are recorded as `other`.
pub const MAX_METHODS: usize = 1000;

/// A66's latency buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 41] = [
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// A66's size buckets, in bytes.
pub const SIZE_BUCKETS: [f64; 14] = [
    0.0,
    1024.0,
    2048.0,
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
    4294967296.0,
];

/// A96's buckets of `grpc.client.call.retries`.
pub const RETRY_BUCKETS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];

/// A96's buckets of `grpc.client.call.transparent_retries`.
pub const TRANSPARENT_RETRY_BUCKETS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0];

/// The instruments gRPC defines as experimental, off unless enabled by
/// name ([`TelemetryBuilder::enable_metric`], as gRFC A79 says): A96's
/// retry instruments, A78's XdsClient and `weighted_round_robin`
/// instruments, A91's outlier-detection ones and A94's subchannel ones.
pub const OPTIONAL_METRICS: [&str; 18] = [
    "grpc.client.call.retries",
    "grpc.client.call.transparent_retries",
    "grpc.client.call.retry_delay",
    "grpc.xds_client.connected",
    "grpc.xds_client.server_failure",
    "grpc.xds_client.resource_updates_valid",
    "grpc.xds_client.resource_updates_invalid",
    "grpc.xds_client.resources",
    "grpc.lb.wrr.rr_fallback",
    "grpc.lb.wrr.endpoint_weight_not_yet_usable",
    "grpc.lb.wrr.endpoint_weight_stale",
    "grpc.lb.wrr.endpoint_weights",
    "grpc.lb.outlier_detection.ejections_enforced",
    "grpc.lb.outlier_detection.ejections_unenforced",
    subchannel::NAMES[0],
    subchannel::NAMES[1],
    subchannel::NAMES[2],
    subchannel::NAMES[3],
];

/// The optional labels gRPC's LB policies can add, off unless named in
/// [`TelemetryBuilder::add_optional_label`]: the locality (A78) and the
/// backend service, the xDS cluster (A89).
pub const OPTIONAL_LABELS: [&str; 2] = ["grpc.lb.locality", "grpc.lb.backend_service"];

/// Which of [`OPTIONAL_LABELS`] are on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OptionalLabels {
    pub(crate) locality: bool,
    pub(crate) backend_service: bool,
}

impl OptionalLabels {
    /// Whether any is on.
    pub(crate) fn any(self) -> bool {
        self.locality || self.backend_service
    }

    /// Appends to `labels` those that are on, with these values: empty
    /// where unknown, as gRPC records an optional label it has no value for.
    pub(crate) fn append(
        self,
        labels: &mut Vec<KeyValue>,
        backend_service: Option<&Arc<str>>,
        locality: Option<&Arc<str>>,
    ) {
        if self.locality {
            labels.push(KeyValue::new("grpc.lb.locality", or_empty(locality)));
        }
        if self.backend_service {
            labels.push(KeyValue::new(
                "grpc.lb.backend_service",
                or_empty(backend_service),
            ));
        }
    }
}

/// A label's value, empty when unknown.
pub(crate) fn or_empty(value: Option<&Arc<str>>) -> Arc<str> {
    value.cloned().unwrap_or_else(|| Arc::from(""))
}

/// The XdsClients of the channels that record with one [`Telemetry`],
/// each with its channel's `grpc.target`: A78's instruments poll them
/// when the meter collects. A client that stopped is forgotten then.
#[derive(Debug, Default)]
pub(crate) struct XdsClients(std::sync::Mutex<Vec<(KeyValue, XdsClientMetrics)>>);

impl XdsClients {
    /// Adds `client` for `target` (once per client and target).
    pub(crate) fn add(&self, target: &KeyValue, client: XdsClientMetrics) {
        let mut all = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !all.iter().any(|(t, c)| t == target && c.same(&client)) {
            all.push((target.clone(), client));
        }
    }

    /// Calls `f` with each running client's figures.
    fn each(&self, mut f: impl FnMut(&KeyValue, &XdsClientFigures)) {
        let mut all = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        all.retain(|(target, client)| match client.read() {
            Some(figures) => {
                f(target, &figures);
                true
            }
            None => false,
        });
    }
}

/// A78's XdsClient instruments, observed when the meter collects; kept so
/// their callbacks stay registered.
#[allow(dead_code)]
#[derive(Debug)]
struct XdsInstruments {
    connected: Option<ObservableGauge<u64>>,
    server_failure: Option<ObservableCounter<u64>>,
    updates_valid: Option<ObservableCounter<u64>>,
    updates_invalid: Option<ObservableCounter<u64>>,
    resources: Option<ObservableGauge<u64>>,
}

impl XdsInstruments {
    fn new(meter: &Meter, enabled: &[&'static str], clients: &Arc<XdsClients>) -> Self {
        let on = |name: &str| enabled.contains(&name);
        let server = |target: &KeyValue, f: &XdsClientFigures| {
            [
                target.clone(),
                KeyValue::new("grpc.xds.server", f.server.clone()),
            ]
        };
        let connected = on(OPTIONAL_METRICS[3]).then(|| {
            let clients = clients.clone();
            meter
                .u64_observable_gauge(OPTIONAL_METRICS[3])
                .with_unit("{bool}")
                .with_description(
                    "Whether the xDS client has a working ADS stream to the xDS server.",
                )
                .with_callback(move |o| {
                    clients.each(|t, f| o.observe(u64::from(f.connected), &server(t, f)))
                })
                .build()
        });
        let server_failure = on(OPTIONAL_METRICS[4]).then(|| {
            let clients = clients.clone();
            meter
                .u64_observable_counter(OPTIONAL_METRICS[4])
                .with_unit("{failure}")
                .with_description("xDS servers going from healthy to unhealthy.")
                .with_callback(move |o| {
                    clients.each(|t, f| o.observe(f.server_failures, &server(t, f)))
                })
                .build()
        });
        let updates = |name: &'static str, valid: bool| {
            on(name).then(|| {
                let clients = clients.clone();
                meter
                    .u64_observable_counter(name)
                    .with_unit("{resource}")
                    .with_description(if valid {
                        "Resources received that were valid."
                    } else {
                        "Resources received that were invalid."
                    })
                    .with_callback(move |o| {
                        clients.each(|t, f| {
                            for (kind, ok, bad) in &f.updates {
                                let [target, server] = server(t, f);
                                let labels = [
                                    target,
                                    server,
                                    KeyValue::new("grpc.xds.resource_type", *kind),
                                ];
                                o.observe(if valid { *ok } else { *bad }, &labels);
                            }
                        })
                    })
                    .build()
            })
        };
        let updates_valid = updates(OPTIONAL_METRICS[5], true);
        let updates_invalid = updates(OPTIONAL_METRICS[6], false);
        let resources = on(OPTIONAL_METRICS[7]).then(|| {
            let clients = clients.clone();
            meter
                .u64_observable_gauge(OPTIONAL_METRICS[7])
                .with_unit("{resource}")
                .with_description("xDS resources, by cache state.")
                .with_callback(move |o| {
                    clients.each(|t, f| {
                        for (authority, state, kind, n) in &f.resources {
                            let labels = [
                                t.clone(),
                                KeyValue::new("grpc.xds.authority", authority.clone()),
                                KeyValue::new("grpc.xds.cache_state", *state),
                                KeyValue::new("grpc.xds.resource_type", *kind),
                            ];
                            o.observe(*n, &labels);
                        }
                    })
                })
                .build()
        });
        XdsInstruments {
            connected,
            server_failure,
            updates_valid,
            updates_invalid,
            resources,
        }
    }
}

/// A filter on a label's value: `true` records it, `false` records `other`.
type AttributeFilter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The instruments of one meter, made once.
#[derive(Debug)]
pub(crate) struct Instruments {
    pub(crate) attempt_started: Counter<u64>,
    pub(crate) attempt_duration: Histogram<f64>,
    pub(crate) attempt_sent: Histogram<u64>,
    pub(crate) attempt_rcvd: Histogram<u64>,
    pub(crate) call_duration: Histogram<f64>,
    /// A96, when enabled.
    pub(crate) call_retries: Option<Histogram<u64>>,
    pub(crate) call_transparent_retries: Option<Histogram<u64>>,
    pub(crate) call_retry_delay: Option<Histogram<f64>>,
    /// tether's own: session calls and cookies.
    pub(crate) session_calls: Counter<u64>,
    pub(crate) session_cookies: Counter<u64>,
    pub(crate) session_envoy_misreads: Counter<u64>,
    /// A94's subchannel instruments, when enabled.
    pub(crate) subchannel: Option<subchannel::Instruments>,
    /// A78's XdsClient instruments, and the clients they read.
    pub(crate) xds_clients: Arc<XdsClients>,
    _xds: XdsInstruments,
    /// A78's `weighted_round_robin` instruments, when enabled.
    pub(crate) wrr_rr_fallback: Option<Counter<u64>>,
    pub(crate) wrr_not_yet_usable: Option<Counter<u64>>,
    pub(crate) wrr_stale: Option<Counter<u64>>,
    pub(crate) wrr_weights: Option<Histogram<f64>>,
    /// A91's outlier-detection instruments, when enabled.
    pub(crate) od_enforced: Option<Counter<u64>>,
    pub(crate) od_unenforced: Option<Counter<u64>>,
    /// The optional labels the LB policies add.
    pub(crate) optional_labels: OptionalLabels,
    /// `xds_override_host`'s sessions, which `tether.client.sessions`
    /// observes.
    pub(crate) session_sources: Arc<lb::SessionSources>,
    _sessions: ObservableGauge<u64>,
}

impl Instruments {
    fn new(meter: &Meter, enabled: &[&'static str], optional_labels: OptionalLabels) -> Self {
        let on = |name: &str| enabled.contains(&name);
        let xds_clients = Arc::new(XdsClients::default());
        let counter = |name: &'static str, unit: &'static str, description: &'static str| {
            on(name).then(|| {
                meter
                    .u64_counter(name)
                    .with_unit(unit)
                    .with_description(description)
                    .build()
            })
        };
        let session_sources = Arc::new(lb::SessionSources::default());
        let sources = session_sources.clone();
        let sessions = meter
            .u64_observable_gauge("tether.client.sessions")
            .with_unit("{session}")
            .with_description(
                "Sessions pinned to an endpoint (tether.endpoint) and its EDS health \
                 (tether.endpoint.health), as xds_override_host keeps them until its idle \
                 timeout.",
            )
            .with_callback(move |o| {
                sources.each(|base, address, health, n| {
                    let labels = [
                        base[0].clone(),
                        base[1].clone(),
                        KeyValue::new("tether.endpoint", address.to_string()),
                        KeyValue::new("tether.endpoint.health", health),
                    ];
                    o.observe(n, &labels);
                })
            })
            .build();
        Instruments {
            session_sources,
            _sessions: sessions,
            optional_labels,
            wrr_rr_fallback: counter(
                OPTIONAL_METRICS[8],
                "{update}",
                "EXPERIMENTAL. Number of scheduler updates in which there were not enough \
                 endpoints with valid weight, which caused the WRR policy to fall back to RR \
                 behavior.",
            ),
            wrr_not_yet_usable: counter(
                OPTIONAL_METRICS[9],
                "{endpoint}",
                "EXPERIMENTAL. Number of endpoints from each scheduler update that don't yet \
                 have usable weight information (no load report yet, or within the blackout \
                 period).",
            ),
            wrr_stale: counter(
                OPTIONAL_METRICS[10],
                "{endpoint}",
                "EXPERIMENTAL. Number of endpoints from each scheduler update whose latest \
                 weight is older than the expiration period.",
            ),
            wrr_weights: on(OPTIONAL_METRICS[11]).then(|| {
                meter
                    .f64_histogram(OPTIONAL_METRICS[11])
                    .with_unit("{weight}")
                    .with_description(
                        "EXPERIMENTAL. The weight of each endpoint, recorded on every scheduler \
                         update; endpoints without a usable weight are recorded as 0.",
                    )
                    .build()
            }),
            od_enforced: counter(
                OPTIONAL_METRICS[12],
                "{ejection}",
                "EXPERIMENTAL. Enforced outlier ejections, by detection method.",
            ),
            od_unenforced: counter(
                OPTIONAL_METRICS[13],
                "{ejection}",
                "EXPERIMENTAL. Outliers detected but not ejected, by detection method and the \
                 reason the ejection was not enforced.",
            ),
            subchannel: subchannel::Instruments::new(meter, enabled),
            _xds: XdsInstruments::new(meter, enabled, &xds_clients),
            xds_clients,
            attempt_started: meter
                .u64_counter("grpc.client.attempt.started")
                .with_unit("{attempt}")
                .with_description(
                    "The total number of RPC attempts started, including those that have not \
                     completed.",
                )
                .build(),
            attempt_duration: meter
                .f64_histogram("grpc.client.attempt.duration")
                .with_unit("s")
                .with_description(
                    "End-to-end time taken to complete an RPC attempt including the time it \
                     takes to pick a subchannel.",
                )
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build(),
            attempt_sent: meter
                .u64_histogram("grpc.client.attempt.sent_total_compressed_message_size")
                .with_unit("By")
                .with_description(
                    "Compressed message bytes sent per RPC attempt (gRPC framing excluded).",
                )
                .with_boundaries(SIZE_BUCKETS.to_vec())
                .build(),
            attempt_rcvd: meter
                .u64_histogram("grpc.client.attempt.rcvd_total_compressed_message_size")
                .with_unit("By")
                .with_description(
                    "Compressed message bytes received per RPC attempt (gRPC framing excluded).",
                )
                .with_boundaries(SIZE_BUCKETS.to_vec())
                .build(),
            call_duration: meter
                .f64_histogram("grpc.client.call.duration")
                .with_unit("s")
                .with_description(
                    "Time the gRPC library takes to complete an RPC from the application's \
                     perspective.",
                )
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build(),
            session_calls: meter
                .u64_counter("tether.client.session.calls")
                .with_unit("{call}")
                .with_description(
                    "Calls through a stateful session, by what became of the session \
                     (tether.session.call: pinned, moved, new, refused).",
                )
                .build(),
            session_cookies: meter
                .u64_counter("tether.client.session.cookies")
                .with_unit("{cookie}")
                .with_description(
                    "Session cookies responses set, by why (tether.session.cookie: new, moved, \
                     reissued).",
                )
                .build(),
            session_envoy_misreads: meter
                .u64_counter("tether.client.session.envoy_misreads")
                .with_unit("{call}")
                .with_description(
                    "Calls pinned by a cookie in a form stock Envoy's cookie session state \
                     misreads (the response re-issues it).",
                )
                .build(),
            call_retries: on(OPTIONAL_METRICS[0]).then(|| {
                meter
                    .u64_histogram(OPTIONAL_METRICS[0])
                    .with_unit("{retry}")
                    .with_description("Number of retries during the client call.")
                    .with_boundaries(RETRY_BUCKETS.to_vec())
                    .build()
            }),
            call_transparent_retries: on(OPTIONAL_METRICS[1]).then(|| {
                meter
                    .u64_histogram(OPTIONAL_METRICS[1])
                    .with_unit("{transparent_retry}")
                    .with_description("Number of transparent retries during the client call.")
                    .with_boundaries(TRANSPARENT_RETRY_BUCKETS.to_vec())
                    .build()
            }),
            call_retry_delay: on(OPTIONAL_METRICS[2]).then(|| {
                meter
                    .f64_histogram(OPTIONAL_METRICS[2])
                    .with_unit("s")
                    .with_description(
                        "Total time of delay while there is no active attempt during the client \
                         call.",
                    )
                    .with_boundaries(LATENCY_BUCKETS.to_vec())
                    .build()
            }),
        }
    }
}

/// gRPC's OpenTelemetry metrics for channels: instruments made from one
/// `MeterProvider`, and the label filters. Cheap to clone.
#[derive(Clone)]
pub struct Telemetry {
    instruments: Arc<Instruments>,
    target_filter: Option<AttributeFilter>,
    method_filter: Option<AttributeFilter>,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("target_filter", &self.target_filter.is_some())
            .field("method_filter", &self.method_filter.is_some())
            .finish()
    }
}

/// The process-wide [`Telemetry`] ([`Telemetry::register_global`]).
fn global() -> &'static ArcSwapOption<Telemetry> {
    static GLOBAL: OnceLock<ArcSwapOption<Telemetry>> = OnceLock::new();
    GLOBAL.get_or_init(ArcSwapOption::empty)
}

impl Telemetry {
    /// Metrics recorded through `provider`'s meter [`METER_NAME`].
    pub fn builder(provider: &dyn MeterProvider) -> TelemetryBuilder {
        let scope = InstrumentationScope::builder(METER_NAME)
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        TelemetryBuilder {
            meter: provider.meter_with_scope(scope),
            enabled: Vec::new(),
            optional_labels: OptionalLabels::default(),
            target_filter: None,
            method_filter: None,
        }
    }

    /// Records for every channel made from now on without its own
    /// ([`crate::ChannelBuilder::telemetry`]), as gRPC's
    /// `BuildAndRegisterGlobal`; channels made before keep what they had.
    pub fn register_global(self) {
        global().store(Some(Arc::new(self)));
    }

    /// Stops [`Telemetry::register_global`]'s recording for channels made
    /// from now on.
    pub fn unregister_global() {
        global().store(None);
    }

    /// The process-wide one, if registered.
    pub(crate) fn global() -> Option<Telemetry> {
        global().load_full().map(|t| (*t).clone())
    }

    /// What a channel to `target` records with.
    pub(crate) fn for_channel(&self, target: &str) -> Arc<ChannelMetrics> {
        let canonical = canonical_target(target);
        let recorded = match &self.target_filter {
            Some(f) if !f(&canonical) => "other".to_owned(),
            _ => canonical,
        };
        Arc::new(ChannelMetrics::new(
            self.instruments.clone(),
            KeyValue::new("grpc.target", Arc::<str>::from(recorded)),
            self.method_filter.clone(),
        ))
    }
}

/// Options of a [`Telemetry`], then [`TelemetryBuilder::build`].
#[must_use]
pub struct TelemetryBuilder {
    meter: Meter,
    /// The optional instruments turned on.
    enabled: Vec<&'static str>,
    optional_labels: OptionalLabels,
    target_filter: Option<AttributeFilter>,
    method_filter: Option<AttributeFilter>,
}

impl fmt::Debug for TelemetryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelemetryBuilder").finish_non_exhaustive()
    }
}

impl TelemetryBuilder {
    /// Called once per channel with its canonical target: `false` records
    /// `grpc.target` as `other` (many channels to IP addresses, say).
    pub fn target_attribute_filter(
        mut self,
        filter: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.target_filter = Some(Arc::new(filter));
        self
    }

    /// Called once per method and channel with the method
    /// (`package.Service/Method`): `false` records `grpc.method` as
    /// `other` (methods named by the network, say).
    pub fn method_attribute_filter(
        mut self,
        filter: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.method_filter = Some(Arc::new(filter));
        self
    }

    /// Turns on one of gRPC's experimental instruments, off by default
    /// (gRFC A79): one of [`OPTIONAL_METRICS`], A96's retry instruments.
    pub fn enable_metric(mut self, name: &str) -> Result<Self, TelemetryError> {
        let Some(known) = OPTIONAL_METRICS.iter().find(|m| **m == name) else {
            return Err(TelemetryError::UnknownMetric {
                name: name.to_owned(),
            });
        };
        if !self.enabled.contains(known) {
            self.enabled.push(known);
        }
        Ok(self)
    }

    /// Adds one of gRPC's optional labels, off by default (gRFC A79): one
    /// of [`OPTIONAL_LABELS`], recorded by the instruments that take it
    /// (the attempts' duration and sizes, A78's `weighted_round_robin` and
    /// A94's subchannel instruments take both, A91's the backend service),
    /// empty where the channel has no value for it.
    pub fn add_optional_label(mut self, name: &str) -> Result<Self, TelemetryError> {
        match name {
            "grpc.lb.locality" => self.optional_labels.locality = true,
            "grpc.lb.backend_service" => self.optional_labels.backend_service = true,
            _ => {
                return Err(TelemetryError::UnknownLabel {
                    name: name.to_owned(),
                })
            }
        }
        Ok(self)
    }

    /// The telemetry.
    pub fn build(self) -> Telemetry {
        Telemetry {
            instruments: Arc::new(Instruments::new(
                &self.meter,
                &self.enabled,
                self.optional_labels,
            )),
            target_filter: self.target_filter,
            method_filter: self.method_filter,
        }
    }
}

/// A [`TelemetryBuilder`] option that cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TelemetryError {
    /// `enable_metric` named no optional instrument tether has.
    UnknownMetric {
        /// The name given.
        name: String,
    },
    /// `add_optional_label` named no optional label tether has.
    UnknownLabel {
        /// The name given.
        name: String,
    },
}

impl fmt::Display for TelemetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TelemetryError::UnknownMetric { name } => write!(
                f,
                "enable_metric: {name:?} is not an optional instrument (known: {})",
                OPTIONAL_METRICS.join(", ")
            ),
            TelemetryError::UnknownLabel { name } => write!(
                f,
                "add_optional_label: {name:?} is not an optional label (known: {})",
                OPTIONAL_LABELS.join(", ")
            ),
        }
    }
}

impl std::error::Error for TelemetryError {}

/// A target as gRPC records it: with its scheme, `dns:///` added where it
/// has none gRPC knows (`localhost:50051` is `dns:///localhost:50051`).
pub fn canonical_target(target: &str) -> String {
    const SCHEMES: [&str; 8] = [
        "xds", "static", "dns", "ipv4", "ipv6", "unix", "http", "https",
    ];
    match target.split_once(':') {
        Some((scheme, _)) if SCHEMES.contains(&scheme) => target.to_owned(),
        _ => format!("dns:///{target}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_without_a_known_scheme_are_dns() {
        assert_eq!(
            canonical_target("localhost:50051"),
            "dns:///localhost:50051"
        );
        assert_eq!(canonical_target("xds:///shop"), "xds:///shop");
        assert_eq!(canonical_target("dns:///a:1"), "dns:///a:1");
        assert_eq!(canonical_target("unix:/tmp/s"), "unix:/tmp/s");
        assert_eq!(canonical_target("example.com"), "dns:///example.com");
    }

    #[test]
    fn only_known_optional_instruments_can_be_enabled() {
        let provider = opentelemetry::metrics::noop::NoopMeterProvider::new();
        let builder = Telemetry::builder(&provider)
            .enable_metric("grpc.client.call.retries")
            .unwrap();
        let e = builder
            .enable_metric("grpc.client.call.hedges")
            .unwrap_err();
        let message = e.to_string();
        assert!(
            message.starts_with(
                "enable_metric: \"grpc.client.call.hedges\" is not an optional instrument (known: \
                 grpc.client.call.retries, "
            ),
            "{message}"
        );
        assert!(
            OPTIONAL_METRICS.iter().all(|m| message.contains(m)),
            "{message}"
        );
    }

    #[test]
    fn buckets_rise() {
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert!(SIZE_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert!(TRANSPARENT_RETRY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }
}
