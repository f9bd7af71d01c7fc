//! The subchannels of one channel, shared by address.
//!
//! The pool keeps only weak references: a subchannel lives as long as some
//! LB policy holds a handle, so policies that share an address share its
//! connection, and one that nobody holds is closed and forgotten.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{StateListener, Subchannel, SubchannelId, SubchannelOptions, WeakSubchannel};
use crate::credentials::{ProviderStore, Transport, XdsSecurity};

/// Creates and shares subchannels by address; clones share the pool.
#[derive(Clone)]
pub struct SubchannelPool(Arc<Inner>);

struct Inner {
    options: SubchannelOptions,
    /// The bootstrap's certificate providers, when the channel honours
    /// its clusters' TLS (xDS credentials, gRFC A29).
    providers: Option<ProviderStore>,
    listener: StateListener,
    /// Where tasks go when `get` is called outside a runtime.
    runtime: Option<tokio::runtime::Handle>,
    next_id: AtomicU64,
    live: Mutex<Live>,
    /// Told of the subchannels' connections (gRFC A94's instruments).
    metrics: Option<Arc<dyn super::ConnectionEventsFor>>,
}

/// The weak handles by address (one per xDS security config the address
/// is used with: clusters asking for different TLS do not share a
/// connection), and when next to sweep out the dead ones.
#[derive(Default)]
struct Live {
    map: HashMap<SocketAddr, Vec<(Security, WeakSubchannel)>>,
    /// Sweep once the map reaches this size: each sweep is paid for by as
    /// many insertions, so an update that adds n addresses stays O(n).
    sweep_at: usize,
}

impl SubchannelPool {
    /// An empty pool whose subchannels connect with `options` and report
    /// their state changes to `listener`.
    pub fn new(options: SubchannelOptions, listener: StateListener) -> Self {
        Self::with_providers(options, listener, None)
    }

    /// A pool whose clusters' TLS (gRFC A29) uses `providers`; without,
    /// clusters' TLS is ignored and the channel's own credentials apply.
    pub(crate) fn with_providers(
        options: SubchannelOptions,
        listener: StateListener,
        providers: Option<ProviderStore>,
    ) -> Self {
        SubchannelPool(Arc::new(Inner {
            options,
            providers,
            listener,
            runtime: tokio::runtime::Handle::try_current().ok(),
            next_id: AtomicU64::new(1),
            live: Mutex::new(Live::default()),
            metrics: None,
        }))
    }

    /// The pool with gRFC A94's instruments recorded by its subchannels
    /// (before any subchannel is made).
    pub(crate) fn with_metrics(self, metrics: Option<Arc<dyn super::ConnectionEventsFor>>) -> Self {
        match Arc::try_unwrap(self.0) {
            Ok(mut inner) => {
                inner.metrics = metrics;
                SubchannelPool(Arc::new(inner))
            }
            Err(shared) => SubchannelPool(shared),
        }
    }

    /// The certificate providers for clusters' TLS, if honoured.
    pub(crate) fn providers(&self) -> Option<&ProviderStore> {
        self.0.providers.as_ref()
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        // The map stays consistent whatever panicked while holding it.
        self.0.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live subchannel for `address` (shared: same id while any handle
    /// lives), else a new one in IDLE.
    pub fn get(&self, address: SocketAddr) -> Subchannel {
        self.get_secured(address, &None)
    }

    /// [`SubchannelPool::get`] for a cluster whose connections use
    /// `security` (gRFC A29), else the channel's own credentials.
    pub(crate) fn get_secured(&self, address: SocketAddr, security: &Security) -> Subchannel {
        self.get_labelled(address, security, None, None)
    }

    /// [`SubchannelPool::get_secured`] from the LB subtree of
    /// `backend_service` and `locality`, which a new subchannel's A94
    /// instruments are labelled with (an existing one keeps its maker's).
    pub(crate) fn get_labelled(
        &self,
        address: SocketAddr,
        security: &Security,
        backend_service: Option<&Arc<str>>,
        locality: Option<&Arc<str>>,
    ) -> Subchannel {
        let mut live = self.live();
        if let Some(subchannel) = find(&live, address, security) {
            return subchannel;
        }
        if live.map.len() >= live.sweep_at {
            live.map.retain(|_, entries| {
                entries.retain(|(_, weak)| !weak.is_dead());
                !entries.is_empty()
            });
            live.sweep_at = (live.map.len() * 2).max(64);
        }
        let id = SubchannelId(self.0.next_id.fetch_add(1, Ordering::Relaxed));
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.0.runtime.clone());
        let transport = match (security, &self.0.options.tls) {
            (Some(s), _) => Transport::Xds(s.clone()),
            (None, Some(tls)) => Transport::Tls(tls.clone()),
            (None, None) => Transport::Plain,
        };
        let subchannel = Subchannel::new(
            id,
            address,
            &self.0.options,
            self.0.listener.clone(),
            runtime.as_ref(),
            transport,
            self.0
                .metrics
                .as_ref()
                .map(|m| m.for_subchannel(backend_service, locality)),
        );
        log::debug!("subchannel {address}: created as {id}");
        let entries = live.map.entry(address).or_default();
        entries.retain(|(s, weak)| !weak.is_dead() && !same(s, security));
        entries.push((security.clone(), subchannel.downgrade()));
        subchannel
    }

    /// The live subchannel for `address`, if any (never creates one).
    pub fn peek(&self, address: SocketAddr) -> Option<Subchannel> {
        self.peek_secured(address, &None)
    }

    /// [`SubchannelPool::peek`] with `security`.
    pub(crate) fn peek_secured(
        &self,
        address: SocketAddr,
        security: &Security,
    ) -> Option<Subchannel> {
        find(&self.live(), address, security)
    }

    /// Whether a subchannel for `address` is alive (with any security).
    pub(crate) fn has_live(&self, address: SocketAddr) -> bool {
        self.live()
            .map
            .get(&address)
            .is_some_and(|entries| entries.iter().any(|(_, weak)| !weak.is_dead()))
    }

    /// Every live subchannel, sorted by address.
    pub fn subchannels(&self) -> Vec<Subchannel> {
        let mut all: Vec<Subchannel> = {
            let mut live = self.live();
            live.map.retain(|_, entries| {
                entries.retain(|(_, weak)| !weak.is_dead());
                !entries.is_empty()
            });
            live.map
                .values()
                .flatten()
                .filter_map(|(_, weak)| weak.upgrade())
                .collect()
        };
        all.sort_by_key(Subchannel::address);
        all
    }
}

/// The xDS security config a subchannel's cluster asked for, if any.
pub(crate) type Security = Option<Arc<XdsSecurity>>;

fn same(a: &Security, b: &Security) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || **a == **b,
        _ => false,
    }
}

