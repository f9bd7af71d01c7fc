//! Hash-based affinity, computed exactly as Envoy 1.40 computes it, so a key
//! lands on the same host whether Envoy or tether does the picking.
//!
//! - [`policy`]: Envoy's route `hash_policy` list (header, cookie, source IP,
//!   query parameter, filter state; `terminal`), evaluated against a plain
//!   view of the request. The result is explicit: [`RequestHash::Hash`] or
//!   [`RequestHash::NoHash`] ("the caller picks at random"), never a silent 0.
//!   A cookie policy with a `ttl` also yields the `Set-Cookie` Envoy would send.
//! - [`ring`]: the `RING_HASH` ring (gRFC A42 and Envoy build the same one).
//! - [`maglev`]: the `MAGLEV` lookup table.
//! - `rewrite` (feature `regex`): the header policy's `regex_rewrite`.
//!
//! Both tables are built once from `(host, weight)` pairs into an immutable
//! value; `pick(hash)` returns the index of the chosen host in the input. The
//! string a host is hashed by is its `ip:port` (IPv6 in brackets), or the
//! endpoint's `hash_key` metadata when the caller passes that instead.
//!
//! Every hash here is XXH64 with seed 0 of the bytes, as Envoy's `HashUtil`,
//! except ring entries of a ring configured with
//! [`HashFunction::MurmurHash2`], which Envoy hashes with [`murmur2`].

pub mod maglev;
pub mod policy;
#[cfg(feature = "regex")]
pub mod rewrite;
pub mod ring;

#[cfg(test)]
mod vectors;

use alloc::collections::BTreeSet;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
use core::net::SocketAddr;

pub use maglev::{Maglev, MaglevConfig};
pub use policy::{Evaluation, HashPolicies, HashPolicy, HashRequest, Headers, Peer, Source};
pub use ring::{HashFunction, Ring, RingConfig};

/// XXH64 of `bytes` with `seed`.
pub fn xxh64(bytes: &[u8], seed: u64) -> u64 {
    xxhash_rust::xxh64::xxh64(bytes, seed)
}

/// The seed Envoy passes to [`murmur2`] (its `MurmurHash::STD_HASH_SEED`).
pub const MURMUR2_SEED: u64 = 0xc70f_6907;

/// 64-bit MurmurHash2 as Envoy computes it for `hash_function: MURMUR_HASH_2`
/// (the byte hash of libstdc++'s `std::hash` on 64-bit targets): 8-byte
/// little-endian blocks, the tail read as a little-endian number, seed mixed
/// with the length.
pub fn murmur2(bytes: &[u8], seed: u64) -> u64 {
    const MUL: u64 = 0xc6a4_a793_5bd1_e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut hash = seed ^ (bytes.len() as u64).wrapping_mul(MUL);
    let mut blocks = bytes.chunks_exact(8);
    for block in &mut blocks {
        let mut word = [0u8; 8];
        word.copy_from_slice(block);
        let data = shift_mix(u64::from_le_bytes(word).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash = (hash ^ data).wrapping_mul(MUL);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let data = tail
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        hash = (hash ^ data).wrapping_mul(MUL);
    }
    shift_mix(shift_mix(hash).wrapping_mul(MUL))
}

/// The hash of a key as Envoy's header hash policy computes it for a single
/// header value: XXH64 of its bytes, seed 0.
pub fn key_hash(key: &str) -> u64 {
    xxh64(key.as_bytes(), 0)
}

/// Folds `next` into an accumulated policy hash the way Envoy does:
/// `rotl64(hash, 1) ^ next`, where the first hash is taken as is. Rotating
/// keeps two identical policies from cancelling each other out.
pub fn combine(acc: Option<u64>, next: u64) -> u64 {
    match acc {
        Some(h) => h.rotate_left(1) ^ next,
        None => next,
    }
}

/// The outcome of evaluating hash policies for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestHash {
    /// The request hashes to this value: pick with it.
    Hash(u64),
    /// No policy produced a hash: the caller picks a host at random (what
    /// Envoy's ring hash and Maglev balancers do).
    NoHash,
}

impl RequestHash {
    /// The hash, if there is one.
    pub fn value(self) -> Option<u64> {
        match self {
            RequestHash::Hash(h) => Some(h),
            RequestHash::NoHash => None,
        }
    }
}

