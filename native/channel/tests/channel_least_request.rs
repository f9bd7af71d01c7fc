//! `least_request` (gRFC A48) end to end: three tonic Echo backends on
//! loopback, one of them answering every call after 200 ms; the real
//! `tether-control` binary serves them with `strategy: WeightedLeastRequest`;
//! `tether::Channel` resolves the target over xDS and 16 callers share a
//! fixed number of calls. Round robin over the same backends (the same file,
//! another route) is the baseline, and gRPC C-core (grpcio) runs the same
//! calls over the same file.
//!
//! A48 draws `choice_count` endpoints with replacement, so a backend is
//! still chosen whenever every draw lands on it: with three endpoints, 1/9
//! of the picks for the default of 2 draws (a third of round robin's 1/3,
//! no better), 1/27 for 3 draws. The test checks both.
//!
//! gRPC C-core (grpcio 1.85) has no `least_request`: it skips the policy in
//! the cluster's list and takes the round robin tether-control puts after
//! it, so there the slow backend keeps its round-robin share. The test
//! prints both shares and checks that C-core accepted the cluster and still
//! runs round robin. A real Envoy given the same file's cluster (Envoy's own
//! LEAST_REQUEST) and a static channel avoid the slow backend as the xDS
//! channel does; tether-control's model and translation are checked too.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_support::{Control, TempDir};
use tether_proto::demo::v1::echo_client::EchoClient;
use tether_proto::demo::v1::EchoRequest;
use tether_testkit::grpc::GrpcBackend;
use tether_testkit::grpcio::{self, Client};

/// How long the slow backend takes to answer.
const SLOW: Duration = Duration::from_millis(200);
/// Callers at once.
const CALLERS: usize = 16;

/// Three virtual hosts over the same three endpoints: round robin, least
/// request with the default choice count, and with 3 draws (another
/// service: the routes of one service share its least request cluster).
fn yaml(addrs: &[SocketAddr]) -> String {
    let endpoints = control_support::endpoints_yaml(addrs);
    format!(
        r#"virtualhosts:
  - name: rr.tether.test
    routes:
      - services: [{{ name: echo }}]
  - name: lr.tether.test
    routes:
      - services: [{{ name: echo }}]
        loadBalancerPolicy:
          strategy: WeightedLeastRequest
  - name: lr3.tether.test
    routes:
      - services: [{{ name: echo-3 }}]
        loadBalancerPolicy:
          strategy: WeightedLeastRequest
          choiceCount: 3
services:
  - name: echo
    protocol: h2c
    endpoints:
{endpoints}  - name: echo-3
    protocol: h2c
    endpoints:
{endpoints}"#
    )
}

/// One Echo call over `client`: the backend that answered.
async fn echo_once<S>(client: &mut EchoClient<S>) -> Result<String, tonic::Status>
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut request = tonic::Request::new(EchoRequest {
        message: "x".into(),
    });
    request.set_timeout(Duration::from_secs(10));
    Ok(client.echo(request).await?.into_inner().backend)
}

/// What one batch of calls did: calls per backend and how long it took.
struct Batch {
    counts: BTreeMap<String, usize>,
    took: Duration,
}

impl Batch {
    fn share(&self, backend: &str) -> f64 {
        let total: usize = self.counts.values().sum();
        self.counts.get(backend).copied().unwrap_or(0) as f64 / total as f64
    }
}

/// A channel to `target` over `bootstrap` and [`batch`]'s calls over it.
async fn channel_batch(bootstrap: &Path, target: &str, calls: usize) -> (tether::Channel, Batch) {
    let channel = tether::Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(bootstrap).unwrap())
        .connect(target)
        .unwrap();
    let batch = batch(target, channel.clone(), calls).await;
    (channel, batch)
}

/// Calls over `service` until all three backends answered (so every
/// endpoint is READY before the measured calls), then `calls` calls from
/// [`CALLERS`] tasks. Panics on a failed call.
async fn batch<S>(what: &str, service: S, calls: usize) -> Batch
where
    S: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut client = EchoClient::new(service.clone());
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 3 {
        assert!(Instant::now() < deadline, "{what}: only {seen:?} answered");
        match echo_once(&mut client).await {
            Ok(b) => {
                seen.insert(b);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let budget = Arc::new(AtomicUsize::new(calls));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let budget = budget.clone();
        let mut client = EchoClient::new(service.clone());
        tasks.spawn(async move {
            let mut got: Vec<Result<String, tonic::Status>> = Vec::new();
            // Bounded by the shared budget.
            while budget
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                got.push(echo_once(&mut client).await);
            }
            got
        });
    }
    let mut counts = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        for r in done.unwrap() {
            let backend = r.unwrap_or_else(|e| panic!("{what}: a call failed: {e:?}"));
            *counts.entry(backend).or_insert(0) += 1;
        }
    }
    let batch = Batch {
        counts,
        took: started.elapsed(),
    };
    assert_eq!(batch.counts.values().sum::<usize>(), calls);
    batch
}

