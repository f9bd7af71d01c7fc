//! # tether-plugin
//!
//! tether's proxy-wasm plugin for Envoy: a thin adapter over
//! [`tether_core::Session`]. On each request it reads the session cookie (or
//! header) in any format tether reads, removes any override header the client
//! sent, and tells Envoy where a pinned request goes by writing a request
//! header; on each response it sets a cookie when the host that answered is
//! not the session's. Every cookie, path and pick decision is tether-core's.
//!
//! Two wirings hand the pinned hosts to Envoy (see the crate's README):
//! - (a) `override_encoding: "list"`: Envoy's
//!   `envoy.load_balancing_policies.override_host` policy reads
//!   `ip:port[,ip:port...]` from the header;
//! - (b) `override_encoding: "session_header"`: Envoy's own
//!   `stateful_session` filter in header mode, placed after the plugin, reads
//!   base64(`ip:port`) and adds `override_host_status` health filtering and
//!   `strict`.
//!
//! - [`config`]: the JSON configuration;
//! - [`filter`]: the request and response logic, against a [`filter::Host`]
//!   trait (so it is tested natively);
//! - [`metrics`]: the counters in Envoy's stats and the VM-local tally the
//!   timer hands to Envoy;
//! - `abi` (wasm32 only): the proxy-wasm contexts and host calls that never
//!   panic.
//!
//! The plugin must never panic: a panic takes down the VM of that worker.
//! Nothing here unwraps a host status or input, and the `wasm` profile aborts
//! rather than unwinds.
#![deny(missing_docs)]

extern crate alloc;

pub mod config;
pub mod filter;
mod memo;
pub mod metrics;

#[cfg(target_arch = "wasm32")]
mod abi;
