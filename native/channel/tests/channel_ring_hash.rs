//! `ring_hash` in `tether::Channel` over xDS from the ADS fixture, against
//! real tonic backends: the route's header hash policy picks the backend
//! tether-core's gRPC ring picks; a backend that stops hands its keys to
//! the next entry's backend, with no failed call, and gets them back when
//! it returns.

mod channel_support;
#[path = "../../xds/tests/xds_support/mod.rs"]
mod xds_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use channel_support::*;
use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::google::protobuf::{Any, UInt64Value};
use tether::xds::resource::pack;
use tether_core::hash::{HashPolicies, HashRequest, Host, Locality, Peer, Ring, RingConfig};
use tether_testkit::grpc::GrpcBackend;
use xds_support::{make, Fixture, Mode};

const KEYS: usize = 300;

/// A RING_HASH EDS cluster.
fn ring_cluster(name: &str) -> Any {
    let mut c = make::cluster(name);
    c.lb_policy = cpb::cluster::LbPolicy::RingHash as i32;
    c.lb_config = Some(cpb::cluster::LbConfig::RingHashLbConfig(
        cpb::cluster::RingHashLbConfig {
            minimum_ring_size: Some(UInt64Value { value: 1024 }),
            ..Default::default()
        },
    ));
    pack(&c)
}

