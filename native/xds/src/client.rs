//! The XdsClient: one ADS state-of-the-world stream per server, a cache of
//! validated resources, and watchers that see each resource's state.
//!
//! Failure behaviour follows gRFC A57:
//! - a stream that ends before any response is a connectivity error, sent to
//!   every watcher of that stream (as the resource error when nothing is
//!   cached, as an ambient error beside a cached resource), and the next
//!   attempt waits with exponential backoff ([`super::backoff`]);
//! - a stream that ends after a response is not an error: a new stream
//!   starts at once and resubscribes with the last ACKed versions and an
//!   empty nonce; the backoff is reset;
//! - the does-not-exist timer (15 s) of a resource starts only once its
//!   subscription went out on a stream the server has accepted, never for a
//!   cached resource, and starts again on a new stream while still uncached.
//!
//! "Accepted" means the server answered the call's headers: the connection
//! is up and the stream reached the server (the ADS server of tonic and of
//! go-control-plane answer headers at once).
//!
//! This module is the public API and the watchers' registry. Inside:
//! - `state`: the protocol (versions, nonces, ACK and NACK, the cache, the
//!   timers, A57's and A88's decisions) as a state machine without I/O,
//!   taking events and the time and returning requests and states;
//! - `actor`: the task that runs the stream, the backoff and the timer, and
//!   carries the state machine's actions out;
//! - `connect`: the connection to the server (TCP, TLS, Unix sockets);
//! - `pool`: the process's clients, for sharing and for CSDS.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::Any;
use tokio::sync::{broadcast, mpsc, watch};

use super::backoff::{Backoff, BackoffConfig};
use super::bootstrap::{Bootstrap, BootstrapError};
use super::error::XdsError;
use super::resource::{Resource, ResourceKind, ValidationError, ValidationOptions};

mod actor;
mod connect;
mod lrs;
mod pool;
mod state;
pub mod stats;

pub use lrs::SEND_ALL_CLUSTERS;
pub use stats::{XdsClientFigures, XdsClientMetrics};

/// gRFC A57's does-not-exist timeout.
pub const DOES_NOT_EXIST_TIMEOUT: Duration = Duration::from_secs(15);

/// Where a watched resource stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResourceStatus {
    /// Subscribed; nothing received yet.
    Requested,
    /// The server sent it and it was ACKed in this version.
    Acked {
        /// The response's `version_info`.
        version: String,
    },
    /// The last version the server sent was invalid and NACKed; `resource`
    /// still holds the previous valid one, if any.
    Nacked {
        /// The rejected `version_info`.
        version: String,
        /// Why.
        error: ValidationError,
    },
    /// Not sent within the does-not-exist timeout, or deleted by the server.
    DoesNotExist,
    /// Not sent within the resource timer of a server with
    /// `resource_timer_is_transient_error` (gRFC A88): CSDS `TIMEOUT`.
    Timeout,
    /// The server reported an error for it in the response's
    /// `resource_errors` (xRFC TP3, read with gRFC A88): CSDS
    /// `RECEIVED_ERROR`. `resource` keeps the cached one unless the server
    /// has `fail_on_data_errors` and the code is `NOT_FOUND` or
    /// `PERMISSION_DENIED`.
    ReceivedError {
        /// The response's `version_info`.
        version: String,
        /// The status the server reported.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
}

/// Everything a watcher knows about one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceState {
    /// The last valid resource (kept across NACKs and connectivity errors).
    pub resource: Option<Resource>,
    /// The version in which `resource` was ACKed: after a NACK this is the
    /// last good version, which the status no longer carries.
    pub resource_version: Option<String>,
    /// Where the resource stands.
    pub status: ResourceStatus,
    /// The latest error: with `resource` present an ambient error (keep
    /// using the resource), without it the reason there is none.
    pub error: Option<XdsError>,
    /// `resource` as the server sent it (its `Any`), for CSDS.
    pub raw: Option<Arc<Any>>,
    /// When `resource` was last received.
    pub updated: Option<SystemTime>,
    /// The last update of this resource that failed (a NACK, or the
    /// server removing it), until one is accepted: CSDS's `error_state`.
    pub rejected: Option<Rejection>,
}

