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

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient, DiscoveryRequest,
    DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::backoff::{Backoff, BackoffConfig};
use super::bootstrap::{Bootstrap, BootstrapError, ChannelCreds, ServerAddress};
use super::error::{code_name, XdsError};
use super::resource::{self, Resource, ResourceKind, ValidationError, ValidationOptions};

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

/// A connection future a [`Connector`] hands to tonic.
type Dialing<S> = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<S>> + Send>>;

/// A tonic connector made of a function from the URI to a connection (a
/// Unix socket, TLS over TCP).
#[derive(Clone)]
struct Connector<F>(F);

impl<F, S> tower_service::Service<tonic::codegen::http::Uri> for Connector<F>
where
    F: Fn(tonic::codegen::http::Uri) -> Dialing<S>,
    S: Send + 'static,
{
    type Response = hyper_util::rt::TokioIo<S>;
    type Error = std::io::Error;
    type Future = Dialing<Self::Response>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
        let dialing = (self.0)(uri);
        Box::pin(async move { dialing.await.map(hyper_util::rt::TokioIo::new) })
    }
}

/// gRPC's authority for a Unix socket, the name a TLS server there must
/// carry.
const UNIX_AUTHORITY: &str = "localhost";
/// The URI tonic's endpoint takes for a Unix socket (its connector ignores it).
const UNIX_ENDPOINT: &str = "http://localhost";

/// Dials the management server's Unix domain socket (the URI is ignored).
fn unix_connector(
    path: std::path::PathBuf,
) -> Connector<impl Fn(tonic::codegen::http::Uri) -> Dialing<tokio::net::UnixStream> + Clone> {
    let path = Arc::new(path);
    Connector(move |_| {
        let path = path.clone();
        Box::pin(async move {
            tokio::net::UnixStream::connect(path.as_path())
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        }) as Dialing<_>
    })
}

/// Dials the management server over TLS (gRFC A65): the files are read
/// for each new connection, so rotated certificates are used by the next
/// one; a read that fails uses the last good ones. The server's
/// certificate must carry the server URI's host.
#[derive(Clone)]
struct TlsConnector {
    creds: Arc<crate::bootstrap::TlsCreds>,
    last_good: Arc<Mutex<Option<crate::tls::TlsConfig>>>,
}

impl TlsConnector {
    fn new(creds: crate::bootstrap::TlsCreds) -> Self {
        TlsConnector {
            creds: Arc::new(creds),
            last_good: Arc::default(),
        }
    }

    fn config(&self) -> Result<crate::tls::TlsConfig, String> {
        let read = || -> Result<crate::tls::TlsConfig, crate::tls::TlsError> {
            let tls = match &self.creds.ca_certificate_file {
                Some(ca) => crate::tls::TlsConfig::from_ca_file(ca)?,
                None => crate::tls::TlsConfig::from_system_roots()?,
            };
            match (&self.creds.certificate_file, &self.creds.private_key_file) {
                (Some(cert), Some(key)) => tls.with_identity_files(cert, key),
                _ => Ok(tls),
            }
        };
        let mut last = self.last_good.lock().unwrap_or_else(|e| e.into_inner());
        match read() {
            Ok(tls) => {
                *last = Some(tls.clone());
                Ok(tls)
            }
            Err(e) => match &*last {
                Some(tls) => {
                    log::warn!("xDS server TLS: {e}; using the certificates read before");
                    Ok(tls.clone())
                }
                None => Err(format!("xDS server TLS: {e}")),
            },
        }
    }
}

impl TlsConnector {
    /// The connector tonic takes.
    fn connector(
        self,
    ) -> Connector<
        impl Fn(
                tonic::codegen::http::Uri,
            ) -> Dialing<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>
            + Clone,
    > {
        Connector(move |uri| {
            let this = self.clone();
            Box::pin(async move { this.dial(uri).await }) as Dialing<_>
        })
    }

