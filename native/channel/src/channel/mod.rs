//! `tether::Channel`: a proxyless gRPC channel with gRPC's xDS load
//! balancing, usable by any generated tonic client:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The bootstrap comes from GRPC_XDS_BOOTSTRAP, as for gRPC C-core.
//! let channel = tether::Channel::from_target("xds:///shop.example").await?;
//! // EchoClient::new(channel) ... any tonic client takes it unchanged.
//! # let _ = channel;
//! # Ok(()) }
//! ```
//!
//! The data path (request → config selector → filters → retry → LB pick →
//! subchannel), in the order gRPC C-core's client channel runs it:
//! - `resolver` follows the listener's xDS graph into a [`ChannelConfig`]
//!   (or a [`StaticConfig`] gives one without a control plane);
//! - `work_serializer` is the channel's one LB task: it runs the tree of
//!   [`crate::lb`] policies and publishes immutable snapshots;
//! - [`call`] runs one call: the config selector (`config_selector`)
//!   matches it to a route and a cluster, then the filters
//!   (`crate::filter`) run in order: [`fault`] injection (A33), the
//!   stateful session ([`crate::session`], A55);
//! - the retry filter (`attempts`) makes the call's attempts, with
//!   the route's [`retry`] policy (A44) and gRPC's transparent retries;
//! - each attempt is a pick (`pick`: queueing while none can be picked)
//!   and a send on the subchannel's HTTP/2 connection (`attempt`,
//!   [`crate::subchannel`]).

mod attempt;
mod attempts;
pub mod call;
pub mod config;
// The route table: crate-private, or public (hidden from the docs) with
// the `internals` feature, for the fuzz targets.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod config_selector;
#[cfg(not(feature = "internals"))]
pub(crate) mod config_selector;
mod deadline;
pub mod fault;
mod pick;
mod replay;
mod resolver;
pub mod retry;
mod service_config;
pub mod target;
mod work_serializer;

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::AbortHandle;

use crate::credentials::{ProviderStore, TlsConfig};
pub use crate::lb::wrr_locality::EndpointPolicy;
use crate::lb::{ConnectivityState, Event, PolicyStats};
pub use crate::session::SessionOptions;
use crate::subchannel::{KeepaliveOptions, SubchannelOptions, SubchannelPool};
use crate::xds::bootstrap::{Bootstrap, BootstrapError};
use crate::xds::client::ClientOptions;
use crate::xds::XdsClient;
pub use call::{Attempts, PickedPeer};
pub use config::{ChannelConfig, StaticConfig, StaticConfigError, StaticEndpoint};
pub use target::{DnsName, Target, TargetProblem};
use tether_core::http::set_cookie::CookieSpec;
use tether_core::KeyRing;
use work_serializer::{Control, Shared, WorkSerializer};

/// Marks a call `wait_for_ready` (or not), overriding the channel's
/// default: put it in the request's extensions
/// (`request.extensions_mut().insert(WaitForReady(true))` on a
/// `tonic::Request`). A `wait_for_ready` call waits through TRANSIENT_FAILURE
/// and resolver errors instead of failing; drops still fail it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitForReady(pub bool);

/// Why a channel could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelError {
    /// The target is neither `xds:///NAME` nor `static:///ADDR,...`.
    Target {
        /// The target as given.
        target: String,
        /// What is wrong with it.
        problem: TargetProblem,
    },
    /// The xDS bootstrap could not be read.
    Bootstrap(BootstrapError),
    /// A static config was not usable.
    Static(StaticConfigError),
    /// The channel was made outside a tokio runtime, which its tasks need.
    NoRuntime,
    /// The TLS configuration cannot be used for this target.
    Tls {
        /// What is wrong.
        problem: String,
    },
    /// The default service config
    /// ([`ChannelBuilder::default_service_config`]) is not usable.
    ServiceConfig {
        /// The JSON given.
        json: String,
        /// What is wrong, naming the field and the value.
        problem: String,
    },
    /// A builder option's value is not usable.
    Option {
        /// The builder method.
        option: &'static str,
        /// The value given.
        value: String,
        /// What is wrong.
        problem: String,
    },
    /// The DNS resolver could not be set up (the system's configuration
    /// unreadable).
    Resolver {
        /// The target.
        target: String,
        /// Why.
        problem: String,
    },
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelError::Target { target, problem } => write!(f, "target {target:?}: {problem}"),
            ChannelError::Bootstrap(e) => write!(f, "{e}"),
            ChannelError::Static(e) => write!(f, "{e}"),
            ChannelError::NoRuntime => f.write_str(
                "a channel must be made inside a tokio runtime (its LB and resolver tasks run there)",
            ),
            ChannelError::Tls { problem } => write!(f, "TLS: {problem}"),
            ChannelError::ServiceConfig { json, problem } => {
                write!(f, "default service config {json}: {problem}")
            }
            ChannelError::Option {
                option,
                value,
                problem,
            } => write!(f, "{option} {value:?}: {problem}"),
            ChannelError::Resolver { target, problem } => {
                write!(f, "target {target:?}: {problem}")
            }
        }
    }
}

