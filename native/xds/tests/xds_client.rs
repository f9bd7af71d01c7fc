//! The XdsClient's protocol: ACK and NACK with version and nonce, partial
//! acceptance of a response, LDS/CDS deletion, and the whole chain
//! Listener → RouteConfiguration → Cluster → ClusterLoadAssignment read from
//! tether's own control plane, with a pushed update.

mod xds_support;

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use tether_control::{translate, Config, ControlPlane};
use tether_xds::client::ResourceStatus;
use tether_xds::resource::listener::RouteSource;
use tether_xds::resource::pack;
use tether_xds::resource::route::{Action, ClusterSpecifier};
use tether_xds::{Resource, ResourceKind, ResourceState, Watcher, XdsClient, XdsError};
use xds_support::{bootstrap, make, Fixture, Mode, CDS, LDS};

async fn wait<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn request_matching(
    f: &Fixture,
    pred: impl Fn(&xds_support::Received) -> bool,
) -> xds_support::Received {
    wait("a request", async {
        loop {
            if let Some(r) = f.requests().into_iter().find(|r| pred(r)) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Waits (at most 10 s) until `pred` holds for the watched resource's
/// state; returns that state.
async fn state_when(
    what: &str,
    watcher: &mut Watcher,
    pred: impl FnMut(&ResourceState) -> bool,
) -> ResourceState {
    wait(what, watcher.wait_for(pred))
        .await
        .unwrap_or_else(|| panic!("the client stopped while waiting for {what}"))
}

/// Waits until the watched resource is present; returns its state.
async fn with_resource(what: &str, watcher: &mut Watcher) -> ResourceState {
    state_when(what, watcher, |s| s.resource.is_some()).await
}

#[tokio::test]
async fn ack_and_nack_carry_version_and_nonce_and_valid_resources_are_kept() {
    let f = Fixture::start(Mode::Serve).await;
    let mut bad = make::cluster("bad");
    bad.lb_policy = cpb::cluster::LbPolicy::RingHash as i32;
    bad.lb_config = Some(cpb::cluster::LbConfig::RingHashLbConfig(
        cpb::cluster::RingHashLbConfig {
            minimum_ring_size: Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 }),
            ..Default::default()
        },
    ));
    f.set_resources(CDS, vec![pack(&make::cluster("good")), pack(&bad)]);
    let v1 = f.version().to_string();
    let client = XdsClient::start(bootstrap(f.addr, "proto-node")).unwrap();
    let mut good = client.watch(ResourceKind::Cluster, "good");
    let mut badw = client.watch(ResourceKind::Cluster, "bad");
    let g = with_resource("good", &mut good).await;
    assert_eq!(
        g.status,
        ResourceStatus::Acked {
            version: v1.clone()
        }
    );
    let b = state_when("bad", &mut badw, |s| s.error.is_some()).await;
    let ResourceStatus::Nacked { version, error } = &b.status else {
        panic!("{b:?}")
    };
    assert_eq!(version, &v1);
    assert_eq!(
        error.errors[0].to_string(),
        "ring_hash_lb_config.minimum_ring_size: 0 must be in the range of 1 to 8388608"
    );
    assert!(matches!(b.error, Some(XdsError::Nacked { .. })));
    assert!(b.resource.is_none());
    // The NACK: the response's nonce and the error, and (as C-core sends
    // it) the response's version, since a resource in it was accepted.
    let nack = request_matching(&f, |r| {
        r.request.type_url == CDS && r.request.error_detail.is_some()
    })
    .await;
    assert_eq!(nack.request.version_info, v1);
    assert_ne!(nack.request.response_nonce, "");
    let detail = nack.request.error_detail.unwrap();
    assert!(
        detail
            .message
            .contains("Cluster \"bad\": ring_hash_lb_config.minimum_ring_size"),
        "{}",
        detail.message
    );

    // A fixed version is ACKed with its version and the new nonce.
    bad.lb_config = None;
    f.set_resources(CDS, vec![pack(&make::cluster("good")), pack(&bad)]);
    let v2 = f.version().to_string();
    f.push(CDS);
    let b = with_resource("fixed", &mut badw).await;
    assert_eq!(
        b.status,
        ResourceStatus::Acked {
            version: v2.clone()
        }
    );
    assert!(b.error.is_none());
    let ack = request_matching(&f, |r| {
        r.request.type_url == CDS && r.request.version_info == v2
    })
    .await;
    assert!(ack.request.error_detail.is_none());
    assert_ne!(ack.request.response_nonce, nack.request.response_nonce);

    // Left out of a later CDS response: deleted.
    f.set_resources(CDS, vec![pack(&make::cluster("good"))]);
    f.push(CDS);
    let b = state_when("deletion", &mut badw, |s| {
        s.status == ResourceStatus::DoesNotExist
    })
    .await;
    assert!(b.resource.is_none());
    assert!(good.current().resource.is_some());
    let v3 = f.version().to_string();

    // A response with nothing valid in it is NACKed with the last accepted
    // version.
    bad.lb_config = Some(cpb::cluster::LbConfig::RingHashLbConfig(
        cpb::cluster::RingHashLbConfig {
            minimum_ring_size: Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 }),
            ..Default::default()
        },
    ));
    f.set_resources(CDS, vec![pack(&bad)]);
    f.push(CDS);
    let nack = request_matching(&f, |r| {
        r.request.type_url == CDS
            && r.request.error_detail.is_some()
            && r.request.response_nonce != nack.request.response_nonce
    })
    .await;
    assert_eq!(nack.request.version_info, v3);
}

