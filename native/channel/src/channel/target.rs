//! What a channel dials, as gRPC and tonic users write it: `xds:///NAME`
//! (a listener from the bootstrap's control plane), `static:///ADDR,...`
//! (fixed endpoints), gRPC's naming forms (`dns:[//SERVER/]HOST[:PORT]`,
//! `ipv4:`/`ipv6:` address lists, `unix:PATH`; a target with no scheme
//! gRPC knows is `dns:///TARGET`, as in gRPC), and tonic's
//! `http://HOST[:PORT]` and `https://HOST[:PORT]`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use super::config::{StaticConfig, StaticEndpoint};
use super::ChannelError;
use crate::lb::wrr_locality::EndpointPolicy;

/// The cluster name of a `static:///` target.
pub const STATIC_CLUSTER: &str = "static";

/// The port of a `dns:` name written without one (gRPC's naming doc).
pub const DNS_DEFAULT_PORT: u16 = 443;

const FORMS: &str = "use xds:///NAME, static:///ADDR[,ADDR...], dns:[//SERVER/]HOST[:PORT], \
                     ipv4:IP:PORT[,...], ipv6:[IP]:PORT[,...], unix:PATH, http://HOST[:PORT] or \
                     https://HOST[:PORT]";

/// What is wrong with a target ([`ChannelError::Target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetProblem {
    /// No `SCHEME:` before the rest.
    NoScheme,
    /// `SCHEME://AUTHORITY/...` where the scheme takes none (`xds:`: xDS
    /// federation, which tether does not support; `unix:`).
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
    /// A scheme tether does not know, and the target is not a `HOST[:PORT]`
    /// either (which would be `dns:///TARGET`).
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
    /// A `dns:` or `http(s)://` name's host is empty or not a host name
    /// or IP address.
    Host {
        /// The host given.
        host: String,
        /// Why.
        reason: String,
    },
    /// A port that is not a number from 1 to 65535.
    Port {
        /// The port given.
        port: String,
    },
    /// `dns://SERVER/...` whose SERVER is not `IP:PORT`.
    DnsServer {
        /// The server given.
        server: String,
    },
    /// An `ipv4:` or `ipv6:` list entry that is not an address of that
    /// family with a port (C-core requires the port).
    ListAddress {
        /// `ipv4` or `ipv6`.
        scheme: String,
        /// Its position, from 1.
        index: usize,
        /// The text given.
        text: String,
    },
    /// `unix:` with no path.
    EmptyPath,
    /// An `http(s)://` target with a path, query or user info, which
    /// tonic's `Endpoint` ignores or refuses.
    HttpExtra {
        /// The part given.
        part: String,
    },
}

impl std::fmt::Display for TargetProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetProblem::NoScheme => write!(f, "has no scheme ({FORMS})"),
            TargetProblem::Authority { scheme } if scheme == "xds" => write!(
                f,
                "names an authority ({scheme}://AUTHORITY/..., xDS federation), which tether \
                 does not support ({FORMS})"
            ),
            TargetProblem::Authority { scheme } => write!(
                f,
                "names an authority ({scheme}://AUTHORITY/...), which {scheme}: does not take \
                 ({scheme}:///PATH or {scheme}:PATH)"
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
            TargetProblem::Host { host, reason } => write!(f, "host {host:?} {reason}"),
            TargetProblem::Port { port } => {
                write!(f, "port {port:?} is not a number from 1 to 65535")
            }
            TargetProblem::DnsServer { server } => write!(
                f,
                "DNS server {server:?} is not IP:PORT (the port too, as gRPC C-core reads it: \
                 e.g. dns://127.0.0.1:53/NAME or dns://[::1]:53/NAME)"
            ),
            TargetProblem::ListAddress {
                scheme,
                index,
                text,
            } => {
                let example = if scheme == "ipv6" {
                    "[::1]:50051"
                } else {
                    "127.0.0.1:50051"
                };
                write!(
                    f,
                    "address {index} {text:?} is not an {} address with a port (e.g. \
                     {scheme}:{example}; gRPC requires the port)",
                    scheme.to_uppercase().replace('V', "v")
                )
            }
            TargetProblem::EmptyPath => {
                f.write_str("has no socket path (unix:PATH or unix:///PATH)")
            }
            TargetProblem::HttpExtra { part } => write!(
                f,
                "has {part:?} after HOST:PORT; an http(s) target is only scheme://HOST[:PORT]"
            ),
        }
    }
}

