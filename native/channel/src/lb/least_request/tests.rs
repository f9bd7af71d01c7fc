//! The policy fed fake subchannel states. The pool has no runtime, so its
//! subchannels never connect on their own: the states a test sends are the
//! only ones the policy sees.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::*;
use crate::lb::ConnectivityState::{Connecting, Idle, Ready, TransientFailure};
use crate::lb::{CallAttributes, Pick, PickArgs, PickResult, SubchannelPool};
use crate::subchannel::SubchannelOptions;

struct Harness {
    pool: SubchannelPool,
    tx: mpsc::UnboundedSender<Event>,
    next_timer: u64,
    policy: LeastRequest,
}

impl Harness {
    fn new() -> Self {
        let (tx, _rx) = mpsc::unbounded_channel();
        Harness {
            pool: SubchannelPool::new(SubchannelOptions::default(), Arc::new(|_, _, _| {})),
            tx,
            next_timer: 0,
            policy: LeastRequest::new(),
        }
    }

    fn update(&mut self, addresses: &[&str], choice_count: u32) -> bool {
        let config = Config {
            endpoints: addresses.iter().map(|a| endpoint(&[a])).collect(),
            choice_count,
        };
        self.update_config(config)
    }

    fn update_config(&mut self, config: Config) -> bool {
        let mut ctx = Ctx::new(&self.pool, &self.tx, &mut self.next_timer, "test");
        self.policy.update(&mut ctx, LbConfig::LeastRequest(config))
    }

    /// The subchannel of `a` reports `state`.
    fn set(&mut self, a: &str, state: ConnectivityState) -> bool {
        let address = addr(a);
        let id = self.pool.peek(address).expect("a subchannel").id();
        let mut ctx = Ctx::new(&self.pool, &self.tx, &mut self.next_timer, "test");
        self.policy
            .event(&mut ctx, &Event::Subchannel(id, address, state))
    }

