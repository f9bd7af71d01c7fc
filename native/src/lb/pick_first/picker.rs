//! pick_first's picker: the chosen subchannel, or queue, or fail.

use std::sync::Arc;

use tonic::Status;

use super::AddressList;
use crate::lb::{
    queue_picker, ConnectivityState, FailPicker, Pick, PickArgs, PickResult, Picker, SharedPicker,
    Subchannel,
};

/// Every call goes to the one chosen subchannel.
#[derive(Debug)]
pub struct PickFirstPicker(pub Subchannel);

impl Picker for PickFirstPicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        PickResult::Complete(Pick::by("pick_first", self.0.clone()))
    }
}

/// The picker for a list's state (no list: no addresses at all).
pub(super) fn for_list(list: Option<&AddressList>) -> SharedPicker {
    let Some(list) = list else {
        return Arc::new(FailPicker(Status::unavailable("empty address list")));
    };
    match (list.state(), list.selected()) {
        (ConnectivityState::Ready, Some(s)) => Arc::new(PickFirstPicker(s.clone())),
        (ConnectivityState::TransientFailure, _) => {
            Arc::new(FailPicker(Status::unavailable(format!(
                "failed to connect to all addresses; last error: {}",
                list.last_error().unwrap_or("unknown")
            ))))
        }
        _ => queue_picker(),
    }
}
