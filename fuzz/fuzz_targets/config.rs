//! Any bytes as a session configuration: parsing never panics, and an accepted
//! configuration renders only header-safe Set-Cookie values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_core::config::SessionMode;
use tether_core::http::set_cookie::Style;
use tether_core::SessionConfig;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok((config, _)) = SessionConfig::from_json(&text, &["override_header"]) {
        if let SessionMode::Cookie(spec) = &config.mode {
            for style in [Style::Envoy, Style::Grpc] {
                let h = spec.render("Cg8xMjcuMC4wLjE6MTkwMDE=", style).unwrap();
                assert!(!h.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0));
            }
        }
    }
});
