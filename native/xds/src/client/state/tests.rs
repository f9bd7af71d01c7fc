//! The ADS state machine driven directly: hand-built responses, time as a
//! plain value, no socket and no runtime. The socket tests
//! (`tests/xds_a57.rs`, `tests/xds_resource_errors.rs`, ...) run the same
//! rules through a real server.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::service::discovery::v3::{ResourceError, ResourceName};
use envoy_types::pb::google::protobuf::UInt64Value;

use super::*;
use crate::backoff::BackoffConfig;
use crate::client::DOES_NOT_EXIST_TIMEOUT;
use crate::resource::pack;

const NODE: &str = "sm-node";
const SERVER: &str = "127.0.0.1:18000";
const CDS: ResourceKind = ResourceKind::Cluster;
const EDS: ResourceKind = ResourceKind::Endpoints;
const NOT_FOUND: i32 = 5;
const PERMISSION_DENIED: i32 = 7;
const UNAVAILABLE: i32 = 14;

/// The watchers' registry, as a plain map of the names each kind holds.
#[derive(Default)]
struct Subs(BTreeMap<ResourceKind, Vec<String>>);

impl Subs {
    fn of(kind: ResourceKind, names: &[&str]) -> Self {
        let mut s = Subs::default();
        s.set(kind, names);
        s
    }

    fn set(&mut self, kind: ResourceKind, names: &[&str]) {
        self.0
            .insert(kind, names.iter().map(|n| (*n).to_owned()).collect());
    }
}

impl Subscriptions for Subs {
    fn names(&mut self, kind: ResourceKind) -> Vec<String> {
        self.0.get(&kind).cloned().unwrap_or_default()
    }

    fn held(&mut self) -> Vec<Key> {
        self.0
            .iter()
            .flat_map(|(k, names)| names.iter().map(|n| (*k, n.clone())))
            .collect()
    }
}

/// A state machine for a server with `features`, A88 on or off; backoff
/// without jitter (1 s, ×1.6).
fn ads(features: &[&str], a88: bool) -> Ads {
    let features: Vec<String> = features.iter().map(|f| format!("{f:?}")).collect();
    let bootstrap = Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{SERVER}","channel_creds":[{{"type":"insecure"}}],"server_features":[{}]}}],"node":{{"id":"{NODE}"}}}}"#,
        features.join(",")
    ))
    .unwrap();
    let options = ClientOptions {
        data_error_handling: a88,
        ..ClientOptions::default()
    };
    let server = bootstrap.server().unwrap();
    let backoff = BackoffConfig {
        jitter: 0.0,
        ..BackoffConfig::default()
    };
    Ads::new(
        Config::new(&bootstrap, server, &options),
        Backoff::with_seed(backoff, 1),
    )
}

/// An EDS cluster.
fn cluster(name: &str) -> Any {
    pack(&cluster_pb(name))
}

fn cluster_pb(name: &str) -> cpb::Cluster {
    use core::config_source::ConfigSourceSpecifier::Self_;
    let eds = cpb::cluster::DiscoveryType::Eds as i32;
    let eds_config = core::ConfigSource {
        config_source_specifier: Some(Self_(core::SelfConfigSource::default())),
        ..Default::default()
    };
    cpb::Cluster {
        name: name.to_owned(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(eds)),
        eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
            eds_config: Some(eds_config),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A cluster gRPC rejects: a ring of size 0.
fn bad_cluster(name: &str) -> Any {
    let mut c = cluster_pb(name);
    c.lb_policy = cpb::cluster::LbPolicy::RingHash as i32;
    c.lb_config = Some(cpb::cluster::LbConfig::RingHashLbConfig(
        cpb::cluster::RingHashLbConfig {
            minimum_ring_size: Some(UInt64Value { value: 0 }),
            ..Default::default()
        },
    ));
    pack(&c)
}

const BAD: &str =
    "Cluster \"bad\": ring_hash_lb_config.minimum_ring_size: 0 must be in the range of 1 to 8388608";

fn response(
    kind: ResourceKind,
    version: &str,
    nonce: &str,
    resources: Vec<Any>,
) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.to_owned(),
        resources,
        type_url: kind.type_url().to_owned(),
        nonce: nonce.to_owned(),
        ..Default::default()
    }
}