/// One upstream host as the hashing tables see it: the string it is hashed by
/// and its weight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Host {
    key: String,
    weight: u32,
}

impl Host {
    /// A host hashed by `key`: its `ip:port` as Envoy prints it
    /// (`127.0.0.1:80`, `[::1]:80`) or its `hash_key` metadata.
    pub fn new(key: impl Into<String>, weight: u32) -> Self {
        Host {
            key: key.into(),
            weight,
        }
    }

    /// A host hashed by its socket address.
    pub fn from_addr(addr: SocketAddr, weight: u32) -> Self {
        Host::new(addr.to_string(), weight)
    }

    /// The string the host is hashed by.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The host's weight (at least 1 once a table accepted it).
    pub fn weight(&self) -> u32 {
        self.weight
    }
}

impl From<(SocketAddr, u32)> for Host {
    fn from((addr, weight): (SocketAddr, u32)) -> Self {
        Host::from_addr(addr, weight)
    }
}

impl From<(&str, u32)> for Host {
    fn from((key, weight): (&str, u32)) -> Self {
        Host::new(key, weight)
    }
}

impl From<(String, u32)> for Host {
    fn from((key, weight): (String, u32)) -> Self {
        Host::new(key, weight)
    }
}

/// Why a ring or a Maglev table could not be built. Each message names the
/// field and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// No hosts were given.
    EmptyHostSet,
    /// A host has weight 0 (Envoy requires `load_balancing_weight` ≥ 1).
    ZeroWeight {
        /// The host's key.
        host: String,
    },
    /// A host's key is empty.
    EmptyKey {
        /// Its position in the input.
        index: usize,
    },
    /// Two hosts hash by the same key, so their entries would collide.
    DuplicateHost {
        /// The repeated key.
        host: String,
    },
    /// The weights add up to more than `u32::MAX` (Envoy's limit).
    WeightSum {
        /// The sum.
        sum: u64,
    },
    /// The locality weights add up to more than `u32::MAX` (Envoy's limit).
    LocalityWeightSum {
        /// The sum.
        sum: u64,
    },
    /// A ring size bound is out of range.
    RingSize {
        /// `minimum_ring_size`, `maximum_ring_size` or `ring_size_cap`.
        field: &'static str,
        /// The rejected value.
        value: u64,
    },
    /// `minimum_ring_size` is above `maximum_ring_size`.
    RingSizeOrder {
        /// `minimum_ring_size`.
        min: u64,
        /// `maximum_ring_size`.
        max: u64,
    },
    /// The Maglev `table_size` is not a prime in range.
    TableSize {
        /// The rejected value.
        value: u64,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::EmptyHostSet => f.write_str("hosts: the host set is empty"),
            BuildError::ZeroWeight { host } => {
                write!(f, "hosts: {host:?} has weight 0 (weights start at 1)")
            }
            BuildError::EmptyKey { index } => write!(f, "hosts[{index}]: \"\" is an empty key"),
            BuildError::DuplicateHost { host } => {
                write!(f, "hosts: {host:?} appears more than once")
            }
            BuildError::WeightSum { sum } => {
                write!(f, "hosts: weights add up to {sum}, above {}", u32::MAX)
            }
            BuildError::LocalityWeightSum { sum } => {
                write!(f, "localities: weights add up to {sum}, above {}", u32::MAX)
            }
            BuildError::RingSize { field, value } => {
                write!(f, "{field}: {value} is outside 1..={}", ring::MAX_RING_SIZE)
            }
            BuildError::RingSizeOrder { min, max } => write!(
                f,
                "minimum_ring_size: {min} is above maximum_ring_size {max}"
            ),
            BuildError::TableSize { value } => write!(
                f,
                "table_size: {value} is not a prime number in 2..={}",
                maglev::MAX_TABLE_SIZE
            ),
        }
    }
}

