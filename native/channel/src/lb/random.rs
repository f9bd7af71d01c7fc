//! A fast per-thread random source for pickers (weighted choices, drops,
//! round robin's starting offset): not for secrets.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};

thread_local! {
    static STATE: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish() | 1
}

/// A uniformly distributed `u64` (xorshift64*).
pub fn next_u64() -> u64 {
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

/// A number in `[0, bound)`; `bound` must be above zero.
pub fn below(bound: u64) -> u64 {
    // Multiply-shift keeps the bias negligible for the bounds used here.
    ((u128::from(next_u64()) * u128::from(bound)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_spreads() {
        let mut counts = [0u32; 4];
        for _ in 0..40_000 {
            let v = below(4);
            counts[v as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }
}
