//! The ADS state-of-the-world server. It serves the latest snapshot; each
//! stream tracks, per type, what the client subscribed to (named resources,
//! or everything for a wildcard LDS/CDS request) and what it last sent, and
//! pushes a new response whenever a new snapshot changes what that client
//! should have: every resource for LDS and CDS (their responses list them
//! all), only the changed ones for RDS and EDS (a client keeps the others,
//! with the version it got them in). The node's `user_agent_name` chooses the flavor: `envoy`
//! gets Envoy's resources (its own when `envoy.nodes` lists its node ID),
//! anything else the proxyless ones. What is published is served without
//! the DRAINING endpoints their service's `drain` removed
//! ([`crate::drain`]); [`ControlPlane::enforce_drains`] removes the ones
//! that come due.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

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

use super::drain::{endpoints_of, leave_out};
use super::load::{DrainStatus, LoadState, Removal};
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
    /// The resources last published, before the removed DRAINING
    /// endpoints were left out, while a service has a `drain` or an
    /// endpoint is kept out (a removal serves them again); held while
    /// publishing.
    full: Arc<Mutex<Option<Translated>>>,
    /// Woken when a removal may have come due sooner.
    drain_wake: Arc<tokio::sync::Notify>,
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
            resources: Translated::default(),
        }));
        let plane = ControlPlane {
            tx: Arc::new(tx),
            records: Arc::new(Mutex::new(Records::default())),
            metrics: Metrics::new(),
            load: Arc::default(),
            streams: Arc::default(),
            full: Arc::default(),
            drain_wake: Arc::default(),
        };
        let served = plane.adopt(&mut plane.full(), resources, Instant::now());
        plane.tx.send_replace(Arc::new(Snapshot {
            version: 1,
            resources: served,
        }));
        plane.track_draining();
        plane
    }

    /// Starts the drain clock of endpoints the snapshot now serves
    /// DRAINING, forgets those it no longer does.
    fn track_draining(&self) {
        let draining = draining_endpoints(&self.snapshot());
        self.load(|l| l.set_draining(draining, Instant::now()));
    }

    /// Runs `f` on the load state (waking the drain timer when a removal
    /// may have come due sooner).
    pub(crate) fn load<T>(&self, f: impl FnOnce(&mut LoadState) -> T) -> T {
        let mut state = self.load.lock().unwrap_or_else(PoisonError::into_inner);
        let out = f(&mut state);
        if state.take_wake() {
            self.drain_wake.notify_one();
        }
        out
    }

    /// Every DRAINING endpoint's drain verdict now, and the endpoints
    /// lately removed by their service's `drain` (`GET /drain`).
    pub fn drain_status(&self) -> DrainStatus {
        self.load(|l| l.status(Instant::now()))
    }

    /// The status page's figures ([`crate::status`]) now.
    pub fn status(&self) -> crate::status::Status {
        let snapshot = self.snapshot();
        self.load(|l| {
            crate::status::status(
                snapshot.version,
                &snapshot.resources,
                &l.status(Instant::now()),
                l.clients(),
                |cluster| l.reports_of(cluster),
            )
        })
    }

    /// Removes from EDS the DRAINING endpoints due for removal at `now`
    /// (see [`crate::drain`]), publishing the ClusterLoadAssignments
    /// without them; logs and counts each. Returns them.
    pub fn enforce_drains(&self, now: Instant) -> Vec<Removal> {
        let mut full = self.full();
        let due = self.load(|l| l.take_due(now));
        if due.is_empty() {
            return due;
        }
        // Policies, hence removals, come with resources kept in `full`.
        let Some(resources) = full.take() else {
            return due;
        };
        let served = self.adopt(&mut full, resources, now);
        let version = self.send(served);
        for r in &due {
            log::info!(
                "service {:?}: DRAINING endpoint {} removed from EDS ({}), serving version {version}",
                r.endpoint.service,
                r.endpoint.address,
                r.reason
            );
            self.metrics.drain_removed(r.reason.label());
        }
        due
    }

    /// The next instant a DRAINING endpoint is due for removal, if nothing
    /// changes.
    pub fn next_drain_deadline(&self) -> Option<Instant> {
        self.load(|l| l.next_deadline())
    }

    /// Notified when a removal may have come due sooner than
    /// [`ControlPlane::next_drain_deadline`] said (a verdict turned idle,
    /// a drain began, a service's `drain` changed).
    pub fn drain_wake(&self) -> Arc<tokio::sync::Notify> {
        self.drain_wake.clone()
    }

    /// What to serve of `resources`, published at `now`: the removed
    /// DRAINING endpoints still DRAINING there left out. `resources` are
    /// kept in `full` while a service has a `drain` or an endpoint is kept
    /// out; else they are served as they are, without a copy.
    fn adopt(
        &self,
        full: &mut Option<Translated>,
        resources: Translated,
        now: Instant,
    ) -> Translated {
        let held_out = self.load(|l| {
            l.set_policies(resources.drain.clone(), now);
            let services = l.drain_services();
            if services.is_empty() {
                return Default::default();
            }
            let endpoints =
                endpoints_of(&resources, &services.iter().map(String::as_str).collect());
            l.keep_removed(&endpoints, now);
            l.held_out()
        });
        if resources.drain.is_empty() && held_out.is_empty() {
            *full = None;
            return resources;
        }
        let served = leave_out(resources.clone(), &held_out);
        *full = Some(resources);
        served
    }

    fn full(&self) -> std::sync::MutexGuard<'_, Option<Translated>> {
        self.full.lock().unwrap_or_else(PoisonError::into_inner)
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
    /// when the resources are the same). DRAINING endpoints removed by
    /// their service's `drain` stay out while they are DRAINING in
    /// `resources`.
    pub fn publish(&self, resources: Translated) -> u64 {
        let mut full = self.full();
        let served = self.adopt(&mut full, resources, Instant::now());
        self.send(served)
    }

    /// Serves `resources` (what [`ControlPlane::adopt`] made); returns
    /// the version.
    fn send(&self, resources: Translated) -> u64 {
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
        self.plane.load(|l| l.release(id, Instant::now()));
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
            self.plane.load(|l| l.hold(id, &node, held, Instant::now()));
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