/// A name resolved by DNS: a `dns:` target, or an `http(s)://` one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DnsName {
    /// The DNS server to ask (`dns://SERVER/...`); the system's
    /// (resolv.conf) when `None`.
    pub server: Option<SocketAddr>,
    /// The host name, or an IP address (IPv6 without brackets).
    pub host: String,
    /// The port every resolved address gets.
    pub port: u16,
    /// The `:authority` calls carry unless the builder sets one: `HOST[:PORT]`
    /// as written, as C-core and tonic send it.
    pub authority: String,
}

/// A parsed target.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Target {
    /// `xds:///NAME`: the listener NAME, which also picks the virtual host.
    Xds {
        /// The listener's name.
        name: String,
    },
    /// `static:///ADDR,...`: round robin over those endpoints, one
    /// locality, priority 0, cluster `static`.
    Static(Box<StaticConfig>),
    /// `dns:[//SERVER/]HOST[:PORT]` (port 443 by default), or a target
    /// without a scheme gRPC knows (`dns:///TARGET`): every address the
    /// name resolves to is an endpoint.
    Dns(DnsName),
    /// `http://HOST[:PORT]` (`secure` false, port 80 by default) or
    /// `https://HOST[:PORT]` (TLS, port 443 by default), as tonic's
    /// `Endpoint` takes them: HOST resolved by the system's DNS.
    Http {
        /// `https`.
        secure: bool,
        /// The name and port.
        name: DnsName,
    },
    /// `ipv4:IP:PORT[,IP:PORT...]` or `ipv6:[IP]:PORT[,...]`: fixed
    /// addresses, each an endpoint.
    Addresses(Vec<SocketAddr>),
    /// `unix:PATH` (relative or absolute) or `unix:///PATH`: a Unix domain
    /// socket.
    Unix(PathBuf),
}

impl Target {
    /// Parses a target in any form tether takes (see [`Target`]). Errors
    /// name the target and what is wrong.
    pub fn parse(text: &str) -> Result<Target, ChannelError> {
        let err = |problem: TargetProblem| ChannelError::Target {
            target: text.to_owned(),
            problem,
        };
        let Some((scheme, rest)) = text.split_once(':') else {
            // gRPC: no scheme is `dns:///TARGET`.
            return parse_dns_name(text, None).map(Target::Dns).map_err(err);
        };
        match scheme {
            "xds" | "static" => {}
            "dns" => return parse_dns(rest).map(Target::Dns).map_err(err),
            "ipv4" | "ipv6" => return parse_list(scheme, rest).map(Target::Addresses).map_err(err),
            "unix" => return parse_unix(rest).map(Target::Unix).map_err(err),
            "http" | "https" => {
                return parse_http(scheme == "https", rest)
                    .map(|name| Target::Http {
                        secure: scheme == "https",
                        name,
                    })
                    .map_err(err)
            }
            _ => {
                // `localhost:50051` is `dns:///localhost:50051` in gRPC:
                // its "scheme" is no scheme gRPC knows.
                return parse_dns_name(text, None).map(Target::Dns).map_err(|_| {
                    err(TargetProblem::Scheme {
                        scheme: scheme.to_owned(),
                    })
                });
            }
        }
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
            _ => {
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
        }
    }
}

/// `[//SERVER/]HOST[:PORT]`, what follows `dns:`.
fn parse_dns(rest: &str) -> Result<DnsName, TargetProblem> {
    let Some(after) = rest.strip_prefix("//") else {
        return parse_dns_name(rest, None);
    };
    let (server, name) = after.split_once('/').unwrap_or((after, ""));
    let server = if server.is_empty() {
        None
    } else {
        Some(
            parse_server(server).ok_or_else(|| TargetProblem::DnsServer {
                server: server.to_owned(),
            })?,
        )
    };
    parse_dns_name(name, server)
}

