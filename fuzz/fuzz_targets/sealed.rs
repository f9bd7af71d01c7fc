//! Any bytes as a sealed value: opening never panics; what opens re-seals
//! to a value that opens the same; and a genuine sealed value changed in
//! any byte after its format byte never opens.
#![no_main]

use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use tether_core::address::AddressList;
use tether_core::cookie::sealed::{seal, FORMAT_BYTE, NONCE_LEN};
use tether_core::cookie::{decode, Format, Key, KeyRing, SessionCookie};

fuzz_target!(|data: &[u8]| {
    let keys = KeyRing::new(vec![
        Key::from_secret(b"fuzzing-sealing-key-0123456789ab").unwrap(),
        Key::from_secret(b"fuzzing-sealing-old-0123456789ab").unwrap(),
    ]);
    let b64 = base64::engine::general_purpose::STANDARD;
    // The bytes as a value, and as a payload behind the format byte.
    let mut payload = vec![FORMAT_BYTE];
    payload.extend_from_slice(data);
    for value in [String::from_utf8_lossy(data).into_owned(), b64.encode(&payload)] {
        if let Ok(d) = decode(&value, &keys) {
            if d.format == Format::Sealed {
                let nonce: [u8; NONCE_LEN] = std::array::from_fn(|i| data.get(i).copied().unwrap_or(0));
                let again = seal(&d.cookie, keys.signer().unwrap(), &nonce).expect("what opened re-seals");
                assert_eq!(decode(&again, &keys).expect("a re-sealed value opens").cookie, d.cookie);
            }
        }
    }
    // The bytes as a mask over a genuine value: any change is no session.
    let cookie = SessionCookie {
        addresses: AddressList::parse("10.0.0.1:8080,[2001:db8::1]:8080").unwrap(),
        cluster: Some("backends/session".into()),
        expires: Some(1_800_000_120),
    };
    let value = seal(&cookie, keys.signer().unwrap(), &[7; NONCE_LEN]).unwrap();
    let mut bytes = b64.decode(&value).unwrap();
    let mut changed = false;
    for (b, m) in bytes.iter_mut().skip(1).zip(data) {
        *b ^= m;
        changed |= *m != 0;
    }
    let got = decode(&b64.encode(&bytes), &keys);
    if changed {
        assert!(!matches!(got, Ok(ref d) if d.format == Format::Sealed), "a changed value opened: {got:?}");
    } else {
        assert_eq!(got.unwrap().cookie, cookie);
    }
});
