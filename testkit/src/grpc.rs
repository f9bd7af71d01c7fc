//! gRPC backends that say who they are: tonic servers of the demo service
//! `tether.demo.v1.Echo`, whose reply carries the backend's name, address
//! and how many calls it has served.
//!
//! Each reply also returns the call's `cookie` and `grpc-timeout` metadata
//! in the response metadata `x-seen-cookie` and `x-seen-grpc-timeout`, so
//! a test can see what a proxy or a channel sent. A
//! message `sleep:MS` is answered after MS milliseconds (a call in flight);
//! a backend started with [`Backend::start_slow`] answers every call after
//! its delay (a slow backend among fast ones), and one started with
//! [`Backend::start_failing`] answers UNAVAILABLE while its switch is on.
//! [`crate::backend::Backend::stop`] closes the listener and every open
//! connection, as a crashed backend would; [`serve_dual`] serves until told
//! to stop and then drains, as a well-behaved server does on SIGTERM.

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tether_proto::demo::v1::echo_server::{Echo, EchoServer};
pub use tether_proto::demo::v1::{EchoReply, EchoRequest};

use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::backend::{accept_loop, Backend};
use crate::graceful_socket::GracefulSocket;
use crate::tls::ClientCertificate;
pub use tether_proto::demo::v1::echo_client::EchoClient;
use tonic::codegen::Service;

/// The demo service `tether.demo.v1.Echo` over gRPC.
pub enum Grpc {}

/// A running gRPC backend; [`Backend::stop`] stops accepting connections.
pub type GrpcBackend = Backend<Grpc>;

impl Backend<Grpc> {
    /// Starts a backend called `name` on a random 127.0.0.1 port.
    pub async fn start(name: &str) -> GrpcBackend {
        Self::start_on(name, "127.0.0.1:0".parse().expect("addr")).await
    }

    /// Starts a backend called `name` on `addr` (e.g. to restart on the same port).
    pub async fn start_on(name: &str, addr: SocketAddr) -> GrpcBackend {
        Self::start_with_delay(name, addr, Duration::ZERO).await
    }

    /// Starts a backend called `name` on a random 127.0.0.1 port that
    /// answers every call after `delay` (calls run concurrently).
    pub async fn start_slow(name: &str, delay: Duration) -> GrpcBackend {
        Self::start_with_delay(name, "127.0.0.1:0".parse().expect("addr"), delay).await
    }

    /// Starts a backend called `name` on a random 127.0.0.1 port whose
    /// handler answers UNAVAILABLE to every call while `failing` is set
    /// (still counted in `served`): a backend outlier detection ejects.
    pub async fn start_failing(name: &str, failing: Arc<AtomicBool>) -> GrpcBackend {
        Self::start_full(
            name,
            "127.0.0.1:0".parse().expect("addr"),
            Duration::ZERO,
            Some(failing),
        )
        .await
    }

    async fn start_with_delay(name: &str, addr: SocketAddr, delay: Duration) -> GrpcBackend {
        Self::start_full(name, addr, delay, None).await
    }

    async fn start_full(
        name: &str,
        addr: SocketAddr,
        delay: Duration,
        failing: Option<Arc<AtomicBool>>,
    ) -> GrpcBackend {
        Self::start_wrapped_full(
            name,
            bind(addr).await,
            delay,
            failing,
            None,
            None,
            |routes| routes,
        )
        .await
    }

    /// Starts a backend called `name` on a random 127.0.0.1 port that ends
    /// every connection gracefully once it is `max_age` old, as gRPC's
    /// `max_connection_age` does: a GOAWAY, the calls already on it
    /// finish, then the connection closes. The counter counts the GOAWAYs
    /// sent.
    pub async fn start_rotating(name: &str, max_age: Duration) -> (GrpcBackend, Arc<AtomicU64>) {
        Self::start_rotating_on(name, "127.0.0.1:0".parse().expect("addr"), max_age).await
    }

    /// [`Backend::start_rotating`] on `addr` (e.g. one of several loopback
    /// addresses sharing a port, as the instances of a scaled service).
    pub async fn start_rotating_on(
        name: &str,
        addr: SocketAddr,
        max_age: Duration,
    ) -> (GrpcBackend, Arc<AtomicU64>) {
        Self::start_rotating_on_listener(name, bind(addr).await, max_age).await
    }

    /// [`Backend::start_rotating`] on `listener`, bound by the caller (so
    /// no other process can take its port in between).
    pub async fn start_rotating_on_listener(
        name: &str,
        listener: tokio::net::TcpListener,
        max_age: Duration,
    ) -> (GrpcBackend, Arc<AtomicU64>) {
        let goaways = Arc::new(AtomicU64::new(0));
        let rotation = Rotation {
            max_age,
            goaways: goaways.clone(),
        };
        let backend = Self::start_wrapped_full(
            name,
            listener,
            Duration::ZERO,
            None,
            Some(rotation),
            None,
            |r| r,
        )
        .await;
        (backend, goaways)
    }

