//! tether's native crate: the `tether` command-line tool.
//!
//! Modules by concern: [`cli`] wires subcommands to `tether-core`.
#![deny(missing_docs)]

pub mod cli;