impl std::error::Error for ChannelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ChannelError::Bootstrap(e) => Some(e),
            ChannelError::Static(e) => Some(e),
            ChannelError::Target { .. }
            | ChannelError::NoRuntime
            | ChannelError::Tls { .. }
            | ChannelError::ServiceConfig { .. }
            | ChannelError::Option { .. }
            | ChannelError::Resolver { .. } => None,
        }
    }
}

impl From<BootstrapError> for ChannelError {
    fn from(e: BootstrapError) -> Self {
        ChannelError::Bootstrap(e)
    }
}

/// A cluster in use: the route table holds one per cluster it names, and
/// each call holds its cluster's until it ends; when the last goes, the LB
/// task may drop the cluster from the tree.
#[derive(Debug)]
pub struct ClusterRef {
    /// The cluster's name.
    pub name: Arc<str>,
    control: mpsc::WeakUnboundedSender<Control>,
}

impl Drop for ClusterRef {
    fn drop(&mut self) {
        if let Some(tx) = self.control.upgrade() {
            let _ = tx.send(Control::ClusterUnused(self.name.clone()));
        }
    }
}

/// What a channel is doing, for operators: "why did my call go there".
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChannelStats {
    /// The channel's target.
    pub target: String,
    /// The root policy's state.
    pub state: ConnectivityState,
    /// Where routing stands (the virtual host in use, or why none).
    pub routing: String,
    /// The LB tree: clusters, priorities, localities, endpoints with their
    /// state and call counts.
    pub tree: PolicyStats,
    /// Calls pinned by a session cookie stock Envoy's cookie session state
    /// would not read (a plain `legacy` text it parses as a protobuf, or an
    /// unpadded value); each address is also logged once.
    pub session_cookies_envoy_misreads: u64,
}

/// Drain readiness of one address in one cluster (see
/// [`ChannelStats::sessions`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterSessions {
    /// The cluster (for an aggregate, the leaf cluster holding the address).
    pub cluster: String,
    /// The address, its health and its sessions.
    #[serde(flatten)]
    pub sessions: crate::lb::override_host::AddressSessions,
}

