//! The ADS protocol of one stream to one server as a plain state machine
//! (sans I/O, as rustls is): it takes events (a stream started, connected,
//! a response, the stream closed, a timer due, the watchers changed) and
//! returns actions (requests to send, resource states to publish). Time is
//! an input; nothing here reads a clock, touches a socket or sleeps. The
//! actor ([`super::actor`]) moves the bytes and runs the timers.
//!
//! It keeps, per type, the last ACKed version, the stream's nonce and the
//! names last requested; per resource, its [`ResourceState`] (a copy of
//! what watchers see) and its does-not-exist deadline; gRFC A57's
//! connectivity error and backoff; and gRFC A88's switches.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;

use super::{ClientOptions, Key, Rejection, ResourceState, ResourceStatus};
use crate::backoff::Backoff;
use crate::bootstrap::{Bootstrap, XdsServer};
use crate::error::{code_name, XdsError};
use crate::resource::{self, Resource, ResourceKind, ValidationError, ValidationOptions};

/// What the state machine asks of the I/O around it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Action {
    /// Send this request on the current stream.
    Send(Box<DiscoveryRequest>),
    /// The resource's state is now `state`; its watchers are woken (and a
    /// change event sent) only when `notify`.
    Publish {
        /// Which resource.
        key: Key,
        /// Its whole new state.
        state: Box<ResourceState>,
        /// Whether watchers see it as a change.
        notify: bool,
    },
}

/// What the watchers subscribe to: the registry they share with the
/// client, read when the state machine needs it.
pub(super) trait Subscriptions {
    /// The names of `kind` to request, for a request about to go out: the
    /// names no watcher holds any more are forgotten here, as the request
    /// unsubscribes them (until then a new watcher finds the resource
    /// still cached, which the server would not send again).
    fn names(&mut self, kind: ResourceKind) -> Vec<String>;
    /// Every resource the registry holds, those about to be unsubscribed
    /// included.
    fn held(&mut self) -> Vec<Key>;
}

/// The server's and the options' switches the protocol follows.
#[derive(Debug, Clone)]
pub(super) struct Config {
    /// The server, as in the bootstrap (for errors and logs).
    pub server_uri: String,
    /// The node the first request presents.
    pub node: Node,
    /// An LDS/CDS resource left out of a response drops the cached one.
    pub drop_on_deletion: bool,
    /// A NACKed update drops the cached resource (A88's
    /// fail_on_data_errors).
    pub drop_on_nack: bool,
    /// The resource timer reports a transient error (A88's
    /// resource_timer_is_transient_error).
    pub timer_is_transient: bool,
    /// A88 is on: the response's `resource_errors` are read.
    pub read_resource_errors: bool,
    /// The server has `fail_on_data_errors`.
    pub fail_on_data_errors: bool,
    /// The does-not-exist timeout.
    pub dne_timeout: Duration,
    /// What validation accepts.
    pub validation: ValidationOptions,
}

impl Config {
    /// The switches for the bootstrap's `server` with `options`, A88 as
    /// C-core runs it.
    pub fn new(bootstrap: &Bootstrap, server: &XdsServer, options: &ClientOptions) -> Self {
        let a88 = options.data_error_handling;
        let mut validation = options.validation.clone();
        validation.certificate_providers =
            bootstrap.certificate_providers.keys().cloned().collect();
        Config {
            server_uri: server.server_uri.clone(),
            node: bootstrap.node.clone(),
            // C-core: with A88 a deletion drops the cached resource only
            // with fail_on_data_errors; without, unless ignore_resource_deletion.
            drop_on_deletion: if a88 {
                server.fail_on_data_errors()
            } else {
                !server.ignore_resource_deletion()
            },
            drop_on_nack: a88 && server.fail_on_data_errors(),
            // A88: the timer of a server with resource_timer_is_transient_error
            // reports a transient error. (A88's text lengthens it to 30 s;
            // grpcio 1.85 keeps 15 s, and so does this client.)
            timer_is_transient: a88 && server.resource_timer_is_transient_error(),
            // C-core reads resource_errors only with A88 on.
            read_resource_errors: a88,
            fail_on_data_errors: server.fail_on_data_errors(),
            dne_timeout: options.does_not_exist_timeout,
            validation,
        }
    }
}

