//! round_robin's picker: the READY subchannels in turn, from a random start.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::lb::{random, Pick, PickArgs, PickResult, Picker, Subchannel};

/// Picks the READY subchannels in turn; never empty.
#[derive(Debug)]
pub struct RoundRobinPicker {
    subchannels: Vec<Subchannel>,
    next: AtomicUsize,
}

impl RoundRobinPicker {
    /// A picker over `subchannels` (at least one), starting at a random one
    /// so that many clients do not all start on the same backend.
    pub fn new(subchannels: Vec<Subchannel>) -> Self {
        let start = random::below(subchannels.len().max(1) as u64) as usize;
        RoundRobinPicker {
            subchannels,
            next: AtomicUsize::new(start),
        }
    }
}

impl Picker for RoundRobinPicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.subchannels.len();
        PickResult::Complete(Pick::by("round_robin", self.subchannels[i].clone()))
    }
}
