//! pick_first's picker: the chosen subchannel, or queue, or fail; while
//! IDLE, queue and ask the policy to connect.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tonic::Status;

use super::AddressList;
use crate::lb::{
    queue_picker, ConnectivityState, Event, FailPicker, Pick, PickArgs, PickResult, Picker,
    PolicyId, SharedPicker, Subchannel,
};

/// Every call goes to the one chosen subchannel.
#[derive(Debug)]
pub struct PickFirstPicker(pub Subchannel);

impl Picker for PickFirstPicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        PickResult::Complete(Pick::by("pick_first", self.0.clone()))
    }
}

/// The IDLE policy's picker: calls queue, and the first one sends
/// [`Event::ExitIdle`] to the policy (the next picker comes with the new
/// state, so one request per picker is enough).
#[derive(Debug)]
struct IdlePicker {
    policy: PolicyId,
    events: mpsc::UnboundedSender<Event>,
    asked: AtomicBool,
}

impl Picker for IdlePicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        if !self.asked.swap(true, Ordering::Relaxed) {
            // The LB task may be gone with its channel: nothing to wake.
            let _ = self.events.send(Event::ExitIdle(self.policy));
        }
        PickResult::Queue
    }
}

/// The picker for a list's state (no list: no addresses at all); an IDLE
/// list's asks `policy` through `events` to leave IDLE.
pub(super) fn for_list(
    list: Option<&AddressList>,
    policy: PolicyId,
    events: mpsc::UnboundedSender<Event>,
) -> SharedPicker {
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
        (ConnectivityState::Idle, _) => Arc::new(IdlePicker {
            policy,
            events,
            asked: AtomicBool::new(false),
        }),
        _ => queue_picker(),
    }
}
