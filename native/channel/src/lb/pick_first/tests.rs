//! pick_first fed fake subchannel states on a paused clock. The subchannels
//! are made before the runtime starts, so they have no task: nothing
//! connects, a request stays visible ([`Subchannel::connection_requested`]),
//! and the states a test sends are the only ones the policy sees.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::*;
use crate::lb::ConnectivityState::{Connecting, Idle, Ready, TransientFailure};
use crate::lb::{CallAttributes, PickArgs, PickResult, SubchannelPool};
use crate::subchannel::SubchannelOptions;

const A: &str = "10.0.0.1:80";
const B: &str = "10.0.0.2:80";
const C: &str = "10.0.0.3:80";
const D: &str = "10.0.0.4:80";
const V6A: &str = "[fd00::1]:80";
const V6B: &str = "[fd00::2]:80";

use crate::lb::test_harness::{addr, endpoint};

struct Harness {
    pool: SubchannelPool,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    next_timer: u64,
    policy: PickFirst,
    /// Keeps the task-less subchannels alive for the policy to share.
    _held: Vec<Subchannel>,
}

impl Harness {
    /// Must run outside a runtime, so that the subchannels get no task.
    fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let pool = SubchannelPool::new(SubchannelOptions::default(), Arc::new(|_, _, _| {}));
        let held = [A, B, C, D, V6A, V6B]
            .iter()
            .map(|a| pool.get(addr(a)))
            .collect();
        Harness {
            pool,
            tx,
            rx,
            next_timer: 0,
            policy: PickFirst::new(),
            _held: held,
        }
    }

    fn update(&mut self, endpoints: Vec<EndpointAddresses>, shuffle: bool) -> bool {
        let mut ctx = Ctx::new(&self.pool, &self.tx, &mut self.next_timer, "test");
        self.policy
            .update(&mut ctx, LbConfig::PickFirst(Config { endpoints, shuffle }))
    }

    /// The subchannel of `a` reports `state`.
    fn set(&mut self, a: &str, state: ConnectivityState) -> bool {
        let address = addr(a);
        let id = self.pool.peek(address).expect("a subchannel").id();
        let mut ctx = Ctx::new(&self.pool, &self.tx, &mut self.next_timer, "test");
        self.policy
            .event(&mut ctx, &Event::Subchannel(id, address, state))
    }

    /// Whether the policy asked `a` to connect (and the test did not yet
    /// report CONNECTING for it).
    fn requested(&self, a: &str) -> bool {
        self.pool
            .peek(addr(a))
            .is_some_and(|s| s.connection_requested())
    }

    /// `a` takes up the request: it reports CONNECTING.
    fn connecting(&mut self, a: &str) {
        let taken = self
            .pool
            .peek(addr(a))
            .is_some_and(|s| s.take_connection_request());
        assert!(taken, "{a} was not asked to connect");
        self.set(a, Connecting);
    }

    /// Lets `delay` pass on the paused clock and feeds the timers that fired.
    async fn elapse(&mut self, delay: Duration) {
        tokio::time::sleep(delay).await;
        // The timers' tasks send once they run.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            let Ok(e) = self.rx.try_recv() else { break };
            let mut ctx = Ctx::new(&self.pool, &self.tx, &mut self.next_timer, "test");
            self.policy.event(&mut ctx, &e);
        }
    }

    fn selected(&self) -> Option<SocketAddr> {
        self.policy
            .list
            .as_ref()
            .and_then(|l| l.selected())
            .map(Subchannel::address)
    }

    fn pick(&self) -> PickResult {
        let headers = http::HeaderMap::new();
        let attributes = CallAttributes::default();
        self.policy.picker().pick(&PickArgs {
            path: "/test.Echo/Echo",
            headers: &headers,
            attributes: &attributes,
        })
    }
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Runs `test` on a paused clock with a fresh harness.
fn run<F: std::future::Future<Output = ()>>(test: impl FnOnce(Harness) -> F) {
    let h = Harness::new();
    paused().block_on(test(h));
}

#[test]
fn the_next_address_starts_after_the_connection_attempt_delay() {
    run(|mut h| async move {
        h.update(vec![endpoint(&[A, B, C])], false);
        assert!(h.requested(A));
        assert!(!h.requested(B));
        h.connecting(A);
        assert_eq!(h.policy.state(), Connecting);
        assert!(matches!(h.pick(), PickResult::Queue));

        h.elapse(Duration::from_millis(249)).await;
        assert!(!h.requested(B), "B starts before the delay");
        h.elapse(Duration::from_millis(1)).await;
        assert!(h.requested(B), "B starts at the delay, A still going");
        h.connecting(B);

        // B wins: chosen, the later timer cancelled, A's outcome ignored.
        assert!(h.set(B, Ready));
        assert_eq!(h.policy.state(), Ready);
        assert_eq!(h.selected(), Some(addr(B)));
        match h.pick() {
            PickResult::Complete(p) => assert_eq!(p.subchannel.address(), addr(B)),
            other => panic!("expected a pick of B, got {other:?}"),
        }
        h.elapse(Duration::from_secs(1)).await;
        assert!(!h.requested(C), "C starts after a winner");
        assert!(!h.set(A, Ready));
        assert_eq!(h.selected(), Some(addr(B)));
    });
}