#[tokio::test]
async fn unsubscribing_sends_the_smaller_set() {
    let f = Fixture::start(Mode::Serve).await;
    f.set_resources(
        LDS,
        vec![make::listener("a", "r"), make::listener("b", "r")],
    );
    let client = XdsClient::start(bootstrap(f.addr, "n")).unwrap();
    let mut a = client.watch(ResourceKind::Listener, "a");
    let b = client.watch(ResourceKind::Listener, "b");
    with_resource("a", &mut a).await;
    request_matching(&f, |r| r.request.resource_names == ["a", "b"]).await;
    drop(b);
    let r = request_matching(&f, |r| {
        r.request.type_url == LDS
            && r.request.resource_names == ["a"]
            && !r.request.response_nonce.is_empty()
    })
    .await;
    assert!(
        r.request.node.is_none(),
        "the node goes on the first request only"
    );
    assert_eq!(client.resources().len(), 1);
}

/// A watcher dropped and another made at once, before the client sent the
/// unsubscription: the name set it would send is unchanged, so it sends
/// nothing and the server sends nothing again; the new watcher must find
/// the resource still cached (seen when a channel to a target was replaced
/// by another while its process's XdsClient stayed).
#[tokio::test]
async fn a_watch_dropped_and_made_again_at_once_keeps_the_cached_resource() {
    let f = Fixture::start(Mode::Serve).await;
    f.set_resources(LDS, vec![make::listener("a", "r")]);
    let client = XdsClient::start(bootstrap(f.addr, "n")).unwrap();
    let mut a = client.watch(ResourceKind::Listener, "a");
    with_resource("a", &mut a).await;
    request_matching(&f, |r| !r.request.response_nonce.is_empty()).await;
    let listener_requests = || {
        f.requests()
            .into_iter()
            .filter(|r| r.request.type_url == LDS)
            .count()
    };
    let requests = listener_requests();
    drop(a);
    let mut again = client.watch(ResourceKind::Listener, "a");
    assert!(again.current().resource.is_some(), "{:?}", again.current());
    // Still there once the client has handled both (no request needed):
    // it handles its watchers' changes in order, and a subscription of
    // another type made after them has reached the server.
    let later = client.watch(ResourceKind::Cluster, "later");
    request_matching(&f, |r| {
        r.request.type_url == CDS && r.request.resource_names == ["later"]
    })
    .await;
    drop(later);
    assert!(with_resource("a", &mut again).await.resource.is_some());
    assert_eq!(listener_requests(), requests, "{:?}", f.requests());
    assert_eq!(client.resources().len(), 1);
}

