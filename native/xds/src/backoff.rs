//! Exponential backoff between ADS stream attempts, as gRPC's connection
//! backoff: 1 s, then ×1.6 per attempt up to 120 s, each delay jittered by
//! ±20 %. [`Backoff::reset`] is called once a stream receives a response.

use std::time::Duration;

/// Backoff parameters (gRPC's defaults via [`Default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct BackoffConfig {
    /// First delay.
    pub initial: Duration,
    /// Growth factor per attempt.
    pub multiplier: f64,
    /// Upper bound of the un-jittered delay.
    pub max: Duration,
    /// Relative jitter: each delay is multiplied by a factor in `[1 - j, 1 + j]`.
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial: Duration::from_secs(1),
            multiplier: 1.6,
            max: Duration::from_secs(120),
            jitter: 0.2,
        }
    }
}

/// Backoff state: the next un-jittered delay and a small random generator.
#[derive(Debug, Clone)]
pub struct Backoff {
    config: BackoffConfig,
    current: Option<Duration>,
    rng: u64,
}

impl Backoff {
    /// A backoff seeded from the process's random hasher keys.
    pub fn new(config: BackoffConfig) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x7e7e_7e7e);
        Backoff::with_seed(config, h.finish())
    }

    /// A backoff with a fixed seed (reproducible jitter).
    pub fn with_seed(config: BackoffConfig, seed: u64) -> Self {
        // splitmix64 spreads nearby seeds apart; xorshift must not start at zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Backoff {
            config,
            current: None,
            rng: (z ^ (z >> 31)) | 1,
        }
    }

    /// The delay before the next attempt; grows the base for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let base = match self.current {
            None => self.config.initial,
            Some(d) => d.mul_f64(self.config.multiplier).min(self.config.max),
        };
        self.current = Some(base);
        let factor = 1.0 + self.config.jitter * (2.0 * self.unit() - 1.0);
        base.mul_f64(factor.max(0.0))
    }

    /// Starts over at the initial delay.
    pub fn reset(&mut self) {
        self.current = None;
    }

    /// A uniform value in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_by_1_6_with_20_percent_jitter_up_to_120s() {
        let mut b = Backoff::with_seed(BackoffConfig::default(), 42);
        let mut base = 1.0f64;
        for attempt in 0..40 {
            let d = b.next_delay().as_secs_f64();
            assert!(
                d >= base * 0.8 - 1e-9 && d <= base * 1.2 + 1e-9,
                "attempt {attempt}: {d} not within 20% of {base}"
            );
            base = (base * 1.6).min(120.0);
        }
        b.reset();
        let d = b.next_delay().as_secs_f64();
        assert!((0.8..=1.2).contains(&d), "after reset: {d}");
    }

    #[test]
    fn jitter_spreads_over_the_whole_range() {
        let mut lo = f64::MAX;
        let mut hi = 0.0f64;
        for seed in 0..500 {
            let mut b = Backoff::with_seed(BackoffConfig::default(), seed * 7919);
            let d = b.next_delay().as_secs_f64();
            lo = lo.min(d);
            hi = hi.max(d);
        }
        assert!(lo < 0.85 && hi > 1.15, "jitter range {lo}..{hi}");
    }
}
