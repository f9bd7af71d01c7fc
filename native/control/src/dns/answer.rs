//! What one resolution of a name (its A and AAAA queries together) said.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// The outcome of resolving one name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// Addresses, with the smallest TTL of the records that gave them.
    Addresses {
        /// Every IPv4 and IPv6 address.
        ips: BTreeSet<IpAddr>,
        /// How long the answer may be kept.
        ttl: Duration,
    },
    /// The servers answered, with no address: NXDOMAIN, or a name with no
    /// A or AAAA record.
    NoAddresses {
        /// The name does not exist (NXDOMAIN), rather than having no
        /// address records.
        nxdomain: bool,
        /// How long the servers say to keep the negative answer (the SOA's),
        /// when they say.
        negative_ttl: Option<Duration>,
    },
    /// No answer to go by: a timeout, SERVFAIL, REFUSED, an unreachable
    /// server.
    Failed {
        /// What went wrong, as the resolver says it.
        reason: String,
    },
}

impl Answer {
    /// Addresses with `ttl`.
    pub fn addresses(ips: impl IntoIterator<Item = IpAddr>, ttl: Duration) -> Answer {
        Answer::Addresses {
            ips: ips.into_iter().collect(),
            ttl,
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Addresses { ips, .. } => {
                let ips: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
                write!(f, "{}", ips.join(", "))
            }
            Answer::NoAddresses { nxdomain: true, .. } => f.write_str("NXDOMAIN (no such name)"),
            Answer::NoAddresses {
                nxdomain: false, ..
            } => f.write_str("no A or AAAA records"),
            Answer::Failed { reason } => write!(f, "no answer: {reason}"),
        }
    }
}
