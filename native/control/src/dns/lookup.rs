//! The queries: A and AAAA for a name, through hickory's resolver, from
//! the file's servers (UDP, TCP when an answer is truncated) or the
//! system's resolv.conf, read into an [`Answer`].
//!
//! The resolver's own cache is off: the refresh schedule is the names'
//! ([`super::NameState`]), and a cached answer would hide a change past
//! `maxRefresh`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;

use super::{Answer, DnsSettings};

/// A resolver for the names of one file.
#[derive(Clone)]
pub struct Lookup {
    resolver: TokioResolver,
    /// Whom it asks, for messages.
    servers: String,
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookup")
            .field("servers", &self.servers)
            .finish()
    }
}

impl Lookup {
    /// A resolver asking `settings.servers`, or the system's servers when
    /// there are none; an error says why the system's configuration could
    /// not be read. Must be called within a Tokio runtime, the one its
    /// queries run on.
    pub fn new(settings: &DnsSettings) -> Result<Lookup, String> {
        let provider = TokioRuntimeProvider::default();
        let (mut builder, servers) = if settings.servers.is_empty() {
            let b = TokioResolver::builder(provider)
                .map_err(|e| format!("cannot read the system's DNS configuration: {e}"))?;
            (b, "the system's DNS servers (resolv.conf)".to_owned())
        } else {
            let name_servers = settings
                .servers
                .iter()
                .map(|s| {
                    let mut c = NameServerConfig::udp_and_tcp(s.ip());
                    for conn in &mut c.connections {
                        conn.port = s.port();
                    }
                    c
                })
                .collect();
            let b = TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(name_servers),
                provider,
            );
            let list: Vec<String> = settings.servers.iter().map(|s| s.to_string()).collect();
            (b, list.join(", "))
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = settings.timeout;
        opts.cache_size = 0;
        if !settings.servers.is_empty() {
            // The file's servers are the whole truth; the system's hosts
            // file is read only with the system's servers, as the system does.
            opts.use_hosts_file = ResolveHosts::Never;
        }
        let resolver = builder
            .build()
            .map_err(|e| format!("cannot start a DNS resolver: {e}"))?;
        Ok(Lookup { resolver, servers })
    }

    /// Whom it asks: the servers' addresses, or the system's.
    pub fn servers(&self) -> &str {
        &self.servers
    }

    /// Resolves `host`: its A and AAAA records, both asked at once.
    pub async fn resolve(&self, host: &str) -> Answer {
        self.resolver.clear_cache();
        let (v4, v6) = tokio::join!(
            self.resolver.lookup(host, RecordType::A),
            self.resolver.lookup(host, RecordType::AAAA)
        );
        combine(family(v4), family(v6))
    }
}

/// One query's outcome.
enum Family {
    Records(BTreeSet<IpAddr>, Duration),
    Empty {
        nxdomain: bool,
        negative_ttl: Option<Duration>,
    },
    Failed(String),
}

fn family(r: Result<hickory_resolver::lookup::Lookup, NetError>) -> Family {
    match r {
        Ok(lookup) => {
            let mut ips = BTreeSet::new();
            let mut ttl = u32::MAX;
            for record in lookup.answers() {
                let ip = match &record.data {
                    RData::A(a) => IpAddr::V4(a.0),
                    RData::AAAA(a) => IpAddr::V6(a.0),
                    _ => continue,
                };
                ips.insert(ip);
                ttl = ttl.min(record.ttl);
            }
            if ips.is_empty() {
                Family::Empty {
                    nxdomain: false,
                    negative_ttl: None,
                }
            } else {
                Family::Records(ips, Duration::from_secs(u64::from(ttl)))
            }
        }
        Err(NetError::Dns(DnsError::NoRecordsFound(nr))) => Family::Empty {
            nxdomain: nr.response_code == ResponseCode::NXDomain,
            negative_ttl: nr.negative_ttl.map(|t| Duration::from_secs(u64::from(t))),
        },
        Err(e) => Family::Failed(e.to_string()),
    }
}

/// Both queries must be answered (records or none): a failure of either
/// is no answer, so a flaky AAAA never drains the IPv6 addresses.
fn combine(v4: Family, v6: Family) -> Answer {
    match (v4, v6) {
        (Family::Failed(a), Family::Failed(b)) if a == b => Answer::Failed { reason: a },
        (Family::Failed(a), Family::Failed(b)) => Answer::Failed {
            reason: format!("A: {a}; AAAA: {b}"),
        },
        (Family::Failed(a), _) => Answer::Failed {
            reason: format!("A: {a}"),
        },
        (_, Family::Failed(b)) => Answer::Failed {
            reason: format!("AAAA: {b}"),
        },
        (Family::Records(mut a, ta), Family::Records(b, tb)) => {
            a.extend(b);
            Answer::Addresses {
                ips: a,
                ttl: ta.min(tb),
            }
        }
        (Family::Records(ips, ttl), Family::Empty { .. })
        | (Family::Empty { .. }, Family::Records(ips, ttl)) => Answer::Addresses { ips, ttl },
        (
            Family::Empty {
                nxdomain: na,
                negative_ttl: ta,
            },
            Family::Empty {
                nxdomain: nb,
                negative_ttl: tb,
            },
        ) => Answer::NoAddresses {
            nxdomain: na || nb,
            negative_ttl: match (ta, tb) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        },
    }
}
