//! gRPC-style subchannels: one HTTP/2 (h2c) connection to one backend
//! address, with gRPC's connectivity states and connection backoff
//! (gRFC A62's subchannel behaviour).
//!
//! A [`Subchannel`] starts IDLE and connects only when asked
//! ([`Subchannel::request_connection`]). An attempt moves it to CONNECTING;
//! success to READY, where [`Subchannel::connection`] hands out the
//! connection; failure to TRANSIENT_FAILURE for one backoff delay, then back
//! to IDLE. A READY connection that ends also goes back to IDLE: the LB
//! policy above decides whether to connect again. Every change is reported
//! to the [`SubchannelPool`]'s [`StateListener`] and on [`Subchannel::watch`].
//!
//! Each subchannel has one background task that owns the connecting and the
//! backoff; the handles share it, and when the last handle is dropped the
//! task is aborted and its connection closed.

pub mod backoff;
mod connection;
pub(crate) mod pool;
mod state;

pub(crate) use connection::Chain;
pub use connection::{Connection, SendError};
pub use pool::SubchannelPool;
pub use state::ConnectivityState;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;

use crate::credentials::{TlsConfig, Transport};
use backoff::{Backoff, BackoffConfig};

/// Identifies one subchannel for as long as any handle to it lives; a
/// subchannel created later for the same address gets a new id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubchannelId(pub u64);

impl fmt::Display for SubchannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// How subchannels connect (gRPC's defaults via [`Default`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SubchannelOptions {
    /// Delays between failed attempts (gRPC's connection backoff).
    pub backoff: BackoffConfig,
    /// The least time one attempt may take; an attempt may take up to the
    /// current backoff delay when that is longer.
    pub min_connect_timeout: Duration,
    /// Seeds the backoff's jitter, for reproducible delays (tests).
    pub backoff_seed: Option<u64>,
    /// HTTP/2 keepalive (gRFC A8); off by default, as in gRPC clients.
    pub keepalive: Option<KeepaliveOptions>,
    /// TLS on every connection; plaintext HTTP/2 (h2c) when `None`, the
    /// default.
    pub tls: Option<TlsConfig>,
    /// TCP_NODELAY on every connection (on by default, as in gRPC and tonic).
    pub tcp_nodelay: bool,
    /// TCP keepalive probes after this idle time (off by default).
    pub tcp_keepalive: Option<Duration>,
    /// HTTP/2's initial stream window (hyper's default when `None`).
    pub initial_stream_window_size: Option<u32>,
    /// HTTP/2's initial connection window (hyper's default when `None`).
    pub initial_connection_window_size: Option<u32>,
    /// HTTP/2 windows sized by BDP estimates (overrides the sizes).
    pub http2_adaptive_window: bool,
    /// A `unix:` target's socket: every connection dials it.
    pub(crate) unix: Option<Arc<std::path::Path>>,
}

/// HTTP/2 keepalive as gRFC A8 and C-core define it: a connection that
/// does not answer a PING sent every `time` within `timeout` is closed
/// (its calls fail UNAVAILABLE, the subchannel leaves READY and the
/// policies move new calls elsewhere). A server that ends the connection
/// for pinging too often (GOAWAY ENHANCE_YOUR_CALM) makes the subchannel
/// double `time` for its next connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeepaliveOptions {
    /// How long between PINGs (`GRPC_ARG_KEEPALIVE_TIME_MS`).
    pub time: Duration,
    /// How long a PING may go unanswered (`GRPC_ARG_KEEPALIVE_TIMEOUT_MS`,
    /// 20 s by default).
    pub timeout: Duration,
    /// Whether to ping a connection with no call open
    /// (`GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS`, false by default).
    pub permit_without_calls: bool,
}

impl KeepaliveOptions {
    /// A PING every `time`, answered within C-core's default 20 s, only
    /// while calls are open.
    pub fn new(time: Duration) -> Self {
        KeepaliveOptions {
            time,
            timeout: Duration::from_secs(20),
            permit_without_calls: false,
        }
    }

    /// This with `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// This with pings while no call is open when `on`.
    pub fn permit_without_calls(mut self, on: bool) -> Self {
        self.permit_without_calls = on;
        self
    }
}

