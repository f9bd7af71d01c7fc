//! Property tests: every format round-trips what it can carry, signatures
//! verify and detect tampering, and no input makes a reader panic.

use base64::Engine as _;
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use tether_core::cookie::{self, Format, Key, KeyRing, SessionCookie, Signature};
use tether_core::http::{cookie_header, path};
use tether_core::{AddressList, SessionConfig};

fn address() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<u32>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::from((Ipv4Addr::from(ip), port))),
        (any::<u128>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::from((Ipv6Addr::from(ip), port))),
    ]
}

fn cluster() -> impl Strategy<Value = String> {
    // Any text without control characters, including `;`, `,` and non-ASCII.
    "[^\\p{Cc}]{1,40}"
}

fn session_cookie(format: Format) -> impl Strategy<Value = SessionCookie> {
    let max_addrs = if format.carries_address_list() { 4 } else { 1 };
    (
        prop::collection::vec(address(), 1..=max_addrs),
        prop::option::of(cluster()),
        prop::option::of(1..u64::MAX),
    )
        .prop_map(move |(addrs, cluster, expires)| SessionCookie {
            addresses: AddressList::new(addrs).unwrap(),
            cluster: cluster.filter(|_| format.carries_cluster()),
            expires: expires.filter(|_| format.carries_expiry()),
        })
}

fn ring() -> KeyRing {
    KeyRing::new(vec![
        Key::from_secret(b"property-test-key-1").unwrap(),
        Key::from_secret(b"property-test-key-2").unwrap(),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn envoy_round_trips(c in session_cookie(Format::Envoy)) {
        let v = cookie::encode(&c, Format::Envoy, None).unwrap();
        let d = cookie::decode(&v, &KeyRing::empty()).unwrap();
        prop_assert_eq!(d.cookie, c);
        prop_assert_eq!(d.format, Format::Envoy);
        // Quoted as Envoy sends it, and unpadded, it still decodes the same.
        let quoted = cookie::decode(&format!("\"{v}\""), &KeyRing::empty()).unwrap();
        prop_assert!(quoted.quoted);
        let unpadded = cookie::decode(v.trim_end_matches('='), &KeyRing::empty()).unwrap();
        prop_assert_eq!(unpadded.cookie, quoted.cookie);
    }

    #[test]
    fn grpc_round_trips(c in session_cookie(Format::Grpc)) {
        let v = cookie::encode(&c, Format::Grpc, None).unwrap();
        let d = cookie::decode(&v, &KeyRing::empty()).unwrap();
        prop_assert_eq!(d.cookie, c);
        prop_assert_eq!(d.format, Format::Grpc);
    }

    #[test]
    fn legacy_round_trips(c in session_cookie(Format::Legacy)) {
        let v = cookie::encode(&c, Format::Legacy, None).unwrap();
        let d = cookie::decode(&v, &KeyRing::empty()).unwrap();
        prop_assert_eq!(d.cookie, c);
        prop_assert_eq!(d.format, Format::Legacy);
    }

    #[test]
    fn signed_round_trips_and_any_change_breaks_the_mac(
        c in session_cookie(Format::Envoy),
        pos in any::<prop::sample::Index>(),
        with in 0usize..64,
    ) {
        let keys = ring();
        let v = cookie::encode(&c, Format::Envoy, keys.signer()).unwrap();
        let d = cookie::decode(&v, &keys).unwrap();
        prop_assert_eq!(&d.cookie, &c);
        prop_assert_eq!(d.signature, Signature::Valid { key: 0 });
        // A different key ring sees a bad MAC.
        let other = KeyRing::new(vec![Key::from_secret(b"some-other-key-0000").unwrap()]);
        prop_assert_eq!(cookie::decode(&v, &other).unwrap().signature, Signature::Invalid);
        // Change one base64 character of the payload (not padding).
        let body = v.trim_end_matches('=');
        let i = pos.index(body.len());
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut bytes = body.as_bytes().to_vec();
        let replacement = alphabet[with];
        prop_assume!(bytes[i] != replacement);
        bytes[i] = replacement;
        let tampered = String::from_utf8(bytes).unwrap();
        // Whatever it decodes to, a valid MAC must mean the session is unchanged.
        if let Ok(t) = cookie::decode(&tampered, &keys) {
            if matches!(t.signature, Signature::Valid { .. }) {
                prop_assert_eq!(t.cookie, c);
            }
        }
    }

    #[test]
    fn decode_never_panics_on_text(s in any::<String>()) {
        let _ = cookie::decode(&s, &ring());
    }

    #[test]
    fn decode_never_panics_on_payload_bytes(b in prop::collection::vec(any::<u8>(), 0..96)) {
        let v = base64::engine::general_purpose::STANDARD.encode(&b);
        let _ = cookie::decode(&v, &ring());
    }

    #[test]
    fn header_and_path_readers_never_panic(h in any::<String>(), n in any::<String>(), p in any::<String>()) {
        let _ = cookie_header::find([h.as_str(), p.as_str()], &n);
        let _ = path::path_matches(&h, &p);
    }

    #[test]
    fn config_parser_never_panics(s in any::<String>()) {
        let _ = SessionConfig::from_json(&s, &[]);
        let _ = SessionConfig::from_json(&format!("{{\"cookie\":{{\"name\":{s:?},\"ttl\":{s:?}}}}}"), &[]);
    }
}