/// `resource_errors` entries: (name, code, message).
fn with_errors(mut resp: DiscoveryResponse, errors: &[(&str, i32, &str)]) -> DiscoveryResponse {
    resp.resource_errors = errors
        .iter()
        .map(|(name, code, message)| ResourceError {
            resource_name: Some(ResourceName {
                name: (*name).to_owned(),
                ..Default::default()
            }),
            error_detail: Some(RpcStatus {
                code: *code,
                message: (*message).to_owned(),
                details: Vec::new(),
            }),
        })
        .collect();
    resp
}

fn sent(actions: &[Action]) -> Vec<&DiscoveryRequest> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send(r) => Some(&**r),
            Action::Publish { .. } => None,
        })
        .collect()
}

/// The one request among `actions`.
fn the_request(actions: &[Action]) -> &DiscoveryRequest {
    match sent(actions)[..] {
        [r] => r,
        ref other => panic!("expected one request, got {other:?}"),
    }
}

/// The names published, with whether watchers were woken.
fn published(actions: &[Action]) -> Vec<(&str, bool)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Publish { key, notify, .. } => Some((key.1.as_str(), *notify)),
            Action::Send(_) => None,
        })
        .collect()
}

impl Ads {
    fn state(&self, kind: ResourceKind, name: &str) -> &ResourceState {
        &self.resources[&(kind, name.to_owned())]
    }
}

/// Feeds a CDS response of `version` with nonce `n<version>`.
fn cds(sm: &mut Ads, subs: &mut Subs, version: &str, resources: Vec<Any>) -> Vec<Action> {
    let resp = response(CDS, version, &format!("n{version}"), resources);
    sm.on_response(subs, resp, SystemTime::now())
}

/// A state machine on a connected stream, subscribed to `names` of CDS,
/// with the clusters `sent` ACKed in version "1".
fn cached(features: &[&str], a88: bool, names: &[&str], sent: &[&str]) -> (Ads, Subs) {
    let mut subs = Subs::of(CDS, names);
    let mut sm = ads(features, a88);
    sm.stream_started(&mut subs);
    sm.stream_connected(&mut subs, Instant::now());
    let acts = cds(
        &mut sm,
        &mut subs,
        "1",
        sent.iter().map(|n| cluster(n)).collect(),
    );
    assert!(the_request(&acts).error_detail.is_none());
    (sm, subs)
}

#[test]
fn the_first_request_has_the_node_and_an_empty_version_and_nonce() {
    let mut subs = Subs::of(CDS, &["c2", "c1"]);
    subs.set(EDS, &["e1"]);
    let mut sm = ads(&[], false);
    let acts = sm.stream_started(&mut subs);
    let reqs = sent(&acts);
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    // Kinds in their order (CDS before EDS), names as the registry has them.
    assert_eq!(reqs[0].type_url, CDS.type_url());
    assert_eq!(reqs[0].resource_names, ["c2", "c1"]);
    assert_eq!(
        (
            reqs[0].version_info.as_str(),
            reqs[0].response_nonce.as_str()
        ),
        ("", "")
    );
    assert_eq!(reqs[0].node.as_ref().map(|n| n.id.as_str()), Some(NODE));
    // Only the stream's first request carries the node.
    assert_eq!(reqs[1].type_url, EDS.type_url());
    assert!(reqs[1].node.is_none());
    // No timer before the server accepted the stream.
    assert_eq!(sm.next_deadline(), None);
}

#[test]
fn a_valid_response_is_acked_with_its_version_and_nonce_and_a_new_stream_resends_the_version() {
    let mut subs = Subs::of(CDS, &["c1"]);
    let mut sm = ads(&[], false);
    sm.stream_started(&mut subs);
    sm.stream_connected(&mut subs, Instant::now());
    let acts = cds(&mut sm, &mut subs, "1", vec![cluster("c1")]);
    assert_eq!(published(&acts), [("c1", true)]);
    let ack = the_request(&acts);
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", "n1")
    );
    assert!(ack.error_detail.is_none() && ack.node.is_none());
    assert_eq!(ack.resource_names, ["c1"]);
    let s = sm.state(CDS, "c1");
    assert_eq!(
        s.status,
        ResourceStatus::Acked {
            version: "1".into()
        }
    );
    assert_eq!(s.resource_version.as_deref(), Some("1"));
    assert!(s.resource.is_some() && s.raw.is_some() && s.error.is_none());
    // The same resource again: ACKed, but no change for watchers.
    let acts = cds(&mut sm, &mut subs, "2", vec![cluster("c1")]);
    assert_eq!(published(&acts), [("c1", false)]);
    assert_eq!(the_request(&acts).version_info, "2");
    // A57: a stream closed after a response is no error and restarts at
    // once, with the ACKed version, an empty nonce and the node again.
    let closed = sm.on_stream_closed(&mut subs, tonic::Code::Unavailable, "gone");
    assert!(closed.actions.is_empty() && closed.retry_after.is_none());
    let acts = sm.stream_started(&mut subs);
    let req = the_request(&acts);
    assert_eq!(
        (req.version_info.as_str(), req.response_nonce.as_str()),
        ("2", "")
    );
    assert!(req.node.is_some());
}