/// `route` hashing the header `x-user`.
fn hashed(mut route: rpb::Route) -> rpb::Route {
    if let Some(rpb::route::Action::Route(a)) = route.action.as_mut() {
        a.hash_policy.push(rpb::route_action::HashPolicy {
            policy_specifier: Some(rpb::route_action::hash_policy::PolicySpecifier::Header(
                rpb::route_action::hash_policy::Header {
                    header_name: "x-user".into(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        });
    }
    route
}

fn key(i: usize) -> String {
    format!("user-{i}-{}", i * 7919)
}

/// The backend a call with `x-user: key` reached.
async fn backend_for(ch: &tether::Channel, key: &str) -> Result<String, tonic::Status> {
    echo_with(ch, "x", &[("x-user", key)]).await
}

/// The request hash of `key` under the route's policy, with gRPC's rules.
fn hash_of(key: &str) -> u64 {
    HashPolicies::from_json(r#"[{"header":{"header_name":"x-user"}}]"#, Peer::Grpc)
        .unwrap()
        .evaluate(&HashRequest::new(&[("x-user", key)]))
        .hash
        .value()
        .unwrap()
}

/// Three backends of weights 1, 2, 3 in one locality behind a RING_HASH
/// cluster hashed on `x-user`, and tether-core's ring for them.
async fn setup(f: &Fixture) -> (Vec<GrpcBackend>, Ring, tether::Channel) {
    let bs = vec![
        GrpcBackend::start("r1").await,
        GrpcBackend::start("r2").await,
        GrpcBackend::start("r3").await,
    ];
    let weights = [1, 2, 3];
    let loc = Loc::of(&bs.iter().map(GrpcBackend::addr).collect::<Vec<_>>()).weights(&weights);
    serve(
        f,
        vec![hashed(route("/", "c"))],
        vec![ring_cluster("c")],
        vec![eds("c", vec![loc], &[])],
    );
    let hosts = Locality::grpc_hosts(&[Locality::new(
        1,
        bs.iter()
            .zip(weights)
            .map(|(b, w)| Host::from_addr(b.addr(), w)),
    )])
    .unwrap();
    let ring = Ring::build(hosts, &RingConfig::grpc()).unwrap();
    (bs, ring, channel(f))
}

/// Backend names by address.
fn names(bs: &[GrpcBackend]) -> HashMap<String, String> {
    bs.iter()
        .map(|b| (b.addr().to_string(), b.name().to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_reaches_the_backend_cores_grpc_ring_picks() {
    let f = Fixture::start(Mode::Serve).await;
    let (bs, ring, ch) = setup(&f).await;
    let names = names(&bs);
    let mut per_backend: HashMap<String, usize> = HashMap::new();
    for i in 0..KEYS {
        let k = key(i);
        let got = backend_for(&ch, &k).await.unwrap();
        let want = &names[ring.pick_host(hash_of(&k)).key()];
        assert_eq!(&got, want, "key {k}");
        *per_backend.entry(got).or_default() += 1;
    }
    assert_eq!(per_backend.len(), 3, "{per_backend:?}");
    // A key keeps its backend.
    for i in 0..20 {
        let k = key(i);
        let first = backend_for(&ch, &k).await.unwrap();
        for _ in 0..5 {
            assert_eq!(backend_for(&ch, &k).await.unwrap(), first);
        }
    }
}

/// The state of `addr`'s subchannel in the channel's tree.
async fn subchannel_state(
    ch: &tether::Channel,
    addr: SocketAddr,
) -> Option<tether::lb::ConnectivityState> {
    fn find(node: &tether::lb::PolicyStats, addr: &str) -> Option<tether::lb::ConnectivityState> {
        node.endpoints
            .iter()
            .find(|e| e.address == addr)
            .map(|e| e.state)
            .or_else(|| node.children.iter().find_map(|c| find(c, addr)))
    }
    find(&ch.stats().await?.tree, &addr.to_string())
}

/// The next entry's backend for `hash` when `down` is down: the first host
/// other than `down` walking the ring from the hash's entry.
fn next_up(ring: &Ring, hash: u64, down: &str) -> String {
    (0..ring.len() as u32)
        .map(|a| ring.hosts()[ring.pick_attempt(hash, a)].key().to_owned())
        .find(|k| k != down)
        .expect("another host in the ring")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_backend_hands_its_keys_to_the_next_entry_and_gets_them_back() {
    let f = Fixture::start(Mode::Serve).await;
    let (mut bs, ring, ch) = setup(&f).await;
    let names = names(&bs);
    let mut before = Vec::new();
    for i in 0..KEYS {
        let k = key(i);
        before.push((k.clone(), backend_for(&ch, &k).await.unwrap()));
    }
    // r2 stops: its connections close (no GOAWAY), it refuses new ones. A
    // call sent in the moment before the channel sees the close fails, as
    // in gRPC (the server may have seen it); once it has seen it, none does.
    let down: SocketAddr = bs[1].addr();
    bs[1].stop().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while subchannel_state(&ch, down).await == Some(tether::lb::ConnectivityState::Ready) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the close is never seen"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut moved = 0;
    for (k, was) in &before {
        // No call fails: the pick waits while the endpoint reconnects, then
        // walks past it once it fails.
        let got = backend_for(&ch, k).await.unwrap();
        if *was == "r2" {
            let want = &names[&next_up(&ring, hash_of(k), &down.to_string())];
            assert_eq!(&got, want, "key {k} moves to the next entry's backend");
            moved += 1;
        } else {
            assert_eq!(&got, was, "key {k} of a backend that stayed up");
        }
    }
    assert!(moved > 0, "r2 had keys");
    // r2 comes back on its address: its keys return (after its backoff).
    bs[1] = GrpcBackend::start_on("r2", down).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let mut wrong = 0;
        for (k, was) in &before {
            if backend_for(&ch, k).await.unwrap() != *was {
                wrong += 1;
            }
        }
        if wrong == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{wrong} keys not back on their backend"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A MAGLEV EDS cluster (default table size).
fn maglev_cluster(name: &str) -> Any {
    let mut c = make::cluster(name);
    c.lb_policy = cpb::cluster::LbPolicy::Maglev as i32;
    pack(&c)
}

/// MAGLEV clusters: refused as C-core refuses them (the calls fail naming
/// the policy), and with `ChannelBuilder::maglev(true)` picked by
/// tether-core's Maglev table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maglev_is_refused_like_c_core_unless_opted_in() {
    use tether_core::hash::{Maglev, MaglevConfig};
    let f = Fixture::start(Mode::Serve).await;
    let bs = [
        GrpcBackend::start("m1").await,
        GrpcBackend::start("m2").await,
        GrpcBackend::start("m3").await,
    ];
    let addrs: Vec<SocketAddr> = bs.iter().map(GrpcBackend::addr).collect();
    serve(
        &f,
        vec![hashed(route("/", "c"))],
        vec![maglev_cluster("c")],
        vec![eds("c", vec![Loc::of(&addrs)], &[])],
    );
    let refused = channel(&f);
    let e = backend_for(&refused, "k").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(
        e.message().contains("lb_policy: 5") && e.message().contains("not supported"),
        "{e:?}"
    );

    let ch = tether::Channel::builder()
        .bootstrap(xds_support::bootstrap(f.addr, NODE))
        .maglev(true)
        .connect(&format!("xds:///{TARGET}"))
        .unwrap();
    let hosts = Locality::grpc_hosts(&[Locality::new(
        1,
        addrs.iter().map(|a| Host::from_addr(*a, 1)),
    )])
    .unwrap();
    let table = Maglev::build(hosts, &MaglevConfig::default()).unwrap();
    let names = names(&bs);
    for i in 0..KEYS {
        let k = key(i);
        let want = &names[table.pick_host(hash_of(&k)).key()];
        assert_eq!(&backend_for(&ch, &k).await.unwrap(), want, "key {k}");
    }
}
