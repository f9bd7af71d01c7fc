//! `tether ring pick`: where does a key land, without sending traffic.
//!
//! Each KEY is hashed as Envoy's header hash policy hashes a header value
//! (XXH64, seed 0) and looked up in the ring (or Maglev table) built from the
//! hosts in the order given, exactly as Envoy builds it for a cluster with
//! those hosts in that order. With `--hash-policy`, a route's whole
//! `hash_policy` list is evaluated instead against one request described by
//! `--header`, `--path`, `--remote`, `--local` and `--filter-state`.

use std::net::{IpAddr, SocketAddr};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use tether_core::hash::{
    key_hash, BuildError, HashFunction, HashPolicies, HashRequest, Host, Maglev, MaglevConfig,
    Peer, RequestHash, Ring, RingConfig,
};

/// Ring subcommands.
#[derive(Debug, Subcommand)]
pub enum RingCommand {
    /// Print the host each KEY lands on (one JSON object per key), or, with
    /// --hash-policy, the host one request lands on.
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
    /// How ring entries are hashed (Envoy's ring_hash_lb_config.hash_function).
    #[arg(long, value_enum, default_value = "xx-hash")]
    hash_function: RingHashFunction,
    /// Maglev table size (a prime).
    #[arg(long, value_name = "N", default_value_t = tether_core::hash::maglev::DEFAULT_TABLE_SIZE)]
    table_size: u64,
    /// The keys to place, e.g. the values of the hashed header.
    #[arg(value_name = "KEY", required_unless_present = "hash_policy")]
    keys: Vec<String>,
    /// A route's hash policies, Envoy's `hash_policy` list as JSON (snake_case
    /// fields), e.g. '[{"header":{"header_name":"x-user"},"terminal":true},
    /// {"connection_properties":{"source_ip":true}}]'. Evaluates one request
    /// (the options below) instead of KEYs.
    #[arg(long, value_name = "JSON", conflicts_with = "keys")]
    hash_policy: Option<String>,
    /// Whose rules evaluate the policies where Envoy and gRPC C-core differ
    /// (repeated headers; C-core ignores cookie, source IP and query
    /// parameter policies); default envoy.
    #[arg(long, value_enum)]
    rules: Option<Rules>,
    /// A request header, NAME:VALUE; repeat for more (a `cookie` header too).
    #[arg(long = "header", value_name = "NAME:VALUE")]
    headers: Vec<String>,
    /// The request's `:path`, query string included (default `/`).
    #[arg(long, value_name = "PATH")]
    path: Option<String>,
    /// The downstream address, IP or ip:port (source IP; generated cookies).
    #[arg(long, value_name = "ADDR")]
    remote: Option<String>,
    /// The address the connection was accepted on, ip:port (generated cookies).
    #[arg(long, value_name = "ADDR")]
    local: Option<String>,
    /// A filter-state string, KEY=VALUE; repeat for more.
    #[arg(long = "filter-state", value_name = "KEY=VALUE")]
    filter_state: Vec<String>,
}

/// Envoy's ring hash functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RingHashFunction {
    /// XX_HASH (Envoy's default; the only one gRPC accepts).
    XxHash,
    /// MURMUR_HASH_2 (Envoy only).
    MurmurHash2,
}

/// Whose hash-policy rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Rules {
    /// Envoy 1.40.
    Envoy,
    /// gRPC C-core (gRFC A42).
    Grpc,
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
                hash_function: match a.hash_function {
                    RingHashFunction::XxHash => HashFunction::XxHash,
                    RingHashFunction::MurmurHash2 => HashFunction::MurmurHash2,
                },
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
    if let Some(policies) = &a.hash_policy {
        return Ok(vec![evaluate(&a, policies, lookup)?]);
    }
    // A request description without policies would be silently ignored.
    let request_options = [
        ("--rules", a.rules.is_some()),
        ("--header", !a.headers.is_empty()),
        ("--path", a.path.is_some()),
        ("--remote", a.remote.is_some()),
        ("--local", a.local.is_some()),
        ("--filter-state", !a.filter_state.is_empty()),
    ];
    if let Some((option, _)) = request_options.iter().find(|(_, given)| *given) {
        return Err(format!(
            "{option}: describes a request for --hash-policy, which is not given"
        ));
    }
    Ok(a.keys
        .iter()
        .map(|k| json!({"key": k, "host": lookup(key_hash(k))}))
        .collect())
}