#[test]
fn an_invalid_resource_nacks_naming_it_and_its_field_and_keeps_the_good_ones() {
    let (mut sm, mut subs) = cached(&[], false, &["bad", "c1"], &["bad", "c1"]);
    // Nothing watched is valid in it: the NACK keeps the previous version.
    let acts = cds(&mut sm, &mut subs, "2", vec![bad_cluster("bad")]);
    let nack = the_request(&acts);
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("1", "n2")
    );
    let detail = nack.error_detail.as_ref().unwrap();
    assert_eq!(detail.code, tonic::Code::InvalidArgument as i32);
    assert_eq!(detail.message, BAD);
    let s = sm.state(CDS, "bad");
    assert!(matches!(&s.status, ResourceStatus::Nacked { version, .. } if version == "2"));
    assert_eq!(
        s.error.as_ref().unwrap().to_string(),
        format!("version \"2\" rejected: {BAD}")
    );
    // The last good resource stays in use (without A88's fail_on_data_errors).
    assert!(s.is_ambient_error());
    assert_eq!(s.resource_version.as_deref(), Some("1"));
    let rejected = s.rejected.as_ref().unwrap();
    assert_eq!(
        (rejected.version.as_str(), rejected.details.as_str()),
        ("2", BAD)
    );
    assert!(rejected.raw.is_some());
    // c1 was left out: a deletion (CDS is state of the world), not a NACK.
    assert_eq!(sm.state(CDS, "c1").status, ResourceStatus::DoesNotExist);

    // A response where a watched resource is valid: the NACK carries its
    // version (C-core), and the good one is ACKed beside it.
    let acts = cds(
        &mut sm,
        &mut subs,
        "3",
        vec![bad_cluster("bad"), cluster("c1")],
    );
    let nack = the_request(&acts);
    assert_eq!(nack.version_info, "3");
    assert_eq!(nack.error_detail.as_ref().unwrap().message, BAD);
    let c1 = sm.state(CDS, "c1");
    assert_eq!(
        c1.status,
        ResourceStatus::Acked {
            version: "3".into()
        }
    );
    assert!(c1.resource.is_some() && c1.rejected.is_none());
}

#[test]
fn a_name_twice_in_a_response_nacks_both_copies() {
    let (mut sm, mut subs) = cached(&[], false, &["c1"], &["c1"]);
    let acts = cds(&mut sm, &mut subs, "2", vec![cluster("c1"), cluster("c1")]);
    assert_eq!(
        the_request(&acts).error_detail.as_ref().unwrap().message,
        "Cluster \"c1\": name: \"c1\" appears twice in one response"
    );
    assert!(matches!(
        sm.state(CDS, "c1").status,
        ResourceStatus::Nacked { .. }
    ));
}

#[test]
fn a_resource_left_out_of_a_cds_response_is_deleted_as_the_switches_say() {
    // (server features, A88, whether the cached cluster is kept)
    let cases: [(&[&str], bool, bool); 5] = [
        (&[], false, false),
        (&["ignore_resource_deletion"], false, true),
        // A88 ignores ignore_resource_deletion; fail_on_data_errors drops.
        (&[], true, true),
        (
            &["ignore_resource_deletion", "fail_on_data_errors"],
            true,
            false,
        ),
        (&["fail_on_data_errors"], true, false),
    ];
    for (features, a88, kept) in cases {
        let label = format!("{features:?} a88 {a88}");
        let (mut sm, mut subs) = cached(features, a88, &["c1", "c2"], &["c1", "c2"]);
        let acts = cds(&mut sm, &mut subs, "2", vec![cluster("c2")]);
        assert!(the_request(&acts).error_detail.is_none(), "{label}");
        assert_eq!(published(&acts), [("c1", true), ("c2", false)], "{label}");
        let s = sm.state(CDS, "c1");
        assert_eq!(s.status, ResourceStatus::DoesNotExist, "{label}");
        assert_eq!(s.resource.is_some(), kept, "{label}");
        assert_eq!(s.is_ambient_error(), kept, "{label}");
        assert_eq!(
            s.error.as_ref().unwrap().to_string(),
            format!("Cluster resource \"c1\" does not exist (node ID:{NODE})"),
            "{label}"
        );
        assert_eq!(
            s.rejected.as_ref().unwrap().details,
            "does not exist",
            "{label}"
        );
        // Left out again: a kept resource is not told twice.
        let acts = cds(&mut sm, &mut subs, "3", vec![cluster("c2")]);
        assert_eq!(published(&acts), [("c2", false)], "{label}");
    }
}

