//! gRPC's OpenTelemetry metrics (gRFC A66) from `tether::Channel`, read
//! back from the OpenTelemetry SDK's in-memory exporter: the instruments'
//! names, units, label keys and buckets, and the counts of real calls to
//! real tonic backends (OK, UNAVAILABLE, a deadline).

#[path = "channel_support/telemetry.rs"]
mod telemetry_support;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use telemetry_support::{labels, Recorder, METHOD};
use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
use tether::telemetry::{LATENCY_BUCKETS, SIZE_BUCKETS};
use tether::{Channel, Telemetry};
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};

async fn echo(channel: &Channel, message: &str) -> Result<usize, tonic::Status> {
    let mut client = EchoClient::new(channel.clone());
    let reply = client
        .echo(EchoRequest {
            message: message.into(),
        })
        .await?;
    Ok(reply.into_inner().encoded_len())
}

#[tokio::test]
async fn calls_and_attempts_are_counted_by_method_target_and_status() {
    let failing = Arc::new(AtomicBool::new(false));
    let backend = GrpcBackend::start_failing("a", failing.clone()).await;
    let recorder = Recorder::new();
    let telemetry = Telemetry::builder(&recorder.provider).build();
    let channel = Channel::builder()
        .telemetry(telemetry)
        .connect_static(
            StaticConfig::new("telemetry", vec![StaticEndpoint::new(backend.addr())])
                .with_policy(EndpointPolicy::RoundRobin),
        )
        .unwrap();
    let target = channel.target().to_owned();

    let request_len = EchoRequest {
        message: "hello".into(),
    }
    .encoded_len();
    let mut reply_len = 0;
    for _ in 0..3 {
        reply_len = echo(&channel, "hello").await.unwrap();
    }
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..2 {
        let e = echo(&channel, "hello").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
    }

    let got = recorder.read();
    let started = &got["grpc.client.attempt.started"];
    assert_eq!(started.unit, "{attempt}");
    let base = [("grpc.method", METHOD), ("grpc.target", target.as_str())];
    assert_eq!(started.points[&labels(&base)].0, 5, "{started:?}");

    let with = |status: &str| {
        let mut l = base.to_vec();
        l.push(("grpc.status", status));
        labels(&l)
    };
    for name in ["grpc.client.attempt.duration", "grpc.client.call.duration"] {
        let i = &got[name];
        assert_eq!(i.unit, "s", "{name}");
        assert_eq!(i.bounds, LATENCY_BUCKETS, "{name}");
        assert_eq!(i.points[&with("OK")].0, 3, "{name}: {i:?}");
        assert_eq!(i.points[&with("UNAVAILABLE")].0, 2, "{name}: {i:?}");
        assert_eq!(i.points.len(), 2, "{name}: {i:?}");
    }
    let sent = &got["grpc.client.attempt.sent_total_compressed_message_size"];
    assert_eq!(sent.unit, "By");
    assert_eq!(sent.bounds, SIZE_BUCKETS);
    // Message bytes, not the 5-byte gRPC prefixes.
    assert_eq!(
        sent.points[&with("OK")],
        (3, 3.0 * request_len as f64),
        "{sent:?}"
    );
    assert_eq!(
        sent.points[&with("UNAVAILABLE")],
        (2, 2.0 * request_len as f64)
    );
    let rcvd = &got["grpc.client.attempt.rcvd_total_compressed_message_size"];
    assert_eq!(rcvd.points[&with("OK")], (3, 3.0 * reply_len as f64));
    // A trailers-only failure carries no message.
    assert_eq!(rcvd.points[&with("UNAVAILABLE")], (2, 0.0));
}