/// An update of one resource that failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// When it arrived.
    pub at: SystemTime,
    /// The response's version.
    pub version: String,
    /// Why it failed: the NACK's reason, `does not exist` (C-core's words
    /// for a resource the server removed), or the message of an error the
    /// server reported.
    pub details: String,
    /// What the server sent, for a NACK.
    pub raw: Option<Arc<Any>>,
}

impl ResourceState {
    fn requested() -> Self {
        ResourceState {
            resource: None,
            resource_version: None,
            status: ResourceStatus::Requested,
            error: None,
            raw: None,
            updated: None,
            rejected: None,
        }
    }

    /// Records a failed update, dropping the cached resource if asked.
    fn fail(&mut self, rejection: Rejection, drop_cached: bool) {
        if drop_cached {
            self.resource = None;
            self.resource_version = None;
            self.raw = None;
        }
        self.rejected = Some(rejection);
    }

    /// Whether the error is ambient (a resource is cached beside it).
    pub fn is_ambient_error(&self) -> bool {
        self.resource.is_some() && self.error.is_some()
    }
}

type Key = (ResourceKind, String);

struct Entry {
    tx: watch::Sender<ResourceState>,
    watchers: usize,
}

#[derive(Default)]
struct Registry {
    entries: HashMap<Key, Entry>,
}

impl Registry {
    /// The names of `kind` to subscribe to, for a request about to be
    /// sent: entries no watcher holds any more are dropped here, as the
    /// request unsubscribes them (until then a new watcher finds the
    /// resource still cached, which the server will not send again).
    fn names(&mut self, kind: ResourceKind) -> Vec<String> {
        self.entries
            .retain(|(k, _), e| *k != kind || e.watchers > 0);
        let set: BTreeSet<&str> = self
            .entries
            .keys()
            .filter(|(k, _)| *k == kind)
            .map(|(_, n)| n.as_str())
            .collect();
        set.into_iter().map(str::to_owned).collect()
    }
}

enum Cmd {
    /// The set of names of a kind changed (a first watcher or a last one left).
    Changed(ResourceKind),
}

struct Shared {
    registry: Mutex<Registry>,
    cmd_tx: mpsc::UnboundedSender<Cmd>,
    events: broadcast::Sender<(ResourceKind, String)>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding the lock cannot leave the map half-updated
        // in a way that matters more than losing the client, so recover.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Stopper(tokio::task::AbortHandle);

impl Drop for Stopper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Knobs for tests and tools; [`Default`] gives gRPC's values.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Backoff between stream attempts that got no response.
    pub backoff: BackoffConfig,
    /// A fixed backoff jitter seed (reproducible delays), or random.
    pub backoff_seed: Option<u64>,
    /// The does-not-exist timeout.
    pub does_not_exist_timeout: Duration,
    /// What resource validation accepts beyond gRPC's rules (default:
    /// nothing, so the client NACKs what gRPC NACKs), e.g. MAGLEV clusters.
    pub validation: ValidationOptions,
    /// gRFC A88's data error handling, as C-core runs it behind
    /// `GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING` (the default reads that
    /// variable, off when unset): a NACK or an LDS/CDS deletion then drops
    /// the cached resource only with the server feature
    /// `fail_on_data_errors`, and `ignore_resource_deletion` is ignored.
    pub data_error_handling: bool,
    /// gRFC A97's `call_creds` in the bootstrap, as C-core runs them behind
    /// `GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS` (the default reads that
    /// variable, off when unset): `jwt_token_file` sends the file's JWT on
    /// each ADS stream, over TLS only.
    pub bootstrap_call_creds: bool,
}

