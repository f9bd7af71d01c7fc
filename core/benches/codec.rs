//! Codec benchmarks: `cargo bench -p tether-core --bench codec`.

use divan::black_box;
use tether_core::cookie::{decode, encode, Format, Key, KeyRing, SessionCookie};
use tether_core::http::cookie_header;
use tether_core::AddressList;

fn main() {
    divan::main();
}

fn sample() -> SessionCookie {
    let mut c = SessionCookie::new(AddressList::parse("127.0.0.1:19002").unwrap());
    c.expires = Some(1_795_348_489);
    c
}

fn keys() -> KeyRing {
    KeyRing::new(vec![
        Key::from_secret(b"0123456789abcdef0123456789abcdef").unwrap()
    ])
}

#[divan::bench(args = Format::ALL)]
fn encode_unsigned(format: Format) -> String {
    let mut c = sample();
    if format != Format::Envoy {
        c.expires = None;
    }
    encode(black_box(&c), format, None).unwrap()
}

#[divan::bench(args = Format::ALL)]
fn decode_unsigned(bencher: divan::Bencher, format: Format) {
    let mut c = sample();
    if format != Format::Envoy {
        c.expires = None;
    }
    let value = encode(&c, format, None).unwrap();
    let ring = KeyRing::empty();
    bencher.bench(|| decode(black_box(&value), &ring).unwrap());
}

/// The hot path of a pinned request through an Envoy-format session: read the
/// cookie, then write it again (the target is ≤ 200 ns).
#[divan::bench]
fn decode_plus_encode_envoy(bencher: divan::Bencher) {
    let value = encode(&sample(), Format::Envoy, None).unwrap();
    let ring = KeyRing::empty();
    bencher.bench(|| {
        let d = decode(black_box(&value), &ring).unwrap();
        encode(&d.cookie, Format::Envoy, None).unwrap()
    });
}

#[divan::bench]
fn encode_signed_envoy(bencher: divan::Bencher) {
    let ring = keys();
    let c = sample();
    bencher.bench(|| encode(black_box(&c), Format::Envoy, ring.signer()).unwrap());
}

#[divan::bench]
fn decode_signed_envoy(bencher: divan::Bencher) {
    let ring = keys();
    let value = encode(&sample(), Format::Envoy, ring.signer()).unwrap();
    bencher.bench(|| decode(black_box(&value), &ring).unwrap());
}

#[divan::bench]
fn cookie_header_find(bencher: divan::Bencher) {
    let headers = [
        "_ga=GA1.2.1234567890.1234567890; theme=dark; lang=en-US",
        "csrftoken=abcdef0123456789; global-session-cookie=\"Cg8xMjcuMC4wLjE6MTkwMDIQibCL2AY=\"; x=y",
    ];
    bencher.bench(|| {
        cookie_header::find(black_box(headers).iter().copied(), "global-session-cookie").unwrap()
    });
}
