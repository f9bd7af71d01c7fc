//! A certificate's subject alternative names against a cluster's
//! `match_subject_alt_names` (gRFC A29), as gRPC C-core matches them: any
//! SAN matching any matcher accepts; no matchers accept every certificate
//! that chains. An `exact` matcher compares DNS-style (case-insensitive,
//! trailing dot ignored, a `*` left-most label in the SAN matching one
//! label) whatever the SAN's type, as C-core does, where grpc-go applies
//! those rules to DNS SANs only. The SANs come as text: DNS names, URIs and
//! IP addresses in canonical form (the channel reads them from the
//! certificate).

use super::security::{SanMatch, SanMatcher};

/// Whether `sans` satisfy `matchers`.
pub fn verify(sans: &[String], matchers: &[SanMatcher]) -> bool {
    matchers.is_empty()
        || sans
            .iter()
            .any(|san| matchers.iter().any(|m| matches(san, m)))
}

/// Whether one SAN satisfies one matcher.
pub fn matches(san: &str, m: &SanMatcher) -> bool {
    let fold = |s: &str| {
        if m.ignore_case {
            s.to_ascii_lowercase()
        } else {
            s.to_owned()
        }
    };
    match &m.matcher {
        SanMatch::Exact(pattern) => dns_match(san, pattern),
        SanMatch::Prefix(p) => fold(san).starts_with(&fold(p)),
        SanMatch::Suffix(p) => fold(san).ends_with(&fold(p)),
        SanMatch::Contains(p) => fold(san).contains(&fold(p)),
        SanMatch::Regex(r) => r.regex.is_match(san),
    }
}

/// DNS-style equality of a SAN (which may hold a wildcard) and a name.
fn dns_match(san: &str, name: &str) -> bool {
    if san.is_empty() || san.starts_with('.') || name.is_empty() || name.starts_with('.') {
        return false;
    }
    let absolute = |s: &str| {
        let mut s = s.to_ascii_lowercase();
        if !s.ends_with('.') {
            s.push('.');
        }
        s
    };
    let (san, name) = (absolute(san), absolute(name));
    if !san.contains('*') {
        return san == name;
    }
    // A wildcard only as the whole left-most label, not for a single
    // label, and matching exactly one label.
    let Some(suffix) = san.strip_prefix('*') else {
        return false;
    };
    if !suffix.starts_with('.') || suffix == "." || suffix.contains('*') {
        return false;
    }
    match name.strip_suffix(suffix) {
        Some(label) => !label.is_empty() && !label.contains('.'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(matcher: SanMatch, ignore_case: bool) -> SanMatcher {
        SanMatcher {
            matcher,
            ignore_case,
        }
    }

    #[test]
    fn exact_matching_follows_dns_rules_for_every_san() {
        for (san, name, expected) in [
            ("foo.example.com", "foo.example.com", true),
            ("foo.example.com", "FOO.Example.com.", true),
            ("*.example.com", "foo.example.com", true),
            ("*.example.com", "a.b.example.com", false),
            ("*.example.com", "example.com", false),
            ("*.", "foo", false),
            ("f*.example.com", "foo.example.com", false),
            ("a.*.example.com", "a.b.example.com", false),
            (".example.com", ".example.com", false),
            ("", "", false),
            // URI and IP SANs compared the same way, as C-core does.
            ("spiffe://td/ns/a/sa/b", "spiffe://td/ns/a/sa/b", true),
            ("spiffe://td/ns/a/sa/b", "SPIFFE://TD/ns/a/sa/b", true),
            ("2001:db8::1", "2001:db8::1", true),
        ] {
            assert_eq!(dns_match(san, name), expected, "{san} vs {name}");
        }
    }

    #[test]
    fn other_matchers_and_ignore_case() {
        let san = vec!["spiffe://Tether.test/ns/default/sa/backend".to_owned()];
        let prefix = |p: &str, ic| m(SanMatch::Prefix(p.into()), ic);
        assert!(verify(&san, &[prefix("spiffe://Tether.test/", false)]));
        assert!(!verify(&san, &[prefix("spiffe://tether.test/", false)]));
        assert!(verify(&san, &[prefix("SPIFFE://tether.test/", true)]));
        assert!(verify(
            &san,
            &[m(SanMatch::Suffix("/sa/backend".into()), false)]
        ));
        assert!(verify(
            &san,
            &[m(SanMatch::Contains("ns/default".into()), false)]
        ));
        assert!(!verify(
            &san,
            &[m(SanMatch::Contains("ns/other".into()), false)]
        ));
        // No matchers: anything that chains.
        assert!(verify(&san, &[]));
        assert!(verify(&[], &[]));
        // Some matcher must match some SAN.
        assert!(!verify(&[], &[prefix("spiffe://", false)]));
        let two = vec!["a.example".to_owned(), "10.0.0.1".to_owned()];
        assert!(verify(
            &two,
            &[m(SanMatch::Exact("10.0.0.1".into()), false)]
        ));
    }
}