#[derive(Debug, Default)]
struct TypeState {
    /// Last ACKed version (kept across streams).
    version: String,
    /// Last nonce on the current stream.
    nonce: String,
    /// Names last sent on the current stream, to skip redundant requests.
    sent: Option<Vec<String>>,
}

#[derive(Debug, Default)]
struct StreamState {
    /// The server accepted the stream (answered its headers).
    connected: bool,
    /// The node went out in a request.
    sent_node: bool,
    /// A response came on it.
    got_response: bool,
}

/// How a stream ended, for the actor.
#[derive(Debug)]
pub(super) struct Closed {
    /// What to do now.
    pub actions: Vec<Action>,
    /// `None`: start the next stream at once; else after this backoff.
    pub retry_after: Option<Duration>,
}

/// The protocol state of the client's ADS stream.
#[derive(Debug)]
pub(super) struct Ads {
    config: Config,
    types: HashMap<ResourceKind, TypeState>,
    /// Every resource the watchers' registry holds, with its state.
    resources: BTreeMap<Key, ResourceState>,
    deadlines: HashMap<Key, Instant>,
    backoff: Backoff,
    /// The connectivity error of the last failed stream, until a response.
    channel_error: Option<XdsError>,
    /// The current stream; `None` between streams.
    stream: Option<StreamState>,
    /// gRFC A78's figures (counted here, read by the client's metrics).
    stats: Arc<super::stats::ClientStats>,
}

impl Ads {
    pub fn new(config: Config, backoff: Backoff) -> Self {
        Ads {
            config,
            types: HashMap::new(),
            resources: BTreeMap::new(),
            deadlines: HashMap::new(),
            backoff,
            channel_error: None,
            stream: None,
            stats: Arc::default(),
        }
    }

    /// Counts into `stats` (shared with the client's metrics).
    pub fn with_stats(mut self, stats: Arc<super::stats::ClientStats>) -> Self {
        self.stats = stats;
        self
    }