    /// Starts a backend called `name` on a random 127.0.0.1 port whose Echo
    /// routes are first handed to `wrap`, which may add services beside
    /// Echo or layers around it (a load reporting server, say).
    pub async fn start_wrapped<S, B>(name: &str, wrap: impl FnOnce(Routes) -> S) -> GrpcBackend
    where
        S: Service<
                tonic::codegen::http::Request<hyper::body::Incoming>,
                Response = tonic::codegen::http::Response<B>,
            > + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: tonic::codegen::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let l = bind("127.0.0.1:0".parse().expect("addr")).await;
        Self::start_wrapped_full(name, l, Duration::ZERO, None, None, None, wrap).await
    }

    /// Starts a backend called `name` on a random 127.0.0.1 port that
    /// speaks gRPC over TLS only, with `config` (see
    /// [`crate::tls::server_config`]). Each reply carries the client
    /// certificate's [`crate::tls::fingerprint`] in `x-client-cert` when
    /// the client presented one.
    pub async fn start_tls(name: &str, config: Arc<rustls::ServerConfig>) -> GrpcBackend {
        let l = bind("127.0.0.1:0".parse().expect("addr")).await;
        Self::start_wrapped_full(name, l, Duration::ZERO, None, None, Some(config), |r| r).await
    }

    /// [`Backend::start_tls`] that also ends each connection gracefully once
    /// it is `max_age` old, as [`Backend::start_rotating`] does: clients make
    /// new TLS connections all the time.
    pub async fn start_tls_rotating(
        name: &str,
        config: Arc<rustls::ServerConfig>,
        max_age: Duration,
    ) -> (GrpcBackend, Arc<AtomicU64>) {
        let goaways = Arc::new(AtomicU64::new(0));
        let rotation = Rotation {
            max_age,
            goaways: goaways.clone(),
        };
        let l = bind("127.0.0.1:0".parse().expect("addr")).await;
        let backend = Self::start_wrapped_full(
            name,
            l,
            Duration::ZERO,
            None,
            Some(rotation),
            Some(config),
            |r| r,
        )
        .await;
        (backend, goaways)
    }

    /// Starts a backend called `name` on `listener` (an address chosen by
    /// the caller, e.g. with [`crate::loopback_listener`]).
    pub async fn start_on_listener(name: &str, listener: tokio::net::TcpListener) -> GrpcBackend {
        Self::start_wrapped_full(name, listener, Duration::ZERO, None, None, None, |r| r).await
    }

    async fn start_wrapped_full<S, B>(
        name: &str,
        listener: tokio::net::TcpListener,
        delay: Duration,
        failing: Option<Arc<AtomicBool>>,
        rotation: Option<Rotation>,
        tls: Option<Arc<rustls::ServerConfig>>,
        wrap: impl FnOnce(Routes) -> S,
    ) -> GrpcBackend
    where
        S: Service<
                tonic::codegen::http::Request<hyper::body::Incoming>,
                Response = tonic::codegen::http::Response<B>,
            > + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: tonic::codegen::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let addr = listener.local_addr().expect("gRPC backend addr");
        let served = Arc::new(AtomicU64::new(0));
        let routes = wrap(Routes::new(EchoServer::new(EchoService {
            name: name.to_string(),
            addr,
            served: served.clone(),
            delay,
            failing,
        })));
        let task = accept_loop(listener, move |stream| {
            let _ = stream.set_nodelay(true);
            let svc = TowerToHyperService::new(routes.clone());
            let rotation = rotation.clone();
            let tls = tls.clone();
            async move {
                let builder = auto::Builder::new(TokioExecutor::new());
                let builder = builder.http2_only();
                let Some((io, cert)) = accept_io(stream, tls).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |mut req: tonic::codegen::http::Request<hyper::body::Incoming>| {
                        if let Some(c) = &cert {
                            req.extensions_mut().insert(c.clone());
                        }
                        hyper::service::Service::call(&svc, req)
                    },
                );
                let Some(rotation) = rotation else {
                    let _ = builder.serve_connection(TokioIo::new(io), svc).await;
                    return;
                };
                let conn = builder.serve_connection(TokioIo::new(GracefulSocket::new(io)), svc);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    () = tokio::time::sleep(rotation.max_age) => {}
                }
                rotation.goaways.fetch_add(1, Ordering::SeqCst);
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        });
        Backend::new(name, addr, served, task)
    }
}

