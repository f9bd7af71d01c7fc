//! Retries from the route's `retry_policy` (gRFC A44, A6) beside gRPC
//! C-core on the same control plane: tether-control routes by an `x-case`
//! header to routes with and without a retry policy; the backends fail
//! their next N attempts as a script says (trailers-only UNAVAILABLE, with
//! or without `grpc-retry-pushback-ms`, or after sending headers) and
//! record each attempt's `grpc-previous-rpc-attempts`. The channel and
//! grpcio each get backends of their own (so both run at once) and must
//! make the same attempts with the same headers and end the same way.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;
#[path = "channel_support/telemetry.rs"]
mod telemetry_support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use control_support::{Control, TempDir};
use http_body::Frame;
use tether::channel::Attempts;
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::service::Routes;

/// How a scripted backend fails its next attempts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Failure {
    /// Trailers-only with this status code.
    Status(tonic::Code),
    /// Trailers-only UNAVAILABLE with `grpc-retry-pushback-ms: <value>`.
    Pushback(&'static str),
    /// Response headers, then trailers with UNAVAILABLE: committed.
    AfterHeaders,
}

#[derive(Debug)]
struct Script {
    fail_next: AtomicU32,
    how: Mutex<Failure>,
    /// Every attempt's `grpc-previous-rpc-attempts` (None: absent).
    seen: Mutex<Vec<Option<String>>>,
}

impl Script {
    fn new() -> Arc<Script> {
        Arc::new(Script {
            fail_next: AtomicU32::new(0),
            how: Mutex::new(Failure::Status(tonic::Code::Unavailable)),
            seen: Mutex::new(Vec::new()),
        })
    }

    /// Fails the next `n` attempts as `how` says; forgets what it saw.
    fn fail(&self, n: u32, how: Failure) {
        *self.how.lock().unwrap() = how;
        self.fail_next.store(n, Ordering::SeqCst);
        self.seen.lock().unwrap().clear();
    }

    fn seen(&self) -> Vec<Option<String>> {
        self.seen.lock().unwrap().clone()
    }
}

/// A body of trailers only (after the response headers).
struct TrailersOnly(Option<http::HeaderMap>);

impl http_body::Body for TrailersOnly {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, tonic::Status>>> {
        Poll::Ready(self.0.take().map(|t| Ok(Frame::trailers(t))))
    }
}

/// Echo behind the script.
#[derive(Clone)]
struct Scripted {
    routes: Routes,
    script: Arc<Script>,
}

impl tower_service::Service<http::Request<hyper::body::Incoming>> for Scripted {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        let previous = req
            .headers()
            .get("grpc-previous-rpc-attempts")
            .map(|v| v.to_str().unwrap().to_owned());
        self.script.seen.lock().unwrap().push(previous);
        let fail = self
            .script
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !fail {
            let mut routes = self.routes.clone();
            return Box::pin(async move {
                let r = tower_service::Service::call(&mut routes, req).await;
                Ok(r.unwrap_or_else(|e| match e {}))
            });
        }
        let how = *self.script.how.lock().unwrap();
        Box::pin(async move {
            // The request is read whole first, as a server would.
            let _ = http_body_util::BodyExt::collect(req.into_body()).await;
            Ok(match how {
                Failure::Status(code) => tonic::Status::new(code, "scripted").into_http(),
                Failure::Pushback(ms) => {
                    let mut r = tonic::Status::unavailable("scripted").into_http();
                    r.headers_mut()
                        .insert("grpc-retry-pushback-ms", ms.parse().unwrap());
                    r
                }
                Failure::AfterHeaders => {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", "14".parse().unwrap());
                    trailers.insert("grpc-message", "scripted".parse().unwrap());
                    http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(Body::new(TrailersOnly(Some(trailers))))
                        .unwrap()
                }
            })
        })
    }
}

async fn scripted(name: &str) -> (GrpcBackend, Arc<Script>) {
    let script = Script::new();
    let s = script.clone();
    let backend =
        GrpcBackend::start_wrapped(name, move |routes| Scripted { routes, script: s }).await;
    (backend, script)
}

