//! A route's `retryPolicy` in the model (Contour's vocabulary), translated
//! to the route's Envoy `RetryPolicy`: Envoy retries on every condition it
//! knows; proxyless gRPC clients (gRFC A44) on the five gRPC status names
//! and ignore the others.
//!
//! ```yaml
//! retryPolicy:
//!   count: 3                      # retries after the first attempt (gRPC: 5 attempts at most)
//!   retryOn: [unavailable, cancelled]
//!   backOff: { baseInterval: 0.025s, maxInterval: 0.25s }   # optional; max defaults to 10 × base
//! ```

use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::google::protobuf as pb;
use serde::Deserialize;
use tether_xds::resource::retry::RETRY_ON;

use crate::model::{DurationField, ModelError};

/// Envoy's other `retry_on` conditions (accepted, used by Envoy only).
pub const ENVOY_RETRY_ON: [&str; 11] = [
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
];

/// A route's `retryPolicy`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicySpec {
    /// Retries after the first attempt (default 1).
    #[serde(default)]
    pub count: Option<u32>,
    /// The conditions retried.
    #[serde(rename = "retryOn")]
    pub retry_on: Vec<String>,
    /// The backoff between attempts (default 25 ms growing to 250 ms).
    #[serde(default, rename = "backOff")]
    pub back_off: Option<BackOffSpec>,
}

/// `retryPolicy.backOff`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackOffSpec {
    /// The first backoff, at least 1ms (Envoy's bound).
    #[serde(rename = "baseInterval")]
    pub base_interval: DurationField,
    /// The longest backoff (default 10 × the base), not below the base.
    #[serde(default, rename = "maxInterval")]
    pub max_interval: Option<DurationField>,
}

impl RetryPolicySpec {
    /// Checks what the types cannot; `at` is the block's path.
    pub(crate) fn validate(&self, at: &str) -> Result<(), ModelError> {
        if self.count == Some(0) {
            return Err(ModelError::invalid(
                format!("{at}.count"),
                0,
                "must be at least 1 (gRPC refuses num_retries 0)",
            ));
        }
        if self.retry_on.is_empty() {
            return Err(ModelError::invalid(
                format!("{at}.retryOn"),
                "[]",
                "must name at least one condition",
            ));
        }
        for (i, c) in self.retry_on.iter().enumerate() {
            let grpc = RETRY_ON.iter().any(|(name, _)| name == c);
            if !grpc && !ENVOY_RETRY_ON.contains(&c.as_str()) {
                return Err(ModelError::invalid(
                    format!("{at}.retryOn[{i}]"),
                    c,
                    "is not a retry condition (gRPC's: cancelled, deadline-exceeded, internal, resource-exhausted, unavailable; or one of Envoy's)",
                ));
            }
        }
        if let Some(b) = &self.back_off {
            if b.base_interval.0 < std::time::Duration::from_millis(1) {
                return Err(ModelError::invalid(
                    format!("{at}.backOff.baseInterval"),
                    format!("{}s", b.base_interval.0.as_secs_f64()),
                    "must be at least 1ms (Envoy's bound)",
                ));
            }
            if let Some(m) = b.max_interval.filter(|m| m.0 < b.base_interval.0) {
                return Err(ModelError::invalid(
                    format!("{at}.backOff.maxInterval"),
                    format!("{}s", m.0.as_secs_f64()),
                    "must not be below baseInterval",
                ));
            }
        }
        Ok(())
    }

    /// The route's `RetryPolicy`.
    pub fn to_proto(&self) -> rpb::RetryPolicy {
        let d = |d: DurationField| pb::Duration {
            seconds: d.0.as_secs() as i64,
            nanos: d.0.subsec_nanos() as i32,
        };
        rpb::RetryPolicy {
            retry_on: self.retry_on.join(","),
            num_retries: self.count.map(|value| pb::UInt32Value { value }),
            retry_back_off: self
                .back_off
                .as_ref()
                .map(|b| rpb::retry_policy::RetryBackOff {
                    base_interval: Some(d(b.base_interval)),
                    max_interval: b.max_interval.map(d),
                }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> RetryPolicySpec {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn a_policy_becomes_the_routes_retry_policy() {
        let p = spec("count: 3\nretryOn: [unavailable, 5xx]\nbackOff: { baseInterval: 0.01s }");
        p.validate("r").unwrap();
        let pb = p.to_proto();
        assert_eq!(pb.retry_on, "unavailable,5xx");
        assert_eq!(pb.num_retries, Some(pb::UInt32Value { value: 3 }));
        let b = pb.retry_back_off.unwrap();
        assert_eq!(
            b.base_interval,
            Some(pb::Duration {
                seconds: 0,
                nanos: 10_000_000
            })
        );
        assert_eq!(b.max_interval, None);
        // Without count and backOff: the client's defaults.
        let pb = spec("retryOn: [internal]").to_proto();
        assert_eq!((pb.num_retries, pb.retry_back_off), (None, None));
    }

    #[test]
    fn errors_name_the_field_and_value() {
        let cases = [
            ("count: 0\nretryOn: [unavailable]", "r.count: 0 must be at least 1 (gRPC refuses num_retries 0)"),
            ("retryOn: []", "r.retryOn: \"[]\" must name at least one condition"),
            (
                "retryOn: [unavailable, unavailible]",
                "r.retryOn[1]: \"unavailible\" is not a retry condition (gRPC's: cancelled, deadline-exceeded, internal, resource-exhausted, unavailable; or one of Envoy's)",
            ),
            (
                "retryOn: [unavailable]\nbackOff: { baseInterval: 0s }",
                "r.backOff.baseInterval: \"0s\" must be at least 1ms (Envoy's bound)",
            ),
            (
                "retryOn: [unavailable]\nbackOff: { baseInterval: 0.1s, maxInterval: 0.05s }",
                "r.backOff.maxInterval: \"0.05s\" must not be below baseInterval",
            ),
        ];
        for (yaml, want) in cases {
            assert_eq!(
                spec(yaml).validate("r").unwrap_err().to_string(),
                want,
                "{yaml}"
            );
        }
    }
}
