//! Fault injection (gRFC A33) beside gRPC C-core on the same control plane:
//! tether-control gives the listener an empty fault filter (as istiod does)
//! and routes override it with aborts, delays, header-controlled faults and
//! `max_active_faults`; the channel and grpcio make the same calls and must
//! see the same statuses, messages and delays, and an aborted call never
//! reaches the backend.
//!
//! One test: `max_active_faults` counts the calls of the whole process in a
//! delay, so the channel's cases run one after another (grpcio's, in
//! processes of their own, run beside them).

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;

use std::time::Duration;

use control_support::{Control, TempDir};
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::grpcio;
use tokio::time::Instant;

const HOST: &str = "fault.tether.test";

fn yaml(backend: &GrpcBackend) -> String {
    let route = |case: &str, fault: &str| {
        format!(
            "      - conditions: [{{ header: {{ name: x-case, exact: {case} }} }}]
        services: [{{ name: echo }}]
        fault: {fault}
"
        )
    };
    let mut routes = String::new();
    for (case, fault) in [
        ("abort", "{ abort: { grpcStatus: 14, percent: 100 } }"),
        ("http", "{ abort: { httpStatus: 404, percent: 100 } }"),
        ("delay", "{ delay: { fixed: 0.3s, percent: 100 } }"),
        (
            "header",
            "{ delay: { header: true, percent: 100 }, abort: { header: true, percent: 100 } }",
        ),
        (
            "max",
            "{ delay: { fixed: 1s, percent: 100 }, maxActiveFaults: 2 }",
        ),
        ("half", "{ abort: { grpcStatus: 8, percent: 50 } }"),
    ] {
        routes.push_str(&route(case, fault));
    }
    format!(
        r#"virtualhosts:
  - name: {HOST}
    fault: {{ abort: {{ grpcStatus: 9, percent: 100 }} }}
    routes:
{routes}      - services: [{{ name: echo }}]
  - name: plain.tether.test
    routes:
      - services: [{{ name: echo }}]
services:
  - name: echo
    protocol: h2c
    endpoints:
      - address: "{}"
"#,
        backend.addr()
    )
}

/// One call's outcome: the status code's name as C-core prints it, the
/// message, and how long it took.
#[derive(Debug, Clone)]
struct Outcome {
    code: String,
    message: String,
    ms: u64,
}

