//! The lookup table of Envoy's `MAGLEV` balancer.
//!
//! Built as Envoy 1.40 builds it:
//! - table size T (default 65537, any prime up to 5000011);
//! - hosts are taken in order of their key (Envoy sorts them so that the
//!   table does not depend on the order the hosts arrived in);
//! - per host: `offset = XXH64(key, 0) % T`, `skip = XXH64(key, 1) % (T-1) + 1`;
//! - weights are normalised (`w / Σw`); in rounds r = 1, 2, ... each host
//!   places one entry unless `r × w < target`, where `target` starts at 0 and
//!   grows by the largest normalised weight each time the host places one, so
//!   the heaviest host places every round and one of a third its weight every
//!   third round; a host places its entry in the first free slot of
//!   `(offset + next × skip) % T`, next = 0, 1, ...;
//! - a pick is `table[hash % T]`.

use alloc::vec;
use alloc::vec::Vec;

use super::{normalize, normalize_localities, xxh64, BuildError, Host, Locality, Normalized};

/// Envoy's default table size.
pub const DEFAULT_TABLE_SIZE: u64 = 65_537;
/// The largest table size Envoy accepts.
pub const MAX_TABLE_SIZE: u64 = 5_000_011;

/// Maglev settings (Envoy's `MaglevLbConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MaglevConfig {
    /// Number of table slots: a prime, at most 5000011 (default 65537).
    pub table_size: u64,
}

impl Default for MaglevConfig {
    fn default() -> Self {
        MaglevConfig {
            table_size: DEFAULT_TABLE_SIZE,
        }
    }
}

impl MaglevConfig {
    /// Checks that the table size is a prime in range.
    pub fn validate(&self) -> Result<(), BuildError> {
        let t = self.table_size;
        if t > MAX_TABLE_SIZE || !is_prime(t) {
            return Err(BuildError::TableSize { value: t });
        }
        Ok(())
    }
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2u64;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

/// An immutable Maglev table.
#[derive(Debug, Clone)]
pub struct Maglev {
    /// `table[slot]` is a host index into `hosts`.
    table: Vec<u32>,
    hosts: Vec<Host>,
}

/// A host's state while the table fills.
struct Builder {
    host: u32,
    offset: u64,
    skip: u64,
    weight: f64,
    target: f64,
    next: u64,
}

const EMPTY: u32 = u32::MAX;

impl Maglev {
    /// Builds the table over `hosts` (any order: the table depends only on
    /// the set of keys and weights).
    pub fn build<I, H>(hosts: I, config: &MaglevConfig) -> Result<Maglev, BuildError>
    where
        I: IntoIterator<Item = H>,
        H: Into<Host>,
    {
        config.validate()?;
        Maglev::from_normalized(normalize(hosts)?, config)
    }

    /// Builds the table over `localities` as Envoy does for a cluster with
    /// `locality_weighted_lb_config`: hosts weighted by their locality's share
    /// (see [`Locality`]); a locality of weight 0 is left out.
    pub fn build_localities(
        localities: &[Locality],
        config: &MaglevConfig,
    ) -> Result<Maglev, BuildError> {
        config.validate()?;
        Maglev::from_normalized(normalize_localities(localities)?, config)
    }

    fn from_normalized(n: Normalized, config: &MaglevConfig) -> Result<Maglev, BuildError> {
        // More hosts than u32 can index would not fit a table this size anyway.
        if n.hosts.len() >= EMPTY as usize {
            return Err(BuildError::TableSize {
                value: config.table_size,
            });
        }
        let size = config.table_size;
        let mut order: Vec<usize> = (0..n.hosts.len()).collect();
        // Keys are unique (normalize checks), so this order is total.
        order.sort_unstable_by(|&a, &b| n.hosts[a].key().cmp(n.hosts[b].key()));
        let mut builders: Vec<Builder> = order
            .iter()
            .map(|&i| {
                let key = n.hosts[i].key().as_bytes();
                Builder {
                    host: i as u32,
                    offset: xxh64(key, 0) % size,
                    skip: xxh64(key, 1) % (size - 1) + 1,
                    weight: n.weights[i],
                    target: 0.0,
                    next: 0,
                }
            })
            .collect();
        let mut table = vec![EMPTY; size as usize];
        let mut filled = 0u64;
        let mut round = 1u32;
        while filled < size {
            for b in builders.iter_mut() {
                if filled == size {
                    break;
                }
                // Envoy compares in doubles with a 32-bit round counter.
                if f64::from(round) * b.weight < b.target {
                    continue;
                }
                b.target += n.max;
                let mut slot = (b.offset + b.skip * b.next) % size;
                while table[slot as usize] != EMPTY {
                    b.next += 1;
                    slot = (b.offset + b.skip * b.next) % size;
                }
                table[slot as usize] = b.host;
                b.next += 1;
                filled += 1;
            }
            round = round.wrapping_add(1);
        }
        Ok(Maglev {
            table,
            hosts: n.hosts,
        })
    }

    /// The index (into [`Maglev::hosts`]) of the host for `hash`.
    pub fn pick(&self, hash: u64) -> usize {
        self.table[(hash % self.table.len() as u64) as usize] as usize
    }

    /// The host for `hash`.
    pub fn pick_host(&self, hash: u64) -> &Host {
        &self.hosts[self.pick(hash)]
    }

    /// Envoy's pick for retry attempt `attempt` (0 is the first try): the
    /// hash is XORed with `2^64 - attempt` to move far from the first slot.
    pub fn pick_attempt(&self, hash: u64, attempt: u32) -> usize {
        if attempt == 0 {
            self.pick(hash)
        } else {
            self.pick(hash ^ u64::from(attempt).wrapping_neg())
        }
    }

