//! The load-balancing tree of [`crate::channel::Channel`], as gRPC's xDS
//! clients build it (gRFC A75's diagrams):
//!
//! ```text
//! xds_cluster_manager ─ a child per cluster of the route table
//!   └ cds ─ a leaf cluster, or an aggregate flattened into a priority of leaves
//!     (└ outlier_detection ─ when CDS sets it: ejects failing endpoints, A50)
//!       └ xds_cluster_impl ─ drops, circuit breaking, the cluster's name
//!         └ xds_override_host ─ sessions stay on their endpoint (A55, A75)
//!           └ priority ─ failover between the cluster's priorities (A56)
//!               ├ xds_wrr_locality ─ the priority's localities
//!               │   └ weighted_target ─ a child per locality, by weight
//!               │       └ round_robin | least_request | pick_first |
//!               │         weighted_round_robin ─ over the endpoints
//!               └ ring_hash ─ (RING_HASH, opt-in MAGLEV) one table over
//!                   all the priority's localities, picked by the call's hash
//! ```
//!
//! Every policy is a synchronous state machine that runs on the channel's one
//! LB task (gRPC's "work serializer"): it reacts to a new config, a
//! subchannel's connectivity state, a timer or a request to leave IDLE, and
//! publishes an immutable [`Picker`] that RPCs read without a lock.
//!
//! One module per policy, each with its config, its picker and the policy;
//! `endpoint_list` holds the endpoint bookkeeping `round_robin`,
//! `least_request` and `weighted_round_robin` share, and `registry` the
//! custom policies a tether user adds (gRFC A52), which go where the
//! endpoint policies go.
//!
//! The public API for policy authors is [`registry`], [`LbPolicy`],
//! [`Picker`], [`EndpointList`] and the types they take ([`Ctx`],
//! [`LbConfig::Custom`], [`Event`], [`PickArgs`], ...). The tree's own
//! policies are not part of the API: they are private to the crate, and
//! public (hidden from the docs) only with the `internals` feature, for the
//! crate's benchmark; they may change in any release.

// The tree's own policies: crate-private, or public with the `internals`
// feature (for the benchmark; no API promise). Declared one by one, not by a
// macro, so that rustfmt sees their files.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod cds;
#[cfg(not(feature = "internals"))]
pub(crate) mod cds;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod cluster_impl;
#[cfg(not(feature = "internals"))]
pub(crate) mod cluster_impl;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod cluster_manager;
#[cfg(not(feature = "internals"))]
pub(crate) mod cluster_manager;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod least_request;
#[cfg(not(feature = "internals"))]
pub(crate) mod least_request;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod outlier_detection;
#[cfg(not(feature = "internals"))]
pub(crate) mod outlier_detection;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod override_host;
#[cfg(not(feature = "internals"))]
pub(crate) mod override_host;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod pick_first;
#[cfg(not(feature = "internals"))]
pub(crate) mod pick_first;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod priority;
#[cfg(not(feature = "internals"))]
pub(crate) mod priority;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod ring_hash;
#[cfg(not(feature = "internals"))]
pub(crate) mod ring_hash;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod round_robin;
#[cfg(not(feature = "internals"))]
pub(crate) mod round_robin;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod weighted_round_robin;
#[cfg(not(feature = "internals"))]
pub(crate) mod weighted_round_robin;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod weighted_target;
#[cfg(not(feature = "internals"))]
pub(crate) mod weighted_target;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod wrr_locality;
#[cfg(not(feature = "internals"))]
pub(crate) mod wrr_locality;

mod aggregate;
// Its docs link `pick_first::AddressList`, crate-private without `internals`
// (rustdoc shows the name unlinked).
#[cfg_attr(not(feature = "internals"), allow(rustdoc::private_intra_doc_links))]
pub mod endpoint_list;
pub(crate) mod random;
pub mod registry;
#[cfg(test)]
mod test_harness;
mod timers;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;

