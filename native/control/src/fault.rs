//! Fault injection in the model: a route's or virtual host's `fault`,
//! translated to Envoy's `HTTPFault` (gRFC A33 for proxyless clients), as
//! istiod translates a VirtualService's `fault`: the listener carries an
//! empty fault filter before the router, and each route or virtual host
//! with a `fault` overrides it in `typed_per_filter_config`.
//!
//! ```yaml
//! fault:
//!   delay: { fixed: 0.2s, percent: 50 }     # or { header: true, percent: 100 }
//!   abort: { grpcStatus: 14, percent: 10 }   # or httpStatus: 503, or header: true
//!   maxActiveFaults: 20
//! ```

use envoy_types::pb::envoy::extensions::filters::common::fault::v3 as common;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3 as fpb;
use envoy_types::pb::envoy::r#type::v3::{fractional_percent::DenominatorType, FractionalPercent};
use envoy_types::pb::google::protobuf as pb;
use serde::Deserialize;

use crate::model::{DurationField, ModelError};

/// The filter's instance name (Envoy's well-known name, which istiod uses).
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";

/// A `fault` block.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// Delay calls before they are sent.
    #[serde(default)]
    pub delay: Option<DelaySpec>,
    /// Fail calls before they are sent.
    #[serde(default)]
    pub abort: Option<AbortSpec>,
    /// At most this many calls of a client process in an injected delay at
    /// once (default: no limit).
    #[serde(default, rename = "maxActiveFaults")]
    pub max_active_faults: Option<u32>,
}

/// `fault.delay`: exactly one of `fixed` and `header`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DelaySpec {
    /// A fixed delay.
    #[serde(default)]
    pub fixed: Option<DurationField>,
    /// The caller's `x-envoy-fault-delay-request` header gives the delay in
    /// milliseconds.
    #[serde(default)]
    pub header: bool,
    /// The share of calls delayed, 0 to 100 (`x-envoy-fault-delay-request-percentage`
    /// may lower it for a call).
    pub percent: f64,
}

/// `fault.abort`: exactly one of `grpcStatus`, `httpStatus` and `header`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AbortSpec {
    /// The gRPC status code, 1 to 16.
    #[serde(default, rename = "grpcStatus")]
    pub grpc_status: Option<u32>,
    /// An HTTP status, 200 to 599 (gRPC clients map it to a gRPC status).
    #[serde(default, rename = "httpStatus")]
    pub http_status: Option<u32>,
    /// The caller's `x-envoy-fault-abort-grpc-request` header gives the
    /// status.
    #[serde(default)]
    pub header: bool,
    /// The share of calls aborted, 0 to 100.
    pub percent: f64,
}

impl FaultSpec {
    /// Checks what the types cannot; `at` is the block's path.
    pub(crate) fn validate(&self, at: &str) -> Result<(), ModelError> {
        if self.delay.is_none() && self.abort.is_none() {
            return Err(ModelError::invalid(
                at,
                "{}",
                "needs a delay, an abort or both",
            ));
        }
        if let Some(d) = &self.delay {
            let at = format!("{at}.delay");
            if d.fixed.is_some() == d.header {
                return Err(ModelError::invalid(
                    at,
                    format!("fixed: {:?}, header: {}", d.fixed.map(|f| f.0), d.header),
                    "needs exactly one of fixed and header: true",
                ));
            }
            percent(d.percent, &format!("{at}.percent"))?;
        }
        if let Some(a) = &self.abort {
            let at = format!("{at}.abort");
            let set = usize::from(a.grpc_status.is_some())
                + usize::from(a.http_status.is_some())
                + usize::from(a.header);
            if set != 1 {
                return Err(ModelError::invalid(
                    at,
                    set,
                    "needs exactly one of grpcStatus, httpStatus and header: true",
                ));
            }
            if let Some(s) = a.grpc_status.filter(|s| !(1..=16).contains(s)) {
                return Err(ModelError::invalid(
                    format!("{at}.grpcStatus"),
                    s,
                    "must be a gRPC status code from 1 to 16 (0 is OK, which aborts nothing)",
                ));
            }
            if let Some(s) = a.http_status.filter(|s| !(200..600).contains(s)) {
                return Err(ModelError::invalid(
                    format!("{at}.httpStatus"),
                    s,
                    "must be an HTTP status from 200 to 599 (Envoy's bound)",
                ));
            }
            percent(a.percent, &format!("{at}.percent"))?;
        }
        Ok(())
    }