impl Default for SubchannelOptions {
    fn default() -> Self {
        SubchannelOptions {
            backoff: BackoffConfig::default(),
            min_connect_timeout: Duration::from_secs(20),
            backoff_seed: None,
            keepalive: None,
            tls: None,
            tcp_nodelay: true,
            tcp_keepalive: None,
            initial_stream_window_size: None,
            initial_connection_window_size: None,
            http2_adaptive_window: false,
            unix: None,
        }
    }
}

/// Called on every state change of any subchannel of the pool, from the
/// subchannel's task (must not block). A subchannel's initial IDLE is not
/// reported; a call may still arrive for a subchannel whose last handle was
/// just dropped.
pub type StateListener = Arc<dyn Fn(SubchannelId, SocketAddr, ConnectivityState) + Send + Sync>;

/// Counters and state of one subchannel, for status pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct SubchannelStats {
    /// The backend's address.
    pub address: String,
    /// The current state.
    pub state: ConnectivityState,
    /// Calls reported started ([`Subchannel::call_started`]).
    pub calls_started: u64,
    /// Calls reported finished successfully.
    pub calls_succeeded: u64,
    /// Calls reported finished with a failure.
    pub calls_failed: u64,
    /// Calls started and not yet finished.
    pub calls_in_flight: u64,
    /// Connection attempts made so far.
    pub connect_attempts: u64,
    /// Why the last attempt failed or the last connection closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The keepalive time its next connection uses (doubled by each
    /// too_many_pings GOAWAY), when keepalive is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keepalive_time_ms: Option<u64>,
}

/// A handle to one subchannel; clones are cheap and share it. Equal when
/// they are the same subchannel.
#[derive(Clone)]
pub struct Subchannel(Arc<Handle>);

/// What the handles share; the task is aborted when the last one goes.
struct Handle {
    shared: Arc<Shared>,
    task: Option<AbortHandle>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        self.shared.connection.store(None);
    }
}

/// A weak reference to a subchannel, as the pool keeps them.
pub(crate) struct WeakSubchannel(Weak<Handle>);

impl fmt::Debug for WeakSubchannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.upgrade() {
            Some(s) => write!(f, "WeakSubchannel({s:?})"),
            None => f.write_str("WeakSubchannel(gone)"),
        }
    }
}

impl WeakSubchannel {
    /// The subchannel, if any handle to it still lives.
    pub(crate) fn upgrade(&self) -> Option<Subchannel> {
        self.0.upgrade().map(Subchannel)
    }

