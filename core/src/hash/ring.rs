//! The consistent-hash ring of Envoy's `RING_HASH` balancer (and gRFC A42).
//!
//! Built as Envoy builds it, so that the same hash picks the same host:
//! 1. weights are normalised, `w / Σw`, in the order the hosts are given
//!    (Envoy's order: the cluster's hosts as configured);
//! 2. `scale = min(ceil(min_w × minimum_ring_size) / min_w, maximum_ring_size)`,
//!    so the lightest host gets a whole number of entries;
//! 3. walking the hosts with running sums (`target += scale × w`), each host
//!    pushes XXH64(`"<key>_<n>"`) for n = 0, 1, ... while `current < target`
//!    (MurmurHash2 instead with Envoy's `hash_function: MURMUR_HASH_2`);
//! 4. entries are sorted by hash; a pick is the first entry whose hash is
//!    ≥ the request's hash, wrapping to the first entry.
//!
//! gRPC caps both ring sizes at 4096 by default (a channel argument);
//! [`RingConfig::grpc`] applies that cap. With one locality, equal weights,
//! the same host order and at most 4096 entries, Envoy and gRPC build the
//! same ring.

use alloc::vec::Vec;

use super::{
    ceil, murmur2, normalize, normalize_localities, xxh64, BuildError, Host, Locality, Normalized,
    MURMUR2_SEED,
};

/// Envoy's default `minimum_ring_size`.
pub const DEFAULT_MIN_RING_SIZE: u64 = 1024;
/// Envoy's default (and largest allowed) `maximum_ring_size`.
pub const MAX_RING_SIZE: u64 = 8_388_608;
/// gRPC's default `ring_size_cap`.
pub const GRPC_RING_SIZE_CAP: u64 = 4096;

/// How ring entries are hashed (Envoy's `RingHashLbConfig.hash_function`).
/// Request hashes are XXH64 either way: this only changes the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HashFunction {
    /// `XX_HASH`: XXH64, seed 0 (Envoy's default; the only one gRPC accepts).
    #[default]
    XxHash,
    /// `MURMUR_HASH_2`: [`murmur2`] with Envoy's seed (Envoy only).
    MurmurHash2,
}

impl HashFunction {
    fn hash(self, key: &[u8]) -> u64 {
        match self {
            HashFunction::XxHash => xxh64(key, 0),
            HashFunction::MurmurHash2 => murmur2(key, MURMUR2_SEED),
        }
    }
}

/// Ring size bounds (Envoy's `RingHashLbConfig`, gRPC's `ring_hash_experimental`)
/// and the hash of its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RingConfig {
    /// Lower bound on the number of entries (default 1024).
    pub minimum_ring_size: u64,
    /// Upper bound on the number of entries (default 8388608).
    pub maximum_ring_size: u64,
    /// gRPC's cap applied to both bounds; `None` in Envoy.
    pub ring_size_cap: Option<u64>,
    /// How entries are hashed (default XXH64).
    pub hash_function: HashFunction,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            minimum_ring_size: DEFAULT_MIN_RING_SIZE,
            maximum_ring_size: MAX_RING_SIZE,
            ring_size_cap: None,
            hash_function: HashFunction::XxHash,
        }
    }
}

impl RingConfig {
    /// Envoy's defaults with `minimum_ring_size` set.
    pub fn with_min(minimum_ring_size: u64) -> Self {
        RingConfig {
            minimum_ring_size,
            ..RingConfig::default()
        }
    }

    /// gRPC C-core's behaviour: the same bounds, capped at 4096 entries.
    pub fn grpc() -> Self {
        RingConfig {
            ring_size_cap: Some(GRPC_RING_SIZE_CAP),
            ..RingConfig::default()
        }
    }

    /// Checks the bounds; returns the effective `(min, max)` after the cap.
    pub fn validate(&self) -> Result<(u64, u64), BuildError> {
        let in_range = |field: &'static str, value: u64| {
            if (1..=MAX_RING_SIZE).contains(&value) {
                Ok(value)
            } else {
                Err(BuildError::RingSize { field, value })
            }
        };
        let min = in_range("minimum_ring_size", self.minimum_ring_size)?;
        let max = in_range("maximum_ring_size", self.maximum_ring_size)?;
        if min > max {
            return Err(BuildError::RingSizeOrder { min, max });
        }
        match self.ring_size_cap {
            None => Ok((min, max)),
            Some(cap) => {
                let cap = in_range("ring_size_cap", cap)?;
                Ok((min.min(cap), max.min(cap)))
            }
        }
    }
}

