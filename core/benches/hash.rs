//! Hash-based affinity benchmarks, side by side in one run:
//! `cargo bench -p tether-core --bench hash`.
//!
//! Goals: ring build for 1,000 hosts ≤ 5 ms, ring pick ≤ 50 ns.

use divan::black_box;
use tether_core::hash::{
    key_hash, HashPolicies, HashPolicy, HashRequest, Host, Maglev, MaglevConfig, Peer, Ring,
    RingConfig,
};

fn main() {
    divan::main();
}

/// `n` hosts `10.x.y.z:8080` with weights 1..=5.
fn hosts(n: u32) -> Vec<Host> {
    (0..n)
        .map(|i| {
            Host::new(
                format!("10.{}.{}.{}:8080", i >> 16, (i >> 8) & 255, i & 255),
                1 + i % 5,
            )
        })
        .collect()
}

/// Keys whose hashes the picks look up, so one iteration is not a cache
/// replay of the previous.
fn hashes() -> Vec<u64> {
    (0..1024).map(|i| key_hash(&format!("user-{i}"))).collect()
}

#[divan::bench(args = [10, 100, 1_000, 10_000])]
fn ring_build(bencher: divan::Bencher, n: u32) {
    let hs = hosts(n);
    bencher.bench(|| Ring::build(black_box(hs.clone()), &RingConfig::default()).unwrap());
}

#[divan::bench(args = [10, 1_000, 10_000])]
fn ring_pick(bencher: divan::Bencher, n: u32) {
    let ring = Ring::build(hosts(n), &RingConfig::default()).unwrap();
    let hs = hashes();
    let mut i = 0usize;
    bencher.bench_local(|| {
        i = (i + 1) & 1023;
        ring.pick(black_box(hs[i]))
    });
}

#[divan::bench(args = [10, 1_000, 10_000])]
fn maglev_build(bencher: divan::Bencher, n: u32) {
    let hs = hosts(n);
    bencher.bench(|| Maglev::build(black_box(hs.clone()), &MaglevConfig::default()).unwrap());
}

#[divan::bench(args = [10, 1_000, 10_000])]
fn maglev_pick(bencher: divan::Bencher, n: u32) {
    let m = Maglev::build(hosts(n), &MaglevConfig::default()).unwrap();
    let hs = hashes();
    let mut i = 0usize;
    bencher.bench_local(|| {
        i = (i + 1) & 1023;
        m.pick(black_box(hs[i]))
    });
}

/// A typical request: a dozen headers, the hashed one among them.
fn request_headers() -> Vec<(&'static str, &'static str)> {
    vec![
        (":authority", "shop.example.com"),
        (":path", "/cart?user=42"),
        (":method", "GET"),
        ("user-agent", "Mozilla/5.0 (X11; Linux x86_64)"),
        ("accept", "text/html,application/xhtml+xml"),
        ("accept-language", "en-GB,en;q=0.9"),
        ("cookie", "theme=dark; session=0123456789abcdef; lang=en"),
        ("x-request-id", "4c2d8f0e-8a53-4c3e-9d55-0e4b1f6f7c21"),
        ("x-user", "user-42"),
        ("x-forwarded-for", "203.0.113.7"),
    ]
}

/// One header policy: the common case.
#[divan::bench]
fn policy_header(bencher: divan::Bencher) {
    let policies = HashPolicies::new(vec![HashPolicy::header("x-user").unwrap()], Peer::Envoy);
    let headers = request_headers();
    bencher.bench_local(|| {
        let req = HashRequest::new(black_box(headers.as_slice()));
        policies.evaluate(&req).hash
    });
}

/// Header (absent) then cookie then source IP, none terminal.
#[divan::bench]
fn policy_header_cookie_ip(bencher: divan::Bencher) {
    let policies = HashPolicies::new(
        vec![
            HashPolicy::header("x-missing").unwrap(),
            HashPolicy::cookie("session").unwrap(),
            HashPolicy::source_ip(),
        ],
        Peer::Envoy,
    );
    let headers = request_headers();
    let remote = "203.0.113.7:50123".parse().unwrap();
    bencher.bench_local(|| {
        let mut req = HashRequest::new(black_box(headers.as_slice()));
        req.remote = Some(black_box(remote));
        policies.evaluate(&req).hash
    });
}

/// Evaluate plus pick: what an adapter does per request.
#[divan::bench]
fn policy_header_then_ring_pick(bencher: divan::Bencher) {
    let policies = HashPolicies::new(vec![HashPolicy::header("x-user").unwrap()], Peer::Envoy);
    let ring = Ring::build(hosts(100), &RingConfig::default()).unwrap();
    let headers = request_headers();
    bencher.bench_local(|| {
        let req = HashRequest::new(black_box(headers.as_slice()));
        policies.evaluate(&req).hash.value().map(|h| ring.pick(h))
    });
}
