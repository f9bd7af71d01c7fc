//! Any SAN matcher against any SANs: matching never panics, a regex is
//! compiled as RE2 would (alone first), and the simple matchers mean what
//! they say.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether::xds::resource::route::{full_match, Pattern};
use tether::xds::resource::san;
use tether::xds::resource::security::{SanMatch, SanMatcher};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the matcher type and ignore_case; the first line
    // after it is the matcher's text, each further line a SAN.
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let (pattern, sans) = text.split_once('\n').unwrap_or((text, ""));
    let sans: Vec<String> = sans.split('\n').map(str::to_owned).collect();
    let ignore_case = selector & 0x80 != 0;
    let matcher = match selector % 5 {
        0 => SanMatch::Exact(pattern.to_owned()),
        1 => SanMatch::Prefix(pattern.to_owned()),
        2 => SanMatch::Suffix(pattern.to_owned()),
        3 => SanMatch::Contains(pattern.to_owned()),
        _ => match full_match(pattern) {
            Ok(regex) => SanMatch::Regex(Pattern {
                source: pattern.to_owned(),
                regex,
            }),
            Err(_) => return,
        },
    };
    let m = SanMatcher {
        matcher,
        ignore_case,
    };
    let any = san::verify(&sans, std::slice::from_ref(&m));
    assert_eq!(any, sans.iter().any(|s| san::matches(s, &m)));
    match &m.matcher {
        SanMatch::Prefix(p) if !ignore_case => {
            for s in &sans {
                assert_eq!(san::matches(s, &m), s.starts_with(p.as_str()), "{s:?}");
            }
        }
        SanMatch::Contains(p) if !ignore_case => {
            for s in &sans {
                assert_eq!(san::matches(s, &m), s.contains(p.as_str()), "{s:?}");
            }
        }
        // A name with no wildcard equals itself, in any case.
        SanMatch::Exact(p) if !p.is_empty() && !p.starts_with('.') && !p.contains('*') => {
            assert!(san::matches(p, &m), "{p:?}");
            assert!(san::matches(&p.to_ascii_uppercase(), &m), "{p:?}");
        }
        // Anchored: any match covers the whole SAN.
        SanMatch::Regex(p) => {
            for s in &sans {
                if p.regex.is_match(s) {
                    assert!(p.regex.find(s).is_some_and(|f| f.start() == 0 && f.end() == s.len()));
                }
            }
        }
        _ => {}
    }
});