use crate::credentials::XdsSecurity;
use crate::subchannel::pool::Security;
pub use crate::subchannel::ConnectivityState;
pub use crate::subchannel::{Subchannel, SubchannelId, SubchannelPool};
pub use crate::telemetry::CallLabels;
use crate::telemetry::{LbLabels, LbMetrics, OutlierRecorder, WrrRecorder};
pub use crate::xds::resource::endpoint::HealthStatus;
pub use aggregate::aggregate_state;
pub use cds::policy_chain;
pub use endpoint_list::{Endpoint, EndpointList};
pub use override_host::AddressSessions;
pub use registry::{CustomConfig, CustomPolicy, ParsedConfig, PolicyBuilder, PolicyRegistry};

/// One endpoint as a policy sees it: its addresses (gRFC A61: the first is
/// the primary), its weight and its EDS health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointAddresses {
    /// Addresses in order; never empty.
    pub addresses: Vec<SocketAddr>,
    /// Load-balancing weight (at least 1).
    pub weight: u32,
    /// EDS health status (only UNKNOWN and HEALTHY reach the leaf policies).
    pub health: HealthStatus,
}

impl EndpointAddresses {
    /// A healthy endpoint of weight 1 at one address.
    pub fn single(address: SocketAddr) -> Self {
        EndpointAddresses {
            addresses: vec![address],
            weight: 1,
            health: HealthStatus::Unknown,
        }
    }
}

/// Per-call data a picker reads, set by the channel's config selector and
/// HTTP filters before the pick.
#[derive(Debug, Clone, Default)]
pub struct CallAttributes {
    /// The cluster the route chose (the key of `xds_cluster_manager`).
    pub cluster: Arc<str>,
    /// The request hash of the route's hash policies, for ring hash.
    pub hash: Option<u64>,
    /// Set when the stateful session filter is on for the call: the
    /// session's addresses in the cookie's order (gRFC A55/A61), empty when
    /// the call has no session yet.
    pub override_addresses: Option<Arc<[SocketAddr]>>,
    /// Which session the call belongs to, when the session filter is on:
    /// the caller's [`crate::session::SessionId`] (a cookie jar's), else a
    /// digest of the addresses its cookie names. Counted per endpoint for
    /// drain readiness.
    pub session_id: Option<u64>,
}

/// What a picker sees of a call.
#[derive(Debug)]
pub struct PickArgs<'a> {
    /// The method path, `/package.Service/Method`.
    pub path: &'a str,
    /// The call's metadata.
    pub headers: &'a http::HeaderMap,
    /// Attributes set by the config selector and filters.
    pub attributes: &'a CallAttributes,
}

/// Observes a call picked for a subchannel, until it ends (circuit
/// breaking counts calls in flight, least request counts them per
/// endpoint; outlier detection will count outcomes).
pub trait CallTracker: Send + Sync {
    /// The call ended: `ok` when its status was OK.
    fn finished(&self, ok: bool);

    /// The call ended with these trailers (the headers of a trailers-only
    /// response), when it got that far: for trackers that read what the
    /// server said, such as ORCA's per-call load report (gRFC A51). The
    /// channel calls this instead of [`CallTracker::finished`]; by default
    /// it ignores the trailers.
    fn finished_with_trailers(&self, ok: bool, trailers: Option<&http::HeaderMap>) {
        let _ = trailers;
        self.finished(ok);
    }

    /// The pick was never sent (no connection, or the connection gave the
    /// request back unsent): the call has no outcome here and is picked
    /// again. A tracker that counted the call when it was picked gives the
    /// count back; outcomes are not recorded, as C-core drops the tracker.
    /// By default nothing happens.
    fn released(&self) {}
}

/// The trackers of one pick, innermost policy first. Two fit inline, so
/// a pick through the xDS tree allocates nothing.
#[derive(Default, Clone)]
pub struct Trackers {
    inline: [Option<Arc<dyn CallTracker>>; 2],
    more: Vec<Arc<dyn CallTracker>>,
}

impl Trackers {
    /// No trackers.
    pub fn new() -> Self {
        Trackers::default()
    }