    /// The earliest resource timer, to wake [`Ads::on_timer`].
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.values().min().copied()
    }

    /// A new stream starts: the nonces and sent names are forgotten, and a
    /// request goes out for every type with subscribed names, with the last
    /// ACKed version (the first one carrying the node).
    pub fn stream_started(&mut self, subs: &mut dyn Subscriptions) -> Vec<Action> {
        self.stream = Some(StreamState::default());
        for ts in self.types.values_mut() {
            ts.nonce.clear();
            ts.sent = None;
        }
        let mut actions = Vec::new();
        for kind in ResourceKind::ALL {
            let names = self.names(subs, kind);
            if !names.is_empty() {
                actions.push(self.request(kind, names));
            }
        }
        actions
    }

    /// The server accepted the stream: the does-not-exist timers start for
    /// every uncached resource.
    pub fn stream_connected(&mut self, subs: &mut dyn Subscriptions, now: Instant) {
        if let Some(stream) = &mut self.stream {
            stream.connected = true;
        }
        self.track(subs);
        self.deadlines.clear();
        self.arm_timers(None, now);
    }

    /// The set of names of `kind` changed (a first watcher came or a last
    /// one left): on a stream, a request when the names differ from the
    /// last sent (and timers when the stream is connected); new resources
    /// get the connectivity error of the last failed stream, if any.
    pub fn on_watchers_changed(
        &mut self,
        subs: &mut dyn Subscriptions,
        kind: ResourceKind,
        now: Instant,
    ) -> Vec<Action> {
        let Some(connected) = self.stream.as_ref().map(|s| s.connected) else {
            // Between streams: nothing goes out; the next stream asks.
            self.track(subs);
            return self.note_new_entries(kind);
        };
        let names = self.names(subs, kind);
        let ts = self.types.entry(kind).or_default();
        if ts.sent.as_ref() == Some(&names) || (ts.sent.is_none() && names.is_empty()) {
            return Vec::new();
        }
        let mut actions = vec![self.request(kind, names)];
        if connected {
            self.arm_timers(Some(kind), now);
        }
        actions.extend(self.note_new_entries(kind));
        actions
    }

    /// The stream ended (`code` and `message` as gRPC reports them). After
    /// a response it is no error and the next stream starts at once (A57);
    /// before any, every watcher gets the connectivity error and the next
    /// attempt waits the backoff.
    pub fn on_stream_closed(
        &mut self,
        subs: &mut dyn Subscriptions,
        code: tonic::Code,
        message: &str,
    ) -> Closed {
        let got_response = self.stream.take().is_some_and(|s| s.got_response);
        // Timers restart on the next stream for what is still uncached.
        self.deadlines.clear();
        if got_response {
            log::info!(
                "xDS server {}: ADS stream ended ({}: {message}); reconnecting",
                self.config.server_uri,
                code_name(code),
            );
            // Not an error (A57): restart at once; backoff was reset.
            return Closed {
                actions: Vec::new(),
                retry_after: None,
            };
        }
        self.stats.failed();
        let err = XdsError::Connectivity {
            server_uri: self.config.server_uri.clone(),
            node_id: self.config.node.id.clone(),
            code: code_name(code).to_owned(),
            message: message.to_owned(),
        };
        self.channel_error = Some(err.clone());
        self.track(subs);
        let mut actions = Vec::new();
        for (key, s) in &mut self.resources {
            s.error = Some(err.clone());
            actions.push(publish(key, s, true));
        }
        let delay = self.backoff.next_delay();
        // Milliseconds: the jitter's nanoseconds are noise.
        let shown = Duration::from_millis(delay.as_millis() as u64);
        log::warn!(
            "{err}; retrying in {}",
            tether_core::duration::display(shown)
        );
        Closed {
            actions,
            retry_after: Some(delay),
        }
    }

    /// The resource timers due by `now` fire: an uncached resource does
    /// not exist (or, with A88's resource_timer_is_transient_error, timed
    /// out).
    pub fn on_timer(&mut self, now: Instant) -> Vec<Action> {
        let due: Vec<Key> = self
            .deadlines
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut actions = Vec::new();
        for key in due {
            self.deadlines.remove(&key);
            let Some(s) = self.resources.get_mut(&key) else {
                continue;
            };
            if s.resource.is_some() {
                continue;
            }
            // A88: with resource_timer_is_transient_error the timer
            // reports a transient error, not a missing resource.
            let (status, err) = if self.config.timer_is_transient {
                (
                    ResourceStatus::Timeout,
                    XdsError::Timeout {
                        kind: key.0,
                        name: key.1.clone(),
                        server_uri: self.config.server_uri.clone(),
                        node_id: self.config.node.id.clone(),
                    },
                )
            } else {
                (
                    ResourceStatus::DoesNotExist,
                    XdsError::DoesNotExist {
                        kind: key.0,
                        name: key.1.clone(),
                        node_id: self.config.node.id.clone(),
                    },
                )
            };
            log::warn!(
                "xDS: {err}: not sent within {}",
                tether_core::duration::display(self.config.dne_timeout)
            );
            s.status = status;
            s.error = Some(err);
            actions.push(publish(&key, s, true));
        }
        actions
    }

    /// A response came (`wall` is when, for CSDS): each resource is
    /// validated and the cache updated, and the response is ACKed or
    /// NACKed.
    pub fn on_response(
        &mut self,
        subs: &mut dyn Subscriptions,
        resp: DiscoveryResponse,
        wall: SystemTime,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(stream) = &mut self.stream {
            if !stream.got_response {
                stream.got_response = true;
                self.stats.responded();
                self.backoff.reset();
                actions.extend(self.clear_channel_error(subs));
            }
        }
        let Some(kind) = ResourceKind::from_type_url(&resp.type_url) else {
            // Not a type this client asked for: NACK it so the server knows.
            log::warn!(
                "xDS: NACK of version {:?}: unknown resource type {:?}",
                resp.version_info,
                resp.type_url
            );
            actions.push(Action::Send(Box::new(DiscoveryRequest {
                type_url: resp.type_url.clone(),
                response_nonce: resp.nonce.clone(),
                error_detail: Some(RpcStatus {
                    code: tonic::Code::InvalidArgument as i32,
                    message: format!("unknown resource type {:?}", resp.type_url),
                    details: Vec::new(),
                }),
                ..Default::default()
            })));
            return actions;
        };
        self.track(subs);
        let decoded = Decoded::new(kind, &resp, &self.config);
        self.stats
            .updates(kind, decoded.valid.len(), decoded.invalid.len());
        let version = resp.version_info.clone();
        for (_, e) in &decoded.invalid {
            log::warn!("xDS: NACK of version {version:?}: {e}");
        }
        // Valid resources this client subscribes to (C-core's count).
        let mut num_valid = 0;
        for ((k, name), s) in self.resources.iter_mut() {
            if *k != kind {
                continue;
            }
            let valid = decoded.valid.get(name);
            num_valid += usize::from(valid.is_some());
            let key = (*k, name.clone());
            let update = Update {
                kind,
                name,
                version: &version,
                wall,
                config: &self.config,
            };
            let notify = if let Some((code, message)) = decoded.reported.get(name) {
                // Applied after the resource itself (C-core reads
                // resource_errors last); it counts as seen, so a
                // state-of-the-world response does not delete it.
                self.deadlines.remove(&key);
                update.received_error(s, valid, *code, message);
                true
            } else if let Some((r, any)) = valid {
                self.deadlines.remove(&key);
                update.accepted(s, r, any)
            } else if let Some(err) = decoded.error_for(name) {
                self.deadlines.remove(&key);
                update.rejected(s, err, decoded.raw_invalid.get(name).copied());
                true
            } else if kind.all_in_each_response() && update.removed(s) {
                true
            } else {
                continue;
            };
            actions.push(publish(&key, s, notify));
        }
        let answer = self.answer(subs, kind, &resp, num_valid > 0, &decoded.invalid);
        actions.push(answer);
        actions
    }

    /// The ACK, or the NACK with every error, of a response of `kind`.
    /// `any_valid`: some resource watched in it was valid.
    fn answer(
        &mut self,
        subs: &mut dyn Subscriptions,
        kind: ResourceKind,
        resp: &DiscoveryResponse,
        any_valid: bool,
        invalid: &[(Option<String>, ValidationError)],
    ) -> Action {
        let names = self.names(subs, kind);
        let ts = self.types.entry(kind).or_default();
        ts.nonce = resp.nonce.clone();
        // C-core takes the response's version when any resource in it was
        // valid, so even its NACK of a partly valid response carries it.
        if any_valid || invalid.is_empty() {
            ts.version = resp.version_info.clone();
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
        let answer = Action::Send(Box::new(DiscoveryRequest {
            version_info: ts.version.clone(),
            node: None,
            resource_names: names.clone(),
            type_url: kind.type_url().to_owned(),
            response_nonce: ts.nonce.clone(),
            error_detail,
            ..Default::default()
        }));
        ts.sent = Some(names);
        answer
    }

    /// The names of `kind` to request now, the cache following the
    /// registry (what it forgot is forgotten here too).
    fn names(&mut self, subs: &mut dyn Subscriptions, kind: ResourceKind) -> Vec<String> {
        let names = subs.names(kind);
        let keep: HashSet<&str> = names.iter().map(String::as_str).collect();
        self.resources
            .retain(|(k, n), _| *k != kind || keep.contains(n.as_str()));
        for n in &names {
            self.resources
                .entry((kind, n.clone()))
                .or_insert_with(ResourceState::requested);
        }
        names
    }

    /// Learns the resources new watchers added to the registry (each as a
    /// fresh, requested state, as the registry made it).
    fn track(&mut self, subs: &mut dyn Subscriptions) {
        for key in subs.held() {
            self.resources
                .entry(key)
                .or_insert_with(ResourceState::requested);
        }
    }

    fn request(&mut self, kind: ResourceKind, names: Vec<String>) -> Action {
        let ts = self.types.entry(kind).or_default();
        let sent_node = self.stream.as_ref().is_some_and(|s| s.sent_node);
        let req = DiscoveryRequest {
            version_info: ts.version.clone(),
            node: (!sent_node).then(|| self.config.node.clone()),
            resource_names: names.clone(),
            type_url: kind.type_url().to_owned(),
            response_nonce: ts.nonce.clone(),
            ..Default::default()
        };
        ts.sent = Some(names);
        if let Some(stream) = &mut self.stream {
            stream.sent_node = true;
        }
        Action::Send(Box::new(req))
    }

    /// Starts does-not-exist timers for uncached, subscribed resources
    /// without one (only on a connected stream).
    fn arm_timers(&mut self, kind: Option<ResourceKind>, now: Instant) {
        let deadline = now + self.config.dne_timeout;
        for (key, s) in &self.resources {
            if kind.is_some_and(|k| k != key.0) {
                continue;
            }
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
        self.deadlines.retain(|k, _| self.resources.contains_key(k));
    }

    /// New entries get the current channel error (as gRPC tells new watchers).
    fn note_new_entries(&mut self, kind: ResourceKind) -> Vec<Action> {
        let Some(err) = &self.channel_error else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        for (key, s) in &mut self.resources {
            if key.0 == kind && s.status == ResourceStatus::Requested && s.error.is_none() {
                s.error = Some(err.clone());
                actions.push(publish(key, s, true));
            }
        }
        actions
    }

    fn clear_channel_error(&mut self, subs: &mut dyn Subscriptions) -> Vec<Action> {
        if self.channel_error.take().is_none() {
            return Vec::new();
        }
        self.track(subs);
        let mut actions = Vec::new();
        for (key, s) in &mut self.resources {
            if matches!(s.error, Some(XdsError::Connectivity { .. })) {
                s.error = None;
                actions.push(publish(key, s, true));
            }
        }
        actions
    }
}

fn publish(key: &Key, state: &ResourceState, notify: bool) -> Action {
    Action::Publish {
        key: key.clone(),
        state: Box::new(state.clone()),
        notify,
    }
}

/// One resource of one response, to apply to its state.
struct Update<'a> {
    kind: ResourceKind,
    name: &'a str,
    /// The response's version.
    version: &'a str,
    wall: SystemTime,
    config: &'a Config,
}