/// The least request node's facts in the channel's tree, found depth first.
fn least_request_facts(tree: &tether::lb::PolicyStats) -> Option<BTreeMap<String, String>> {
    Some(tree.find("least_request")?.facts.iter().cloned().collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_request_steers_calls_away_from_a_slow_backend_unlike_round_robin() {
    let fast1 = GrpcBackend::start("fast-1").await;
    let fast2 = GrpcBackend::start("fast-2").await;
    let slow = GrpcBackend::start_slow("slow", SLOW).await;
    let addrs = [fast1.addr(), slow.addr(), fast2.addr()];
    let control = Control::start(&yaml(&addrs)).await;
    let dir = TempDir::new("least-request");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("least-request"));

    // Round robin: every third call, whatever the latency.
    let (_rr_channel, rr) = channel_batch(&bootstrap, "xds:///rr.tether.test", 480).await;
    let rr_share = rr.share("slow");
    println!(
        "round robin: slow share {rr_share:.3} {:?} in {:?}",
        rr.counts, rr.took
    );
    assert!((0.30..=0.37).contains(&rr_share), "{:?}", rr.counts);

    // Three draws: the slow backend only when all three land on it (1/27)
    // or while its counter is not above the others' (the first picks).
    let (channel, lr3) = channel_batch(&bootstrap, "xds:///lr3.tether.test", 960).await;
    let lr3_share = lr3.share("slow");
    println!(
        "least_request, choiceCount 3: slow share {lr3_share:.3} {:?} in {:?}",
        lr3.counts, lr3.took
    );
    assert!(
        lr3_share <= rr_share / 3.0,
        "least_request (3 draws) gave the slow backend {lr3_share:.3}, more than a third of round robin's {rr_share:.3}: {:?}",
        lr3.counts
    );
    let stats = channel.stats().await.expect("the channel answers");
    let facts = least_request_facts(&stats.tree).expect("a least_request node in the tree");
    assert_eq!(facts["choice_count"], "3", "{facts:?}");
    assert_eq!(facts["ready"], "3/3", "{facts:?}");
    drop(channel);

    // The default two draws: both land on the slow backend 1/9 of the time
    // (A48 draws with replacement), about a third of round robin's share;
    // a few more while its counter climbs past the fast ones' at the start.
    let (_lr_channel, lr) = channel_batch(&bootstrap, "xds:///lr.tether.test", 960).await;
    let lr_share = lr.share("slow");
    println!(
        "least_request, default choiceCount 2: slow share {lr_share:.3} {:?} in {:?}",
        lr.counts, lr.took
    );
    // Four standard deviations (960 calls) below 1/9; at most half of round
    // robin's share, five above.
    assert!(
        (1.0 / 9.0 - 0.04..=rr_share / 2.0).contains(&lr_share),
        "least_request (2 draws) gave the slow backend {lr_share:.3}, expected about 1/9: {:?}",
        lr.counts
    );
    assert!(
        control.nacks_none(),
        "tether's channel NACKed: {}",
        control.stderr()
    );

    // gRPC C-core over the same file and target.
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-grpcio");
    let py = grpcio::python_or_install(Some(&venv))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = Client::new(py, &bootstrap);
    let started = Instant::now();
    let calls = client
        .calls_concurrently("xds:///lr.tether.test", 3, 480, CALLERS)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();
    assert_eq!(calls.len(), 480);
    let mut core: BTreeMap<String, usize> = BTreeMap::new();
    for c in &calls {
        *core.entry(c.backend.clone()).or_insert(0) += 1;
    }
    let core_share = core.get("slow").copied().unwrap_or(0) as f64 / calls.len() as f64;
    println!(
        "grpcio (C-core) on the least request cluster: slow share {core_share:.3} {core:?} in {took:?} (process included)"
    );
    println!(
        "slow backend's share: round robin {rr_share:.3}, tether least_request {lr_share:.3} (2 draws) / {lr3_share:.3} (3 draws), C-core {core_share:.3}"
    );
    assert!(
        control.nacks_none(),
        "C-core NACKed the least request cluster: {}",
        control.stderr()
    );
    // C-core runs the list's round robin. Should this fail, C-core has
    // gained least_request: then it should avoid the slow backend as the
    // channel does, and this comparison should say so.
    assert!(
        core_share >= 0.25,
        "C-core gave the slow backend {core_share:.3} of {core:?}: has grpcio gained least_request?"
    );
}

/// Without a control plane: a static channel with least_request avoids the
/// slow backend the same way, and one draw is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_least_request_channel_avoids_the_slow_backend() {
    use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
    let fast1 = GrpcBackend::start("fast-1").await;
    let fast2 = GrpcBackend::start("fast-2").await;
    let slow = GrpcBackend::start_slow("slow", SLOW).await;
    let config = |choice_count| {
        StaticConfig::new(
            "echo",
            [fast1.addr(), slow.addr(), fast2.addr()]
                .map(StaticEndpoint::new)
                .to_vec(),
        )
        .with_policy(EndpointPolicy::LeastRequest { choice_count })
    };
    let err = tether::Channel::from_static(config(1)).unwrap_err();
    assert!(
        err.to_string()
            .contains("least_request choice_count 1 must be at least 2"),
        "{err}"
    );
    let channel = tether::Channel::from_static(config(3)).unwrap();
    let b = batch("static", channel, 960).await;
    let share = b.share("slow");
    println!(
        "static least_request, choice_count 3: slow share {share:.3} {:?} in {:?}",
        b.counts, b.took
    );
    assert!(share <= 1.0 / 9.0, "{:?}", b.counts);
}

