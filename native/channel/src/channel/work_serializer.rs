//! The channel's one LB task (gRPC's "work serializer"): every change to
//! the LB tree runs here, one event at a time — resolver updates,
//! subchannel states, timers, clusters calls stopped using — and each
//! change publishes a new immutable snapshot (config selector + picker)
//! that calls read without a lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;

use super::config::ChannelConfig;
use super::config_selector::ConfigSelector;
use super::{ChannelStats, ClusterRef};
use crate::lb::cluster_manager::{self, ClusterManager};
use crate::lb::{cds, ConnectivityState, Ctx, Event, LbConfig, LbPolicy, SharedPicker};
use crate::session::notes::CookieNotes;
use crate::session::SessionOptions;
use crate::subchannel::SubchannelPool;
use crate::xds::resource::listener::HttpFilter;
use crate::xds::resource::route::VirtualHost;

/// Events the LB task handles before it publishes; a control message
/// (a new config) waits at most this many.
const EVENT_BATCH: usize = 256;

/// Where the channel's routing stands.
#[derive(Debug, Clone)]
pub(crate) enum Routing {
    /// No resolver result yet: calls wait.
    Waiting,
    /// Routes are known.
    Ready(Arc<ConfigSelector>),
    /// The resolver failed (no listener, no routes, no virtual host):
    /// calls fail with this, `wait_for_ready` calls wait.
    Failed(Status),
}

/// What calls read: the routes and the root picker, swapped as one.
pub(crate) struct Snapshot {
    pub routing: Routing,
    pub picker: SharedPicker,
    pub state: ConnectivityState,
}

/// The snapshot and a counter that moves on every new one (queued calls
/// wait on it).
pub(crate) struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub generation: watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn new() -> Self {
        Shared {
            snapshot: ArcSwap::from_pointee(Snapshot {
                routing: Routing::Waiting,
                picker: crate::lb::queue_picker(),
                state: ConnectivityState::Idle,
            }),
            generation: watch::channel(0).0,
        }
    }
}

/// Requests to the LB task from outside the tree.
pub(crate) enum Control {
    /// A resolver result: a config, or the reason there is none.
    Resolved(Result<Box<ChannelConfig>, String>),
    /// The last handle of a cluster was dropped.
    ClusterUnused(Arc<str>),
    /// Report the tree.
    Stats(oneshot::Sender<ChannelStats>),
    /// Session cookies' keys rotated ([`crate::Channel::set_session_keys`]).
    SessionKeys(tether_core::KeyRing),
}

pub(crate) struct WorkSerializer {
    pub target: String,
    pub pool: SubchannelPool,
    pub lb_tx: mpsc::UnboundedSender<Event>,
    pub control_tx: mpsc::WeakUnboundedSender<Control>,
    pub shared: Arc<Shared>,
    session_options: SessionOptions,
    cookie_notes: Arc<CookieNotes>,
    root: ClusterManager,
    next_timer: u64,
    routing: Routing,
    /// The last config of every cluster still in use.
    clusters: BTreeMap<Arc<str>, cds::Config>,
    live: HashMap<Arc<str>, Weak<ClusterRef>>,
    /// What the route table was last made from, made again when the
    /// session keys rotate.
    routes: Option<RouteInputs>,
    last_state: Option<ConnectivityState>,
    /// What the LB policies record, when the channel has a telemetry.
    lb_metrics: Option<Arc<crate::telemetry::LbMetrics>>,
}

/// The parts of a resolver result the route table is made from.
struct RouteInputs {
    virtual_host: VirtualHost,
    max_stream_duration: Option<Duration>,
    handles: HashMap<String, Arc<ClusterRef>>,
    http_filters: Vec<HttpFilter>,
}

impl WorkSerializer {
    pub(crate) fn new(
        target: String,
        pool: SubchannelPool,
        lb_tx: mpsc::UnboundedSender<Event>,
        control_tx: mpsc::WeakUnboundedSender<Control>,
        shared: Arc<Shared>,
        session_options: SessionOptions,
        lb_metrics: Option<Arc<crate::telemetry::LbMetrics>>,
    ) -> Self {
        log::debug!(
            "{target}: session cookies it writes: {}",
            tether_core::cookie::readers::explain(session_options.format, false)
        );
        WorkSerializer {
            lb_metrics,
            session_options,
            cookie_notes: Arc::default(),
            target,
            pool,
            lb_tx,
            control_tx,
            shared,
            root: ClusterManager::new(),
            next_timer: 0,
            routing: Routing::Waiting,
            clusters: BTreeMap::new(),
            live: HashMap::new(),
            routes: None,
            last_state: None,
        }
    }

    /// Handles events until every sender is gone.
    pub(crate) async fn run(
        mut self,
        mut lb_rx: mpsc::UnboundedReceiver<Event>,
        mut control_rx: mpsc::UnboundedReceiver<Control>,
    ) {
        loop {
            tokio::select! {
                biased;
                c = control_rx.recv() => match c {
                    Some(c) => self.control(c),
                    None => return,
                },
                e = lb_rx.recv() => match e {
                    Some(e) => self.lb_events(e, &mut lb_rx),
                    None => return,
                },
            }
        }
    }

