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
        let err = |problem: String| ChannelError::Target {
            target: text.to_owned(),
            problem,
        };
        let Some((scheme, rest)) = text.split_once(':') else {
            return Err(err(format!("has no scheme ({FORMS})")));
        };
        let Some(path) = rest.strip_prefix("///") else {
            return Err(err(if rest.starts_with("//") {
                format!(
                    "names an authority ({scheme}://AUTHORITY/..., xDS federation), which tether \
                     does not support ({FORMS})"
                )
            } else {
                format!("does not start with {scheme}:/// ({FORMS})")
            }));
        };
        match scheme {
            "xds" if path.is_empty() => Err(err("has an empty name (expected xds:///NAME)".into())),
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
                                err(format!(
                                    "address {} {a:?} is not an IP:PORT address (no DNS: e.g. \
                                 127.0.0.1:50051 or [::1]:50051)",
                                    i + 1
                                ))
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
            _ => Err(err(format!(
                "the scheme {scheme:?} is not supported ({FORMS})"
            ))),
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
    }
}
