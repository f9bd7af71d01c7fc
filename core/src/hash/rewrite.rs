//! The header hash policy's `regex_rewrite` (feature `regex`).
//!
//! Envoy runs RE2's `GlobalReplace`: every non-overlapping leftmost-first
//! match is replaced by the substitution, in which `\0`..`\9` insert a
//! capture group and `\\` a backslash. An empty match right where the
//! previous match ended is not replaced; the scan steps over one character.
//!
//! The engine is `regex-automata`'s meta regex, which builds `no_std` with
//! `alloc`. It is behind the `regex` feature (off by default) because it adds
//! build time and a few hundred KB to a wasm plugin that does not use
//! rewrites. Patterns are compiled byte-oriented without Unicode tables:
//! `\d`, `\w`, `\s` and `(?i)` are ASCII, as RE2's Perl classes are; on
//! non-ASCII values `.` and negated classes match one byte where RE2
//! matches one UTF-8 character. HTTP header values are ASCII in practice.
//!
//! Stricter than Envoy: a substitution naming a group the pattern lacks, or
//! holding `\` before anything but a digit or `\`, is rejected when the
//! policy is built (Envoy accepts it and RE2 then leaves values unchanged).

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
use regex_automata::{meta, util::syntax, Input};

/// A compiled rewrite: pattern plus substitution.
#[derive(Clone)]
pub struct Rewrite {
    regex: meta::Regex,
    pieces: Vec<Piece>,
    pattern: String,
    substitution: String,
}

#[derive(Debug, Clone)]
enum Piece {
    Literal(Vec<u8>),
    Group(usize),
}

/// Why a rewrite was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewriteError {
    field: &'static str,
    value: String,
    message: String,
}

impl RewriteError {
    /// `pattern.regex` or `substitution`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// The rejected text.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// What is wrong with it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for RewriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?} {}", self.field, self.value, self.message)
    }
}

impl Rewrite {
    /// Compiles `pattern` and checks `substitution` against its groups.
    pub fn new(pattern: &str, substitution: &str) -> Result<Self, RewriteError> {
        let regex = meta::Regex::builder()
            .syntax(syntax::Config::new().unicode(false).utf8(false))
            .configure(meta::Config::new().utf8_empty(false))
            .build(pattern)
            .map_err(|e| RewriteError {
                field: "pattern.regex",
                value: pattern.to_string(),
                message: alloc::format!("is not a valid regex: {e}"),
            })?;
        let groups = regex.captures_len().saturating_sub(1);
        let pieces = parse_substitution(substitution, groups)?;
        Ok(Rewrite {
            regex,
            pieces,
            pattern: pattern.to_string(),
            substitution: substitution.to_string(),
        })
    }

    /// The pattern as given.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// The substitution as given.
    pub fn substitution(&self) -> &str {
        &self.substitution
    }

    /// Replaces every match in `hay` (RE2 `GlobalReplace` semantics).
    pub fn apply(&self, hay: &[u8]) -> Vec<u8> {
        let mut caps = self.regex.create_captures();
        let mut out = Vec::with_capacity(hay.len() + 16);
        let mut p = 0usize;
        let mut last_end: Option<usize> = None;
        let mut replaced = false;
        while p <= hay.len() {
            self.regex
                .search_captures(&Input::new(hay).span(p..hay.len()), &mut caps);
            let Some(m) = caps.get_match() else { break };
            out.extend_from_slice(&hay[p..m.start()]);
            if m.is_empty() && Some(m.start()) == last_end {
                // No empty match where the last one ended: copy one
                // character and search again after it.
                let n = char_len(&hay[p..]);
                out.extend_from_slice(&hay[p..(p + n).min(hay.len())]);
                p += n.max(1);
                continue;
            }
            for piece in &self.pieces {
                match piece {
                    Piece::Literal(bytes) => out.extend_from_slice(bytes),
                    Piece::Group(g) => {
                        if let Some(span) = caps.get_group(*g) {
                            out.extend_from_slice(&hay[span.range()]);
                        }
                    }
                }
            }
            p = m.end();
            last_end = Some(p);
            replaced = true;
        }
        if !replaced {
            return hay.to_vec();
        }
        if p < hay.len() {
            out.extend_from_slice(&hay[p..]);
        }
        out
    }
}

