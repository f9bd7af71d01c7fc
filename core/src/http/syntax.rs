//! Character classes from RFC 6265 and RFC 9110, used to validate everything
//! tether writes into a header, so no configured name or value can inject a
//! `;`, a quote, a line break or another header.

/// RFC 9110 `tchar`: the characters of a token (header names, cookie names,
/// attribute names).
pub fn is_tchar(b: u8) -> bool {
    matches!(b,
        b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' |
        b'^' | b'_' | b'`' | b'|' | b'~' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
}

/// A non-empty token.
pub fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// RFC 6265 `cookie-octet`: what an unquoted cookie value may hold (no space,
/// `"`, `,`, `;` or `\`).
pub fn is_cookie_octet(b: u8) -> bool {
    matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E)
}

/// A cookie value: cookie-octets only (quotes are added by the renderer).
pub fn is_cookie_value(s: &str) -> bool {
    s.bytes().all(is_cookie_octet)
}

/// RFC 6265 `av-octet` as tether accepts it for attribute values and paths:
/// visible ASCII and space, but no `;` (which would start another attribute).
pub fn is_attribute_value(s: &str) -> bool {
    s.bytes().all(|b| (0x20..=0x7E).contains(&b) && b != b';')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert!(is_token("global-session-cookie"));
        assert!(is_token("SameSite"));
        for bad in ["", "a b", "a;b", "a=b", "a\r\nb", "a\"", "a,b", "ä"] {
            assert!(!is_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn cookie_values() {
        assert!(is_cookie_value("Cg8xMjcuMC4wLjE6MTkwMDE="));
        assert!(is_cookie_value(""));
        for bad in ["a b", "a;b", "a\"b", "a,b", "a\\b", "a\nb"] {
            assert!(!is_cookie_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn attribute_values() {
        assert!(is_attribute_value("/a b/c"));
        assert!(is_attribute_value("example.com"));
        for bad in ["a;b", "a\r\nSet-Cookie: x=y", "a\tb", "\u{7f}"] {
            assert!(!is_attribute_value(bad), "{bad:?}");
        }
    }
}
