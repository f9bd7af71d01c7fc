//! What policy unit tests that run timers share: a policy over a real
//! subchannel pool whose state changes come back to it as events, as on the
//! LB task, and addresses that refuse connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Ctx, EndpointAddresses, Event, HealthStatus, LbPolicy};
use crate::subchannel::{SubchannelOptions, SubchannelPool};

/// `s` as a socket address (tests' literals).
pub(crate) fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A healthy endpoint of weight 1 with `addresses` in order.
pub(crate) fn endpoint(addresses: &[&str]) -> EndpointAddresses {
    EndpointAddresses {
        addresses: addresses.iter().map(|a| addr(a)).collect(),
        weight: 1,
        health: HealthStatus::Healthy,
    }
}

/// An address nothing listens on (bound, then closed): connections to it
/// are refused at once.
pub(crate) fn refused() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// `policy` with a pool whose subchannel state changes, and the timers the
/// policy starts, arrive on `rx`.
pub(crate) struct Harness<P> {
    pub pool: SubchannelPool,
    pub tx: mpsc::UnboundedSender<Event>,
    pub rx: mpsc::UnboundedReceiver<Event>,
    pub next_timer: u64,
    pub policy: P,
}

impl<P: LbPolicy> Harness<P> {
    pub fn new(policy: P) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let listener_tx = tx.clone();
        let pool = SubchannelPool::new(
            SubchannelOptions::default(),
            Arc::new(move |id, addr, state| {
                let _ = listener_tx.send(Event::Subchannel(id, addr, state));
            }),
        );
        Harness {
            pool,
            tx,
            rx,
            next_timer: 0,
            policy,
        }
    }

    /// Runs `f` on the policy with its context.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut P, &mut Ctx<'_>) -> R) -> R {
        let mut ctx = Ctx::new(&self.pool, &self.tx, &mut self.next_timer, "test");
        f(&mut self.policy, &mut ctx)
    }

    /// Feeds events to the policy until one of its timers fires; returns
    /// when.
    pub async fn next_timer(&mut self) -> Instant {
        for _ in 0..10_000 {
            let e = tokio::time::timeout(Duration::from_secs(3600), self.rx.recv())
                .await
                .expect("an event within an hour")
                .expect("the channel is open");
            self.with(|p, ctx| p.event(ctx, &e));
            if matches!(e, Event::Timer(_)) {
                return Instant::now();
            }
        }
        panic!("no timer within 10,000 events");
    }
}

/// A custom policy that counts the updates it is given (READY, with a
/// queueing picker), for tests of parents that should not update it.
pub(crate) struct CountingBuilder(pub Arc<std::sync::atomic::AtomicUsize>);

struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl super::LbPolicy for Counting {
    fn update(&mut self, _: &mut Ctx<'_>, _: super::LbConfig) -> bool {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        true
    }
    fn event(&mut self, _: &mut Ctx<'_>, _: &super::Event) -> bool {
        false
    }
    fn state(&self) -> super::ConnectivityState {
        super::ConnectivityState::Ready
    }
    fn picker(&self) -> super::SharedPicker {
        super::queue_picker()
    }
    fn stats(&self) -> super::PolicyStats {
        super::PolicyStats {
            policy: "test.counting",
            name: None,
            state: self.state(),
            facts: Vec::new(),
            endpoints: Vec::new(),
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}

impl super::PolicyBuilder for CountingBuilder {
    fn name(&self) -> &'static str {
        "test.counting"
    }
    fn parse_config(&self, _: &serde_json::Value) -> Result<super::ParsedConfig, String> {
        Ok(Arc::new(()))
    }
    fn build(&self) -> Box<dyn super::LbPolicy> {
        Box::new(Counting(self.0.clone()))
    }
}