    /// Adds the tracker of a policy above those already in.
    pub fn push(&mut self, tracker: Arc<dyn CallTracker>) {
        match self.inline.iter_mut().find(|t| t.is_none()) {
            Some(slot) => *slot = Some(tracker),
            None => self.more.push(tracker),
        }
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.inline.iter().flatten().count() + self.more.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tells every tracker, innermost first, that the call ended.
    pub fn finished(&self, ok: bool) {
        self.finished_with_trailers(ok, None);
    }

    /// Tells every tracker, innermost first, that the call ended with
    /// these trailers (none when it ended without any).
    pub fn finished_with_trailers(&self, ok: bool, trailers: Option<&http::HeaderMap>) {
        for t in self.inline.iter().flatten().chain(&self.more) {
            t.finished_with_trailers(ok, trailers);
        }
    }

    /// Tells every tracker, innermost first, that the pick was never sent
    /// ([`CallTracker::released`]).
    pub fn released(&self) {
        for t in self.inline.iter().flatten().chain(&self.more) {
            t.released();
        }
    }
}

/// A completed pick.
pub struct Pick {
    /// Where the call goes.
    pub subchannel: Subchannel,
    /// Told when the call ends.
    pub trackers: Trackers,
    /// The picked endpoint's addresses, the picked one first (gRFC A61), as
    /// `xds_override_host` knows them: what a session cookie names. Set for
    /// calls the session filter applies to.
    pub endpoint: Option<Arc<[SocketAddr]>>,
    /// The policy that chose the subchannel (`round_robin`,
    /// `xds_override_host` for a session's endpoint, a custom policy's
    /// name, ...), which `tether call` reports.
    pub policy: &'static str,
    /// The optional labels of the attempt's metrics the pick knows (set
    /// by `xds_cluster_impl` when the channel records them).
    pub labels: Option<Arc<CallLabels>>,
}

impl Pick {
    /// `policy`'s pick of `subchannel`, with nothing else known yet.
    pub fn by(policy: &'static str, subchannel: Subchannel) -> Self {
        Pick {
            subchannel,
            trackers: Trackers::new(),
            endpoint: None,
            policy,
            labels: None,
        }
    }
}

impl fmt::Debug for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pick")
            .field("subchannel", &self.subchannel.address())
            .field("trackers", &self.trackers.len())
            .field("policy", &self.policy)
            .finish()
    }
}

/// What a picker decided for one call.
#[derive(Debug)]
pub enum PickResult {
    /// Send the call on this subchannel.
    Complete(Pick),
    /// Wait for the next picker.
    Queue,
    /// Fail the call, unless it is `wait_for_ready`, in which case it waits
    /// for the next picker (a TRANSIENT_FAILURE picker's answer).
    Fail(Status),
    /// Fail the call even if it is `wait_for_ready` (drops, circuit breaking).
    Drop(Status),
}

/// An immutable snapshot of a policy's choice, read by RPCs without locks.
pub trait Picker: Send + Sync + fmt::Debug {
    /// Picks for one call. Must not block.
    fn pick(&self, args: &PickArgs<'_>) -> PickResult;
}

/// A picker shared by the policy that made it and its parent's picker.
pub type SharedPicker = Arc<dyn Picker>;

/// Queues every call: the picker of a policy that is connecting.
#[derive(Debug, Default)]
pub struct QueuePicker;

impl Picker for QueuePicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        PickResult::Queue
    }
}

/// Fails every call with one status: the picker of TRANSIENT_FAILURE.
#[derive(Debug)]
pub struct FailPicker(pub Status);

impl Picker for FailPicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        PickResult::Fail(self.0.clone())
    }
}

/// A picker that queues, shared.
pub fn queue_picker() -> SharedPicker {
    Arc::new(QueuePicker)
}

/// A picker that fails calls with UNAVAILABLE and `message`, shared.
pub fn fail_picker(message: impl Into<String>) -> SharedPicker {
    Arc::new(FailPicker(Status::unavailable(message)))
}