fn code_name(code: tonic::Code) -> String {
    // C-core's names: SCREAMING_SNAKE_CASE of tonic's variants.
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

async fn channel_call(
    channel: &Channel,
    metadata: &[(&'static str, &'static str)],
    timeout: Duration,
) -> Outcome {
    let mut client = EchoClient::new(channel.clone());
    let mut r = tonic::Request::new(EchoRequest {
        message: "hi".into(),
    });
    r.set_timeout(timeout);
    for (k, v) in metadata {
        r.metadata_mut().insert(*k, v.parse().unwrap());
    }
    let start = Instant::now();
    let result = client.echo(r).await;
    let ms = start.elapsed().as_millis() as u64;
    match result {
        Ok(_) => Outcome {
            code: "OK".into(),
            message: String::new(),
            ms,
        },
        Err(s) => Outcome {
            code: code_name(s.code()),
            message: s.message().to_owned(),
            ms,
        },
    }
}

/// grpcio's calls with `metadata`, `calls` of them from `concurrency`
/// threads, each with a deadline of `timeout_s`.
async fn ccore(
    client: &grpcio::Client,
    target: &str,
    metadata: &[(&str, &str)],
    calls: usize,
    concurrency: usize,
    timeout_s: u64,
) -> Vec<Outcome> {
    let mut args: Vec<String> = vec![
        "--failures-ok".into(),
        "--timeout".into(),
        timeout_s.to_string(),
    ];
    for (k, v) in metadata {
        args.push("--metadata".into());
        args.push(format!("{k}:{v}"));
    }
    if concurrency > 1 {
        args.push("--concurrency".into());
        args.push(concurrency.to_string());
    }
    args.push(target.into());
    args.push(calls.to_string());
    client
        .run(&args, None)
        .await
        .unwrap()
        .into_iter()
        .map(|c| Outcome {
            code: c.code,
            message: c.message,
            ms: c.ms,
        })
        .collect()
}

/// Waits until the channel routes (the plain host answers).
async fn ready(channel: &Channel) {
    for _ in 0..200 {
        if channel_call(channel, &[("x-case", "none")], Duration::from_secs(5))
            .await
            .code
            != "UNAVAILABLE"
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the channel never routed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_beside_c_core() {
    let Ok(python) = grpcio::python_or_install(None).await else {
        panic!("grpcio is needed (scripts/setup.sh installs it)");
    };
    let backend = GrpcBackend::start("echo").await;
    let control = Control::start(&yaml(&backend)).await;
    let dir = TempDir::new("fault");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("fault"));
    let channel = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&bootstrap).unwrap())
        .connect(&format!("xds:///{HOST}"))
        .unwrap();
    let plain = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&bootstrap).unwrap())
        .connect("xds:///plain.tether.test")
        .unwrap();
    let ccore_client = grpcio::Client::new(&python, &bootstrap);
    let target = format!("xds:///{HOST}");

    // grpcio's runs, beside the channel's cases.
    let c_runs = {
        let c = ccore_client.clone();
        let target = target.clone();
        tokio::spawn(async move {
            let t = target.as_str();
            let plain = ccore(&c, "xds:///plain.tether.test", &[], 3, 1, 20).await;
            let abort = ccore(&c, t, &[("x-case", "abort")], 3, 1, 20).await;
            let http = ccore(&c, t, &[("x-case", "http")], 3, 1, 20).await;
            let vh = ccore(&c, t, &[("x-case", "none")], 3, 1, 20).await;
            let delay = ccore(&c, t, &[("x-case", "delay")], 3, 1, 20).await;
            let h_none = ccore(&c, t, &[("x-case", "header")], 2, 1, 20).await;
            let h_abort = ccore(
                &c,
                t,
                &[
                    ("x-case", "header"),
                    ("x-envoy-fault-abort-grpc-request", "8"),
                ],
                2,
                1,
                20,
            )
            .await;
            let h_zero = ccore(
                &c,
                t,
                &[
                    ("x-case", "header"),
                    ("x-envoy-fault-abort-grpc-request", "8"),
                    ("x-envoy-fault-abort-percentage", "0"),
                ],
                2,
                1,
                20,
            )
            .await;
            let h_text = ccore(
                &c,
                t,
                &[
                    ("x-case", "header"),
                    ("x-envoy-fault-abort-grpc-request", "eight"),
                ],
                2,
                1,
                20,
            )
            .await;
            let h_delay = ccore(
                &c,
                t,
                &[("x-case", "header"), ("x-envoy-fault-delay-request", "200")],
                2,
                1,
                20,
            )
            .await;
            let h_deadline = ccore(
                &c,
                t,
                &[
                    ("x-case", "header"),
                    ("x-envoy-fault-delay-request", "5000"),
                ],
                1,
                1,
                1,
            )
            .await;
            let max = ccore(&c, t, &[("x-case", "max")], 6, 6, 20).await;
            let half = ccore(&c, t, &[("x-case", "half")], 200, 4, 20).await;
            let h_http = ccore(
                &c,
                t,
                &[("x-case", "header"), ("x-envoy-fault-abort-request", "503")],
                2,
                1,
                20,
            )
            .await;
            [
                plain, abort, http, vh, delay, h_none, h_abort, h_zero, h_text, h_delay,
                h_deadline, max, half, h_http,
            ]
        })
    };

    ready(&plain).await;
    ready(&channel).await;
    let ten = Duration::from_secs(10);
    let run = |metadata: &'static [(&'static str, &'static str)], n: usize, timeout: Duration| {
        let channel = channel.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(channel_call(&channel, metadata, timeout).await);
            }
            out
        }
    };
    let plain_out = {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(channel_call(&plain, &[], ten).await);
        }
        out
    };
    let before = backend.hits();
    let abort = run(&[("x-case", "abort")], 3, ten).await;
    let http = run(&[("x-case", "http")], 3, ten).await;
    let vh = run(&[("x-case", "none")], 3, ten).await;
    // Aborted calls never reach the backend.
    let after_aborts = backend.hits();
    let delay = run(&[("x-case", "delay")], 3, ten).await;
    let h_none = run(&[("x-case", "header")], 2, ten).await;
    let h_abort = run(
        &[
            ("x-case", "header"),
            ("x-envoy-fault-abort-grpc-request", "8"),
        ],
        2,
        ten,
    )
    .await;
    let h_zero = run(
        &[
            ("x-case", "header"),
            ("x-envoy-fault-abort-grpc-request", "8"),
            ("x-envoy-fault-abort-percentage", "0"),
        ],
        2,
        ten,
    )
    .await;
    let h_text = run(
        &[
            ("x-case", "header"),
            ("x-envoy-fault-abort-grpc-request", "eight"),
        ],
        2,
        ten,
    )
    .await;
    let h_delay = run(
        &[("x-case", "header"), ("x-envoy-fault-delay-request", "200")],
        2,
        ten,
    )
    .await;
    let h_deadline = run(
        &[
            ("x-case", "header"),
            ("x-envoy-fault-delay-request", "5000"),
        ],
        1,
        Duration::from_secs(1),
    )
    .await;
    let max = {
        let calls: Vec<_> = (0..6)
            .map(|_| {
                let channel = channel.clone();
                tokio::spawn(async move { channel_call(&channel, &[("x-case", "max")], ten).await })
            })
            .collect();
        let mut out = Vec::new();
        for c in calls {
            out.push(c.await.unwrap());
        }
        out
    };
    let half = {
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let channel = channel.clone();
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    for _ in 0..50 {
                        out.push(channel_call(&channel, &[("x-case", "half")], ten).await);
                    }
                    out
                })
            })
            .collect();
        let mut out = Vec::new();
        for c in calls {
            out.extend(c.await.unwrap());
        }
        out
    };
    let h_http = run(
        &[("x-case", "header"), ("x-envoy-fault-abort-request", "503")],
        2,
        ten,
    )
    .await;
    let ours = [
        plain_out, abort, http, vh, delay, h_none, h_abort, h_zero, h_text, h_delay, h_deadline,
        max, half, h_http,
    ];
    let theirs = c_runs.await.unwrap();
    assert_eq!(before, after_aborts, "aborted calls reached the backend");
    assert!(control.nacks_none(), "{}", control.stderr());

    let names = [
        "plain host",
        "abort 14",
        "http 404",
        "virtual host's abort",
        "fixed delay",
        "header route, no headers",
        "header abort 8",
        "header abort at 0 %",
        "header abort not a number",
        "header delay 200 ms",
        "header delay past the deadline",
        "max_active_faults 2",
        "abort at 50 %",
        "HTTP abort header (not read)",
    ];
    for ((name, ours), theirs) in names.iter().zip(&ours).zip(&theirs) {
        println!("{name}:\n  tether: {ours:?}\n  C-core: {theirs:?}");
    }
    // Every case: the same (code, message) for each call, on both clients.
    let same = |i: usize, code: &str, message: &str| {
        for (who, list) in [("tether", &ours[i]), ("C-core", &theirs[i])] {
            assert!(!list.is_empty(), "{}: {who} made no calls", names[i]);
            for o in list.iter() {
                assert_eq!(
                    (o.code.as_str(), o.message.as_str()),
                    (code, message),
                    "{}: {who}: {list:?}",
                    names[i]
                );
            }
        }
    };
    let all = |i: usize, f: &dyn Fn(&Outcome) -> bool, what: &str| {
        for (who, list) in [("tether", &ours[i]), ("C-core", &theirs[i])] {
            assert!(list.iter().all(f), "{}: {who}: {what}: {list:?}", names[i]);
        }
    };
    same(0, "OK", "");
    same(1, "UNAVAILABLE", "Fault injected");
    same(2, "UNIMPLEMENTED", "Fault injected");
    same(3, "FAILED_PRECONDITION", "Fault injected");
    same(4, "OK", "");
    all(4, &|o| o.ms >= 300, "delayed 300 ms");
    same(5, "OK", "");
    same(6, "RESOURCE_EXHAUSTED", "Fault injected");
    same(7, "OK", "");
    // Not a number: UNKNOWN (C-core's reading; A33 says ignored).
    same(8, "UNKNOWN", "Fault injected");
    same(9, "OK", "");
    all(9, &|o| o.ms >= 200, "delayed 200 ms");
    for (who, list) in [("tether", &ours[10]), ("C-core", &theirs[10])] {
        let o = &list[0];
        assert_eq!(o.code, "DEADLINE_EXCEEDED", "{who}: {o:?}");
        assert!((900..3000).contains(&o.ms), "{who}: {o:?}");
    }
    // max_active_faults 2: of six calls at once, two are delayed a second
    // and four pass at once (and none is aborted).
    same(11, "OK", "");
    for (who, list) in [("tether", &ours[11]), ("C-core", &theirs[11])] {
        let delayed = list.iter().filter(|o| o.ms >= 1000).count();
        let fast = list.iter().filter(|o| o.ms < 900).count();
        assert_eq!((delayed, fast), (2, 4), "{who}: {list:?}");
    }
    same(13, "OK", "");
    // 50 %: each call rolls its own dice.
    for (who, list) in [("tether", &ours[12]), ("C-core", &theirs[12])] {
        assert_eq!(list.len(), 200, "{who}");
        let aborted = list
            .iter()
            .filter(|o| o.code == "RESOURCE_EXHAUSTED" && o.message == "Fault injected")
            .count();
        let ok = list.iter().filter(|o| o.code == "OK").count();
        assert_eq!(aborted + ok, 200, "{who}: {list:?}");
        // Six standard deviations of a fair coin's 200 throws.
        assert!(
            (58..=142).contains(&aborted),
            "{who}: {aborted} of 200 aborted"
        );
    }
}