/// Hosts with their normalised weights (`w / Σw`), as Envoy computes them,
/// and the smallest and largest of those.
pub(crate) struct Normalized {
    pub(crate) hosts: Vec<Host>,
    pub(crate) weights: Vec<f64>,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

/// Checks a host set and normalises its weights.
pub(crate) fn normalize<I, H>(hosts: I) -> Result<Normalized, BuildError>
where
    I: IntoIterator<Item = H>,
    H: Into<Host>,
{
    let hosts: Vec<Host> = hosts.into_iter().map(Into::into).collect();
    let sum = check_hosts(&hosts, 0, &mut BTreeSet::new())?;
    let mut n = Normalized::with_capacity(hosts.len());
    n.push_locality(hosts, sum, 1.0);
    n.non_empty()
}

/// Checks `hosts` (laid out from position `offset`): keys non-empty and
/// unique across every call sharing `seen`, weights at least 1 and adding up
/// to at most `u32::MAX`; returns that sum.
fn check_hosts<'a>(
    hosts: &'a [Host],
    offset: usize,
    seen: &mut BTreeSet<&'a str>,
) -> Result<u64, BuildError> {
    let mut sum = 0u64;
    for (i, h) in hosts.iter().enumerate() {
        if h.key.is_empty() {
            return Err(BuildError::EmptyKey { index: offset + i });
        }
        if h.weight == 0 {
            return Err(BuildError::ZeroWeight {
                host: h.key.clone(),
            });
        }
        if !seen.insert(h.key.as_str()) {
            return Err(BuildError::DuplicateHost {
                host: h.key.clone(),
            });
        }
        sum += u64::from(h.weight);
    }
    if sum > u64::from(u32::MAX) {
        return Err(BuildError::WeightSum { sum });
    }
    Ok(sum)
}

/// A locality's name as EDS gives it. Ordered field by field (region, then
/// zone, then sub-zone), as gRPC orders localities.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalityName {
    /// `region`.
    pub region: String,
    /// `zone`.
    pub zone: String,
    /// `sub_zone`.
    pub sub_zone: String,
}

impl fmt::Display for LocalityName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{region={:?}, zone={:?}, sub_zone={:?}}}",
            self.region, self.zone, self.sub_zone
        )
    }
}

/// The hosts of one locality and the locality's weight (EDS
/// `LocalityLbEndpoints.load_balancing_weight`), for rings and Maglev tables
/// over localities: as Envoy builds them with `locality_weighted_lb_config`
/// ([`Ring::build_localities`]), or as gRPC weighs them for ring hash
/// ([`Locality::grpc_hosts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locality {
    /// The locality's name (gRPC orders localities by it).
    pub name: LocalityName,
    /// The locality's weight; 0 leaves its hosts out.
    pub weight: u32,
    /// Its hosts, in order.
    pub hosts: Vec<Host>,
}

impl Locality {
    /// An unnamed locality of `weight` with `hosts`.
    pub fn new<I, H>(weight: u32, hosts: I) -> Self
    where
        I: IntoIterator<Item = H>,
        H: Into<Host>,
    {
        Locality {
            name: LocalityName::default(),
            weight,
            hosts: hosts.into_iter().map(Into::into).collect(),
        }
    }

    /// The same locality, named.
    pub fn named(mut self, region: &str, zone: &str, sub_zone: &str) -> Self {
        self.name = LocalityName {
            region: region.to_string(),
            zone: zone.to_string(),
            sub_zone: sub_zone.to_string(),
        };
        self
    }

    /// The hosts a gRPC ring hash is built over (gRFC A42 as gRPC C-core
    /// does it, observed with grpcio): localities in name order (not the
    /// order EDS lists them in), a locality of weight 0 left out, each
    /// host weighing its weight × its locality's weight (not Envoy's share
    /// within the locality). Build the ring with [`Ring::build`] and
    /// [`RingConfig::grpc`].
    pub fn grpc_hosts(localities: &[Locality]) -> Result<Vec<Host>, BuildError> {
        let mut ordered: Vec<&Locality> = localities.iter().filter(|l| l.weight != 0).collect();
        ordered.sort_by(|a, b| a.name.cmp(&b.name));
        let mut hosts = Vec::new();
        for l in ordered {
            for h in &l.hosts {
                let weight =
                    h.weight
                        .checked_mul(l.weight)
                        .ok_or_else(|| BuildError::WeightSum {
                            sum: u64::from(h.weight) * u64::from(l.weight),
                        })?;
                hosts.push(Host::new(h.key.clone(), weight));
            }
        }
        Ok(hosts)
    }
}

