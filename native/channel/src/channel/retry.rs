//! Retries (gRFC A6) as the route's `retry_policy` configures them (A44),
//! made as C-core makes them: an attempt that ends with a status the policy
//! names, before the call committed (no response headers, no more sent than
//! the retry buffer holds), is picked again after a backoff, up to
//! `num_retries + 1` attempts and never more than 5; the server's
//! `grpc-retry-pushback-ms` replaces the backoff or stops the retries; each
//! retry tells the server how many attempts came before it.
//!
//! This module holds the route's policy, the backoff and the server's
//! pushback; the retry filter that makes a call's attempts is `attempts`.

use std::time::Duration;

use http::HeaderMap;
use tonic::Code;

use crate::lb::random;
use crate::xds::resource::retry::RetryPolicy as XdsRetryPolicy;

/// At most this many attempts a call, whatever the policy asks (C-core's
/// `MAX_MAX_RETRY_ATTEMPTS`).
pub const MAX_ATTEMPTS: u32 = 5;
/// The request header that carries the number of earlier attempts
/// (a name made once: a lookup by `&str` parses it every time).
pub static PREVIOUS_ATTEMPTS_HEADER: http::HeaderName =
    http::HeaderName::from_static("grpc-previous-rpc-attempts");
/// The trailer a server asks for a retry delay with (milliseconds; a
/// negative value or one that is not a number: no more retries).
pub const PUSHBACK_TRAILER: &str = "grpc-retry-pushback-ms";
/// The backoff multiplier A44 sets.
const MULTIPLIER: u32 = 2;
/// C-core's retry backoff jitter: each delay is within ±20 %.
const JITTER: f64 = 0.2;

/// A route's retry policy as calls run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The retried statuses, one bit per code.
    codes: u32,
    /// Attempts in all, the first included (2 to 5).
    pub max_attempts: u32,
    /// The first backoff.
    pub initial_backoff: Duration,
    /// The longest backoff before jitter.
    pub max_backoff: Duration,
}

/// Why a route's retry policy cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRetryPolicy(pub String);

impl RetryPolicy {
    /// The policy of an xDS `retry_policy`: `None` when it names no status
    /// gRPC retries; an error for a zero backoff, which gRPC's retry policy
    /// refuses (C-core then fails the whole route table).
    pub fn from_xds(p: &XdsRetryPolicy) -> Result<Option<RetryPolicy>, InvalidRetryPolicy> {
        if p.retry_on.is_empty() {
            return Ok(None);
        }
        for (field, d) in [
            ("base_interval", p.base_interval),
            ("max_interval", p.max_interval),
        ] {
            if d.is_zero() {
                return Err(InvalidRetryPolicy(format!(
                    "retry_policy.retry_back_off.{field} is 0s; a retry backoff must be above 0"
                )));
            }
        }
        Ok(Some(RetryPolicy {
            codes: p.retry_on.iter().fold(0, |bits, c| bits | 1 << (*c as u32)),
            max_attempts: p.num_retries.saturating_add(1).min(MAX_ATTEMPTS),
            initial_backoff: p.base_interval,
            max_backoff: p.max_interval,
        }))
    }

    /// Whether an attempt that ended with `code` may be retried.
    pub fn retries(&self, code: Code) -> bool {
        self.codes & (1 << (code as u32)) != 0
    }
}

/// A call's backoff: the first retry waits about the initial backoff, each
/// next one twice the last, up to the maximum, each within ±20 %.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    current: Option<Duration>,
}

impl Backoff {
    /// The delay before the next retry.
    pub fn next(&mut self, policy: &RetryPolicy) -> Duration {
        let current = match self.current {
            None => policy.initial_backoff,
            Some(c) => (c * MULTIPLIER).min(policy.max_backoff),
        };
        self.current = Some(current);
        // uniform in [1 - JITTER, 1 + JITTER)
        let unit = random::below(1 << 32) as f64 / (1u64 << 32) as f64;
        current.mul_f64(1.0 - JITTER + 2.0 * JITTER * unit)
    }

    /// After a server's pushback the next backoff starts over.
    pub fn reset(&mut self) {
        self.current = None;
    }
}

/// What a failed attempt's server asked of the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushback {
    /// Nothing: the backoff decides.
    None,
    /// Retry after exactly this long.
    After(Duration),
    /// Do not retry (a negative value, or one that is not a number).
    Stop,
}

/// The `grpc-retry-pushback-ms` of an attempt's trailers.
pub(crate) fn pushback(trailers: &HeaderMap) -> Pushback {
    let Some(v) = trailers.get(PUSHBACK_TRAILER) else {
        return Pushback::None;
    };
    match v.to_str().ok().and_then(|s| s.trim().parse::<i64>().ok()) {
        Some(ms) if ms >= 0 => Pushback::After(Duration::from_millis(ms as u64)),
        _ => Pushback::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xds(codes: Vec<Code>, retries: u32, base_ms: u64, max_ms: u64) -> XdsRetryPolicy {
        let mut p = XdsRetryPolicy::default();
        p.retry_on = codes;
        p.num_retries = retries;
        p.base_interval = Duration::from_millis(base_ms);
        p.max_interval = Duration::from_millis(max_ms);
        p
    }

    #[test]
    fn attempts_are_capped_at_five_and_codes_kept() {
        let p = RetryPolicy::from_xds(&xds(vec![Code::Unavailable, Code::Cancelled], 10, 25, 250))
            .unwrap()
            .unwrap();
        assert_eq!(p.max_attempts, 5);
        assert!(p.retries(Code::Unavailable) && p.retries(Code::Cancelled));
        assert!(!p.retries(Code::Internal) && !p.retries(Code::Ok));
        let two = RetryPolicy::from_xds(&xds(vec![Code::Internal], 1, 25, 250))
            .unwrap()
            .unwrap();
        assert_eq!(two.max_attempts, 2);
        // No code gRPC retries: no policy.
        assert_eq!(RetryPolicy::from_xds(&xds(vec![], 3, 25, 250)), Ok(None));
        assert_eq!(
            RetryPolicy::from_xds(&xds(vec![Code::Internal], 1, 0, 250)),
            Err(InvalidRetryPolicy(
                "retry_policy.retry_back_off.base_interval is 0s; a retry backoff must be above 0"
                    .into()
            ))
        );
    }

    #[test]
    fn backoff_doubles_to_the_maximum_within_twenty_percent() {
        let p = RetryPolicy::from_xds(&xds(vec![Code::Unavailable], 4, 100, 350))
            .unwrap()
            .unwrap();
        for _ in 0..200 {
            let mut b = Backoff::default();
            for base in [100.0, 200.0, 350.0, 350.0] {
                let d = b.next(&p).as_secs_f64() * 1000.0;
                assert!(d >= base * 0.8 && d < base * 1.2, "{d} around {base}");
            }
            b.reset();
            let d = b.next(&p).as_secs_f64() * 1000.0;
            assert!((80.0..120.0).contains(&d), "{d} after a reset");
        }
    }

    #[test]
    fn pushback_values_as_c_core_reads_them() {
        let of = |v: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = v {
                h.insert(PUSHBACK_TRAILER, v.parse().unwrap());
            }
            pushback(&h)
        };
        assert_eq!(of(None), Pushback::None);
        assert_eq!(of(Some("300")), Pushback::After(Duration::from_millis(300)));
        assert_eq!(of(Some("0")), Pushback::After(Duration::ZERO));
        assert_eq!(of(Some("-1")), Pushback::Stop);
        assert_eq!(of(Some("soon")), Pushback::Stop);
    }
}