impl Update<'_> {
    /// The server reports an error for it (xRFC TP3, read with A88): the
    /// state is that error, the cached resource kept beside it unless the
    /// server has fail_on_data_errors and the code says it is gone.
    fn received_error(
        &self,
        s: &mut ResourceState,
        valid: Option<&(Resource, &Any)>,
        code: tonic::Code,
        message: &str,
    ) {
        let (kind, name, version) = (self.kind, self.name, self.version);
        if let Some((r, any)) = valid {
            s.resource = Some(r.clone());
            s.resource_version = Some(version.to_owned());
            s.raw = Some(Arc::new((*any).clone()));
            s.updated = Some(self.wall);
        }
        // fail_on_data_errors drops the cached resource for the two codes
        // that say it is gone.
        let drop_cached = self.config.fail_on_data_errors
            && matches!(code, tonic::Code::NotFound | tonic::Code::PermissionDenied);
        s.fail(self.rejection(message.to_owned(), None), drop_cached);
        s.status = ResourceStatus::ReceivedError {
            version: version.to_owned(),
            code,
            message: message.to_owned(),
        };
        s.error = Some(XdsError::ReceivedError {
            kind,
            name: name.to_owned(),
            code,
            message: message.to_owned(),
            node_id: self.config.node.id.clone(),
        });
        log::warn!(
            "xDS: the server reports {kind} {name:?} in version {version:?}: {}: {message}{}",
            code_name(code),
            if drop_cached {
                "; the cached resource is dropped"
            } else {
                ""
            }
        );
    }

    /// It is valid: ACKed. Whether watchers see a change.
    fn accepted(&self, s: &mut ResourceState, r: &Resource, any: &Any) -> bool {
        let (kind, name, version) = (self.kind, self.name, self.version);
        let notify = s.resource.as_ref() != Some(r)
            || s.error.is_some()
            || matches!(
                s.status,
                ResourceStatus::Requested
                    | ResourceStatus::DoesNotExist
                    | ResourceStatus::Nacked { .. }
            );
        s.resource = Some(r.clone());
        s.resource_version = Some(version.to_owned());
        s.status = ResourceStatus::Acked {
            version: version.to_owned(),
        };
        s.error = None;
        if s.raw.as_deref() != Some(any) {
            s.raw = Some(Arc::new(any.clone()));
            s.updated = Some(self.wall);
        }
        s.rejected = None;
        if notify {
            log::info!("xDS: ACK {kind} {name:?} version {version:?}");
        }
        notify
    }

    /// It is invalid: NACKed, the cached resource kept (dropped with A88's
    /// fail_on_data_errors).
    fn rejected(&self, s: &mut ResourceState, err: &ValidationError, raw: Option<&Any>) {
        let rejection = self.rejection(err.to_string(), raw.map(|a| Arc::new(a.clone())));
        s.fail(rejection, self.config.drop_on_nack);
        s.status = ResourceStatus::Nacked {
            version: self.version.to_owned(),
            error: err.clone(),
        };
        s.error = Some(XdsError::Nacked {
            version: self.version.to_owned(),
            error: err.clone(),
        });
    }

    /// Left out of a state-of-the-world LDS/CDS response: deleted. C-core
    /// marks it does-not-exist and drops the cached resource unless told
    /// to keep it (ignore_resource_deletion; with A88, unless
    /// fail_on_data_errors), then an ambient error. Whether that changed
    /// anything (not for an uncached one, nor for a kept one told before).
    fn removed(&self, s: &mut ResourceState) -> bool {
        let (kind, name, version) = (self.kind, self.name, self.version);
        let drop_cached = self.config.drop_on_deletion;
        if s.resource.is_none() || (!drop_cached && s.status == ResourceStatus::DoesNotExist) {
            return false;
        }
        s.fail(self.rejection("does not exist".into(), None), drop_cached);
        s.status = ResourceStatus::DoesNotExist;
        s.error = Some(XdsError::DoesNotExist {
            kind,
            name: name.to_owned(),
            node_id: self.config.node.id.clone(),
        });
        log::warn!(
            "xDS: {kind} {name:?} does not exist: the server removed it in version {version:?}{}",
            if drop_cached {
                ""
            } else {
                "; the cached resource is kept"
            }
        );
        true
    }

    fn rejection(&self, details: String, raw: Option<Arc<Any>>) -> Rejection {
        Rejection {
            at: self.wall,
            version: self.version.to_owned(),
            details,
            raw,
        }
    }
}