    fn ready(&mut self, a: &str) {
        self.set(a, Connecting);
        self.set(a, Ready);
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

    /// A completed pick, its call still going.
    fn start(&self) -> Pick {
        match self.pick() {
            PickResult::Complete(p) => p,
            other => panic!("expected a completed pick, got {other:?}"),
        }
    }

    /// Where a call that ends at once goes.
    fn call(&self) -> SocketAddr {
        let p = self.start();
        p.trackers.finished(true);
        p.subchannel.address()
    }

    fn fact(&self, name: &str) -> String {
        self.policy
            .stats()
            .facts
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    /// The outstanding count of each endpoint, by its first address.
    fn outstanding(&self) -> HashMap<SocketAddr, u64> {
        self.fact("outstanding")
            .split_whitespace()
            .map(|kv| {
                let (a, n) = kv.split_once('=').unwrap();
                (addr(a), n.parse().unwrap())
            })
            .collect()
    }
}

use crate::lb::test_harness::{addr, endpoint};

const A: &str = "10.0.0.1:80";
const B: &str = "10.0.0.2:80";
const C: &str = "10.0.0.3:80";

/// Calls held on `target` until it has `n` outstanding (picks that went
/// elsewhere end at once); bounded.
fn load(h: &Harness, target: &str, n: usize) -> Vec<Pick> {
    let mut held = Vec::new();
    for _ in 0..10_000 {
        if held.len() == n {
            return held;
        }
        let p = h.start();
        if p.subchannel.address() == addr(target) {
            held.push(p);
        } else {
            p.trackers.finished(true);
        }
    }
    panic!("{target} never got {n} calls");
}

#[test]
fn choice_count_defaults_to_2_and_is_capped_at_10() {
    let count = |choice_count| {
        Config {
            endpoints: Vec::new(),
            choice_count,
        }
        .effective_choice_count()
    };
    assert_eq!(Config::default().effective_choice_count(), 2);
    assert_eq!(count(2), 2);
    assert_eq!(count(7), 7);
    assert_eq!(count(10), 10);
    assert_eq!(count(11), 10);
    assert_eq!(count(u32::MAX), 10);
    // Refused by validation; never fewer than two draws if one slips by.
    assert_eq!(count(0), 2);
    assert_eq!(count(1), 2);
    let mut h = Harness::new();
    h.update(&[A, B], 50);
    assert_eq!(h.fact("choice_count"), "10");
}

#[test]
fn equal_loads_spread_evenly() {
    let mut h = Harness::new();
    h.update(&[A, B, C], 2);
    for a in [A, B, C] {
        h.ready(a);
    }
    assert_eq!(h.policy.state(), Ready);
    let mut counts: HashMap<SocketAddr, u32> = HashMap::new();
    for _ in 0..30_000 {
        *counts.entry(h.call()).or_default() += 1;
    }
    for a in [A, B, C] {
        let n = counts[&addr(a)];
        assert!((9_000..11_000).contains(&n), "{counts:?}");
    }
}

#[test]
fn the_least_loaded_draw_wins_and_draws_are_with_replacement() {
    let mut h = Harness::new();
    h.update(&[A, B], 2);
    h.ready(A);
    h.ready(B);
    let held = load(&h, A, 5);
    assert_eq!(h.outstanding()[&addr(A)], 5);
    // A is chosen only when both draws land on it: a quarter of the calls.
    let to_a = (0..8_000).filter(|_| h.call() == addr(A)).count();
    assert!((1_600..2_400).contains(&to_a), "{to_a} of 8000 went to A");
    // Ten draws: A only when all ten land on it (about 1 in 1024).
    h.update(&[A, B], 10);
    let to_a = (0..8_000).filter(|_| h.call() == addr(A)).count();
    assert!(to_a < 40, "{to_a} of 8000 went to A");
    for p in held {
        p.trackers.finished(false);
    }
    assert_eq!(h.outstanding()[&addr(A)], 0);
}

#[test]
fn a_call_counts_from_its_pick_until_it_ends() {
    let mut h = Harness::new();
    h.update(&[A], 2);
    h.ready(A);
    let p1 = h.start();
    let p2 = h.start();
    assert_eq!(p1.trackers.len(), 1);
    assert_eq!(h.outstanding()[&addr(A)], 2);
    p1.trackers.finished(true);
    assert_eq!(h.outstanding()[&addr(A)], 1);
    p2.trackers.finished(false);
    assert_eq!(h.outstanding()[&addr(A)], 0);
}

#[test]
fn counters_survive_new_pickers_and_connectivity_changes() {
    let mut h = Harness::new();
    h.update(&[A, B], 2);
    h.ready(A);
    h.ready(B);
    let held = load(&h, A, 3);
    // An update that keeps A (and adds C) keeps A's counter.
    assert!(h.update(&[C, A, B], 2));
    assert_eq!(h.outstanding()[&addr(A)], 3);
    assert_eq!(h.outstanding()[&addr(C)], 0);
    // So does A's connection closing and coming back.
    h.set(A, Idle);
    h.set(A, Connecting);
    assert_eq!(h.fact("ready"), "1/3");
    h.set(A, Ready);
    assert_eq!(h.outstanding()[&addr(A)], 3);
    // The calls picked before all that end on the same counter.
    for p in held {
        p.trackers.finished(true);
    }
    assert_eq!(h.outstanding()[&addr(A)], 0);
    // An endpoint that leaves and comes back starts again at zero.
    let held = load(&h, B, 2);
    h.update(&[A, C], 2);
    h.update(&[A, B, C], 2);
    assert_eq!(h.outstanding()[&addr(B)], 0);
    drop(held);
}

#[test]
fn only_ready_endpoints_are_picked() {
    let mut h = Harness::new();
    h.update(&[A, B, C], 3);
    assert!(matches!(h.pick(), PickResult::Queue));
    assert_eq!(h.policy.state(), Connecting);
    h.ready(B);
    h.set(A, Connecting);
    assert_eq!(h.policy.state(), Ready);
    for _ in 0..200 {
        assert_eq!(h.call(), addr(B));
    }
    h.set(C, Connecting);
    h.set(C, TransientFailure);
    for _ in 0..200 {
        assert_eq!(h.call(), addr(B));
    }
}

#[test]
fn all_failing_is_transient_failure_until_one_connects() {
    let mut h = Harness::new();
    h.update(&[A, B], 2);
    for a in [A, B] {
        h.set(a, Connecting);
        h.set(a, TransientFailure);
    }
    assert_eq!(h.policy.state(), TransientFailure);
    match h.pick() {
        PickResult::Fail(s) => {
            assert_eq!(s.code(), tonic::Code::Unavailable);
            assert!(
                s.message()
                    .starts_with("connections to all backends failing; last error:"),
                "{}",
                s.message()
            );
        }
        other => panic!("expected a failing pick, got {other:?}"),
    }
    // Retrying after backoff does not leave TRANSIENT_FAILURE (sticky).
    h.set(A, Idle);
    h.set(A, Connecting);
    assert_eq!(h.policy.state(), TransientFailure);
    h.set(A, Ready);
    assert_eq!(h.policy.state(), Ready);
    assert_eq!(h.call(), addr(A));
}

#[test]
fn no_endpoints_fail_with_an_empty_address_list() {
    let mut h = Harness::new();
    h.update(&[], 2);
    assert_eq!(h.policy.state(), TransientFailure);
    match h.pick() {
        PickResult::Fail(s) => assert_eq!(s.message(), "empty address list"),
        other => panic!("expected a failing pick, got {other:?}"),
    }
}

#[test]
fn duplicate_endpoints_are_one_endpoint() {
    let mut h = Harness::new();
    h.update(&[A, A, B], 2);
    assert_eq!(h.fact("ready"), "0/2");
    h.ready(A);
    h.ready(B);
    assert_eq!(h.fact("ready"), "2/2");
    let to_a = (0..6_000).filter(|_| h.call() == addr(A)).count();
    assert!((2_600..3_400).contains(&to_a), "{to_a} of 6000 went to A");
}

#[test]
fn an_endpoint_with_several_addresses_is_picked_on_the_one_connected() {
    // Connection Attempt Delay timers need a runtime; never driven, it
    // runs neither them nor the subchannels' tasks.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let mut h = Harness::new();
    h.update_config(Config {
        endpoints: vec![endpoint(&[A, B])],
        choice_count: 2,
    });
    h.set(A, Connecting);
    h.set(A, TransientFailure);
    h.set(B, Connecting);
    h.set(B, Ready);
    assert_eq!(h.policy.state(), Ready);
    assert_eq!(h.call(), addr(B));
    // Counted once, under the endpoint's first address.
    let p = h.start();
    assert_eq!(h.outstanding()[&addr(A)], 1);
    p.trackers.finished(true);
}

#[test]
fn stats_name_the_policy() {
    let mut h = Harness::new();
    h.update(&[A, B], 3);
    h.ready(A);
    let s = h.policy.stats();
    assert_eq!(s.policy, "least_request");
    assert_eq!(s.state, Ready);
    assert_eq!(h.fact("ready"), "1/2");
    assert_eq!(h.fact("choice_count"), "3");
    assert_eq!(s.endpoints.len(), 2);
}