impl ChannelStats {
    /// Drain readiness: for every address of every cluster with sessions
    /// on, how many sessions used it within the cluster's `idle_timeout`,
    /// and its health. A DRAINING address at 0 has no session left.
    pub fn sessions(&self) -> Vec<ClusterSessions> {
        fn walk(node: &PolicyStats, cluster: &str, out: &mut Vec<ClusterSessions>) {
            let cluster = match (node.policy, &node.name) {
                ("cds", Some(name)) => name.as_str(),
                _ => cluster,
            };
            out.extend(node.sessions.iter().map(|s| ClusterSessions {
                cluster: cluster.to_owned(),
                sessions: s.clone(),
            }));
            for c in &node.children {
                walk(c, cluster, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.tree, "", &mut out);
        out
    }
}

pub(crate) struct Inner {
    target: String,
    /// gRPC's `io.grpc.channel_id` (hash policies may name it): unique per channel.
    channel_id: String,
    authority: http::uri::Authority,
    /// `https` when connections use TLS, as tonic writes it.
    scheme: http::uri::Scheme,
    /// The deadline of calls that carry no `grpc-timeout`.
    default_timeout: Option<Duration>,
    /// The `user-agent` every call carries, when set.
    user_agent: Option<http::HeaderValue>,
    wait_for_ready: bool,
    /// The session cookie format written, which rotated keys must suit.
    session_format: tether_core::cookie::Format,
    /// gRPC's metrics (A66), when the channel records them.
    metrics: Option<Arc<crate::telemetry::ChannelMetrics>>,
    shared: Arc<Shared>,
    control: mpsc::UnboundedSender<Control>,
    tasks: Vec<AbortHandle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A gRPC channel with xDS load balancing: a cheap-to-clone tower
/// `Service` that generated tonic clients take unchanged. Must be made
/// inside a tokio runtime; its background tasks stop when the last clone is
/// dropped.
#[derive(Clone)]
pub struct Channel {
    inner: Arc<Inner>,
    /// The session this handle's calls belong to ([`Channel::with_cookie_jar`]).
    jar: Option<crate::session::jar::JarHandle>,
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("target", &self.inner.target)
            .finish()
    }
}

/// The endpoint address a `unix:` target's one endpoint has in the LB tree
/// and stats: its subchannels dial the socket's path instead.
const UNIX_ENDPOINT: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

/// Which channels share an XdsClient, and so one ADS stream to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum XdsClientScope {
    /// Channels to the same target share one; each target has its own, as
    /// in gRPC C-core since gRFC A71 (its CSDS lists one client a target).
    #[default]
    Target,
    /// Every channel of the process with the same bootstrap shares one.
    Process,
}

/// Options of a channel, then [`ChannelBuilder::connect`] or
/// [`ChannelBuilder::connect_static`].
#[derive(Debug, Clone, Default)]
pub struct ChannelBuilder {
    bootstrap: Option<Bootstrap>,
    xds_client: Option<XdsClient>,
    xds_client_scope: XdsClientScope,
    client_options: ClientOptions,
    subchannel: SubchannelOptions,
    wait_for_ready: bool,
    authority: Option<String>,
    session: SessionOptions,
    /// Ignore clusters' TLS (gRFC A29) when set.
    no_xds_credentials: bool,
    /// For targets without xDS: the LB policy's JSON.
    service_config: Option<String>,
    /// For targets without xDS: the session cookie.
    session_cookie: Option<CookieSpec>,
    min_time_between_resolutions: Option<Duration>,
    default_timeout: Option<Duration>,
    user_agent: Option<String>,
    telemetry: Option<crate::telemetry::Telemetry>,
}

impl ChannelBuilder {
    /// The xDS bootstrap (default: from `GRPC_XDS_BOOTSTRAP` or
    /// `GRPC_XDS_BOOTSTRAP_CONFIG`).
    pub fn bootstrap(mut self, bootstrap: Bootstrap) -> Self {
        self.bootstrap = Some(bootstrap);
        self
    }

    /// The XdsClient to use, instead of the one [`ChannelBuilder::xds_client_scope`]
    /// picks (e.g. one made by [`XdsClient::start_with`]: a stream of the
    /// channel's own).
    pub fn xds_client(mut self, client: XdsClient) -> Self {
        self.xds_client = Some(client);
        self
    }

    /// Which channels share the channel's XdsClient and its ADS stream:
    /// by default those to the same target, as gRPC C-core (gRFC A71);
    /// [`XdsClientScope::Process`] shares one stream among every channel
    /// of the process with the same bootstrap, for a management server
    /// that keeps one stream per client.
    pub fn xds_client_scope(mut self, scope: XdsClientScope) -> Self {
        self.xds_client_scope = scope;
        self
    }

    /// Options of the channel's XdsClient (e.g. a shorter does-not-exist
    /// timer for tests); channels share a client only when their options
    /// are equal too.
    pub fn xds_client_options(mut self, options: ClientOptions) -> Self {
        self.client_options = options;
        self
    }

    /// Subchannel options: connection backoff and connect timeout.
    pub fn subchannel_options(mut self, options: SubchannelOptions) -> Self {
        self.subchannel = options;
        self
    }

    /// HTTP/2 keepalive on every connection (gRFC A8; off by default, as
    /// in gRPC clients): a backend that stops answering is found within
    /// `time + timeout`, its calls fail UNAVAILABLE and new calls move.
    /// The same as [`SubchannelOptions::keepalive`].
    pub fn keepalive(mut self, keepalive: KeepaliveOptions) -> Self {
        self.subchannel.keepalive = Some(keepalive);
        self
    }

    /// TLS (and mTLS, with a client identity) on every connection the
    /// channel makes to its endpoints; plaintext HTTP/2 without it. Servers
    /// are verified against the config's server name, else the call
    /// authority: the target's name for `xds:///` targets or the one given
    /// to [`ChannelBuilder::authority`]; for a static target without
    /// either, against each endpoint's IP address.
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.subchannel.tls = Some(tls);
        self
    }

