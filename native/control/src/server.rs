//! The ADS state-of-the-world server. It serves the latest snapshot; each
//! stream tracks, per type, what the client subscribed to (named resources,
//! or everything for a wildcard LDS/CDS request) and what it last sent, and
//! pushes a new response whenever a new snapshot changes what that client
//! should have: every resource for LDS and CDS (their responses list them
//! all), only the changed ones for RDS and EDS (a client keeps the others,
//! with the version it got them in). The node's `user_agent_name` chooses the flavor: `envoy`
//! gets Envoy's resources (its own when `envoy.nodes` lists its node ID),
//! anything else the proxyless ones.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use envoy_types::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_server::{
        AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
    },
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::load::{DrainStatus, LoadState};
use super::lrs::{draining_endpoints, LrsService};
use super::metrics::{ClientGuard, Metrics};
use super::translate::{Flavor, Translated};
use tether_xds::resource::ResourceKind;

/// A versioned set of resources.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Increases by one with every published change.
    pub version: u64,
    /// The resources for both flavors.
    pub resources: Translated,
}

/// A NACK a client sent, kept for operators and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nack {
    /// The client's node ID.
    pub node_id: String,
    /// The type it rejected.
    pub type_url: String,
    /// The version it still runs.
    pub version: String,
    /// Its error message.
    pub message: String,
}

#[derive(Debug, Default)]
struct Records {
    nacks: Vec<Nack>,
}

/// The control plane's state: the current snapshot, shared by every stream.
#[derive(Clone)]
pub struct ControlPlane {
    tx: Arc<watch::Sender<Arc<Snapshot>>>,
    records: Arc<Mutex<Records>>,
    metrics: Metrics,
    /// Who holds which endpoints, what they report, what drains.
    load: Arc<Mutex<LoadState>>,
    /// Numbers ADS and LRS streams.
    streams: Arc<AtomicU64>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("version", &self.snapshot().version)
            .finish()
    }
}

impl ControlPlane {
    /// A control plane serving `resources` as version 1.
    pub fn new(resources: Translated) -> Self {
        let (tx, _) = watch::channel(Arc::new(Snapshot {
            version: 1,
            resources,
        }));
        let plane = ControlPlane {
            tx: Arc::new(tx),
            records: Arc::new(Mutex::new(Records::default())),
            metrics: Metrics::new(),
            load: Arc::default(),
            streams: Arc::default(),
        };
        plane.track_draining();
        plane
    }

    /// Starts the drain clock of endpoints the snapshot now serves
    /// DRAINING, forgets those it no longer does.
    fn track_draining(&self) {
        let draining = draining_endpoints(&self.snapshot());
        self.load(|l| l.set_draining(draining, std::time::Instant::now()));
    }

