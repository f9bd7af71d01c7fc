//! Tests of tether's built artifacts and against real peers (Envoy 1.40, gRPC
//! C-core). The tests live in `tests/`; this library holds what they share.

pub mod control;
pub mod demo;
pub mod host;
pub mod scenario;