    /// The `HTTPFault` of this block.
    pub fn to_proto(&self) -> fpb::HttpFault {
        fpb::HttpFault {
            delay: self.delay.as_ref().map(|d| common::FaultDelay {
                fault_delay_secifier: Some(match d.fixed {
                    Some(f) => common::fault_delay::FaultDelaySecifier::FixedDelay(pb::Duration {
                        seconds: f.0.as_secs() as i64,
                        nanos: f.0.subsec_nanos() as i32,
                    }),
                    None => common::fault_delay::FaultDelaySecifier::HeaderDelay(
                        common::fault_delay::HeaderDelay {},
                    ),
                }),
                percentage: Some(fraction(d.percent)),
            }),
            abort: self.abort.as_ref().map(|a| {
                use fpb::fault_abort::ErrorType;
                fpb::FaultAbort {
                    error_type: Some(match (a.grpc_status, a.http_status) {
                        (Some(s), _) => ErrorType::GrpcStatus(s),
                        (_, Some(s)) => ErrorType::HttpStatus(s),
                        _ => ErrorType::HeaderAbort(fpb::fault_abort::HeaderAbort {}),
                    }),
                    percentage: Some(fraction(a.percent)),
                    ..Default::default()
                }
            }),
            max_active_faults: self
                .max_active_faults
                .map(|value| pb::UInt32Value { value }),
            ..Default::default()
        }
    }
}

fn percent(p: f64, at: &str) -> Result<(), ModelError> {
    if !(0.0..=100.0).contains(&p) {
        return Err(ModelError::invalid(at, p, "must be from 0 to 100"));
    }
    Ok(())
}

/// A whole percent out of a hundred (so that the percentage headers, which
/// give a numerator, read as percents); anything finer out of a million.
fn fraction(p: f64) -> FractionalPercent {
    if p.fract() == 0.0 {
        FractionalPercent {
            numerator: p as u32,
            denominator: DenominatorType::Hundred as i32,
        }
    } else {
        FractionalPercent {
            numerator: (p * 10_000.0).round() as u32,
            denominator: DenominatorType::Million as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> FaultSpec {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn blocks_translate_to_http_fault() {
        let f = spec("delay: { fixed: 1.5s, percent: 12.5 }\nabort: { httpStatus: 503, percent: 100 }\nmaxActiveFaults: 3");
        f.validate("fault").unwrap();
        let p = f.to_proto();
        let d = p.delay.unwrap();
        assert_eq!(
            d.fault_delay_secifier,
            Some(common::fault_delay::FaultDelaySecifier::FixedDelay(
                pb::Duration {
                    seconds: 1,
                    nanos: 500_000_000
                }
            ))
        );
        assert_eq!(
            d.percentage,
            Some(FractionalPercent {
                numerator: 125_000,
                denominator: DenominatorType::Million as i32
            })
        );
        let a = p.abort.unwrap();
        assert_eq!(
            a.error_type,
            Some(fpb::fault_abort::ErrorType::HttpStatus(503))
        );
        assert_eq!(a.percentage.unwrap().numerator, 100);
        assert_eq!(p.max_active_faults, Some(pb::UInt32Value { value: 3 }));
        let h = spec("delay: { header: true, percent: 100 }\nabort: { header: true, percent: 50 }")
            .to_proto();
        assert!(matches!(
            h.delay.unwrap().fault_delay_secifier,
            Some(common::fault_delay::FaultDelaySecifier::HeaderDelay(_))
        ));
        assert!(matches!(
            h.abort.unwrap().error_type,
            Some(fpb::fault_abort::ErrorType::HeaderAbort(_))
        ));
    }

    #[test]
    fn errors_name_the_field_and_value() {
        let cases = [
            ("maxActiveFaults: 1", "fault: \"{}\" needs a delay, an abort or both"),
            (
                "delay: { percent: 5 }",
                "fault.delay: \"fixed: None, header: false\" needs exactly one of fixed and header: true",
            ),
            (
                "abort: { grpcStatus: 17, percent: 5 }",
                "fault.abort.grpcStatus: 17 must be a gRPC status code from 1 to 16 (0 is OK, which aborts nothing)",
            ),
            (
                "abort: { grpcStatus: 3, header: true, percent: 5 }",
                "fault.abort: 2 needs exactly one of grpcStatus, httpStatus and header: true",
            ),
            (
                "abort: { httpStatus: 600, percent: 5 }",
                "fault.abort.httpStatus: 600 must be an HTTP status from 200 to 599 (Envoy's bound)",
            ),
            (
                "delay: { fixed: 1s, percent: 101 }",
                "fault.delay.percent: 101.0 must be from 0 to 100",
            ),
        ];
        for (yaml, want) in cases {
            let err = spec(yaml).validate("fault").unwrap_err();
            assert_eq!(err.to_string(), want, "{yaml}");
        }
    }
}
