//! Any bytes as a cookie value, and as a base64 payload: decoding never
//! panics, and whatever decodes re-encodes to something that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether_core::cookie::{decode, encode, Key, KeyRing};

fuzz_target!(|data: &[u8]| {
    let keys = KeyRing::new(vec![Key::from_secret(b"fuzzing-key-0123456").unwrap()]);
    let text = String::from_utf8_lossy(data);
    if let Ok(d) = decode(&text, &keys) {
        // A sealed value re-seals with the ring's key; the others need none.
        let key = if d.format.is_sealed() { keys.signer() } else { None };
        let again = encode(&d.cookie, d.format, key).expect("a decoded cookie re-encodes in its format");
        let back = decode(&again, &keys).expect("a re-encoded cookie decodes");
        assert_eq!(back.cookie, d.cookie);
    }
    use base64::Engine as _;
    let _ = base64::engine::general_purpose::STANDARD.encode(data);
});
