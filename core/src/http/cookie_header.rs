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

/// The `name=value` pairs of one `Cookie` header value, in order.
pub fn pairs(header: &str) -> impl Iterator<Item = (&str, &str)> {
    header.split([';', ',']).filter_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        let name = name.trim_matches([' ', '\t']);
        if name.is_empty() {
            return None;
        }
        Some((name, value.trim_matches([' ', '\t'])))
    })
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
    fn first_match_wins_across_headers() {
        let h = ["x=1", "s=first; s=second", "s=third"];
        assert_eq!(find(h, "s"), Some("first"));
        assert_eq!(find(h, "S"), None);
        assert_eq!(find(["a=b,s=v"], "s"), Some("v"));
        assert_eq!(find([] as [&str; 0], "s"), None);
    }
}
