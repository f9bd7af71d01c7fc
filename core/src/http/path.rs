//! The cookie path gate: does a cookie configured with `Path=cookie_path`
//! apply to a request for `request_path`?
//!
//! RFC 6265 §5.1.4 path-match, extended as Envoy does it for `:path` values
//! that still carry a query or fragment: a `?` or `#` right after the cookie
//! path counts like a `/`.

/// Returns whether `cookie_path` path-matches `request_path`.
///
/// - empty or `/` matches every request;
/// - a path ending in `/` matches every request path it prefixes;
/// - otherwise the request path equals it, or starts with it and continues
///   with `/`, `?` or `#`.
pub fn path_matches(cookie_path: &str, request_path: &str) -> bool {
    if matches_every_path(cookie_path) {
        return true;
    }
    let Some(rest) = request_path.strip_prefix(cookie_path) else {
        return false;
    };
    rest.is_empty()
        || cookie_path.ends_with('/')
        || matches!(rest.as_bytes()[0], b'/' | b'?' | b'#')
}

/// Whether a cookie path matches every request path (empty or `/`).
pub fn matches_every_path(cookie_path: &str) -> bool {
    cookie_path.is_empty() || cookie_path == "/"
}

#[cfg(test)]
mod tests {
    use super::path_matches;

    #[test]
    fn query_and_fragment_count_as_boundaries() {
        assert!(path_matches("/api", "/api?x=1"));
        assert!(path_matches("/api", "/api#top"));
        assert!(!path_matches("/api", "/apiary"));
        assert!(path_matches("/api/", "/api/x"));
        assert!(!path_matches("/api/", "/api"));
    }
}
