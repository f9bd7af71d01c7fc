//! gRPC backends that say who they are: tonic servers of the demo service
//! `tether.demo.v1.Echo`, whose reply carries the backend's name, address
//! and how many calls it has served.
//!
//! Each reply also returns the call's `cookie` metadata in the response
//! metadata `x-seen-cookie`, so a test can see what a proxy forwarded. A
//! message `sleep:MS` is answered after MS milliseconds (a call in flight).
//! [`crate::backend::Backend::stop`] closes the listener and every open
//! connection, as a crashed backend would.

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tether_proto::demo::v1::echo_server::{Echo, EchoServer};
pub use tether_proto::demo::v1::{EchoReply, EchoRequest};

use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::backend::{accept_loop, Backend};
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
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind gRPC backend");
        let addr = listener.local_addr().expect("gRPC backend addr");
        let served = Arc::new(AtomicU64::new(0));
        let routes = Routes::new(EchoServer::new(EchoService {
            name: name.to_string(),
            addr,
            served: served.clone(),
        }));
        let task = accept_loop(listener, move |stream| {
            let _ = stream.set_nodelay(true);
            let svc = TowerToHyperService::new(routes.clone());
            async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .http2_only()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            }
        });
        Backend::new(name, addr, served, task)
    }
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
        let addr = listener.local_addr().expect("backend addr");
        let hits = Arc::new(AtomicU64::new(0));
        let routes = Routes::new(EchoServer::new(EchoService {
            name: name.to_string(),
            addr,
            served: hits.clone(),
        }));
        let (n, h) = (name.to_string(), hits.clone());
        let task = accept_loop(listener, move |stream| {
            let _ = stream.set_nodelay(true);
            let (n, h, routes) = (n.clone(), h.clone(), routes.clone());
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let grpc = req
                        .headers()
                        .get("content-type")
                        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                    let (n, h, mut routes) = (n.clone(), h.clone(), routes.clone());
                    async move {
                        if grpc {
                            routes.call(req).await
                        } else {
                            let resp = crate::backend::answer(req, n, addr, h).await?;
                            Ok(resp.map(tonic::body::Body::new))
                        }
                    }
                });
            async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            }
        });
        Backend::new(name, addr, hits, task)
    }
}

struct EchoService {
    name: String,
    addr: SocketAddr,
    served: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl Echo for EchoService {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let served = self.served.fetch_add(1, Ordering::SeqCst) + 1;
        let seen = request.metadata().get("cookie").cloned();
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
        Ok(reply)
    }
}
