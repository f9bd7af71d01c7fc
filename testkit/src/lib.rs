//! Fixtures for tether's integration tests, all on loopback:
//!
//! - [`envoy`]: a real Envoy process started from a YAML config, killed on drop;
//! - [`backend`]: HTTP backends that answer with who they are;
//! - [`client`]: a minimal HTTP/1.1 client that shows every response header;
//! - `grpc` (feature `grpc`): gRPC backends serving the demo Echo service,
//!   whose replies say which backend answered.
//!
//! Ports come from [`free_port`]; tests format them into their YAML.

pub mod backend;
pub mod client;
pub mod envoy;
#[cfg(feature = "grpc")]
pub mod grpc;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// A TCP port on 127.0.0.1 that nothing listens on, for a test to write
/// into a config that another process (Envoy) binds later.
///
/// The port is taken below the kernel's ephemeral range, so nothing binding
/// port 0 (Envoy's own admin listener, a backend) and no outgoing
/// connection can be handed it in the meantime, and no two calls in one
/// process return the same port. Each process starts at its own offset.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // The range and this process's offset in it, worked out once.
    static PLAN: OnceLock<(u16, u16, u32)> = OnceLock::new();
    let &(lo, hi, start) = PLAN.get_or_init(|| {
        let (lo, hi) = fixed_port_range();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = std::process::id().wrapping_mul(7919) ^ nanos;
        (lo, hi, start)
    });
    let span = u32::from(hi - lo) + 1;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + (start.wrapping_add(n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {lo}-{hi}");
}

/// Ports outside the ephemeral range (`ip_local_port_range`, 32768-60999 by
/// default): the 10,000 below it, or those above it when it starts too low.
fn fixed_port_range() -> (u16, u16) {
    let (eph_lo, eph_hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    if eph_lo >= 11_024 {
        (eph_lo - 10_000, eph_lo - 1)
    } else if eph_hi <= 64_535 {
        (eph_hi + 1, 65_535)
    } else {
        // The whole range is ephemeral: distinct ports are the best on offer.
        (1_024, 65_535)
    }
}

/// Polls `check` every 50 ms until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether something accepts TCP connections at `addr`.
pub async fn is_listening(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}
