//! The xDS resolver: follows the listener's graph through the XdsClient and
//! hands the LB task a new [`ChannelConfig`] whenever the graph is complete
//! and differs from the last one, or the reason there is none.
//!
//! gRFC A57: a resource error (does-not-exist, or an error before any
//! resource) fails calls with the XdsClient's message; an ambient error
//! beside a cached resource is logged and changes nothing, so a NACKed
//! update keeps the previous config serving.

use tokio::sync::{broadcast, mpsc};

use crate::channel::config::{self, ChannelConfig};
use crate::channel::work_serializer::Control;
use crate::xds::graph::Graph;
use crate::xds::XdsClient;

/// Runs until the channel is gone or the client stops.
pub(crate) async fn run(
    client: XdsClient,
    target: String,
    control: mpsc::UnboundedSender<Control>,
) {
    let mut events = client.events();
    let mut graph = Graph::new(client.clone(), target.clone());
    let mut last: Option<Result<ChannelConfig, String>> = None;
    let mut reported_errors: Vec<String> = Vec::new();
    loop {
        let walk = graph.walk();
        for e in &walk.errors {
            if !reported_errors.contains(e) {
                // The XdsClient has warned already; this ties it to the channel.
                log::debug!("{target}: xDS: {e}");
            }
        }
        reported_errors = walk.errors.clone();
        if let Some(result) = config::from_walk(&walk, &client) {
            if last.as_ref() != Some(&result) {
                if let Ok(c) = &result {
                    log::info!(
                        "{target}: xDS config: virtual host {}, clusters {}",
                        c.virtual_host.name,
                        c.clusters
                            .keys()
                            .map(|k| k.as_ref())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                if control
                    .send(Control::Resolved(result.clone().map(Box::new)))
                    .is_err()
                {
                    return;
                }
                last = Some(result);
            }
        }
        tokio::select! {
            r = events.recv() => match r {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = control.closed() => return,
        }
    }
}