/// A backend's connection: TCP, or TLS over it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Io for T {}

/// How long a TLS client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// An accepted connection as the server speaks it: `stream` itself, or,
/// with `tls`, TLS over it with the client certificate the peer presented.
/// `None` when the handshake fails or takes too long (the peer is gone).
async fn accept_io(
    stream: tokio::net::TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Option<(Box<dyn Io>, Option<ClientCertificate>)> {
    let Some(config) = tls else {
        return Some((Box::new(stream), None));
    };
    let peer = stream.peer_addr().ok();
    let accepted = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsAcceptor::from(config).accept(stream),
    )
    .await;
    let stream = match accepted {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            log::info!("TLS handshake with {peer:?} failed: {e}");
            return None;
        }
        Err(_) => {
            log::info!("TLS handshake with {peer:?}: no answer within {HANDSHAKE_TIMEOUT:?}");
            return None;
        }
    };
    let cert = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| ClientCertificate(c.to_vec()));
    Some((Box::new(stream), cert))
}

async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind gRPC backend")
}

/// How a rotating backend ends its connections.
#[derive(Clone)]
struct Rotation {
    max_age: Duration,
    goaways: Arc<AtomicU64>,
}

/// HTTP/1.1 (answered as [`crate::backend`] says) and gRPC (the demo Echo
/// service) on one port: a request whose `content-type` starts with
/// `application/grpc` goes to Echo, any other to the HTTP answer.
pub enum Dual {}

/// A running backend serving both HTTP and gRPC.
pub type DualBackend = Backend<Dual>;

impl Backend<Dual> {
    /// Starts a backend called `name` on a random 127.0.0.1 port.
    pub async fn start(name: &str) -> DualBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind backend");
        Self::start_on(name, listener)
    }

    /// Starts a backend called `name` on `listener`.
    pub fn start_on(name: &str, listener: tokio::net::TcpListener) -> DualBackend {
        let addr = listener.local_addr().expect("backend addr");
        let hits = Arc::new(AtomicU64::new(0));
        let service = DualService::new(name, addr, hits.clone());
        let task = accept_loop(listener, move |stream| {
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
        });
        Backend::new(name, addr, hits, task)
    }
}

/// What [`serve_dual`] saw when it was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Connections still open when the shutdown began.
    pub connections: usize,
    /// Whether every one of them finished within the grace period.
    pub in_time: bool,
    /// How long they took (the grace period when they did not finish).
    pub took: Duration,
}