#[tokio::test]
async fn a_deadline_and_a_dropped_call_are_recorded_with_their_status() {
    let slow = GrpcBackend::start_slow("slow", Duration::from_secs(30)).await;
    let recorder = Recorder::new();
    let channel = Channel::builder()
        .telemetry(Telemetry::builder(&recorder.provider).build())
        .connect_static(StaticConfig::new(
            "telemetry",
            vec![StaticEndpoint::new(slow.addr())],
        ))
        .unwrap();
    let target = channel.target().to_owned();
    let mut client = EchoClient::new(channel.clone());
    let mut request = tonic::Request::new(EchoRequest {
        message: "x".into(),
    });
    request.set_timeout(Duration::from_millis(200));
    let e = client.echo(request).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded);

    // The application gives up on a call: CANCELLED.
    let call = tokio::spawn({
        let channel = channel.clone();
        async move { echo(&channel, "y").await }
    });
    let served =
        tether_testkit::wait_until(Duration::from_secs(10), || async { slow.hits() >= 2 }).await;
    assert!(served, "the second call never reached the backend");
    call.abort();
    let _ = call.await;

    let got = recorder.read();
    let with = |status: &str| {
        labels(&[
            ("grpc.method", METHOD),
            ("grpc.target", target.as_str()),
            ("grpc.status", status),
        ])
    };
    let calls = &got["grpc.client.call.duration"];
    assert_eq!(calls.points[&with("DEADLINE_EXCEEDED")].0, 1, "{calls:?}");
    assert_eq!(calls.points[&with("CANCELLED")].0, 1, "{calls:?}");
    let (n, seconds) = calls.points[&with("DEADLINE_EXCEEDED")];
    assert!(n == 1 && (0.2..5.0).contains(&seconds), "{seconds}");
    let attempts = &got["grpc.client.attempt.duration"];
    assert_eq!(attempts.points[&with("DEADLINE_EXCEEDED")].0, 1);
    assert_eq!(attempts.points[&with("CANCELLED")].0, 1);
}

#[tokio::test]
async fn method_and_target_labels_stay_bounded_by_the_filters() {
    let backend = GrpcBackend::start("a").await;
    let recorder = Recorder::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let telemetry = Telemetry::builder(&recorder.provider)
        .target_attribute_filter(|_| false)
        .method_attribute_filter({
            let seen = seen.clone();
            move |m| {
                seen.lock().unwrap().push(m.to_owned());
                false
            }
        })
        .build();
    let channel = Channel::builder()
        .telemetry(telemetry)
        .connect(&format!("ipv4:{}", backend.addr()))
        .unwrap();
    for _ in 0..3 {
        echo(&channel, "x").await.unwrap();
    }
    let got = recorder.read();
    let started = &got["grpc.client.attempt.started"];
    assert_eq!(
        started.points[&labels(&[("grpc.method", "other"), ("grpc.target", "other")])].0,
        3,
        "{started:?}"
    );
    // Asked once per method, not once per call.
    assert_eq!(*seen.lock().unwrap(), [METHOD]);
}

