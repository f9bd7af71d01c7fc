//! Services: endpoints, locality weights, aggregates, and the TLS,
//! keepalive and outlier detection of their clusters.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::field::{AddressField, DurationField, HealthField};
use super::one;

/// How Envoy talks to a service's endpoints.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1 (default).
    #[default]
    Http1,
    /// HTTP/2 without TLS (gRPC backends).
    H2c,
}

/// A service.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// Its name: the EDS resource name and the base of its cluster names.
    pub name: String,
    /// Protocol Envoy uses towards the endpoints.
    #[serde(default)]
    pub protocol: Protocol,
    /// Weights of localities (`region/zone/subzone` or a prefix of it); 1 when absent.
    #[serde(default, rename = "localityWeights")]
    pub locality_weights: BTreeMap<String, u32>,
    /// Endpoints.
    #[serde(default)]
    pub endpoints: Vec<EndpointSpec>,
    /// Makes this an aggregate service (gRFC A75, Envoy's
    /// `envoy.clusters.aggregate`): the services it fails over between, the
    /// first preferred while it has healthy endpoints. An aggregate service
    /// has no endpoints, locality weights or protocol of its own.
    #[serde(default)]
    pub aggregate: Option<Vec<String>>,
    /// Outlier detection for the service's clusters (gRFC A50; CDS
    /// `outlier_detection`).
    #[serde(default, rename = "outlierDetection")]
    pub outlier_detection: Option<OutlierDetectionSpec>,
    /// HTTP/2 keepalive on Envoy's connections to the endpoints (`h2c`
    /// services only). Proxyless clients set their own keepalive (gRPC
    /// takes it from the channel, not from xDS).
    #[serde(default)]
    pub keepalive: Option<KeepaliveSpec>,
    /// TLS to the endpoints for proxyless clients (gRFC A29): a CDS
    /// `transport_socket` naming the clients' bootstrap certificate
    /// provider instances.
    #[serde(default)]
    pub tls: Option<ServiceTlsSpec>,
    /// Load reports from the service's clients (LRS, gRFC A27): proxyless
    /// clients get `lrs_server` on its clusters and report to
    /// tether-control; Envoy reports when its bootstrap has a load stats
    /// config. Drain readiness reads them.
    #[serde(default, rename = "loadReporting")]
    pub load_reporting: Option<LoadReportingSpec>,
    /// Removal of the service's DRAINING endpoints from EDS once idle
    /// (`removeWhenIdle`, read from the load reports) or after `maxDrain`
    /// whatever their load. Opt-in: without it a DRAINING endpoint is
    /// served until the file (or DNS) drops it.
    #[serde(default)]
    pub drain: Option<DrainSpec>,
    /// Shares of calls the clients drop before picking an endpoint, per
    /// category (EDS `policy.drop_overloads`); each drop is reported per
    /// category in LRS.
    #[serde(default, rename = "dropOverloads")]
    pub drop_overloads: Vec<DropOverloadSpec>,
}

/// One entry of a service's `dropOverloads`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DropOverloadSpec {
    /// The category the drops are reported under.
    pub category: String,
    /// The share of calls dropped, in percent (0 to 100, to 4 decimal
    /// places: EDS carries it per million).
    pub percent: f64,
}

impl DropOverloadSpec {
    /// `percent` per million, as EDS carries it (`FractionalPercent` with
    /// the denominator `MILLION`). Rounded: validation refuses a share finer
    /// than a millionth, so rounding only absorbs the binary fraction's error.
    pub fn per_million(&self) -> u32 {
        (self.percent * PER_MILLION_PER_PERCENT).round() as u32
    }
}

/// Millionths in one percent.
pub(crate) const PER_MILLION_PER_PERCENT: f64 = 10_000.0;

/// `loadReporting` of a service.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LoadReportingSpec {
    /// How often clients report (LRS's `load_reporting_interval`).
    pub interval: DurationField,
    /// The backends' ORCA metrics the clients add to their reports (gRFC
    /// A85, CDS `lrs_report_endpoint_metrics`): `cpu_utilization`,
    /// `mem_utilization`, `application_utilization`, `named_metrics.KEY`,
    /// or `named_metrics.*` for every named metric.
    #[serde(default, rename = "endpointMetrics")]
    pub endpoint_metrics: Vec<String>,
}

/// `drain` of a service: when its DRAINING endpoints leave EDS. Either
/// key may be left out (not both).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DrainSpec {
    /// A DRAINING endpoint whose drain verdict has been `idle` this long
    /// without a break is removed (needs `loadReporting`).
    #[serde(default, rename = "removeWhenIdle")]
    pub remove_when_idle: Option<DurationField>,
    /// A DRAINING endpoint is removed this long after its drain began,
    /// whatever its verdict.
    #[serde(default, rename = "maxDrain")]
    pub max_drain: Option<DurationField>,
}

