//! tether's native crate: the `tether` command-line tool.
//!
//! Modules by concern: [`cli`] wires subcommands to `tether-core`; [`xds`] is
//! the xDS client (gRFC A57 failure behaviour, resource validation);
//! [`control`] is the `tether-control` management server.
#![deny(missing_docs)]

pub mod cli;
pub mod control;
pub mod xds;