/// Identifies one scheduled timer; a policy keeps the token of each timer it
/// started and ignores tokens it does not know (timers it cancelled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerToken(pub u64);

/// A scheduled timer: dropping it cancels it.
#[derive(Debug)]
pub struct Timer {
    token: TimerToken,
    deadline: Instant,
    /// On the process's LB timer thread ([`timers`]); unit tests keep
    /// tokio's timers, whose clock they pause.
    #[cfg(not(test))]
    id: u64,
    #[cfg(test)]
    task: tokio::task::AbortHandle,
}

impl Timer {
    /// The token its firing carries.
    pub fn token(&self) -> TimerToken {
        self.token
    }

    /// When it fires.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        #[cfg(not(test))]
        timers::cancel(self.id);
        #[cfg(test)]
        self.task.abort();
    }
}

/// Names one policy for the events addressed to it; never reused within
/// the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyId(pub u64);

impl PolicyId {
    /// An id no policy had before.
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        PolicyId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Events the LB task handles, one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A subchannel of the channel's pool (id, address) changed state.
    Subchannel(SubchannelId, SocketAddr, ConnectivityState),
    /// A timer fired.
    Timer(TimerToken),
    /// A session's pick found its endpoint without a subchannel: the
    /// `xds_override_host` policy that knows the address creates one.
    SessionConnect(SocketAddr),
    /// A session used this endpoint for the first time since its policy
    /// last let go of its subchannel: the policy keeps (owns) it.
    SessionUsed(SocketAddr),
    /// A `ring_hash` picker chose an IDLE endpoint: that policy starts
    /// connecting the endpoint whose first address this is (pickers cannot
    /// change a policy's endpoints themselves).
    ConnectEndpoint(PolicyId, SocketAddr),
    /// An IDLE policy's picker got a call: that policy starts connecting
    /// (gRPC's `ExitIdle`; `pick_first` after its connection closed).
    ExitIdle(PolicyId),
    /// `outlier_detection` ejected (true) or un-ejected the endpoint with
    /// this address; sent only to its own subtree, where
    /// `xds_override_host` keeps sessions off ejected endpoints.
    Ejection(SocketAddr, bool),
}

/// What a policy can do from the LB task: create subchannels, start timers,
/// read the clock. Passed down the tree on every call into a policy.
pub struct Ctx<'a> {
    pool: &'a SubchannelPool,
    events: &'a mpsc::UnboundedSender<Event>,
    next_timer: &'a mut u64,
    /// Names the channel in log lines (its target).
    pub target: &'a str,
    /// The xDS-managed TLS of the cluster being updated (set by `cds` for
    /// its subtree): the subchannels made now use it.
    pub(crate) security: Security,
    /// While set, the addresses of the subchannels handed out
    /// ([`Ctx::record_subchannels`]).
    recorded: std::cell::RefCell<Option<Vec<SocketAddr>>>,
    /// What policies record (gRFC A78, A91), when the channel has a
    /// telemetry.
    metrics: Option<&'a LbMetrics>,
    /// The labels of the subtree being updated (set by `cds` and
    /// `weighted_target` for their children), for what policies record.
    pub(crate) labels: LbLabels,
}

impl<'a> Ctx<'a> {
    /// A context over the channel's pool and event queue.
    pub fn new(
        pool: &'a SubchannelPool,
        events: &'a mpsc::UnboundedSender<Event>,
        next_timer: &'a mut u64,
        target: &'a str,
    ) -> Self {
        Ctx {
            pool,
            events,
            next_timer,
            target,
            security: None,
            recorded: std::cell::RefCell::new(None),
            metrics: None,
            labels: LbLabels::default(),
        }
    }