/// Whether `GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING` is set to a true
/// value (`true`, `yes`, `1`, any case), as C-core reads it.
pub fn data_error_handling_from_env() -> bool {
    crate::env::flag("GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING")
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            backoff: BackoffConfig::default(),
            backoff_seed: None,
            does_not_exist_timeout: DOES_NOT_EXIST_TIMEOUT,
            validation: ValidationOptions::default(),
            data_error_handling: data_error_handling_from_env(),
            bootstrap_call_creds: crate::call_creds::enabled_from_env(),
        }
    }
}

/// An xDS client talking to the bootstrap's first server. Cheap to clone;
/// the stream stops when the last clone is dropped.
#[derive(Clone)]
pub struct XdsClient {
    shared: Arc<Shared>,
    server_uri: Arc<str>,
    node_id: Arc<str>,
    node: Arc<Node>,
    scope: Arc<str>,
    certificate_providers:
        Arc<std::collections::BTreeMap<String, crate::bootstrap::CertificateProvider>>,
    load: Arc<LoadReporting>,
    /// What gRFC A78's metrics read.
    stats: Arc<stats::ClientStats>,
    _stopper: Arc<Stopper>,
}

/// The client's load reporting: its store, and the LRS stream started on
/// the first cluster that reports.
struct LoadReporting {
    store: crate::load_report::LoadStore,
    /// Taken by the first [`XdsClient::report_load`].
    start: Mutex<Option<lrs::Lrs>>,
    stream: std::sync::OnceLock<Stopper>,
}

impl std::fmt::Debug for XdsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsClient")
            .field("server_uri", &self.server_uri)
            .field("node_id", &self.node_id)
            .finish()
    }
}

impl XdsClient {
    /// Starts a client on the current tokio runtime with gRPC's defaults.
    pub fn start(bootstrap: Bootstrap) -> Result<Self, BootstrapError> {
        XdsClient::start_with(bootstrap, ClientOptions::default())
    }

    /// The process's client for `bootstrap` and `options`: the one already
    /// running (on a runtime that still runs) when there is one, else a
    /// new one. Channels that take it share one ADS stream whatever their
    /// targets, for a management server that keeps one stream per client
    /// and ends the older one when another opens (Istio's agent before it
    /// accepted several).
    pub fn shared(bootstrap: Bootstrap, options: ClientOptions) -> Result<Self, BootstrapError> {
        XdsClient::pooled(bootstrap, options, None)
    }

    /// The client for the data-plane `target` (`xds:///NAME`), as gRPC
    /// C-core keeps one per target (gRFC A71): channels to the same target
    /// share it, channels to other targets have their own ADS streams. Its
    /// CSDS `client_scope` is the target as C-core writes it (`xds:/NAME`).
    pub fn for_target(
        bootstrap: Bootstrap,
        options: ClientOptions,
        target: &str,
    ) -> Result<Self, BootstrapError> {
        XdsClient::pooled(bootstrap, options, Some(target.to_owned()))
    }

    fn pooled(
        bootstrap: Bootstrap,
        options: ClientOptions,
        target: Option<String>,
    ) -> Result<Self, BootstrapError> {
        let key = (bootstrap.clone(), options.clone(), target);
        if let Some(client) = pool::find(&key) {
            return Ok(client);
        }
        XdsClient::start_pooled(bootstrap, options, Some(key))
    }

    /// The CSDS `client_scope`: the target of a per-target client (as
    /// C-core writes it), empty for the others.
    pub fn client_scope(&self) -> &str {
        &self.scope
    }

    /// Every XdsClient of the process that is still in use (shared or
    /// not), in the order they started: what a CSDS service reports.
    pub fn all() -> Vec<XdsClient> {
        pool::all()
    }

    /// Starts a client of its own with explicit options (never shared: a
    /// stream of its own to the server).
    pub fn start_with(
        bootstrap: Bootstrap,
        options: ClientOptions,
    ) -> Result<Self, BootstrapError> {
        XdsClient::start_pooled(bootstrap, options, None)
    }

