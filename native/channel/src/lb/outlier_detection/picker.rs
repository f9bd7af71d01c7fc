//! outlier_detection's picker: the child's pick, with a tracker that
//! counts the call's outcome for the picked endpoint.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::CounterMap;
use crate::lb::{CallTracker, PickArgs, PickResult, Picker, SharedPicker};

/// One increment per finished call: successes in the low half, failures
/// in the high half, so a call is one atomic add and the timer takes both
/// in one swap (2³² calls of one endpoint in one interval would carry).
const FAILURE: u64 = 1 << 32;

/// The call counter of one endpoint, shared by all its addresses (A61).
#[derive(Debug, Default)]
pub struct CallCounter(AtomicU64);

impl CallCounter {
    /// Takes the counts since the last take, (successes, failures): the
    /// active bucket becomes the inactive one the algorithms read, and
    /// counting restarts from zero.
    pub fn take(&self) -> (u64, u64) {
        let v = self.0.swap(0, Ordering::Relaxed);
        (v & (FAILURE - 1), v >> 32)
    }
}

impl CallTracker for CallCounter {
    fn finished(&self, ok: bool) {
        self.0
            .fetch_add(if ok { 1 } else { FAILURE }, Ordering::Relaxed);
    }
}

/// The picker of one `outlier_detection` policy.
#[derive(Debug)]
pub struct OutlierDetectionPicker {
    child: SharedPicker,
    /// `None` when neither algorithm is on: nothing is counted.
    counters: Option<Arc<CounterMap>>,
}

impl OutlierDetectionPicker {
    /// A picker over the child's, counting into `counters` if given.
    pub fn new(child: SharedPicker, counters: Option<Arc<CounterMap>>) -> Self {
        OutlierDetectionPicker { child, counters }
    }
}

impl Picker for OutlierDetectionPicker {
    fn pick(&self, args: &PickArgs<'_>) -> PickResult {
        let result = self.child.pick(args);
        match (result, &self.counters) {
            (PickResult::Complete(mut pick), Some(counters)) => {
                if let Some(c) = counters.get(&pick.subchannel.address()) {
                    pick.trackers.push(c.clone());
                }
                PickResult::Complete(pick)
            }
            (other, _) => other,
        }
    }
}