#[test]
fn a_resource_left_out_of_an_eds_response_is_no_deletion() {
    let mut subs = Subs::of(EDS, &["e1", "e2"]);
    let mut sm = ads(&[], false);
    sm.stream_started(&mut subs);
    let acts = sm.on_response(
        &mut subs,
        response(EDS, "1", "n1", vec![pack(&cla("e1"))]),
        SystemTime::now(),
    );
    assert_eq!(published(&acts), [("e1", true)]);
    assert_eq!(sm.state(EDS, "e2").status, ResourceStatus::Requested);
}

fn cla(name: &str) -> envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
    envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
        cluster_name: name.to_owned(),
        ..Default::default()
    }
}

#[test]
fn does_not_exist_fires_after_the_timeout_for_an_uncached_resource_only() {
    let mut subs = Subs::of(CDS, &["c1", "c2"]);
    let mut sm = ads(&[], false);
    let t0 = Instant::now();
    sm.stream_started(&mut subs);
    sm.stream_connected(&mut subs, t0);
    assert_eq!(sm.next_deadline(), Some(t0 + DOES_NOT_EXIST_TIMEOUT));
    cds(&mut sm, &mut subs, "1", vec![cluster("c2")]);
    // c2 arrived: its timer is gone; c1's still runs.
    assert_eq!(sm.next_deadline(), Some(t0 + DOES_NOT_EXIST_TIMEOUT));
    assert!(sm
        .on_timer(t0 + DOES_NOT_EXIST_TIMEOUT - Duration::from_millis(1))
        .is_empty());
    let acts = sm.on_timer(t0 + DOES_NOT_EXIST_TIMEOUT);
    assert_eq!(published(&acts), [("c1", true)]);
    let s = sm.state(CDS, "c1");
    assert_eq!(s.status, ResourceStatus::DoesNotExist);
    assert_eq!(
        s.error.as_ref().unwrap().to_string(),
        format!("Cluster resource \"c1\" does not exist (node ID:{NODE})")
    );
    assert_eq!(sm.next_deadline(), None);
    // A watcher of a new name on the connected stream: a request and a timer.
    subs.set(CDS, &["c1", "c2", "c3"]);
    let t1 = t0 + Duration::from_secs(20);
    let acts = sm.on_watchers_changed(&mut subs, CDS, t1);
    assert_eq!(the_request(&acts).resource_names, ["c1", "c2", "c3"]);
    assert_eq!(sm.next_deadline(), Some(t1 + DOES_NOT_EXIST_TIMEOUT));
    // The same names again: nothing to send.
    assert!(sm.on_watchers_changed(&mut subs, CDS, t1).is_empty());
}

#[test]
fn the_timer_is_a_transient_error_with_a88_and_resource_timer_is_transient_error() {
    // (A88, whether the timer reports a timeout)
    for (a88, transient) in [(true, true), (false, false)] {
        let mut subs = Subs::of(CDS, &["c1"]);
        let mut sm = ads(&["resource_timer_is_transient_error"], a88);
        let t0 = Instant::now();
        sm.stream_started(&mut subs);
        sm.stream_connected(&mut subs, t0);
        sm.on_timer(t0 + DOES_NOT_EXIST_TIMEOUT);
        let s = sm.state(CDS, "c1");
        if transient {
            assert_eq!(s.status, ResourceStatus::Timeout);
            assert_eq!(
                s.error.as_ref().unwrap().to_string(),
                format!("timeout obtaining Cluster resource \"c1\" from xDS server {SERVER} (node ID:{NODE})")
            );
        } else {
            assert_eq!(s.status, ResourceStatus::DoesNotExist, "a88 {a88}");
        }
    }
}