/// An address given as `ip:port`, or as a bare IP (port 0).
fn parse_addr(option: &str, text: &str) -> Result<SocketAddr, String> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 0));
    }
    tether_core::address::parse(text).map_err(|e| format!("{option}: {e}"))
}

/// Splits `text` at the first `sep` after its first character (so that a
/// pseudo-header such as `:authority:host` keeps its colon), or names the
/// option and the value.
fn split_pair<'t>(
    option: &str,
    i: usize,
    text: &'t str,
    sep: char,
    form: &str,
) -> Result<(&'t str, &'t str), String> {
    let first = text.chars().next().map_or(0, char::len_utf8);
    match text[first..].find(sep).map(|at| at + first) {
        Some(at) if !text[..at].trim().is_empty() => {
            Ok((text[..at].trim(), text[at + 1..].trim_start()))
        }
        _ => Err(format!("{option}[{i}]: {text:?} is not {form}")),
    }
}

/// Evaluates the policies against the request the options describe and
/// picks with the result.
fn evaluate(
    a: &PickArgs,
    policies: &str,
    lookup: Box<dyn Fn(u64) -> String>,
) -> Result<Value, String> {
    let peer = match a.rules.unwrap_or(Rules::Envoy) {
        Rules::Envoy => Peer::Envoy,
        Rules::Grpc => Peer::Grpc,
    };
    let policies =
        HashPolicies::from_json(policies, peer).map_err(|e| format!("--hash-policy{}", at(e)))?;
    let headers = a
        .headers
        .iter()
        .enumerate()
        .map(|(i, h)| split_pair("--header", i, h, ':', "NAME:VALUE"))
        .collect::<Result<Vec<_>, _>>()?;
    let filter_state = a
        .filter_state
        .iter()
        .enumerate()
        .map(|(i, h)| split_pair("--filter-state", i, h, '=', "KEY=VALUE"))
        .collect::<Result<Vec<_>, _>>()?;
    let remote = a
        .remote
        .as_deref()
        .map(|r| parse_addr("--remote", r))
        .transpose()?;
    let local = a
        .local
        .as_deref()
        .map(|l| parse_addr("--local", l))
        .transpose()?;
    let request = HashRequest {
        headers: (&headers).into(),
        path: a.path.as_deref().unwrap_or("/"),
        remote,
        local,
        filter_state: &filter_state,
        generated: None,
    };
    let evaluation = policies.evaluate(&request);
    Ok(match evaluation.hash {
        RequestHash::Hash(h) => json!({
            "hash": format!("{h:016x}"),
            "host": lookup(h),
            "set_cookie": evaluation.set_cookies,
        }),
        RequestHash::NoHash => json!({
            "hash": null,
            "host": null,
            "set_cookie": evaluation.set_cookies,
            "note": "no policy produced a hash: the balancer picks a host at random",
        }),
    })
}