#[test]
fn a_failure_starts_the_next_address_at_once() {
    run(|mut h| async move {
        h.update(vec![endpoint(&[A]), endpoint(&[B]), endpoint(&[C])], false);
        h.connecting(A);
        h.set(A, TransientFailure);
        assert!(h.requested(B), "B does not wait for the delay");
        assert_eq!(h.policy.state(), Connecting);
        // The cancelled timer of A does not start C.
        h.connecting(B);
        h.elapse(Duration::from_millis(100)).await;
        assert!(!h.requested(C));
        h.elapse(Duration::from_millis(150)).await;
        assert!(h.requested(C), "B's own delay starts C");
    });
}

#[test]
fn the_pass_fails_only_when_every_attempt_failed_then_sticks() {
    run(|mut h| async move {
        h.update(vec![endpoint(&[A, B])], false);
        h.connecting(A);
        h.elapse(Duration::from_millis(250)).await;
        h.connecting(B);
        h.set(B, TransientFailure);
        assert_eq!(h.policy.state(), Connecting, "A is still trying");
        h.set(A, TransientFailure);
        assert_eq!(h.policy.state(), TransientFailure);
        assert!(matches!(h.pick(), PickResult::Fail(_)));

        // Sticky: each address retries as its backoff ends, and the list
        // stays TRANSIENT_FAILURE while they connect again.
        h.set(A, Idle);
        assert!(h.requested(A), "A retries after its backoff");
        h.connecting(A);
        assert_eq!(h.policy.state(), TransientFailure);
        h.set(B, Idle);
        assert!(h.requested(B));
        h.connecting(B);
        h.set(B, Ready);
        assert_eq!(h.policy.state(), Ready);
        assert_eq!(h.selected(), Some(addr(B)));
    });
}