    /// Runs `f` on the load state.
    pub(crate) fn load<T>(&self, f: impl FnOnce(&mut LoadState) -> T) -> T {
        f(&mut self.load.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every DRAINING endpoint's drain verdict now (`GET /drain`).
    pub fn drain_status(&self) -> DrainStatus {
        self.load(|l| l.status(std::time::Instant::now()))
    }

    /// A new stream's number.
    pub(crate) fn next_stream_id(&self) -> u64 {
        self.streams.fetch_add(1, Ordering::Relaxed)
    }

    /// The snapshots as they are published.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// The control plane's metrics (what `/metrics` shows).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Publishes new resources; returns the version now served (unchanged
    /// when the resources are the same).
    pub fn publish(&self, resources: Translated) -> u64 {
        let mut version = 0;
        let changed = self.tx.send_if_modified(|cur| {
            if cur.resources == resources {
                version = cur.version;
                return false;
            }
            version = cur.version + 1;
            *cur = Arc::new(Snapshot { version, resources });
            true
        });
        // The same resources drain the same endpoints.
        if changed {
            self.track_draining();
        }
        version
    }

    /// The snapshot being served.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// NACKs received so far.
    pub fn nacks(&self) -> Vec<Nack> {
        self.records
            .lock()
            .map(|r| r.nacks.clone())
            .unwrap_or_default()
    }

    /// The tonic service to add to a server.
    pub fn service(&self) -> AggregatedDiscoveryServiceServer<AdsService> {
        AggregatedDiscoveryServiceServer::new(self.ads_service())
    }

    /// The ADS implementation itself, for a server that wraps it.
    pub fn ads_service(&self) -> AdsService {
        AdsService {
            plane: self.clone(),
        }
    }

    /// Serves ADS on `listener` until `shutdown` completes.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        // No Nagle delay between a push's responses (one per resource type).
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(self.service())
            .add_service(LrsService::new(self.clone()))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// Serves ADS over TLS with `config` (see [`crate::tls::server_config`])
    /// on `listener` until `shutdown` completes.
    pub async fn serve_tls(
        &self,
        listener: tokio::net::TcpListener,
        config: Arc<rustls::ServerConfig>,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        tonic::transport::Server::builder()
            .add_service(self.service())
            .add_service(LrsService::new(self.clone()))
            .serve_with_incoming_shutdown(crate::tls::incoming(listener, config), shutdown)
            .await
    }
}

/// The ADS service implementation.
#[derive(Debug, Clone)]
pub struct AdsService {
    plane: ControlPlane,
}

type ResponseStream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        let stream = AdsStream {
            plane: self.plane.clone(),
            snapshots: self.plane.tx.subscribe(),
            tx,
            flavor: None,
            node_id: String::new(),
            subs: HashMap::new(),
            nonce: 0,
            client: None,
            id: self.plane.next_stream_id(),
        };
        tokio::spawn(stream.run(request.into_inner()));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "tether-control serves the state-of-the-world protocol only",
        ))
    }
}

#[derive(Debug, Default)]
struct Subscription {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What was last sent, to push only real changes.
    sent: Option<BTreeMap<String, Any>>,
}

struct AdsStream {
    plane: ControlPlane,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    flavor: Option<Flavor>,
    node_id: String,
    subs: HashMap<String, Subscription>,
    nonce: u64,
    /// The stream in the metrics, once its node is known.
    client: Option<ClientGuard>,
    /// The stream's number, for the drain status's holders.
    id: u64,
}

impl AdsStream {
    async fn run(mut self, mut inbound: Streaming<DiscoveryRequest>) {
        self.serve(&mut inbound).await;
        let id = self.id;
        self.plane.load(|l| l.release(id));
    }

