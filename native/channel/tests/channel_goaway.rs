//! Connections that go away without a failed call (gRFC A6's transparent
//! retry): three tonic Echo backends end every connection with a GOAWAY
//! once it is 300 ms old (gRPC's `max_connection_age`), while 64 callers
//! and one sequential caller keep calling through `tether::Channel`, over
//! the real `tether-control` binary, with round robin, pinned sessions,
//! pick_first and ring hash. A call that a going-away connection gives back
//! unsent waits for the picker that knows and is sent on a new connection:
//! no call fails, every session and every hash key stays on its backend,
//! and outlier detection (ejecting at 1% failures) counts no failure: a
//! pick never sent is no outcome (C-core drops its tracker).
//! gRPC C-core (grpcio) makes the same concurrent calls over the same file.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use control_support::{Control, TempDir};
use tether::session::{CookieJar, CookieJarLayer, Layer};
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio::{self, Client};

/// How old a backend lets a connection grow before its GOAWAY.
const MAX_AGE: Duration = Duration::from_millis(300);
/// Concurrent callers.
const CALLERS: usize = 64;
/// How long the callers of one policy keep calling (bounded by
/// [`MAX_CALLS`] each too).
const RUN: Duration = Duration::from_millis(1500);
/// The most calls one caller makes.
const MAX_CALLS: usize = 300;
/// Each call is answered after this long, so calls are in flight when a
/// GOAWAY comes.
const MESSAGE: &str = "sleep:5";

fn yaml(addrs: &[SocketAddr]) -> String {
    let endpoints = control_support::endpoints_yaml(addrs);
    format!(
        r#"virtualhosts:
  - name: rr.tether.test
    routes:
      - services: [{{ name: echo }}]
  - name: session.tether.test
    routes:
      - services: [{{ name: echo }}]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: session, path: /, ttl: 600s }}
  - name: pf.tether.test
    routes:
      - services: [{{ name: echo }}]
        loadBalancerPolicy:
          strategy: PickFirst
  - name: hash.tether.test
    routes:
      - services: [{{ name: echo }}]
        loadBalancerPolicy:
          strategy: RequestHash
          requestHashPolicies:
            - headerHashOptions: {{ headerName: x-user }}
  - name: od.tether.test
    routes:
      - services: [{{ name: echo-od }}]
services:
  - name: echo
    protocol: h2c
    endpoints:
{endpoints}  - name: echo-od
    protocol: h2c
    outlierDetection:
      interval: 0.2s
      maxEjectionPercent: 100
      failurePercentage: {{ threshold: 1, enforcementPercentage: 100, minimumHosts: 3, requestVolume: 10 }}
    endpoints:
{endpoints}"#
    )
}

/// What the callers of one policy saw.
#[derive(Debug, Default)]
struct Outcome {
    calls: u64,
    failures: Vec<String>,
    /// Per caller, the backends that answered it.
    backends: Vec<BTreeSet<String>>,
}

/// One caller: calls until [`RUN`] is over (or [`MAX_CALLS`]), each with
/// `user` as its `x-user` when given; the backends that answered and the
/// failures.
async fn caller<S>(
    mut client: EchoClient<S>,
    user: Option<String>,
    calls: Arc<AtomicU64>,
) -> (BTreeSet<String>, Vec<String>)
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let until = Instant::now() + RUN;
    let (mut backends, mut failures) = (BTreeSet::new(), Vec::new());
    for _ in 0..MAX_CALLS {
        if Instant::now() >= until {
            break;
        }
        let mut request = tonic::Request::new(EchoRequest {
            message: MESSAGE.into(),
        });
        request.set_timeout(Duration::from_secs(10));
        if let Some(u) = &user {
            request
                .metadata_mut()
                .insert("x-user", u.parse().expect("a metadata value"));
        }
        calls.fetch_add(1, Ordering::Relaxed);
        match client.echo(request).await {
            Ok(reply) => {
                backends.insert(reply.into_inner().backend);
            }
            Err(status) => failures.push(format!("{}: {}", status.code(), status.message())),
        }
    }
    (backends, failures)
}

/// [`CALLERS`] callers at once and one more, sequential, after them, each
/// with its own cookie jar when `sessions`, and its own `x-user` when
/// `hash`.
async fn run(channel: &Channel, sessions: bool, hash: bool) -> Outcome {
    let calls = Arc::new(AtomicU64::new(0));
    let user = |i: usize| hash.then(|| format!("user-{i}"));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CALLERS {
        let calls = calls.clone();
        if sessions {
            let client =
                EchoClient::new(CookieJarLayer::new(CookieJar::new()).layer(channel.clone()));
            tasks.spawn(caller(client, user(i), calls));
        } else {
            tasks.spawn(caller(EchoClient::new(channel.clone()), user(i), calls));
        }
    }
    let mut outcome = Outcome::default();
    while let Some(done) = tasks.join_next().await {
        let (backends, failures) = done.expect("a caller panicked");
        outcome.backends.push(backends);
        outcome.failures.extend(failures);
    }
    // One caller alone: each call waits for the last.
    let (backends, failures) = if sessions {
        let client = EchoClient::new(CookieJarLayer::new(CookieJar::new()).layer(channel.clone()));
        caller(client, user(CALLERS), calls.clone()).await
    } else {
        caller(
            EchoClient::new(channel.clone()),
            user(CALLERS),
            calls.clone(),
        )
        .await
    };
    outcome.backends.push(backends);
    outcome.failures.extend(failures);
    outcome.calls = calls.load(Ordering::Relaxed);
    outcome
}

