//! tether's own protobuf messages, compiled from `proto/` at build time.
//!
//! - [`session::v1::SessionCookie`]: the `envoy`-format session cookie payload.
//!   Fields 1 (`address`) and 2 (`expires`) are the ones Envoy's cookie-based
//!   session state reads; 100 (`cluster`), 101 (`extra_addresses`) and 102
//!   (`mac`) are tether's extensions, skipped by stock Envoy.
//! - [`demo::v1`]: the echo service used by tests and demos; its tonic client and
//!   server exist with the `grpc` feature.
//!
//! Without features the crate is `no_std` + `alloc`, so `tether-core` can use it
//! in every build (wasm plugin, JavaScript, native).
#![cfg_attr(not(feature = "grpc"), no_std)]
#![allow(missing_docs)] // generated code

extern crate alloc;

/// Session cookie messages.
pub mod session {
    /// Version 1 of the session cookie payload.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/tether.session.v1.rs"));
    }
}

/// Demo echo service.
pub mod demo {
    /// Version 1 of the demo service.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/tether.demo.v1.rs"));
    }
}
