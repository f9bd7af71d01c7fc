//! Configuration errors: what is wrong ([`Problem`]) with which field and
//! value ([`ConfigError`]). Every reader of configuration (the session
//! config, cookie attributes, signing keys, hash policies) reports with them.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::String;
use core::fmt;

use crate::duration::DurationError;

/// What is wrong with a configuration value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A required field is absent or empty.
    Missing,
    /// Not an RFC 9110 token.
    NotToken,
    /// Holds a control character or `;`.
    NotAttributeValue,
    /// Holds characters a cookie value may not.
    NotCookieValue,
    /// An attribute tether renders itself.
    Reserved,
    /// Not one of the listed values.
    OneOf(&'static str),
    /// A bad duration.
    Duration(DurationError),
    /// Not base64.
    NotBase64,
    /// A secret shorter than 16 bytes (its length).
    KeyTooShort(usize),
    /// Of the wrong JSON type (the expected one).
    WrongType(&'static str),
    /// A field the configuration does not have.
    Unknown,
    /// Cannot be set together with the named field.
    Conflict(&'static str),
    /// The write format cannot carry a MAC.
    CannotSign,
    /// Format `sealed` without keys.
    NeedsKeys,
    /// A secret too short to seal with (its length in bytes).
    SealingKeyTooShort(usize),
    /// A key file or list without a key.
    NoKeys,
    /// The text is not JSON (parser message).
    Json(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => f.write_str("field not present"),
            Problem::NotToken => {
                f.write_str("is not a valid name (RFC 9110 token characters only)")
            }
            Problem::NotAttributeValue => f.write_str("contains a control character or ';'"),
            Problem::NotCookieValue => f.write_str("contains characters a cookie value may not"),
            Problem::Reserved => {
                f.write_str("is rendered by tether itself (set ttl or path instead)")
            }
            Problem::OneOf(list) => write!(f, "is not one of {list}"),
            Problem::Duration(e) => e.fmt(f),
            Problem::NotBase64 => f.write_str("is not base64"),
            Problem::KeyTooShort(n) => write!(f, "decodes to {n} bytes; a key needs at least 16"),
            Problem::WrongType(t) => write!(f, "is not {t}"),
            Problem::Unknown => f.write_str("is not a known field"),
            Problem::Conflict(other) => write!(f, "cannot be combined with {other}"),
            Problem::CannotSign => {
                f.write_str("cannot carry a MAC; signing keys need format \"envoy\"")
            }
            Problem::NeedsKeys => f.write_str(
                "needs keys (base64 secrets of at least 32 bytes; the first seals, all open)",
            ),
            Problem::SealingKeyTooShort(n) => {
                write!(f, "decodes to {n} bytes; a sealing key needs at least 32")
            }
            Problem::NoKeys => f.write_str("holds no key"),
            Problem::Json(msg) => write!(f, "is not valid JSON: {msg}"),
        }
    }
}

/// A configuration error naming the field, the value and the problem, e.g.
/// `cookie.ttl: "-5s" is negative`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Path of the field, e.g. `cookie.attributes[1].name`.
    pub field: String,
    /// The offending value as written (empty when the field is absent).
    pub value: String,
    /// What is wrong with it.
    pub problem: Problem,
}

impl ConfigError {
    /// An error for `field` holding `value`.
    pub fn new(field: &str, value: &str, problem: Problem) -> Self {
        ConfigError {
            field: field.to_owned(),
            value: value.to_owned(),
            problem,
        }
    }

    /// The same error seen from an enclosing object: `name` becomes
    /// `cookie.name`, `[2]` becomes `attributes[2]`.
    pub fn within(mut self, parent: &str) -> Self {
        self.field = if self.field.is_empty() {
            parent.to_owned()
        } else if self.field.starts_with('[') {
            format!("{parent}{}", self.field)
        } else {
            format!("{parent}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = if self.field.is_empty() {
            "configuration"
        } else {
            &self.field
        };
        match self.problem {
            Problem::Missing
            | Problem::Unknown
            | Problem::Conflict(_)
            | Problem::Json(_)
            | Problem::NoKeys
                if self.value.is_empty() =>
            {
                write!(f, "{field}: {}", self.problem)
            }
            // The value is JSON text already.
            Problem::WrongType(_) => write!(f, "{field}: {} {}", self.value, self.problem),
            _ => write!(f, "{field}: {:?} {}", self.value, self.problem),
        }
    }
}
