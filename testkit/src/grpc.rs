//! gRPC backends that say who they are: tonic servers of the demo service
//! `tether.demo.v1.Echo`, whose reply carries the backend's name, address
//! and how many calls it has served.
//!
//! Each reply also returns the call's `cookie` metadata in the response
//! metadata `x-seen-cookie`, so a test can see what a proxy forwarded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tether_proto::demo::v1::echo_server::{Echo, EchoServer};
pub use tether_proto::demo::v1::{EchoReply, EchoRequest};
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::backend::Backend;
pub use tether_proto::demo::v1::echo_client::EchoClient;

/// The demo service `tether.demo.v1.Echo` over gRPC.
pub enum Grpc {}

/// A running gRPC backend; [`Backend::stop`] stops accepting connections.
pub type GrpcBackend = Backend<Grpc>;

impl Backend<Grpc> {
    /// Starts a backend called `name` on a random 127.0.0.1 port.
    pub async fn start(name: &str) -> GrpcBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind gRPC backend");
        let addr = listener.local_addr().expect("gRPC backend addr");
        let served = Arc::new(AtomicU64::new(0));
        let svc = EchoService {
            name: name.to_string(),
            addr,
            served: served.clone(),
        };
        let incoming = TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ = Server::builder()
                .serve_with_incoming(EchoServer::new(svc), incoming)
                .await;
        });
        Backend::new(name, addr, served, task)
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