    fn start_pooled(
        bootstrap: Bootstrap,
        options: ClientOptions,
        key: Option<pool::PoolKey>,
    ) -> Result<Self, BootstrapError> {
        // C-core's scope: the target URI normalized (`xds:///a` -> `xds:/a`).
        let scope: Arc<str> = match key.as_ref().and_then(|k| k.2.as_deref()) {
            Some(t) => t.replacen(":///", ":/", 1).into(),
            None => "".into(),
        };
        let server = bootstrap.server()?.clone();
        let (channel, secure) = connect::channel(&server)?;
        let call_creds = if options.bootstrap_call_creds {
            crate::call_creds::from_bootstrap(&server.call_creds, "xds_servers[0]")?
        } else {
            Vec::new()
        };
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            registry: Mutex::new(Registry::default()),
            cmd_tx,
            events,
        });
        let backoff = match options.backoff_seed {
            Some(seed) => Backoff::with_seed(options.backoff, seed),
            None => Backoff::new(options.backoff),
        };
        let actor_channel = channel.clone();
        let stats = Arc::new(stats::ClientStats::default());
        let actor = actor::Actor {
            shared: Arc::downgrade(&shared),
            cmd_rx,
            channel,
            server_uri: server.server_uri.clone(),
            call_creds,
            secure,
            ads: state::Ads::new(state::Config::new(&bootstrap, &server, &options), backoff)
                .with_stats(stats.clone()),
        };
        let handle = tokio::spawn(actor.run());
        let store = crate::load_report::LoadStore::new();
        let lrs = lrs::Lrs {
            channel: actor_channel,
            node: bootstrap.node.clone(),
            store: store.clone(),
            server_uri: server.server_uri.clone(),
            call_creds: if options.bootstrap_call_creds {
                crate::call_creds::from_bootstrap(&server.call_creds, "xds_servers[0]")?
            } else {
                Vec::new()
            },
            secure,
            backoff: Backoff::new(options.backoff),
        };
        let client = XdsClient {
            shared,
            server_uri: server.server_uri.into(),
            node_id: bootstrap.node.id.clone().into(),
            node: Arc::new(bootstrap.node.clone()),
            scope,
            certificate_providers: Arc::new(bootstrap.certificate_providers.clone()),
            load: Arc::new(LoadReporting {
                store,
                start: Mutex::new(Some(lrs)),
                stream: std::sync::OnceLock::new(),
            }),
            stats,
            _stopper: Arc::new(Stopper(handle.abort_handle())),
        };
        pool::add(key, &client);
        Ok(client)
    }

    /// Whether `other` is this client (a clone of it), not merely one with
    /// the same bootstrap.
    pub fn same(&self, other: &XdsClient) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// The server this client talks to, as written in the bootstrap.
    pub fn server_uri(&self) -> &str {
        &self.server_uri
    }

    /// The node ID this client presents.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The node this client presents (the bootstrap's).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The bootstrap's certificate provider instances (gRFC A29), which
    /// the clusters this client accepts may name.
    pub fn certificate_providers(
        &self,
    ) -> &std::collections::BTreeMap<String, crate::bootstrap::CertificateProvider> {
        &self.certificate_providers
    }

    /// The load of `cluster` (with its EDS service name) that its calls
    /// count, reported to this client's server over LRS (gRFC A27) when the
    /// cluster's `lrs_server` is `self`. The first call starts the LRS
    /// stream on the ADS stream's connection; it runs while the client does.
    pub fn report_load(
        &self,
        cluster: &str,
        eds_service_name: Option<&str>,
    ) -> Arc<crate::load_report::ClusterLoad> {
        let load = self.load.store.cluster(cluster, eds_service_name);
        self.load.stream.get_or_init(|| {
            let lrs = self
                .load
                .start
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            let handle = match lrs {
                Some(lrs) => tokio::spawn(lrs.run()),
                // Unreachable: `start` is taken inside this once.
                None => tokio::spawn(async {}),
            };
            Stopper(handle.abort_handle())
        });
        load
    }

    /// Watches a resource. A cached resource is in [`Watcher::current`] at
    /// once (and the first [`Watcher::changed`] returns immediately); the
    /// subscription goes to the server when this is the first watcher.
    pub fn watch(&self, kind: ResourceKind, name: &str) -> Watcher {
        let key = (kind, name.to_owned());
        let mut reg = self.shared.lock();
        let (rx, new) = match reg.entries.get_mut(&key) {
            Some(e) => {
                e.watchers += 1;
                (e.tx.subscribe(), false)
            }
            None => {
                let (tx, rx) = watch::channel(ResourceState::requested());
                reg.entries.insert(key.clone(), Entry { tx, watchers: 1 });
                (rx, true)
            }
        };
        drop(reg);
        if new {
            let _ = self.shared.cmd_tx.send(Cmd::Changed(kind));
        }
        let mut rx = rx;
        rx.mark_changed();
        Watcher {
            key,
            rx,
            shared: self.shared.clone(),
        }
    }

    /// What a metrics exporter polls of this client (gRFC A78): a handle
    /// that does not keep the client running.
    pub fn metrics(&self) -> XdsClientMetrics {
        XdsClientMetrics::new(
            Arc::downgrade(&self.shared),
            self.stats.clone(),
            self.server_uri.clone(),
        )
    }

    /// Every watched resource and its state, sorted by kind and name (what
    /// `tether xds dump` prints).
    pub fn resources(&self) -> Vec<(ResourceKind, String, ResourceState)> {
        let reg = self.shared.lock();
        let mut out: Vec<_> = reg
            .entries
            .iter()
            .filter(|(_, e)| e.watchers > 0)
            .map(|((k, n), e)| (*k, n.clone(), e.tx.borrow().clone()))
            .collect();
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        out
    }

    /// A stream of `(kind, name)` for every change of any watched
    /// resource's state.
    pub fn events(&self) -> broadcast::Receiver<(ResourceKind, String)> {
        self.shared.events.subscribe()
    }
}