/// One side's virtual host `<side>.retry.test`: single-endpoint service
/// `<side>` for the plain cases, two-endpoint `<side>-s` for sessions.
fn side_yaml(side: &str) -> String {
    let backoff = "backOff: { baseInterval: 0.01s, maxInterval: 0.1s }";
    let route = |case: &str, service: &str, extra: &str| {
        format!(
            "      - conditions: [{{ header: {{ name: x-case, exact: {case} }} }}]
        services: [{{ name: {service} }}]
{extra}"
        )
    };
    let mut routes = String::new();
    routes += &route(
        "retry",
        side,
        &format!(
            "        retryPolicy: {{ count: 3, retryOn: [unavailable, cancelled], {backoff} }}\n"
        ),
    );
    routes += &route(
        "cap",
        side,
        &format!("        retryPolicy: {{ count: 10, retryOn: [unavailable], {backoff} }}\n"),
    );
    routes += &route(
        "session",
        &format!("{side}-s"),
        &format!(
            "        retryPolicy: {{ count: 3, retryOn: [unavailable], {backoff} }}
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: grpc-session, path: /, ttl: 60s }}
"
        ),
    );
    format!(
        "  - name: {side}.retry.test
    routes:
{routes}      - services: [{{ name: {side} }}]
"
    )
}

fn yaml(t: &[&GrpcBackend; 2], c: &[&GrpcBackend; 2]) -> String {
    let service = |name: &str, backends: &[&GrpcBackend]| {
        let mut s = format!("  - name: {name}\n    protocol: h2c\n    endpoints:\n");
        for b in backends {
            s += &format!("      - address: \"{}\"\n", b.addr());
        }
        s
    };
    format!(
        "virtualhosts:\n{}{}services:\n{}{}{}{}",
        side_yaml("t"),
        side_yaml("c"),
        service("t", &[t[0]]),
        service("t-s", &t[..]),
        service("c", &[c[0]]),
        service("c-s", &c[..]),
    )
}

/// What one call came to.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    code: tonic::Code,
    backend: String,
    ms: u64,
    set_cookie: Option<String>,
}

async fn channel_call(
    channel: &Channel,
    case: &'static str,
    cookie: Option<&str>,
    size: usize,
) -> (Outcome, Option<u32>) {
    let mut client = EchoClient::new(channel.clone());
    let mut r = tonic::Request::new(EchoRequest {
        message: "x".repeat(size.max(1)),
    });
    r.set_timeout(Duration::from_secs(10));
    r.metadata_mut().insert("x-case", case.parse().unwrap());
    if let Some(c) = cookie {
        r.metadata_mut().insert("cookie", c.parse().unwrap());
    }
    let start = Instant::now();
    let result = client.echo(r).await;
    let ms = start.elapsed().as_millis() as u64;
    match result {
        Ok(reply) => {
            let attempts = reply.extensions().get::<Attempts>().map(|a| a.0);
            let set_cookie = reply
                .metadata()
                .get("set-cookie")
                .map(|v| v.to_str().unwrap().to_owned());
            (
                Outcome {
                    code: tonic::Code::Ok,
                    backend: reply.into_inner().backend,
                    ms,
                    set_cookie,
                },
                attempts,
            )
        }
        Err(s) => (
            Outcome {
                code: s.code(),
                backend: String::new(),
                ms,
                set_cookie: None,
            },
            None,
        ),
    }
}

