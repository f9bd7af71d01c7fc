//! The share of IPv4 endpoints whose plain `legacy` cookie stock Envoy's
//! cookie session state reads as a protobuf without an address (and so
//! ignores), per port: exact over 10.0.0.0/8 and 127.0.0.0/8, estimated over
//! the whole IPv4 space from a fixed-seed sample. IPv6 texts start with `[`
//! (an unclosed protobuf group) and are never affected.
//!
//! `cargo run --release -p tether-core --example legacy_share [PORT...]`

use std::net::{Ipv4Addr, SocketAddr};

use tether_core::cookie::readers::legacy_text_read_by_envoy;

fn share(port: u16, addrs: impl Iterator<Item = Ipv4Addr>) -> (u64, u64) {
    let (mut misread, mut all) = (0, 0);
    for ip in addrs {
        all += 1;
        if !legacy_text_read_by_envoy(SocketAddr::from((ip, port))) {
            misread += 1;
        }
    }
    (misread, all)
}

fn main() {
    let ports: Vec<u16> = std::env::args()
        .skip(1)
        .map(|p| p.parse().expect("a port number"))
        .collect();
    let ports = if ports.is_empty() {
        vec![80, 443, 3000, 5000, 8000, 8080, 8443, 9000, 9090, 50051]
    } else {
        ports
    };
    println!("port\t10.0.0.0/8\t127.0.0.0/8\tall IPv4 (sample of 1,000,000)");
    for port in ports {
        let ten = share(
            port,
            (0..1u32 << 24).map(|i| Ipv4Addr::from(0x0a00_0000 | i)),
        );
        let lo = share(
            port,
            (0..1u32 << 24).map(|i| Ipv4Addr::from(0x7f00_0000 | i)),
        );
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let sample = (0..1_000_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Ipv4Addr::from(x as u32)
        });
        let all = share(port, sample);
        let pct = |(m, a): (u64, u64)| 100.0 * m as f64 / a as f64;
        println!(
            "{port}\t{:.2} %\t{:.2} %\t{:.2} %",
            pct(ten),
            pct(lo),
            pct(all)
        );
    }
}
