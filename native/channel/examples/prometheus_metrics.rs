//! gRPC's standard metrics (gRFC A66) and tether's session metrics from
//! `tether::Channel`, exported to Prometheus: the OpenTelemetry SDK with the
//! Prometheus exporter, served at `http://LISTEN/metrics`.
//!
//! ```sh
//! # Each TARGET gets a channel (session cookie on, round robin) and
//! # --calls Echo calls in one cookie jar; then the process keeps serving
//! # /metrics until interrupted.
//! cargo run -p tether --example prometheus_metrics -- \
//!     --listen 127.0.0.1:9464 --calls 10 ipv4:127.0.0.1:50051,127.0.0.1:50052
//! # xds:/// targets read the bootstrap from GRPC_XDS_BOOTSTRAP, as gRPC does.
//! ```
//!
//! Prometheus sees the instruments with dots as underscores and units as
//! suffixes: `grpc_client_call_duration_seconds_count{grpc_status="OK"}`,
//! `grpc_client_attempt_started_total`, `tether_client_session_calls_total`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use prometheus::{Encoder, Registry, TextEncoder};
use tether::{Channel, CookieJar, Telemetry};
use tether_core::http::set_cookie::CookieSpec;
use tether_proto::demo::v1::echo_client::EchoClient;
use tether_proto::demo::v1::EchoRequest;

/// The command line: `[--listen ADDR] [--calls N] TARGET...`.
struct Args {
    listen: SocketAddr,
    calls: u32,
    targets: Vec<String>,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        listen: "127.0.0.1:9464".parse().expect("default address"),
        calls: 10,
        targets: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--listen" => {
                let v = it.next().ok_or("--listen: an address is needed")?;
                out.listen = v.parse().map_err(|e| format!("--listen {v}: {e}"))?;
            }
            "--calls" => {
                let v = it.next().ok_or("--calls: a number is needed")?;
                out.calls = v.parse().map_err(|e| format!("--calls {v}: {e}"))?;
            }
            _ => out.targets.push(a),
        }
    }
    if out.targets.is_empty() {
        return Err("usage: prometheus_metrics [--listen ADDR] [--calls N] TARGET...".into());
    }
    Ok(out)
}

/// Serves `registry` as Prometheus text on `listener`, one connection at a time
/// per task.
async fn serve(listener: tokio::net::TcpListener, registry: Registry) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_request| {
                let mut body = Vec::new();
                let encoder = TextEncoder::new();
                if let Err(e) = encoder.encode(&registry.gather(), &mut body) {
                    eprintln!("prometheus_metrics: encoding the metrics: {e}");
                }
                let response = hyper::Response::builder()
                    .header("content-type", encoder.format_type())
                    .body(Full::new(Bytes::from(body)))
                    .expect("a response");
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let registry = Registry::new();
    let exporter = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .build()?;
    let provider = SdkMeterProvider::builder().with_reader(exporter).build();
    let telemetry = Telemetry::builder(&provider).build();

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("metrics at http://{}/metrics", listener.local_addr()?);
    tokio::spawn(serve(listener, registry));

    let cookie = CookieSpec::new("grpc-session", "/", Duration::from_secs(600), Vec::new())
        .map_err(|e| e.to_string())?;
    // Kept while the metrics are served: a channel's sessions
    // (`tether.client.sessions`) are observed while it lives.
    let mut channels = Vec::new();
    for target in &args.targets {
        let mut builder = Channel::builder().telemetry(telemetry.clone());
        if !target.starts_with("xds:") {
            builder = builder
                .default_service_config(r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#)
                .session_cookie(cookie.clone());
        }
        let channel = builder.connect(target)?;
        let mut client = EchoClient::new(channel.with_cookie_jar(CookieJar::new()));
        channels.push(channel);
        for i in 0..args.calls {
            let request = tonic::Request::new(EchoRequest {
                message: format!("call {i}"),
            });
            match client.echo(request).await {
                Ok(reply) => println!("{target}: call {i}: {}", reply.into_inner().backend),
                Err(status) => println!("{target}: call {i}: {:?}", status.code()),
            }
        }
    }
    println!("calls done; serving /metrics until interrupted");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
