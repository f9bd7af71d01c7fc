//! least_request's picker: `choice_count` random draws among the READY
//! endpoints (with replacement, as gRFC A48 and Envoy draw), the one with
//! the fewest calls outstanding wins, the first drawn on a tie. The winner's
//! counter goes up at the pick and down when the call ends, through the
//! pick's trackers: atomics only, no lock on the RPC path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::lb::{random, CallTracker, Pick, PickArgs, PickResult, Picker, Subchannel};

/// The calls outstanding on one endpoint, as one `least_request` policy
/// counts them (gRFC A48: counters are the policy's own, not shared with
/// other clusters that use the same subchannel).
#[derive(Debug, Default)]
pub struct Outstanding(AtomicU64);

impl Outstanding {
    /// A counter at zero.
    pub fn new() -> Self {
        Outstanding::default()
    }

    /// Calls picked and not yet ended.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn started(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl CallTracker for Outstanding {
    fn finished(&self, _ok: bool) {
        // The tracker is pushed only after `started`, and the channel tells
        // each pick's trackers exactly once (finished or released), so this
        // never goes below zero.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    fn released(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A READY endpoint as the picker sees it.
#[derive(Debug, Clone)]
pub struct ReadyEndpoint {
    /// The endpoint's connected subchannel.
    pub subchannel: Subchannel,
    /// Its counter, kept by the policy across pickers.
    pub outstanding: Arc<Outstanding>,
}

/// Picks the least loaded of `choice_count` random READY endpoints; never
/// empty.
#[derive(Debug)]
pub struct LeastRequestPicker {
    endpoints: Vec<ReadyEndpoint>,
    choice_count: u32,
}

impl LeastRequestPicker {
    /// A picker over `endpoints` (at least one) drawing `choice_count`
    /// times per pick (at least once).
    pub fn new(endpoints: Vec<ReadyEndpoint>, choice_count: u32) -> Self {
        LeastRequestPicker {
            endpoints,
            choice_count: choice_count.max(1),
        }
    }

    /// The endpoint one pick chooses.
    fn choose(&self) -> &ReadyEndpoint {
        let n = self.endpoints.len();
        if n == 1 {
            return &self.endpoints[0];
        }
        // Two draws per random number: each 32-bit half, scaled to n by
        // multiply-shift (the bias is n / 2^32).
        let mut bits = 0u64;
        let mut draw = |k: u32| {
            let half = if k.is_multiple_of(2) {
                bits = random::next_u64();
                bits & 0xffff_ffff
            } else {
                bits >> 32
            };
            &self.endpoints[((half * n as u64) >> 32) as usize]
        };
        let mut best = draw(0);
        let mut best_load = best.outstanding.get();
        for k in 1..self.choice_count {
            let candidate = draw(k);
            let load = candidate.outstanding.get();
            // Strictly fewer: on a tie the earlier draw stays (A48).
            if load < best_load {
                best = candidate;
                best_load = load;
            }
        }
        best
    }
}

impl Picker for LeastRequestPicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        let chosen = self.choose();
        chosen.outstanding.started();
        let mut pick = Pick::by("least_request", chosen.subchannel.clone());
        pick.trackers.push(chosen.outstanding.clone());
        PickResult::Complete(pick)
    }
}
