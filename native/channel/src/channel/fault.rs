//! The fault injection filter (gRFC A33), run as gRPC C-core runs it: once
//! a call's route is chosen and before it is picked, each fault filter of
//! the listener (in order) may delay the call and then fail it with a
//! status, each with its own roll of the dice. Header-controlled faults read
//! the call's `x-envoy-fault-*` metadata. `max_active_faults` bounds the
//! calls of the whole process that sit in an injected delay.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;
use tonic::{Code, Status};

use super::config_selector::header_value;
use super::deadline::sleep_within;
use crate::filter::{Answered, Call, Filter};
use crate::lb::random;
use crate::xds::resource::fault::{
    code_of_number, AbortSource, DelaySource, FaultConfig, Fraction, ABORT_GRPC_STATUS_HEADER,
    ABORT_PERCENTAGE_HEADER, DELAY_HEADER, DELAY_PERCENTAGE_HEADER,
};

/// The message of an injected abort (C-core's).
pub const ABORT_MESSAGE: &str = "Fault injected";

/// Calls of this process in an injected delay, across every channel (C-core
/// keeps one such gauge per process).
static ACTIVE_FAULTS: AtomicU32 = AtomicU32::new(0);

/// What one fault filter decided for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Injection {
    /// The delay rolled for the call (zero: none).
    pub delay: Duration,
    /// The status rolled for the call.
    pub abort: Option<Code>,
    /// The filter's `max_active_faults` (no limit: `u32::MAX`).
    pub max_active_faults: u32,
}

/// Rolls `config`'s dice for a call with `headers`: the delay and the abort
/// each with a roll of their own (A33), header-controlled values read as
/// C-core reads them.
pub(crate) fn decide(config: &FaultConfig, headers: &HeaderMap) -> Injection {
    let mut delay = Duration::ZERO;
    let mut delay_share = Fraction::NONE;
    if let Some(d) = &config.delay {
        delay_share = d.percentage;
        match d.source {
            DelaySource::Fixed(t) => delay = t,
            DelaySource::Header => {
                // Milliseconds; anything but a number is no delay, a
                // negative one too.
                if let Some(v) = header_value(headers, DELAY_HEADER) {
                    let ms = v.trim().parse::<i64>().unwrap_or(0).max(0);
                    delay = Duration::from_millis(ms as u64);
                }
                lower(&mut delay_share, headers, DELAY_PERCENTAGE_HEADER);
            }
        }
    }
    let mut abort = None;
    let mut abort_share = Fraction::NONE;
    if let Some(a) = &config.abort {
        abort_share = a.percentage;
        match a.source {
            AbortSource::Status(code) => abort = code,
            AbortSource::Header => {
                // A value that is not a number aborts with UNKNOWN; a number
                // outside 0..=16 does not abort (C-core).
                if let Some(v) = header_value(headers, ABORT_GRPC_STATUS_HEADER) {
                    abort = match v.trim().parse::<i64>() {
                        Ok(n) => code_of_number(n).filter(|c| *c != Code::Ok),
                        Err(_) => Some(Code::Unknown),
                    };
                }
                lower(&mut abort_share, headers, ABORT_PERCENTAGE_HEADER);
            }
        }
    }
    if !delay.is_zero() && !roll(delay_share) {
        delay = Duration::ZERO;
    }
    if abort.is_some() && !roll(abort_share) {
        abort = None;
    }
    Injection {
        delay,
        abort,
        max_active_faults: config.max_active_faults.unwrap_or(u32::MAX),
    }
}

/// A percentage header lowers the configured numerator, never raises it;
/// one that is not a number leaves it.
fn lower(share: &mut Fraction, headers: &HeaderMap, name: &str) {
    if let Some(v) = header_value(headers, name) {
        let n = v.trim().parse::<u32>().unwrap_or(u32::MAX);
        share.numerator = share.numerator.min(n);
    }
}

/// True for `share` of the calls.
fn roll(share: Fraction) -> bool {
    if share.numerator == 0 {
        return false;
    }
    if share.numerator >= share.denominator {
        return true;
    }
    random::below(u64::from(share.denominator)) < u64::from(share.numerator)
}

/// Holds one place in the active-fault gauge while a call is delayed; a
/// call dropped mid-delay gives it back too.
struct ActiveFault<'a>(&'a AtomicU32);

impl Drop for ActiveFault<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Injection {
    /// Whether this filter injects anything.
    pub fn is_none(&self) -> bool {
        self.delay.is_zero() && self.abort.is_none()
    }

    /// Carries the decision out against the process's gauge.
    pub async fn run(&self, deadline: Option<Instant>) -> Result<(), Status> {
        self.run_with(&ACTIVE_FAULTS, deadline).await
    }

