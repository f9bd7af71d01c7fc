//! ring_hash's picker: C-core's pick over a snapshot of the endpoints.
//!
//! The call's hash is the one the config selector computed from the route's
//! hash policies; a call no policy hashed gets a random one, as C-core's
//! resolver gives it, and is then picked like any other. From the hash's
//! place in the table, the first endpoint not in TRANSIENT_FAILURE decides:
//! READY takes the call; IDLE is asked to connect and the call waits for
//! the next picker; CONNECTING makes it wait. Failing endpoints are passed
//! over (each retries on its own after its backoff), so a call lands where
//! it would have if they were not in the table. When every endpoint is
//! failing, the call fails with the first one's error.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tonic::Status;

use super::HashTable;
use crate::lb::pick_first::AddressList;
use crate::lb::{
    random, ConnectivityState, Event, Pick, PickArgs, PickResult, Picker, PolicyId, Subchannel,
};

/// One endpoint as the picker saw it.
struct EndpointView {
    state: ConnectivityState,
    /// The connected subchannel, when READY.
    subchannel: Option<Subchannel>,
    /// The first address: names the endpoint to its policy.
    address: Option<SocketAddr>,
    /// Why it last failed.
    error: Option<String>,
    /// This picker already asked the policy to connect it.
    asked: AtomicBool,
}

/// Picks by the call's hash in a `ring_hash` table.
pub struct RingHashPicker {
    table: Arc<HashTable>,
    /// Indexed like the table's hosts.
    endpoints: Vec<EndpointView>,
    policy: PolicyId,
    events: mpsc::UnboundedSender<Event>,
}

impl std::fmt::Debug for RingHashPicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingHashPicker")
            .field("table", &self.table.kind())
            .field("size", &self.table.len())
            .field("endpoints", &self.endpoints.len())
            .finish()
    }
}

impl RingHashPicker {
    /// A snapshot of `endpoints` (in the table's host order) over `table`;
    /// connection requests go to the policy `policy` through `events`.
    pub(super) fn new(
        table: Arc<HashTable>,
        endpoints: &[AddressList],
        policy: PolicyId,
        events: mpsc::UnboundedSender<Event>,
    ) -> Self {
        let endpoints = endpoints
            .iter()
            .map(|e| EndpointView {
                state: e.state(),
                subchannel: e.selected().cloned(),
                address: e.addresses().next(),
                error: e.last_error().map(str::to_owned),
                asked: AtomicBool::new(false),
            })
            .collect();
        RingHashPicker {
            table,
            endpoints,
            policy,
            events,
        }
    }

    /// What endpoint `i` makes of the call, or `None` when it is failing.
    fn decide(&self, i: usize) -> Option<PickResult> {
        let e = &self.endpoints[i];
        match (e.state, &e.subchannel) {
            (ConnectivityState::Ready, Some(sc)) => {
                Some(PickResult::Complete(Pick::by("ring_hash", sc.clone())))
            }
            (ConnectivityState::Idle, _) => {
                // The policy connects it on its task; once per picker is
                // enough, the next picker comes with the new state.
                if !e.asked.swap(true, Ordering::Relaxed) {
                    if let Some(address) = e.address {
                        let _ = self
                            .events
                            .send(Event::ConnectEndpoint(self.policy, address));
                    }
                }
                Some(PickResult::Queue)
            }
            (ConnectivityState::TransientFailure, _) => None,
            _ => Some(PickResult::Queue),
        }
    }

    /// The pick for `hash`.
    pub fn pick_hash(&self, hash: u64) -> PickResult {
        let mut walk = self.table.walk(hash);
        let Some(first) = walk.next() else {
            return PickResult::Fail(Status::unavailable("ring_hash: empty table"));
        };
        if let Some(result) = self.decide(first) {
            return result;
        }
        // The first endpoint is failing: walk on, each endpoint once, and
        // stop once all have been seen.
        let mut seen = vec![false; self.endpoints.len()];
        seen[first] = true;
        let mut left = self.endpoints.len() - 1;
        for i in walk {
            if left == 0 {
                break;
            }
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            left -= 1;
            if let Some(result) = self.decide(i) {
                return result;
            }
        }
        PickResult::Fail(Status::unavailable(format!(
            "ring hash cannot find a connected endpoint; first failure: {}",
            self.endpoints[first].error.as_deref().unwrap_or("unknown")
        )))
    }
}

impl Picker for RingHashPicker {
    fn pick(&self, args: &PickArgs<'_>) -> PickResult {
        let hash = args.attributes.hash.unwrap_or_else(random::next_u64);
        self.pick_hash(hash)
    }
}
