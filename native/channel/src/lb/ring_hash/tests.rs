//! The policy fed fake subchannel states. The pool has no runtime, so its
//! subchannels never connect on their own: the states a test sends are the
//! only ones the policy sees, and a connection the policy or a picker asks
//! for shows as the endpoint leaving IDLE.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tether_core::hash::{
    Host, Locality as CoreLocality, LocalityName, Maglev, MaglevConfig, Ring, RingConfig,
};
use tokio::sync::mpsc;

use super::*;
use crate::lb::ConnectivityState::{Connecting, Idle, Ready, TransientFailure};
use crate::lb::{
    CallAttributes, EndpointAddresses, HealthStatus, PickArgs, PickResult, SubchannelPool,
};
use crate::subchannel::SubchannelOptions;

struct Harness {
    pool: SubchannelPool,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    next_timer: u64,
    policy: RingHash,
}

impl Harness {
    fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Harness {
            pool: SubchannelPool::new(SubchannelOptions::default(), Arc::new(|_, _, _| {})),
            tx,
            rx,
            next_timer: 0,
            policy: RingHash::new(),
        }
    }

    fn with<R>(&mut self, f: impl FnOnce(&mut RingHash, &mut Ctx<'_>) -> R) -> R {
        let mut ctx = Ctx::new(&self.pool, &self.tx, &mut self.next_timer, "test");
        f(&mut self.policy, &mut ctx)
    }

    fn update(&mut self, config: Config) -> bool {
        self.with(|p, ctx| p.update(ctx, LbConfig::RingHash(config)))
    }

    fn event(&mut self, e: Event) -> bool {
        self.with(|p, ctx| p.event(ctx, &e))
    }

    /// The subchannel of `addr` reports `state`.
    fn set(&mut self, addr: SocketAddr, state: ConnectivityState) {
        let id = self.pool.peek(addr).expect("a subchannel").id();
        self.event(Event::Subchannel(id, addr, state));
    }

    /// What a picker's request to connect `addr` does.
    fn connect(&mut self, addr: SocketAddr) {
        let id = self.policy.id;
        self.event(Event::ConnectEndpoint(id, addr));
    }

    /// `addr`'s endpoint connects.
    fn ready(&mut self, addr: SocketAddr) {
        self.connect(addr);
        self.set(addr, Connecting);
        self.set(addr, Ready);
        assert_eq!(self.endpoint_state(addr), Ready);
    }

    /// `addr`'s endpoint fails to connect.
    fn fail(&mut self, addr: SocketAddr) {
        self.connect(addr);
        self.set(addr, Connecting);
        self.set(addr, TransientFailure);
        assert_eq!(self.endpoint_state(addr), TransientFailure);
    }

    fn endpoint_state(&self, addr: SocketAddr) -> ConnectivityState {
        self.policy.endpoints[self.policy.by_address[&addr]].state()
    }

    /// The endpoints' states, in the policy's order.
    fn states(&self) -> Vec<ConnectivityState> {
        self.policy
            .endpoints
            .iter()
            .map(AddressList::state)
            .collect()
    }

    fn count(&self, state: ConnectivityState) -> usize {
        self.states().iter().filter(|s| **s == state).count()
    }

    fn pick(&self, hash: Option<u64>) -> PickResult {
        let headers = http::HeaderMap::new();
        let attributes = CallAttributes {
            hash,
            ..CallAttributes::default()
        };
        self.policy.picker().pick(&PickArgs {
            path: "/test.Echo/Echo",
            headers: &headers,
            attributes: &attributes,
        })
    }

    /// The address a completed pick went to.
    fn picked(&self, hash: Option<u64>) -> SocketAddr {
        match self.pick(hash) {
            PickResult::Complete(p) => p.subchannel.address(),
            other => panic!("expected a completed pick, got {other:?}"),
        }
    }

    /// The endpoints pickers asked to connect since the last call.
    fn requests(&mut self) -> Vec<SocketAddr> {
        let mut out = Vec::new();
        while let Ok(e) = self.rx.try_recv() {
            if let Event::ConnectEndpoint(id, addr) = e {
                assert_eq!(id, self.policy.id);
                out.push(addr);
            }
        }
        out
    }

    fn fact(&self, name: &str) -> Option<String> {
        self.policy
            .stats()
            .facts
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn endpoint(a: &str, weight: u32) -> EndpointAddresses {
    EndpointAddresses {
        addresses: vec![addr(a)],
        weight,
        health: HealthStatus::Healthy,
    }
}

fn locality(zone: &str, weight: u32, endpoints: Vec<EndpointAddresses>) -> Locality {
    Locality {
        name: LocalityName {
            region: "us".into(),
            zone: zone.into(),
            sub_zone: String::new(),
        },
        weight,
        endpoints,
    }
}

/// gRPC's default ring for a cluster that does not set sizes.
const RING: Table = Table::Ring {
    min_ring_size: 1024,
    max_ring_size: 8_388_608,
};

/// One locality of equal endpoints at `addresses`.
fn flat(addresses: &[&str], table: Table) -> Config {
    Config {
        localities: vec![locality(
            "a",
            1,
            addresses.iter().map(|a| endpoint(a, 1)).collect(),
        )],
        table,
    }
}

/// Well spread 64-bit hashes (splitmix64).
fn hashes(n: usize) -> impl Iterator<Item = u64> {
    let mut x = 0x1234_5678_9abc_def0u64;
    (0..n).map(move |_| {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// Two localities listed out of name order, unequal locality and endpoint
/// weights (products 3, 4, 6, 4): the spec of the grpcio comparison.
fn two_localities(table: Table) -> Config {
    Config {
        localities: vec![
            locality(
                "b",
                1,
                vec![endpoint("10.0.1.1:80", 3), endpoint("10.0.1.2:80", 4)],
            ),
            locality(
                "a",
                2,
                vec![endpoint("10.0.0.1:80", 3), endpoint("10.0.0.2:80", 2)],
            ),
        ],
        table,
    }
}

/// The same localities built straight with tether-core, as gRPC weighs them.
fn two_core_localities() -> Vec<CoreLocality> {
    vec![
        CoreLocality::new(
            1,
            [
                Host::from_addr(addr("10.0.1.1:80"), 3),
                Host::from_addr(addr("10.0.1.2:80"), 4),
            ],
        )
        .named("us", "b", ""),
        CoreLocality::new(
            2,
            [
                Host::from_addr(addr("10.0.0.1:80"), 3),
                Host::from_addr(addr("10.0.0.2:80"), 2),
            ],
        )
        .named("us", "a", ""),
    ]
}

fn all_addresses(config: &Config) -> Vec<SocketAddr> {
    config
        .localities
        .iter()
        .flat_map(|l| l.endpoints.iter().map(|e| e.addresses[0]))
        .collect()
}

#[test]
fn the_ring_picks_what_core_picks_over_two_weighted_localities() {
    let config = two_localities(RING);
    let mut h = Harness::new();
    h.update(config.clone());
    for a in all_addresses(&config) {
        h.ready(a);
    }
    let ring = Ring::build(
        CoreLocality::grpc_hosts(&two_core_localities()).unwrap(),
        &RingConfig::grpc(),
    )
    .unwrap();
    assert_eq!(h.fact("table").as_deref(), Some("ring"));
    assert_eq!(h.fact("ring_size"), Some(ring.len().to_string()));
    for hash in hashes(20_000) {
        assert_eq!(
            h.picked(Some(hash)),
            addr(ring.pick_host(hash).key()),
            "hash {hash:#x}"
        );
    }
}

#[test]
fn endpoints_start_idle_and_nothing_connects_until_a_pick() {
    let mut h = Harness::new();
    h.update(flat(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"], RING));
    assert_eq!(h.policy.state(), Idle);
    assert_eq!(h.states(), [Idle, Idle, Idle]);
    assert!(h.requests().is_empty());
}

#[test]
fn a_ready_endpoint_takes_the_call() {
    let mut h = Harness::new();
    h.update(flat(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"], RING));
    let hash = 42;
    let first = addr(
        h.policy.table.as_ref().unwrap().hosts()[h.policy.table.as_ref().unwrap().pick(hash)].key(),
    );
    h.ready(first);
    assert_eq!(h.picked(Some(hash)), first);
    assert_eq!(h.policy.state(), Ready);
}

#[test]
fn an_idle_endpoint_queues_the_call_and_is_asked_to_connect() {
    let mut h = Harness::new();
    h.update(flat(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"], RING));
    let table = h.policy.table.clone().unwrap();
    let hash = 7;
    let first = addr(table.hosts()[table.pick(hash)].key());
    assert!(matches!(h.pick(Some(hash)), PickResult::Queue));
    // A second call on the same picker does not ask again.
    assert!(matches!(h.pick(Some(hash)), PickResult::Queue));
    assert_eq!(h.requests(), [first]);
    // The LB task acts on the request: that endpoint, and only it, connects.
    h.connect(first);
    assert_eq!(h.endpoint_state(first), Connecting);
    assert_eq!(h.count(Connecting), 1);
    assert_eq!(h.policy.state(), Connecting);
}

#[test]
fn a_connecting_endpoint_queues_the_call() {
    let mut h = Harness::new();
    h.update(flat(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"], RING));
    let table = h.policy.table.clone().unwrap();
    let hash = 99;
    let first = addr(table.hosts()[table.pick(hash)].key());
    h.connect(first);
    h.set(first, Connecting);
    assert!(matches!(h.pick(Some(hash)), PickResult::Queue));
    assert!(h.requests().is_empty(), "nothing new to connect");
}

/// The first endpoint of `hash` on `ring` and the next distinct one.
fn first_and_next(ring: &Ring, hash: u64) -> (SocketAddr, SocketAddr) {
    let first = ring.pick(hash);
    let next = (1..ring.len() as u32)
        .map(|a| ring.pick_attempt(hash, a))
        .find(|&i| i != first)
        .unwrap();
    (
        addr(ring.hosts()[first].key()),
        addr(ring.hosts()[next].key()),
    )
}

#[test]
fn a_failing_endpoint_passes_the_call_to_the_next_distinct_endpoint() {
    let addresses = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"];
    let ring = Ring::build(
        addresses.map(|a| Host::from_addr(addr(a), 1)),
        &RingConfig::grpc(),
    )
    .unwrap();
    let hash = 0xfeed_f00d;
    let (first, next) = first_and_next(&ring, hash);
    let other = addresses
        .iter()
        .map(|a| addr(a))
        .find(|a| *a != first && *a != next)
        .unwrap();

    // The next one IDLE: asked to connect, the call waits. (Another one
    // is connecting, so the policy starts nothing on its own.)
    let mut h = Harness::new();
    h.update(flat(&addresses, RING));
    h.connect(other);
    h.fail(first);
    assert_eq!(h.policy.state(), Connecting);
    assert_eq!(h.endpoint_state(next), Idle);
    assert!(matches!(h.pick(Some(hash)), PickResult::Queue));
    assert_eq!(h.requests(), [next]);

    // The next one READY: it takes the call.
    h.ready(next);
    assert_eq!(h.picked(Some(hash)), next);

    // The next one CONNECTING: the call waits, nothing more is asked.
    let mut h = Harness::new();
    h.update(flat(&addresses, RING));
    h.connect(next);
    h.fail(first);
    assert!(matches!(h.pick(Some(hash)), PickResult::Queue));
    assert!(h.requests().is_empty());
}

#[test]
fn when_every_endpoint_fails_the_call_fails_unavailable() {
    let addresses = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
    let mut h = Harness::new();
    h.update(flat(&addresses, RING));
    for a in addresses {
        h.fail(addr(a));
    }
    assert_eq!(h.policy.state(), TransientFailure);
    for hash in hashes(10) {
        let PickResult::Fail(status) = h.pick(Some(hash)) else {
            panic!("expected a failed pick");
        };
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status
                .message()
                .starts_with("ring hash cannot find a connected endpoint; first failure: "),
            "{}",
            status.message()
        );
    }
    assert!(h.requests().is_empty());
}

#[test]
fn the_state_follows_c_cores_aggregation_rules() {
    let three = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
    let [a, b, c] = three.map(addr);
    let fresh = |addresses: &[&str]| {
        let mut h = Harness::new();
        h.update(flat(addresses, RING));
        h
    };

    // 1. Any READY: READY, however many fail.
    let mut h = fresh(&three);
    h.ready(a);
    h.fail(b);
    h.fail(c);
    assert_eq!(h.states(), [Ready, TransientFailure, TransientFailure]);
    assert_eq!(h.policy.state(), Ready);

    // 2. Two failing: TRANSIENT_FAILURE, even with one connecting.
    let mut h = fresh(&three);
    h.connect(c);
    h.fail(a);
    h.fail(b);
    assert_eq!(h.states(), [TransientFailure, TransientFailure, Connecting]);
    assert_eq!(h.policy.state(), TransientFailure);

    // 3. One connecting, none failing: CONNECTING.
    let mut h = fresh(&three);
    h.connect(b);
    assert_eq!(h.states(), [Idle, Connecting, Idle]);
    assert_eq!(h.policy.state(), Connecting);

    // 4. One failing out of several: CONNECTING (and, nothing connecting,
    // the policy starts the first IDLE endpoint).
    let mut h = fresh(&three);
    h.connect(b);
    h.set(b, TransientFailure);
    assert_eq!(h.states(), [Connecting, TransientFailure, Idle]);
    assert_eq!(h.policy.state(), Connecting);

    // 5. All IDLE: IDLE.
    let h = fresh(&three);
    assert_eq!(h.policy.state(), Idle);
    let h = fresh(&["10.0.0.1:80"]);
    assert_eq!(h.policy.state(), Idle);

    // 6. Otherwise (the only endpoint failing): TRANSIENT_FAILURE.
    let mut h = fresh(&["10.0.0.1:80"]);
    h.fail(a);
    assert_eq!(h.policy.state(), TransientFailure);
}

#[test]
fn in_transient_failure_the_policy_keeps_one_endpoint_connecting() {
    let addresses = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"];
    let mut h = Harness::new();
    h.update(flat(&addresses, RING));
    // Each failure leaves exactly one endpoint connecting, started by the
    // policy itself (no picks), until none is left to try.
    let expected = [
        (Connecting, [TransientFailure, Connecting, Idle, Idle]),
        (
            TransientFailure,
            [TransientFailure, TransientFailure, Connecting, Idle],
        ),
        (
            TransientFailure,
            [
                TransientFailure,
                TransientFailure,
                TransientFailure,
                Connecting,
            ],
        ),
    ];
    h.fail(addr(addresses[0]));
    for (i, (state, states)) in expected.iter().enumerate() {
        assert_eq!(h.policy.state(), *state, "after {} failures", i + 1);
        assert_eq!(h.states(), states, "after {} failures", i + 1);
        let connecting = addr(addresses[i + 1]);
        h.set(connecting, TransientFailure);
    }
    assert_eq!(h.states(), [TransientFailure; 4]);
    assert_eq!(h.policy.state(), TransientFailure);
    assert!(h
        .fact("error")
        .unwrap()
        .starts_with("no reachable endpoints"));
    // One connects again: READY.
    h.set(addr(addresses[2]), Idle);
    h.set(addr(addresses[2]), Connecting);
    h.set(addr(addresses[2]), Ready);
    assert_eq!(h.policy.state(), Ready);
    assert_eq!(h.picked(Some(1)), addr(addresses[2]));
}

#[test]
fn an_endpoint_whose_connection_closes_is_idle_until_a_pick_needs_it() {
    let addresses = ["10.0.0.1:80", "10.0.0.2:80"];
    let mut h = Harness::new();
    h.update(flat(&addresses, RING));
    let table = h.policy.table.clone().unwrap();
    let hash = 5;
    let first = addr(table.hosts()[table.pick(hash)].key());
    h.ready(first);
    h.set(first, Idle);
    assert_eq!(h.endpoint_state(first), Idle, "no reconnection on its own");
    assert_eq!(h.policy.state(), Idle);
    assert!(matches!(h.pick(Some(hash)), PickResult::Queue));
    assert_eq!(h.requests(), [first]);
}

#[test]
fn an_endpoint_is_hashed_by_its_first_address_and_served_by_any() {
    // Connection Attempt Delay timers need a runtime; never driven, it
    // runs neither them nor the subchannels' tasks.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let (primary, secondary) = (addr("10.0.0.1:80"), addr("[2001:db8::1]:80"));
    let mut h = Harness::new();
    h.update(Config {
        localities: vec![locality(
            "a",
            1,
            vec![
                EndpointAddresses {
                    addresses: vec![primary, secondary],
                    weight: 1,
                    health: HealthStatus::Healthy,
                },
                endpoint("10.0.0.2:80", 1),
            ],
        )],
        table: RING,
    });
    let table = h.policy.table.clone().unwrap();
    let keys: Vec<&str> = table.hosts().iter().map(Host::key).collect();
    assert_eq!(keys, ["10.0.0.1:80", "10.0.0.2:80"]);
    // The first address fails, the second connects: the endpoint is READY
    // on it, and calls hashed to the endpoint go there.
    h.connect(primary);
    h.set(primary, TransientFailure);
    assert_eq!(h.endpoint_state(primary), Connecting);
    h.set(secondary, Ready);
    assert_eq!(h.endpoint_state(primary), Ready);
    let hash = hashes(100)
        .find(|&x| table.pick(x) == 0)
        .expect("a hash for the first endpoint");
    assert_eq!(h.picked(Some(hash)), secondary);
}

#[test]
fn calls_without_a_hash_spread_over_the_endpoints() {
    let addresses = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"];
    let mut h = Harness::new();
    h.update(flat(&addresses, RING));
    for a in addresses {
        h.ready(addr(a));
    }
    let mut counts: HashMap<SocketAddr, usize> = HashMap::new();
    for _ in 0..4000 {
        *counts.entry(h.picked(None)).or_default() += 1;
    }
    assert_eq!(counts.len(), 4, "{counts:?}");
    for (a, n) in &counts {
        assert!(*n > 600, "{a} got {n} of 4000: {counts:?}");
    }
}

#[test]
fn an_update_keeps_the_endpoints_that_stay() {
    let mut h = Harness::new();
    h.update(flat(&["10.0.0.1:80", "10.0.0.2:80"], RING));
    let a = addr("10.0.0.1:80");
    h.ready(a);
    let id = h.pool.peek(a).unwrap().id();
    assert!(h.pool.peek(addr("10.0.0.2:80")).is_some());
    // The same config again changes nothing.
    assert!(!h.update(flat(&["10.0.0.1:80", "10.0.0.2:80"], RING)));
    h.update(flat(&["10.0.0.1:80", "10.0.0.3:80"], RING));
    assert_eq!(h.pool.peek(a).unwrap().id(), id, "same subchannel");
    assert_eq!(h.endpoint_state(a), Ready, "still connected");
    assert_eq!(h.endpoint_state(addr("10.0.0.3:80")), Idle);
    assert!(
        h.pool.peek(addr("10.0.0.2:80")).is_none(),
        "the endpoint that left let go of its subchannel"
    );
    assert_eq!(h.policy.state(), Ready);
}

#[test]
fn ring_sizes_are_honoured_and_capped_at_4096() {
    let addresses = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"];
    let hosts = || addresses.map(|a| Host::from_addr(addr(a), 1));
    let mut h = Harness::new();
    h.update(flat(
        &addresses,
        Table::Ring {
            min_ring_size: 10,
            max_ring_size: 20,
        },
    ));
    let small = Ring::build(
        hosts(),
        &RingConfig {
            minimum_ring_size: 10,
            maximum_ring_size: 20,
            ..RingConfig::grpc()
        },
    )
    .unwrap();
    assert!(small.len() <= 20);
    assert_eq!(h.fact("ring_size"), Some(small.len().to_string()));
    // Asking for more than C-core's cap gets the cap.
    h.update(flat(
        &addresses,
        Table::Ring {
            min_ring_size: 100_000,
            max_ring_size: 8_388_608,
        },
    ));
    assert_eq!(h.fact("ring_size").as_deref(), Some("4096"));
}

#[test]
fn no_endpoints_or_a_table_that_cannot_be_built_is_transient_failure() {
    let mut h = Harness::new();
    h.update(Config {
        localities: vec![locality("a", 1, Vec::new())],
        table: RING,
    });
    assert_eq!(h.policy.state(), TransientFailure);
    let PickResult::Fail(status) = h.pick(Some(1)) else {
        panic!("expected a failed pick");
    };
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("empty address list"),
        "{}",
        status.message()
    );

    h.update(flat(&["10.0.0.1:80"], Table::Maglev { table_size: 1000 }));
    assert_eq!(h.policy.state(), TransientFailure);
    let PickResult::Fail(status) = h.pick(Some(1)) else {
        panic!("expected a failed pick");
    };
    assert_eq!(
        status.message(),
        "ring_hash: cannot build the Maglev table: table_size: 1000 is not a prime number in 2..=5000011"
    );
}

#[test]
fn maglev_picks_what_core_maglev_picks() {
    let table_size = 1021;
    let config = two_localities(Table::Maglev { table_size });
    let mut h = Harness::new();
    h.update(config.clone());
    for a in all_addresses(&config) {
        h.ready(a);
    }
    let maglev = Maglev::build(
        CoreLocality::grpc_hosts(&two_core_localities()).unwrap(),
        &MaglevConfig { table_size },
    )
    .unwrap();
    assert_eq!(h.fact("table").as_deref(), Some("maglev"));
    assert_eq!(h.fact("table_size").as_deref(), Some("1021"));
    for hash in hashes(5_000) {
        assert_eq!(h.picked(Some(hash)), addr(maglev.pick_host(hash).key()));
    }
}

#[test]
fn maglev_passes_a_failing_endpoint_by_envoys_retry_sequence() {
    let table_size = 1021;
    let config = two_localities(Table::Maglev { table_size });
    let maglev = Maglev::build(
        CoreLocality::grpc_hosts(&two_core_localities()).unwrap(),
        &MaglevConfig { table_size },
    )
    .unwrap();
    let hash = 0xabcd_ef01_2345;
    let first = maglev.pick(hash);
    let next = (1..)
        .map(|a| maglev.pick_attempt(hash, a))
        .find(|&i| i != first)
        .unwrap();
    let mut h = Harness::new();
    h.update(config.clone());
    for a in all_addresses(&config) {
        if a == addr(maglev.hosts()[first].key()) {
            h.fail(a);
        } else {
            h.ready(a);
        }
    }
    assert_eq!(h.picked(Some(hash)), addr(maglev.hosts()[next].key()));
}

mod validation {
    use envoy_types::pb::envoy::config::cluster::v3 as cpb;
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::extensions::load_balancing_policies::maglev::v3::Maglev;
    use envoy_types::pb::google::protobuf::UInt64Value;

    use crate::xds::resource::cluster::LbPolicy;
    use crate::xds::resource::{
        decode, decode_with, pack, Resource, ResourceKind, ValidationOptions,
    };

    fn eds_cluster() -> cpb::Cluster {
        cpb::Cluster {
            name: "c".into(),
            cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
                cpb::cluster::DiscoveryType::Eds as i32,
            )),
            eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
                eds_config: Some(core::ConfigSource {
                    config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
                        core::AggregatedConfigSource {},
                    )),
                    ..Default::default()
                }),
                service_name: "svc".into(),
            }),
            ..Default::default()
        }
    }

    fn opt_in() -> ValidationOptions {
        {
            let mut validation = ValidationOptions::default();
            validation.maglev = true;
            validation
        }
    }

    fn errors(c: &cpb::Cluster, options: ValidationOptions) -> Vec<String> {
        match decode_with(ResourceKind::Cluster, &pack(c), options).result {
            Ok(r) => panic!("expected a NACK, got {r:?}"),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        }
    }

    fn policy(c: &cpb::Cluster, options: ValidationOptions) -> LbPolicy {
        match decode_with(ResourceKind::Cluster, &pack(c), options).result {
            Ok(Resource::Cluster(c)) => c.lb_policy.clone(),
            other => panic!("expected a cluster, got {other:?}"),
        }
    }

    fn legacy(table_size: Option<u64>) -> cpb::Cluster {
        let mut c = eds_cluster();
        c.lb_policy = cpb::cluster::LbPolicy::Maglev as i32;
        c.lb_config = table_size.map(|v| {
            cpb::cluster::LbConfig::MaglevLbConfig(cpb::cluster::MaglevLbConfig {
                table_size: Some(UInt64Value { value: v }),
            })
        });
        c
    }

    fn typed(table_size: Option<u64>) -> cpb::Cluster {
        let mut c = eds_cluster();
        c.load_balancing_policy = Some(cpb::LoadBalancingPolicy {
            policies: vec![cpb::load_balancing_policy::Policy {
                typed_extension_config: Some(core::TypedExtensionConfig {
                    name: "maglev".into(),
                    typed_config: Some(pack(&Maglev {
                        table_size: table_size.map(|value| UInt64Value { value }),
                        ..Default::default()
                    })),
                }),
            }],
        });
        c
    }

    #[test]
    fn maglev_is_refused_without_the_opt_in() {
        // As gRPC: the legacy enum value is not supported, the typed policy
        // is skipped and nothing else is in the list.
        assert_eq!(
            errors(&legacy(Some(1021)), ValidationOptions::default()),
            ["lb_policy: 5 LB policy is not supported"]
        );
        assert!(decode(ResourceKind::Cluster, &pack(&legacy(None)))
            .result
            .is_err());
        assert_eq!(
            errors(&typed(None), ValidationOptions::default()),
            ["load_balancing_policy: no supported load balancing policy in the list"]
        );
    }

    #[test]
    fn maglev_is_accepted_with_the_opt_in() {
        assert_eq!(
            policy(&legacy(Some(1021)), opt_in()),
            LbPolicy::Maglev { table_size: 1021 }
        );
        assert_eq!(
            policy(&legacy(None), opt_in()),
            LbPolicy::Maglev { table_size: 65537 }
        );
        assert_eq!(
            policy(&typed(Some(251)), opt_in()),
            LbPolicy::Maglev { table_size: 251 }
        );
        assert_eq!(
            policy(&typed(None), opt_in()),
            LbPolicy::Maglev { table_size: 65537 }
        );
        assert_eq!(
            errors(&legacy(Some(1000)), opt_in()),
            ["maglev_lb_config.table_size: 1000 must be a prime number up to 5000011"]
        );
        assert_eq!(
            errors(&typed(Some(5_000_101)), opt_in()),
            ["load_balancing_policy.policies[0].typed_extension_config.typed_config.table_size: \
              5000101 must be a prime number up to 5000011"]
        );
    }
}

mod cds {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::mpsc;

    use crate::lb::cds::{Cds, Config, LeafCluster};
    use crate::lb::{Ctx, Event, LbConfig, LbPolicy, PolicyStats, SubchannelPool};
    use crate::subchannel::SubchannelOptions;
    use crate::xds::resource::cluster::{ClusterResource, Discovery, LbPolicy as ClusterLbPolicy};
    use crate::xds::resource::endpoint::{
        Endpoint, EndpointsResource, HealthSet, HealthStatus, LocalityEndpoints, LocalityName,
        Priority,
    };

    fn endpoint(a: &str, health: HealthStatus) -> Endpoint {
        Endpoint {
            addresses: vec![a.parse().unwrap()],
            health,
            weight: 1,
            hostname: String::new(),
        }
    }

    fn priority(zone: &str, endpoints: Vec<Endpoint>) -> Priority {
        Priority {
            localities: vec![LocalityEndpoints {
                locality: LocalityName {
                    region: "us".into(),
                    zone: zone.into(),
                    sub_zone: String::new(),
                },
                weight: 1,
                endpoints,
            }],
        }
    }

    fn leaf(lb_policy: ClusterLbPolicy) -> LbConfig {
        LbConfig::Cds(Config::Leaf(LeafCluster {
            name: "hashed".into(),
            cluster: Arc::new(ClusterResource {
                name: "hashed".into(),
                discovery: Discovery::Eds { service_name: None },
                lb_policy,
                override_host_status: HealthSet::default_override(),
                idle_timeout: Duration::from_secs(3600),
                max_requests: 1024,
                outlier_detection: None,
                security: None,
                lrs_server: false,
                backend_metric_propagation: Default::default(),
            }),
            endpoints: Arc::new(EndpointsResource {
                cluster_name: "hashed".into(),
                priorities: vec![
                    priority(
                        "a",
                        vec![
                            endpoint("10.0.0.1:80", HealthStatus::Healthy),
                            endpoint("10.0.0.2:80", HealthStatus::Draining),
                            endpoint("10.0.0.3:80", HealthStatus::Unknown),
                        ],
                    ),
                    priority("b", vec![endpoint("10.0.1.1:80", HealthStatus::Healthy)]),
                ],
                drop_overloads: Vec::new(),
            }),
            load: None,
        }))
    }

    /// The tree below the cluster, one policy per level, the first child
    /// each time.
    fn chain(stats: &PolicyStats) -> Vec<&PolicyStats> {
        let mut out = vec![stats];
        let mut at = stats;
        while let Some(c) = at.children.first() {
            out.push(c);
            at = c;
        }
        out
    }

    fn stats_for(lb_policy: ClusterLbPolicy) -> PolicyStats {
        let (tx, _rx) = mpsc::unbounded_channel::<Event>();
        let pool = SubchannelPool::new(SubchannelOptions::default(), Arc::new(|_, _, _| {}));
        let mut next_timer = 0;
        let mut ctx = Ctx::new(&pool, &tx, &mut next_timer, "test");
        let mut cds = Cds::new();
        cds.update(&mut ctx, leaf(lb_policy));
        cds.stats()
    }

    fn fact<'s>(s: &'s PolicyStats, name: &str) -> Option<&'s str> {
        s.facts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[tokio::test]
    async fn cds_runs_ring_hash_under_priority_for_a_ring_hash_cluster() {
        let stats = stats_for(ClusterLbPolicy::RingHash {
            min_ring_size: 1024,
            max_ring_size: 8_388_608,
        });
        let chain = chain(&stats);
        let names: Vec<&str> = chain.iter().map(|s| s.policy).collect();
        assert_eq!(
            names,
            [
                "cds",
                "xds_cluster_impl",
                "xds_override_host",
                "priority",
                "ring_hash"
            ]
        );
        let ring = chain[4];
        assert_eq!(ring.name.as_deref(), Some("hashed[priority-0]"));
        assert_eq!(fact(ring, "table"), Some("ring"));
        assert_eq!(fact(ring, "ring_size"), Some("1024"));
        // The DRAINING endpoint stays out.
        assert_eq!(fact(ring, "ready"), Some("0/2"));
        let addresses: Vec<&str> = ring.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.1:80", "10.0.0.3:80"]);
    }

    #[tokio::test]
    async fn cds_runs_a_maglev_cluster_as_ring_hash_with_a_maglev_table() {
        let stats = stats_for(ClusterLbPolicy::Maglev { table_size: 251 });
        let ring = *chain(&stats).last().unwrap();
        assert_eq!(ring.policy, "ring_hash");
        assert_eq!(fact(ring, "table"), Some("maglev"));
        assert_eq!(fact(ring, "table_size"), Some("251"));
    }

    #[tokio::test]
    async fn cds_refuses_ring_hash_under_wrr_locality() {
        let stats = stats_for(ClusterLbPolicy::WrrLocality(Box::new(
            ClusterLbPolicy::RingHash {
                min_ring_size: 1024,
                max_ring_size: 8_388_608,
            },
        )));
        assert_eq!(stats.state, crate::lb::ConnectivityState::TransientFailure);
        assert!(stats.children.is_empty());
    }
}
