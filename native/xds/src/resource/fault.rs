//! The fault injection filter (gRFC A33): an `HTTPFault` in the listener's
//! HTTP filters or in a virtual host's, route's or weighted cluster's
//! `typed_per_filter_config` (the same message either way), read as gRPC
//! C-core reads it. What C-core leaves out is left out here too: header
//! matchers, upstream cluster and downstream node selection, the response
//! rate limit and every runtime key are ignored.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::filters::common::fault::v3::fault_delay::FaultDelaySecifier;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::fault_abort::ErrorType;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
use tonic::Code;

use super::Check;

/// The header that sets an abort's gRPC status when the abort is
/// header-controlled.
pub const ABORT_GRPC_STATUS_HEADER: &str = "x-envoy-fault-abort-grpc-request";
/// The header that lowers a header-controlled abort's percentage. C-core
/// reads this name; Envoy's documentation and gRFC A33 spell it
/// `x-envoy-fault-abort-request-percentage`.
pub const ABORT_PERCENTAGE_HEADER: &str = "x-envoy-fault-abort-percentage";
/// The header that sets a header-controlled delay, in milliseconds.
pub const DELAY_HEADER: &str = "x-envoy-fault-delay-request";
/// The header that lowers a header-controlled delay's percentage.
pub const DELAY_PERCENTAGE_HEADER: &str = "x-envoy-fault-delay-request-percentage";

/// A validated `HTTPFault`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FaultConfig {
    /// The delay injected before a call is picked, if configured.
    pub delay: Option<FaultDelay>,
    /// The status a call fails with before it is picked, if configured.
    pub abort: Option<FaultAbort>,
    /// `max_active_faults`: above this many calls delayed at once in the
    /// process, no more are delayed or aborted (unset: no limit).
    pub max_active_faults: Option<u32>,
}

/// What delays a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelaySource {
    /// `fixed_delay` (zero, or neither field set: no delay).
    Fixed(Duration),
    /// `header_delay`: the call's [`DELAY_HEADER`] gives milliseconds.
    Header,
}

/// A fault's delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultDelay {
    /// How long.
    pub source: DelaySource,
    /// The share of calls delayed (unset: none).
    pub percentage: Fraction,
}

/// What status an aborted call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortSource {
    /// `grpc_status`, or `http_status` mapped as C-core maps an HTTP status.
    /// `None`: no abort (`grpc_status` 0 with `http_status` 0 or 200, or
    /// neither set).
    Status(Option<Code>),
    /// `header_abort`: the call's [`ABORT_GRPC_STATUS_HEADER`] gives the
    /// status.
    Header,
}

/// A fault's abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultAbort {
    /// Which status.
    pub source: AbortSource,
    /// The share of calls aborted (unset: none).
    pub percentage: Fraction,
}

/// A `FractionalPercent`: `numerator` out of `denominator` (100, 10,000 or
/// 1,000,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fraction {
    /// Out of `denominator`; at or above it, always.
    pub numerator: u32,
    /// 100, 10,000 or 1,000,000.
    pub denominator: u32,
}

impl Fraction {
    /// Zero out of a hundred: an unset percentage.
    pub const NONE: Fraction = Fraction {
        numerator: 0,
        denominator: 100,
    };

    fn of(p: Option<&FractionalPercent>) -> Fraction {
        let Some(p) = p else {
            return Fraction::NONE;
        };
        // An unknown denominator counts as HUNDRED, as in C-core.
        let denominator = match DenominatorType::try_from(p.denominator) {
            Ok(DenominatorType::TenThousand) => 10_000,
            Ok(DenominatorType::Million) => 1_000_000,
            _ => 100,
        };
        Fraction {
            numerator: p.numerator,
            denominator,
        }
    }
}

/// The gRPC status C-core gives an HTTP status (`grpc_http2_status_to_grpc_status`):
/// `None` for 200.
pub fn code_of_http_status(status: u32) -> Option<Code> {
    Some(match status {
        200 => return None,
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    })
}

/// The gRPC status numbered `n`, if `n` is one (0 to 16).
pub fn code_of_number(n: i64) -> Option<Code> {
    (0..=16).contains(&n).then(|| Code::from_i32(n as i32))
}

