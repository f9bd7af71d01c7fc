//! Durations as protobuf JSON writes them (`"120s"`, `"1.5s"`), with the range
//! checks Envoy and gRPC apply to `google.protobuf.Duration`.

use core::fmt;
use core::time::Duration;

/// Largest number of seconds a `google.protobuf.Duration` may hold (10,000 years).
pub const MAX_SECONDS: u64 = 315_576_000_000;

/// Why a duration string was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationError {
    /// Not of the form `<seconds>[.<fraction>]s`.
    Syntax,
    /// Below zero.
    Negative,
    /// Above [`MAX_SECONDS`].
    TooLarge,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DurationError::Syntax => "is not a duration (expected e.g. \"120s\" or \"1.5s\")",
            DurationError::Negative => "is negative",
            DurationError::TooLarge => "is above 315576000000s",
        })
    }
}

/// Parses `"<seconds>[.<up to 9 digits>]s"`, the JSON form of
/// `google.protobuf.Duration`, into a non-negative duration.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let body = text.strip_suffix('s').ok_or(DurationError::Syntax)?;
    let (negative, body) = match body.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let (whole, frac) = match body.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (body, None),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(DurationError::Syntax);
    }
    let mut nanos = 0u32;
    if let Some(frac) = frac {
        if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(DurationError::Syntax);
        }
        for i in 0..9 {
            let digit = frac.as_bytes().get(i).map_or(0, |b| u32::from(b - b'0'));
            nanos = nanos * 10 + digit;
        }
    }
    // More than 12 digits cannot be in range; checking first avoids overflow.
    let secs = if whole.len() > 12 {
        return Err(if negative {
            DurationError::Negative
        } else {
            DurationError::TooLarge
        });
    } else {
        whole.parse::<u64>().map_err(|_| DurationError::Syntax)?
    };
    if negative && (secs > 0 || nanos > 0) {
        return Err(DurationError::Negative);
    }
    if secs > MAX_SECONDS || (secs == MAX_SECONDS && nanos > 0) {
        return Err(DurationError::TooLarge);
    }
    Ok(Duration::new(secs, nanos))
}

/// Writes a duration the way protobuf JSON does: `"120s"`, `"1.500s"`.
pub fn display(d: Duration) -> impl fmt::Display {
    struct D(Duration);
    impl fmt::Display for D {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let nanos = self.0.subsec_nanos();
            if nanos == 0 {
                write!(f, "{}s", self.0.as_secs())
            } else if nanos.is_multiple_of(1_000_000) {
                write!(f, "{}.{:03}s", self.0.as_secs(), nanos / 1_000_000)
            } else if nanos.is_multiple_of(1_000) {
                write!(f, "{}.{:06}s", self.0.as_secs(), nanos / 1_000)
            } else {
                write!(f, "{}.{:09}s", self.0.as_secs(), nanos)
            }
        }
    }
    D(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn parses_protobuf_json_durations() {
        assert_eq!(parse("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("-0s"), Ok(Duration::ZERO));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0.000000001s"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse("315576000000s"), Ok(Duration::from_secs(MAX_SECONDS)));
    }

    #[test]
    fn rejects_out_of_range_and_syntax() {
        assert_eq!(parse("-5s"), Err(DurationError::Negative));
        assert_eq!(parse("-0.1s"), Err(DurationError::Negative));
        assert_eq!(parse("315576000001s"), Err(DurationError::TooLarge));
        assert_eq!(parse("315576000000.5s"), Err(DurationError::TooLarge));
        assert_eq!(parse("99999999999999999999s"), Err(DurationError::TooLarge));
        for bad in [
            "",
            "s",
            "120",
            "1.s",
            ".5s",
            "1.0000000001s",
            "1e3s",
            " 1s",
            "+1s",
            "1,5s",
        ] {
            assert_eq!(parse(bad), Err(DurationError::Syntax), "{bad:?}");
        }
    }

    #[test]
    fn displays_round_trip() {
        for s in ["120s", "1.500s", "0.000001s", "0.000000001s", "0s"] {
            assert_eq!(display(parse(s).unwrap()).to_string(), s);
        }
    }
}
