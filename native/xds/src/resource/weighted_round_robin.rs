//! `weighted_round_robin`'s config (gRFC A58) validated into
//! [`Settings`]: from a cluster's `ClientSideWeightedRoundRobin`, or from a
//! TypedStruct's service-config JSON.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::load_balancing_policies::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin;

use super::{Check, Spelling};
use crate::lb_config::weighted_round_robin::{
    Settings, DEFAULT_BLACKOUT_PERIOD, DEFAULT_ERROR_UTILIZATION_PENALTY,
    DEFAULT_OOB_REPORTING_PERIOD, DEFAULT_WEIGHT_EXPIRATION_PERIOD, DEFAULT_WEIGHT_UPDATE_PERIOD,
    MIN_WEIGHT_UPDATE_PERIOD,
};

/// Validates a cluster's `ClientSideWeightedRoundRobin` into [`Settings`]:
/// A58's defaults for unset fields, `weight_update_period` raised to
/// [`MIN_WEIGHT_UPDATE_PERIOD`], and a negative (or NaN)
/// `error_utilization_penalty` or a malformed duration refused (recorded
/// on `c`, naming the field and value). Fields gRPC ignores
/// (`metric_names_for_computing_utilization`, `slow_start_config`,
/// `oob_reporting_config`) are ignored here too.
pub(crate) fn parse(c: &mut Check, p: &ClientSideWeightedRoundRobin) -> Option<Settings> {
    parse_as(c, p, Spelling::Proto)
}

/// [`parse`], with errors naming the fields as `spelling` does: as the
/// proto, or as the service-config JSON when the message was read from a
/// TypedStruct's `weighted_round_robin` config.
pub(crate) fn parse_as(
    c: &mut Check,
    p: &ClientSideWeightedRoundRobin,
    spelling: Spelling,
) -> Option<Settings> {
    let mut ok = true;
    let mut duration = |c: &mut Check,
                        field: &str,
                        d: &Option<envoy_types::pb::google::protobuf::Duration>,
                        default: Duration| {
        match d {
            None => default,
            Some(d) => c.at(field, |c| c.duration(d)).unwrap_or_else(|| {
                ok = false;
                default
            }),
        }
    };
    let oob_reporting_period = duration(
        c,
        spelling.name("oob_reporting_period", "oobReportingPeriod"),
        &p.oob_reporting_period,
        DEFAULT_OOB_REPORTING_PERIOD,
    );
    let blackout_period = duration(
        c,
        spelling.name("blackout_period", "blackoutPeriod"),
        &p.blackout_period,
        DEFAULT_BLACKOUT_PERIOD,
    );
    let weight_expiration_period = duration(
        c,
        spelling.name("weight_expiration_period", "weightExpirationPeriod"),
        &p.weight_expiration_period,
        DEFAULT_WEIGHT_EXPIRATION_PERIOD,
    );
    let weight_update_period = duration(
        c,
        spelling.name("weight_update_period", "weightUpdatePeriod"),
        &p.weight_update_period,
        DEFAULT_WEIGHT_UPDATE_PERIOD,
    )
    .max(MIN_WEIGHT_UPDATE_PERIOD);
    let error_utilization_penalty = p
        .error_utilization_penalty
        .as_ref()
        .map_or(DEFAULT_ERROR_UTILIZATION_PENALTY, |v| v.value);
    if error_utilization_penalty.is_nan() || error_utilization_penalty < 0.0 {
        let field = spelling.name("error_utilization_penalty", "errorUtilizationPenalty");
        c.at(field, |c| {
            c.fail_value(error_utilization_penalty, "must be non-negative")
        });
        ok = false;
    }
    ok.then_some(Settings {
        enable_oob_load_report: p.enable_oob_load_report.as_ref().is_some_and(|v| v.value),
        oob_reporting_period,
        blackout_period,
        weight_expiration_period,
        weight_update_period,
        error_utilization_penalty,
    })
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf as pb;

    use super::*;

    #[test]
    fn config_defaults() {
        let mut c = Check::default();
        let s = parse(&mut c, &ClientSideWeightedRoundRobin::default()).unwrap();
        assert!(c.errors().is_empty());
        assert_eq!(s, Settings::default());
        assert_eq!(s.blackout_period, Duration::from_secs(10));
        assert_eq!(s.weight_expiration_period, Duration::from_secs(180));
        assert_eq!(s.weight_update_period, Duration::from_secs(1));
        assert_eq!(s.oob_reporting_period, Duration::from_secs(10));
        assert_eq!(s.error_utilization_penalty, 1.0);
        assert!(!s.enable_oob_load_report);
    }

    fn duration(seconds: i64, nanos: i32) -> Option<pb::Duration> {
        Some(pb::Duration { seconds, nanos })
    }

    #[test]
    fn config_values_and_the_update_period_floor() {
        let p = ClientSideWeightedRoundRobin {
            enable_oob_load_report: Some(pb::BoolValue { value: true }),
            oob_reporting_period: duration(5, 0),
            blackout_period: duration(0, 0),
            weight_expiration_period: duration(60, 0),
            weight_update_period: duration(0, 50_000_000),
            error_utilization_penalty: Some(pb::FloatValue { value: 0.0 }),
            ..Default::default()
        };
        let mut c = Check::default();
        let s = parse(&mut c, &p).unwrap();
        assert!(c.errors().is_empty());
        assert_eq!(
            s,
            Settings {
                enable_oob_load_report: true,
                oob_reporting_period: Duration::from_secs(5),
                blackout_period: Duration::ZERO,
                weight_expiration_period: Duration::from_secs(60),
                weight_update_period: MIN_WEIGHT_UPDATE_PERIOD,
                error_utilization_penalty: 0.0,
            }
        );
    }

    #[test]
    fn config_errors_name_field_and_value() {
        let p = ClientSideWeightedRoundRobin {
            blackout_period: duration(-1, 0),
            error_utilization_penalty: Some(pb::FloatValue { value: -0.5 }),
            ..Default::default()
        };
        let mut c = Check::default();
        assert_eq!(parse(&mut c, &p), None);
        let errors: Vec<String> = c.errors().iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "blackout_period.seconds: -1 is outside [0, 315576000000]",
                "error_utilization_penalty: -0.5 must be non-negative",
            ]
        );
        let nan = ClientSideWeightedRoundRobin {
            error_utilization_penalty: Some(pb::FloatValue { value: f32::NAN }),
            ..Default::default()
        };
        let mut c = Check::default();
        assert_eq!(parse(&mut c, &nan), None);
        assert_eq!(c.errors().len(), 1);
    }
}