/// `tls` of a service: what proxyless clients get as the cluster's
/// `UpstreamTlsContext`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServiceTlsSpec {
    /// The clients' certificate provider instance holding the roots.
    #[serde(default, rename = "caInstance")]
    pub ca_instance: String,
    /// Verify servers against the clients' system roots instead of a
    /// provider instance (gRFC A82's `system_root_certs`).
    #[serde(default, rename = "systemRootCerts")]
    pub system_root_certs: bool,
    /// The instance holding the client certificate (mTLS), if any.
    #[serde(default, rename = "identityInstance")]
    pub identity_instance: Option<String>,
    /// A server's certificate must have a SAN matching one of these (any
    /// certificate that chains when empty).
    #[serde(default, rename = "subjectAltNames")]
    pub subject_alt_names: Vec<SanMatcherSpec>,
    /// The same TLS for Envoy's clusters, from files on the Envoy hosts
    /// (Envoy has no certificate provider instances). A file that serves
    /// Envoy needs it, or `envoyPlaintext: true`.
    #[serde(default)]
    pub envoy: Option<EnvoyTlsFiles>,
    /// Envoy speaks plaintext to this service on purpose (the proxyless
    /// clients still use TLS): without it, a file that serves Envoy and
    /// gives a `tls` service no `tls.envoy` is refused.
    #[serde(default, rename = "envoyPlaintext")]
    pub envoy_plaintext: bool,
}

/// `tls.envoy`: the files an Envoy reads for a service's TLS.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EnvoyTlsFiles {
    /// The roots (PEM).
    #[serde(rename = "caFile")]
    pub ca_file: String,
    /// The client certificate chain (PEM), for mTLS.
    #[serde(default, rename = "certificateFile")]
    pub certificate_file: Option<String>,
    /// Its private key (PEM).
    #[serde(default, rename = "privateKeyFile")]
    pub private_key_file: Option<String>,
}

/// One SAN matcher: exactly one of `exact`, `prefix`, `suffix`,
/// `contains`, `regex`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct SanMatcherSpec {
    /// Equal (DNS rules: case-insensitive, wildcards in the SAN).
    #[serde(default)]
    pub exact: Option<String>,
    /// Starts with.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Ends with.
    #[serde(default)]
    pub suffix: Option<String>,
    /// Contains.
    #[serde(default)]
    pub contains: Option<String>,
    /// Matches the whole SAN (RE2 syntax).
    #[serde(default)]
    pub regex: Option<String>,
    /// Compare case-insensitively (not with `regex`).
    #[serde(default, rename = "ignoreCase")]
    pub ignore_case: bool,
}

/// `keepalive` of a service: Envoy's HTTP/2 `connection_keepalive`. A
/// connection whose PING is not answered within `timeout` is closed, so a
/// backend that stops answering without closing (a partition, a hung host)
/// is left within `interval` + `timeout` instead of when TCP gives up.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeepaliveSpec {
    /// How often a PING is sent on a connection.
    pub interval: DurationField,
    /// How long a PING may go unanswered.
    pub timeout: DurationField,
}

/// `outlierDetection` of a service: gRPC's settings (gRFC A50), each
/// defaulting as in gRPC. An algorithm runs when its block is present.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutlierDetectionSpec {
    /// How often ejections are decided (default 10 s).
    #[serde(default)]
    pub interval: Option<DurationField>,
    /// An ejection lasts this times the endpoint's ejection count (default 30 s).
    #[serde(default, rename = "baseEjectionTime")]
    pub base_ejection_time: Option<DurationField>,
    /// Longest ejection, unless `baseEjectionTime` is longer (default 300 s).
    #[serde(default, rename = "maxEjectionTime")]
    pub max_ejection_time: Option<DurationField>,
    /// Endpoints ejected at most, in percent (default 10; one always may be).
    #[serde(default, rename = "maxEjectionPercent")]
    pub max_ejection_percent: Option<u32>,
    /// The success-rate algorithm.
    #[serde(default, rename = "successRate")]
    pub success_rate: Option<SuccessRateSpec>,
    /// The failure-percentage algorithm.
    #[serde(default, rename = "failurePercentage")]
    pub failure_percentage: Option<FailurePercentageSpec>,
}