#[test]
fn a_stream_closed_before_any_response_is_a_connectivity_error_for_every_watcher() {
    let (mut sm, mut subs) = cached(&[], false, &["c1", "c2"], &["c2"]);
    let closed = sm.on_stream_closed(&mut subs, tonic::Code::Unavailable, "reset");
    assert!(closed.retry_after.is_none());
    // The next stream fails before any response.
    sm.stream_started(&mut subs);
    let closed = sm.on_stream_closed(&mut subs, tonic::Code::Unavailable, "refused");
    assert_eq!(published(&closed.actions), [("c1", true), ("c2", true)]);
    assert_eq!(closed.retry_after, Some(Duration::from_secs(1)));
    let text = format!(
        "xDS channel for server {SERVER}: xDS call failed with no responses received; \
         status: UNAVAILABLE: refused (node ID:{NODE})"
    );
    // Uncached: the error is the resource's; cached: ambient beside it.
    let c1 = sm.state(CDS, "c1");
    assert!(c1.resource.is_none() && !c1.is_ambient_error());
    assert_eq!(c1.error.as_ref().unwrap().to_string(), text);
    assert!(sm.state(CDS, "c2").is_ambient_error());
    // A watcher that comes during the backoff hears of it at once.
    subs.set(CDS, &["c1", "c2", "late"]);
    let acts = sm.on_watchers_changed(&mut subs, CDS, Instant::now());
    assert!(sent(&acts).is_empty());
    assert_eq!(published(&acts), [("late", true)]);
    assert_eq!(
        sm.state(CDS, "late").error.as_ref().unwrap().to_string(),
        text
    );
    // Failing again backs off longer.
    sm.stream_started(&mut subs);
    let closed = sm.on_stream_closed(&mut subs, tonic::Code::Unavailable, "refused");
    assert_eq!(closed.retry_after, Some(Duration::from_millis(1600)));
    // A response clears the connectivity errors and resets the backoff.
    sm.stream_started(&mut subs);
    sm.stream_connected(&mut subs, Instant::now());
    let acts = cds(&mut sm, &mut subs, "2", vec![cluster("c2")]);
    assert_eq!(
        published(&acts),
        [("c1", true), ("c2", true), ("late", true), ("c2", false)]
    );
    assert!(sm.state(CDS, "c1").error.is_none());
    assert!(sm.state(CDS, "c2").error.is_none());
    sm.on_stream_closed(&mut subs, tonic::Code::Unavailable, "reset");
    sm.stream_started(&mut subs);
    let closed = sm.on_stream_closed(&mut subs, tonic::Code::Unavailable, "refused");
    assert_eq!(closed.retry_after, Some(Duration::from_secs(1)));
}

#[test]
fn resource_errors_with_a88_are_received_errors_and_acked() {
    // An uncached resource: the error is its state, the response ACKed.
    let mut subs = Subs::of(CDS, &["c1"]);
    let mut sm = ads(&[], true);
    sm.stream_started(&mut subs);
    let resp = with_errors(
        response(CDS, "1", "n1", vec![]),
        &[
            ("c1", PERMISSION_DENIED, "not for you"),
            ("unwatched", NOT_FOUND, "x"),
        ],
    );
    let acts = sm.on_response(&mut subs, resp, SystemTime::now());
    assert_eq!(published(&acts), [("c1", true)]);
    let ack = the_request(&acts);
    assert!(ack.error_detail.is_none());
    assert_eq!(ack.version_info, "1");
    let s = sm.state(CDS, "c1");
    assert_eq!(
        s.status,
        ResourceStatus::ReceivedError {
            version: "1".into(),
            code: tonic::Code::PermissionDenied,
            message: "not for you".into(),
        }
    );
    assert_eq!(
        s.error.as_ref().unwrap().to_string(),
        format!(
            "Cluster resource \"c1\": the xDS server reported PERMISSION_DENIED: not for you (node ID:{NODE})"
        )
    );
    assert_eq!(s.rejected.as_ref().unwrap().details, "not for you");
    // Errors for resources nobody watches are ignored.
    assert!(!sm.resources.contains_key(&(CDS, "unwatched".to_owned())));
}