    /// The table size.
    #[allow(clippy::len_without_is_empty)] // never empty by construction
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// The hosts, in the order given to [`Maglev::build`].
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The table: host index per slot.
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// How many slots each host owns, in host order.
    pub fn entries_per_host(&self) -> Vec<usize> {
        let mut counts = vec![0usize; self.hosts.len()];
        for &h in &self.table {
            counts[h as usize] += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::key_hash;
    use alloc::format;
    use alloc::string::ToString;

    fn hosts(weights: &[u32]) -> Vec<Host> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Host::new(format!("127.0.0.1:{}", 19001 + i), w))
            .collect()
    }

    #[test]
    fn default_table_is_full_and_balanced() {
        let m = Maglev::build(hosts(&[1, 1, 1]), &MaglevConfig::default()).unwrap();
        assert_eq!(m.len(), 65_537);
        assert!(m.table().iter().all(|&h| h < 3));
        let counts = m.entries_per_host();
        assert_eq!(counts.iter().sum::<usize>(), 65_537);
        // Round robin over equal weights: counts differ by at most one.
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(hi - lo <= 1, "{counts:?}");
    }

    #[test]
    fn weights_are_honoured() {
        let m = Maglev::build(hosts(&[1, 2, 3, 1, 5]), &MaglevConfig::default()).unwrap();
        let counts = m.entries_per_host();
        let total: usize = counts.iter().sum();
        for (c, w) in counts.iter().zip([1.0, 2.0, 3.0, 1.0, 5.0]) {
            let want = total as f64 * w / 12.0;
            assert!((*c as f64 - want).abs() < want * 0.01 + 2.0, "{counts:?}");
        }
    }

    #[test]
    fn table_ignores_input_order() {
        let a = hosts(&[1, 2, 3, 1, 5]);
        let mut b = a.clone();
        b.reverse();
        let ma = Maglev::build(a, &MaglevConfig::default()).unwrap();
        let mb = Maglev::build(b, &MaglevConfig::default()).unwrap();
        for k in ["foo", "bar", "user-42", ""] {
            assert_eq!(ma.pick_host(key_hash(k)), mb.pick_host(key_hash(k)));
        }
    }

    #[test]
    fn first_slots_follow_the_permutation() {
        // With one host every slot is its own; with a small prime the first
        // slot each host takes is its offset.
        let one = Maglev::build([("10.0.0.1:80", 1)], &MaglevConfig { table_size: 7 }).unwrap();
        assert_eq!(one.table(), [0; 7]);
        let two = Maglev::build([("a", 1), ("b", 1)], &MaglevConfig { table_size: 13 }).unwrap();
        let offset = |k: &str| (xxh64(k.as_bytes(), 0) % 13) as usize;
        assert_eq!(two.table()[offset("a")], 0);
        if offset("b") != offset("a") {
            assert_eq!(two.table()[offset("b")], 1);
        }
        assert_eq!(two.entries_per_host(), [7, 6]);
    }

    #[test]
    fn pick_is_hash_mod_size() {
        let m = Maglev::build(hosts(&[1, 1, 1]), &MaglevConfig { table_size: 101 }).unwrap();
        for h in [0u64, 100, 101, 12345, u64::MAX] {
            assert_eq!(m.pick(h), m.table()[(h % 101) as usize] as usize);
        }
        let h = 5u64;
        assert_eq!(m.pick_attempt(h, 0), m.pick(h));
        assert_eq!(m.pick_attempt(h, 1), m.pick(h ^ u64::MAX));
        assert_eq!(m.pick_attempt(h, 2), m.pick(h ^ (u64::MAX - 1)));
    }

    #[test]
    fn ten_thousand_hosts() {
        let hs: Vec<Host> = (0..10_000u32)
            .map(|i| Host::new(format!("10.0.{}.{}:8080", i >> 8, i & 255), 1))
            .collect();
        let m = Maglev::build(hs, &MaglevConfig::default()).unwrap();
        let counts = m.entries_per_host();
        // 65537 slots over 10,000 equal hosts: 6 or 7 each.
        assert!(
            counts.iter().all(|&c| c == 6 || c == 7),
            "{:?}",
            &counts[..10]
        );
    }

    #[test]
    fn errors_name_field_and_value() {
        let e = |size| {
            Maglev::build(hosts(&[1]), &MaglevConfig { table_size: size })
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e(65_536),
            "table_size: 65536 is not a prime number in 2..=5000011"
        );
        assert_eq!(e(1), "table_size: 1 is not a prime number in 2..=5000011");
        assert_eq!(e(0), "table_size: 0 is not a prime number in 2..=5000011");
        assert_eq!(
            e(5_000_077),
            "table_size: 5000077 is not a prime number in 2..=5000011"
        );
        assert!(Maglev::build(
            hosts(&[1]),
            &MaglevConfig {
                table_size: 5_000_011
            }
        )
        .is_ok());
        assert!(Maglev::build(hosts(&[1]), &MaglevConfig { table_size: 2 }).is_ok());
        assert_eq!(
            Maglev::build(Vec::<Host>::new(), &MaglevConfig::default()).unwrap_err(),
            BuildError::EmptyHostSet
        );
        assert_eq!(
            Maglev::build(hosts(&[1, 0]), &MaglevConfig::default()).unwrap_err(),
            BuildError::ZeroWeight {
                host: "127.0.0.1:19002".into()
            }
        );
    }
}