    /// Waits out the delay (if the gauge is below the limit; the call's
    /// deadline may end it first, failing the call as DEADLINE_EXCEEDED),
    /// then fails the call with the abort status: without a quota check
    /// when a delay was rolled, as in C-core, else only while the gauge is
    /// below the limit.
    async fn run_with(&self, gauge: &AtomicU32, deadline: Option<Instant>) -> Result<(), Status> {
        let below_limit = || gauge.load(Ordering::Acquire) < self.max_active_faults;
        if !self.delay.is_zero() && below_limit() {
            gauge.fetch_add(1, Ordering::Relaxed);
            let _active = ActiveFault(gauge);
            sleep_within(self.delay, deadline, "during an injected delay").await?;
            if let Some(code) = self.abort {
                return Err(Status::new(code, ABORT_MESSAGE));
            }
            return Ok(());
        }
        match self.abort {
            Some(code) if !self.delay.is_zero() || below_limit() => {
                Err(Status::new(code, ABORT_MESSAGE))
            }
            _ => Ok(()),
        }
    }
}

/// Runs each filter's decision in order for a call with `headers`.
pub(crate) async fn inject(
    faults: &[FaultConfig],
    headers: &HeaderMap,
    deadline: Option<Instant>,
) -> Result<(), Status> {
    for config in faults {
        let injection = decide(config, headers);
        if !injection.is_none() {
            injection.run(deadline).await?;
        }
    }
    Ok(())
}

/// The fault injection filter on the call path: its config for a call is
/// the route's fault configs, one per fault filter of the listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FaultInjection;

impl Filter for FaultInjection {
    type Config = [FaultConfig];

    async fn on_request(
        &self,
        faults: &[FaultConfig],
        call: &mut Call,
        request: &http::request::Parts,
    ) -> Result<(), Status> {
        call.waited = true;
        Box::pin(inject(faults, &request.headers, call.deadline)).await
    }