    /// Whether an `xds:///` target's connections use the TLS each cluster
    /// asks for (gRFC A29's xDS credentials: a CDS `transport_socket` with
    /// an `UpstreamTlsContext`, certificates from the bootstrap's
    /// `certificate_providers`); on by default. Off, clusters' TLS is
    /// ignored and every connection uses the channel's own credentials
    /// ([`ChannelBuilder::tls`], else plaintext), as a gRPC channel made
    /// with insecure or TLS credentials does.
    pub fn xds_credentials(mut self, on: bool) -> Self {
        self.no_xds_credentials = !on;
        self
    }

    /// Whether calls are `wait_for_ready` unless they say otherwise
    /// ([`WaitForReady`]); default false, as in gRPC.
    pub fn wait_for_ready(mut self, on: bool) -> Self {
        self.wait_for_ready = on;
        self
    }

    /// Accepts MAGLEV clusters in the channel's own XdsClient (tether beyond
    /// gRPC C-core, which NACKs them): they run as `ring_hash` over Envoy's
    /// Maglev table. Off by default, so the channel validates as C-core does.
    /// A shared XdsClient ([`ChannelBuilder::xds_client`]) keeps its own
    /// setting.
    pub fn maglev(mut self, on: bool) -> Self {
        self.client_options.validation.maglev = on;
        self
    }

    /// Custom LB policies (gRFC A52) the channel's own XdsClient accepts
    /// in clusters' `load_balancing_policy` lists, selected by name through
    /// a TypedStruct (see [`crate::lb::registry`]). A shared XdsClient
    /// ([`ChannelBuilder::xds_client`]) keeps its own registry, set in its
    /// [`ClientOptions`]' validation.
    pub fn lb_policy_registry(mut self, registry: crate::lb::PolicyRegistry) -> Self {
        self.client_options.validation.policies = registry.parsers().clone();
        self
    }

    /// How session cookies are written (default: C-core's format, unsigned).
    /// The channel reads every format whatever it writes.
    pub fn session_options(mut self, options: SessionOptions) -> Self {
        self.session = options;
        self
    }

    /// The `:authority` calls carry (default: the target's name as written
    /// (`HOST[:PORT]` of a `dns:` or `http(s)://` target), the first
    /// address of an `ipv4:`/`ipv6:` list, `localhost` for `unix:`, or the
    /// static cluster's name).
    pub fn authority(mut self, authority: impl Into<String>) -> Self {
        self.authority = Some(authority.into());
        self
    }

    /// tonic's `Endpoint::origin`: calls carry `origin`'s authority (its
    /// scheme follows the channel's TLS). The same as
    /// [`ChannelBuilder::authority`].
    pub fn origin(mut self, origin: http::Uri) -> Self {
        self.authority = Some(
            origin
                .authority()
                .map_or_else(|| origin.to_string(), ToString::to_string),
        );
        self
    }

    /// For targets without xDS (`dns:`, `ipv4:`, `ipv6:`, `unix:`,
    /// `http(s)://`, `static:///`): gRPC's default service config, of which
    /// the channel reads the load balancing: `loadBalancingConfig` (the
    /// first policy the registry knows: `pick_first`, `round_robin`,
    /// `least_request_experimental`, `weighted_round_robin`, custom
    /// policies of [`ChannelBuilder::lb_policy_registry`]) or the deprecated
    /// `loadBalancingPolicy`. Without one, `pick_first`, as in gRPC
    /// (`static:///` keeps round robin). Checked by
    /// [`ChannelBuilder::connect`]: `{"loadBalancingConfig": [{"round_robin": {}}]}`.
    pub fn default_service_config(mut self, json: impl Into<String>) -> Self {
        self.service_config = Some(json.into());
        self
    }

    /// For targets without xDS: a stateful session cookie (gRFC A55) on
    /// every call, as [`StaticConfig::with_session`] gives a static config
    /// and an xDS listener's `stateful_session` filter would. The cookie
    /// names the endpoint's address; when the address leaves the resolver's
    /// answer, its sessions move, each with a fresh cookie. gRPC itself has
    /// cookie affinity only with xDS.
    pub fn session_cookie(mut self, cookie: impl Into<Option<CookieSpec>>) -> Self {
        self.session_cookie = cookie.into();
        self
    }

