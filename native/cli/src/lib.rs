//! The `tether` command line. Every subcommand prints JSON on stdout so its
//! output can be piped into `jq` or compared by scripts; errors go to stderr
//! and give a non-zero exit code.
//!
//! The one crate that wires the others (tether-core, tether-xds, the
//! `tether` channel) into a program.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod call;
pub mod cookie;
pub mod csds;
pub mod metrics_file;
pub mod ring;
pub mod xds;

use clap::{Parser, Subcommand};
use std::ffi::OsString;

/// Session affinity that works the same in Envoy and in proxyless gRPC.
#[derive(Debug, Parser)]
#[command(name = "tether", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Read and write session cookies (Envoy, gRPC C-core, legacy; signed or not).
    #[command(subcommand)]
    Cookie(cookie::CookieCommand),
    /// Ring hash and Maglev: which host a key (or a request, through hash policies) lands on.
    #[command(subcommand)]
    Ring(ring::RingCommand),
    /// Inspect what the xDS client receives from a control plane.
    #[command(subcommand)]
    Xds(xds::XdsCommand),
    /// Call any gRPC method through tether's channel (xds:///NAME or static:///ADDR,...), like
    /// grpcurl without a .proto: one JSON line per call says which peer and cluster served it.
    Call(Box<call::CallArgs>),
}

/// Runs the command line `args` (program name first); returns the exit code.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    let result = match cli.command {
        Command::Cookie(c) => {
            // What a value's readers will make of it is said on stderr.
            init_logging(log::LevelFilter::Info);
            cookie::run(c).map(|json| vec![json])
        }
        Command::Ring(c) => ring::run(c),
        // Long-running and streaming: prints and picks its exit code itself.
        Command::Xds(c) => return xds::run(c),
        Command::Call(a) => return call::run(*a),
    };
    match result {
        Ok(lines) => {
            for json in lines {
                println!("{json}");
            }
            0
        }
        Err(e) => {
            eprintln!("tether: {e}");
            1
        }
    }
}

/// Sends tether's `log` lines (channel, subchannels, XdsClient, control
/// plane) at `level` and above to stderr, with millisecond timestamps;
/// `RUST_LOG`, when set, overrides the level. For tether's binaries: a
/// second call (a logger already installed) changes nothing.
pub fn init_logging(level: log::LevelFilter) {
    let _ = env_logger::Builder::new()
        .filter_level(level)
        .parse_env(env_logger::Env::default())
        .format_timestamp_millis()
        .target(env_logger::Target::Stderr)
        .try_init();
}

/// A current-thread tokio runtime for a subcommand; `None` (said on
/// stderr) when it cannot be made.
pub(crate) fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("tether: cannot start the runtime: {e}");
            None
        }
    }
}

/// Seconds since the Unix epoch by the system clock.
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