/// Serves `name` on `listener` as a [`DualBackend`] does (HTTP/1.1 and
/// gRPC, answers naming the backend and the listener's address, or the
/// address a connection reached when the listener is bound to every
/// address) until
/// `shutdown` resolves, then drains: the listener is closed first, so new
/// connections are refused at once, and every open connection is asked to
/// finish (HTTP/2: GOAWAY, its streams in flight complete; HTTP/1.1: closed
/// after the response in flight) and waited for, at most `grace`.
///
/// This is what a backend must do on SIGTERM for a stop to lose no call.
///
/// With `max_age`, each connection is ended the same graceful way once it
/// is that old, as gRPC servers' `max_connection_age` does. With `tls`
/// (see [`crate::tls::server_config_from_files`]) every connection is TLS
/// (mTLS when the config asks for client certificates) and answers (Echo
/// replies' metadata, HTTP headers) carry the client certificate's
/// fingerprint in `x-client-cert`.
pub async fn serve_dual(
    name: &str,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
    grace: Duration,
    max_age: Option<Duration>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<Drained> {
    let addr = listener.local_addr()?;
    let hits = Arc::new(AtomicU64::new(0));
    let service = DualService::new(name, addr, hits.clone());
    let builder = auto::Builder::new(TokioExecutor::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Each connection's task holds a sender: all gone, all closed.
    let (alive_tx, mut alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let builder = builder.clone();
                    // Bound to every address (a replica that does not know
                    // its own): answers name the address this client reached.
                    let service = match stream.local_addr() {
                        Ok(local) if addr.ip().is_unspecified() => {
                            DualService::new(name, local, hits.clone())
                        }
                        _ => service.clone(),
                    };
                    let tls = tls.clone();
                    let mut stop = stop_rx.clone();
                    let alive = alive_tx.clone();
                    let open = open.clone();
                    open.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        let Some((io, cert)) = accept_io(stream, tls).await else {
                            open.fetch_sub(1, Ordering::SeqCst);
                            drop(alive);
                            return;
                        };
                        let conn = builder.serve_connection(
                            TokioIo::new(GracefulSocket::new(io)),
                            service.with_client_certificate(cert),
                        );
                        tokio::pin!(conn);
                        let aged = async {
                            match max_age {
                                Some(age) => tokio::time::sleep(age).await,
                                None => std::future::pending().await,
                            }
                        };
                        let ended = tokio::select! {
                            result = conn.as_mut() => Some(result),
                            () = aged => {
                                log::debug!("{addr}: connection from {peer} reached its max age: GOAWAY");
                                None
                            }
                            _ = stop.wait_for(|stop| *stop) => None,
                        };
                        let result = match ended {
                            Some(result) => result,
                            None => {
                                conn.as_mut().graceful_shutdown();
                                conn.await
                            }
                        };
                        if let Err(e) = result {
                            log::debug!("{addr}: connection from {peer}: {e}");
                        }
                        open.fetch_sub(1, Ordering::SeqCst);
                        drop(alive);
                    });
                }
                Err(e) => {
                    // E.g. out of file descriptors: wait instead of spinning.
                    log::warn!("{addr}: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let connections = open.load(Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let _ = stop_tx.send(true);
    drop(alive_tx);
    let in_time = tokio::time::timeout(grace, alive_rx.recv()).await.is_ok();
    Ok(Drained {
        connections,
        in_time,
        took: started.elapsed(),
    })
}

/// One backend's HTTP/1.1 answer and Echo service behind one hyper service:
/// a request whose `content-type` starts with `application/grpc` goes to
/// Echo, any other to the HTTP answer.
#[derive(Clone)]
struct DualService {
    name: String,
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
    routes: Routes,
    /// What the connection's TLS peer presented, put in each request.
    client_cert: Option<ClientCertificate>,
}

impl DualService {
    fn new(name: &str, addr: SocketAddr, hits: Arc<AtomicU64>) -> DualService {
        let routes = Routes::new(EchoServer::new(EchoService {
            name: name.to_string(),
            addr,
            served: hits.clone(),
            delay: Duration::ZERO,
            failing: None,
        }));
        DualService {
            name: name.to_string(),
            addr,
            hits,
            routes,
            client_cert: None,
        }
    }

    /// This service for a connection whose peer presented `cert`.
    fn with_client_certificate(mut self, cert: Option<ClientCertificate>) -> DualService {
        self.client_cert = cert;
        self
    }
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for DualService {
    type Response = hyper::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, mut req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        if let Some(cert) = &self.client_cert {
            req.extensions_mut().insert(cert.clone());
        }
        let grpc = req
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let (name, addr, hits, mut routes) = (
            self.name.clone(),
            self.addr,
            self.hits.clone(),
            self.routes.clone(),
        );
        let client_cert = self
            .client_cert
            .as_ref()
            .and_then(|c| crate::tls::fingerprint(&c.0).parse().ok());
        Box::pin(async move {
            if grpc {
                routes.call(req).await
            } else {
                let mut resp = crate::backend::answer(req, name, addr, hits).await?;
                if let Some(v) = client_cert {
                    resp.headers_mut().insert("x-client-cert", v);
                }
                Ok(resp.map(tonic::body::Body::new))
            }
        })
    }
}

struct EchoService {
    name: String,
    addr: SocketAddr,
    served: Arc<AtomicU64>,
    /// Every call is answered after this long.
    delay: Duration,
    /// While set, every call fails UNAVAILABLE.
    failing: Option<Arc<AtomicBool>>,
}

#[tonic::async_trait]
impl Echo for EchoService {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let served = self.served.fetch_add(1, Ordering::SeqCst) + 1;
        let seen = request.metadata().get("cookie").cloned();
        let timeout = request.metadata().get("grpc-timeout").cloned();
        let client_cert = request.extensions().get::<ClientCertificate>().cloned();
        if self
            .failing
            .as_ref()
            .is_some_and(|f| f.load(Ordering::SeqCst))
        {
            return Err(Status::unavailable(format!("{} is failing", self.name)));
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if let Some(ms) = request.get_ref().message.strip_prefix("sleep:") {
            let ms = ms.parse().unwrap_or(0);
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        let mut reply = Response::new(EchoReply {
            message: request.into_inner().message,
            backend: self.name.clone(),
            address: self.addr.to_string(),
            served,
        });
        if let Some(cookie) = seen {
            reply.metadata_mut().insert("x-seen-cookie", cookie);
        }
        if let Some(t) = timeout {
            reply.metadata_mut().insert("x-seen-grpc-timeout", t);
        }
        if let Some(cert) = client_cert {
            if let Ok(v) = crate::tls::fingerprint(&cert.0).parse() {
                reply.metadata_mut().insert("x-client-cert", v);
            }
        }
        Ok(reply)
    }
}
