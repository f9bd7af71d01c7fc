//! A stream keeps its cluster in the LB tree until it ends: a call whose
//! response headers arrived but whose body is still coming holds its
//! cluster even after the routes stop naming it (the real `tether-control`
//! binary moves the route to another service); the cluster leaves the tree
//! only once the stream is over.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use control_support::{Control, TempDir};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tokio::sync::mpsc;
use tower_service::Service;

fn yaml(service: &str, first: SocketAddr, second: SocketAddr) -> String {
    format!(
        r#"virtualhosts:
  - name: stream.tether.test
    routes:
      - services: [{{ name: {service} }}]
services:
  - name: first
    protocol: h2c
    endpoints:
      - address: "{first}"
  - name: second
    protocol: h2c
    endpoints:
      - address: "{second}"
"#
    )
}

type Frames = mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

/// An HTTP/2 server whose every response is headers at once, then the
/// frames the test sends on the channel it hands out, one per request.
async fn held_server() -> (SocketAddr, mpsc::UnboundedReceiver<Frames>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (streams_tx, streams_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let streams_tx = streams_tx.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let _ = streams_tx.send(tx);
                    let body =
                        StreamBody::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
                    let response = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body)
                        .unwrap();
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
            });
        }
    });
    (addr, streams_rx)
}

/// Whether the channel's tree has a `cds` node for `cluster`.
async fn has_cluster(channel: &Channel, cluster: &str) -> bool {
    let stats = tokio::time::timeout(Duration::from_secs(10), channel.stats())
        .await
        .expect("stats within 10 s")
        .expect("the channel answers");
    fn walk(n: &tether::lb::PolicyStats, cluster: &str) -> bool {
        (n.policy == "cds" && n.name.as_deref() == Some(cluster))
            || n.children.iter().any(|c| walk(c, cluster))
    }
    walk(&stats.tree, cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_keeps_its_cluster_until_it_ends() {
    let (first, mut streams) = held_server().await;
    let second = GrpcBackend::start("second").await;
    let control = Control::start(&yaml("first", first, second.addr())).await;
    let dir = TempDir::new("streams");
    let bootstrap = dir.bootstrap(&control.bootstrap_json("streams"));
    let mut channel = Channel::builder()
        .bootstrap(tether::xds::Bootstrap::from_file(&bootstrap).unwrap())
        .wait_for_ready(true)
        .connect("xds:///stream.tether.test")
        .unwrap();

    // A call to `first`: its headers come back, its body is held.
    let request = http::Request::builder()
        .uri("http://stream.tether.test/tether.demo.v1.Echo/Echo")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::empty())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), channel.call(request))
        .await
        .expect("the response headers within 10 s")
        .unwrap();
    assert_eq!(response.status(), 200);
    let frames = tokio::time::timeout(Duration::from_secs(10), streams.recv())
        .await
        .expect("the server got the call within 10 s")
        .expect("the server holds the stream");
    assert!(has_cluster(&channel, "first").await);

    // The routes move to `second`: a new call lands there once the channel
    // has the new route table.
    control.write(&yaml("second", first, second.addr()));
    let client = EchoClient::new(channel.clone());
    let moved = tether_testkit::wait_until(Duration::from_secs(10), || {
        let mut client = client.clone();
        async move {
            // Held by `first` while the route still goes there: bounded.
            let mut request = tonic::Request::new(EchoRequest {
                message: "x".into(),
            });
            request.set_timeout(Duration::from_millis(500));
            let reply = client.echo(request).await;
            reply.is_ok_and(|r| r.into_inner().backend == "second")
        }
    })
    .await;
    assert!(moved, "the route never moved to second");

    // No route names `first`, but the stream is still open: its cluster
    // stays, with the stream's connection.
    assert!(
        has_cluster(&channel, "first").await,
        "the cluster went while a stream on it was open"
    );

    // The stream ends: then the cluster goes.
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    frames.send(Ok(Frame::trailers(trailers))).unwrap();
    drop(frames);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the stream ends well");
    assert_eq!(
        body.trailers().and_then(|t| t.get("grpc-status")),
        Some(&"0".parse().unwrap())
    );
    let gone = tether_testkit::wait_until(Duration::from_secs(10), || {
        let channel = channel.clone();
        async move { !has_cluster(&channel, "first").await }
    })
    .await;
    assert!(gone, "the cluster stayed after its last stream ended");
    assert!(control.nacks_none(), "{}", control.stderr());
}
