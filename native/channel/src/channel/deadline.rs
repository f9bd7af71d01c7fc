//! The call's deadline: `grpc-timeout` as gRPC writes it on the wire, and
//! the waits it bounds (an injected fault's delay, a retry's backoff).

use std::time::Duration;

use http::HeaderValue;
use tokio::time::Instant;
use tonic::Status;

/// The header name made once (a lookup by `&str` parses it every time).
pub(super) static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// Waits `delay` (a retry's backoff, an injected fault), failing the call
/// with DEADLINE_EXCEEDED ("deadline exceeded {what}") if its deadline
/// comes first.
pub(crate) async fn sleep_within(
    delay: Duration,
    deadline: Option<Instant>,
    what: &str,
) -> Result<(), Status> {
    let until = Instant::now() + delay;
    match deadline {
        Some(d) if d <= until => {
            tokio::time::sleep_until(d).await;
            Err(Status::deadline_exceeded(format!(
                "deadline exceeded {what}"
            )))
        }
        _ => {
            tokio::time::sleep_until(until).await;
            Ok(())
        }
    }
}

/// `grpc-timeout` as gRPC encodes it: at most 8 digits and a unit.
pub(super) fn encode_timeout(t: Duration) -> HeaderValue {
    let micros = t.as_micros();
    let text = if micros < 100_000_000 {
        format!("{micros}u")
    } else if t.as_millis() < 100_000_000 {
        format!("{}m", t.as_millis())
    } else {
        format!("{}S", t.as_secs().min(99_999_999))
    };
    HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("99999999S"))
}

/// The call's `grpc-timeout`, if it has a valid one.
pub(crate) fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    parse_grpc_timeout(headers.get(&GRPC_TIMEOUT)?.to_str().ok()?)
}

/// A `grpc-timeout` value as gRPC writes it (at most 8 digits and a unit:
/// `H`, `M`, `S`, `m`, `u`, `n`), e.g. what a server was given.
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_round_trip() {
        for (text, d) in [
            ("5S", Duration::from_secs(5)),
            ("250m", Duration::from_millis(250)),
            ("7u", Duration::from_micros(7)),
            ("2H", Duration::from_secs(7200)),
            ("3M", Duration::from_secs(180)),
            ("9n", Duration::from_nanos(9)),
        ] {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", HeaderValue::from_static(text));
            assert_eq!(grpc_timeout(&h), Some(d), "{text}");
        }
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", encode_timeout(Duration::from_millis(1500)));
        assert_eq!(grpc_timeout(&h), Some(Duration::from_millis(1500)));
        for bad in ["", "S", "123456789S", "5x", "-1S"] {
            h.insert("grpc-timeout", HeaderValue::from_str(bad).unwrap());
            assert_eq!(grpc_timeout(&h), None, "{bad:?}");
        }
    }
}