/// A DNS server as gRPC's `dns://SERVER/` names it: `IP:PORT`, IPv6 in
/// brackets. C-core's c-ares resolver refuses a server without a port
/// (grpc-go would take 53); tether refuses it too.
fn parse_server(text: &str) -> Option<SocketAddr> {
    text.parse::<SocketAddr>().ok()
}

/// `HOST[:PORT]` (IPv6 hosts in brackets), port 443 by default.
fn parse_dns_name(text: &str, server: Option<SocketAddr>) -> Result<DnsName, TargetProblem> {
    let (host, port) = split_host_port(text)?;
    Ok(DnsName {
        server,
        host,
        port: port.unwrap_or(DNS_DEFAULT_PORT),
        authority: text.to_owned(),
    })
}

/// Splits `HOST[:PORT]` as C-core does: a bracketed IPv6 host, or a host
/// with at most one colon; an empty port is no port. The host is checked
/// to be a host name or an IP address.
fn split_host_port(text: &str) -> Result<(String, Option<u16>), TargetProblem> {
    let bad_host = |reason: &str| TargetProblem::Host {
        host: text.to_owned(),
        reason: reason.to_owned(),
    };
    let (host, port) = if let Some(inner) = text.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or_else(|| bad_host("has '[' without ']'"))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad_host(
                "has brackets around something not an IPv6 address",
            ));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| bad_host("has text after ']' that is not :PORT"))?,
            ),
        };
        (host, port)
    } else if text.matches(':').count() > 1 {
        // A bare IPv6 address, no port.
        if text.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad_host(
                "has several ':' but is not an IPv6 address (write [IPv6]:PORT)",
            ));
        }
        (text, None)
    } else {
        match text.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(TargetProblem::Host {
            host: text.to_owned(),
            reason: "has an empty host name".to_owned(),
        });
    }
    if host.parse::<IpAddr>().is_err() && !is_host_name(host) {
        return Err(TargetProblem::Host {
            host: host.to_owned(),
            reason: "is not a host name (letters, digits, '-', '_' and '.') or an IP address"
                .to_owned(),
        });
    }
    let port = match port {
        None | Some("") => None,
        Some(p) => Some(parse_port(p)?),
    };
    Ok((host.to_owned(), port))
}

fn parse_port(text: &str) -> Result<u16, TargetProblem> {
    match text.parse::<u16>() {
        Ok(p) if p > 0 && !text.starts_with('+') => Ok(p),
        _ => Err(TargetProblem::Port {
            port: text.to_owned(),
        }),
    }
}

/// Labels of letters, digits, `-` and `_`, dot-separated (a trailing dot:
/// an absolute name).
fn is_host_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// `IP:PORT[,IP:PORT...]` after `ipv4:` or `ipv6:` (IPv6 in brackets).
fn parse_list(scheme: &str, rest: &str) -> Result<Vec<SocketAddr>, TargetProblem> {
    // gRPC's sockaddr resolver takes the URI's path: `ipv4:///...` too.
    let list = rest
        .strip_prefix("//")
        .map_or(rest, |r| r.strip_prefix('/').unwrap_or(r));
    list.split(',')
        .enumerate()
        .map(|(i, text)| {
            let bad = || TargetProblem::ListAddress {
                scheme: scheme.to_owned(),
                index: i + 1,
                text: text.to_owned(),
            };
            let a: SocketAddr = text.parse().map_err(|_| bad())?;
            match (scheme, a) {
                ("ipv4", SocketAddr::V4(_)) | ("ipv6", SocketAddr::V6(_)) if a.port() != 0 => Ok(a),
                _ => Err(bad()),
            }
        })
        .collect()
}

/// `PATH` or `///PATH` after `unix:`.
fn parse_unix(rest: &str) -> Result<PathBuf, TargetProblem> {
    let path = match rest.strip_prefix("//") {
        Some(r) if r.starts_with('/') => r,
        Some(_) => {
            return Err(TargetProblem::Authority {
                scheme: "unix".to_owned(),
            })
        }
        None => rest,
    };
    if path.is_empty() {
        return Err(TargetProblem::EmptyPath);
    }
    Ok(PathBuf::from(path))
}