/// One response's resources, validated.
struct Decoded<'a> {
    valid: HashMap<String, (Resource, &'a Any)>,
    /// The invalid ones (by name when it could be read), and malformed
    /// `resource_errors` entries (without).
    invalid: Vec<(Option<String>, ValidationError)>,
    raw_invalid: HashMap<String, &'a Any>,
    /// Errors the server reports per resource (xRFC TP3), read with A88.
    reported: HashMap<String, (tonic::Code, String)>,
}

impl<'a> Decoded<'a> {
    /// Why the resource `name` is invalid, if it is.
    fn error_for(&self, name: &str) -> Option<&ValidationError> {
        self.invalid
            .iter()
            .find(|(n, _)| n.as_deref() == Some(name))
            .map(|(_, e)| e)
    }

    fn new(kind: ResourceKind, resp: &'a DiscoveryResponse, config: &Config) -> Self {
        let mut valid: HashMap<String, (Resource, &Any)> = HashMap::new();
        let mut invalid: Vec<(Option<String>, ValidationError)> = Vec::new();
        let mut raw_invalid: HashMap<String, &Any> = HashMap::new();
        let mut seen = HashSet::new();
        for any in &resp.resources {
            let decoded = resource::decode_with(kind, any, config.validation.clone());
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
        if config.read_resource_errors {
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
        Decoded {
            valid,
            invalid,
            raw_invalid,
            reported,
        }
    }
}

#[cfg(test)]
mod tests;