    /// Whether every handle is gone.
    pub(crate) fn is_dead(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// Set on an IDLE state code by `request_connection`: the task consumes it
/// by moving to CONNECTING, so a request can never outlive its IDLE period.
const REQUESTED: u8 = 0x80;

fn code(state: ConnectivityState) -> u8 {
    match state {
        ConnectivityState::Idle => 0,
        ConnectivityState::Connecting => 1,
        ConnectivityState::Ready => 2,
        ConnectivityState::TransientFailure => 3,
    }
}

fn decode(code: u8) -> ConnectivityState {
    match code & !REQUESTED {
        0 => ConnectivityState::Idle,
        1 => ConnectivityState::Connecting,
        2 => ConnectivityState::Ready,
        _ => ConnectivityState::TransientFailure,
    }
}

/// The state shared by the handles and the background task.
struct Shared {
    id: SubchannelId,
    address: SocketAddr,
    /// A state code, with [`REQUESTED`] possibly set on IDLE.
    state: AtomicU8,
    /// Wakes the task when a connection is requested.
    wake: Notify,
    state_tx: watch::Sender<ConnectivityState>,
    last_error: Mutex<Option<String>>,
    connection: ArcSwapOption<Connection>,
    /// The serial of the last connection a call found going away
    /// ([`Subchannel::connection_lost`]); the task then lets it go.
    lost: AtomicU64,
    /// Wakes the task when a call reports its connection lost.
    lost_wake: Notify,
    /// Keepalive as configured, and its current time (doubled on each
    /// too_many_pings GOAWAY).
    keepalive: Option<KeepaliveOptions>,
    keepalive_time_ms: AtomicU64,
    calls_started: AtomicU64,
    calls_succeeded: AtomicU64,
    calls_failed: AtomicU64,
    calls_in_flight: AtomicU64,
    connect_attempts: AtomicU64,
    listener: StateListener,
    /// Told of each connection attempt and connection (gRFC A94's
    /// instruments), when the channel records them.
    metrics: Option<Arc<dyn ConnectionEvents>>,
}

impl Shared {
    /// Moves to `new` (only the task calls this) and tells everyone.
    fn set_state(&self, new: ConnectivityState, error: Option<String>) {
        let old = decode(self.state.swap(code(new), Ordering::AcqRel));
        self.announce(old, new, error);
    }

    fn announce(&self, old: ConnectivityState, new: ConnectivityState, error: Option<String>) {
        match &error {
            Some(e) => log::info!("subchannel {}: {old} -> {new}: {e}", self.address),
            None => log::info!("subchannel {}: {old} -> {new}", self.address),
        }
        if error.is_some() {
            // Before the listener runs, so it can read why.
            *self
                .last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = error;
        }
        self.state_tx.send_replace(new);
        (self.listener)(self.id, self.address, new);
    }

    /// Doubles the keepalive time after a too_many_pings GOAWAY, as C-core
    /// does (capped at i32::MAX ms, C-core's integer).
    fn throttle_keepalive(&self) {
        let old = self.keepalive_time_ms.load(Ordering::Relaxed);
        let new = old.saturating_mul(2).min(i32::MAX as u64);
        self.keepalive_time_ms.store(new, Ordering::Relaxed);
        log::warn!(
            "subchannel {}: the server sent too_many_pings: keepalive time {old} ms -> {new} ms",
            self.address
        );
    }

    /// Completes once a call reported connection `serial` lost.
    async fn lost(&self, serial: u64) {
        loop {
            let notified = self.lost_wake.notified();
            if self.lost.load(Ordering::Acquire) == serial {
                return;
            }
            notified.await;
        }
    }

    /// Waits in IDLE until a connection is requested, then moves to CONNECTING.
    async fn requested(&self) {
        loop {
            let took = self.state.compare_exchange(
                code(ConnectivityState::Idle) | REQUESTED,
                code(ConnectivityState::Connecting),
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            if took.is_ok() {
                break;
            }
            // A stale permit only costs one more look at the state.
            self.wake.notified().await;
        }
        self.announce(ConnectivityState::Idle, ConnectivityState::Connecting, None);
    }
}

/// The subchannel's background task: connect when asked, hold the
/// connection while it lives, back off after failures.
///
/// Its future lives as long as the subchannel, so it is kept small (a
/// channel can have 100,000 of them): what only an attempt or a connection
/// needs is in futures boxed for their time ([`attempt`], [`hold`]).
async fn run(
    shared: Arc<Shared>,
    mut backoff: Backoff,
    min_connect_timeout: Duration,
    transport: Transport,
    socket: Arc<connection::SocketOptions>,
) {
    let mut serial = 0;
    loop {
        shared.requested().await;
        // gRPC: an attempt may take as long as the delay before the next one.
        let delay = backoff.next_delay();
        let timeout = delay.max(min_connect_timeout);
        match Box::pin(attempt(&shared, timeout, &transport, &socket, serial + 1)).await {
            Ok(()) => {
                backoff.reset();
                serial += 1;
            }
            Err(e) => {
                shared.set_state(ConnectivityState::TransientFailure, Some(e));
                tokio::time::sleep(delay).await;
                shared.set_state(ConnectivityState::Idle, None);
            }
        }
    }
}

/// One connection attempt and, when it succeeds, the connection's life
/// (READY until it ends, then IDLE); the attempt's error otherwise.
async fn attempt(
    shared: &Arc<Shared>,
    timeout: Duration,
    transport: &Transport,
    socket: &connection::SocketOptions,
    serial: u64,
) -> Result<(), String> {
    shared.connect_attempts.fetch_add(1, Ordering::Relaxed);
    let keepalive = shared.keepalive.map(|mut k| {
        k.time = Duration::from_millis(shared.keepalive_time_ms.load(Ordering::Relaxed));
        k
    });
    let connected =
        connection::connect(shared.address, timeout, keepalive, transport, socket).await;
    let (mut conn, task) = match connected {
        Ok(c) => c,
        Err(e) => {
            if let Some(m) = &shared.metrics {
                m.attempt_failed();
            }
            return Err(e.to_string());
        }
    };
    // Open until it ends (or until the subchannel's task is aborted).
    let open = shared.metrics.as_ref().map(|m| {
        m.connected();
        OpenConnection {
            events: m.clone(),
            ended: false,
        }
    });
    conn.serial = serial;
    shared.connection.store(Some(Arc::new(conn)));
    shared.set_state(ConnectivityState::Ready, None);
    let (why, kind) = hold(shared, task, keepalive.is_some(), serial).await;
    if let Some(open) = open {
        open.ended(kind);
    }
    shared.connection.store(None);
    shared.set_state(ConnectivityState::Idle, Some(why));
    Ok(())
}

/// What a subchannel tells of its connections (gRFC A94's instruments
/// listen): each failed attempt, each connection made, and why each ended
/// (A94's `grpc.disconnect_error`).
pub(crate) trait ConnectionEvents: Send + Sync + fmt::Debug {
    /// A connection attempt failed.
    fn attempt_failed(&self);
    /// A connection attempt succeeded.
    fn connected(&self);
    /// A connection ended, for `why`.
    fn disconnected(&self, why: &'static str);
}

/// Makes each new subchannel's [`ConnectionEvents`] listener, with the
/// cluster (backend service) and locality of the LB subtree that made it.
pub(crate) trait ConnectionEventsFor: Send + Sync + fmt::Debug {
    /// The listener of a subchannel made under `backend_service` and
    /// `locality` (either unknown: `None`).
    fn for_subchannel(
        &self,
        backend_service: Option<&Arc<str>>,
        locality: Option<&Arc<str>>,
    ) -> Arc<dyn ConnectionEvents>;
}

/// A connection [`ConnectionEvents`] was told of, until it ends; dropped
/// unended (the subchannel's task aborted), it ended as a shutdown.
struct OpenConnection {
    events: Arc<dyn ConnectionEvents>,
    ended: bool,
}

impl OpenConnection {
    fn ended(mut self, why: &'static str) {
        self.ended = true;
        self.events.disconnected(why);
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if !self.ended {
            self.events.disconnected("subchannel shutdown");
        }
    }
}

/// Waits until connection `serial` ends or a call finds it going away;
/// why it was let go, and A94's name for it.
async fn hold(
    shared: &Shared,
    mut task: connection::ConnectionTask,
    keepalive: bool,
    serial: u64,
) -> (String, &'static str) {
    tokio::select! {
        closed = task.closed() => {
            if keepalive && closed.too_many_pings() {
                shared.throttle_keepalive();
            }
            (closed.to_string(), connection::disconnect_error(&closed))
        }
        () = shared.lost(serial) => {
            // Calls already on it finish there (a GOAWAY's streams go
            // on); new ones wait for a new one.
            tokio::spawn(async move {
                let closed = task.closed().await;
                log::debug!("a connection let go of ended: {closed}");
            });
            (
                "connection going away: it gave a request back unsent".to_owned(),
                // Why it goes is not known yet (most often a GOAWAY).
                "unknown",
            )
        }
    }
}

impl Subchannel {
    /// A new IDLE subchannel whose task runs on `runtime`.
    pub(crate) fn new(
        id: SubchannelId,
        address: SocketAddr,
        options: &SubchannelOptions,
        listener: StateListener,
        runtime: Option<&tokio::runtime::Handle>,
        transport: Transport,
        metrics: Option<Arc<dyn ConnectionEvents>>,
    ) -> Subchannel {
        let (state_tx, _) = watch::channel(ConnectivityState::Idle);
        let shared = Arc::new(Shared {
            id,
            address,
            state: AtomicU8::new(code(ConnectivityState::Idle)),
            wake: Notify::new(),
            state_tx,
            last_error: Mutex::new(None),
            connection: ArcSwapOption::empty(),
            calls_started: AtomicU64::new(0),
            calls_succeeded: AtomicU64::new(0),
            calls_failed: AtomicU64::new(0),
            calls_in_flight: AtomicU64::new(0),
            connect_attempts: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            lost_wake: Notify::new(),
            keepalive: options.keepalive,
            keepalive_time_ms: AtomicU64::new(
                options
                    .keepalive
                    .map_or(0, |k| u64::try_from(k.time.as_millis()).unwrap_or(u64::MAX)),
            ),
            listener,
            metrics,
        });
        let backoff = match options.backoff_seed {
            Some(seed) => Backoff::with_seed(options.backoff, seed),
            None => Backoff::new(options.backoff),
        };
        let task = match runtime {
            Some(rt) => Some(
                rt.spawn(run(
                    shared.clone(),
                    backoff,
                    options.min_connect_timeout,
                    transport,
                    Arc::new(connection::SocketOptions::from(options)),
                ))
                .abort_handle(),
            ),
            None => {
                log::error!("subchannel {address}: no tokio runtime, it will never connect");
                None
            }
        };
        Subchannel(Arc::new(Handle { shared, task }))
    }

    /// A weak reference, which does not keep the subchannel alive.
    pub(crate) fn downgrade(&self) -> WeakSubchannel {
        WeakSubchannel(Arc::downgrade(&self.0))
    }

    fn shared(&self) -> &Shared {
        &self.0.shared
    }

    /// Its id.
    pub fn id(&self) -> SubchannelId {
        self.shared().id
    }

    /// The backend's address.
    pub fn address(&self) -> SocketAddr {
        self.shared().address
    }

    /// The current state.
    pub fn state(&self) -> ConnectivityState {
        decode(self.shared().state.load(Ordering::Acquire))
    }

    /// Why the last attempt failed or the last connection closed (kept
    /// after a later success).
    pub fn last_error(&self) -> Option<String> {
        self.shared()
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Starts connecting if IDLE; does nothing in any other state (as
    /// gRPC, a request during TRANSIENT_FAILURE is not remembered).
    pub fn request_connection(&self) {
        let shared = self.shared();
        let asked = shared.state.compare_exchange(
            code(ConnectivityState::Idle),
            code(ConnectivityState::Idle) | REQUESTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if asked.is_ok() {
            log::debug!("subchannel {}: connection requested", shared.address);
            shared.wake.notify_one();
        }
    }

    /// Whether a connection was requested and not yet taken up (tests of
    /// policies over subchannels that have no task to take it up).
    #[cfg(test)]
    pub(crate) fn connection_requested(&self) -> bool {
        self.shared().state.load(Ordering::Acquire) & REQUESTED != 0
    }

    /// Clears a pending request, as a task taking it up would.
    #[cfg(test)]
    pub(crate) fn take_connection_request(&self) -> bool {
        self.shared().state.fetch_and(!REQUESTED, Ordering::AcqRel) & REQUESTED != 0
    }

    /// The connection, only while READY and open: one hyper knows is
    /// closed is reported lost ([`Subchannel::connection_lost`]) instead.
    pub fn connection(&self) -> Option<Connection> {
        let connection = self.shared().connection.load().as_deref().cloned()?;
        if connection.is_closed() {
            self.connection_lost(&connection);
            return None;
        }
        Some(connection)
    }

    /// A call found `connection` going away (it gave a request back
    /// unsent, or hyper reports it closed): it is handed out no more, and
    /// the subchannel goes IDLE at once, so the policies publish a picker
    /// that knows, while calls already on it finish there. A report about
    /// an older connection changes nothing.
    pub fn connection_lost(&self, connection: &Connection) {
        let shared = self.shared();
        let current = shared.connection.load_full();
        if current
            .as_ref()
            .is_some_and(|c| c.serial == connection.serial)
        {
            // Only that connection: the task may have stored a newer one.
            shared.connection.compare_and_swap(&current, None);
            shared.lost.store(connection.serial, Ordering::Release);
            shared.lost_wake.notify_one();
        }
    }

    /// A receiver of the state, current value first.
    pub fn watch(&self) -> watch::Receiver<ConnectivityState> {
        self.shared().state_tx.subscribe()
    }

    /// Counts a call started on this subchannel.
    pub fn call_started(&self) {
        let shared = self.shared();
        shared.calls_started.fetch_add(1, Ordering::Relaxed);
        shared.calls_in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call finished, successfully or not.
    pub fn call_finished(&self, ok: bool) {
        let shared = self.shared();
        let counter = if ok {
            &shared.calls_succeeded
        } else {
            &shared.calls_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        // Saturating: a finish without a start must not wrap around.
        let _ = shared
            .calls_in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Takes back a [`Subchannel::call_started`] whose request the
    /// connection gave back unsent: it did not go out here.
    pub fn call_released(&self) {
        let shared = self.shared();
        for counter in [&shared.calls_started, &shared.calls_in_flight] {
            let _ =
                counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Its counters and state.
    pub fn stats(&self) -> SubchannelStats {
        let shared = self.shared();
        SubchannelStats {
            address: shared.address.to_string(),
            state: self.state(),
            calls_started: shared.calls_started.load(Ordering::Relaxed),
            calls_succeeded: shared.calls_succeeded.load(Ordering::Relaxed),
            calls_failed: shared.calls_failed.load(Ordering::Relaxed),
            calls_in_flight: shared.calls_in_flight.load(Ordering::Relaxed),
            connect_attempts: shared.connect_attempts.load(Ordering::Relaxed),
            last_error: self.last_error(),
            keepalive_time_ms: shared
                .keepalive
                .as_ref()
                .map(|_| shared.keepalive_time_ms.load(Ordering::Relaxed)),
        }
    }
}

impl PartialEq for Subchannel {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for Subchannel {}

impl std::hash::Hash for Subchannel {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id().hash(state);
    }
}

impl fmt::Debug for Subchannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subchannel")
            .field("id", &self.id().0)
            .field("address", &self.address())
            .field("state", &self.state())
            .finish()
    }
}

#[cfg(test)]
pub(super) mod tests {
    //! Real sockets on 127.0.0.1 throughout. Tests with a paused clock rely
    //! on tokio advancing it only while every task waits: a connect to a
    //! refused loopback port completes at once, so no time passes in it.

    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use prost::Message;
    use tether_proto::demo::v1::{EchoReply, EchoRequest};
    use tether_testkit::backend::HttpBackend;
    use tether_testkit::grpc::GrpcBackend;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;
    use tokio::time::{timeout, Instant};

    /// Bound on any wait for the network or a state change.
    pub(crate) const WAIT: Duration = Duration::from_secs(10);

    /// One listener call, with the (tokio) time it was made.
    pub(crate) type Event = (SubchannelId, ConnectivityState, Instant);

    /// A listener that records every call.
    pub(crate) fn recorder() -> (StateListener, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let listener: StateListener = Arc::new(move |id, _, state| {
            let _ = tx.send((id, state, Instant::now()));
        });
        (listener, rx)
    }

    /// The next listener call.
    pub(crate) async fn next(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
        timeout(Duration::from_secs(60), events.recv())
            .await
            .expect("no state change in time")
            .expect("listener dropped")
    }

    /// Waits until `subchannel` is in `state`.
    pub(crate) async fn wait_state(subchannel: &Subchannel, state: ConnectivityState) {
        let mut watch = subchannel.watch();
        timeout(WAIT, watch.wait_for(|s| *s == state))
            .await
            .unwrap_or_else(|_| panic!("{subchannel:?} not {state} in time"))
            .expect("subchannel gone");
    }

    /// An address on 127.0.0.1 that refuses connections.
    pub(crate) async fn refused_addr() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr")
    }

    /// A server that accepts TCP and never says anything, holding each socket.
    pub(crate) async fn silent_server() -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
        raw_server(&[]).await
    }

    /// A server that sends an empty SETTINGS frame and then only reads.
    pub(crate) async fn settings_server() -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
        raw_server(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await
    }

    /// Accepts connections, writes `greeting` on each, reads until the
    /// client closes, then reports the close.
    async fn raw_server(greeting: &'static [u8]) -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (closed_tx, closed_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let closed_tx = closed_tx.clone();
                tokio::spawn(async move {
                    if socket.write_all(greeting).await.is_ok() {
                        let mut buf = [0u8; 1024];
                        while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
                    }
                    let _ = closed_tx.send(());
                });
            }
        });
        (addr, closed_rx)
    }

    /// A unary `Echo` call built by hand: gRPC's 5-byte frame header, then
    /// the message.
    pub(crate) async fn echo(conn: &Connection, addr: SocketAddr, message: &str) -> EchoReply {
        let payload = EchoRequest {
            message: message.into(),
        }
        .encode_to_vec();
        let mut frame = vec![0u8];
        frame.extend_from_slice(&u32::try_from(payload.len()).expect("len").to_be_bytes());
        frame.extend_from_slice(&payload);
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("http://{addr}/tether.demo.v1.Echo/Echo"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(Full::new(Bytes::from(frame))))
            .expect("request");
        let response = timeout(WAIT, conn.send(request))
            .await
            .expect("no response in time")
            .expect("send");
        assert_eq!(response.status(), http::StatusCode::OK);
        let body = timeout(WAIT, response.into_body().collect())
            .await
            .expect("no body in time")
            .expect("body");
        let status = body
            .trailers()
            .and_then(|t| t.get("grpc-status"))
            .map(|v| v.to_str().expect("ascii").to_string());
        assert_eq!(status.as_deref(), Some("0"), "grpc-status");
        let bytes = body.to_bytes();
        assert!(bytes.len() >= 5, "short reply: {bytes:?}");
        assert_eq!(bytes[0], 0, "compressed reply");
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        EchoReply::decode(&bytes[5..5 + len]).expect("decode reply")
    }

    fn pool(options: SubchannelOptions) -> (SubchannelPool, mpsc::UnboundedReceiver<Event>) {
        let (listener, events) = recorder();
        (SubchannelPool::new(options, listener), events)
    }

    #[tokio::test]
    async fn idle_until_requested_then_ready_and_serves_a_grpc_call() {
        let backend = GrpcBackend::start("b1").await;
        let (pool, mut events) = pool(SubchannelOptions::default());
        let sc = pool.get(backend.addr());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(sc.state(), ConnectivityState::Idle);
        assert!(sc.connection().is_none());
        assert!(events.try_recv().is_err(), "nothing happens until asked");

        sc.request_connection();
        let (id, state, _) = next(&mut events).await;
        assert_eq!((id, state), (sc.id(), ConnectivityState::Connecting));
        let (id, state, _) = next(&mut events).await;
        assert_eq!((id, state), (sc.id(), ConnectivityState::Ready));
        assert_eq!(sc.state(), ConnectivityState::Ready);
        assert_eq!(*sc.watch().borrow(), ConnectivityState::Ready);
        // Asking again while READY does nothing.
        sc.request_connection();

        let conn = sc.connection().expect("connection while READY");
        sc.call_started();
        let reply = echo(&conn, backend.addr(), "hi").await;
        sc.call_finished(true);
        assert_eq!(reply.backend, "b1");
        assert_eq!(reply.message, "hi");
        // A second call reuses the same connection.
        assert_eq!(echo(&conn, backend.addr(), "again").await.served, 2);
        sc.call_started();
        sc.call_finished(false);

        let stats = sc.stats();
        assert_eq!(
            stats,
            SubchannelStats {
                address: backend.addr().to_string(),
                state: ConnectivityState::Ready,
                calls_started: 2,
                calls_succeeded: 1,
                calls_failed: 1,
                calls_in_flight: 0,
                connect_attempts: 1,
                last_error: None,
                keepalive_time_ms: None,
            }
        );
        let json = serde_json::to_value(&stats).expect("json");
        assert_eq!(json["state"], "READY");
        assert!(json.get("last_error").is_none());
        assert!(events.try_recv().is_err(), "no further changes: {events:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn refused_is_transient_failure_then_idle_after_each_backoff_delay() {
        let addr = refused_addr().await;
        let seed = 7;
        let options = SubchannelOptions {
            backoff_seed: Some(seed),
            ..SubchannelOptions::default()
        };
        let mut expected = Backoff::with_seed(options.backoff, seed);
        let (pool, mut events) = pool(options);
        let sc = pool.get(addr);
        let mut base = Duration::from_secs(1);
        for attempt in 0..2 {
            sc.request_connection();
            assert_eq!(next(&mut events).await.1, ConnectivityState::Connecting);
            let (_, state, failed_at) = next(&mut events).await;
            assert_eq!(state, ConnectivityState::TransientFailure);
            let error = sc.last_error().expect("last_error");
            assert!(
                error.starts_with(&format!("connect {addr} failed: ")) && error.contains("refused"),
                "{error}"
            );
            assert!(sc.connection().is_none());
            // Ignored: gRPC does not remember it for after the backoff.
            sc.request_connection();

            let (_, state, idle_at) = next(&mut events).await;
            assert_eq!(state, ConnectivityState::Idle);
            let waited = idle_at - failed_at;
            let want = expected.next_delay();
            // The timer wheel rounds up to the millisecond.
            assert!(
                waited >= want && waited <= want + Duration::from_millis(1),
                "attempt {attempt}: waited {waited:?}, want {want:?}"
            );
            assert!(
                want >= base.mul_f64(0.8) && want <= base.mul_f64(1.2),
                "attempt {attempt}: {want:?} not within 20% of {base:?}"
            );
            base = base.mul_f64(1.6);

            tokio::time::sleep(Duration::from_secs(300)).await;
            assert_eq!(
                sc.state(),
                ConnectivityState::Idle,
                "no reconnect by itself"
            );
            assert!(events.try_recv().is_err());
        }
    }

    #[tokio::test]
    async fn ready_goes_idle_when_the_server_goes_away() {
        let backend = HttpBackend::start("h2").await;
        let (pool, mut events) = pool(SubchannelOptions::default());
        let sc = pool.get(backend.addr());
        sc.request_connection();
        wait_state(&sc, ConnectivityState::Ready).await;
        assert!(sc.connection().is_some());
        assert_eq!(next(&mut events).await.1, ConnectivityState::Connecting);
        assert_eq!(next(&mut events).await.1, ConnectivityState::Ready);

        backend.stop().await;
        let (id, state, _) = next(&mut events).await;
        assert_eq!((id, state), (sc.id(), ConnectivityState::Idle));
        assert_eq!(sc.state(), ConnectivityState::Idle);
        assert!(sc.connection().is_none());
        let error = sc.last_error().expect("why it closed");
        assert!(error.starts_with("connection"), "{error}");

        // Connecting again is the policy's call; the port now refuses.
        sc.request_connection();
        assert_eq!(next(&mut events).await.1, ConnectivityState::Connecting);
        assert_eq!(
            next(&mut events).await.1,
            ConnectivityState::TransientFailure
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_gets_no_http2_answer_times_out_after_min_connect_timeout() {
        let (addr, mut closed) = silent_server().await;
        let (pool, mut events) = pool(SubchannelOptions {
            backoff_seed: Some(1),
            ..SubchannelOptions::default()
        });
        let sc = pool.get(addr);
        sc.request_connection();
        let (_, state, started) = next(&mut events).await;
        assert_eq!(state, ConnectivityState::Connecting);
        let (_, state, failed) = next(&mut events).await;
        assert_eq!(state, ConnectivityState::TransientFailure);
        let took = failed - started;
        assert!(
            took >= Duration::from_secs(20) && took <= Duration::from_millis(20_001),
            "failed after {took:?}"
        );
        let error = sc.last_error().expect("last_error");
        assert_eq!(error, format!("connect {addr} timed out after 20s"));
        // The abandoned attempt's socket is closed.
        timeout(WAIT, closed.recv())
            .await
            .expect("attempt's socket not closed")
            .expect("server gone");
    }

    #[tokio::test]
    async fn last_handle_dropped_closes_the_connection() {
        let (addr, mut closed) = settings_server().await;
        let (pool, _events) = pool(SubchannelOptions::default());
        let sc = pool.get(addr);
        sc.request_connection();
        wait_state(&sc, ConnectivityState::Ready).await;
        let conn = sc.connection().expect("connection");
        drop(sc);
        timeout(WAIT, closed.recv())
            .await
            .expect("connection not closed")
            .expect("server gone");
        // A clone taken before the drop fails instead of hanging.
        let request = http::Request::new(tonic::body::Body::empty());
        let sent = timeout(WAIT, conn.send(request)).await.expect("send hung");
        assert!(sent.is_err());
    }

    #[tokio::test]
    async fn last_handle_dropped_aborts_an_attempt() {
        let (addr, mut closed) = silent_server().await;
        let (pool, mut events) = pool(SubchannelOptions::default());
        let sc = pool.get(addr);
        sc.request_connection();
        assert_eq!(next(&mut events).await.1, ConnectivityState::Connecting);
        // Let the TCP connect finish.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(sc);
        timeout(WAIT, closed.recv())
            .await
            .expect("attempt's socket not closed")
            .expect("server gone");
    }

    #[test]
    fn runtime_shutdown_and_a_later_drop_do_not_panic() {
        let server = tokio::runtime::Runtime::new().expect("server runtime");
        let (addr, mut closed) = server.block_on(settings_server());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let sc = runtime.block_on(async {
            let (pool, _events) = pool(SubchannelOptions::default());
            let sc = pool.get(addr);
            sc.request_connection();
            wait_state(&sc, ConnectivityState::Ready).await;
            sc
        });
        // Drops the subchannel's and the connection's tasks.
        drop(runtime);
        server.block_on(async {
            timeout(WAIT, closed.recv())
                .await
                .expect("connection not closed with its runtime")
                .expect("server gone");
        });
        sc.request_connection();
        drop(sc);
    }
}
