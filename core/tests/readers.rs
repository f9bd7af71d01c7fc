//! `cookie::readers` held against independent models of each peer's parser,
//! over the whole space of IPv4 and IPv6 address and port texts: stock
//! Envoy's cookie reader (the `base64` crate's strict standard engine, then a
//! prost-generated `Cookie` with Envoy's two fields, then the bytes as text),
//! gRPC C-core's (base64 padded or not, the text before the first `;` split
//! on `,`) and tether's own decoder. And what tether writes: every format's
//! value is honoured by the readers the README names, for every address.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use base64::Engine as _;
use proptest::prelude::*;
use tether_core::cookie::readers::{self, honours, read, Miss, Reader, Reading};
use tether_core::cookie::{self, Format, KeyRing, SessionCookie};
use tether_core::AddressList;

/// Envoy's `Cookie` message (proto3), for the model.
#[derive(Clone, PartialEq, prost::Message)]
struct EnvoyCookie {
    #[prost(string, tag = "1")]
    address: String,
    #[prost(uint64, tag = "2")]
    expires: u64,
}

const NOW: u64 = 1_800_000_000;

/// The model of stock Envoy's cookie reader.
fn envoy_model(value: &str, now: u64) -> Reading {
    let v = value.trim_matches('"');
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(v) else {
        return Reading::NoSession(Miss::Base64);
    };
    if bytes.is_empty() {
        return Reading::NoSession(Miss::Base64);
    }
    match <EnvoyCookie as prost::Message>::decode(bytes.as_slice()) {
        Ok(c) if c.address.is_empty() => Reading::NoSession(Miss::ProtobufWithoutAddress),
        Ok(c) if c.expires != 0 && now > c.expires => Reading::NoSession(Miss::Expired),
        Ok(c) => Reading::Pins(vec![c.address]),
        Err(_) => Reading::Pins(vec![String::from_utf8_lossy(&bytes).into_owned()]),
    }
}

/// The model of C-core's reader.
fn grpc_model(value: &str) -> Reading {
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let Ok(bytes) = engine.decode(value) else {
        return Reading::NoSession(Miss::Base64);
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let hosts = text.split(';').next().unwrap_or_default();
    if hosts.is_empty() {
        return Reading::NoSession(Miss::Unreadable);
    }
    Reading::Pins(hosts.split(',').map(String::from).collect())
}

fn legacy_plain(addr: SocketAddr) -> String {
    base64::engine::general_purpose::STANDARD.encode(addr.to_string())
}

fn one(addr: SocketAddr) -> SessionCookie {
    SessionCookie::new(AddressList::one(addr))
}

/// Every check for one endpoint.
fn check(addr: SocketAddr) {
    // The plain legacy text: the judge is each model.
    let plain = legacy_plain(addr);
    assert_eq!(
        read(Reader::EnvoyCookie, &plain, NOW),
        envoy_model(&plain, NOW),
        "{addr}"
    );
    assert_eq!(
        read(Reader::Grpc, &plain, NOW),
        grpc_model(&plain),
        "{addr}"
    );
    assert!(honours(Reader::EnvoyHeader, &plain, addr, NOW), "{addr}");
    assert!(honours(Reader::Tether, &plain, addr, NOW), "{addr}");
    assert_eq!(
        readers::legacy_text_read_by_envoy(addr),
        honours(Reader::EnvoyCookie, &plain, addr, NOW),
        "{addr}"
    );
    // What tether writes for a cookie, per format, and for a header.
    let legacy = cookie::encode(&one(addr), Format::Legacy, None).unwrap();
    let header = cookie::encode_header(&one(addr), Format::Legacy, None).unwrap();
    let envoy = cookie::encode(&one(addr), Format::Envoy, None).unwrap();
    let mut clustered = one(addr);
    clustered.cluster = Some("shop/session".into());
    let grpc = cookie::encode(&clustered, Format::Grpc, None).unwrap();
    for (value, readers) in [
        (
            &legacy,
            &[Reader::EnvoyCookie, Reader::Grpc, Reader::Tether][..],
        ),
        (&header, &[Reader::EnvoyHeader, Reader::Tether][..]),
        (&envoy, &[Reader::EnvoyCookie, Reader::Tether][..]),
        (&grpc, &[Reader::Grpc, Reader::Tether][..]),
    ] {
        for r in readers {
            assert!(honours(*r, value, addr, NOW), "{addr}: {r} {value}");
        }
        // The models agree on what tether writes too.
        assert_eq!(
            read(Reader::EnvoyCookie, value, NOW),
            envoy_model(value, NOW),
            "{addr} {value}"
        );
        assert_eq!(
            read(Reader::Grpc, value, NOW),
            grpc_model(value),
            "{addr} {value}"
        );
    }
    // A guard only where the plain text fails Envoy; tether reads it back as legacy.
    assert_eq!(
        legacy == plain,
        readers::legacy_text_read_by_envoy(addr),
        "{addr}"
    );
    let back = cookie::decode(&legacy, &KeyRing::empty()).unwrap();
    assert_eq!(
        (back.format, back.cookie),
        (Format::Legacy, one(addr)),
        "{addr}"
    );
    assert_eq!(header, plain, "{addr}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5_000))]

    #[test]
    fn ipv4_endpoints(ip in any::<u32>(), port in any::<u16>()) {
        check(SocketAddr::from((Ipv4Addr::from(ip), port)));
    }

    #[test]
    fn ipv6_endpoints_are_never_misread(ip in any::<u128>(), port in any::<u16>()) {
        let addr = SocketAddr::from((Ipv6Addr::from(ip), port));
        check(addr);
        prop_assert!(readers::legacy_text_read_by_envoy(addr));
    }
}

#[test]
fn every_port_of_a_few_addresses() {
    for ip in ["10.0.0.1", "127.0.0.1", "::1"] {
        let ip: std::net::IpAddr = ip.parse().unwrap();
        for port in 0..=u16::MAX {
            check(SocketAddr::new(ip, port));
        }
    }
}

#[test]
fn the_issue_s_example_and_its_guard() {
    let addr: SocketAddr = "10.0.0.1:8080".parse().unwrap();
    assert!(!readers::legacy_text_read_by_envoy(addr));
    assert_eq!(
        read(Reader::EnvoyCookie, &legacy_plain(addr), NOW),
        Reading::NoSession(Miss::ProtobufWithoutAddress)
    );
    let guarded = cookie::encode(&one(addr), Format::Legacy, None).unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(&guarded)
            .unwrap(),
        b"10.0.0.1:8080;<\n\x0d10.0.0.1:8080"
    );
    // Addresses whose text Envoy falls back to are written plain.
    let plain: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    assert!(readers::legacy_text_read_by_envoy(plain));
    assert_eq!(
        cookie::encode(&one(plain), Format::Legacy, None).unwrap(),
        legacy_plain(plain)
    );
}
