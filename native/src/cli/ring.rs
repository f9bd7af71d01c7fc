//! `tether ring pick`: where does a key land, without sending traffic.
//!
//! The key is hashed as Envoy's header hash policy hashes a header value
//! (XXH64, seed 0) and looked up in the ring (or Maglev table) built from the
//! hosts in the order given, exactly as Envoy builds it for a cluster with
//! those hosts in that order.

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use tether_core::hash::{key_hash, BuildError, Host, Maglev, MaglevConfig, Ring, RingConfig};

/// Ring subcommands.
#[derive(Debug, Subcommand)]
pub enum RingCommand {
    /// Print the host each KEY lands on: one JSON object per key.
    Pick(PickArgs),
}

/// The hashing table to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// Envoy's RING_HASH (gRFC A42).
    Ring,
    /// Envoy's MAGLEV.
    Maglev,
}

/// Arguments of `tether ring pick`.
#[derive(Debug, Args)]
pub struct PickArgs {
    /// Load-balancing policy.
    #[arg(long, value_enum, default_value = "ring")]
    policy: Policy,
    /// An upstream host ip:port ([v6]:port), optionally =WEIGHT (default 1);
    /// repeat in the cluster's order.
    #[arg(long = "host", value_name = "ADDR[=WEIGHT]", required = true)]
    hosts: Vec<String>,
    /// Ring hash minimum_ring_size.
    #[arg(long, value_name = "N", default_value_t = tether_core::hash::ring::DEFAULT_MIN_RING_SIZE)]
    min_ring_size: u64,
    /// Ring hash maximum_ring_size.
    #[arg(long, value_name = "N", default_value_t = tether_core::hash::ring::MAX_RING_SIZE)]
    max_ring_size: u64,
    /// Cap both ring sizes at N, as gRPC does (its default cap is 4096).
    #[arg(long, value_name = "N")]
    ring_size_cap: Option<u64>,
    /// Maglev table size (a prime).
    #[arg(long, value_name = "N", default_value_t = tether_core::hash::maglev::DEFAULT_TABLE_SIZE)]
    table_size: u64,
    /// The keys to place, e.g. the values of the hashed header.
    #[arg(value_name = "KEY", required = true)]
    keys: Vec<String>,
}

/// Runs a ring subcommand and returns its JSON lines.
pub fn run(cmd: RingCommand) -> Result<Vec<Value>, String> {
    match cmd {
        RingCommand::Pick(a) => pick(a),
    }
}

/// Parses `ADDR[=WEIGHT]`.
fn parse_host(i: usize, text: &str) -> Result<Host, String> {
    let (addr, weight) = match text.rsplit_once('=') {
        Some((a, w)) => {
            let weight = w
                .parse::<u32>()
                .map_err(|_| format!("--host[{i}]: weight {w:?} is not a whole number"))?;
            (a, weight)
        }
        None => (text, 1),
    };
    let addr = tether_core::address::parse(addr).map_err(|e| format!("--host[{i}]: {e}"))?;
    Ok(Host::from_addr(addr, weight))
}

/// A build error with the configuration field names replaced by the options
/// that set them.
fn cli_error(e: BuildError) -> String {
    let text = e.to_string();
    let text = match text.strip_prefix("hosts") {
        Some(rest) => format!("--host{rest}"),
        None => text,
    };
    text.replace("minimum_ring_size", "--min-ring-size")
        .replace("maximum_ring_size", "--max-ring-size")
        .replace("ring_size_cap", "--ring-size-cap")
        .replace("table_size", "--table-size")
}

fn pick(a: PickArgs) -> Result<Vec<Value>, String> {
    let hosts = a
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| parse_host(i, h))
        .collect::<Result<Vec<_>, _>>()?;
    let lookup: Box<dyn Fn(u64) -> String> = match a.policy {
        Policy::Ring => {
            let config = RingConfig {
                minimum_ring_size: a.min_ring_size,
                maximum_ring_size: a.max_ring_size,
                ring_size_cap: a.ring_size_cap,
            };
            let ring = Ring::build(hosts, &config).map_err(cli_error)?;
            Box::new(move |h| ring.pick_host(h).key().to_string())
        }
        Policy::Maglev => {
            let config = MaglevConfig {
                table_size: a.table_size,
            };
            let table = Maglev::build(hosts, &config).map_err(cli_error)?;
            Box::new(move |h| table.pick_host(h).key().to_string())
        }
    };
    Ok(a.keys
        .iter()
        .map(|k| json!({"key": k, "host": lookup(key_hash(k))}))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(subcommand)]
        cmd: RingCommand,
    }

    fn run_args(args: &[&str]) -> Result<Vec<Value>, String> {
        let mut all = vec!["t"];
        all.extend_from_slice(args);
        run(T::try_parse_from(all).map_err(|e| e.to_string())?.cmd)
    }

    const HOSTS: [&str; 6] = [
        "--host",
        "127.0.0.1:441",
        "--host",
        "127.0.0.1:442",
        "--host",
        "127.0.0.1:443",
    ];

    #[test]
    fn ring_picks_match_envoy_vectors() {
        let mut args = vec!["pick"];
        args.extend_from_slice(&HOSTS);
        args.extend_from_slice(&["foo", "bar", "user-42"]);
        let out = run_args(&args).unwrap();
        assert_eq!(
            out,
            [
                json!({"key": "foo", "host": "127.0.0.1:442"}),
                json!({"key": "bar", "host": "127.0.0.1:443"}),
                json!({"key": "user-42", "host": "127.0.0.1:441"}),
            ]
        );
    }

    #[test]
    fn maglev_and_weights() {
        let out = run_args(&[
            "pick",
            "--policy",
            "maglev",
            "--host",
            "[::1]:8080=3",
            "--host",
            "10.0.0.1:80",
            "k",
        ])
        .unwrap();
        let host = out[0]["host"].as_str().unwrap();
        assert!(host == "[::1]:8080" || host == "10.0.0.1:80", "{host}");
    }

    #[test]
    fn errors_name_the_option_and_value() {
        let err = |extra: &[&str]| {
            let mut args = vec!["pick"];
            args.extend_from_slice(extra);
            args.push("k");
            run_args(&args).unwrap_err()
        };
        assert_eq!(
            err(&["--host", "127.0.0.1:1=0"]),
            "--host: \"127.0.0.1:1\" has weight 0 (weights start at 1)"
        );
        assert_eq!(
            err(&["--host", "127.0.0.1:1=x"]),
            "--host[0]: weight \"x\" is not a whole number"
        );
        assert_eq!(
            err(&["--host", "localhost:1"]),
            "--host[0]: \"localhost:1\" is not an ip:port address (IPv6 in brackets)"
        );
        assert_eq!(
            err(&["--host", "127.0.0.1:1", "--min-ring-size", "0"]),
            "--min-ring-size: 0 is outside 1..=8388608"
        );
        assert_eq!(
            err(&[
                "--host",
                "127.0.0.1:1",
                "--policy",
                "maglev",
                "--table-size",
                "100"
            ]),
            "--table-size: 100 is not a prime number in 2..=5000011"
        );
        assert_eq!(
            err(&[
                "--host",
                "127.0.0.1:1",
                "--min-ring-size",
                "9",
                "--max-ring-size",
                "8"
            ]),
            "--min-ring-size: 9 is above --max-ring-size 8"
        );
    }
}