#[tokio::test]
async fn a_globally_registered_telemetry_records_for_later_channels_only() {
    let backend = GrpcBackend::start("a").await;
    let before = Channel::builder()
        .connect(&format!("ipv4:{}", backend.addr()))
        .unwrap();
    let recorder = Recorder::new();
    Telemetry::builder(&recorder.provider)
        .build()
        .register_global();
    let after = Channel::builder()
        .connect(&format!("dns:///{}", backend.addr()))
        .unwrap();
    Telemetry::unregister_global();
    let unregistered = Channel::builder()
        .connect(&format!("ipv4:{}", backend.addr()))
        .unwrap();
    for channel in [&before, &after, &unregistered] {
        echo(channel, "x").await.unwrap();
    }
    let got = recorder.read();
    let started = &got["grpc.client.attempt.started"];
    let targets: Vec<&str> = started
        .points
        .keys()
        .flat_map(|l| l.iter().filter(|(k, _)| k == "grpc.target"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(targets, [format!("dns:///{}", backend.addr())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_calls_and_cookies_are_counted_by_what_became_of_the_session() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let recorder = Recorder::new();
    let cookie = tether_core::http::set_cookie::CookieSpec::new(
        "grpc-session",
        "/",
        Duration::from_secs(600),
        Vec::new(),
    )
    .unwrap();
    let channel = Channel::builder()
        .telemetry(Telemetry::builder(&recorder.provider).build())
        .default_service_config(r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#)
        .session_cookie(cookie)
        .connect(&format!("ipv4:{},{}", a.addr(), b.addr()))
        .unwrap();
    let target = channel.target().to_owned();
    let jar = tether::CookieJar::new();
    let mut client = EchoClient::new(channel.with_cookie_jar(jar.clone()));
    let call = |client: &mut EchoClient<Channel>| {
        let mut client = client.clone();
        async move {
            client
                .echo(EchoRequest {
                    message: "s".into(),
                })
                .await
                .map(|r| r.into_inner().backend)
        }
    };
    // A new session, then three calls it pins.
    let first = call(&mut client).await.unwrap();
    for _ in 0..3 {
        assert_eq!(call(&mut client).await.unwrap(), first);
    }
    // Its backend stops: the session moves once, with a fresh cookie.
    let (pinned, other) = if first == "a" { (a, b) } else { (b, a) };
    pinned.stop().await;
    let mut failed = 0;
    let moved = loop {
        match call(&mut client).await {
            Ok(backend) => break backend,
            Err(_) if failed < 50 => failed += 1,
            Err(e) => panic!("the session never moved: {e}"),
        }
    };
    assert_eq!(moved, other.name());
    // A cookie that names no session: refused, and a new one is written.
    let mut garbage = tonic::Request::new(EchoRequest {
        message: "g".into(),
    });
    garbage
        .metadata_mut()
        .insert("cookie", "grpc-session=not-a-session".parse().unwrap());
    EchoClient::new(channel.clone())
        .echo(garbage)
        .await
        .unwrap();

    let got = recorder.read();
    let of = |name: &str, key: &str| -> Vec<(String, u64)> {
        got[name]
            .points
            .iter()
            .map(|(labels, (n, _))| {
                assert!(labels.contains(&("grpc.target".to_owned(), target.clone())));
                let v = labels.iter().find(|(k, _)| k == key).unwrap();
                (v.1.clone(), *n)
            })
            .collect()
    };
    let n = |pairs: &[(&str, u64)]| -> Vec<(String, u64)> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    assert_eq!(
        of("tether.client.session.calls", "tether.session.call"),
        n(&[("moved", 1), ("new", 1), ("pinned", 3), ("refused", 1)])
    );
    assert_eq!(
        of("tether.client.session.cookies", "tether.session.cookie"),
        n(&[("moved", 1), ("new", 2)])
    );
    assert_eq!(got["tether.client.session.calls"].unit, "{call}");
    assert!(!got.contains_key("tether.client.session.envoy_misreads"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subchannel_instruments_count_connections_and_why_they_ended() {
    // Connections the backend ends gracefully (GOAWAY NO_ERROR) at 200 ms.
    let (backend, goaways) = GrpcBackend::start_rotating("a", Duration::from_millis(200)).await;
    let recorder = Recorder::new();
    let mut telemetry = Telemetry::builder(&recorder.provider);
    for m in tether::telemetry::OPTIONAL_METRICS
        .iter()
        .filter(|m| m.starts_with("grpc.subchannel."))
    {
        telemetry = telemetry.enable_metric(m).unwrap();
    }
    let telemetry = telemetry.build();
    let serving = Channel::builder()
        .telemetry(telemetry.clone())
        .connect(&format!("ipv4:{}", backend.addr()))
        .unwrap();
    echo(&serving, "x").await.unwrap();
    // Nothing listens here: the attempt fails.
    let nobody = format!("ipv4:127.0.0.1:{}", tether_testkit::free_port());
    let refused = Channel::builder()
        .telemetry(telemetry)
        .connect(&nobody)
        .unwrap();
    assert!(echo(&refused, "x").await.is_err());

    let serving_target = serving.target().to_owned();
    let started = std::time::Instant::now();
    let got = loop {
        let got = recorder.read();
        let ended = got
            .get("grpc.subchannel.disconnections")
            .and_then(|i| {
                i.points.get(&labels(&[
                    ("grpc.disconnect_error", "GOAWAY NO_ERROR"),
                    ("grpc.target", &serving_target),
                ]))
            })
            .is_some_and(|(n, _)| *n >= 1);
        if ended {
            break got;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no graceful disconnection recorded ({} GOAWAYs sent): {got:#?}",
            goaways.load(std::sync::atomic::Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let of = |name: &str, target: &str| -> u64 {
        got[name].points[&labels(&[("grpc.target", target)])].0
    };
    assert_eq!(
        got["grpc.subchannel.connection_attempts_succeeded"].unit,
        "{attempt}"
    );
    assert!(
        of(
            "grpc.subchannel.connection_attempts_succeeded",
            &serving_target
        ) >= 1
    );
    assert!(
        of(
            "grpc.subchannel.connection_attempts_failed",
            refused.target()
        ) >= 1
    );
    // The up-down counter: connections opened less those that ended.
    let open = &got["grpc.subchannel.open_connections"];
    assert_eq!(open.unit, "{connection}");
    let succeeded = of(
        "grpc.subchannel.connection_attempts_succeeded",
        &serving_target,
    );
    let disconnections: u64 = got["grpc.subchannel.disconnections"]
        .points
        .iter()
        .filter(|(l, _)| l.contains(&("grpc.target".to_owned(), serving_target.clone())))
        .map(|(_, (n, _))| n)
        .sum();
    let open_now = open.points[&labels(&[("grpc.target", &serving_target)])].0;
    assert!(open_now <= 1, "{open:?}");
    assert_eq!(
        open_now,
        succeeded - disconnections,
        "open = succeeded - disconnections: {got:#?}"
    );
}
