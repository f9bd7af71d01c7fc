//! The process's XdsClients: the ones [`XdsClient::shared`] and
//! [`XdsClient::for_target`] hand out again, and every one
//! [`XdsClient::all`] lists (what CSDS reports).

use std::sync::{Arc, Mutex, MutexGuard};

use envoy_types::pb::envoy::config::core::v3::Node;

use super::{ClientOptions, Shared, Stopper, XdsClient};
use crate::bootstrap::Bootstrap;

/// What a pooled client is found again by: the bootstrap, the options and
/// the target (`None`: the process's).
pub(super) type PoolKey = (Bootstrap, ClientOptions, Option<String>);

/// One XdsClient of the process, as [`XdsClient::shared`] finds it again
/// and [`XdsClient::all`] lists it: held weakly, so that the stream still
/// stops when the last user drops its client.
struct Pooled {
    /// Only clients made by [`XdsClient::shared`] or
    /// [`XdsClient::for_target`] are handed out again: the key is the
    /// bootstrap, the options and the target (`None`: the process's).
    key: Option<PoolKey>,
    scope: Arc<str>,
    shared: std::sync::Weak<Shared>,
    stopper: std::sync::Weak<Stopper>,
    server_uri: Arc<str>,
    node_id: Arc<str>,
    node: Arc<Node>,
    certificate_providers:
        Arc<std::collections::BTreeMap<String, crate::bootstrap::CertificateProvider>>,
    load: std::sync::Weak<super::LoadReporting>,
    stats: Arc<super::stats::ClientStats>,
}

impl Pooled {
    /// The client, if a user still holds it and its task still runs (a
    /// client of a runtime that was shut down has stopped).
    fn client(&self) -> Option<XdsClient> {
        let stopper = self.stopper.upgrade()?;
        if stopper.0.is_finished() {
            return None;
        }
        Some(XdsClient {
            shared: self.shared.upgrade()?,
            server_uri: self.server_uri.clone(),
            node_id: self.node_id.clone(),
            node: self.node.clone(),
            scope: self.scope.clone(),
            certificate_providers: self.certificate_providers.clone(),
            load: self.load.upgrade()?,
            stats: self.stats.clone(),
            _stopper: stopper,
        })
    }
}

/// Every XdsClient of the process.
static POOL: Mutex<Vec<Pooled>> = Mutex::new(Vec::new());

/// The pool, without the clients that stopped.
fn pool() -> MutexGuard<'static, Vec<Pooled>> {
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    pool.retain(|p| p.client().is_some());
    pool
}

/// The running client for `key`, if there is one.
pub(super) fn find(key: &PoolKey) -> Option<XdsClient> {
    let pool = pool();
    let found = pool.iter().find(|p| p.key.as_ref() == Some(key));
    found.and_then(Pooled::client)
}

/// Every client still in use, in the order they started.
pub(super) fn all() -> Vec<XdsClient> {
    let pool = pool();
    pool.iter().filter_map(Pooled::client).collect()
}

/// Adds a new client, to be found again by `key` if it has one.
pub(super) fn add(key: Option<PoolKey>, client: &XdsClient) {
    let mut pool = pool();
    pool.push(Pooled {
        key,
        shared: Arc::downgrade(&client.shared),
        stopper: Arc::downgrade(&client._stopper),
        server_uri: client.server_uri.clone(),
        node_id: client.node_id.clone(),
        node: client.node.clone(),
        scope: client.scope.clone(),
        certificate_providers: client.certificate_providers.clone(),
        load: Arc::downgrade(&client.load),
        stats: client.stats.clone(),
    });
}
