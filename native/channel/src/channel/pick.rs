//! The LB pick: the call's subchannel from the channel's latest picker (an
//! immutable snapshot the work serializer publishes), queueing while none
//! can be picked. The fast path reads the snapshot and picks without
//! registering anywhere; only a call that must wait subscribes to the next
//! snapshot.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::time::Instant;
use tonic::Status;

use super::attempt::CallGuard;
use super::work_serializer::{Shared, Snapshot};
use crate::lb::{CallLabels, PickArgs, PickResult, Subchannel};
use crate::subchannel::Connection;

/// A subchannel picked for an attempt, with a live connection.
pub(super) struct Picked {
    pub(super) subchannel: Subchannel,
    /// Counts the attempt on the subchannel and tells the pick's trackers
    /// how it ends.
    pub(super) guard: CallGuard,
    pub(super) connection: Connection,
    /// The endpoint's addresses, the picked one first (A61).
    pub(super) endpoint: Option<Arc<[SocketAddr]>>,
    /// The policy that chose the subchannel.
    pub(super) policy: &'static str,
    /// The snapshot whose picker chose it.
    pub(super) snapshot: Arc<Snapshot>,
    /// The attempt's optional metric labels, when the channel records them.
    pub(super) labels: Option<Arc<CallLabels>>,
}

/// Why no subchannel was picked.
pub(super) enum PickError {
    /// The picker failed the call (TRANSIENT_FAILURE, not wait-for-ready):
    /// an attempt's failure, which the route's retry policy may retry.
    Failed(Status),
    /// The call ends here: a drop (never retried), its deadline, or the
    /// channel shut down.
    Final(Status),
}

/// Picks a subchannel for `args`, from `routed_by` first (the snapshot that
/// routed the call, read moments ago) and from the latest after, waiting
/// for newer pickers while the one in hand queues the call (or fails it,
/// for a `wait_for_ready` call) and until the call's `deadline`.
pub(super) async fn pick(
    shared: &Shared,
    routed_by: &mut Option<Arc<Snapshot>>,
    args: &PickArgs<'_>,
    wait_for_ready: bool,
    deadline: Option<Instant>,
) -> Result<Picked, PickError> {
    loop {
        let snapshot = routed_by
            .take()
            .unwrap_or_else(|| shared.snapshot.load_full());
        match snapshot.picker.pick(args) {
            PickResult::Complete(pick) => {
                let guard = CallGuard::new(pick.subchannel.clone(), pick.trackers);
                // The connection may have closed since the picker was
                // made: wait for the picker that knows.
                if let Some(connection) = pick.subchannel.connection() {
                    return Ok(Picked {
                        subchannel: pick.subchannel,
                        guard: guard.start(),
                        connection,
                        endpoint: pick.endpoint,
                        policy: pick.policy,
                        snapshot,
                        labels: pick.labels,
                    });
                }
                // Never sent: no outcome for the trackers.
                guard.release();
            }
            PickResult::Queue => {}
            PickResult::Fail(status) if !wait_for_ready => return Err(PickError::Failed(status)),
            PickResult::Fail(_) => {}
            PickResult::Drop(status) => return Err(PickError::Final(status)),
        }
        Box::pin(next_snapshot(shared, &snapshot, deadline))
            .await
            .map_err(PickError::Final)?;
    }
}

/// Waits for a snapshot newer than `seen`, or fails at the deadline. Only
/// calls that must wait get here: the fast path reads the snapshot and
/// picks without registering anywhere.
pub(super) async fn next_snapshot(
    shared: &Shared,
    seen: &Arc<Snapshot>,
    deadline: Option<Instant>,
) -> Result<(), Status> {
    let mut generation = shared.generation.subscribe();
    // Published between the pick and the subscription: not missed.
    if !Arc::ptr_eq(&shared.snapshot.load(), seen) {
        return Ok(());
    }
    let changed = generation.changed();
    let result = match deadline {
        Some(d) => tokio::time::timeout_at(d, changed).await.map_err(|_| {
            Status::deadline_exceeded("deadline exceeded while waiting for a subchannel")
        })?,
        None => changed.await,
    };
    result.map_err(|_| Status::unavailable("channel shut down"))
}