/// A policy error's text, joined to the option name: `[0].header...` as
/// `--hash-policy[0].header...`, anything else after `: `.
fn at(e: impl std::fmt::Display) -> String {
    let text = e.to_string();
    if text.starts_with('[') {
        text
    } else {
        format!(": {text}")
    }
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

    /// Every hash-policy vector of the shared data file, through the command
    /// line: the same hash, generated cookies and (where observed) host.
    #[test]
    fn hash_policy_vectors_through_the_command_line() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/vectors.json"
        ))
        .unwrap();
        let all: Value = serde_json::from_str(&text).unwrap();
        let hash = &all["hash"];
        // The ring observed on Envoy for weights 1,2,3,1,5 (ports 441..445).
        let mut hosts = Vec::new();
        for h in hash["ring"][2]["hosts"].as_array().unwrap() {
            hosts.push("--host".to_owned());
            hosts.push(format!(
                "{}={}",
                h["address"].as_str().unwrap(),
                h["weight"]
            ));
        }
        let vectors = hash["policies"].as_array().unwrap();
        assert!(vectors.len() >= 10);
        for v in vectors {
            let name = v["name"].as_str().unwrap();
            let r = &v["request"];
            let mut args: Vec<String> = vec!["pick".into()];
            args.extend(hosts.iter().cloned());
            args.extend([
                "--hash-policy".into(),
                v["policies"].to_string(),
                "--rules".into(),
                v["peer"].as_str().unwrap().into(),
            ]);
            let pairs = |field: &str, sep: char| -> Vec<String> {
                r[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| format!("{}{sep}{}", p[0].as_str().unwrap(), p[1].as_str().unwrap()))
                    .collect()
            };
            for h in pairs("headers", ':') {
                args.extend(["--header".into(), h]);
            }
            for f in pairs("filter_state", '=') {
                args.extend(["--filter-state".into(), f]);
            }
            for field in ["path", "remote", "local"] {
                if let Some(value) = r[field].as_str() {
                    args.extend([format!("--{field}"), value.into()]);
                }
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = run_args(&args).unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = &out[0];
            let e = &v["expect"];
            let want = if let Some(of) = e["hash_of"].as_str() {
                Some(key_hash(of))
            } else if let Some(chain) = e["hash_of_chain"].as_array() {
                Some(chain.iter().fold(0, |seed, x| {
                    tether_core::hash::xxh64(x.as_str().unwrap().as_bytes(), seed)
                }))
            } else {
                e["hash"]
                    .as_str()
                    .map(|h| u64::from_str_radix(h, 16).unwrap())
            };
            assert_eq!(
                got["hash"],
                json!(want.map(|h| format!("{h:016x}"))),
                "{name}"
            );
            assert_eq!(got["set_cookie"], e["set_cookies"], "{name}");
            if let Some(host) = e["ring_12315_host"].as_str() {
                assert_eq!(got["host"], host, "{name}");
            }
            if want.is_none() {
                assert_eq!(got["host"], Value::Null, "{name}");
            }
        }
    }

    #[test]
    fn hash_policy_errors_name_the_option_and_value() {
        let err = |extra: &[&str]| {
            let mut args = vec!["pick", "--host", "127.0.0.1:1"];
            args.extend_from_slice(extra);
            run_args(&args).unwrap_err()
        };
        assert_eq!(
            err(&["--hash-policy", r#"[{"header":{"header_nam":"a"}}]"#]),
            "--hash-policy[0].header.header_nam: is not a known field"
        );
        assert_eq!(
            err(&["--hash-policy", "[]", "--header", "no-colon"]),
            "--header[0]: \"no-colon\" is not NAME:VALUE"
        );
        assert_eq!(
            err(&["--hash-policy", "[]", "--filter-state", "k"]),
            "--filter-state[0]: \"k\" is not KEY=VALUE"
        );
        assert_eq!(
            err(&["--hash-policy", "[]", "--remote", "host:1"]),
            "--remote: \"host:1\" is not an ip:port address (IPv6 in brackets)"
        );
        assert_eq!(
            err(&["--header", "a:b", "k"]),
            "--header: describes a request for --hash-policy, which is not given"
        );
        assert!(err(&["--hash-policy", "[]", "k"]).contains("cannot be used with"));
        // A pseudo-header keeps its leading colon.
        let out = run_args(&[
            "pick",
            "--host",
            "127.0.0.1:1",
            "--hash-policy",
            r#"[{"header":{"header_name":":authority"}}]"#,
            "--header",
            ":authority:example.com",
        ])
        .unwrap();
        assert_eq!(out[0]["hash"], format!("{:016x}", key_hash("example.com")));
    }

    #[test]
    fn murmur_hash_2_rings_are_core_rings_with_that_function() {
        let mut args = vec!["pick", "--hash-function", "murmur-hash2"];
        args.extend_from_slice(&HOSTS);
        let keys: Vec<String> = (0..50).map(|i| format!("user-{i}")).collect();
        args.extend(keys.iter().map(String::as_str));
        let out = run_args(&args).unwrap();
        let config = RingConfig {
            hash_function: HashFunction::MurmurHash2,
            ..RingConfig::default()
        };
        let hosts = ["127.0.0.1:441", "127.0.0.1:442", "127.0.0.1:443"];
        let ring = Ring::build(hosts.map(|h| (h, 1)), &config).unwrap();
        let xx = Ring::build(hosts.map(|h| (h, 1)), &RingConfig::default()).unwrap();
        let mut differ = 0;
        for (k, line) in keys.iter().zip(&out) {
            let h = key_hash(k);
            assert_eq!(line["host"], ring.pick_host(h).key(), "{k}");
            differ += usize::from(ring.pick(h) != xx.pick(h));
        }
        assert!(differ > 0, "the hash function changes the ring");
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
