//! One ADS stream per xDS server for the whole process
//! (`XdsClientScope::Process`), against a server that keeps one stream per
//! client, as Istio's agent did: when a newer stream opens, the older one
//! is ended. Channels to several targets share the process's XdsClient, so
//! one stream carries all their resources and every channel works. With
//! gRPC C-core's scope (one client a target, the default) the two
//! clients make the server end one stream after another, each reopening
//! at once.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tether::channel::XdsClientScope;
use tether::xds::client::ClientOptions;
use tether::xds::{Bootstrap, XdsClient};
use tether::Channel;
use tether_control::server::AdsService;
use tether_control::{translate, Config, ControlPlane};
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// ADS with one stream at a time: a newer stream ends the older one.
#[derive(Clone)]
struct OneStream {
    inner: AdsService,
    /// The newest stream's number.
    newest: watch::Sender<u64>,
    opened: Arc<AtomicU64>,
}

/// A stream that ends with UNAVAILABLE once a newer one opened.
struct Replaceable {
    inner: BoxStream<DiscoveryResponse>,
    replaced: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    done: bool,
}

impl Stream for Replaceable {
    type Item = Result<DiscoveryResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.replaced.as_mut().poll(cx).is_ready() {
            self.done = true;
            return Poll::Ready(Some(Err(Status::unavailable(
                "a newer stream from this client replaced this one",
            ))));
        }
        self.inner.as_mut().poll_next(cx)
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for OneStream {
    type StreamAggregatedResourcesStream = BoxStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mine = self.opened.fetch_add(1, Ordering::SeqCst) + 1;
        self.newest.send_replace(mine);
        let mut newest = self.newest.subscribe();
        let inner = self
            .inner
            .stream_aggregated_resources(request)
            .await?
            .into_inner();
        let replaced = Box::pin(async move {
            while *newest.borrow_and_update() == mine {
                if newest.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        });
        Ok(Response::new(Box::pin(Replaceable {
            inner,
            replaced,
            done: false,
        })))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

fn yaml(a: &GrpcBackend, b: &GrpcBackend) -> String {
    format!(
        r#"virtualhosts:
  - name: a.tether.test
    routes:
      - services: [{{ name: a }}]
  - name: b.tether.test
    routes:
      - services: [{{ name: b }}]
services:
  - name: a
    protocol: h2c
    endpoints:
      - address: "{}"
  - name: b
    protocol: h2c
    endpoints:
      - address: "{}"
"#,
        a.addr(),
        b.addr()
    )
}

/// Serves `plane` with one stream at a time; the count of streams opened.
async fn serve(plane: &ControlPlane) -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opened = Arc::new(AtomicU64::new(0));
    let service = OneStream {
        inner: plane.ads_service(),
        newest: watch::channel(0).0,
        opened: opened.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(service))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (addr, opened)
}

fn bootstrap(addr: std::net::SocketAddr) -> Bootstrap {
    Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{addr}","channel_creds":[{{"type":"insecure"}}],"server_features":["xds_v3"]}}],"node":{{"id":"sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local","metadata":{{"GENERATOR":"grpc"}}}}}}"#
    ))
    .unwrap()
}

async fn echo(channel: &Channel) -> Result<String, Status> {
    let mut r = Request::new(EchoRequest {
        message: "hi".into(),
    });
    r.set_timeout(Duration::from_secs(5));
    Ok(EchoClient::new(channel.clone())
        .echo(r)
        .await?
        .into_inner()
        .backend)
}

/// Waits until no XdsClient is left: the channels' tasks end (an abort
/// takes effect on the runtime, not at the drop), and with them the last
/// holders of their clients.
async fn gone() {
    let start = tokio::time::Instant::now();
    while !XdsClient::all().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "clients outlived their channels"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_share_one_stream_to_a_server_that_keeps_one() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let plane = ControlPlane::new(translate(&Config::parse(&yaml(&a, &b)).unwrap()));
    let (addr, opened) = serve(&plane).await;

    // Process scope: one client, one stream, both targets work.
    let shared = |target: &str| {
        Channel::builder()
            .bootstrap(bootstrap(addr))
            .xds_client_scope(XdsClientScope::Process)
            .connect(target)
            .unwrap()
    };
    let ca = shared("xds:///a.tether.test");
    assert_eq!(echo(&ca).await.unwrap(), "a");
    let cb = shared("xds:///b.tether.test");
    assert_eq!(echo(&cb).await.unwrap(), "b");
    assert_eq!(XdsClient::all().len(), 1, "one client in the process");
    // Calls on both for a while: the one stream stays.
    for _ in 0..20 {
        assert_eq!(echo(&ca).await.unwrap(), "a");
        assert_eq!(echo(&cb).await.unwrap(), "b");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(opened.load(Ordering::SeqCst), 1, "streams opened");
    // A channel dropped releases its watches; the other keeps working and
    // a new target joins the same stream.
    drop(cb);
    let cb = shared("xds:///b.tether.test");
    assert_eq!(echo(&cb).await.unwrap(), "b");
    assert_eq!(echo(&ca).await.unwrap(), "a");
    assert_eq!(opened.load(Ordering::SeqCst), 1, "streams opened");
    drop((ca, cb));
    gone().await;

    // C-core's scope, the default: a client per target; each new stream
    // ends the other's, which opens again at once, and so on.
    let own = |target: &str| {
        Channel::builder()
            .bootstrap(bootstrap(addr))
            .connect(target)
            .unwrap()
    };
    let before = opened.load(Ordering::SeqCst);
    let (ca, cb) = (own("xds:///a.tether.test"), own("xds:///b.tether.test"));
    // A second channel to a target shares that target's client.
    let ca2 = own("xds:///a.tether.test");
    let scopes: Vec<String> = XdsClient::all()
        .iter()
        .map(|c| c.client_scope().to_owned())
        .collect();
    assert_eq!(scopes, ["xds:/a.tether.test", "xds:/b.tether.test"]);
    let start = tokio::time::Instant::now();
    while opened.load(Ordering::SeqCst) < before + 10 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "two clients did not fight: {} streams",
            opened.load(Ordering::SeqCst) - before
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "two clients of their own opened {} streams in {:?}",
        opened.load(Ordering::SeqCst) - before,
        start.elapsed()
    );
    drop((ca, ca2, cb));
    gone().await;
    // A client of its own, made by hand, is listed too (empty scope).
    let own = XdsClient::start_with(bootstrap(addr), ClientOptions::default()).unwrap();
    assert_eq!(XdsClient::all().len(), 1);
    assert_eq!(own.client_scope(), "");
}