    /// The connector tonic takes for a `unix:` server: TLS over the Unix
    /// stream, as C-core runs its channel credentials over any transport.
    /// The certificate must name `localhost`, gRPC's authority for Unix
    /// sockets.
    fn unix_connector(
        self,
        path: std::path::PathBuf,
    ) -> Connector<
        impl Fn(
                tonic::codegen::http::Uri,
            ) -> Dialing<tokio_rustls::client::TlsStream<tokio::net::UnixStream>>
            + Clone,
    > {
        let path = Arc::new(path);
        Connector(move |_| {
            let (this, path) = (self.clone(), path.clone());
            Box::pin(async move {
                let other = |e: String| std::io::Error::other(e);
                let tls = this
                    .config()
                    .and_then(|t| {
                        t.with_server_name(UNIX_AUTHORITY)
                            .map_err(|e| e.to_string())
                    })
                    .map_err(other)?;
                let unix = tokio::net::UnixStream::connect(path.as_path())
                    .await
                    .map_err(|e| {
                        std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                    })?;
                tls.handshake_named(unix).await.map_err(|e| {
                    other(format!("TLS handshake over {} failed: {e}", path.display()))
                })
            }) as Dialing<_>
        })
    }

    async fn dial(
        &self,
        uri: tonic::codegen::http::Uri,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let other = |e: String| std::io::Error::other(e);
        let host = uri
            .host()
            .ok_or_else(|| other(format!("{uri} has no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let tls = self
            .config()
            .and_then(|t| t.with_server_name(&host).map_err(|e| e.to_string()))
            .map_err(other)?;
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        let _ = tcp.set_nodelay(true);
        let peer = tcp.peer_addr()?;
        tls.handshake(peer, tcp)
            .await
            .map_err(|e| other(format!("TLS handshake with {host}:{port} failed: {e}")))
    }
}

/// One XdsClient of the process, as [`XdsClient::shared`] finds it again
/// and [`XdsClient::all`] lists it: held weakly, so that the stream still
/// stops when the last user drops its client.
struct Pooled {
    /// Only clients made by [`XdsClient::shared`] or
    /// [`XdsClient::for_target`] are handed out again: the key is the
    /// bootstrap, the options and the target (`None`: the process's).
    key: Option<(Bootstrap, ClientOptions, Option<String>)>,
    scope: Arc<str>,
    shared: std::sync::Weak<Shared>,
    stopper: std::sync::Weak<Stopper>,
    server_uri: Arc<str>,
    node_id: Arc<str>,
    node: Arc<Node>,
    certificate_providers:
        Arc<std::collections::BTreeMap<String, crate::bootstrap::CertificateProvider>>,
}

impl Pooled {
    /// The client, if a user still holds it and its task still runs (a
    /// client of a runtime that was shut down has stopped).
    fn client(&self) -> Option<XdsClient> {
        let stopper = self.stopper.upgrade()?;
        if stopper.0.is_finished() {
            return None;
        }
        Some(XdsClient {
            shared: self.shared.upgrade()?,
            server_uri: self.server_uri.clone(),
            node_id: self.node_id.clone(),
            node: self.node.clone(),
            scope: self.scope.clone(),
            certificate_providers: self.certificate_providers.clone(),
            _stopper: stopper,
        })
    }
}

/// Every XdsClient of the process.
static POOL: Mutex<Vec<Pooled>> = Mutex::new(Vec::new());

/// The pool, without the clients that stopped.
fn pool() -> MutexGuard<'static, Vec<Pooled>> {
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    pool.retain(|p| p.client().is_some());
    pool
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
    _stopper: Arc<Stopper>,
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
        let pool = pool();
        let found = pool.iter().find(|p| {
            p.key
                .as_ref()
                .is_some_and(|(b, o, t)| *b == bootstrap && *o == options && *t == target)
        });
        if let Some(client) = found.and_then(Pooled::client) {
            return Ok(client);
        }
        drop(pool);
        let key = (bootstrap.clone(), options.clone(), target);
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
        let pool = pool();
        pool.iter().filter_map(Pooled::client).collect()
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
        key: Option<(Bootstrap, ClientOptions, Option<String>)>,
    ) -> Result<Self, BootstrapError> {
        // C-core's scope: the target URI normalized (`xds:///a` -> `xds:/a`).
        let scope: Arc<str> = match key.as_ref().and_then(|k| k.2.as_deref()) {
            Some(t) => t.replacen(":///", ":/", 1).into(),
            None => "".into(),
        };
        let server = bootstrap.server()?.clone();
        // `secure` comes from the connector each arm builds, so no transport
        // can be plaintext while the stream believes it is encrypted.
        let (channel, secure) = match (server.address(), &server.channel_creds) {
            (ServerAddress::Unix(path), ChannelCreds::Tls(creds)) => (
                Endpoint::from_static(UNIX_ENDPOINT).connect_with_connector_lazy(
                    TlsConnector::new(creds.clone()).unix_connector(path),
                ),
                true,
            ),
            (ServerAddress::Unix(path), ChannelCreds::Insecure) => (
                Endpoint::from_static(UNIX_ENDPOINT)
                    .connect_with_connector_lazy(unix_connector(path)),
                false,
            ),
            (ServerAddress::Tcp(uri), creds) => {
                let endpoint = Endpoint::from_shared(uri).map_err(|e| BootstrapError {
                    field: "xds_servers[0].server_uri".into(),
                    value: server.server_uri.clone(),
                    problem: format!("is not a valid URI: {e}"),
                })?;
                match creds {
                    ChannelCreds::Tls(creds) => (
                        endpoint.connect_with_connector_lazy(
                            TlsConnector::new(creds.clone()).connector(),
                        ),
                        true,
                    ),
                    ChannelCreds::Insecure => (endpoint.connect_lazy(), false),
                }
            }
        };
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
        // A88: the timer of a server with resource_timer_is_transient_error
        // reports a transient error. (A88's text lengthens it to 30 s; grpcio
        // 1.85 keeps 15 s, and so does this client.)
        let timer_is_transient =
            options.data_error_handling && server.resource_timer_is_transient_error();
        let dne_timeout = options.does_not_exist_timeout;
        let actor = Actor {
            shared: Arc::downgrade(&shared),
            cmd_rx,
            channel,
            server_uri: server.server_uri.clone(),
            // C-core: with A88 a deletion drops the cached resource only
            // with fail_on_data_errors; without, unless ignore_resource_deletion.
            drop_on_deletion: if options.data_error_handling {
                server.fail_on_data_errors()
            } else {
                !server.ignore_resource_deletion()
            },
            drop_on_nack: options.data_error_handling && server.fail_on_data_errors(),
            timer_is_transient,
            // C-core reads resource_errors only with A88 on.
            read_resource_errors: options.data_error_handling,
            call_creds,
            secure,
            fail_on_data_errors: server.fail_on_data_errors(),
            node: bootstrap.node.clone(),
            types: HashMap::new(),
            deadlines: HashMap::new(),
            backoff,
            dne_timeout,
            validation: {
                let mut v = options.validation;
                v.certificate_providers = bootstrap.certificate_providers.keys().cloned().collect();
                v
            },
            channel_error: None,
        };
        let handle = tokio::spawn(actor.run());
        let client = XdsClient {
            shared,
            server_uri: server.server_uri.into(),
            node_id: bootstrap.node.id.clone().into(),
            node: Arc::new(bootstrap.node.clone()),
            scope,
            certificate_providers: Arc::new(bootstrap.certificate_providers.clone()),
            _stopper: Arc::new(Stopper(handle.abort_handle())),
        };
        let mut pool = pool();
        pool.push(Pooled {
            key,
            shared: Arc::downgrade(&client.shared),
            stopper: Arc::downgrade(&client._stopper),
            server_uri: client.server_uri.clone(),
            node_id: client.node_id.clone(),
            node: client.node.clone(),
            scope: client.scope.clone(),
            certificate_providers: client.certificate_providers.clone(),
        });
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

#[derive(Default)]
struct TypeState {
    /// Last ACKed version (kept across streams).
    version: String,
    /// Last nonce on the current stream.
    nonce: String,
    /// Names last sent on the current stream, to skip redundant requests.
    sent: Option<Vec<String>>,
}

struct Actor {
    shared: std::sync::Weak<Shared>,
    cmd_rx: mpsc::UnboundedReceiver<Cmd>,
    channel: Channel,
    server_uri: String,
    /// An LDS/CDS resource left out of a response drops the cached one.
    drop_on_deletion: bool,
    /// A NACKed update drops the cached resource (A88's
    /// fail_on_data_errors).
    drop_on_nack: bool,
    /// The resource timer reports a transient error (A88's
    /// resource_timer_is_transient_error).
    timer_is_transient: bool,
    /// A88 is on: the response's `resource_errors` are read.
    read_resource_errors: bool,
    /// The server has `fail_on_data_errors`.
    fail_on_data_errors: bool,
    /// Call credentials for each stream (gRFC A97).
    call_creds: Vec<crate::call_creds::JwtTokenFile>,
    /// The channel to the server is TLS (call credentials may be sent).
    secure: bool,
    node: envoy_types::pb::envoy::config::core::v3::Node,
    types: HashMap<ResourceKind, TypeState>,
    deadlines: HashMap<Key, Instant>,
    backoff: Backoff,
    dne_timeout: Duration,
    validation: ValidationOptions,
    /// The connectivity error of the last failed stream, until a response.
    channel_error: Option<XdsError>,
}

enum StreamEnd {
    /// The client was dropped.
    Stop,
    /// The stream ended.
    Closed {
        got_response: bool,
        status: tonic::Status,
    },
}

struct Stream {
    tx: mpsc::UnboundedSender<DiscoveryRequest>,
    connected: bool,
    sent_node: bool,
}

impl Actor {
    async fn run(mut self) {
        loop {
            match self.run_stream().await {
                StreamEnd::Stop => return,
                StreamEnd::Closed {
                    got_response: true,
                    status,
                } => {
                    log::info!(
                        "xDS server {}: ADS stream ended ({}: {}); reconnecting",
                        self.server_uri,
                        code_name(effective_code(&status)),
                        status_message(&status)
                    );
                    // Not an error (A57): restart at once; backoff was reset.
                    continue;
                }
                StreamEnd::Closed {
                    got_response: false,
                    status,
                } => {
                    self.connectivity_error(&status);
                    let delay = self.backoff.next_delay();
                    if let Some(e) = &self.channel_error {
                        // Milliseconds: the jitter's nanoseconds are noise.
                        let shown = Duration::from_millis(delay.as_millis() as u64);
                        log::warn!("{e}; retrying in {}", tether_core::duration::display(shown));
                    }
                    if self.idle(delay).await.is_none() {
                        return;
                    }
                }
            }
        }
    }

    /// Waits `delay` while keeping the registry's commands drained.
    async fn idle(&mut self, delay: Duration) -> Option<()> {
        let until = Instant::now() + delay;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return Some(()),
                cmd = self.cmd_rx.recv() => {
                    let Cmd::Changed(kind) = cmd?;
                    self.shared.upgrade()?;
                    self.note_new_entries(kind);
                }
            }
        }
    }

    /// New entries get the current channel error (as gRPC tells new watchers).
    fn note_new_entries(&mut self, kind: ResourceKind) {
        let Some(err) = self.channel_error.clone() else {
            return;
        };
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let reg = shared.lock();
        for ((k, n), e) in &reg.entries {
            if *k == kind && e.tx.borrow().status == ResourceStatus::Requested {
                let changed = e.tx.send_if_modified(|s| {
                    if s.error.is_none() {
                        s.error = Some(err.clone());
                        true
                    } else {
                        false
                    }
                });
                if changed {
                    let _ = shared.events.send((*k, n.clone()));
                }
            }
        }
    }

    fn connectivity_error(&mut self, status: &tonic::Status) {
        let err = XdsError::Connectivity {
            server_uri: self.server_uri.clone(),
            node_id: self.node.id.clone(),
            code: code_name(effective_code(status)).to_owned(),
            message: status_message(status),
        };
        self.channel_error = Some(err.clone());
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let reg = shared.lock();
        for ((k, n), e) in &reg.entries {
            e.tx.send_modify(|s| s.error = Some(err.clone()));
            let _ = shared.events.send((*k, n.clone()));
        }
    }

    fn request(&mut self, stream: &mut Stream, kind: ResourceKind, names: Vec<String>) {
        let ts = self.types.entry(kind).or_default();
        let req = DiscoveryRequest {
            version_info: ts.version.clone(),
            node: (!stream.sent_node).then(|| self.node.clone()),
            resource_names: names.clone(),
            type_url: kind.type_url().to_owned(),
            response_nonce: ts.nonce.clone(),
            ..Default::default()
        };
        ts.sent = Some(names);
        stream.sent_node = true;
        let _ = stream.tx.send(req);
    }

    /// Starts does-not-exist timers for uncached, subscribed resources
    /// without one (only on a connected stream).
    fn arm_timers(&mut self, kind: Option<ResourceKind>) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let reg = shared.lock();
        let deadline = Instant::now() + self.dne_timeout;
        for (key, e) in &reg.entries {
            if kind.is_some_and(|k| k != key.0) {
                continue;
            }
            let s = e.tx.borrow();
            let waiting = s.resource.is_none()
                && !matches!(
                    s.status,
                    ResourceStatus::DoesNotExist | ResourceStatus::Timeout
                );
            if waiting && !self.deadlines.contains_key(key) {
                self.deadlines.insert(key.clone(), deadline);
            }
        }
        // Drop timers of resources nobody watches any more.
        self.deadlines.retain(|k, _| reg.entries.contains_key(k));
    }

