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
use super::weight::{EndpointWeight, Unusable};
use super::Settings;
use crate::lb::{random, Pick, PickArgs, PickResult, Picker, Subchannel};

/// One scheduler rebuild of `weighted_round_robin`, as A78 counts it.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SchedulerUpdate {
    /// Each READY endpoint's weight (0: unusable).
    pub weights: Vec<f64>,
    /// Endpoints without a report yet, or within the blackout period.
    pub not_yet_usable: u64,
    /// Endpoints whose last report is older than the expiration period.
    pub stale: u64,
    /// Whether the weights could not tell the endpoints apart (round robin).
    pub fallback: bool,
}

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
    /// do not move in step; and what its first scheduler was made from.
    pub fn new(
        endpoints: Vec<ReadyEndpoint>,
        settings: &Settings,
        now: Instant,
    ) -> (Self, SchedulerUpdate) {
        let picker = WeightedRoundRobinPicker {
            sequence: AtomicU64::new(random::next_u64() >> 1),
            endpoints,
            scheduler: ArcSwapOption::empty(),
            per_call: !settings.enable_oob_load_report,
        };
        let update = picker.update_scheduler(settings, now);
        (picker, update)
    }

    /// Rebuilds the scheduler from the endpoints' weights at `now`; returns
    /// the weights and counts gRFC A78 records of it.
    pub fn update_scheduler(&self, settings: &Settings, now: Instant) -> SchedulerUpdate {
        let mut update = SchedulerUpdate::default();
        for e in &self.endpoints {
            let (weight, unusable) = e.weight.reading(
                now,
                settings.weight_expiration_period,
                settings.blackout_period,
            );
            match unusable {
                Some(Unusable::NotYetUsable) => update.not_yet_usable += 1,
                Some(Unusable::Stale) => update.stale += 1,
                None => {}
            }
            update.weights.push(weight);
        }
        let scheduler = StaticStrideScheduler::new(&update.weights);
        if scheduler.is_none() {
            log::trace!(
                "weights {:?} do not tell endpoints apart: round robin",
                update.weights
            );
        }
        update.fallback = scheduler.is_none();
        self.scheduler.store(scheduler.map(Arc::new));
        update
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