impl fmt::Debug for Rewrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rewrite")
            .field("pattern", &self.pattern)
            .field("substitution", &self.substitution)
            .finish()
    }
}

/// Length of the UTF-8 character at the start of `b` (1 for an invalid
/// byte, 0 for an empty slice).
fn char_len(b: &[u8]) -> usize {
    let chunk = &b[..b.len().min(4)];
    let valid = match core::str::from_utf8(chunk) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&chunk[..e.valid_up_to()]).unwrap_or(""),
    };
    match valid.chars().next() {
        Some(c) => c.len_utf8(),
        None => usize::from(!b.is_empty()),
    }
}

fn parse_substitution(text: &str, groups: usize) -> Result<Vec<Piece>, RewriteError> {
    let err = |message: String| RewriteError {
        field: "substitution",
        value: text.to_string(),
        message,
    };
    let mut pieces = Vec::new();
    let mut literal = Vec::new();
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            literal.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'\\') => literal.push(b'\\'),
            Some(d @ b'0'..=b'9') => {
                let g = usize::from(d - b'0');
                if g > groups {
                    return Err(err(alloc::format!(
                        "refers to group {g} but the pattern has {groups}"
                    )));
                }
                if !literal.is_empty() {
                    pieces.push(Piece::Literal(core::mem::take(&mut literal)));
                }
                pieces.push(Piece::Group(g));
            }
            _ => {
                return Err(err(
                    "has a \\ that is not followed by a digit or \\".to_string()
                ))
            }
        }
    }
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(pattern: &str, sub: &str, hay: &str) -> String {
        let out = Rewrite::new(pattern, sub).unwrap().apply(hay.as_bytes());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn replaces_every_match_with_groups() {
        assert_eq!(rw("^/users/([0-9]+)/.*$", "\\1", "/users/42/cart"), "42");
        assert_eq!(rw("[0-9]+", "N", "a1b22c333"), "aNbNcN");
        assert_eq!(rw("(a)(b)?", "[\\2\\1\\\\]", "aab"), "[a\\][ba\\]");
        assert_eq!(rw("x", "y", "abc"), "abc");
        assert_eq!(rw("\\d+", "#", "v1.2"), "v#.#");
    }

    #[test]
    fn empty_matches_follow_re2() {
        // RE2: GlobalReplace("baaa", "a*", "-") == "-b-".
        assert_eq!(rw("a*", "-", "baaa"), "-b-");
        assert_eq!(rw("", "-", "ab"), "-a-b-");
        assert_eq!(rw("b*", "-", "abc"), "-a-c-");
        assert_eq!(rw("", "-", ""), "-");
        // A multi-byte character is stepped over whole.
        assert_eq!(rw("", "-", "é"), "-é-");
    }

    #[test]
    fn anchors_see_the_whole_value() {
        assert_eq!(rw("^a", "X", "aaa"), "Xaa");
        assert_eq!(rw("a$", "X", "aaa"), "aaX");
    }

    #[test]
    fn rejects_bad_pattern_and_substitution() {
        let e = Rewrite::new("(", "").unwrap_err();
        assert_eq!(e.field(), "pattern.regex");
        assert!(e
            .to_string()
            .starts_with("pattern.regex: \"(\" is not a valid regex"));
        let e = Rewrite::new("(a)", "\\2").unwrap_err();
        assert_eq!(
            e.to_string(),
            "substitution: \"\\\\2\" refers to group 2 but the pattern has 1"
        );
        let e = Rewrite::new("a", "\\n").unwrap_err();
        assert_eq!(e.field(), "substitution");
        assert!(Rewrite::new("a", "trailing\\").is_err());
    }
}