/// An immutable ring. Picks never fail: a ring always has at least one entry.
#[derive(Debug, Clone)]
pub struct Ring {
    /// Entry hashes, ascending; kept apart from `owners` so the binary search
    /// touches only the hashes.
    hashes: Vec<u64>,
    /// `owners[i]` is the index (into `hosts`) of the host of entry `i`.
    owners: Vec<u32>,
    hosts: Vec<Host>,
    /// `starts[b]`: the first entry whose hash's top `bucket_bits` bits are
    /// ≥ `b` (one more for the end), so a pick searches one bucket, about
    /// one entry, instead of the whole ring.
    starts: Vec<u32>,
    bucket_bits: u32,
}

/// The bucket index of ascending `hashes`: about one entry a bucket, at
/// most 2^16 buckets.
fn bucket_starts(hashes: &[u64]) -> (Vec<u32>, u32) {
    let bits = (usize::BITS - hashes.len().max(2).saturating_sub(1).leading_zeros()).clamp(1, 16);
    let buckets = 1usize << bits;
    let mut starts = Vec::with_capacity(buckets + 1);
    let mut i = 0;
    for b in 0..buckets {
        while i < hashes.len() && ((hashes[i] >> (64 - bits)) as usize) < b {
            i += 1;
        }
        // A ring has at most u32::MAX entries (the owners are u32).
        starts.push(i as u32);
    }
    starts.push(hashes.len() as u32);
    (starts, bits)
}

impl Ring {
    /// Builds the ring over `hosts` in the given order.
    pub fn build<I, H>(hosts: I, config: &RingConfig) -> Result<Ring, BuildError>
    where
        I: IntoIterator<Item = H>,
        H: Into<Host>,
    {
        let (min_size, max_size) = config.validate()?;
        Ring::from_normalized(normalize(hosts)?, min_size, max_size, config)
    }

    /// Builds the ring over `localities` as Envoy does for a cluster with
    /// `locality_weighted_lb_config`: hosts weighted by their locality's share
    /// (see [`Locality`]), locality by locality; a locality of weight 0 is
    /// left out.
    pub fn build_localities(
        localities: &[Locality],
        config: &RingConfig,
    ) -> Result<Ring, BuildError> {
        let (min_size, max_size) = config.validate()?;
        Ring::from_normalized(
            normalize_localities(localities)?,
            min_size,
            max_size,
            config,
        )
    }

    fn from_normalized(
        n: Normalized,
        min_size: u64,
        max_size: u64,
        config: &RingConfig,
    ) -> Result<Ring, BuildError> {
        let scale = (ceil(n.min * min_size as f64) / n.min).min(max_size as f64);
        let size = ceil(scale) as usize;
        let mut entries: Vec<(u64, u32)> = Vec::with_capacity(size);
        let mut key = Vec::with_capacity(64);
        let mut current = 0.0f64;
        let mut target = 0.0f64;
        for (index, (host, weight)) in n.hosts.iter().zip(&n.weights).enumerate() {
            key.clear();
            key.extend_from_slice(host.key().as_bytes());
            key.push(b'_');
            let stem = key.len();
            target += scale * weight;
            let mut i = 0u64;
            while current < target {
                key.truncate(stem);
                push_decimal(&mut key, i);
                // At most u32::MAX hosts: normalize bounds the weight sum.
                entries.push((config.hash_function.hash(&key), index as u32));
                i += 1;
                current += 1.0;
            }
        }
        // Ties (equal hashes) are left in any order by Envoy's sort; break
        // them by host order so a build is at least deterministic.
        entries.sort_unstable();
        let (hashes, owners): (Vec<u64>, Vec<u32>) = entries.into_iter().unzip();
        let (starts, bucket_bits) = bucket_starts(&hashes);
        Ok(Ring {
            hashes,
            owners,
            hosts: n.hosts,
            starts,
            bucket_bits,
        })
    }

    /// The index (into [`Ring::hosts`]) of the host for `hash`: the first
    /// entry whose hash is ≥ `hash`, wrapping to the first entry.
    pub fn pick(&self, hash: u64) -> usize {
        self.owners[self.entry_for(hash)] as usize
    }

    /// The host for `hash`.
    pub fn pick_host(&self, hash: u64) -> &Host {
        &self.hosts[self.pick(hash)]
    }

    /// Envoy's pick for retry attempt `attempt` (0 is the first try): the
    /// entry `attempt` places after the first pick, wrapping. It may name the
    /// same host again, as in Envoy.
    pub fn pick_attempt(&self, hash: u64, attempt: u32) -> usize {
        let i = (self.entry_for(hash) + attempt as usize) % self.hashes.len();
        self.owners[i] as usize
    }