/// One watcher of one resource. Dropping the last watcher of a resource
/// unsubscribes it.
pub struct Watcher {
    key: Key,
    rx: watch::Receiver<ResourceState>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("key", &self.key).finish()
    }
}

impl Watcher {
    /// Which kind of resource.
    pub fn kind(&self) -> ResourceKind {
        self.key.0
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.key.1
    }

    /// The current state.
    pub fn current(&self) -> ResourceState {
        self.rx.borrow().clone()
    }

    /// Waits for the next change and returns the new state. Returns `None`
    /// when the client is gone.
    pub async fn changed(&mut self) -> Option<ResourceState> {
        self.rx.changed().await.ok()?;
        Some(self.rx.borrow_and_update().clone())
    }

    /// Waits until `pred` holds for the state (checking the current state
    /// first) and returns it; `None` when the client is gone.
    pub async fn wait_for(
        &mut self,
        mut pred: impl FnMut(&ResourceState) -> bool,
    ) -> Option<ResourceState> {
        self.rx.wait_for(|s| pred(s)).await.ok().map(|s| s.clone())
    }

    /// A `tokio::sync::watch` receiver of the state, for callers that want
    /// to build their own stream (e.g. `tokio_stream::wrappers::WatchStream`).
    pub fn receiver(&self) -> watch::Receiver<ResourceState> {
        self.rx.clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let mut reg = self.shared.lock();
        let last = match reg.entries.get_mut(&self.key) {
            Some(e) => {
                e.watchers = e.watchers.saturating_sub(1);
                e.watchers == 0
            }
            None => false,
        };
        if last {
            // Removed when the unsubscription is sent (Registry::names).
            drop(reg);
            let _ = self.shared.cmd_tx.send(Cmd::Changed(self.key.0));
        }
    }
}