    /// The context with the channel's LB recorder.
    pub(crate) fn with_metrics(mut self, metrics: Option<&'a LbMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Whether the channel records what policies do (labels are worth
    /// setting).
    pub(crate) fn records(&self) -> bool {
        self.metrics.is_some()
    }

    /// Whether picks should carry [`CallLabels`] (the channel records an
    /// optional label of them).
    pub(crate) fn records_call_labels(&self) -> bool {
        self.metrics.is_some_and(LbMetrics::call_labels)
    }

    /// Has the channel's `tether.client.sessions` observe `source`, with
    /// the subtree's backend service, while it lives.
    pub(crate) fn watch_sessions(
        &self,
        source: std::sync::Weak<dyn crate::telemetry::SessionSource>,
    ) {
        if let Some(m) = self.metrics {
            m.watch_sessions(&self.labels, source);
        }
    }

    /// The recorder of A78's `weighted_round_robin` instruments for a
    /// policy in the subtree being updated, if any of them is on.
    pub(crate) fn wrr_recorder(&self) -> Option<WrrRecorder> {
        self.metrics?.weighted_round_robin(&self.labels)
    }

    /// The recorder of A91's outlier-detection instruments for a policy in
    /// the subtree being updated, if either is on.
    pub(crate) fn outlier_recorder(&self) -> Option<OutlierRecorder> {
        self.metrics?.outlier_detection(&self.labels)
    }

    /// The subchannel for `address`: the pool's existing one (shared with
    /// other clusters using the same credentials) or a new one in IDLE.
    pub fn subchannel(&self, address: SocketAddr) -> Subchannel {
        self.record(address);
        self.pool.get_labelled(
            address,
            &self.security,
            self.labels.backend_service.as_ref(),
            self.labels.locality.as_ref(),
        )
    }

    /// The pool's live subchannel for `address`, if any (none is created).
    pub fn existing_subchannel(&self, address: SocketAddr) -> Option<Subchannel> {
        let found = self.pool.peek_secured(address, &self.security);
        if found.is_some() {
            self.record(address);
        }
        found
    }

    fn record(&self, address: SocketAddr) {
        if let Some(addresses) = self.recorded.borrow_mut().as_mut() {
            addresses.push(address);
        }
    }

    /// Starts recording the addresses of the subchannels handed out, for a
    /// parent that sends subchannel events only to the children holding
    /// them; returns the recording in progress, to give back to
    /// [`Ctx::recorded_subchannels`].
    pub(crate) fn record_subchannels(&self) -> Option<Vec<SocketAddr>> {
        self.recorded.replace(Some(Vec::new()))
    }

    /// Ends the recording [`Ctx::record_subchannels`] started: the
    /// addresses handed out since, which the recording it interrupted (if
    /// any) gets too.
    pub(crate) fn recorded_subchannels(&self, outer: Option<Vec<SocketAddr>>) -> Vec<SocketAddr> {
        let mine = self.recorded.replace(outer).unwrap_or_default();
        if let Some(outer) = self.recorded.borrow_mut().as_mut() {
            outer.extend_from_slice(&mine);
        }
        mine
    }

    /// Whether the pool has a live subchannel for `address` (with any
    /// credentials).
    pub(crate) fn has_subchannel(&self, address: SocketAddr) -> bool {
        self.pool.has_live(address)
    }

    /// The security for a cluster that asks for `tls` (gRFC A29): `None`
    /// without, or when the channel does not use xDS credentials.
    pub(crate) fn security_for(
        &self,
        tls: Option<&tether_xds::resource::security::UpstreamTls>,
    ) -> Result<Security, String> {
        match (tls, self.pool.providers()) {
            (Some(tls), Some(store)) => XdsSecurity::new(tls, store).map(|s| Some(Arc::new(s))),
            _ => Ok(None),
        }
    }

    /// A sender of events to the LB task, for pickers that must ask it to
    /// act ("hop into the control plane").
    pub fn events(&self) -> mpsc::UnboundedSender<Event> {
        self.events.clone()
    }

    /// Starts a timer that fires [`Event::Timer`] after `delay`.
    pub fn timer(&mut self, delay: Duration) -> Timer {
        *self.next_timer += 1;
        let token = TimerToken(*self.next_timer);
        let events = self.events.clone();
        let deadline = Instant::now() + delay;
        #[cfg(not(test))]
        let id = timers::schedule(deadline.into_std(), events, token);
        #[cfg(test)]
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let _ = events.send(Event::Timer(token));
        })
        .abort_handle();
        Timer {
            token,
            deadline,
            #[cfg(not(test))]
            id,
            #[cfg(test)]
            task,
        }
    }

    /// The LB task's clock.
    pub fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A policy's view for `tether call --stats` and [`crate::channel::Channel::stats`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicyStats {
    /// The policy's name, e.g. `priority`.
    pub policy: &'static str,
    /// The child's key in its parent (cluster, priority or locality name), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its connectivity state.
    pub state: ConnectivityState,
    /// Policy-specific facts (e.g. the chosen priority).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub facts: Vec<(String, String)>,
    /// Its subchannels (leaf policies).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<crate::subchannel::SubchannelStats>,
    /// Drain readiness per address (`xds_override_host`): sessions within
    /// its `idle_timeout` and health.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<override_host::AddressSessions>,
    /// Its children.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<PolicyStats>,
}