/// Checks localities and normalises their hosts' weights as Envoy does with
/// locality weighting: a host's weight is `w × (lw / Σlw) / Σw` over its
/// locality; hosts come locality by locality, in order.
pub(crate) fn normalize_localities(localities: &[Locality]) -> Result<Normalized, BuildError> {
    let sum: u64 = localities.iter().map(|l| u64::from(l.weight)).sum();
    if sum > u64::from(u32::MAX) {
        return Err(BuildError::LocalityWeightSum { sum });
    }
    let mut n = Normalized::with_capacity(localities.iter().map(|l| l.hosts.len()).sum());
    let mut seen = BTreeSet::new();
    for l in localities.iter().filter(|l| l.weight != 0) {
        let host_sum = check_hosts(&l.hosts, n.hosts.len(), &mut seen)?;
        let share = f64::from(l.weight) / sum as f64;
        n.push_locality(l.hosts.clone(), host_sum, share);
    }
    n.non_empty()
}

impl Normalized {
    /// No hosts yet (min and max start where Envoy's do), room for `n`.
    fn with_capacity(n: usize) -> Normalized {
        Normalized {
            hosts: Vec::with_capacity(n),
            weights: Vec::with_capacity(n),
            min: 1.0,
            max: 0.0,
        }
    }

    /// Adds checked `hosts` (weights adding up to `sum`) with weights
    /// `w × share / sum`: the operations and order of Envoy's
    /// normalizeHostWeights, so the doubles (and so the tables) come out bit
    /// for bit identical.
    fn push_locality(&mut self, hosts: Vec<Host>, sum: u64, share: f64) {
        let total = sum as f64;
        for h in hosts {
            let w = f64::from(h.weight) * share / total;
            self.min = self.min.min(w);
            self.max = self.max.max(w);
            self.weights.push(w);
            self.hosts.push(h);
        }
    }

    fn non_empty(self) -> Result<Normalized, BuildError> {
        if self.hosts.is_empty() {
            Err(BuildError::EmptyHostSet)
        } else {
            Ok(self)
        }
    }
}

