//! A route's or virtual host's `retry_policy` (gRFC A44) as C-core reads
//! it: the `retry_on` conditions gRPC knows become status codes (others are
//! ignored; none left means no retries), `num_retries` (default 1, 0 is an
//! error) and `retry_back_off` (default 25 ms to 250 ms; the maximum
//! defaults to ten times the base). A route's policy replaces its virtual
//! host's whole.

use std::time::Duration;

use envoy_types::pb::envoy::config::route::v3 as rpb;
use tonic::Code;

use super::Check;

/// The `retry_on` names gRPC turns into status codes, in C-core's order.
pub const RETRY_ON: [(&str, Code); 5] = [
    ("cancelled", Code::Cancelled),
    ("deadline-exceeded", Code::DeadlineExceeded),
    ("internal", Code::Internal),
    ("resource-exhausted", Code::ResourceExhausted),
    ("unavailable", Code::Unavailable),
];

/// A validated retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// The statuses an attempt is retried on, in [`RETRY_ON`]'s order
    /// (empty: the policy retries nothing).
    pub retry_on: Vec<Code>,
    /// `num_retries`: attempts after the first (gRPC makes at most 5 in all).
    pub num_retries: u32,
    /// `retry_back_off.base_interval`: the first backoff.
    pub base_interval: Duration,
    /// `retry_back_off.max_interval`: the longest backoff.
    pub max_interval: Duration,
}

impl Default for RetryPolicy {
    /// No status codes, one retry, 25 ms to 250 ms.
    fn default() -> Self {
        RetryPolicy {
            retry_on: Vec::new(),
            num_retries: 1,
            base_interval: Duration::from_millis(25),
            max_interval: Duration::from_millis(250),
        }
    }
}

/// Validates a `RetryPolicy` as C-core's `RetryPolicyParse` does.
pub(crate) fn validate(c: &mut Check, p: &rpb::RetryPolicy) -> RetryPolicy {
    let mut out = RetryPolicy::default();
    // Split on ',' exactly: " unavailable" is not a condition gRPC knows.
    let named: Vec<&str> = p.retry_on.split(',').collect();
    out.retry_on = RETRY_ON
        .iter()
        .filter(|(name, _)| named.contains(name))
        .map(|(_, code)| *code)
        .collect();
    if let Some(n) = &p.num_retries {
        if n.value == 0 {
            c.fail_at("num_retries", "must be greater than 0");
        }
        out.num_retries = n.value;
    }
    if let Some(b) = &p.retry_back_off {
        c.at("retry_back_off", |c| {
            match &b.base_interval {
                None => c.fail_at("base_interval", "field not present"),
                Some(d) => {
                    out.base_interval = c.at("base_interval", |c| c.duration(d)).unwrap_or_default()
                }
            }
            out.max_interval = match &b.max_interval {
                Some(d) => c.at("max_interval", |c| c.duration(d)).unwrap_or_default(),
                None => out.base_interval * 10,
            };
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf as pb;

    fn run(p: &rpb::RetryPolicy) -> (RetryPolicy, Vec<String>) {
        let mut c = Check::default();
        let out = validate(&mut c, p);
        (out, c.errors().iter().map(|e| e.to_string()).collect())
    }

    fn ms(n: i32) -> pb::Duration {
        pb::Duration {
            seconds: 0,
            nanos: n * 1_000_000,
        }
    }

    #[test]
    fn retry_on_keeps_the_codes_grpc_knows_in_c_cores_order() {
        let (p, errors) = run(&rpb::RetryPolicy {
            retry_on: "unavailable,5xx,cancelled,reset, internal,resource-exhausted".into(),
            ..Default::default()
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            p.retry_on,
            [Code::Cancelled, Code::ResourceExhausted, Code::Unavailable]
        );
        assert_eq!(p.num_retries, 1);
        assert_eq!(
            (p.base_interval, p.max_interval),
            (Duration::from_millis(25), Duration::from_millis(250))
        );
        let (p, _) = run(&rpb::RetryPolicy {
            retry_on: "5xx,gateway-error".into(),
            ..Default::default()
        });
        assert!(p.retry_on.is_empty());
    }

    #[test]
    fn backoff_and_retries_as_c_core_reads_them() {
        let (p, errors) = run(&rpb::RetryPolicy {
            retry_on: "unavailable".into(),
            num_retries: Some(pb::UInt32Value { value: 7 }),
            retry_back_off: Some(rpb::retry_policy::RetryBackOff {
                base_interval: Some(ms(40)),
                max_interval: None,
            }),
            ..Default::default()
        });
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(p.num_retries, 7);
        assert_eq!(
            (p.base_interval, p.max_interval),
            (Duration::from_millis(40), Duration::from_millis(400))
        );
        let (_, errors) = run(&rpb::RetryPolicy {
            retry_on: "unavailable".into(),
            num_retries: Some(pb::UInt32Value { value: 0 }),
            retry_back_off: Some(rpb::retry_policy::RetryBackOff {
                base_interval: None,
                max_interval: Some(ms(-1)),
            }),
            ..Default::default()
        });
        assert_eq!(
            errors,
            [
                "num_retries: must be greater than 0",
                "retry_back_off.base_interval: field not present",
                "retry_back_off.max_interval.nanos: -1000000 is outside [0, 999999999]",
            ]
        );
    }
}