const YAML: &str = r#"
virtualhosts:
  - name: echo.example
    routes:
      - services:
          - name: echo
            weight: 3
          - name: echo-canary
            weight: 1
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: { name: s, path: /, ttl: 30s }
            overrideHostStatus: [HEALTHY, DRAINING]
            idleTimeout: 120s
services:
  - name: echo
    endpoints:
      - { address: "127.0.0.1:7001", priority: 0, locality: us/a }
      - { address: "127.0.0.1:7002", health: DRAINING, locality: us/a }
      - { address: "127.0.0.1:7003", priority: 1, locality: us/b, additionalAddresses: ["[::1]:7003"] }
  - name: echo-canary
    endpoints:
      - { address: "127.0.0.1:7100" }
"#;

#[tokio::test]
async fn reads_the_whole_chain_from_tether_control_and_follows_a_push() {
    let plane = ControlPlane::new(translate(&Config::parse(YAML).unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = {
        let plane = plane.clone();
        tokio::spawn(async move { plane.serve(listener, std::future::pending()).await })
    };
    let client = XdsClient::start(bootstrap(addr, "proxyless")).unwrap();
    let mut l = client.watch(ResourceKind::Listener, "echo.example");
    let s = with_resource("listener", &mut l).await;
    let Some(Resource::Listener(lis)) = s.resource else {
        panic!()
    };
    let RouteSource::Rds(rds) = &lis.http.routes else {
        panic!()
    };
    assert!(lis.http.stateful_session().is_some());
    let mut r = client.watch(ResourceKind::RouteConfiguration, rds);
    let s = with_resource("routes", &mut r).await;
    let Some(Resource::RouteConfiguration(rc)) = s.resource else {
        panic!()
    };
    let vh = rc.virtual_host_for("echo.example").unwrap();
    let route = &vh.routes[0];
    let Action::Route(action) = &route.action else {
        panic!()
    };
    let ClusterSpecifier::Weighted(w) = &action.clusters else {
        panic!()
    };
    assert_eq!(
        w.iter()
            .map(|c| (c.name.as_str(), c.weight))
            .collect::<Vec<_>>(),
        [("echo/session", 3), ("echo-canary/session", 1)]
    );
    assert!(route
        .filter_overrides
        .contains_key("envoy.filters.http.stateful_session"));
    let mut c = client.watch(ResourceKind::Cluster, "echo/session");
    let s = with_resource("cluster", &mut c).await;
    let Some(Resource::Cluster(cl)) = s.resource else {
        panic!()
    };
    assert_eq!(cl.idle_timeout, Duration::from_secs(120));
    assert_eq!(
        format!("{:?}", cl.override_host_status),
        "{Healthy, Draining}"
    );
    let mut e = client.watch(ResourceKind::Endpoints, cl.eds_name().unwrap());
    let s = with_resource("endpoints", &mut e).await;
    let Some(Resource::Endpoints(eds)) = s.resource else {
        panic!()
    };
    assert_eq!(eds.priorities.len(), 2);
    assert_eq!(eds.priorities[0].localities[0].endpoints.len(), 2);
    assert_eq!(
        eds.priorities[1].localities[0].endpoints[0].addresses.len(),
        2
    );
    assert!(plane.nacks().is_empty(), "{:?}", plane.nacks());

    // A pushed change reaches the watcher.
    let changed = YAML.replace("health: DRAINING, ", "");
    let v = plane.publish(translate(&Config::parse(&changed).unwrap()));
    assert_eq!(v, 2);
    let s = state_when("the update", &mut e, |s| {
        s.status
            == ResourceStatus::Acked {
                version: "2".into(),
            }
    })
    .await;
    let Some(Resource::Endpoints(eds)) = s.resource else {
        panic!()
    };
    assert!(eds
        .endpoints()
        .all(|(_, _, ep)| ep.health == tether_xds::resource::endpoint::HealthStatus::Healthy));
    // The dump view lists all four with their status.
    let dump = client.resources();
    assert_eq!(dump.len(), 4);
    assert!(dump
        .iter()
        .all(|(_, _, s)| matches!(s.status, ResourceStatus::Acked { .. })));
    server.abort();
}