/// `//HOST[:PORT][/]` after `http:` or `https:`.
fn parse_http(secure: bool, rest: &str) -> Result<DnsName, TargetProblem> {
    let Some(after) = rest.strip_prefix("//") else {
        return Err(TargetProblem::Host {
            host: rest.to_owned(),
            reason: format!(
                "does not follow {}:// (scheme://HOST[:PORT])",
                if secure { "https" } else { "http" }
            ),
        });
    };
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, tail) = after.split_at(end);
    if !(tail.is_empty() || tail == "/") {
        return Err(TargetProblem::HttpExtra {
            part: tail.to_owned(),
        });
    }
    if let Some((user, _)) = authority.split_once('@') {
        return Err(TargetProblem::HttpExtra {
            part: format!("{user}@"),
        });
    }
    let (host, port) = split_host_port(authority)?;
    Ok(DnsName {
        server: None,
        host,
        port: port.unwrap_or(if secure { 443 } else { 80 }),
        authority: authority.to_owned(),
    })
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

    fn dns(server: Option<&str>, host: &str, port: u16, authority: &str) -> DnsName {
        DnsName {
            server: server.map(|s| s.parse().unwrap()),
            host: host.into(),
            port,
            authority: authority.into(),
        }
    }

    #[test]
    fn xds_and_static_targets() {
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
    }

    #[test]
    fn every_form_gives_what_it_names() {
        let sock = |s: &str| s.parse::<SocketAddr>().unwrap();
        for (text, want) in [
            (
                "dns:///echo.test:8080",
                Target::Dns(dns(None, "echo.test", 8080, "echo.test:8080")),
            ),
            (
                "dns:///echo.test",
                Target::Dns(dns(None, "echo.test", 443, "echo.test")),
            ),
            (
                "dns:echo.test:1",
                Target::Dns(dns(None, "echo.test", 1, "echo.test:1")),
            ),
            (
                "dns:echo.test:",
                Target::Dns(dns(None, "echo.test", 443, "echo.test:")),
            ),
            (
                "dns://127.0.0.1:5353/echo.test:50051",
                Target::Dns(dns(
                    Some("127.0.0.1:5353"),
                    "echo.test",
                    50051,
                    "echo.test:50051",
                )),
            ),
            (
                "dns://[::1]:54/a.b:2",
                Target::Dns(dns(Some("[::1]:54"), "a.b", 2, "a.b:2")),
            ),
            (
                "dns:///[::1]:7",
                Target::Dns(dns(None, "::1", 7, "[::1]:7")),
            ),
            ("dns:///::1", Target::Dns(dns(None, "::1", 443, "::1"))),
            (
                "dns:///127.0.0.1:9",
                Target::Dns(dns(None, "127.0.0.1", 9, "127.0.0.1:9")),
            ),
            (
                "dns:///name.with.dot.:9",
                Target::Dns(dns(None, "name.with.dot.", 9, "name.with.dot.:9")),
            ),
            // gRPC: no scheme it knows is dns:///TARGET.
            (
                "localhost:50051",
                Target::Dns(dns(None, "localhost", 50051, "localhost:50051")),
            ),
            (
                "shop.example",
                Target::Dns(dns(None, "shop.example", 443, "shop.example")),
            ),
            (
                "127.0.0.1:80",
                Target::Dns(dns(None, "127.0.0.1", 80, "127.0.0.1:80")),
            ),
            ("[::1]:80", Target::Dns(dns(None, "::1", 80, "[::1]:80"))),
            (
                "http://echo.test:50051",
                Target::Http {
                    secure: false,
                    name: dns(None, "echo.test", 50051, "echo.test:50051"),
                },
            ),
            (
                "http://echo.test",
                Target::Http {
                    secure: false,
                    name: dns(None, "echo.test", 80, "echo.test"),
                },
            ),
            (
                "http://[::1]:5/",
                Target::Http {
                    secure: false,
                    name: dns(None, "::1", 5, "[::1]:5"),
                },
            ),
            (
                "https://echo.test",
                Target::Http {
                    secure: true,
                    name: dns(None, "echo.test", 443, "echo.test"),
                },
            ),
            (
                "https://echo.test:8443",
                Target::Http {
                    secure: true,
                    name: dns(None, "echo.test", 8443, "echo.test:8443"),
                },
            ),
            (
                "ipv4:1.2.3.4:80,5.6.7.8:81",
                Target::Addresses(vec![sock("1.2.3.4:80"), sock("5.6.7.8:81")]),
            ),
            (
                "ipv4:///1.2.3.4:80",
                Target::Addresses(vec![sock("1.2.3.4:80")]),
            ),
            ("ipv6:[::1]:80", Target::Addresses(vec![sock("[::1]:80")])),
            (
                "ipv6:[::1]:80,[fe80::1]:81",
                Target::Addresses(vec![sock("[::1]:80"), sock("[fe80::1]:81")]),
            ),
            ("unix:/run/echo.sock", Target::Unix("/run/echo.sock".into())),
            ("unix:relative.sock", Target::Unix("relative.sock".into())),
            (
                "unix:///run/echo.sock",
                Target::Unix("/run/echo.sock".into()),
            ),
        ] {
            assert_eq!(Target::parse(text).unwrap(), want, "{text}");
        }
    }

    #[test]
    fn every_error_names_the_target_and_what_is_wrong() {
        for (bad, problem) in [
            ("xds://auth/x", "authority (xds://AUTHORITY"),
            ("xds:///", "empty name"),
            ("xds:x", "does not start with xds:///"),
            ("static:///", "address 1 \"\""),
            (
                "static:///127.0.0.1:1,localhost:2",
                "address 2 \"localhost:2\"",
            ),
            ("static:127.0.0.1:1", "static:///"),
            ("foo:bar", "the scheme \"foo\" is not supported"),
            ("a b", "host \"a b\" is not a host name"),
            ("", "empty host name"),
            ("dns:///", "empty host name"),
            ("dns:///:50051", "empty host name"),
            (
                "dns:///echo.test:x",
                "port \"x\" is not a number from 1 to 65535",
            ),
            ("dns:///echo.test:0", "port \"0\""),
            ("dns:///echo.test:65536", "port \"65536\""),
            (
                "dns:///ech o.test:1",
                "host \"ech o.test\" is not a host name",
            ),
            ("dns:///[::1:5", "has '[' without ']'"),
            (
                "dns:///[1.2.3.4]:5",
                "brackets around something not an IPv6",
            ),
            ("dns:///[::1]x", "text after ']'"),
            ("dns:///a:b:c", "several ':'"),
            (
                "dns://dns.example/echo.test",
                "DNS server \"dns.example\" is not IP:PORT",
            ),
            ("dns://1.2.3.4:x/echo.test", "DNS server \"1.2.3.4:x\""),
            (
                "dns://10.0.0.1/a.b",
                "DNS server \"10.0.0.1\" is not IP:PORT",
            ),
            ("dns://[::1]/a.b:2", "DNS server \"[::1]\" is not IP:PORT"),
            ("dns://127.0.0.1:53/", "empty host name"),
            (
                "ipv4:1.2.3.4",
                "address 1 \"1.2.3.4\" is not an IPv4 address with a port",
            ),
            (
                "ipv4:1.2.3.4:80,[::1]:80",
                "address 2 \"[::1]:80\" is not an IPv4",
            ),
            ("ipv4:", "address 1 \"\""),
            ("ipv4:1.2.3.4:0", "address 1 \"1.2.3.4:0\""),
            (
                "ipv6:::1",
                "address 1 \"::1\" is not an IPv6 address with a port",
            ),
            ("ipv6:1.2.3.4:80", "is not an IPv6"),
            ("unix:", "no socket path"),
            ("unix://host/x.sock", "unix: does not take"),
            ("http:echo.test", "does not follow http://"),
            ("http://echo.test:1/v1", "has \"/v1\" after HOST:PORT"),
            ("https://u@echo.test", "has \"u@\""),
            ("http://echo.test:99999", "port \"99999\""),
            ("http://", "empty host name"),
        ] {
            let e = Target::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(problem) && e.contains(&format!("target {bad:?}")),
                "{bad}: {e}"
            );
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
        assert_eq!(
            Target::parse("dns:///echo.test:x").unwrap_err(),
            ChannelError::Target {
                target: "dns:///echo.test:x".into(),
                problem: TargetProblem::Port { port: "x".into() },
            }
        );
    }
}
