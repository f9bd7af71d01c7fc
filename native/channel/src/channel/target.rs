//! What a channel dials: `xds:///NAME` (a listener from the bootstrap's
//! control plane) or `static:///ADDR[,ADDR...]` (round robin over fixed
//! endpoints, no control plane).

use std::net::SocketAddr;

use super::config::{StaticConfig, StaticEndpoint};
use super::ChannelError;
use crate::lb::wrr_locality::EndpointPolicy;

/// The cluster name of a `static:///` target.
pub const STATIC_CLUSTER: &str = "static";

const FORMS: &str = "use xds:///NAME or static:///ADDR[,ADDR...]";

/// What is wrong with a target ([`ChannelError::Target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetProblem {
    /// No `SCHEME:` before the rest.
    NoScheme,
    /// `SCHEME://AUTHORITY/...` (xDS federation), which tether does not support.
    Authority {
        /// The scheme given.
        scheme: String,
    },
    /// The rest does not start with `///`.
    NotTripleSlash {
        /// The scheme given.
        scheme: String,
    },
    /// `xds:///` with no listener name.
    EmptyName,
    /// A `static:///` address that is not IP:PORT.
    Address {
        /// Its position, from 1.
        index: usize,
        /// The text given.
        text: String,
    },
    /// A scheme other than `xds` and `static`.
    Scheme {
        /// The scheme given.
        scheme: String,
    },
    /// The `:authority` calls would carry is not valid.
    CallAuthority {
        /// The authority given.
        authority: String,
        /// Why (`http`'s parse error).
        reason: String,
    },
}

impl std::fmt::Display for TargetProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetProblem::NoScheme => write!(f, "has no scheme ({FORMS})"),
            TargetProblem::Authority { scheme } => write!(
                f,
                "names an authority ({scheme}://AUTHORITY/..., xDS federation), which tether \
                 does not support ({FORMS})"
            ),
            TargetProblem::NotTripleSlash { scheme } => {
                write!(f, "does not start with {scheme}:/// ({FORMS})")
            }
            TargetProblem::EmptyName => f.write_str("has an empty name (expected xds:///NAME)"),
            TargetProblem::Address { index, text } => write!(
                f,
                "address {index} {text:?} is not an IP:PORT address (no DNS: e.g. \
                 127.0.0.1:50051 or [::1]:50051)"
            ),
            TargetProblem::Scheme { scheme } => {
                write!(f, "the scheme {scheme:?} is not supported ({FORMS})")
            }
            TargetProblem::CallAuthority { authority, reason } => {
                write!(f, "authority {authority:?} is not valid: {reason}")
            }
        }
    }
}

/// A parsed target.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// `xds:///NAME`: the listener NAME, which also picks the virtual host.
    Xds {
        /// The listener's name.
        name: String,
    },
    /// `static:///ADDR,...`: round robin over those endpoints, one
    /// locality, priority 0, cluster `static`.
    Static(Box<StaticConfig>),
}

impl Target {
    /// Parses `xds:///NAME` or `static:///ADDR[,ADDR...]` (IP:PORT, IPv6 in
    /// brackets; no DNS). Errors name the target and what is wrong.
    pub fn parse(text: &str) -> Result<Target, ChannelError> {
        let err = |problem: TargetProblem| ChannelError::Target {
            target: text.to_owned(),
            problem,
        };
        let Some((scheme, rest)) = text.split_once(':') else {
            return Err(err(TargetProblem::NoScheme));
        };
        let Some(path) = rest.strip_prefix("///") else {
            let scheme = scheme.to_owned();
            return Err(err(if rest.starts_with("//") {
                TargetProblem::Authority { scheme }
            } else {
                TargetProblem::NotTripleSlash { scheme }
            }));
        };
        match scheme {
            "xds" if path.is_empty() => Err(err(TargetProblem::EmptyName)),
            "xds" => Ok(Target::Xds {
                name: path.to_owned(),
            }),
            "static" => {
                let endpoints = path
                    .split(',')
                    .enumerate()
                    .map(|(i, a)| {
                        a.parse::<SocketAddr>()
                            .map(StaticEndpoint::new)
                            .map_err(|_| {
                                err(TargetProblem::Address {
                                    index: i + 1,
                                    text: a.to_owned(),
                                })
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Target::Static(Box::new(StaticConfig {
                    cluster: STATIC_CLUSTER.to_owned(),
                    endpoints,
                    policy: EndpointPolicy::RoundRobin,
                    session: None,
                })))
            }
            _ => Err(err(TargetProblem::Scheme {
                scheme: scheme.to_owned(),
            })),
        }
    }
}

/// The `static:///` form of a static config (its endpoints' first addresses).
pub(crate) fn static_target(config: &StaticConfig) -> String {
    let addrs: Vec<String> = config
        .endpoints
        .iter()
        .filter_map(|e| e.addresses.first().map(ToString::to_string))
        .collect();
    format!("static:///{}", addrs.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_xds_names_or_static_lists() {
        assert_eq!(
            Target::parse("xds:///shop.example").unwrap(),
            Target::Xds {
                name: "shop.example".into()
            }
        );
        let Target::Static(c) = Target::parse("static:///127.0.0.1:1,[::1]:2").unwrap() else {
            panic!("not static");
        };
        assert_eq!(c.cluster, "static");
        assert_eq!(static_target(&c), "static:///127.0.0.1:1,[::1]:2");
        for (bad, problem) in [
            ("dns:///x", "scheme \"dns\""),
            ("shop.example", "no scheme"),
            ("xds://auth/x", "authority"),
            ("xds:///", "empty name"),
            ("static:///", "address 1 \"\""),
            (
                "static:///127.0.0.1:1,localhost:2",
                "address 2 \"localhost:2\"",
            ),
            ("static:127.0.0.1:1", "static:///"),
        ] {
            let e = Target::parse(bad).unwrap_err().to_string();
            assert!(e.contains(problem) && e.contains(bad), "{bad}: {e}");
        }
        // Typed, the text aside.
        assert_eq!(
            Target::parse("static:///127.0.0.1:1,localhost:2").unwrap_err(),
            ChannelError::Target {
                target: "static:///127.0.0.1:1,localhost:2".into(),
                problem: TargetProblem::Address {
                    index: 2,
                    text: "localhost:2".into()
                },
            }
        );
    }
}
