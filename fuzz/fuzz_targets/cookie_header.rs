//! Any bytes as `Cookie` headers and a request path: the session lookup (header
//! parsing, path gate, decoding) never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use tether_core::http::set_cookie::CookieSpec;
use tether_core::session::{Session, SessionRequest};
use tether_core::SessionConfig;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let path = parts.next().unwrap_or("");
    let h1 = parts.next().unwrap_or("");
    let h2 = parts.next().unwrap_or("");
    let spec = CookieSpec::new("s", "/a", Duration::from_secs(5), vec![]).unwrap();
    let session = Session::new(SessionConfig::cookie(spec)).unwrap();
    let lookup = session.lookup(&SessionRequest { path, cookies: &[h1, h2], header: Some(h2) }, 1_800_000_000);
    let _ = lookup.override_header_value();
    for (name, value) in tether_core::http::cookie_header::pairs(h1) {
        assert!(!name.is_empty());
        assert!(!value.contains(';'));
    }
});
