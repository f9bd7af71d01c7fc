//! tether's xDS client: a gRPC-compatible bootstrap, one ADS stream per
//! server with ACK/NACK and a resource cache, and the failure behaviour of
//! gRFC A57 (connectivity errors, does-not-exist timers, backoff).
//!
//! Every resource is validated here, with gRPC's rules, into plain values:
//! the channel (`tether`) and the control plane (`tether-control`) consume
//! them and never see a proto. This crate depends on tether-core and
//! Envoy's protos only, never on the channel.
//!
//! - [`bootstrap`]: the bootstrap file gRPC clients read (`GRPC_XDS_BOOTSTRAP`).
//! - [`client`]: [`XdsClient`], its watchers and the per-resource state that
//!   load balancing and `tether xds dump` read.
//! - [`resource`]: validation of Listener, RouteConfiguration, Cluster and
//!   ClusterLoadAssignment into plain Rust structs, with gRPC's rules.
//! - [`backoff`]: exponential backoff with jitter between stream attempts.
//! - [`error`]: the errors watchers see.
//! - [`graph`]: one listener's resource graph, as a channel follows it.
//! - [`csds`]: the Client Status Discovery Service (gRFC A40) over every
//!   XdsClient of the process.
//! - [`lb_config`]: LB policy configs (outlier detection, weighted round
//!   robin, least request) and custom policies' names and parsers (A52).
//! - [`load_report`]: the load a cluster's calls make, reported over LRS
//!   (gRFC A27).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod backoff;
pub mod bootstrap;
pub mod call_creds;
pub mod client;
pub mod csds;
mod env;
pub mod error;
pub mod graph;
pub mod lb_config;
pub mod load_report;
pub mod resource;
pub mod tls;

pub use bootstrap::Bootstrap;
pub use client::{ResourceState, ResourceStatus, Watcher, XdsClient};
pub use error::XdsError;
pub use resource::{Resource, ResourceKind};
