//! `outlier_detection`'s settings (gRFC A50), with gRPC's defaults and
//! validation. CDS `outlier_detection` and tether-control's YAML both end
//! up here.

use std::fmt;
use std::time::Duration;

/// Default `interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Default `base_ejection_time`.
pub const DEFAULT_BASE_EJECTION_TIME: Duration = Duration::from_secs(30);
/// Default `max_ejection_time`.
pub const DEFAULT_MAX_EJECTION_TIME: Duration = Duration::from_secs(300);
/// Default `max_ejection_percent`.
pub const DEFAULT_MAX_EJECTION_PERCENT: u32 = 10;

/// What outlier detection does for one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct OutlierDetectionConfig {
    /// How often the ejection algorithms run.
    #[serde(with = "millis")]
    pub interval: Duration,
    /// An ejection lasts this times the endpoint's multiplier.
    #[serde(with = "millis")]
    pub base_ejection_time: Duration,
    /// An ejection lasts at most max(`base_ejection_time`, this).
    #[serde(with = "millis")]
    pub max_ejection_time: Duration,
    /// Endpoints ejected at most, in percent of the cluster's (one is
    /// always allowed, as in C-core).
    pub max_ejection_percent: u32,
    /// The success-rate algorithm, when on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_rate: Option<SuccessRateEjection>,
    /// The failure-percentage algorithm, when on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_percentage: Option<FailurePercentageEjection>,
}

impl Default for OutlierDetectionConfig {
    /// gRPC's defaults, with neither algorithm on.
    fn default() -> Self {
        OutlierDetectionConfig {
            interval: DEFAULT_INTERVAL,
            base_ejection_time: DEFAULT_BASE_EJECTION_TIME,
            max_ejection_time: DEFAULT_MAX_EJECTION_TIME,
            max_ejection_percent: DEFAULT_MAX_EJECTION_PERCENT,
            success_rate: None,
            failure_percentage: None,
        }
    }
}

/// Ejects endpoints whose success rate is far below the cluster's mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SuccessRateEjection {
    /// The threshold is mean − stdev × `stdev_factor` / 1000.
    pub stdev_factor: u32,
    /// Chance in percent that an outlier found is ejected.
    pub enforcement_percentage: u32,
    /// Endpoints with `request_volume` calls needed to run at all.
    pub minimum_hosts: u32,
    /// Calls in an interval for an endpoint to count.
    pub request_volume: u32,
}

impl Default for SuccessRateEjection {
    fn default() -> Self {
        SuccessRateEjection {
            stdev_factor: 1900,
            enforcement_percentage: 100,
            minimum_hosts: 5,
            request_volume: 100,
        }
    }
}

/// Ejects endpoints whose failure percentage is above a threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct FailurePercentageEjection {
    /// Failure percentage above which an endpoint is an outlier.
    pub threshold: u32,
    /// Chance in percent that an outlier found is ejected.
    pub enforcement_percentage: u32,
    /// Endpoints with `request_volume` calls needed to run at all.
    pub minimum_hosts: u32,
    /// Calls in an interval for an endpoint to count.
    pub request_volume: u32,
}

impl Default for FailurePercentageEjection {
    fn default() -> Self {
        FailurePercentageEjection {
            threshold: 85,
            enforcement_percentage: 100,
            minimum_hosts: 5,
            request_volume: 50,
        }
    }
}

/// A setting outside what gRPC accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidOutlierDetection {
    /// The field, as the xDS `OutlierDetection` message names it.
    pub field: &'static str,
    /// Its value.
    pub value: u64,
    /// What is wrong.
    pub problem: &'static str,
}

impl fmt::Display for InvalidOutlierDetection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} {}", self.field, self.value, self.problem)
    }
}

impl std::error::Error for InvalidOutlierDetection {}

impl OutlierDetectionConfig {
    /// Whether calls are counted and the timer runs (either algorithm on).
    pub fn counting(&self) -> bool {
        self.success_rate.is_some() || self.failure_percentage.is_some()
    }

    /// How long an ejection with `multiplier` lasts:
    /// min(base × multiplier, max(base, max)).
    pub fn ejection_time(&self, multiplier: u32) -> Duration {
        self.base_ejection_time
            .saturating_mul(multiplier)
            .min(self.base_ejection_time.max(self.max_ejection_time))
    }

    /// Every percentage must be at most 100 (gRFC A50's validation; the
    /// durations are checked where they are parsed). Fields are named as
    /// the xDS message names them.
    pub fn validate(&self) -> Result<(), Vec<InvalidOutlierDetection>> {
        let mut checks = vec![("max_ejection_percent", self.max_ejection_percent)];
        if let Some(s) = &self.success_rate {
            checks.push(("enforcing_success_rate", s.enforcement_percentage));
        }
        if let Some(f) = &self.failure_percentage {
            checks.push(("failure_percentage_threshold", f.threshold));
            checks.push(("enforcing_failure_percentage", f.enforcement_percentage));
        }
        let errors: Vec<_> = checks
            .into_iter()
            .filter(|(_, v)| *v > 100)
            .map(|(field, v)| InvalidOutlierDetection {
                field,
                value: u64::from(v),
                problem: "must be at most 100",
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// Durations as whole milliseconds in `tether xds dump` and stats.
mod millis {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis().min(u128::from(u64::MAX)) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejection_time_is_base_times_multiplier_capped_at_the_larger_of_base_and_max() {
        let c = OutlierDetectionConfig {
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(100),
            ..Default::default()
        };
        assert_eq!(c.ejection_time(1), Duration::from_secs(30));
        assert_eq!(c.ejection_time(3), Duration::from_secs(90));
        assert_eq!(c.ejection_time(4), Duration::from_secs(100));
        // A max below base does not shorten an ejection below base.
        let c = OutlierDetectionConfig {
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(10),
            ..Default::default()
        };
        assert_eq!(c.ejection_time(5), Duration::from_secs(30));
    }

    #[test]
    fn percentages_above_100_are_named_with_their_value() {
        let c = OutlierDetectionConfig {
            max_ejection_percent: 101,
            success_rate: Some(SuccessRateEjection {
                enforcement_percentage: 150,
                ..Default::default()
            }),
            failure_percentage: Some(FailurePercentageEjection {
                threshold: 200,
                ..Default::default()
            }),
            ..Default::default()
        };
        let errors = c.validate().unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "max_ejection_percent: 101 must be at most 100",
                "enforcing_success_rate: 150 must be at most 100",
                "failure_percentage_threshold: 200 must be at most 100",
            ]
        );
        assert!(OutlierDetectionConfig::default().validate().is_ok());
    }
}