/// `ceil` for finite non-negative doubles (`f64::ceil` needs std).
pub(crate) fn ceil(x: f64) -> f64 {
    // From 2^52 on every double is an integer.
    if x >= 4_503_599_627_370_496.0 {
        return x;
    }
    let t = x as u64 as f64;
    if t < x {
        t + 1.0
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn xxh64_vectors_from_envoy() {
        assert_eq!(key_hash("foo"), 0x33bf00a859c4ba3f);
        assert_eq!(key_hash("bar"), 0x48a37c90ad27a659);
        assert_eq!(key_hash(""), 0xef46db3751d8e999);
        assert_eq!(key_hash("user-42"), 0x397e9d3a76af7c81);
        assert_eq!(key_hash("127.0.0.1:441_0"), 0xe381ee9ca3e023a5);
    }

    #[test]
    fn combine_rotates_then_xors() {
        let foo = key_hash("foo");
        let bar = key_hash("bar");
        assert_eq!(combine(None, foo), foo);
        assert_eq!(combine(Some(foo), bar), 0x2fdd7dc01eaed227);
        assert_eq!(combine(Some(foo), foo), 0x54c101f8ea4dce41);
        // The top bit wraps around.
        assert_eq!(combine(Some(1 << 63), 0), 1);
    }

    #[test]
    fn host_set_errors_name_the_host() {
        let e = normalize([("a:1", 1), ("b:1", 0)]).err().unwrap();
        assert_eq!(
            e.to_string(),
            "hosts: \"b:1\" has weight 0 (weights start at 1)"
        );
        let e = normalize([("a:1", 1), ("a:1", 2)]).err().unwrap();
        assert_eq!(e, BuildError::DuplicateHost { host: "a:1".into() });
        assert_eq!(
            normalize([("", 1)]).err().unwrap().to_string(),
            "hosts[0]: \"\" is an empty key"
        );
        assert_eq!(
            normalize(Vec::<Host>::new()).err().unwrap(),
            BuildError::EmptyHostSet
        );
        let e = normalize([("a:1", u32::MAX), ("b:1", 1)]).err().unwrap();
        assert_eq!(e, BuildError::WeightSum { sum: 1 << 32 });
    }

    #[test]
    fn hosts_from_addresses_print_as_envoy_does() {
        let v4: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let v6: SocketAddr = "[::1]:8080".parse().unwrap();
        let hosts: Vec<Host> = vec![(v4, 1).into(), (v6, 2).into()];
        assert_eq!(hosts[0].key(), "127.0.0.1:80");
        assert_eq!(hosts[1].key(), "[::1]:8080");
        assert_eq!(hosts[1].weight(), 2);
    }

    #[test]
    fn ceil_matches_integer_rounding_up() {
        for (x, c) in [
            (0.0, 0.0),
            (0.1, 1.0),
            (1.0, 1.0),
            (85.333, 86.0),
            (1e300, 1e300),
        ] {
            assert_eq!(ceil(x), c, "{x}");
        }
    }

    #[test]
    fn localities_weigh_hosts_by_their_share() {
        let hosts = [("10.0.0.1:80", 1), ("10.0.0.2:80", 3)];
        // One locality: the same weights as no locality at all.
        let one = normalize_localities(&[Locality::new(7, hosts)]).unwrap();
        let flat = normalize(hosts).unwrap();
        assert_eq!(one.weights, flat.weights);
        assert_eq!(one.hosts, flat.hosts);
        // Locality b has three times a's weight; within a locality the host
        // weights split its share.
        let n = normalize_localities(&[
            Locality::new(1, [("a1:1", 1), ("a2:1", 1)]),
            Locality::new(0, [("z:1", 5)]),
            Locality::new(3, [("b1:1", 1)]),
        ])
        .unwrap();
        let keys: Vec<&str> = n.hosts.iter().map(Host::key).collect();
        assert_eq!(keys, ["a1:1", "a2:1", "b1:1"], "weight 0 leaves z out");
        assert_eq!(n.weights, [0.125, 0.125, 0.75]);
        assert_eq!((n.min, n.max), (0.125, 0.75));
        let ring = Ring::build_localities(
            &[
                Locality::new(1, [("a1:1", 1), ("a2:1", 1)]),
                Locality::new(3, [("b1:1", 1)]),
            ],
            &RingConfig::default(),
        )
        .unwrap();
        // The lightest host gets ceil(0.125 × 1024) = 128 entries; 1,024 in all.
        assert_eq!(ring.entries_per_host(), [128, 128, 768]);
        let table = Maglev::build_localities(
            &[
                Locality::new(1, [("a:1", 1)]),
                Locality::new(1, [("b:1", 1)]),
            ],
            &MaglevConfig::default(),
        )
        .unwrap();
        assert_eq!(table.len(), 65537);
    }

    #[test]
    fn grpc_hosts_multiply_weights_and_order_localities_by_name() {
        let hosts = Locality::grpc_hosts(&[
            Locality::new(1, [("b0:1", 3), ("b2:1", 4)]).named("us", "b", ""),
            Locality::new(0, [("z:1", 1)]).named("aa", "", ""),
            Locality::new(2, [("b1:1", 3), ("b3:1", 2)]).named("us", "a", ""),
            // Field by field: region "us" sorts before "us-east", although
            // "us-east/..." sorts before "us/..." as text.
            Locality::new(1, [("e:1", 1)]).named("us-east", "a", ""),
        ])
        .unwrap();
        let got: Vec<(&str, u32)> = hosts.iter().map(|h| (h.key(), h.weight())).collect();
        assert_eq!(
            got,
            [
                ("b1:1", 6),
                ("b3:1", 4),
                ("b0:1", 3),
                ("b2:1", 4),
                ("e:1", 1)
            ]
        );
        assert_eq!(
            Locality::grpc_hosts(&[Locality::new(u32::MAX, [("a:1", 2)])])
                .unwrap_err()
                .to_string(),
            "hosts: weights add up to 8589934590, above 4294967295"
        );
    }

    #[test]
    fn locality_errors_name_what_is_wrong() {
        let err = |l: &[Locality]| normalize_localities(l).err().unwrap().to_string();
        assert_eq!(
            err(&[Locality::new(0, [("a:1", 1)])]),
            "hosts: the host set is empty"
        );
        assert_eq!(err(&[]), "hosts: the host set is empty");
        assert_eq!(
            err(&[
                Locality::new(1, [("a:1", 1)]),
                Locality::new(1, [("a:1", 1)])
            ]),
            "hosts: \"a:1\" appears more than once"
        );
        assert_eq!(
            err(&[
                Locality::new(u32::MAX, [("a:1", 1)]),
                Locality::new(1, [("b:1", 1)])
            ]),
            "localities: weights add up to 4294967296, above 4294967295"
        );
        assert_eq!(
            err(&[Locality::new(1, [("a:1", 1)]), Locality::new(1, [("", 1)])]),
            "hosts[1]: \"\" is an empty key"
        );
    }
}