    /// Nothing: an injected fault ends the call before any response.
    fn on_response(
        &self,
        _faults: &[FaultConfig],
        _call: &Call,
        _answered: &Answered<'_>,
        _response: &mut http::response::Parts,
    ) {
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resource::fault::{FaultAbort, FaultDelay};

    fn always() -> Fraction {
        Fraction {
            numerator: 100,
            denominator: 100,
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn config(delay: Option<FaultDelay>, abort: Option<FaultAbort>) -> FaultConfig {
        let mut c = FaultConfig::default();
        c.delay = delay;
        c.abort = abort;
        c
    }

    fn header_abort(percent: u32) -> FaultConfig {
        config(
            None,
            Some(FaultAbort {
                source: AbortSource::Header,
                percentage: Fraction {
                    numerator: percent,
                    denominator: 100,
                },
            }),
        )
    }

    #[test]
    fn header_controlled_abort_reads_the_status_as_c_core_does() {
        let c = header_abort(100);
        let code = |pairs: &[(&'static str, &'static str)]| decide(&c, &headers(pairs)).abort;
        assert_eq!(code(&[]), None);
        assert_eq!(
            code(&[(ABORT_GRPC_STATUS_HEADER, "14")]),
            Some(Code::Unavailable)
        );
        assert_eq!(code(&[(ABORT_GRPC_STATUS_HEADER, "0")]), None);
        assert_eq!(code(&[(ABORT_GRPC_STATUS_HEADER, "17")]), None);
        assert_eq!(code(&[(ABORT_GRPC_STATUS_HEADER, "-1")]), None);
        // Not a number: UNKNOWN, as C-core (A33's text says ignored).
        assert_eq!(
            code(&[(ABORT_GRPC_STATUS_HEADER, "unavailable")]),
            Some(Code::Unknown)
        );
        // Two values join into one that is not a number.
        assert_eq!(
            code(&[
                (ABORT_GRPC_STATUS_HEADER, "14"),
                (ABORT_GRPC_STATUS_HEADER, "3")
            ]),
            Some(Code::Unknown)
        );
        // The percentage header lowers the configured 100 to 0.
        assert_eq!(
            code(&[
                (ABORT_GRPC_STATUS_HEADER, "14"),
                (ABORT_PERCENTAGE_HEADER, "0")
            ]),
            None
        );
        // It never raises it: configured 0 stays 0.
        let none = header_abort(0);
        let h = headers(&[
            (ABORT_GRPC_STATUS_HEADER, "14"),
            (ABORT_PERCENTAGE_HEADER, "100"),
        ]);
        assert_eq!(decide(&none, &h).abort, None);
        // A percentage that is not a number leaves the configured one.
        assert_eq!(
            code(&[
                (ABORT_GRPC_STATUS_HEADER, "14"),
                (ABORT_PERCENTAGE_HEADER, "x")
            ]),
            Some(Code::Unavailable)
        );
    }

    #[test]
    fn header_controlled_delay_reads_milliseconds() {
        let c = config(
            Some(FaultDelay {
                source: DelaySource::Header,
                percentage: always(),
            }),
            None,
        );
        let delay = |pairs: &[(&'static str, &'static str)]| decide(&c, &headers(pairs)).delay;
        assert_eq!(delay(&[]), Duration::ZERO);
        assert_eq!(delay(&[(DELAY_HEADER, "250")]), Duration::from_millis(250));
        assert_eq!(delay(&[(DELAY_HEADER, "-5")]), Duration::ZERO);
        assert_eq!(delay(&[(DELAY_HEADER, "soon")]), Duration::ZERO);
        assert_eq!(
            delay(&[(DELAY_HEADER, "250"), (DELAY_PERCENTAGE_HEADER, "0")]),
            Duration::ZERO
        );
    }

    #[test]
    fn percentages_roll_independently_near_their_share() {
        let c = config(
            Some(FaultDelay {
                source: DelaySource::Fixed(Duration::from_millis(5)),
                percentage: Fraction {
                    numerator: 200_000,
                    denominator: 1_000_000,
                },
            }),
            Some(FaultAbort {
                source: AbortSource::Status(Some(Code::Aborted)),
                percentage: Fraction {
                    numerator: 500,
                    denominator: 10_000,
                },
            }),
        );
        let h = HeaderMap::new();
        let (mut delays, mut aborts, mut any) = (0, 0, 0);
        let n = 100_000;
        for _ in 0..n {
            let i = decide(&c, &h);
            delays += usize::from(!i.delay.is_zero());
            aborts += usize::from(i.abort.is_some());
            any += usize::from(!i.is_none());
        }
        let share = |k: usize| k as f64 / n as f64;
        // 20 % delayed, 5 % aborted, and 24 % either: two rolls, not one.
        assert!((share(delays) - 0.20).abs() < 0.01, "{delays}");
        assert!((share(aborts) - 0.05).abs() < 0.005, "{aborts}");
        assert!((share(any) - 0.24).abs() < 0.01, "{any}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_gauge_bounds_delays_and_aborts_as_c_core_counts() {
        let gauge = AtomicU32::new(0);
        let delayed = Injection {
            delay: Duration::from_secs(1),
            abort: Some(Code::Unavailable),
            max_active_faults: 1,
        };
        let mut first = Box::pin(delayed.run_with(&gauge, None));
        // Polled once: it holds the one place while it sleeps.
        assert!(futures_poll(&mut first).await.is_none());
        assert_eq!(gauge.load(Ordering::Relaxed), 1);
        // A second delayed call finds the gauge full: no delay, but its
        // abort still applies, since a delay was rolled (C-core).
        let start = Instant::now();
        let second = delayed.run_with(&gauge, None).await.unwrap_err();
        assert_eq!(second.code(), Code::Unavailable);
        assert_eq!(Instant::now(), start);
        // An abort without a delay checks the gauge: full, so no abort.
        let abort_only = Injection {
            delay: Duration::ZERO,
            ..delayed.clone()
        };
        assert!(abort_only.run_with(&gauge, None).await.is_ok());
        // The first ends its delay, aborts and gives its place back.
        let status = first.await.unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unavailable, ABORT_MESSAGE)
        );
        assert_eq!(Instant::now(), start + Duration::from_secs(1));
        assert_eq!(gauge.load(Ordering::Relaxed), 0);
        assert_eq!(
            abort_only.run_with(&gauge, None).await.unwrap_err().code(),
            Code::Unavailable
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_inside_the_delay_ends_the_call_and_frees_its_place() {
        let gauge = AtomicU32::new(0);
        let i = Injection {
            delay: Duration::from_secs(5),
            abort: None,
            max_active_faults: u32::MAX,
        };
        let start = Instant::now();
        let status = i
            .run_with(&gauge, Some(start + Duration::from_millis(300)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(Instant::now(), start + Duration::from_millis(300));
        assert_eq!(gauge.load(Ordering::Relaxed), 0);
        // A call dropped mid-delay gives its place back too.
        let mut pending = Box::pin(i.run_with(&gauge, None));
        assert!(futures_poll(&mut pending).await.is_none());
        assert_eq!(gauge.load(Ordering::Relaxed), 1);
        drop(pending);
        assert_eq!(gauge.load(Ordering::Relaxed), 0);
    }

    /// Polls a future once.
    async fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut *f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
