//! A purpose-built ADS server for fault injection: it serves what the test
//! puts in it, can withhold responses, reset streams, drop every connection
//! at once (as a killed process would) and come back on the same port.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use envoy_types::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_server::{
        AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
    },
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    ResourceError, ResourceName,
};
use envoy_types::pb::google::protobuf::Any;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// How the server treats streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Answer subscriptions with the resources it holds.
    Serve,
    /// Read requests, never answer.
    Withhold,
    /// End each stream with UNAVAILABLE right after its first request.
    FailFirstRequest,
}

#[derive(Default)]
struct Kill {
    killed: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
}

impl Kill {
    fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        for w in self.wakers.lock().unwrap().drain(..) {
            w.wake();
        }
    }
    fn check(&self, cx: &Context<'_>) -> bool {
        if self.killed.load(Ordering::SeqCst) {
            return true;
        }
        let mut w = self.wakers.lock().unwrap();
        if !w.iter().any(|x| x.will_wake(cx.waker())) {
            w.push(cx.waker().clone());
        }
        false
    }
}

/// A byte stream: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A connection that fails every read and write once killed.
pub struct Conn {
    inner: Box<dyn Io>,
    kill: Arc<Kill>,
}

fn killed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionReset, "killed by the fixture")
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.kill.check(cx) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.kill.check(cx) {
            return Poll::Ready(Err(killed()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

/// What [`Fixture::push`] sent: the response's nonce, and how many open
/// streams it went to.
#[derive(Debug, Clone)]
pub struct Pushed {
    pub nonce: String,
    pub streams: usize,
}

/// One request the server received, with the time it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    /// When (tokio clock).
    pub at: Instant,
    /// Which stream (0, 1, ...).
    pub stream: usize,
    /// The request.
    pub request: DiscoveryRequest,
}

#[derive(Default)]
struct State {
    mode: Option<Mode>,
    resources: HashMap<String, Vec<Any>>,
    /// Per-resource errors (xRFC TP3) sent with each response of a type.
    errors: HashMap<String, Vec<ResourceError>>,
    version: u64,
    requests: Vec<Received>,
    streams: Vec<Instant>,
    /// Each stream's `authorization` header, if it had one.
    authorization: Vec<Option<String>>,
    /// TLS for new connections.
    tls: Option<Arc<rustls::ServerConfig>>,
    live: Vec<mpsc::Sender<Result<DiscoveryResponse, Status>>>,
    nonce: u64,
}

/// The fixture.
#[derive(Clone)]
pub struct Fixture {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    kill: Arc<Mutex<Arc<Kill>>>,
    task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

#[derive(Clone)]
struct Svc {
    state: Arc<Mutex<State>>,
}

impl Fixture {
    /// Starts on a free port.
    pub async fn start(mode: Mode) -> Fixture {
        Fixture::serving(TcpListener::bind("127.0.0.1:0").await.unwrap(), mode)
    }

    /// Starts on 127.0.0.1 serving ADS over TLS with `config`.
    #[allow(dead_code)]
    pub async fn start_tls(mode: Mode, config: Arc<rustls::ServerConfig>) -> Fixture {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let f = Fixture {
            addr: listener.local_addr().unwrap(),
            state: Arc::new(Mutex::new(State {
                mode: Some(mode),
                version: 1,
                tls: Some(config),
                ..Default::default()
            })),
            kill: Arc::new(Mutex::new(Arc::new(Kill::default()))),
            task: Arc::new(Mutex::new(None)),
        };
        f.serve(listener);
        f
    }

    /// Each stream's `authorization` header (None: it had none), in the
    /// order the streams opened.
    #[allow(dead_code)]
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().authorization.clone()
    }

    /// A free port with nothing listening (connections are refused).
    pub async fn unused_addr() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], tether_testkit::free_port()))
    }

    /// Starts on `addr` (e.g. one that was refused so far).
    pub async fn start_at(addr: SocketAddr, mode: Mode) -> Fixture {
        Fixture::serving(TcpListener::bind(addr).await.unwrap(), mode)
    }

    /// A fixture in `mode`, serving on `listener`.
    fn serving(listener: TcpListener, mode: Mode) -> Fixture {
        let f = Fixture {
            addr: listener.local_addr().unwrap(),
            state: Arc::new(Mutex::new(State {
                mode: Some(mode),
                version: 1,
                ..Default::default()
            })),
            kill: Arc::new(Mutex::new(Arc::new(Kill::default()))),
            task: Arc::new(Mutex::new(None)),
        };
        f.serve(listener);
        f
    }

    fn serve(&self, listener: TcpListener) {
        let kill = Arc::new(Kill::default());
        *self.kill.lock().unwrap() = kill.clone();
        let svc = AggregatedDiscoveryServiceServer::new(Svc {
            state: self.state.clone(),
        });
        let (tx, rx) = mpsc::channel::<std::io::Result<Conn>>(16);
        let tls = self.state.lock().unwrap().tls.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    return;
                };
                let _ = s.set_nodelay(true);
                let inner: Box<dyn Io> = match &tls {
                    None => Box::new(s),
                    Some(config) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
                        match acceptor.accept(s).await {
                            Ok(s) => Box::new(s),
                            Err(_) => continue,
                        }
                    }
                };
                if tx
                    .send(Ok(Conn {
                        inner,
                        kill: kill.clone(),
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        // Aborting this task drops the acceptor (and so the listener) too.
        *self.task.lock().unwrap() = Some(tokio::spawn(async move {
            let _guard = AbortOnDrop(accept);
            let _ = tonic::transport::Server::builder()
                .serve_with_incoming(svc, ReceiverStream::new(rx))
                .await;
        }));
    }

    /// Drops every connection and stops listening, as a killed process would.
    pub fn kill(&self) {
        self.kill.lock().unwrap().kill();
        if let Some(t) = self.task.lock().unwrap().take() {
            t.abort();
        }
        self.state.lock().unwrap().live.clear();
    }

    /// Listens again on the same port.
    pub async fn restart(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    /// Ends every open stream with UNAVAILABLE (the connection stays).
    pub fn reset_streams(&self) {
        let live: Vec<_> = self.state.lock().unwrap().live.drain(..).collect();
        for tx in live {
            let _ = tx.try_send(Err(Status::unavailable("stream reset by the fixture")));
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().unwrap().mode = Some(mode);
    }

    /// Replaces the resources of a type and bumps the version (not pushed).
    pub fn set_resources(&self, type_url: &str, resources: Vec<Any>) {
        let mut s = self.state.lock().unwrap();
        s.resources.insert(type_url.to_owned(), resources);
        s.version += 1;
    }

    /// Sets the per-resource errors (xRFC TP3) sent with a type's responses:
    /// (resource name, gRPC code, message); bumps the version.
    #[allow(dead_code)]
    pub fn set_errors(&self, type_url: &str, errors: &[(&str, i32, &str)]) {
        let mut s = self.state.lock().unwrap();
        let errors = errors
            .iter()
            .map(|(name, code, message)| ResourceError {
                resource_name: Some(ResourceName {
                    name: (*name).to_owned(),
                    ..Default::default()
                }),
                error_detail: Some(envoy_types::pb::google::rpc::Status {
                    code: *code,
                    message: (*message).to_owned(),
                    details: Vec::new(),
                }),
            })
            .collect();
        s.errors.insert(type_url.to_owned(), errors);
        s.version += 1;
    }

    /// Sends the current resources of a type on every open stream.
    pub fn push(&self, type_url: &str) -> Pushed {
        let mut s = self.state.lock().unwrap();
        let resp = s.response(type_url, None);
        let streams = s
            .live
            .iter()
            .filter(|tx| tx.try_send(Ok(resp.clone())).is_ok())
            .count();
        Pushed {
            nonce: resp.nonce,
            streams,
        }
    }

    /// How many streams have answered (ACKed or NACKed) the response
    /// with `nonce`.
    pub fn answered(&self, nonce: &str) -> usize {
        let s = self.state.lock().unwrap();
        let streams: std::collections::HashSet<usize> = s
            .requests
            .iter()
            .filter(|r| r.request.response_nonce == nonce)
            .map(|r| r.stream)
            .collect();
        streams.len()
    }

    /// Waits (at most 20 s) until every stream `pushed` went to has
    /// answered it: each client has handled that response.
    pub async fn until_answered(&self, pushed: &Pushed) {
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while self.answered(&pushed.nonce) < pushed.streams {
            assert!(
                Instant::now() < deadline,
                "{} of {} streams answered the push with nonce {}",
                self.answered(&pushed.nonce),
                pushed.streams,
                pushed.nonce
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    pub fn requests(&self) -> Vec<Received> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn stream_starts(&self) -> Vec<Instant> {
        self.state.lock().unwrap().streams.clone()
    }

    pub fn version(&self) -> u64 {
        self.state.lock().unwrap().version
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl State {
    fn response(&mut self, type_url: &str, names: Option<&[String]>) -> DiscoveryResponse {
        self.nonce += 1;
        let all = self.resources.get(type_url).cloned().unwrap_or_default();
        let resources = match names {
            Some(n) if !n.is_empty() => all
                .into_iter()
                .filter(|a| resource_name(type_url, a).is_none_or(|name| n.contains(&name)))
                .collect(),
            _ => all,
        };
        DiscoveryResponse {
            version_info: self.version.to_string(),
            resources,
            resource_errors: self.errors.get(type_url).cloned().unwrap_or_default(),
            type_url: type_url.to_owned(),
            nonce: self.nonce.to_string(),
            ..Default::default()
        }
    }
}

/// The name inside a resource (None when it cannot be decoded: served anyway).
fn resource_name(type_url: &str, any: &Any) -> Option<String> {
    use prost::Message;
    let kind = tether_xds::ResourceKind::from_type_url(type_url)?;
    let bytes = any.value.as_slice();
    Some(match kind {
        tether_xds::ResourceKind::Listener => {
            envoy_types::pb::envoy::config::listener::v3::Listener::decode(bytes)
                .ok()?
                .name
        }
        tether_xds::ResourceKind::RouteConfiguration => {
            envoy_types::pb::envoy::config::route::v3::RouteConfiguration::decode(bytes)
                .ok()?
                .name
        }
        tether_xds::ResourceKind::Cluster => {
            envoy_types::pb::envoy::config::cluster::v3::Cluster::decode(bytes)
                .ok()?
                .name
        }
        tether_xds::ResourceKind::Endpoints => {
            envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(bytes)
                .ok()?
                .cluster_name
        }
    })
}

type Out = Pin<Box<dyn tokio_stream::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaOut =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Svc {
    type StreamAggregatedResourcesStream = Out;
    type DeltaAggregatedResourcesStream = DeltaOut;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Out>, Status> {
        let (tx, rx) = mpsc::channel(64);
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let stream_id = {
            let mut s = self.state.lock().unwrap();
            s.authorization.push(authorization);
            s.streams.push(Instant::now());
            s.live.push(tx.clone());
            s.streams.len() - 1
        };
        let state = self.state.clone();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let mut last_names: HashMap<String, Vec<String>> = HashMap::new();
            while let Ok(Some(req)) = inbound.message().await {
                let reply = {
                    let mut s = state.lock().unwrap();
                    s.requests.push(Received {
                        at: Instant::now(),
                        stream: stream_id,
                        request: req.clone(),
                    });
                    match s.mode.unwrap_or(Mode::Serve) {
                        Mode::Withhold => None,
                        Mode::FailFirstRequest => Some(Err(Status::unavailable(
                            "injected failure before any response",
                        ))),
                        Mode::Serve => {
                            let changed =
                                last_names.get(&req.type_url) != Some(&req.resource_names);
                            if req.response_nonce.is_empty() || changed {
                                last_names.insert(req.type_url.clone(), req.resource_names.clone());
                                Some(Ok(s.response(&req.type_url, Some(&req.resource_names))))
                            } else {
                                None
                            }
                        }
                    }
                };
                if let Some(r) = reply {
                    let fail = r.is_err();
                    if tx.send(r).await.is_err() || fail {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaOut>, Status> {
        Err(Status::unimplemented("no delta"))
    }
}

/// A bootstrap for a server at `addr` with node ID `node`.
pub fn bootstrap(addr: SocketAddr, node: &str) -> tether_xds::Bootstrap {
    tether_xds::Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{addr}","channel_creds":[{{"type":"insecure"}}]}}],"node":{{"id":"{node}"}}}}"#
    ))
    .unwrap()
}

/// Resource builders.
pub mod make {
    use envoy_types::pb::envoy::config::cluster::v3 as cpb;
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::config::endpoint::v3 as epb;
    use envoy_types::pb::envoy::config::listener::v3 as lpb;
    use envoy_types::pb::envoy::config::route::v3 as rpb;
    use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::google::protobuf::UInt32Value;
    use tether_xds::resource::pack;

    pub fn ads() -> core::ConfigSource {
        core::ConfigSource {
            config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
                core::AggregatedConfigSource {},
            )),
            ..Default::default()
        }
    }

    /// An API listener reading routes `route` over RDS.
    pub fn listener(name: &str, route: &str) -> Any {
        listener_with(name, route, Vec::new())
    }

    /// An API listener reading routes `route` over RDS, with the HTTP
    /// filters `(name, config)` before the router.
    pub fn listener_with(name: &str, route: &str, filters: Vec<(&str, Any)>) -> Any {
        let mut http_filters: Vec<hcm::HttpFilter> = filters
            .into_iter()
            .map(|(n, config)| hcm::HttpFilter {
                name: n.to_owned(),
                config_type: Some(hcm::http_filter::ConfigType::TypedConfig(config)),
                ..Default::default()
            })
            .collect();
        http_filters.push(hcm::HttpFilter {
            name: "router".into(),
            config_type: Some(hcm::http_filter::ConfigType::TypedConfig(pack(
                &Router::default(),
            ))),
            ..Default::default()
        });
        let m = hcm::HttpConnectionManager {
            route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
                hcm::Rds {
                    config_source: Some(ads()),
                    route_config_name: route.to_owned(),
                },
            )),
            http_filters,
            ..Default::default()
        };
        pack(&lpb::Listener {
            name: name.to_owned(),
            api_listener: Some(lpb::ApiListener {
                api_listener: Some(pack(&m)),
            }),
            ..Default::default()
        })
    }

    /// One endpoint `addr` (`ip:port`) for cluster `name`, in one locality.
    pub fn endpoints(name: &str, addr: &str) -> epb::ClusterLoadAssignment {
        let (ip, port) = addr.rsplit_once(':').unwrap();
        epb::ClusterLoadAssignment {
            cluster_name: name.to_owned(),
            endpoints: vec![epb::LocalityLbEndpoints {
                locality: Some(core::Locality::default()),
                load_balancing_weight: Some(UInt32Value { value: 1 }),
                lb_endpoints: vec![epb::LbEndpoint {
                    host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(
                        epb::Endpoint {
                            address: Some(core::Address {
                                address: Some(core::address::Address::SocketAddress(
                                    core::SocketAddress {
                                        address: ip.to_owned(),
                                        port_specifier: Some(
                                            core::socket_address::PortSpecifier::PortValue(
                                                port.parse().unwrap(),
                                            ),
                                        ),
                                        ..Default::default()
                                    },
                                )),
                            }),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A route sending `prefix` to `cluster`.
    pub fn route(prefix: &str, cluster: &str) -> rpb::Route {
        rpb::Route {
            r#match: Some(rpb::RouteMatch {
                path_specifier: Some(rpb::route_match::PathSpecifier::Prefix(prefix.to_owned())),
                ..Default::default()
            }),
            action: Some(rpb::route::Action::Route(rpb::RouteAction {
                cluster_specifier: Some(rpb::route_action::ClusterSpecifier::Cluster(
                    cluster.to_owned(),
                )),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    /// A route configuration `name` with one virtual host for every domain.
    pub fn route_config(name: &str, routes: Vec<rpb::Route>) -> rpb::RouteConfiguration {
        rpb::RouteConfiguration {
            name: name.to_owned(),
            virtual_hosts: vec![rpb::VirtualHost {
                name: "all".into(),
                domains: vec!["*".into()],
                routes,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// An EDS cluster with round robin.
    pub fn cluster(name: &str) -> cpb::Cluster {
        cpb::Cluster {
            name: name.to_owned(),
            cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
                cpb::cluster::DiscoveryType::Eds as i32,
            )),
            eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
                eds_config: Some(ads()),
                service_name: String::new(),
            }),
            ..Default::default()
        }
    }
}

pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