/// The same file's least request cluster served to a real Envoy (the
/// legacy `LEAST_REQUEST` with `choice_count`), gRPC calls through its
/// listener: Envoy, which draws as A48 does, avoids the slow backend too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gets_the_least_request_cluster_and_avoids_the_slow_backend() {
    let fast1 = GrpcBackend::start("fast-1").await;
    let fast2 = GrpcBackend::start("fast-2").await;
    let slow = GrpcBackend::start_slow("slow", SLOW).await;
    let addrs = [fast1.addr(), slow.addr(), fast2.addr()];
    let listen = tether_testkit::free_port();
    let yaml = format!(
        "listener: {{ port: {listen} }}\n{}",
        yaml(&addrs).replacen(
            "  - name: lr3.tether.test\n",
            "  - name: lr3.tether.test\n    domains: [\"*\"]\n",
            1
        )
    );
    let control = Control::start(&yaml).await;
    let envoy = tether_testkit::envoy::Envoy::start(&tether_testkit::envoy::ads_bootstrap(
        control.addr,
        "envoy-least-request",
    ))
    .await
    .expect("envoy starts");
    let listener: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{listener}"))
        .unwrap()
        .connect_lazy();
    let through_envoy = batch("envoy", channel, 960).await;
    let share = through_envoy.share("slow");
    println!(
        "Envoy LEAST_REQUEST, choice_count 3: slow share {share:.3} {:?} in {:?}",
        through_envoy.counts, through_envoy.took
    );
    assert!(
        share <= 1.0 / 9.0,
        "Envoy gave the slow backend {share:.3}: {:?}\n{}",
        through_envoy.counts,
        envoy.log()
    );
    assert!(control.nacks_none(), "{}", control.stderr());
}

// --- tether-control's model and translation ---------------------------------

const MODEL: &str = r#"listener: { port: 10000 }
virtualhosts:
  - name: shop
    routes:
      - conditions: [{ prefix: /a }]
        services: [{ name: web }]
        loadBalancerPolicy:
          strategy: WeightedLeastRequest
          choiceCount: 3
      - services: [{ name: web }]
        loadBalancerPolicy:
          strategy: LeastRequest
          choiceCount: 3
services:
  - name: web
    endpoints:
      - address: 127.0.0.1:8001
"#;

fn model_err(yaml: &str) -> String {
    tether_control::Config::parse(yaml).unwrap_err().to_string()
}

/// `yaml`'s error is `message` at the line and column of the value of the
/// first `needle` (`key: value`).
fn assert_model_err_at(yaml: &str, message: &str, needle: &str) {
    let at = yaml.find(needle).unwrap() + needle.find(": ").unwrap() + 2;
    let line = yaml[..at].matches('\n').count() + 1;
    let column = at - yaml[..at].rfind('\n').map_or(0, |n| n + 1) + 1;
    assert_eq!(
        model_err(yaml),
        format!("{message} at line {line} column {column}")
    );
}