async fn ccore_call(
    client: &grpcio::Client,
    case: &str,
    cookie: Option<&str>,
    size: usize,
) -> Outcome {
    let mut args: Vec<String> = vec![
        "--failures-ok".into(),
        "--metadata".into(),
        format!("x-case:{case}"),
        "--timeout".into(),
        "10".into(),
    ];
    if size > 0 {
        args.push("--message-size".into());
        args.push(size.to_string());
    }
    args.push("xds:///c.retry.test".into());
    args.push("1".into());
    if let Some(c) = cookie {
        args.push(c.into());
    }
    let calls = client.run(&args, None).await.unwrap();
    let c = &calls[0];
    let code = match c.code.as_str() {
        "OK" => tonic::Code::Ok,
        "UNAVAILABLE" => tonic::Code::Unavailable,
        "INTERNAL" => tonic::Code::Internal,
        other => panic!("C-core: unexpected code {other}: {c:?}"),
    };
    Outcome {
        code,
        backend: c.backend.clone(),
        ms: c.ms,
        set_cookie: c.set_cookie.first().cloned(),
    }
}

/// The cases, one after another, for one side: `call(case, cookie, size)`
/// makes one call; returns per case the outcome and what the backends saw.
async fn cases<F, Fut>(
    a: &Script,
    b: &Script,
    names: [&str; 2],
    call: F,
) -> Vec<(String, Outcome, Vec<Option<String>>, usize)>
where
    F: Fn(&'static str, Option<String>, usize) -> Fut,
    Fut: Future<Output = Outcome>,
{
    use tonic::Code::*;
    let mut out = Vec::new();
    let mut record = |name: &str, o: Outcome, seen: Vec<Option<String>>, other: usize| {
        out.push((name.to_owned(), o, seen, other));
    };
    // Retried twice, then answered.
    a.fail(2, Failure::Status(Unavailable));
    let o = call("retry", None, 0).await;
    record("retry", o, a.seen(), 0);
    // A code the policy does not name.
    a.fail(1, Failure::Status(Internal));
    let o = call("retry", None, 0).await;
    record("code not named", o, a.seen(), 0);
    // No policy on the route.
    a.fail(1, Failure::Status(Unavailable));
    let o = call("none", None, 0).await;
    record("no policy", o, a.seen(), 0);
    // count 10: five attempts at most.
    a.fail(100, Failure::Status(Unavailable));
    let o = call("cap", None, 0).await;
    record("capped", o, a.seen(), 0);
    // Pushback: exactly 400 ms instead of the 10 ms backoff.
    a.fail(1, Failure::Pushback("400"));
    let o = call("retry", None, 0).await;
    record("pushback 400", o, a.seen(), 0);
    // A negative pushback: no more retries.
    a.fail(1, Failure::Pushback("-1"));
    let o = call("retry", None, 0).await;
    record("pushback -1", o, a.seen(), 0);
    // Response headers came: committed.
    a.fail(1, Failure::AfterHeaders);
    let o = call("retry", None, 0).await;
    record("after headers", o, a.seen(), 0);
    // More than the 256 KiB retry buffer: committed.
    a.fail(1, Failure::Status(Unavailable));
    let o = call("retry", None, 300 * 1024).await;
    record("above the buffer", o, a.seen(), 0);
    a.fail(0, Failure::Status(Unavailable));
    // A session: the first call pins it, the pinned endpoint fails twice,
    // and every attempt stays on it.
    b.fail(0, Failure::Status(Unavailable));
    let first = call("session", None, 0).await;
    let cookie = first
        .set_cookie
        .clone()
        .unwrap_or_else(|| panic!("no session cookie: {first:?}"));
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let (pinned, other) = if first.backend == names[0] {
        (a, b)
    } else {
        (b, a)
    };
    pinned.fail(2, Failure::Status(Unavailable));
    other.fail(0, Failure::Status(Unavailable));
    let o = call("session", Some(cookie), 0).await;
    let pinned_name = first.backend.clone();
    let mut o = o;
    assert_eq!(o.backend, pinned_name, "the session moved: {o:?}");
    o.backend = "pinned".into();
    record("session", o, pinned.seen(), other.seen().len());
    pinned.fail(0, Failure::Status(Unavailable));
    out
}

/// `address -> (started, succeeded, failed)` of every subchannel in a
/// channel's stats (a subchannel shared by two clusters counted once).
fn subchannel_counts(
    v: &serde_json::Value,
    out: &mut std::collections::BTreeMap<String, (u64, u64, u64)>,
) {
    match v {
        serde_json::Value::Object(m) => {
            if let (Some(a), Some(s)) = (m.get("address"), m.get("calls_started")) {
                let n = |k: &str| m[k].as_u64().unwrap();
                out.insert(
                    a.as_str().unwrap().to_owned(),
                    (s.as_u64().unwrap(), n("calls_succeeded"), n("calls_failed")),
                );
            }
            m.values().for_each(|v| subchannel_counts(v, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| subchannel_counts(v, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_beside_c_core() {
    let Ok(python) = grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let (ta, ta_script) = scripted("t-a").await;
    let (tb, tb_script) = scripted("t-b").await;
    let (ca, ca_script) = scripted("c-a").await;
    let (cb, cb_script) = scripted("c-b").await;
    let control = Control::start(&yaml(&[&ta, &tb], &[&ca, &cb])).await;
    let dir = TempDir::new("retry");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("retry"));
    // gRPC's metrics too (A66, and A96's retry instruments turned on).
    let recorder = telemetry_support::Recorder::new();
    let mut telemetry = tether::Telemetry::builder(&recorder.provider);
    for m in tether::telemetry::OPTIONAL_METRICS {
        telemetry = telemetry.enable_metric(m).unwrap();
    }
    let channel = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&bootstrap).unwrap())
        .telemetry(telemetry.build())
        .connect("xds:///t.retry.test")
        .unwrap();
    let ccore = grpcio::Client::new(&python, &bootstrap);

    let attempts = Arc::new(Mutex::new(Vec::new()));
    let ours = {
        let channel = channel.clone();
        let attempts = attempts.clone();
        async move {
            cases(
                &ta_script,
                &tb_script,
                ["t-a", "t-b"],
                |case, cookie, size| {
                    let channel = channel.clone();
                    let attempts = attempts.clone();
                    async move {
                        let (o, n) = channel_call(&channel, case, cookie.as_deref(), size).await;
                        attempts.lock().unwrap().push((case, n));
                        o
                    }
                },
            )
            .await
        }
    };
    let theirs = cases(
        &ca_script,
        &cb_script,
        ["c-a", "c-b"],
        |case, cookie, size| {
            let ccore = ccore.clone();
            async move { ccore_call(&ccore, case, cookie.as_deref(), size).await }
        },
    );
    let (ours, theirs) = tokio::join!(ours, theirs);
    // Every attempt went through the pick's trackers: the subchannels'
    // counters (which outlier detection, least_request and circuit
    // breaking count the same way) saw each attempt, not each call.
    let stats = serde_json::to_value(channel.stats().await.unwrap()).unwrap();
    let mut counted = std::collections::BTreeMap::new();
    subchannel_counts(&stats, &mut counted);
    let attempts_seen: usize = ours.iter().map(|c| c.2.len()).sum::<usize>() + 1;
    let (started, succeeded, failed) =
        counted.values().fold((0, 0, 0), |t, c: &(u64, u64, u64)| {
            (t.0 + c.0, t.1 + c.1, t.2 + c.2)
        });
    println!("subchannels: {counted:?}");
    // (+1: the session's first call, which the cases do not list.)
    assert_eq!(started as usize, attempts_seen, "{counted:?}");
    assert_eq!((succeeded, failed), (4, started - 4), "{counted:?}");
    assert!(control.nacks_none(), "{}", control.stderr());
    metrics_of_the_cases(&recorder, attempts_seen as u64);

    use tonic::Code;
    let prev = |n: usize| -> Vec<Option<String>> {
        (0..n).map(|i| (i > 0).then(|| i.to_string())).collect()
    };
    // (case, final code, attempts' grpc-previous-rpc-attempts)
    let want: [(&str, tonic::Code, Vec<Option<String>>); 9] = [
        ("retry", Code::Ok, prev(3)),
        ("code not named", Code::Internal, prev(1)),
        ("no policy", Code::Unavailable, prev(1)),
        ("capped", Code::Unavailable, prev(5)),
        ("pushback 400", Code::Ok, prev(2)),
        ("pushback -1", Code::Unavailable, prev(1)),
        ("after headers", Code::Unavailable, prev(1)),
        ("above the buffer", Code::Unavailable, prev(1)),
        ("session", Code::Ok, prev(3)),
    ];
    for (who, list) in [("tether", &ours), ("C-core", &theirs)] {
        println!("{who}:");
        for (name, o, seen, other) in list.iter() {
            println!("  {name}: {o:?} seen {seen:?} other endpoint {other}");
        }
    }
    println!("tether's Attempts: {:?}", attempts.lock().unwrap());
    for (who, list) in [("tether", &ours), ("C-core", &theirs)] {
        assert_eq!(list.len(), want.len(), "{who}");
        for ((name, o, seen, other), (w_name, w_code, w_seen)) in list.iter().zip(&want) {
            assert_eq!(name, w_name);
            assert_eq!((o.code, seen), (*w_code, w_seen), "{who}: {name}: {o:?}");
            // The session's attempts all reached its endpoint.
            assert_eq!(*other, 0, "{who}: {name}");
        }
        let pushback = &list[4].1;
        assert!(
            pushback.ms >= 400,
            "{who}: the pushback was not waited: {pushback:?}"
        );
    }
    // The channel's Attempts extension, on answered calls: the retried
    // call 3, the pushed-back one 2, the session's first 1, its retried 3.
    let seen = attempts.lock().unwrap().clone();
    let answered: Vec<(&str, Option<u32>)> = [0, 4, 8, 9].iter().map(|i| seen[*i]).collect();
    assert_eq!(
        answered,
        [
            ("retry", Some(3)),
            ("retry", Some(2)),
            ("session", Some(1)),
            ("session", Some(3))
        ],
        "{seen:?}"
    );
    let _ = (&tb, &cb, &ca);
}

/// What the channel's telemetry recorded of the cases: every attempt, each
/// call by its final status, and (A96) the retries of the four calls that
/// retried (2, 4, 1 and 2), with the waits between their attempts, the
/// 400 ms pushback among them.
fn metrics_of_the_cases(recorder: &telemetry_support::Recorder, attempts: u64) {
    use telemetry_support::{labels, METHOD};
    let got = recorder.read();
    let base = [
        ("grpc.method", METHOD),
        ("grpc.target", "xds:///t.retry.test"),
    ];
    let started = &got["grpc.client.attempt.started"];
    assert_eq!(started.points[&labels(&base)].0, attempts, "{started:?}");
    let calls = &got["grpc.client.call.duration"];
    let by_status: Vec<(String, u64)> = calls
        .points
        .iter()
        .map(|(l, (n, _))| {
            let status = l.iter().find(|(k, _)| k == "grpc.status").unwrap();
            (status.1.clone(), *n)
        })
        .collect();
    assert_eq!(
        by_status,
        [
            ("INTERNAL".to_owned(), 1),
            ("OK".to_owned(), 4),
            ("UNAVAILABLE".to_owned(), 5)
        ],
        "{calls:?}"
    );
    let attempt_count: u64 = got["grpc.client.attempt.duration"]
        .points
        .values()
        .map(|(n, _)| n)
        .sum();
    assert_eq!(attempt_count, attempts);
    let retries = &got["grpc.client.call.retries"];
    assert_eq!(retries.unit, "{retry}");
    assert_eq!(retries.bounds, tether::telemetry::RETRY_BUCKETS);
    assert_eq!(retries.points[&labels(&base)], (4, 9.0), "{retries:?}");
    let delay = &got["grpc.client.call.retry_delay"];
    let (n, seconds) = delay.points[&labels(&base)];
    assert!(n == 4 && seconds >= 0.4, "{delay:?}");
    // No attempt went unseen: no transparent retry to record.
    assert!(
        !got.contains_key("grpc.client.call.transparent_retries"),
        "{:?}",
        got.get("grpc.client.call.transparent_retries")
    );
}