    /// The least time between two DNS resolutions of a `dns:` or
    /// `http(s)://` target (C-core's `grpc.dns_min_time_between_resolutions_ms`,
    /// 30 s by default): a re-resolution a lost or failed connection asks
    /// for within it waits for its end.
    pub fn dns_min_time_between_resolutions(mut self, interval: Duration) -> Self {
        self.min_time_between_resolutions = Some(interval);
        self
    }

    /// tonic's `Endpoint::connect_timeout`: the least time a connection
    /// attempt may take (gRPC's min connect timeout, 20 s by default; an
    /// attempt may take up to the current backoff delay when that is
    /// longer). The same as [`SubchannelOptions::min_connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.subchannel.min_connect_timeout = timeout;
        self
    }

    /// tonic's `Endpoint::timeout`: the deadline of every call that does
    /// not carry a shorter `grpc-timeout` (DEADLINE_EXCEEDED when it
    /// passes). None by default.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = Some(timeout);
        self
    }

    /// tonic's `Endpoint::tcp_nodelay` (on by default, as in tonic and gRPC).
    pub fn tcp_nodelay(mut self, on: bool) -> Self {
        self.subchannel.tcp_nodelay = on;
        self
    }

    /// tonic's `Endpoint::tcp_keepalive`: TCP keepalive probes after this
    /// idle time (off by default). HTTP/2 keepalive is
    /// [`ChannelBuilder::keepalive`].
    pub fn tcp_keepalive(mut self, idle: Option<Duration>) -> Self {
        self.subchannel.tcp_keepalive = idle;
        self
    }

    /// tonic's `Endpoint::initial_stream_window_size`: HTTP/2's initial
    /// flow-control window of each stream (hyper's default when `None`).
    pub fn initial_stream_window_size(mut self, size: impl Into<Option<u32>>) -> Self {
        self.subchannel.initial_stream_window_size = size.into();
        self
    }

    /// tonic's `Endpoint::initial_connection_window_size`: HTTP/2's
    /// flow-control window of each connection (hyper's default when `None`).
    pub fn initial_connection_window_size(mut self, size: impl Into<Option<u32>>) -> Self {
        self.subchannel.initial_connection_window_size = size.into();
        self
    }

    /// tonic's `Endpoint::http2_adaptive_window`: windows sized by BDP
    /// estimates (overrides the window sizes).
    pub fn http2_adaptive_window(mut self, on: bool) -> Self {
        self.subchannel.http2_adaptive_window = on;
        self
    }

    /// tonic's `Endpoint::user_agent`: every call carries `user-agent:
    /// {user_agent} tether/{version}` (as tonic adds its own name). Checked
    /// by [`ChannelBuilder::connect`] to be a header value.
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = Some(user_agent.into());
        self
    }

    /// Records gRPC's standard metrics (gRFC A66, [`crate::telemetry`])
    /// with `telemetry`, instead of the process-wide one
    /// ([`crate::Telemetry::register_global`]) if any.
    pub fn telemetry(mut self, telemetry: crate::Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// A channel for any target [`Target`] parses:
    /// - `xds:///NAME`: NAME is the listener and picks the virtual host;
    ///   calls made before the resources arrive wait for them;
    /// - `static:///ADDR[,ADDR...]`: fixed endpoints, round robin;
    /// - `dns:[//SERVER/]HOST[:PORT]` (or a target without a scheme gRPC
    ///   knows, such as `localhost:50051`), `http://HOST[:PORT]`,
    ///   `https://HOST[:PORT]` (TLS: [`ChannelBuilder::tls`], else the
    ///   system's roots): every address HOST resolves to is an endpoint,
    ///   re-resolved when a connection is lost or fails;
    /// - `ipv4:IP:PORT[,...]`, `ipv6:[IP]:PORT[,...]`: fixed addresses;
    /// - `unix:PATH`, `unix:///PATH`: a Unix domain socket.
    ///
    /// Targets without xDS run [`ChannelBuilder::default_service_config`]'s
    /// policy (pick_first by default) and [`ChannelBuilder::session_cookie`].
    pub fn connect(self, target: &str) -> Result<Channel, ChannelError> {
        // Checked before anything is spawned, which would panic.
        tokio::runtime::Handle::try_current().map_err(|_| ChannelError::NoRuntime)?;
        match Target::parse(target)? {
            Target::Xds { name } => self.connect_xds(target, name),
            Target::Static(mut config) => {
                if self.service_config.is_some() {
                    config.policy = self.policy()?;
                }
                config.session = self.session_cookie.clone();
                self.connect_static(*config)
            }
            Target::Addresses(addresses) => {
                let config = StaticConfig::new(
                    target,
                    addresses.iter().copied().map(StaticEndpoint::new).collect(),
                )
                .with_policy(self.policy()?)
                .with_session(self.session_cookie.clone());
                let authority = addresses[0].to_string();
                let options = self.subchannel.clone();
                self.connect_fixed(target, config, &authority, options)
            }
            Target::Unix(path) => {
                let config = StaticConfig::new(target, vec![StaticEndpoint::new(UNIX_ENDPOINT)])
                    .with_policy(self.policy()?)
                    .with_session(self.session_cookie.clone());
                let mut options = self.subchannel.clone();
                options.unix = Some(path.into());
                self.connect_fixed(target, config, "localhost", options)
            }
            Target::Dns(name) => {
                let options = self.subchannel.clone();
                self.connect_dns(target, name, options)
            }
            Target::Http { secure, name } => {
                let mut options = self.subchannel.clone();
                if secure && options.tls.is_none() {
                    options.tls =
                        Some(
                            TlsConfig::from_system_roots().map_err(|e| ChannelError::Tls {
                                problem: format!("{target}: the system's roots: {e}"),
                            })?,
                        );
                }
                self.connect_dns(target, name, options)
            }
        }
    }

    /// The default service config's endpoint policy (pick_first without one).
    fn policy(&self) -> Result<EndpointPolicy, ChannelError> {
        service_config::endpoint_policy(
            self.service_config.as_deref(),
            &self.client_options.validation,
        )
        .map_err(|problem| ChannelError::ServiceConfig {
            json: self.service_config.clone().unwrap_or_default(),
            problem,
        })
    }

    fn connect_xds(self, target: &str, name: String) -> Result<Channel, ChannelError> {
        let client = match self.xds_client.clone() {
            Some(c) => c,
            None => {
                let bootstrap = match self.bootstrap.clone() {
                    Some(b) => b,
                    None => Bootstrap::from_env()?,
                };
                let options = self.client_options.clone();
                match self.xds_client_scope {
                    XdsClientScope::Target => XdsClient::for_target(bootstrap, options, target)?,
                    XdsClientScope::Process => XdsClient::shared(bootstrap, options)?,
                }
            }
        };
        let authority = self.authority.clone().unwrap_or_else(|| name.clone());
        let providers = (!self.no_xds_credentials)
            .then(|| ProviderStore::new(client.certificate_providers().clone()));
        let options = self.subchannel.clone();
        let mut inner = self.start(target, &authority, true, providers, options, None)?;
        if let Some(m) = &inner.metrics {
            m.watch_xds_client(&client);
        }
        let task = tokio::spawn(resolver::xds::run(client, name, inner.control.clone()));
        inner.tasks.push(task.abort_handle());
        Ok(Channel {
            jar: None,
            inner: Arc::new(inner),
        })
    }

    /// A `dns:` or `http(s)://` target: the DNS resolver's task beside the
    /// LB task, told of every lost or failed connection.
    fn connect_dns(
        self,
        target: &str,
        name: DnsName,
        options: SubchannelOptions,
    ) -> Result<Channel, ChannelError> {
        let template = StaticConfig::new(format!("{}:{}", name.host, name.port), Vec::new())
            .with_policy(self.policy()?)
            .with_session(self.session_cookie.clone());
        let authority = self
            .authority
            .clone()
            .unwrap_or_else(|| name.authority.clone());
        let min_interval = self
            .min_time_between_resolutions
            .unwrap_or(resolver::dns::DEFAULT_MIN_TIME_BETWEEN_RESOLUTIONS);
        let dns = resolver::dns::Dns::new(name, template, min_interval).map_err(|problem| {
            ChannelError::Resolver {
                target: target.to_owned(),
                problem,
            }
        })?;
        let reresolve = Arc::new(Notify::new());
        let mut inner = self.start(
            target,
            &authority,
            true,
            None,
            options,
            Some(reresolve.clone()),
        )?;
        let task = tokio::spawn(dns.run(inner.control.clone(), reresolve));
        inner.tasks.push(task.abort_handle());
        Ok(Channel {
            jar: None,
            inner: Arc::new(inner),
        })
    }

    /// A channel over fixed endpoints, run by the same LB tree.
    pub fn connect_static(self, config: StaticConfig) -> Result<Channel, ChannelError> {
        tokio::runtime::Handle::try_current().map_err(|_| ChannelError::NoRuntime)?;
        let authority = self
            .authority
            .clone()
            .unwrap_or_else(|| config.cluster.clone());
        let options = self.subchannel.clone();
        self.connect_fixed(&target::static_target(&config), config, &authority, options)
    }

    /// Fixed endpoints: one resolver result, at once. TLS verifies servers
    /// against the authority only when the builder named one.
    fn connect_fixed(
        self,
        target: &str,
        config: StaticConfig,
        authority: &str,
        options: SubchannelOptions,
    ) -> Result<Channel, ChannelError> {
        let resolved = config.channel_config().map_err(ChannelError::Static)?;
        let authority = self
            .authority
            .clone()
            .unwrap_or_else(|| authority.to_owned());
        let named = self.authority.is_some();
        let inner = self.start(target, &authority, named, None, options, None)?;
        let _ = inner
            .control
            .send(Control::Resolved(Ok(Box::new(resolved))));
        Ok(Channel {
            jar: None,
            inner: Arc::new(inner),
        })
    }

    /// The LB task and everything a call needs, before the resolver. With
    /// `named`, TLS verifies servers against the authority's host unless
    /// its config names another. `reresolve` is told of every connection
    /// lost or failed (a subchannel going IDLE or TRANSIENT_FAILURE), as
    /// gRPC's policies ask their resolver.
    fn start(
        &self,
        target: &str,
        authority: &str,
        named: bool,
        providers: Option<ProviderStore>,
        mut options: SubchannelOptions,
        reresolve: Option<Arc<Notify>>,
    ) -> Result<Inner, ChannelError> {
        let authority: http::uri::Authority =
            authority.parse().map_err(|e| ChannelError::Target {
                target: target.to_owned(),
                problem: TargetProblem::CallAuthority {
                    authority: authority.to_owned(),
                    reason: format!("{e}"),
                },
            })?;
        self.session.check().map_err(|e| ChannelError::Option {
            option: "session_options",
            value: format!("format {}", self.session.format.as_str()),
            problem: e.to_string(),
        })?;
        let user_agent = match &self.user_agent {
            None => None,
            Some(ua) => Some(
                http::HeaderValue::try_from(format!("{ua} tether/{}", env!("CARGO_PKG_VERSION")))
                    .map_err(|e| ChannelError::Option {
                    option: "user_agent",
                    value: ua.clone(),
                    problem: format!("is not a header value: {e}"),
                })?,
            ),
        };
        if let Some(tls) = options
            .tls
            .as_mut()
            .filter(|t| named && !t.has_server_name())
        {
            let host = authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']');
            *tls = tls
                .clone()
                .with_server_name(host)
                .map_err(|e| ChannelError::Tls {
                    problem: format!(
                        "{e} (the authority {authority}); give TlsConfig::with_server_name"
                    ),
                })?;
        }
        let scheme = if options.tls.is_some() {
            http::uri::Scheme::HTTPS
        } else {
            http::uri::Scheme::HTTP
        };
        let (lb_tx, lb_rx) = mpsc::unbounded_channel();
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let listener_tx = lb_tx.clone();
        let metrics = self
            .telemetry
            .clone()
            .or_else(crate::telemetry::Telemetry::global)
            .map(|t| t.for_channel(target));
        let pool = SubchannelPool::with_providers(
            options,
            Arc::new(move |id, address, state| {
                if let Some(r) = &reresolve {
                    if matches!(
                        state,
                        ConnectivityState::Idle | ConnectivityState::TransientFailure
                    ) {
                        r.notify_one();
                    }
                }
                let _ = listener_tx.send(Event::Subchannel(id, address, state));
            }),
            providers,
        )
        .with_metrics(
            metrics
                .as_ref()
                .and_then(|m| m.subchannels())
                .map(|m| m as Arc<dyn crate::subchannel::ConnectionEventsFor>),
        );
        let shared = Arc::new(Shared::new());
        let serializer = WorkSerializer::new(
            target.to_owned(),
            pool,
            lb_tx,
            control_tx.downgrade(),
            shared.clone(),
            self.session.clone(),
            metrics.as_ref().map(|m| m.lb()),
        );
        let task = tokio::spawn(serializer.run(lb_rx, control_rx));
        Ok(Inner {
            target: target.to_owned(),
            channel_id: format!("{:016x}", crate::lb::random::next_u64()),
            authority,
            scheme,
            default_timeout: self.default_timeout,
            user_agent,
            wait_for_ready: self.wait_for_ready,
            session_format: self.session.format,
            metrics,
            shared,
            control: control_tx,
            tasks: vec![task.abort_handle()],
        })
    }
}

