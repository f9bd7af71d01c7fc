//! Endpoints written as `NAME:PORT`: tether-control resolves the names (A
//! and AAAA) and serves every address as an endpoint; clients never
//! resolve them.
//!
//! - [`answer`]: what one resolution of a name said.
//! - [`name`]: one name's addresses over time, without I/O: fed answers
//!   and instants, it keeps the last good addresses through DNS trouble,
//!   confirms an empty answer before believing it, and drains an address
//!   that left the answer for `drainOnRemoval` before removing it.
//! - [`table`]: every name the file uses, what is due, and the addresses
//!   translation reads.
//! - [`lookup`]: the queries, through hickory's resolver.

use std::net::SocketAddr;
use std::time::Duration;

pub mod answer;
pub mod lookup;
pub mod name;
pub mod table;

pub use answer::Answer;
pub use lookup::Lookup;
pub use name::{Event, NameState};
pub use table::{DnsStatus, NameReport, Names, Resolved, ResolvedAddress};

/// How names are resolved: the file's `dns` section with its defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DnsSettings {
    /// The servers to ask; empty: the system's (resolv.conf).
    pub servers: Vec<SocketAddr>,
    /// A name is asked again after its TTL, never sooner than this
    /// (default 5 s, Envoy's STRICT_DNS `dns_refresh_rate`) ...
    pub min_refresh: Duration,
    /// ... and never later than this (default 60 s).
    pub max_refresh: Duration,
    /// How long an address that left the answer is served DRAINING
    /// (default 30 s; zero removes it at once).
    pub drain_on_removal: Duration,
    /// How long one query waits for an answer (default 5 s).
    pub timeout: Duration,
}

impl Default for DnsSettings {
    fn default() -> Self {
        DnsSettings {
            servers: Vec::new(),
            min_refresh: Duration::from_secs(5),
            max_refresh: Duration::from_secs(60),
            drain_on_removal: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
        }
    }
}

impl DnsSettings {
    /// When a name whose answer lives `ttl` is asked again.
    pub fn refresh_after(&self, ttl: Duration) -> Duration {
        ttl.clamp(self.min_refresh, self.max_refresh.max(self.min_refresh))
    }
}
