//! The Client Status Discovery Service (gRFC A40): what every XdsClient of
//! this process holds, as `envoy.service.status.v3` reports it, for a user
//! to add to their own gRPC server beside their services (as grpcio's
//! `grpc_csds` and grpc-go's `admin` do), so that an operator can ask a
//! live client what it holds (`tether xds dump --csds ADDR`, grpcdebug,
//! `istioctl x internal-debug`).
//!
//! ```no_run
//! # async fn serve(listener: tokio::net::TcpListener) -> Result<(), tonic::transport::Error> {
//! tonic::transport::Server::builder()
//!     .add_service(tether_xds::csds::service())
//!     // .add_service(your services...)
//!     .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
//!     .await
//! # }
//! ```
//!
//! Each client is one `ClientConfig`: the node it presents, and one
//! `GenericXdsConfig` per resource it watches: its type URL and name, the
//! version and resource last ACKed (as the server sent it) and when, the
//! status (`REQUESTED`, `ACKED`, `NACKED`, `DOES_NOT_EXIST`), and for the
//! last update that failed, until one is accepted, the `error_state`: when,
//! the response's version, the rejected resource and why (a NACK's reason,
//! or `does not exist` for a resource the server removed, as C-core says).

use std::pin::Pin;
use std::time::SystemTime;

use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_server::{
    ClientStatusDiscoveryService, ClientStatusDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::status::v3::{
    ClientConfig, ClientStatusRequest, ClientStatusResponse,
};
use envoy_types::pb::google::protobuf::Timestamp;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::client::{ResourceState, ResourceStatus, XdsClient};

/// The CSDS service over every XdsClient of the process.
pub fn service() -> ClientStatusDiscoveryServiceServer<Csds> {
    ClientStatusDiscoveryServiceServer::new(Csds)
}

/// The CSDS implementation (see [`service`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Csds;

/// What the process's XdsClients hold now.
pub fn client_status() -> ClientStatusResponse {
    ClientStatusResponse {
        config: XdsClient::all().iter().map(client_config).collect(),
    }
}

/// One client's node and resources.
pub fn client_config(client: &XdsClient) -> ClientConfig {
    ClientConfig {
        node: Some(client.node().clone()),
        generic_xds_configs: client
            .resources()
            .into_iter()
            .map(|(kind, name, state)| GenericXdsConfig {
                type_url: kind.type_url().to_owned(),
                name,
                version_info: state.resource_version.clone().unwrap_or_default(),
                xds_config: state.raw.as_deref().cloned(),
                last_updated: state.updated.map(timestamp),
                client_status: status(&state) as i32,
                error_state: error_state(&state),
                ..Default::default()
            })
            .collect(),
        client_scope: client.client_scope().to_owned(),
        ..Default::default()
    }
}

fn status(state: &ResourceState) -> ClientResourceStatus {
    match state.status {
        ResourceStatus::Requested => ClientResourceStatus::Requested,
        ResourceStatus::Acked { .. } => ClientResourceStatus::Acked,
        ResourceStatus::Nacked { .. } => ClientResourceStatus::Nacked,
        ResourceStatus::DoesNotExist => ClientResourceStatus::DoesNotExist,
        ResourceStatus::Timeout => ClientResourceStatus::Timeout,
        ResourceStatus::ReceivedError { .. } => ClientResourceStatus::ReceivedError,
    }
}

fn error_state(state: &ResourceState) -> Option<UpdateFailureState> {
    let r = state.rejected.as_ref()?;
    Some(UpdateFailureState {
        failed_configuration: r.raw.as_deref().cloned(),
        last_update_attempt: Some(timestamp(r.at)),
        details: r.details.clone(),
        version_info: r.version.clone(),
    })
}

fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<ClientStatusResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ClientStatusDiscoveryService for Csds {
    type StreamClientStatusStream = ResponseStream;

    /// One response per request on the stream.
    async fn stream_client_status(
        &self,
        request: Request<Streaming<ClientStatusRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let requests = request.into_inner();
        let responses = requests.map(|r| r.map(|_| client_status()));
        Ok(Response::new(Box::pin(responses)))
    }

    async fn fetch_client_status(
        &self,
        _request: Request<ClientStatusRequest>,
    ) -> Result<Response<ClientStatusResponse>, Status> {
        Ok(Response::new(client_status()))
    }
}