    fn entry_for(&self, hash: u64) -> usize {
        // Entries before the bucket's start are below `hash`, those from the
        // next bucket's start above it: search in between.
        let b = (hash >> (64 - self.bucket_bits)) as usize;
        let (lo, hi) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        let i = lo + self.hashes[lo..hi].partition_point(|&h| h < hash);
        if i == self.hashes.len() {
            0
        } else {
            i
        }
    }

    /// Number of entries.
    #[allow(clippy::len_without_is_empty)] // never empty by construction
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// The hosts, in the order given to [`Ring::build`].
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The entries in ring order: `(hash, host index)`.
    pub fn entries(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.hashes
            .iter()
            .zip(&self.owners)
            .map(|(&h, &o)| (h, o as usize))
    }

    /// How many entries each host has, in host order.
    pub fn entries_per_host(&self) -> Vec<usize> {
        let mut counts = alloc::vec![0usize; self.hosts.len()];
        for &o in &self.owners {
            counts[o as usize] += 1;
        }
        counts
    }
}

/// Appends `n` in decimal (what `absl::StrCat` writes), without `format!`.
fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::key_hash;
    use alloc::format;
    use alloc::string::{String, ToString};
    use alloc::vec;

    fn three(weights: [u32; 3]) -> Vec<Host> {
        (0..3)
            .map(|i| Host::new(format!("127.0.0.1:{}", 441 + i), weights[i]))
            .collect()
    }

    /// The whole-ring search the bucket index stands in for.
    fn searched(ring: &Ring, hash: u64) -> usize {
        let i = ring.hashes.partition_point(|&h| h < hash);
        if i == ring.hashes.len() {
            0
        } else {
            i
        }
    }

    #[test]
    fn the_bucket_index_finds_the_entry_a_whole_ring_search_finds() {
        for (hosts, min) in [(1usize, 1u64), (3, 1024), (1000, 1024), (7, 70_000)] {
            let config = RingConfig {
                minimum_ring_size: min,
                ..RingConfig::default()
            };
            let ring = Ring::build(
                (0..hosts).map(|i| Host::new(format!("10.0.{}.{}:80", i / 256, i % 256), 1)),
                &config,
            )
            .unwrap();
            let mut probes = vec![0, 1, u64::MAX, u64::MAX - 1, 1 << 63];
            // Every entry's hash, and its neighbours: the bucket edges.
            for &h in &ring.hashes {
                probes.extend([h, h.wrapping_sub(1), h.wrapping_add(1)]);
            }
            probes.extend((0..10_000u64).map(|k| key_hash(&format!("key-{k}"))));
            for h in probes {
                assert_eq!(
                    ring.entry_for(h),
                    searched(&ring, h),
                    "{hosts} hosts, hash {h:#x}"
                );
            }
        }
    }

    #[test]
    fn equal_weights_give_342_each() {
        let ring = Ring::build(three([1, 1, 1]), &RingConfig::default()).unwrap();
        assert_eq!(ring.len(), 1026);
        assert_eq!(ring.entries_per_host(), [342, 342, 342]);
        // Sorted ascending.
        assert!(ring.hashes.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn weights_one_two_three() {
        let ring = Ring::build(three([1, 2, 3]), &RingConfig::default()).unwrap();
        assert_eq!(ring.len(), 1026);
        assert_eq!(ring.entries_per_host(), [171, 342, 513]);
    }

    #[test]
    fn size_with_uneven_weights() {
        let hosts: Vec<Host> = [1, 2, 3, 1, 5]
            .iter()
            .enumerate()
            .map(|(i, &w)| Host::new(format!("10.0.0.{i}:80"), w))
            .collect();
        let ring = Ring::build(hosts, &RingConfig::default()).unwrap();
        assert_eq!(ring.len(), 1032);
    }

    #[test]
    fn named_picks() {
        let ring = Ring::build(three([1, 1, 1]), &RingConfig::default()).unwrap();
        let host = |k: &str| ring.pick_host(key_hash(k)).key().to_string();
        assert_eq!(host("foo"), "127.0.0.1:442");
        assert_eq!(host("bar"), "127.0.0.1:443");
        assert_eq!(host("user-42"), "127.0.0.1:441");
        // An entry's own hash picks that entry's host.
        assert_eq!(ring.pick(0xe381ee9ca3e023a5), 0);
    }

    #[test]
    fn pick_is_first_entry_at_or_above_and_wraps() {
        let ring = Ring::build(three([1, 1, 1]), &RingConfig::with_min(3)).unwrap();
        let e: Vec<_> = ring.entries().collect();
        assert_eq!(e.len(), 3);
        assert_eq!(ring.pick(e[1].0), e[1].1);
        assert_eq!(ring.pick(e[1].0 - 1), e[1].1);
        assert_eq!(ring.pick(e[0].0 + 1), e[1].1);
        assert_eq!(ring.pick(0), e[0].1);
        assert_eq!(ring.pick(e[2].0 + 1), e[0].1);
        assert_eq!(
            ring.pick(u64::MAX),
            if e[2].0 == u64::MAX { e[2].1 } else { e[0].1 }
        );
        assert_eq!(ring.pick_attempt(e[2].0, 1), e[0].1);
        assert_eq!(ring.pick_attempt(e[0].0, 0), e[0].1);
    }

    #[test]
    fn one_host_takes_everything() {
        let ring = Ring::build([("10.0.0.1:80", 7)], &RingConfig::default()).unwrap();
        assert_eq!(ring.len(), 1024);
        for h in [0, 1, u64::MAX / 2, u64::MAX] {
            assert_eq!(ring.pick(h), 0);
        }
    }

    #[test]
    fn ten_thousand_hosts() {
        let hosts: Vec<Host> = (0..10_000u32)
            .map(|i| {
                Host::new(
                    format!("10.{}.{}.{}:8080", i >> 16, (i >> 8) & 255, i & 255),
                    1 + i % 3,
                )
            })
            .collect();
        let ring = Ring::build(hosts, &RingConfig::default()).unwrap();
        // The lightest host (weight 1 of Σ 19,999) gets one entry: scale is
        // ceil(min_w × 1024) / min_w = Σw.
        assert_eq!(ring.len(), 19_999);
        let counts = ring.entries_per_host();
        assert_eq!(counts[0], 1);
        assert_eq!(counts[2], 3);
        assert!(ring.pick(key_hash("user-42")) < 10_000);
    }

    #[test]
    fn maximum_ring_size_scales_down() {
        // ceil(0.25 × 5) / 0.25 = 8 entries wanted, 6 allowed.
        let config = RingConfig {
            minimum_ring_size: 5,
            maximum_ring_size: 6,
            ..RingConfig::default()
        };
        let hosts: Vec<Host> = (0..4).map(|i| Host::new(format!("h{i}"), 1)).collect();
        let ring = Ring::build(hosts, &config).unwrap();
        // 1.5 entries per host by running sums: 2, 1, 2, 1.
        assert_eq!(ring.entries_per_host(), [2, 1, 2, 1]);
    }

    #[test]
    fn grpc_cap() {
        let hosts: Vec<Host> = (0..3).map(|i| Host::new(format!("h{i}"), 1)).collect();
        let config = RingConfig {
            minimum_ring_size: 8192,
            ..RingConfig::grpc()
        };
        assert_eq!(config.validate(), Ok((4096, 4096)));
        let ring = Ring::build(hosts.clone(), &config).unwrap();
        assert_eq!(ring.len(), 4096);
        let envoy = Ring::build(hosts, &RingConfig::with_min(8192)).unwrap();
        assert_eq!(envoy.len(), 8193);
    }

    #[test]
    fn config_errors_name_field_and_value() {
        let hosts = || three([1, 1, 1]);
        let err = |c: RingConfig| Ring::build(hosts(), &c).unwrap_err().to_string();
        assert_eq!(
            err(RingConfig::with_min(0)),
            "minimum_ring_size: 0 is outside 1..=8388608"
        );
        assert_eq!(
            err(RingConfig {
                maximum_ring_size: 8_388_609,
                ..RingConfig::default()
            }),
            "maximum_ring_size: 8388609 is outside 1..=8388608"
        );
        assert_eq!(
            err(RingConfig {
                minimum_ring_size: 2048,
                maximum_ring_size: 1024,
                ..RingConfig::default()
            }),
            "minimum_ring_size: 2048 is above maximum_ring_size 1024"
        );
        assert_eq!(
            err(RingConfig {
                ring_size_cap: Some(0),
                ..RingConfig::default()
            }),
            "ring_size_cap: 0 is outside 1..=8388608"
        );
        let e = Ring::build(Vec::<Host>::new(), &RingConfig::default()).unwrap_err();
        assert_eq!(e, BuildError::EmptyHostSet);
        let e = Ring::build([("a", 1), ("b", 0)], &RingConfig::default()).unwrap_err();
        assert_eq!(e, BuildError::ZeroWeight { host: "b".into() });
    }

    #[test]
    fn decimal_keys() {
        let mut v = vec![];
        for n in [0u64, 7, 10, 1234567890, u64::MAX] {
            v.clear();
            push_decimal(&mut v, n);
            assert_eq!(String::from_utf8(v.clone()).unwrap(), n.to_string());
        }
    }
}
