//! gRFC A58's static-stride scheduler: each endpoint's weight scaled to a
//! `u16` (the largest to [`MAX_WEIGHT`]), and a pick walks one shared
//! sequence counter, accepting endpoint `i` in generation `g` when
//! `(w_i * g + offset_i) mod MAX_WEIGHT >= MAX_WEIGHT - w_i`: every
//! endpoint is accepted `w_i / MAX_WEIGHT` of the generations, spread out
//! by its offset. A pick is one atomic add (plus a few more for light
//! endpoints): no lock, no per-pick allocation, and the weights never
//! change under a scheduler (a new one replaces it).

use std::sync::atomic::{AtomicU64, Ordering};

/// The largest scaled weight: the heaviest endpoint is accepted in every
/// generation.
pub const MAX_WEIGHT: u16 = u16::MAX;
/// The heaviest endpoint counts as at most this many times the mean, so
/// that one wild report cannot starve the others.
pub const MAX_RATIO: f64 = 10.0;
/// Every endpoint counts as at least this fraction of the mean, so that
/// even a loaded endpoint keeps seeing some calls (and reporting). C-core's
/// value; grpc-go clamps neither end.
pub const MIN_RATIO: f64 = 0.01;
/// Draws a pick makes before settling for the last one drawn. The
/// heaviest endpoint accepts every draw, so fewer than one draw per
/// endpoint is ever rejected in a row unless other threads take the
/// heaviest endpoint's turns; this only bounds that race.
const MAX_DRAWS: usize = 1024;

/// The scaled weights of one snapshot of endpoint weights; picks index
/// the slice the weights were given in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticStrideScheduler {
    weights: Box<[u16]>,
}

impl StaticStrideScheduler {
    /// A scheduler for `weights` (one per endpoint, in order; zero, negative
    /// or not finite for an endpoint without a usable weight, which then
    /// counts as the mean of the others). `None` when weights cannot tell
    /// the endpoints apart: fewer than two usable weights, or all the
    /// scaled weights equal; the caller then picks in round robin order.
    pub fn new(weights: &[f64]) -> Option<Self> {
        let usable = |w: f64| w.is_finite() && w > 0.0;
        let (mut sum, mut count, mut max) = (0.0f64, 0usize, 0.0f64);
        for &w in weights.iter().filter(|&&w| usable(w)) {
            sum += w;
            count += 1;
            max = max.max(w);
        }
        if count < 2 {
            return None;
        }
        let mean = sum / count as f64;
        let max = max.min(MAX_RATIO * mean);
        let scale = f64::from(MAX_WEIGHT) / max;
        let to_u16 = |w: f64| (w * scale).round().clamp(1.0, f64::from(MAX_WEIGHT)) as u16;
        let lower = to_u16(MIN_RATIO * mean);
        let scaled_mean = to_u16(mean);
        let scaled: Box<[u16]> = weights
            .iter()
            .map(|&w| {
                if usable(w) {
                    to_u16(w).max(lower)
                } else {
                    scaled_mean
                }
            })
            .collect();
        if scaled.iter().all(|&w| w == scaled[0]) {
            return None;
        }
        Some(StaticStrideScheduler { weights: scaled })
    }

    /// The scaled weights, in the endpoints' order.
    pub fn weights(&self) -> &[u16] {
        &self.weights
    }

    /// The index of the next endpoint, advancing `sequence` (shared by
    /// every pick of the picker, and across the schedulers that replace
    /// each other in it, so that a new scheduler continues the rotation).
    pub fn pick(&self, sequence: &AtomicU64) -> usize {
        let n = self.weights.len() as u64;
        let max = u64::from(MAX_WEIGHT);
        let mut index = 0;
        for _ in 0..MAX_DRAWS {
            let seq = sequence.fetch_add(1, Ordering::Relaxed);
            // Reduced mod MAX_WEIGHT first (the same residues), so that
            // nothing overflows however long the counter runs.
            let generation = (seq / n) % max;
            index = (seq % n) as usize;
            let weight = u64::from(self.weights[index]);
            // Half a cycle between neighbours, so that endpoints of equal
            // weight are not accepted in the same generations.
            let offset = (max / 2 * (index as u64 % max)) % max;
            if (weight * generation + offset) % max >= max - weight {
                return index;
            }
        }
        index
    }
}
