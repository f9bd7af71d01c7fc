//! weighted_round_robin's picker: the READY endpoints by the static-stride
//! scheduler of their current weights, or in turn (round robin) while the
//! weights cannot tell them apart. The policy rebuilds the scheduler every
//! `weight_update_period` ([`WeightedRoundRobinPicker::update_scheduler`])
//! and swaps it in; picks read it without a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tokio::time::Instant;

use super::scheduler::StaticStrideScheduler;
use super::weight::EndpointWeight;
use super::Settings;
use crate::lb::{random, Pick, PickArgs, PickResult, Picker, Subchannel};

/// A READY endpoint as the picker sees it.
#[derive(Debug, Clone)]
pub struct ReadyEndpoint {
    /// The endpoint's connected subchannel.
    pub subchannel: Subchannel,
    /// Its weight, kept by the policy across pickers.
    pub weight: Arc<EndpointWeight>,
}

/// Picks READY endpoints by weight; never empty.
#[derive(Debug)]
pub struct WeightedRoundRobinPicker {
    endpoints: Vec<ReadyEndpoint>,
    /// The rotation, shared by every scheduler this picker gets.
    sequence: AtomicU64,
    /// `None`: round robin order.
    scheduler: ArcSwapOption<StaticStrideScheduler>,
    /// Per-call reports feed the weights (out-of-band reporting is off).
    per_call: bool,
}

impl WeightedRoundRobinPicker {
    /// A picker over `endpoints` (at least one) with the weights as of
    /// `now`, starting the rotation at a random point so that many clients
    /// do not move in step.
    pub fn new(endpoints: Vec<ReadyEndpoint>, settings: &Settings, now: Instant) -> Self {
        let picker = WeightedRoundRobinPicker {
            sequence: AtomicU64::new(random::next_u64() >> 1),
            endpoints,
            scheduler: ArcSwapOption::empty(),
            per_call: !settings.enable_oob_load_report,
        };
        picker.update_scheduler(settings, now);
        picker
    }

    /// Rebuilds the scheduler from the endpoints' weights at `now`.
    pub fn update_scheduler(&self, settings: &Settings, now: Instant) {
        let weights: Vec<f64> = self
            .endpoints
            .iter()
            .map(|e| {
                e.weight.weight(
                    now,
                    settings.weight_expiration_period,
                    settings.blackout_period,
                )
            })
            .collect();
        let scheduler = StaticStrideScheduler::new(&weights);
        if scheduler.is_none() {
            log::trace!("weights {weights:?} do not tell endpoints apart: round robin");
        }
        self.scheduler.store(scheduler.map(Arc::new));
    }

    /// The scaled weights in use, none while picking in round robin order.
    pub fn scheduled_weights(&self) -> Option<Vec<u16>> {
        self.scheduler.load().as_ref().map(|s| s.weights().to_vec())
    }

    fn choose(&self) -> &ReadyEndpoint {
        let n = self.endpoints.len();
        let index = match &*self.scheduler.load() {
            Some(s) => s.pick(&self.sequence),
            None => (self.sequence.fetch_add(1, Ordering::Relaxed) % n as u64) as usize,
        };
        &self.endpoints[index]
    }
}

impl Picker for WeightedRoundRobinPicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        let chosen = self.choose();
        let mut pick = Pick::by("weighted_round_robin", chosen.subchannel.clone());
        if self.per_call {
            pick.trackers.push(chosen.weight.clone());
        }
        PickResult::Complete(pick)
    }
}
