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
use std::time::Duration;

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
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