    fn on_changed(&mut self, stream: &mut Stream, kind: ResourceKind) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let names = shared.lock().names(kind);
        let ts = self.types.entry(kind).or_default();
        if ts.sent.as_ref() == Some(&names) || (ts.sent.is_none() && names.is_empty()) {
            return;
        }
        self.request(stream, kind, names);
        if stream.connected {
            self.arm_timers(Some(kind));
        }
        self.note_new_entries(kind);
    }

    async fn run_stream(&mut self) -> StreamEnd {
        let Some(shared) = self.shared.upgrade() else {
            return StreamEnd::Stop;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let mut stream = Stream {
            tx,
            connected: false,
            sent_node: false,
        };
        for ts in self.types.values_mut() {
            ts.nonce.clear();
            ts.sent = None;
        }
        for kind in ResourceKind::ALL {
            let names = shared.lock().names(kind);
            if !names.is_empty() {
                self.request(&mut stream, kind, names);
            }
        }
        drop(shared);
        log::debug!("xDS server {}: starting an ADS stream", self.server_uri);
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        if let Err(status) = self.authorize(request.metadata_mut()) {
            return StreamEnd::Closed {
                got_response: false,
                status,
            };
        }
        let mut client = AggregatedDiscoveryServiceClient::new(self.channel.clone());
        let call = client.stream_aggregated_resources(request);
        tokio::pin!(call);
        let mut inbound = loop {
            tokio::select! {
                r = &mut call => match r {
                    Ok(resp) => break resp.into_inner(),
                    Err(status) => return StreamEnd::Closed { got_response: false, status },
                },
                cmd = self.cmd_rx.recv() => {
                    let Some(Cmd::Changed(kind)) = cmd else { return StreamEnd::Stop };
                    if self.shared.strong_count() == 0 { return StreamEnd::Stop; }
                    self.on_changed(&mut stream, kind);
                }
            }
        };
        stream.connected = true;
        log::info!("xDS server {}: ADS stream open", self.server_uri);
        self.deadlines.clear();
        self.arm_timers(None);
        let mut got_response = false;
        let end = loop {
            let next = self.deadlines.values().min().copied();
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(resp)) => {
                        if !got_response {
                            got_response = true;
                            self.backoff.reset();
                            self.clear_channel_error();
                        }
                        self.on_response(&mut stream, resp);
                    }
                    Ok(None) => break StreamEnd::Closed {
                        got_response,
                        status: tonic::Status::unavailable("ADS stream closed by the server"),
                    },
                    Err(status) => break StreamEnd::Closed { got_response, status },
                },
                cmd = self.cmd_rx.recv() => {
                    let Some(Cmd::Changed(kind)) = cmd else { break StreamEnd::Stop };
                    if self.shared.strong_count() == 0 { break StreamEnd::Stop; }
                    self.on_changed(&mut stream, kind);
                }
                _ = sleep_until_opt(next), if next.is_some() => self.fire_timers(),
            }
        };
        // Timers restart on the next stream for what is still uncached.
        self.deadlines.clear();
        end
    }

    /// Adds the call credentials' headers to a new stream's metadata.
    fn authorize(&self, metadata: &mut tonic::metadata::MetadataMap) -> Result<(), tonic::Status> {
        if self.call_creds.is_empty() {
            return Ok(());
        }
        if !self.secure {
            return Err(tonic::Status::unauthenticated(
                "Established channel does not have a sufficient security level to transfer call \
                 credential.",
            ));
        }
        for creds in &self.call_creds {
            let value = creds.authorization()?;
            let value = value.parse().map_err(|_| {
                tonic::Status::unauthenticated(format!(
                    "the JWT token in {} is not a valid header value",
                    creds.path().display()
                ))
            })?;
            metadata.append("authorization", value);
        }
        Ok(())
    }

    fn clear_channel_error(&mut self) {
        if self.channel_error.take().is_none() {
            return;
        }
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let reg = shared.lock();
        for ((k, n), e) in &reg.entries {
            let changed = e.tx.send_if_modified(|s| {
                if matches!(s.error, Some(XdsError::Connectivity { .. })) {
                    s.error = None;
                    true
                } else {
                    false
                }
            });
            if changed {
                let _ = shared.events.send((*k, n.clone()));
            }
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        let due: Vec<Key> = self
            .deadlines
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let reg = shared.lock();
        for key in due {
            self.deadlines.remove(&key);
            if let Some(e) = reg.entries.get(&key) {
                // A88: with resource_timer_is_transient_error the timer
                // reports a transient error, not a missing resource.
                let (status, err) = if self.timer_is_transient {
                    (
                        ResourceStatus::Timeout,
                        XdsError::Timeout {
                            kind: key.0,
                            name: key.1.clone(),
                            server_uri: self.server_uri.clone(),
                            node_id: self.node.id.clone(),
                        },
                    )
                } else {
                    (
                        ResourceStatus::DoesNotExist,
                        XdsError::DoesNotExist {
                            kind: key.0,
                            name: key.1.clone(),
                            node_id: self.node.id.clone(),
                        },
                    )
                };
                let text = err.to_string();
                let changed = e.tx.send_if_modified(|s| {
                    if s.resource.is_some() {
                        return false;
                    }
                    s.status = status;
                    s.error = Some(err);
                    true
                });
                if changed {
                    log::warn!(
                        "xDS: {text}: not sent within {}",
                        tether_core::duration::display(self.dne_timeout)
                    );
                    let _ = shared.events.send(key.clone());
                }
            }
        }
    }

    fn on_response(&mut self, stream: &mut Stream, resp: DiscoveryResponse) {
        let Some(kind) = ResourceKind::from_type_url(&resp.type_url) else {
            // Not a type this client asked for: NACK it so the server knows.
            log::warn!(
                "xDS: NACK of version {:?}: unknown resource type {:?}",
                resp.version_info,
                resp.type_url
            );
            let req = DiscoveryRequest {
                type_url: resp.type_url.clone(),
                response_nonce: resp.nonce.clone(),
                error_detail: Some(RpcStatus {
                    code: tonic::Code::InvalidArgument as i32,
                    message: format!("unknown resource type {:?}", resp.type_url),
                    details: Vec::new(),
                }),
                ..Default::default()
            };
            let _ = stream.tx.send(req);
            return;
        };
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let mut valid: HashMap<String, (Resource, &Any)> = HashMap::new();
        let mut invalid: Vec<(Option<String>, ValidationError)> = Vec::new();
        let mut raw_invalid: HashMap<String, &Any> = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        let now = SystemTime::now();
        for any in &resp.resources {
            let decoded = resource::decode_with(kind, any, self.validation.clone());
            match decoded.result {
                Ok(r) => {
                    let name = r.name().to_owned();
                    if seen.insert(name.clone()) {
                        valid.insert(name, (r, any));
                    } else {
                        // The same name twice in one response: neither copy is used.
                        valid.remove(&name);
                        invalid.push((
                            Some(name.clone()),
                            ValidationError {
                                kind,
                                name: name.clone(),
                                errors: vec![resource::FieldError {
                                    field: "name".into(),
                                    value: format!("{name:?}"),
                                    problem: "appears twice in one response".into(),
                                }],
                            },
                        ));
                    }
                }
                Err(e) => {
                    if let Some(n) = &decoded.name {
                        raw_invalid.insert(n.clone(), any);
                    }
                    invalid.push((decoded.name, e))
                }
            }
        }
        // Errors the server reports per resource (xRFC TP3). A malformed
        // entry is a data error: it NACKs the response, as in C-core.
        let mut reported: HashMap<String, (tonic::Code, String)> = HashMap::new();
        if self.read_resource_errors {
            for (i, re) in resp.resource_errors.iter().enumerate() {
                let name = re
                    .resource_name
                    .as_ref()
                    .map(|n| n.name.clone())
                    .unwrap_or_default();
                let code = re.error_detail.as_ref().map_or(0, |d| d.code);
                let problem = if name.is_empty() {
                    Some(("resource_name", "unset".to_owned()))
                } else if code == 0 {
                    Some(("error_detail", "must be non-OK".to_owned()))
                } else {
                    None
                };
                if let Some((field, problem)) = problem {
                    invalid.push((
                        None,
                        ValidationError {
                            kind,
                            name: name.clone(),
                            errors: vec![resource::FieldError {
                                field: format!("resource_errors[{i}].{field}"),
                                value: format!("{name:?}"),
                                problem,
                            }],
                        },
                    ));
                    continue;
                }
                let message = re
                    .error_detail
                    .as_ref()
                    .map(|d| d.message.clone())
                    .unwrap_or_default();
                reported.insert(name, (tonic::Code::from_i32(code), message));
            }
        }
        let version = resp.version_info.clone();
        for (_, e) in &invalid {
            log::warn!("xDS: NACK of version {version:?}: {e}");
        }
        // Valid resources this client subscribes to (C-core's count).
        let mut num_valid = 0;
        {
            let reg = shared.lock();
            for ((k, name), e) in &reg.entries {
                if *k != kind {
                    continue;
                }
                if valid.contains_key(name) {
                    num_valid += 1;
                }
                let key = (*k, name.clone());
                if let Some((code, message)) = reported.get(name) {
                    // Applied after the resource itself (C-core reads
                    // resource_errors last); it counts as seen, so a
                    // state-of-the-world response does not delete it.
                    self.deadlines.remove(&key);
                    if let Some((r, any)) = valid.get(name) {
                        e.tx.send_modify(|s| {
                            s.resource = Some(r.clone());
                            s.resource_version = Some(version.clone());
                            s.raw = Some(Arc::new((*any).clone()));
                            s.updated = Some(now);
                        });
                    }
                    // fail_on_data_errors drops the cached resource for
                    // the two codes that say it is gone.
                    let drop_cached = self.fail_on_data_errors
                        && matches!(code, tonic::Code::NotFound | tonic::Code::PermissionDenied);
                    let node_id = self.node.id.clone();
                    e.tx.send_modify(|s| {
                        s.fail(
                            Rejection {
                                at: now,
                                version: version.clone(),
                                details: message.clone(),
                                raw: None,
                            },
                            drop_cached,
                        );
                        s.status = ResourceStatus::ReceivedError {
                            version: version.clone(),
                            code: *code,
                            message: message.clone(),
                        };
                        s.error = Some(XdsError::ReceivedError {
                            kind,
                            name: name.clone(),
                            code: *code,
                            message: message.clone(),
                            node_id,
                        });
                    });
                    log::warn!(
                        "xDS: the server reports {kind} {name:?} in version {version:?}: {}: {message}{}",
                        code_name(*code),
                        if drop_cached { "; the cached resource is dropped" } else { "" }
                    );
                    let _ = shared.events.send(key);
                } else if let Some((r, any)) = valid.get(name) {
                    self.deadlines.remove(&key);
                    let status = ResourceStatus::Acked {
                        version: version.clone(),
                    };
                    let changed = e.tx.send_if_modified(|s| {
                        let notify = s.resource.as_ref() != Some(r)
                            || s.error.is_some()
                            || matches!(
                                s.status,
                                ResourceStatus::Requested
                                    | ResourceStatus::DoesNotExist
                                    | ResourceStatus::Nacked { .. }
                            );
                        s.resource = Some(r.clone());
                        s.resource_version = Some(version.clone());
                        s.status = status;
                        s.error = None;
                        if s.raw.as_deref() != Some(*any) {
                            s.raw = Some(Arc::new((*any).clone()));
                            s.updated = Some(now);
                        }
                        s.rejected = None;
                        notify
                    });
                    if changed {
                        log::info!("xDS: ACK {kind} {name:?} version {version:?}");
                        let _ = shared.events.send(key);
                    }
                } else if let Some((_, err)) = invalid
                    .iter()
                    .find(|(n, _)| n.as_deref() == Some(name.as_str()))
                {
                    self.deadlines.remove(&key);
                    let drop_on_nack = self.drop_on_nack;
                    e.tx.send_modify(|s| {
                        // A88's fail_on_data_errors: the cached resource goes.
                        s.fail(
                            Rejection {
                                at: now,
                                version: version.clone(),
                                details: err.to_string(),
                                raw: raw_invalid.get(name).map(|a| Arc::new((*a).clone())),
                            },
                            drop_on_nack,
                        );
                        s.status = ResourceStatus::Nacked {
                            version: version.clone(),
                            error: err.clone(),
                        };
                        s.error = Some(XdsError::Nacked {
                            version: version.clone(),
                            error: err.clone(),
                        });
                    });
                    let _ = shared.events.send(key);
                } else if kind.all_in_each_response() {
                    // Left out of a state-of-the-world LDS/CDS response:
                    // deleted. C-core marks it does-not-exist and drops the
                    // cached resource unless told to keep it
                    // (ignore_resource_deletion; with A88, unless
                    // fail_on_data_errors), then an ambient error.
                    let node_id = self.node.id.clone();
                    let drop_cached = self.drop_on_deletion;
                    let changed = e.tx.send_if_modified(|s| {
                        if s.resource.is_none()
                            || (!drop_cached && s.status == ResourceStatus::DoesNotExist)
                        {
                            return false;
                        }
                        s.fail(
                            Rejection {
                                at: now,
                                version: version.clone(),
                                details: "does not exist".into(),
                                raw: None,
                            },
                            drop_cached,
                        );
                        s.status = ResourceStatus::DoesNotExist;
                        s.error = Some(XdsError::DoesNotExist {
                            kind,
                            name: name.clone(),
                            node_id,
                        });
                        true
                    });
                    if changed {
                        log::warn!(
                            "xDS: {kind} {name:?} does not exist: the server removed it in version {version:?}{}",
                            if drop_cached { "" } else { "; the cached resource is kept" }
                        );
                        let _ = shared.events.send(key);
                    }
                }
            }
        }
        let ts = self.types.entry(kind).or_default();
        ts.nonce = resp.nonce.clone();
        // C-core takes the response's version when any resource in it was
        // valid, so even its NACK of a partly valid response carries it.
        if num_valid > 0 || invalid.is_empty() {
            ts.version = version;
        }
        let error_detail = if invalid.is_empty() {
            None
        } else {
            let message = invalid
                .iter()
                .map(|(_, e)| e.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            Some(RpcStatus {
                code: tonic::Code::InvalidArgument as i32,
                message,
                details: Vec::new(),
            })
        };
        let names = shared.lock().names(kind);
        let req = DiscoveryRequest {
            version_info: ts.version.clone(),
            node: None,
            resource_names: names.clone(),
            type_url: kind.type_url().to_owned(),
            response_nonce: ts.nonce.clone(),
            error_detail,
            ..Default::default()
        };
        ts.sent = Some(names);
        let _ = stream.tx.send(req);
    }
}

/// gRPC reports a transport failure under a call as UNAVAILABLE. tonic calls
/// a connection lost mid-stream UNKNOWN, and one closed before the request
/// went out (a server dying with its socket still open) CANCELLED; both
/// carry the transport error as their source. A status the server sent
/// itself has no source and keeps its code.
fn effective_code(status: &tonic::Status) -> tonic::Code {
    use std::error::Error as _;
    let Some(source) = status.source() else {
        return status.code();
    };
    match status.code() {
        tonic::Code::Unknown => tonic::Code::Unavailable,
        tonic::Code::Cancelled if closed_under_the_call(source) => tonic::Code::Unavailable,
        code => code,
    }
}

/// Whether hyper dropped the call because its connection closed.
fn closed_under_the_call(err: &(dyn std::error::Error + 'static)) -> bool {
    error_chain(err).any(|e| {
        e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
    })
}

/// The status message, with the transport's reason when tonic's message
/// leaves it out ("operation was canceled" says nothing of why).
fn status_message(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut message = status.message().to_owned();
    for e in status.source().into_iter().flat_map(error_chain) {
        let text = e.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message = format!("{message}: {text}");
        }
    }
    message
}

/// `err` and its sources, outermost first.
fn error_chain<'e>(
    err: &'e (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'e (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| e.source())
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
