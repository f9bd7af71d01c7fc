//! The client's task: it owns the ADS stream, the connection, the backoff
//! sleep and the resource timer, feeds what happens to the protocol state
//! machine ([`super::state::Ads`]) and carries out what it answers
//! (requests on the stream, states into the watchers' registry). The
//! stream is connected once the server answered the call's headers.

use std::sync::Weak;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient, DiscoveryRequest,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

use super::state::{Action, Ads, Subscriptions};
use super::{Cmd, Key, Shared};
use crate::resource::ResourceKind;

pub(super) struct Actor {
    pub shared: Weak<Shared>,
    pub cmd_rx: mpsc::UnboundedReceiver<Cmd>,
    pub channel: Channel,
    pub server_uri: String,
    /// Call credentials for each stream (gRFC A97).
    pub call_creds: Vec<crate::call_creds::JwtTokenFile>,
    /// The channel to the server is TLS (call credentials may be sent).
    pub secure: bool,
    /// The protocol.
    pub ads: Ads,
}

/// The watchers' registry as the state machine reads it.
struct Registered<'a>(&'a Shared);

impl Subscriptions for Registered<'_> {
    fn names(&mut self, kind: ResourceKind) -> Vec<String> {
        self.0.lock().names(kind)
    }

    fn held(&mut self) -> Vec<Key> {
        self.0.lock().entries.keys().cloned().collect()
    }
}

/// Carries out the state machine's actions: requests go on `stream` (if
/// there is one), states into the registry, with an event when they
/// notify.
fn perform(
    shared: &Shared,
    stream: Option<&mpsc::UnboundedSender<DiscoveryRequest>>,
    actions: Vec<Action>,
) {
    for action in actions {
        match action {
            Action::Send(req) => {
                if let Some(tx) = stream {
                    let _ = tx.send(*req);
                }
            }
            Action::Publish { key, state, notify } => {
                let reg = shared.lock();
                let Some(e) = reg.entries.get(&key) else {
                    continue;
                };
                e.tx.send_if_modified(|s| {
                    *s = *state;
                    notify
                });
                if notify {
                    let _ = shared.events.send(key);
                }
            }
        }
    }
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

impl Actor {
    pub async fn run(mut self) {
        loop {
            // `None`: the client was dropped.
            let Some(status) = self.run_stream().await else {
                return;
            };
            let Some(shared) = self.shared.upgrade() else {
                return;
            };
            let closed = self.ads.on_stream_closed(
                &mut Registered(&shared),
                effective_code(&status),
                &status_message(&status),
            );
            perform(&shared, None, closed.actions);
            drop(shared);
            if let Some(delay) = closed.retry_after {
                if self.idle(delay).await.is_none() {
                    return;
                }
            }
        }
    }

    /// Waits `delay` while keeping the registry's commands drained.
    async fn idle(&mut self, delay: Duration) -> Option<()> {
        let until = Instant::now() + delay;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return Some(()),
                cmd = self.cmd_rx.recv() => self.on_cmd(cmd, None)?,
            }
        }
    }

    /// A watcher command; `None` when the client is gone.
    fn on_cmd(
        &mut self,
        cmd: Option<Cmd>,
        stream: Option<&mpsc::UnboundedSender<DiscoveryRequest>>,
    ) -> Option<()> {
        let Cmd::Changed(kind) = cmd?;
        let shared = self.shared.upgrade()?;
        let actions = self
            .ads
            .on_watchers_changed(&mut Registered(&shared), kind, now());
        perform(&shared, stream, actions);
        Some(())
    }

    /// One stream, until it ends (its status) or the client is dropped
    /// (`None`).
    async fn run_stream(&mut self) -> Option<tonic::Status> {
        let shared = self.shared.upgrade()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let actions = self.ads.stream_started(&mut Registered(&shared));
        perform(&shared, Some(&tx), actions);
        drop(shared);
        log::debug!("xDS server {}: starting an ADS stream", self.server_uri);
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        if let Err(status) = self.authorize(request.metadata_mut()) {
            return Some(status);
        }
        let mut client = AggregatedDiscoveryServiceClient::new(self.channel.clone());
        let call = client.stream_aggregated_resources(request);
        tokio::pin!(call);
        let mut inbound = loop {
            tokio::select! {
                r = &mut call => match r {
                    Ok(resp) => break resp.into_inner(),
                    Err(status) => return Some(status),
                },
                cmd = self.cmd_rx.recv() => self.on_cmd(cmd, Some(&tx))?,
            }
        };
        log::info!("xDS server {}: ADS stream open", self.server_uri);
        let shared = self.shared.upgrade()?;
        self.ads.stream_connected(&mut Registered(&shared), now());
        drop(shared);
        loop {
            let next = self.ads.next_deadline().map(Instant::from_std);
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(resp)) => {
                        let shared = self.shared.upgrade()?;
                        let actions = self.ads.on_response(
                            &mut Registered(&shared),
                            resp,
                            SystemTime::now(),
                        );
                        perform(&shared, Some(&tx), actions);
                    }
                    Ok(None) => {
                        return Some(tonic::Status::unavailable("ADS stream closed by the server"))
                    }
                    Err(status) => return Some(status),
                },
                cmd = self.cmd_rx.recv() => self.on_cmd(cmd, Some(&tx))?,
                _ = sleep_until_opt(next), if next.is_some() => {
                    let shared = self.shared.upgrade()?;
                    let actions = self.ads.on_timer(now());
                    perform(&shared, Some(&tx), actions);
                }
            }
        }
    }

    /// Adds the call credentials' headers to a new stream's metadata.
    fn authorize(&self, metadata: &mut tonic::metadata::MetadataMap) -> Result<(), tonic::Status> {
        crate::call_creds::authorize(&self.call_creds, self.secure, metadata)
    }
}

/// gRPC reports a transport failure under a call as UNAVAILABLE. tonic calls
/// a connection lost mid-stream UNKNOWN, and one closed before the request
/// went out (a server dying with its socket still open) CANCELLED; both
/// carry the transport error as their source. A status the server sent
/// itself has no source and keeps its code.
fn effective_code(status: &tonic::Status) -> tonic::Code {
    use std::error::Error as _;
    let Some(source) = status.source() else {
        return status.code();
    };
    match status.code() {
        tonic::Code::Unknown => tonic::Code::Unavailable,
        tonic::Code::Cancelled if closed_under_the_call(source) => tonic::Code::Unavailable,
        code => code,
    }
}

/// Whether hyper dropped the call because its connection closed.
fn closed_under_the_call(err: &(dyn std::error::Error + 'static)) -> bool {
    error_chain(err).any(|e| {
        e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
    })
}

/// The status message, with the transport's reason when tonic's message
/// leaves it out ("operation was canceled" says nothing of why).
fn status_message(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut message = status.message().to_owned();
    for e in status.source().into_iter().flat_map(error_chain) {
        let text = e.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message = format!("{message}: {text}");
        }
    }
    message
}

/// `err` and its sources, outermost first.
fn error_chain<'e>(
    err: &'e (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'e (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| e.source())
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