impl Channel {
    /// A builder with gRPC's defaults.
    pub fn builder() -> ChannelBuilder {
        ChannelBuilder::default()
    }

    /// A channel for `xds:///NAME` with the bootstrap from the environment
    /// (`GRPC_XDS_BOOTSTRAP` or `GRPC_XDS_BOOTSTRAP_CONFIG`), or for any
    /// other target [`ChannelBuilder::connect`] takes (`dns:`, `ipv4:`,
    /// `ipv6:`, `unix:`, `http(s)://`, `static:///`). Async for the call sites' sake: the
    /// channel starts at once and calls wait for the resources.
    pub async fn from_target(target: &str) -> Result<Channel, ChannelError> {
        Channel::builder().connect(target)
    }

    /// A channel over fixed endpoints (no control plane).
    pub fn from_static(config: StaticConfig) -> Result<Channel, ChannelError> {
        Channel::builder().connect_static(config)
    }

    /// A handle to the same channel whose calls are one session: they
    /// carry `jar`'s cookies, and the cookies answers set go into it, as
    /// through a [`CookieJarLayer`](crate::session::CookieJarLayer), but
    /// without a layer: the channel hands the jar's session to its session
    /// filter directly, which costs less on every call. Clones share the
    /// jar; the original handle is left as it was.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use tether::session::CookieJar;
    ///
    /// let channel = tether::Channel::from_target("xds:///shop.example").await?;
    /// let jar = CookieJar::new();
    /// let session = channel.with_cookie_jar(jar.clone());
    /// // EchoClient::new(session) ... every call of it goes to the endpoint
    /// // the session's cookie names; `jar` shows what was stored.
    /// # let _ = session;
    /// # Ok(()) }
    /// ```
    pub fn with_cookie_jar(&self, jar: crate::session::CookieJar) -> Channel {
        Channel {
            inner: self.inner.clone(),
            jar: Some(crate::session::jar::JarHandle::new(jar)),
        }
    }