#[test]
fn least_request_translates_for_envoy_and_proxyless() {
    use envoy_types::pb::envoy::config::cluster::v3 as cpb;
    use prost::Message;
    use tether::xds::resource::cluster::LbPolicy;
    use tether::xds::resource::{decode, ResourceKind};
    use tether_control::{translate, Config, Flavor};

    let t = translate(&Config::parse(MODEL).unwrap());
    let raw = |flavor: Flavor| {
        let any = &t.for_flavor(flavor)[&ResourceKind::Cluster]["web/least-request"];
        cpb::Cluster::decode(any.value.as_slice()).unwrap()
    };
    // Envoy: the legacy enum and its config.
    let envoy = raw(Flavor::Envoy);
    assert_eq!(envoy.lb_policy, cpb::cluster::LbPolicy::LeastRequest as i32);
    let Some(cpb::cluster::LbConfig::LeastRequestLbConfig(lr)) = &envoy.lb_config else {
        panic!("{:?}", envoy.lb_config)
    };
    assert_eq!(lr.choice_count.as_ref().map(|v| v.value), Some(3));
    assert!(envoy.load_balancing_policy.is_none());
    // Proxyless: WrrLocality over [LeastRequest, RoundRobin].
    let proxyless = raw(Flavor::Proxyless);
    let names = |p: &cpb::LoadBalancingPolicy| -> Vec<String> {
        p.policies
            .iter()
            .map(|p| {
                let any = p.typed_extension_config.as_ref().unwrap();
                any.typed_config.as_ref().unwrap().type_url.clone()
            })
            .collect()
    };
    let outer = proxyless.load_balancing_policy.as_ref().unwrap();
    assert_eq!(
        names(outer),
        ["type.googleapis.com/envoy.extensions.load_balancing_policies.wrr_locality.v3.WrrLocality"]
    );
    // Both validate in tether's client as least request with 3 draws.
    for (flavor, want) in [
        (Flavor::Envoy, LbPolicy::LeastRequest { choice_count: 3 }),
        (
            Flavor::Proxyless,
            LbPolicy::WrrLocality(Box::new(LbPolicy::LeastRequest { choice_count: 3 })),
        ),
    ] {
        let any = &t.for_flavor(flavor)[&ResourceKind::Cluster]["web/least-request"];
        match decode(ResourceKind::Cluster, any).result {
            Ok(tether::xds::Resource::Cluster(c)) => assert_eq!(c.lb_policy, want),
            Ok(other) => panic!("{other:?}"),
            Err(e) => panic!("{flavor:?}: {e}"),
        }
    }
    // Both route names reach the same cluster; the default choice count is 2.
    let two = MODEL.replace("          choiceCount: 3\n", "");
    let t = translate(&Config::parse(&two).unwrap());
    let any = &t.envoy[&ResourceKind::Cluster]["web/least-request"];
    let c = cpb::Cluster::decode(any.value.as_slice()).unwrap();
    let Some(cpb::cluster::LbConfig::LeastRequestLbConfig(lr)) = &c.lb_config else {
        panic!("{:?}", c.lb_config)
    };
    assert_eq!(lr.choice_count.as_ref().map(|v| v.value), Some(2));
}

#[test]
fn least_request_errors_name_the_field_value_and_line() {
    let at = "virtualhosts[0].routes[0].loadBalancerPolicy.choiceCount";
    assert_model_err_at(
        &MODEL.replacen("choiceCount: 3", "choiceCount: 1", 1),
        &format!("{at}: 1 must be from 2 to 10 (gRPC refuses fewer than 2 and draws at most 10)"),
        "choiceCount: 1",
    );
    assert_model_err_at(
        &MODEL.replacen("choiceCount: 3", "choiceCount: 11", 1),
        &format!("{at}: 11 must be from 2 to 10 (gRPC refuses fewer than 2 and draws at most 10)"),
        "choiceCount: 11",
    );
    assert_model_err_at(
        &MODEL.replacen("strategy: WeightedLeastRequest", "strategy: Random", 1),
        &format!("{at}: \"Random\" is only used with strategy WeightedLeastRequest"),
        "choiceCount: 3",
    );
    let second = "virtualhosts[0].routes[1].loadBalancerPolicy.choiceCount";
    let e = model_err(&MODEL.replacen("choiceCount: 3", "choiceCount: 4", 1));
    assert!(
        e.starts_with(&format!(
            "{second}: 3 differs from virtualhosts[0].routes[0].loadBalancerPolicy's choiceCount 4 for service \"web\""
        )),
        "{e}"
    );
    let e = model_err(&MODEL.replacen("WeightedLeastRequest", "LeastRequests", 1));
    assert!(e.contains("LeastRequests"), "{e}");
    assert!(e.contains("WeightedLeastRequest"), "{e}");
}