    async fn serve(&mut self, inbound: &mut Streaming<DiscoveryRequest>) {
        loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        if self.on_request(req).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) | Err(_) => {
                        log::info!("stream of node {:?} ended", self.node_id);
                        return;
                    }
                },
                changed = self.snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let types: Vec<String> = self.subs.keys().cloned().collect();
                    for t in types {
                        if self.respond(&t, false).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }

    async fn on_request(&mut self, req: DiscoveryRequest) -> Result<(), ()> {
        if self.flavor.is_none() {
            let node = req.node.clone().unwrap_or_default();
            self.flavor = Some(if node.user_agent_name == "envoy" {
                Flavor::Envoy
            } else {
                Flavor::Proxyless
            });
            self.node_id = node.id;
            self.client = Some(
                self.plane
                    .metrics
                    .client(&self.node_id, self.flavor == Some(Flavor::Envoy)),
            );
            log::info!(
                "stream from node {:?} ({:?})",
                self.node_id,
                self.flavor.unwrap_or(Flavor::Proxyless)
            );
        }
        if let Some(err) = &req.error_detail {
            let nack = Nack {
                node_id: self.node_id.clone(),
                type_url: req.type_url.clone(),
                version: req.version_info.clone(),
                message: err.message.clone(),
            };
            log::warn!(
                "NACK from node {:?} for {} version {:?}: {}",
                nack.node_id,
                nack.type_url,
                nack.version,
                nack.message
            );
            if let Ok(mut r) = self.plane.records.lock() {
                r.nacks.push(nack);
            }
            if let (Some(client), Some(kind)) =
                (&self.client, ResourceKind::from_type_url(&req.type_url))
            {
                client.nack(kind);
            }
        } else if !req.response_nonce.is_empty() {
            if let (Some(client), Some(kind)) =
                (&self.client, ResourceKind::from_type_url(&req.type_url))
            {
                client.ack(kind, &req.version_info);
            }
        }
        let first = !self.subs.contains_key(&req.type_url);
        let sub = self.subs.entry(req.type_url.clone()).or_default();
        let names: BTreeSet<String> = req.resource_names.iter().cloned().collect();
        // Legacy wildcard: an empty list on the first request, kept by later
        // empty lists (ACKs); an explicit "*" always means everything.
        let wildcard = ((first || sub.wildcard) && names.is_empty()) || names.contains("*");
        let changed = first || wildcard != sub.wildcard || names != sub.names;
        sub.wildcard = wildcard;
        sub.names = names;
        if changed && req.type_url == ResourceKind::Endpoints.type_url() {
            let (id, node, held) = (self.id, self.node_id.clone(), sub.names.clone());
            self.plane.load(|l| l.hold(id, &node, held));
        }
        if changed {
            self.respond(&req.type_url, true).await
        } else {
            Ok(())
        }
    }

    /// Sends what the subscription should hold if it differs from what was
    /// sent (`force`: also when nothing was sent yet for a new subscription).
    async fn respond(&mut self, type_url: &str, force: bool) -> Result<(), ()> {
        let Some(kind) = ResourceKind::from_type_url(type_url) else {
            return Ok(());
        };
        let snapshot = self.snapshots.borrow_and_update().clone();
        let flavor = self.flavor.unwrap_or(Flavor::Proxyless);
        let Some(sub) = self.subs.get_mut(type_url) else {
            return Ok(());
        };
        let all = snapshot
            .resources
            .for_node(flavor, &self.node_id)
            .get(&kind);
        let selected: BTreeMap<String, Any> = match all {
            None => BTreeMap::new(),
            Some(all) if sub.wildcard => all.clone(),
            Some(all) => sub
                .names
                .iter()
                .filter_map(|n| all.get(n).map(|a| (n.clone(), a.clone())))
                .collect(),
        };
        if sub.sent.as_ref() == Some(&selected) && !(force && sub.sent.is_none()) {
            return Ok(());
        }
        // Named RDS/EDS: nothing to say about resources that do not exist.
        if selected.is_empty() && sub.sent.is_none() && !kind.all_in_each_response() {
            return Ok(());
        }
        if selected.is_empty() && !sub.wildcard && sub.names.is_empty() && sub.sent.is_none() {
            return Ok(());
        }
        // RDS and EDS responses need not carry every subscribed resource
        // (clients keep those left out): only the ones that changed go, so
        // a client's unchanged ClusterLoadAssignments keep their version.
        let resources: Vec<Any> = match &sub.sent {
            Some(sent) if !kind.all_in_each_response() => selected
                .iter()
                .filter(|(name, any)| sent.get(*name) != Some(*any))
                .map(|(_, any)| any.clone())
                .collect(),
            _ => selected.values().cloned().collect(),
        };
        let partial = sub.sent.is_some() && !kind.all_in_each_response();
        sub.sent = Some(selected);
        if partial && resources.is_empty() {
            // Only unsubscribed or deleted ones differ: nothing to say.
            return Ok(());
        }
        self.nonce += 1;
        let resp = DiscoveryResponse {
            version_info: snapshot.version.to_string(),
            resources,
            type_url: type_url.to_owned(),
            nonce: self.nonce.to_string(),
            ..Default::default()
        };
        log::info!(
            "push {} version {} ({} resources) to node {:?}",
            kind,
            resp.version_info,
            resp.resources.len(),
            self.node_id
        );
        self.tx.send(Ok(resp)).await.map_err(|_| ())?;
        if let Some(client) = &self.client {
            client.pushed(kind);
        }
        Ok(())
    }
}