    /// The channel's target.
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// The root policy's connectivity state.
    pub fn state(&self) -> ConnectivityState {
        self.inner.shared.snapshot.load().state
    }

    /// Waits until the channel is in `state`.
    pub async fn wait_for_state(&self, state: ConnectivityState) {
        let mut generation = self.inner.shared.generation.subscribe();
        while self.state() != state {
            if generation.changed().await.is_err() {
                return;
            }
        }
    }

    /// Rotates the keys session cookies are signed or sealed with, without
    /// a restart: the first key writes, every key reads. A cookie an older
    /// key of the ring reads keeps its session and is re-issued under the
    /// first, so withdrawing that key later loses no session that made a
    /// call in between. Calls started after the channel applies the ring
    /// use it; an error names what is wrong (a `sealed` ring needs keys of
    /// at least 32 bytes) and changes nothing.
    pub fn set_session_keys(&self, keys: KeyRing) -> Result<(), ChannelError> {
        let mut options = SessionOptions::new(self.inner.session_format);
        options.keys = keys;
        options.check().map_err(|e| ChannelError::Option {
            option: "set_session_keys",
            value: format!("{} keys", options.keys.len()),
            problem: e.to_string(),
        })?;
        let _ = self.inner.control.send(Control::SessionKeys(options.keys));
        Ok(())
    }

    /// A snapshot of the LB tree: clusters, priorities, localities and
    /// endpoints with their states and call counts.
    pub async fn stats(&self) -> Option<ChannelStats> {
        let (tx, rx) = oneshot::channel();
        self.inner.control.send(Control::Stats(tx)).ok()?;
        rx.await.ok()
    }
}

impl tower_service::Service<http::Request<tonic::body::Body>> for Channel {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let jar = self.jar.as_mut().map(|j| j.apply(&mut request));
        // The call's own future, boxed as it is (a wrapper would be one
        // more copy of it on every call).
        Box::pin(call::call(self.inner.clone(), request, jar))
    }
}