#[test]
fn resource_errors_keep_the_cached_resource_unless_fail_on_data_errors_and_gone() {
    // (server features, code, whether the cached cluster survives)
    let cases: [(&[&str], i32, bool); 5] = [
        (&[], NOT_FOUND, true),
        (&[], PERMISSION_DENIED, true),
        (&["fail_on_data_errors"], UNAVAILABLE, true),
        (&["fail_on_data_errors"], NOT_FOUND, false),
        (&["fail_on_data_errors"], PERMISSION_DENIED, false),
    ];
    for (features, code, kept) in cases {
        let label = format!("{features:?} code {code}");
        let (mut sm, mut subs) = cached(features, true, &["c1"], &["c1"]);
        // Left out and reported in error: an error, not a deletion.
        let resp = with_errors(
            response(CDS, "2", "n2", vec![]),
            &[("c1", code, "withdrawn")],
        );
        let acts = sm.on_response(&mut subs, resp, SystemTime::now());
        assert!(the_request(&acts).error_detail.is_none(), "{label}");
        let s = sm.state(CDS, "c1");
        assert!(
            matches!(&s.status, ResourceStatus::ReceivedError { code: c, .. } if *c == tonic::Code::from_i32(code)),
            "{label}: {s:?}"
        );
        assert_eq!(s.resource.is_some(), kept, "{label}");
        assert_eq!(s.is_ambient_error(), kept, "{label}");
        assert_eq!(s.resource_version.is_some(), kept, "{label}");
    }
}

#[test]
fn malformed_resource_errors_nack_and_without_a88_they_are_not_read() {
    let errors = [("", UNAVAILABLE, "no name"), ("c1", 0, "ok is no error")];
    let mut subs = Subs::of(CDS, &["c1"]);
    let mut sm = ads(&[], true);
    sm.stream_started(&mut subs);
    let resp = with_errors(response(CDS, "1", "n1", vec![cluster("c1")]), &errors);
    let acts = sm.on_response(&mut subs, resp, SystemTime::now());
    let nack = the_request(&acts);
    assert_eq!(
        nack.error_detail.as_ref().unwrap().message,
        "Cluster \"\": resource_errors[0].resource_name: \"\" unset; \
         Cluster \"c1\": resource_errors[1].error_detail: \"c1\" must be non-OK"
    );
    // c1 was valid in it: the NACK carries the response's version.
    assert_eq!(nack.version_info, "1");
    assert!(matches!(
        sm.state(CDS, "c1").status,
        ResourceStatus::Acked { .. }
    ));

    // Without A88: not read; c1 left out is a deletion, and the response ACKed.
    let (mut sm, mut subs) = cached(&[], false, &["c1"], &["c1"]);
    let resp = with_errors(
        response(CDS, "2", "n2", vec![]),
        &[("c1", PERMISSION_DENIED, "not for you"), ("", 0, "")],
    );
    let acts = sm.on_response(&mut subs, resp, SystemTime::now());
    assert!(the_request(&acts).error_detail.is_none());
    let s = sm.state(CDS, "c1");
    assert_eq!(s.status, ResourceStatus::DoesNotExist);
    assert!(s.resource.is_none());
}

#[test]
fn an_unknown_type_is_nacked() {
    let mut subs = Subs::of(CDS, &["c1"]);
    let mut sm = ads(&[], false);
    sm.stream_started(&mut subs);
    let mut resp = response(CDS, "1", "n1", vec![]);
    resp.type_url = "type.googleapis.com/unknown.Type".into();
    let acts = sm.on_response(&mut subs, resp, SystemTime::now());
    let nack = the_request(&acts);
    assert_eq!(nack.type_url, "type.googleapis.com/unknown.Type");
    assert_eq!(nack.response_nonce, "n1");
    assert_eq!(
        nack.error_detail.as_ref().unwrap().message,
        "unknown resource type \"type.googleapis.com/unknown.Type\""
    );
}

#[test]
fn an_unsubscription_forgets_the_resource_when_it_goes_out() {
    let (mut sm, mut subs) = cached(&[], false, &["c1", "c2"], &["c1", "c2"]);
    subs.set(CDS, &["c2"]);
    let acts = sm.on_watchers_changed(&mut subs, CDS, Instant::now());
    let req = the_request(&acts);
    assert_eq!(req.resource_names, ["c2"]);
    assert_eq!(
        (req.version_info.as_str(), req.response_nonce.as_str()),
        ("1", "n1")
    );
    assert!(!sm.resources.contains_key(&(CDS, "c1".to_owned())));
    // Subscribed again: a fresh request, nothing cached.
    subs.set(CDS, &["c1", "c2"]);
    sm.on_watchers_changed(&mut subs, CDS, Instant::now());
    assert_eq!(sm.state(CDS, "c1").status, ResourceStatus::Requested);
}
