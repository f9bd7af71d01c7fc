//! # tether-core
//!
//! The sans-I/O heart of tether: everything about session affinity that does not
//! touch a socket. Callers hand in plain values (header strings, addresses, a
//! clock reading) and get plain values back (what to route to, what to set).
//! The proxy-wasm plugin, the native client and the JavaScript binding are thin
//! adapters over this crate, so a cookie means the same thing in all of them.
//!
//! - [`cookie`]: the session cookie model and its codec. Reads Envoy's protobuf
//!   cookie, gRPC C-core's `addr[,addr];cluster` text and the legacy plain
//!   `ip:port`; writes any of them, optionally signed.
//! - [`http`]: RFC 6265 `Cookie` header parsing, `Set-Cookie` rendering in
//!   Envoy's and C-core's byte order, and the cookie path gate.
//! - [`config`]: the session configuration (mirrors Envoy's `StatefulSession`).
//! - [`error`]: configuration errors that name the field and the value.
//! - [`session`]: the two decisions every adapter makes: which hosts a request
//!   is pinned to, and what (if anything) to send back after it was served.
//! - [`hash`]: hash-based affinity as Envoy computes it: route hash policies,
//!   the ring hash ring and the Maglev table.
//!
//! The crate is `no_std` + `alloc`.
#![no_std]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod address;
pub mod config;
pub mod cookie;
pub mod duration;
pub mod error;
pub mod hash;
pub mod http;
pub mod session;
#[cfg(test)]
mod testing;

pub use address::AddressList;
pub use config::{ConfigError, SessionConfig, SessionMode};
pub use cookie::{DecodeError, Decoded, EncodeError, Format, KeyRing, SessionCookie, Signature};
pub use session::{Emit, Lookup, Miss, Served, Session, SessionRequest};