/// Validates an `HTTPFault` as C-core does: a `grpc_status` above 16 and a
/// `fixed_delay` out of range are errors; the rest is read as it is.
pub(crate) fn validate(c: &mut Check, f: &HttpFault) -> FaultConfig {
    let abort = f.abort.as_ref().map(|a| {
        c.at("abort", |c| {
            let source = match &a.error_type {
                Some(ErrorType::HeaderAbort(_)) => AbortSource::Header,
                Some(ErrorType::GrpcStatus(s)) if *s != 0 => match code_of_number(i64::from(*s)) {
                    Some(code) => AbortSource::Status(Some(code)),
                    None => {
                        c.at("grpc_status", |c| {
                            c.fail_value(s, "is not a gRPC status code (0 to 16)")
                        });
                        AbortSource::Status(None)
                    }
                },
                Some(ErrorType::HttpStatus(s)) if *s != 0 => {
                    AbortSource::Status(code_of_http_status(*s))
                }
                _ => AbortSource::Status(None),
            };
            FaultAbort {
                source,
                percentage: Fraction::of(a.percentage.as_ref()),
            }
        })
    });
    let delay = f.delay.as_ref().map(|d| {
        c.at("delay", |c| {
            let source = match &d.fault_delay_secifier {
                Some(FaultDelaySecifier::HeaderDelay(_)) => DelaySource::Header,
                Some(FaultDelaySecifier::FixedDelay(fixed)) => DelaySource::Fixed(
                    c.at("fixed_delay", |c| c.duration(fixed))
                        .unwrap_or_default(),
                ),
                None => DelaySource::Fixed(Duration::ZERO),
            };
            FaultDelay {
                source,
                percentage: Fraction::of(d.percentage.as_ref()),
            }
        })
    });
    FaultConfig {
        delay,
        abort,
        max_active_faults: f.max_active_faults.as_ref().map(|m| m.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{
        fault_delay, FaultDelay as PbDelay,
    };
    use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
        fault_abort, FaultAbort as PbAbort,
    };
    use envoy_types::pb::google::protobuf as pb;

    fn abort(e: ErrorType, p: Option<(u32, DenominatorType)>) -> HttpFault {
        HttpFault {
            abort: Some(PbAbort {
                error_type: Some(e),
                percentage: p.map(|(numerator, d)| FractionalPercent {
                    numerator,
                    denominator: d as i32,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn run(f: &HttpFault) -> (FaultConfig, Vec<String>) {
        let mut c = Check::default();
        let config = validate(&mut c, f);
        (config, c.errors().iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn abort_sources_as_c_core_reads_them() {
        let cases = [
            (
                ErrorType::GrpcStatus(14),
                AbortSource::Status(Some(Code::Unavailable)),
            ),
            (ErrorType::GrpcStatus(0), AbortSource::Status(None)),
            (
                ErrorType::HttpStatus(503),
                AbortSource::Status(Some(Code::Unavailable)),
            ),
            (
                ErrorType::HttpStatus(404),
                AbortSource::Status(Some(Code::Unimplemented)),
            ),
            (
                ErrorType::HttpStatus(400),
                AbortSource::Status(Some(Code::Internal)),
            ),
            (
                ErrorType::HttpStatus(418),
                AbortSource::Status(Some(Code::Unknown)),
            ),
            // C-core: 200 maps to OK, which injects nothing (A33's text says UNKNOWN).
            (ErrorType::HttpStatus(200), AbortSource::Status(None)),
            (
                ErrorType::HeaderAbort(fault_abort::HeaderAbort {}),
                AbortSource::Header,
            ),
        ];
        for (e, want) in cases {
            let (config, errors) = run(&abort(e, Some((25, DenominatorType::TenThousand))));
            assert!(errors.is_empty(), "{e:?}: {errors:?}");
            let a = config.abort.unwrap();
            assert_eq!(a.source, want, "{e:?}");
            assert_eq!(
                a.percentage,
                Fraction {
                    numerator: 25,
                    denominator: 10_000
                }
            );
        }
        // No percentage: none of the calls.
        let (config, _) = run(&abort(ErrorType::GrpcStatus(2), None));
        assert_eq!(config.abort.unwrap().percentage, Fraction::NONE);
    }

    #[test]
    fn a_status_above_16_is_an_error_naming_the_field() {
        let (_, errors) = run(&abort(ErrorType::GrpcStatus(17), None));
        assert_eq!(
            errors,
            ["abort.grpc_status: 17 is not a gRPC status code (0 to 16)"]
        );
    }

    #[test]
    fn delays_fixed_by_header_and_out_of_range() {
        let delay = |s: Option<fault_delay::FaultDelaySecifier>| HttpFault {
            delay: Some(PbDelay {
                fault_delay_secifier: s,
                percentage: Some(FractionalPercent {
                    numerator: 50,
                    denominator: DenominatorType::Hundred as i32,
                }),
            }),
            max_active_faults: Some(pb::UInt32Value { value: 3 }),
            ..Default::default()
        };
        let (config, errors) = run(&delay(Some(FaultDelaySecifier::FixedDelay(pb::Duration {
            seconds: 1,
            nanos: 500_000_000,
        }))));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            config.delay.unwrap().source,
            DelaySource::Fixed(Duration::from_millis(1500))
        );
        assert_eq!(config.max_active_faults, Some(3));
        let (config, _) = run(&delay(Some(FaultDelaySecifier::HeaderDelay(
            fault_delay::HeaderDelay {},
        ))));
        assert_eq!(config.delay.unwrap().source, DelaySource::Header);
        let (config, _) = run(&delay(None));
        assert_eq!(
            config.delay.unwrap().source,
            DelaySource::Fixed(Duration::ZERO)
        );
        let (_, errors) = run(&delay(Some(FaultDelaySecifier::FixedDelay(pb::Duration {
            seconds: -1,
            nanos: 0,
        }))));
        assert_eq!(
            errors,
            ["delay.fixed_delay.seconds: -1 is outside [0, 315576000000]"]
        );
    }
}