/// `outlierDetection.successRate`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct SuccessRateSpec {
    /// Threshold: mean − stdev × stdevFactor / 1000 (default 1900).
    #[serde(default, rename = "stdevFactor")]
    pub stdev_factor: Option<u32>,
    /// Chance in percent that an outlier is ejected (default 100).
    #[serde(default, rename = "enforcementPercentage")]
    pub enforcement_percentage: Option<u32>,
    /// Endpoints with enough calls needed to run (default 5).
    #[serde(default, rename = "minimumHosts")]
    pub minimum_hosts: Option<u32>,
    /// Calls in an interval for an endpoint to count (default 100).
    #[serde(default, rename = "requestVolume")]
    pub request_volume: Option<u32>,
}

/// `outlierDetection.failurePercentage`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct FailurePercentageSpec {
    /// Failure percentage above which an endpoint is ejected (default 85).
    #[serde(default)]
    pub threshold: Option<u32>,
    /// Chance in percent that an outlier is ejected (default 100).
    #[serde(default, rename = "enforcementPercentage")]
    pub enforcement_percentage: Option<u32>,
    /// Endpoints with enough calls needed to run (default 5).
    #[serde(default, rename = "minimumHosts")]
    pub minimum_hosts: Option<u32>,
    /// Calls in an interval for an endpoint to count (default 50).
    #[serde(default, rename = "requestVolume")]
    pub request_volume: Option<u32>,
}

impl OutlierDetectionSpec {
    /// The settings, gRPC's defaults filled in.
    pub fn settings(&self) -> tether_xds::lb_config::outlier_detection::OutlierDetectionConfig {
        use tether_xds::lb_config::outlier_detection as od;
        let mut c = od::OutlierDetectionConfig::default();
        if let Some(v) = self.interval {
            c.interval = v.0;
        }
        if let Some(v) = self.base_ejection_time {
            c.base_ejection_time = v.0;
        }
        if let Some(v) = self.max_ejection_time {
            c.max_ejection_time = v.0;
        }
        if let Some(v) = self.max_ejection_percent {
            c.max_ejection_percent = v;
        }
        c.success_rate = self.success_rate.map(|s| {
            let mut sr = od::SuccessRateEjection::default();
            sr.stdev_factor = s.stdev_factor.unwrap_or(sr.stdev_factor);
            sr.enforcement_percentage = s
                .enforcement_percentage
                .unwrap_or(sr.enforcement_percentage);
            sr.minimum_hosts = s.minimum_hosts.unwrap_or(sr.minimum_hosts);
            sr.request_volume = s.request_volume.unwrap_or(sr.request_volume);
            sr
        });
        c.failure_percentage = self.failure_percentage.map(|f| {
            let mut fp = od::FailurePercentageEjection::default();
            fp.threshold = f.threshold.unwrap_or(fp.threshold);
            fp.enforcement_percentage = f
                .enforcement_percentage
                .unwrap_or(fp.enforcement_percentage);
            fp.minimum_hosts = f.minimum_hosts.unwrap_or(fp.minimum_hosts);
            fp.request_volume = f.request_volume.unwrap_or(fp.request_volume);
            fp
        });
        c
    }
}

impl ServiceSpec {
    /// Whether this is an aggregate service.
    pub fn is_aggregate(&self) -> bool {
        self.aggregate.is_some()
    }

    /// The services an aggregate service names, in priority order (none for
    /// a service with endpoints).
    pub fn children(&self) -> &[String] {
        self.aggregate.as_deref().unwrap_or(&[])
    }
}

/// An endpoint.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// `ip:port` (`[v6]:port` for IPv6), or `name:port`: every address
    /// the name resolves to becomes an endpoint with this entry's weight,
    /// health, priority and locality.
    pub address: AddressField,
    /// The endpoint's other addresses (A61); names among them add every
    /// address they resolve to (only beside an `address` that is an IP:
    /// a name's addresses are endpoints of their own).
    #[serde(default, rename = "additionalAddresses")]
    pub additional_addresses: Vec<AddressField>,
    /// Relative weight within its locality (default 1).
    #[serde(default = "one")]
    pub weight: u32,
    /// EDS health status (default HEALTHY).
    #[serde(default)]
    pub health: HealthField,
    /// Priority, 0 the most preferred (default 0).
    #[serde(default)]
    pub priority: u32,
    /// Locality as `region/zone/subzone` (default empty).
    #[serde(default)]
    pub locality: String,
}

/// Splits `region/zone/subzone` (missing parts empty).
pub fn split_locality(s: &str) -> (String, String, String) {
    let mut it = s.splitn(3, '/');
    let region = it.next().unwrap_or("").to_owned();
    let zone = it.next().unwrap_or("").to_owned();
    let sub = it.next().unwrap_or("").to_owned();
    (region, zone, sub)
}