#[test]
fn families_interleave_from_the_first_address() {
    fn order(list: &[&'static str]) -> Vec<&'static str> {
        let addresses: Vec<SocketAddr> = list.iter().map(|a| addr(a)).collect();
        interleave_families(&addresses)
            .into_iter()
            .map(|i| list[i])
            .collect()
    }
    assert_eq!(order(&[A, B, V6A, V6B, C]), vec![A, V6A, B, V6B, C]);
    assert_eq!(order(&[V6A, A, B, V6B]), vec![V6A, A, V6B, B]);
    assert_eq!(order(&[A, B]), vec![A, B]);
    assert!(order(&[]).is_empty());

    run(|mut h| async move {
        h.update(vec![endpoint(&[A, B]), endpoint(&[V6A])], false);
        h.connecting(A);
        h.elapse(Duration::from_millis(250)).await;
        assert!(h.requested(V6A), "IPv6 comes second");
        assert!(!h.requested(B));
        h.connecting(V6A);
        h.elapse(Duration::from_millis(250)).await;
        assert!(h.requested(B));
    });
}

#[test]
fn shuffle_permutes_endpoints_and_keeps_their_addresses_together() {
    run(|mut h| async move {
        let endpoints = vec![
            endpoint(&[A]),
            endpoint(&[B, V6A]),
            endpoint(&[C]),
            endpoint(&[D]),
        ];
        let mut firsts = std::collections::HashSet::new();
        let mut orders = std::collections::HashSet::new();
        for _ in 0..200 {
            h.policy = PickFirst::new();
            h.update(endpoints.clone(), true);
            for a in [A, B, C, D, V6A] {
                h.pool.peek(addr(a)).unwrap().take_connection_request();
            }
            let list: Vec<SocketAddr> = h.policy.list.as_ref().unwrap().addresses().collect();
            let b = list.iter().position(|a| *a == addr(B)).unwrap();
            assert_eq!(
                list[b + 1],
                addr(V6A),
                "an endpoint's addresses split: {list:?}"
            );
            firsts.insert(list[0]);
            orders.insert(list);
        }
        assert_eq!(firsts.len(), 4, "not every endpoint came first: {firsts:?}");
        assert!(orders.len() > 4, "few orders: {orders:?}");

        for _ in 0..20 {
            h.policy = PickFirst::new();
            h.update(endpoints.clone(), false);
            let list: Vec<SocketAddr> = h.policy.list.as_ref().unwrap().addresses().collect();
            assert_eq!(list, [A, B, V6A, C, D].map(addr));
        }
    });
}

impl Harness {
    /// The events sent to the LB task so far (timers that fired included).
    fn sent(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.rx.try_recv().ok()).collect()
    }

    /// Feeds `event` to the policy, as the LB task would.
    fn feed(&mut self, event: Event) -> bool {
        let mut ctx = Ctx::new(&self.pool, &self.tx, &mut self.next_timer, "test");
        self.policy.event(&mut ctx, &event)
    }
}

/// A on its own connected: the policy READY on A.
async fn ready_on_a(h: &mut Harness) {
    h.update(vec![endpoint(&[A]), endpoint(&[B])], false);
    assert_eq!(h.policy.state(), Connecting, "the first update connects");
    h.connecting(A);
    assert!(h.set(A, Ready));
    assert_eq!(h.policy.state(), Ready);
    assert_eq!(h.selected(), Some(addr(A)));
}

#[test]
fn a_closed_connection_leaves_the_policy_idle_until_a_call_comes() {
    run(|mut h| async move {
        ready_on_a(&mut h).await;

        // The connection closes: IDLE, nothing asked to connect, however
        // long nobody calls.
        assert!(h.set(A, Idle));
        assert_eq!(h.policy.state(), Idle);
        assert_eq!(h.policy.stats().state, Idle);
        assert_eq!(h.selected(), None);
        assert!(h.sent().is_empty());
        h.elapse(Duration::from_secs(30)).await;
        assert!(!h.requested(A) && !h.requested(B));

        // Calls queue; only the first asks the policy to leave IDLE.
        for _ in 0..5 {
            assert!(matches!(h.pick(), PickResult::Queue));
        }
        let sent = h.sent();
        let id = h.policy.id;
        assert_eq!(sent, vec![Event::ExitIdle(id)]);
        assert!(!h.requested(A), "the picker connects nothing itself");

        // Another policy's request is not ours.
        assert!(!h.feed(Event::ExitIdle(PolicyId::next())));
        assert_eq!(h.policy.state(), Idle);

        // On the event, a new pass from the first address.
        assert!(h.feed(Event::ExitIdle(id)));
        assert_eq!(h.policy.state(), Connecting);
        assert!(h.requested(A));
        assert!(!h.requested(B));
        assert!(matches!(h.pick(), PickResult::Queue));
        assert!(h.sent().is_empty(), "a CONNECTING picker asks nothing");
        // A late duplicate changes nothing.
        assert!(!h.feed(Event::ExitIdle(id)));
        h.connecting(A);
        assert!(h.set(A, Ready));
        assert_eq!(h.policy.state(), Ready);
        match h.pick() {
            PickResult::Complete(p) => assert_eq!(p.subchannel.address(), addr(A)),
            other => panic!("expected a pick of A, got {other:?}"),
        }
    });
}

#[test]
fn the_new_pass_is_happy_eyeballs_with_sticky_failure() {
    run(|mut h| async move {
        ready_on_a(&mut h).await;
        h.set(A, Idle);
        assert!(matches!(h.pick(), PickResult::Queue));
        let id = h.policy.id;
        h.feed(Event::ExitIdle(id));
        h.connecting(A);
        h.elapse(CONNECTION_ATTEMPT_DELAY).await;
        assert!(h.requested(B), "B starts after the delay, A still going");
        h.connecting(B);
        h.set(A, TransientFailure);
        assert_eq!(h.policy.state(), Connecting);
        h.set(B, TransientFailure);
        assert_eq!(h.policy.state(), TransientFailure);
        assert!(matches!(h.pick(), PickResult::Fail(_)));
        // Sticky: retries as backoffs end, not IDLE.
        h.set(B, Idle);
        assert!(h.requested(B));
        assert_eq!(h.policy.state(), TransientFailure);
        h.connecting(B);
        h.set(B, Ready);
        assert_eq!(h.policy.state(), Ready);
        assert_eq!(h.selected(), Some(addr(B)));
    });
}

#[test]
fn an_update_while_idle_waits_for_a_call() {
    run(|mut h| async move {
        ready_on_a(&mut h).await;
        h.set(A, Idle);
        assert!(h.update(vec![endpoint(&[C]), endpoint(&[D])], false));
        assert_eq!(h.policy.state(), Idle);
        assert!(!h.requested(C) && !h.requested(D) && !h.requested(A));

        // The call that comes connects the new list from its start.
        assert!(matches!(h.pick(), PickResult::Queue));
        let id = h.policy.id;
        assert_eq!(h.sent(), vec![Event::ExitIdle(id)]);
        h.feed(Event::ExitIdle(id));
        assert_eq!(h.policy.state(), Connecting);
        assert!(h.requested(C));
        assert!(!h.requested(A));
    });
}

#[test]
fn a_policy_emptied_then_given_addresses_connects_at_once() {
    run(|mut h| async move {
        ready_on_a(&mut h).await;
        h.set(A, Idle);
        h.update(Vec::new(), false);
        assert_eq!(h.policy.state(), TransientFailure);
        assert!(matches!(h.pick(), PickResult::Fail(_)));
        h.update(vec![endpoint(&[C])], false);
        assert_eq!(h.policy.state(), Connecting);
        assert!(h.requested(C));
    });
}
