//! Reading cookies from request `Cookie` headers (RFC 6265 §4.2, §5.4).
//!
//! Parsing is deliberately more forgiving than gRPC C-core's (which splits only
//! on `"; "` and so misses a cookie in a header it joined with others):
//! - every `Cookie` header of the request is read, in order;
//! - pairs are separated by `;` with or without spaces, and also by `,`, the
//!   separator proxies use when they fold several `Cookie` headers into one
//!   (RFC 6265 cookie values cannot contain a `,`);
//! - spaces and tabs around names and values are dropped; a pair without `=`
//!   is skipped;
//! - names are case-sensitive and the first pair with the name wins;
//! - values are returned as sent: surrounding double quotes are removed by the
//!   session cookie decoder, not here.

use crate::address::trim_blanks;

/// The `name=value` pairs of one `Cookie` header value, in order.
pub fn pairs(header: &str) -> impl Iterator<Item = (&str, &str)> {
    // Split at the bytes of the ASCII separators rather than by chars: the
    // pieces are the same, and char iteration costs several times more in
    // the wasm plugin, which reads the cookie header of every request.
    let mut rest = Some(header);
    core::iter::from_fn(move || {
        while let Some(text) = rest {
            let piece = match text.bytes().position(|b| b == b';' || b == b',') {
                Some(at) => {
                    // An ASCII byte always sits on a char boundary.
                    let (piece, tail) = text.split_at_checked(at)?;
                    rest = tail.get(1..);
                    piece
                }
                None => {
                    rest = None;
                    text
                }
            };
            if let Some(pair) = pair(piece) {
                return Some(pair);
            }
        }
        None
    })
}

/// One `name=value` piece, blanks trimmed; `None` without `=` or a name.
fn pair(piece: &str) -> Option<(&str, &str)> {
    let (name, value) = piece.split_once('=')?;
    let name = trim_blanks(name);
    if name.is_empty() {
        return None;
    }
    Some((name, trim_blanks(value)))
}

/// The value of the first cookie called `name` across `headers` (each a
/// `Cookie` header value, in the order they arrived).
pub fn find<'a, I>(headers: I, name: &str) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    headers
        .into_iter()
        .find_map(|h| pairs(h).find(|(n, _)| *n == name).map(|(_, v)| v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn pairs_handle_spacing_and_junk() {
        let p: Vec<_> = pairs(" a=1;b = 2 ;; junk ; c=\"x\" ,d=;=e").collect();
        assert_eq!(p, [("a", "1"), ("b", "2"), ("c", "\"x\""), ("d", "")]);
    }

    #[test]
    fn pairs_equal_a_char_wise_split() {
        // The plain definition the byte-wise reader must match.
        fn reference(header: &str) -> Vec<(&str, &str)> {
            header
                .split([';', ','])
                .filter_map(|pair| {
                    let (name, value) = pair.split_once('=')?;
                    let name = name.trim_matches([' ', '\t']);
                    (!name.is_empty()).then(|| (name, value.trim_matches([' ', '\t'])))
                })
                .collect()
        }
        let alphabet: Vec<char> = "as=;, \t\"é€\u{1F600}".chars().collect();
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15_u64);
        for _ in 0..20_000 {
            let len = (next() % 20) as usize;
            let header: alloc::string::String = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            assert_eq!(
                pairs(&header).collect::<Vec<_>>(),
                reference(&header),
                "{header:?}"
            );
        }
    }

    #[test]
    fn first_match_wins_across_headers() {
        let h = ["x=1", "s=first; s=second", "s=third"];
        assert_eq!(find(h, "s"), Some("first"));
        assert_eq!(find(h, "S"), None);
        assert_eq!(find(["a=b,s=v"], "s"), Some("v"));
        assert_eq!(find([] as [&str; 0], "s"), None);
    }
}
