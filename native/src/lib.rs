//! tether's native crate: the proxyless gRPC [`Channel`], the `tether`
//! command-line tool and the `tether-control` management server.
//!
//! Modules by concern, along the data path of a call: [`channel`] (the
//! tonic-compatible Service, the xDS resolver, the config selector), [`lb`]
//! (gRPC's xDS load-balancing tree, one module per policy), [`subchannel`]
//! (HTTP/2 connections with their connectivity state and backoff). Beside
//! them: [`xds`] is the xDS client (gRFC A57 failure behaviour, resource
//! validation); [`cli`] wires subcommands to `tether-core`; [`control`] is
//! `tether-control`.
//!
//! Features: `cli` (the `tether` command line) and `control` (tether-control's
//! library), both on by default; the channel, the LB tree, the subchannels
//! and the XdsClient need neither.
#![deny(missing_docs)]

pub mod channel;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "control")]
pub mod control;
pub mod lb;
pub mod orca;
pub mod session;
pub mod subchannel;
pub mod xds;

pub use channel::Channel;
