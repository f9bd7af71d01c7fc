//! The model's error: a parse error, or a field that is wrong together
//! with others, with where it is in the file.

use std::fmt;

/// A problem with the configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelError {
    /// Not valid YAML, or a field of the wrong type, unknown or with a bad
    /// value; the message names the field path, line and column.
    Parse(String),
    /// A field that is wrong together with others.
    Invalid {
        /// Path of the field, e.g. `virtualhosts[0].routes[1].services[0].name`.
        field: String,
        /// The value as written.
        value: String,
        /// What is wrong.
        problem: String,
        /// Where the field is in the file, when the error came from
        /// [`Config::parse`](super::Config::parse) and the field could be
        /// found in the text.
        location: Option<Location>,
    },
}

/// A position in the file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Line.
    pub line: usize,
    /// Column.
    pub column: usize,
}

impl ModelError {
    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl fmt::Debug,
        problem: impl Into<String>,
    ) -> Self {
        ModelError::Invalid {
            field: field.into(),
            value: format!("{value:?}"),
            problem: problem.into(),
            location: None,
        }
    }

    /// Where in the file the error is, if known.
    pub fn location(&self) -> Option<Location> {
        match self {
            ModelError::Parse(_) => None,
            ModelError::Invalid { location, .. } => *location,
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::Parse(m) => f.write_str(m),
            ModelError::Invalid {
                field,
                value,
                problem,
                location,
            } => {
                write!(f, "{field}: {value} {problem}")?;
                // The same suffix the parser puts on syntax and type errors.
                if let Some(l) = location {
                    write!(f, " at line {} column {}", l.line, l.column)?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ModelError {}
