//! The cookie jar against a real tonic server that sets cookies: as a layer
//! over `tether::Channel` and over a plain `tonic::transport::Channel`, and
//! inside a `tether::Channel` handle (`with_cookie_jar`): the
//! cookies a reply sets come back on later calls, a `Max-Age=0` cookie
//! deletes, and an error (a trailers-only response) stores its cookies too.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
use tether::session::{CookieJar, CookieJarLayer, Layer};
use tether::Channel;
use tether_proto::demo::v1::echo_client::EchoClient;
use tether_proto::demo::v1::echo_server::{Echo, EchoServer};
use tether_proto::demo::v1::{EchoReply, EchoRequest};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codegen::{Body, Bytes, StdError};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request, Response, Status};

/// Echo that manages a session cookie `s` and answers with the `cookie`
/// metadata it received (in the reply's message, or the error's message).
/// - a call without `s` gets `s=<call number>; Path=/; Max-Age=60`;
/// - `logout` deletes `s`;
/// - `fail` fails (trailers-only) setting `t=2` with no Path.
struct CookieEcho {
    calls: AtomicU64,
}

#[tonic::async_trait]
impl Echo for CookieEcho {
    async fn echo(&self, request: Request<EchoRequest>) -> Result<Response<EchoReply>, Status> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let seen = request
            .metadata()
            .get("cookie")
            .map(|v| v.to_str().unwrap_or("<not ASCII>").to_owned())
            .unwrap_or_default();
        let message = request.into_inner().message;
        let mut metadata = MetadataMap::new();
        match message.as_str() {
            // The deletion must name the cookie's Path: without it, it would
            // be another cookie, of the default path /tether.demo.v1.Echo.
            "logout" => {
                metadata.append(
                    "set-cookie",
                    MetadataValue::from_static("s=; Path=/; Max-Age=0"),
                );
            }
            "fail" => {
                metadata.append("set-cookie", MetadataValue::from_static("t=2"));
                return Err(Status::with_metadata(
                    Code::PermissionDenied,
                    seen,
                    metadata,
                ));
            }
            _ if !seen.split("; ").any(|c| c.starts_with("s=")) => {
                let cookie = format!("s={n}; Path=/; Max-Age=60");
                metadata.append("set-cookie", cookie.parse().expect("metadata value"));
            }
            _ => {}
        }
        let mut reply = Response::new(EchoReply {
            message: seen,
            backend: "cookie-echo".into(),
            address: String::new(),
            served: n,
        });
        *reply.metadata_mut() = metadata;
        Ok(reply)
    }
}

async fn start_server() -> (SocketAddr, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = EchoServer::new(CookieEcho {
        calls: AtomicU64::new(0),
    });
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await;
    });
    (addr, task)
}

/// The `cookie` metadata the server saw for a call with `message`.
async fn call<T>(client: &mut EchoClient<T>, message: &str) -> Result<String, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    let reply = client
        .echo(EchoRequest {
            message: message.into(),
        })
        .await?;
    Ok(reply.into_inner().message)
}

/// The same conversation over any channel wrapped in the jar's layer.
async fn conversation<T>(mut client: EchoClient<T>, jar: &CookieJar)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
{
    assert_eq!(call(&mut client, "hello").await.unwrap(), "");
    assert_eq!(jar.get("s").as_deref(), Some("1"));
    assert_eq!(call(&mut client, "hello").await.unwrap(), "s=1");
    assert_eq!(call(&mut client, "logout").await.unwrap(), "s=1");
    assert_eq!(jar.get("s"), None);
    // No cookie after logout (this call is given a new session).
    assert_eq!(call(&mut client, "hello").await.unwrap(), "");
    assert_eq!(jar.get("s").as_deref(), Some("4"));

    let status = call(&mut client, "fail").await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(status.message(), "s=4");
    // tonic hands the trailers-only response's metadata to the Status...
    assert_eq!(
        status
            .metadata()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok()),
        Some("t=2")
    );
    // ... and the layer saw it as the response's headers.
    assert_eq!(jar.get("t").as_deref(), Some("2"));
    // t's default path /tether.demo.v1.Echo is longer than s's /: t first.
    assert_eq!(call(&mut client, "hello").await.unwrap(), "t=2; s=4");
    assert_eq!(
        jar.cookies(),
        [("t".into(), "2".into()), ("s".into(), "4".into())]
    );
}

const DEADLINE: Duration = Duration::from_secs(20);

/// A tether channel to the server at `addr`.
fn tether_channel(addr: SocketAddr) -> Channel {
    Channel::builder()
        // Calls wait while the subchannel connects instead of failing.
        .wait_for_ready(true)
        .connect_static(
            StaticConfig::new("cookie-echo", vec![StaticEndpoint::new(addr)])
                .with_policy(EndpointPolicy::RoundRobin),
        )
        .unwrap()
}

#[tokio::test]
async fn jar_over_tether_channel() {
    let (addr, server) = start_server().await;
    let channel = tether_channel(addr);
    let jar = CookieJar::new();
    let client = EchoClient::new(CookieJarLayer::new(jar.clone()).layer(channel));
    tokio::time::timeout(DEADLINE, conversation(client, &jar))
        .await
        .expect("conversation in time");
    server.abort();
}

/// The same conversation through a channel handle that carries the jar
/// itself (`Channel::with_cookie_jar`); the handle it came from sends no
/// cookie.
#[tokio::test]
async fn jar_in_a_tether_channel_handle() {
    let (addr, server) = start_server().await;
    let channel = tether_channel(addr);
    let jar = CookieJar::new();
    let client = EchoClient::new(channel.with_cookie_jar(jar.clone()));
    tokio::time::timeout(DEADLINE, conversation(client, &jar))
        .await
        .expect("conversation in time");
    let mut plain = EchoClient::new(channel);
    assert_eq!(call(&mut plain, "hello").await.unwrap(), "");
    assert_eq!(jar.get("s").as_deref(), Some("4"), "the jar is left alone");
    server.abort();
}

#[tokio::test]
async fn jar_over_tonic_channel() {
    let (addr, server) = start_server().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy();
    let jar = CookieJar::new();
    let client = EchoClient::new(CookieJarLayer::new(jar.clone()).layer(channel));
    tokio::time::timeout(DEADLINE, conversation(client, &jar))
        .await
        .expect("conversation in time");
    server.abort();
}