impl PolicyStats {
    /// The first node of this subtree (itself included, depth first) run
    /// by `policy`.
    pub fn find(&self, policy: &str) -> Option<&PolicyStats> {
        if self.policy == policy {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(policy))
    }

    /// The value of fact `name`, if the node has it.
    pub fn fact(&self, name: &str) -> Option<&str> {
        self.facts
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A load-balancing policy: one node of the tree. Every method runs on the
/// LB task; `update` and `event` return whether the policy's state or
/// picker changed, so the parent knows to rebuild its own.
pub trait LbPolicy: Send {
    /// A new config for this policy (its endpoints included). Returns whether
    /// its state or picker changed.
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool;
    /// A subchannel of the pool changed state, or a timer fired (maybe not
    /// this policy's: parents pass every event to their children).
    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool;
    /// Its connectivity state.
    fn state(&self) -> ConnectivityState;
    /// Its current picker.
    fn picker(&self) -> SharedPicker;
    /// A snapshot for operators.
    fn stats(&self) -> PolicyStats;
    /// Asked by a parent that does not keep children IDLE (as C-core's
    /// `weighted_target` does not): start connecting if IDLE. Returns
    /// whether its state or picker changed. Policies that never wait IDLE
    /// keep this default.
    fn exit_idle(&mut self, _ctx: &mut Ctx<'_>) -> bool {
        false
    }
}

/// A policy's config. The xDS policies get typed configs made by their
/// parent (endpoints travel inside them, split at each level); the
/// endpoint-picking policies are the ones a cluster's `lb_policy` names.
#[derive(Debug, Clone, PartialEq)]
pub enum LbConfig {
    /// `xds_cluster_manager`.
    ClusterManager(cluster_manager::Config),
    /// `cds`.
    Cds(cds::Config),
    /// `xds_cluster_impl`.
    ClusterImpl(cluster_impl::Config),
    /// `outlier_detection` (gRFC A50).
    OutlierDetection(outlier_detection::Config),
    /// `xds_override_host`.
    OverrideHost(override_host::Config),
    /// `priority`.
    Priority(priority::Config),
    /// `xds_wrr_locality`.
    WrrLocality(wrr_locality::Config),
    /// `weighted_target`.
    WeightedTarget(weighted_target::Config),
    /// `round_robin`.
    RoundRobin(round_robin::Config),
    /// `least_request` (gRFC A48).
    LeastRequest(least_request::Config),
    /// `weighted_round_robin` (gRFC A58).
    WeightedRoundRobin(weighted_round_robin::Config),
    /// `pick_first`.
    PickFirst(pick_first::Config),
    /// `ring_hash` (a ring, or a Maglev table when opted in).
    RingHash(ring_hash::Config),
    /// A policy from the channel's [`PolicyRegistry`] (gRFC A52).
    Custom(CustomConfig),
}

impl LbConfig {
    /// The policy's name as gRPC spells it.
    pub fn policy_name(&self) -> &'static str {
        match self {
            LbConfig::ClusterManager(_) => "xds_cluster_manager",
            LbConfig::Cds(_) => "cds",
            LbConfig::ClusterImpl(_) => "xds_cluster_impl",
            LbConfig::OutlierDetection(_) => "outlier_detection",
            LbConfig::OverrideHost(_) => "xds_override_host",
            LbConfig::Priority(_) => "priority",
            LbConfig::WrrLocality(_) => "xds_wrr_locality",
            LbConfig::WeightedTarget(_) => "weighted_target",
            LbConfig::RoundRobin(_) => "round_robin",
            LbConfig::LeastRequest(_) => "least_request",
            LbConfig::WeightedRoundRobin(_) => "weighted_round_robin",
            LbConfig::PickFirst(_) => "pick_first",
            LbConfig::RingHash(_) => "ring_hash",
            LbConfig::Custom(c) => c.policy.name(),
        }
    }

    /// A new policy for this config (not yet updated with it).
    pub fn build(&self) -> Box<dyn LbPolicy> {
        match self {
            LbConfig::ClusterManager(_) => Box::new(cluster_manager::ClusterManager::new()),
            LbConfig::Cds(_) => Box::new(cds::Cds::new()),
            LbConfig::ClusterImpl(_) => Box::new(cluster_impl::ClusterImpl::new()),
            LbConfig::OutlierDetection(_) => Box::new(outlier_detection::OutlierDetection::new()),
            LbConfig::OverrideHost(_) => Box::new(override_host::OverrideHost::new()),
            LbConfig::Priority(_) => Box::new(priority::Priority::new()),
            LbConfig::WrrLocality(_) => Box::new(wrr_locality::WrrLocality::new()),
            LbConfig::WeightedTarget(_) => Box::new(weighted_target::WeightedTarget::new()),
            LbConfig::RoundRobin(_) => Box::new(round_robin::RoundRobin::new()),
            LbConfig::LeastRequest(_) => Box::new(least_request::LeastRequest::new()),
            LbConfig::WeightedRoundRobin(_) => {
                Box::new(weighted_round_robin::WeightedRoundRobin::new())
            }
            LbConfig::PickFirst(_) => Box::new(pick_first::PickFirst::new()),
            LbConfig::RingHash(_) => Box::new(ring_hash::RingHash::new()),
            LbConfig::Custom(c) => match registry::builder_of(&c.policy) {
                Some(builder) => builder.build(),
                None => Box::new(registry::Unbuildable(c.policy.name())),
            },
        }
    }
}

/// A child policy and the config it was last given: a new config of the
/// same policy updates it, another policy replaces it.
pub struct Child {
    policy: Box<dyn LbPolicy>,
    name: &'static str,
}

impl Child {
    /// Builds the policy for `config` and gives it the config.
    pub fn new(ctx: &mut Ctx<'_>, config: LbConfig) -> Self {
        let mut policy = config.build();
        let name = config.policy_name();
        policy.update(ctx, config);
        Child { policy, name }
    }

    /// Updates the child in `slot` with `config`, building it the first time.
    pub fn update_in(slot: &mut Option<Child>, ctx: &mut Ctx<'_>, config: LbConfig) {
        match slot {
            Some(c) => {
                c.update(ctx, config);
            }
            None => *slot = Some(Child::new(ctx, config)),
        }
    }

    /// Updates the child, replacing it when the policy changed. Returns
    /// whether its state or picker changed.
    pub fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        if config.policy_name() != self.name {
            *self = Child::new(ctx, config);
            return true;
        }
        self.policy.update(ctx, config)
    }

    /// The policy.
    pub fn policy(&mut self) -> &mut dyn LbPolicy {
        self.policy.as_mut()
    }

    /// The policy, read-only.
    pub fn get(&self) -> &dyn LbPolicy {
        self.policy.as_ref()
    }

    /// Passes an event to the child; whether its state or picker changed.
    pub fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        self.policy.event(ctx, event)
    }
}

impl fmt::Debug for Child {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Child({})", self.name)
    }
}
