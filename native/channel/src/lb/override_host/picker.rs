//! xds_override_host's picker: gRFC A75's pseudo-code. With the session's
//! addresses (the call attribute the session filter sets), walk them in the
//! cookie's order, skipping unknown ones and those whose health is not in
//! `override_host_status`: a READY subchannel is picked at once; else the
//! first IDLE one is asked to connect and the pick queues; else a
//! CONNECTING one queues it; else the first entry without a subchannel gets
//! one (through the LB task) and the pick queues. TRANSIENT_FAILURE entries
//! are skipped, and so are endpoints `outlier_detection` ejected (they
//! show TRANSIENT_FAILURE through it). Otherwise the child picks. Either way a completed pick of
//! a session call carries the endpoint's address list, the one picked first.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::{AddressMap, Clock, MapEntry};
use crate::lb::{
    ConnectivityState, Event, Pick, PickArgs, PickResult, Picker, SharedPicker, Subchannel,
};
use crate::xds::resource::endpoint::HealthSet;

/// The picker of one `xds_override_host` policy.
pub struct OverrideHostPicker {
    statuses: HealthSet,
    map: Arc<AddressMap>,
    child: SharedPicker,
    events: mpsc::UnboundedSender<Event>,
    clock: Clock,
}

impl std::fmt::Debug for OverrideHostPicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverrideHostPicker")
            .field("addresses", &self.map.len())
            .field("child", &self.child)
            .finish()
    }
}

impl OverrideHostPicker {
    /// A picker over the policy's map and its child's picker.
    pub fn new(
        statuses: HealthSet,
        map: Arc<AddressMap>,
        child: SharedPicker,
        events: mpsc::UnboundedSender<Event>,
        clock: Clock,
    ) -> Self {
        OverrideHostPicker {
            statuses,
            map,
            child,
            events,
            clock,
        }
    }

    /// A session uses `entry`: note when, and have the LB task keep its
    /// subchannel (told once per ownership).
    fn used(&self, addr: SocketAddr, entry: &MapEntry, session: Option<u64>) {
        let now = self.clock.now_ms();
        // Milliseconds: most picks of a busy endpoint find it written.
        if entry.last_used_ms.load(Ordering::Relaxed) != now {
            entry.last_used_ms.store(now, Ordering::Relaxed);
        }
        if let Some(id) = session {
            entry.record_session(id, now);
        }
        if !entry.owned.swap(true, Ordering::Relaxed) {
            let _ = self.events.send(Event::SessionUsed(addr));
        }
    }

    /// The session pick, or `None` to let the child pick.
    fn session_pick(&self, addresses: &[SocketAddr], session: Option<u64>) -> Option<PickResult> {
        let mut idle: Option<Subchannel> = None;
        let mut connecting = false;
        let mut without_subchannel: Option<SocketAddr> = None;
        for addr in addresses {
            let Some(entry) = self.map.get(addr) else {
                continue;
            };
            // An endpoint outlier detection ejected shows TRANSIENT_FAILURE.
            if !self.statuses.contains(entry.health) || entry.ejected.load(Ordering::Relaxed) {
                continue;
            }
            match entry.subchannel() {
                Some(sc) => match sc.state() {
                    ConnectivityState::Ready => {
                        self.used(*addr, entry, session);
                        let mut pick = Pick::by("xds_override_host", sc);
                        pick.endpoint = Some(entry.addresses.clone());
                        return Some(PickResult::Complete(pick));
                    }
                    ConnectivityState::Idle => {
                        idle.get_or_insert(sc);
                    }
                    ConnectivityState::Connecting => connecting = true,
                    ConnectivityState::TransientFailure => {}
                },
                None => {
                    without_subchannel.get_or_insert(*addr);
                }
            }
        }
        if let Some(sc) = idle {
            sc.request_connection();
            return Some(PickResult::Queue);
        }
        if connecting {
            return Some(PickResult::Queue);
        }
        if let Some(addr) = without_subchannel {
            let _ = self.events.send(Event::SessionConnect(addr));
            return Some(PickResult::Queue);
        }
        None
    }
}

impl Picker for OverrideHostPicker {
    fn pick(&self, args: &PickArgs<'_>) -> PickResult {
        if let Some(addresses) = &args.attributes.override_addresses {
            if let Some(result) = self.session_pick(addresses, args.attributes.session_id) {
                return result;
            }
        }
        match self.child.pick(args) {
            // Only a call of the session filter needs its endpoint (for the
            // cookie): other picks skip the map.
            PickResult::Complete(mut pick) if args.attributes.override_addresses.is_some() => {
                let addr = pick.subchannel.address();
                if let Some(entry) = self.map.get(&addr) {
                    // A new session starts on this endpoint.
                    self.used(addr, entry, args.attributes.session_id);
                    pick.endpoint = Some(entry.addresses.clone());
                }
                PickResult::Complete(pick)
            }
            other => other,
        }
    }
}
