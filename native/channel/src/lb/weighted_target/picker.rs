//! A random choice among child pickers by weight (binary search over the
//! running sums).

use crate::lb::{random, PickArgs, PickResult, Picker, SharedPicker};

/// Chooses a child picker at random by weight, then delegates to it.
pub struct WeightedPicker {
    /// Running sums of the weights, and the pickers.
    ends: Vec<u64>,
    pickers: Vec<SharedPicker>,
    total: u64,
}

impl WeightedPicker {
    /// A picker over `(weight, picker)` pairs (at least one, weights above zero).
    pub fn new(choices: Vec<(u32, SharedPicker)>) -> Self {
        let mut total = 0u64;
        let mut ends = Vec::with_capacity(choices.len());
        let mut pickers = Vec::with_capacity(choices.len());
        for (w, p) in choices {
            total += u64::from(w.max(1));
            ends.push(total);
            pickers.push(p);
        }
        WeightedPicker {
            ends,
            pickers,
            total,
        }
    }
}

impl std::fmt::Debug for WeightedPicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightedPicker")
            .field("ends", &self.ends)
            .finish()
    }
}

impl Picker for WeightedPicker {
    fn pick(&self, args: &PickArgs<'_>) -> PickResult {
        let i = if self.pickers.len() == 1 {
            0
        } else {
            let r = random::below(self.total);
            self.ends.partition_point(|&end| end <= r)
        };
        self.pickers[i].pick(args)
    }
}