fn channel(bootstrap: &Path, target: &str) -> Channel {
    Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(bootstrap).unwrap())
        .wait_for_ready(true)
        .connect(target)
        .unwrap()
}

struct Fixture {
    _backends: Vec<GrpcBackend>,
    goaways: Vec<Arc<AtomicU64>>,
    control: Control,
    _dir: TempDir,
    bootstrap: PathBuf,
}

impl Fixture {
    async fn start() -> Fixture {
        let mut backends = Vec::new();
        let mut goaways = Vec::new();
        for name in ["backend-1", "backend-2", "backend-3"] {
            let (b, g) = GrpcBackend::start_rotating(name, MAX_AGE).await;
            backends.push(b);
            goaways.push(g);
        }
        let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr()).collect();
        let control = Control::start(&yaml(&addrs)).await;
        let dir = TempDir::new("goaway");
        let bootstrap = dir.bootstrap(&control.bootstrap_json("goaway"));
        Fixture {
            _backends: backends,
            goaways,
            control,
            _dir: dir,
            bootstrap,
        }
    }

    fn goaways(&self) -> u64 {
        self.goaways.iter().map(|g| g.load(Ordering::SeqCst)).sum()
    }

    /// Runs the callers against `target` and checks the common ground: no
    /// failed call, GOAWAYs sent meanwhile, nothing NACKed.
    async fn check(&self, target: &str, sessions: bool, hash: bool) -> Outcome {
        let before = self.goaways();
        let ch = channel(&self.bootstrap, target);
        let outcome = run(&ch, sessions, hash).await;
        let goaways = self.goaways() - before;
        println!(
            "{target}: {} calls, {} failed, {goaways} GOAWAYs sent meanwhile",
            outcome.calls,
            outcome.failures.len()
        );
        assert!(
            outcome.failures.is_empty(),
            "{target}: {} of {} calls failed across GOAWAYs: {:?}",
            outcome.failures.len(),
            outcome.calls,
            &outcome.failures[..outcome.failures.len().min(5)]
        );
        // 1.5 s against connections that live 300 ms: each backend's
        // connection went away several times.
        assert!(goaways >= 3, "{target}: only {goaways} GOAWAYs were sent");
        assert!(self.control.nacks_none(), "{}", self.control.stderr());
        outcome
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_across_goaways_never_fail_and_sessions_and_keys_stay_put() {
    tether_testkit::init_logging();
    let f = Fixture::start().await;

    f.check("xds:///rr.tether.test", false, false).await;

    // Each caller is one session: every call after its first carries its
    // cookie, and its backend never changes, whatever its connection does.
    let sessions = f.check("xds:///session.tether.test", true, false).await;
    for (i, backends) in sessions.backends.iter().enumerate() {
        assert_eq!(
            backends.len(),
            1,
            "session {i} moved across GOAWAYs: {backends:?}"
        );
    }

    f.check("xds:///pf.tether.test", false, false).await;

    // One x-user per caller: one backend per key.
    let hashed = f.check("xds:///hash.tether.test", false, true).await;
    for (i, backends) in hashed.backends.iter().enumerate() {
        assert_eq!(
            backends.len(),
            1,
            "user-{i} moved across GOAWAYs: {backends:?}"
        );
    }

    // A pick that was never sent is not a failure: outlier detection,
    // ejecting any backend with 1% failed calls, ejects none.
    let od_channel = channel(&f.bootstrap, "xds:///od.tether.test");
    let outcome = run(&od_channel, false, false).await;
    assert!(
        outcome.failures.is_empty(),
        "{} failed: {:?}",
        outcome.failures.len(),
        &outcome.failures[..outcome.failures.len().min(5)]
    );
    let stats = od_channel.stats().await.expect("the channel answers");
    let od = stats
        .tree
        .find("outlier_detection")
        .expect("an outlier_detection node");
    println!(
        "od.tether.test: {} calls, outlier detection {:?}",
        outcome.calls, od.facts
    );
    assert_eq!(od.fact("ejections"), Some("0"), "{:?}", od.facts);

    // gRPC C-core: the same concurrent calls over the same file.
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-grpcio");
    let py = grpcio::python_or_install(Some(&venv))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client = Client::new(py, &f.bootstrap);
    let before = f.goaways();
    let args: Vec<String> = [
        "--concurrency",
        &CALLERS.to_string(),
        "--failures-ok",
        "--message",
        MESSAGE,
        "xds:///rr.tether.test",
        "6000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let calls = client
        .run(&args, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let failed: Vec<_> = calls.iter().filter(|c| !c.ok()).collect();
    println!(
        "grpcio (C-core) on xds:///rr.tether.test: {} calls, {} failed, {} GOAWAYs sent meanwhile",
        calls.len(),
        failed.len(),
        f.goaways() - before
    );
    assert_eq!(calls.len(), 6000);
    assert!(
        failed.is_empty(),
        "C-core failed calls across GOAWAYs too: {:?}",
        &failed[..failed.len().min(5)]
    );
    assert!(f.control.nacks_none(), "{}", f.control.stderr());
}