fn find(live: &Live, address: SocketAddr, security: &Security) -> Option<Subchannel> {
    live.map
        .get(&address)?
        .iter()
        .find(|(s, _)| same(s, security))
        .and_then(|(_, weak)| weak.upgrade())
}

impl fmt::Debug for SubchannelPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubchannelPool")
            .field("options", &self.0.options)
            .field("subchannels", &self.subchannels())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subchannel::tests::{next, recorder, settings_server, WAIT};
    use crate::subchannel::ConnectivityState;
    use std::time::Duration;

    #[tokio::test]
    async fn shares_by_address_and_forgets_dropped_subchannels() {
        let (addr, mut closed) = settings_server().await;
        let (listener, mut events) = recorder();
        let pool = SubchannelPool::new(SubchannelOptions::default(), listener);
        let a = pool.get(addr);
        let b = pool.clone().get(addr);
        assert_eq!(a.id(), b.id());
        assert_eq!(a, b);
        assert_eq!(pool.subchannels(), vec![a.clone()]);

        b.request_connection();
        for want in [ConnectivityState::Connecting, ConnectivityState::Ready] {
            let (id, state, _) = next(&mut events).await;
            assert_eq!((id, state), (a.id(), want));
        }
        assert_eq!(a.state(), ConnectivityState::Ready);
        assert!(a.connection().is_some());

        let old = a.id();
        drop(a);
        // One handle still holds it: still shared, still connected.
        assert_eq!(pool.get(addr).id(), old);
        assert_eq!(b.state(), ConnectivityState::Ready);
        drop(b);
        tokio::time::timeout(WAIT, closed.recv())
            .await
            .expect("connection not closed with the last handle")
            .expect("server gone");
        assert!(pool.subchannels().is_empty());

        let again = pool.get(addr);
        assert_ne!(again.id(), old);
        assert_eq!(again.state(), ConnectivityState::Idle);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(events.try_recv().is_err(), "the old task is gone");
    }

    #[tokio::test]
    async fn lists_live_subchannels_by_address() {
        let (listener, _events) = recorder();
        let pool = SubchannelPool::new(SubchannelOptions::default(), listener);
        let addrs: Vec<SocketAddr> = ["127.0.0.1:9003", "127.0.0.1:9001", "127.0.0.1:9002"]
            .iter()
            .map(|a| a.parse().expect("addr"))
            .collect();
        let held: Vec<Subchannel> = addrs.iter().map(|a| pool.get(*a)).collect();
        let listed: Vec<SocketAddr> = pool.subchannels().iter().map(Subchannel::address).collect();
        let mut sorted = addrs.clone();
        sorted.sort();
        assert_eq!(listed, sorted);
        let ids: std::collections::HashSet<SubchannelId> =
            held.iter().map(Subchannel::id).collect();
        assert_eq!(ids.len(), 3);
        drop(held);
        assert!(pool.subchannels().is_empty());
        assert!(format!("{pool:?}").contains("SubchannelPool"));
    }

    #[test]
    fn outside_a_runtime_get_does_not_panic() {
        let (listener, _events) = recorder();
        let pool = SubchannelPool::new(SubchannelOptions::default(), listener);
        let sc = pool.get("127.0.0.1:9".parse().expect("addr"));
        sc.request_connection();
        assert_eq!(sc.state(), ConnectivityState::Idle);
    }
}