    fn ctx_parts(&mut self) -> (Ctx<'_>, &mut ClusterManager) {
        let ctx = Ctx::new(&self.pool, &self.lb_tx, &mut self.next_timer, &self.target)
            .with_metrics(self.lb_metrics.as_deref());
        (ctx, &mut self.root)
    }

    /// Handles `first` and the events queued behind it (at most
    /// [`EVENT_BATCH`]), then publishes once: when 100,000 subchannels
    /// change state at once, the picker is remade per batch, not per event.
    fn lb_events(&mut self, first: Event, rx: &mut mpsc::UnboundedReceiver<Event>) {
        let (mut ctx, root) = self.ctx_parts();
        let mut changed = root.event(&mut ctx, &first);
        for _ in 1..EVENT_BATCH {
            let Ok(e) = rx.try_recv() else {
                break;
            };
            changed |= root.event(&mut ctx, &e);
        }
        if changed {
            self.publish();
        }
    }

    fn control(&mut self, c: Control) {
        match c {
            Control::Resolved(Ok(config)) => self.apply(*config),
            Control::SessionKeys(keys) => {
                log::info!(
                    "{}: session keys rotated ({} keys)",
                    self.target,
                    keys.len()
                );
                self.session_options.keys = keys;
                if matches!(self.routing, Routing::Ready(_)) {
                    self.route();
                    self.publish();
                }
            }
            Control::Resolved(Err(message)) => {
                log::warn!("{}: resolution failed: {message}", self.target);
                self.routing = Routing::Failed(Status::unavailable(message));
                self.publish();
            }
            Control::ClusterUnused(name) => {
                if self.live.get(&name).is_some_and(|w| w.upgrade().is_none()) {
                    log::debug!("{}: cluster {name} no longer used", self.target);
                    self.live.remove(&name);
                    self.clusters.remove(&name);
                    self.update_root();
                    self.publish();
                }
            }
            Control::Stats(reply) => {
                let _ = reply.send(ChannelStats {
                    target: self.target.clone(),
                    state: self.root.state(),
                    routing: match &self.routing {
                        Routing::Waiting => "waiting for the resolver".to_owned(),
                        Routing::Ready(s) => format!("virtual host {}", s.virtual_host().name),
                        Routing::Failed(s) => format!("failed: {}", s.message()),
                    },
                    tree: self.root.stats(),
                    session_cookies_envoy_misreads: self.cookie_notes.misreads(),
                });
            }
        }
    }

    /// A new resolver result: handles for its clusters, the tree updated,
    /// then the new routes published with the new picker.
    fn apply(&mut self, config: ChannelConfig) {
        let Some(control) = self.control_tx.upgrade() else {
            return;
        };
        let mut handles = HashMap::new();
        for (name, cluster) in &config.clusters {
            let handle = match self.live.get(name).and_then(Weak::upgrade) {
                Some(h) => h,
                None => {
                    let h = Arc::new(ClusterRef {
                        name: name.clone(),
                        control: control.downgrade(),
                    });
                    self.live.insert(name.clone(), Arc::downgrade(&h));
                    h
                }
            };
            handles.insert(name.to_string(), handle);
            self.clusters.insert(name.clone(), cluster.clone());
        }
        // Clusters neither named nor in use by a call go now.
        let live = &self.live;
        self.clusters.retain(|n, _| {
            config.clusters.contains_key(n) || live.get(n).is_some_and(|w| w.strong_count() > 0)
        });
        self.live.retain(|_, w| w.strong_count() > 0);
        self.update_root();
        self.routes = Some(RouteInputs {
            virtual_host: config.virtual_host,
            max_stream_duration: config.max_stream_duration,
            handles,
            http_filters: config.http_filters,
        });
        self.route();
        self.publish();
    }

    /// The route table from the last resolver result and the session
    /// options.
    fn route(&mut self) {
        let Some(r) = &self.routes else {
            return;
        };
        self.routing = match ConfigSelector::new(
            r.virtual_host.clone(),
            r.max_stream_duration,
            r.handles.clone(),
            &r.http_filters,
            &self.session_options,
        ) {
            Ok(selector) => Routing::Ready(Arc::new(
                selector.with_notes(self.target.clone(), self.cookie_notes.clone()),
            )),
            Err(message) => {
                log::warn!("{}: {message}", self.target);
                Routing::Failed(Status::unavailable(message))
            }
        };
    }

    fn update_root(&mut self) {
        let config = cluster_manager::Config {
            clusters: self
                .clusters
                .iter()
                .map(|(n, c)| (n.clone(), LbConfig::Cds(c.clone())))
                .collect(),
        };
        let (mut ctx, root) = self.ctx_parts();
        root.update(&mut ctx, LbConfig::ClusterManager(config));
    }

    fn publish(&mut self) {
        let state = self.root.state();
        if self.last_state != Some(state) {
            log::info!("{}: channel is {state}", self.target);
            self.last_state = Some(state);
        } else {
            log::debug!("{}: new picker ({state})", self.target);
        }
        self.shared.snapshot.store(Arc::new(Snapshot {
            routing: self.routing.clone(),
            picker: self.root.picker(),
            state,
        }));
        self.shared.generation.send_modify(|g| *g += 1);
    }
}
