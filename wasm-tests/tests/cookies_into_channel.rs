//! Session cookies crossing between a real Envoy 1.40 and `tether::Channel`
//! over the same three tonic backends: a cookie minted by Envoy's native
//! stateful_session filter, and one minted by the tether plugin, pin a
//! channel's calls to the backend Envoy chose; a cookie the channel writes
//! in Envoy's format pins stock Envoy's calls to the channel's backend.

use std::net::SocketAddr;
use std::time::Duration;

use tether::channel::{EndpointPolicy, SessionOptions, StaticConfig, StaticEndpoint};
use tether::Channel;
use tether_core::cookie::Format;
use tether_core::http::set_cookie::CookieSpec;
use tether_testkit::free_port;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_wasm_tests::scenario::{
    bootstrap, http2_upstream, listener, native_cookie_filter, override_host_cluster,
    plugin_config, plugin_filter, route, start_envoy, static_cluster, COOKIE,
};

const CALLS: usize = 20;

async fn three() -> [GrpcBackend; 3] {
    [
        GrpcBackend::start("grpc-1").await,
        GrpcBackend::start("grpc-2").await,
        GrpcBackend::start("grpc-3").await,
    ]
}

/// A channel over the backends with the same session cookie as Envoy's
/// (name, path), writing `format`.
fn channel(addrs: &[SocketAddr], format: Format) -> Channel {
    let spec = CookieSpec::new(COOKIE, "/", Duration::from_secs(120), Vec::new()).unwrap();
    Channel::builder()
        .session_options(SessionOptions::new(format))
        .connect_static(
            StaticConfig::new(
                "echo",
                addrs.iter().map(|a| StaticEndpoint::new(*a)).collect(),
            )
            .with_policy(EndpointPolicy::RoundRobin)
            .with_session(spec),
        )
        .unwrap()
}

/// One Echo call over `service` with an optional cookie: the backend and
/// the response's session cookies (`name=value`).
async fn call<S>(service: S, cookie: Option<&str>) -> (String, Vec<String>)
where
    S: tonic::client::GrpcService<tonic::body::Body>,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut client = EchoClient::new(service);
    let mut req = tonic::Request::new(EchoRequest {
        message: "hello".into(),
    });
    req.set_timeout(Duration::from_secs(10));
    if let Some(c) = cookie {
        req.metadata_mut().insert("cookie", c.parse().unwrap());
    }
    let resp = client.echo(req).await.expect("the call succeeds");
    let set_cookies = tether_wasm_tests::scenario::metadata_cookies(resp.metadata());
    let cookies = set_cookies.iter().map(|m| m.cookie_header()).collect();
    (resp.into_inner().backend, cookies)
}

/// A tonic channel to Envoy's listener on `port`.
async fn through_envoy(port: u16) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .expect("Envoy's listener answers")
}

/// Envoy mints a cookie for a backend other than the channel's first
/// pick would be (several calls, the last backend's cookie), and every
/// channel call carrying it reaches that backend.
async fn envoy_cookie_pins_the_channel(envoy_port: u16, addrs: &[SocketAddr]) {
    let envoy = through_envoy(envoy_port).await;
    let mut minted = Vec::new();
    for _ in 0..3 {
        let (backend, cookies) = call(envoy.clone(), None).await;
        assert_eq!(cookies.len(), 1, "Envoy sets one session cookie");
        minted.push((backend, cookies[0].clone()));
    }
    let ch = channel(addrs, Format::Grpc);
    for (backend, cookie) in &minted {
        for _ in 0..CALLS {
            let (b, _) = call(ch.clone(), Some(cookie)).await;
            assert_eq!(&b, backend, "the channel honours Envoy's cookie {cookie}");
        }
    }
}

/// Envoy on a free port with `filter` in front of the backends (an
/// override_host cluster for the plugin's wiring, else a plain one): the
/// running Envoy and its port.
async fn envoy_with(
    filter: serde_json::Value,
    addrs: &[SocketAddr],
) -> (tether_testkit::envoy::Envoy, u16) {
    let port = free_port();
    let plugin = filter["name"] == "tether";
    let mut cluster = if plugin {
        override_host_cluster("echo", addrs)
    } else {
        static_cluster("echo", addrs)
    };
    http2_upstream(&mut cluster);
    let yaml = bootstrap(
        vec![listener(
            "grpc",
            port,
            vec![filter],
            vec![route("/", "echo")],
        )],
        vec![cluster],
    );
    (start_envoy(&yaml).await, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_of_envoys_native_filter_pins_the_channel() {
    let backends = three().await;
    let addrs: Vec<SocketAddr> = backends.iter().map(GrpcBackend::addr).collect();
    let (_envoy, port) = envoy_with(native_cookie_filter(Some("120s"), false), &addrs).await;
    envoy_cookie_pins_the_channel(port, &addrs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_of_the_tether_plugin_pins_the_channel() {
    let backends = three().await;
    let addrs: Vec<SocketAddr> = backends.iter().map(GrpcBackend::addr).collect();
    let (_envoy, port) = envoy_with(plugin_filter(&plugin_config()), &addrs).await;
    envoy_cookie_pins_the_channel(port, &addrs).await;
}

/// The channel, told to write Envoy's format, mints a cookie per backend;
/// stock Envoy (native filter) sends every call carrying one to that
/// backend and sets nothing new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_cookie_in_envoys_format_pins_stock_envoy() {
    let backends = three().await;
    let addrs: Vec<SocketAddr> = backends.iter().map(GrpcBackend::addr).collect();
    let (_envoy, port) = envoy_with(native_cookie_filter(Some("120s"), false), &addrs).await;
    let ch = channel(&addrs, Format::Envoy);
    let mut minted = std::collections::BTreeMap::new();
    for _ in 0..12 {
        let (backend, cookies) = call(ch.clone(), None).await;
        assert_eq!(cookies.len(), 1, "the channel sets one session cookie");
        minted.entry(backend).or_insert(cookies[0].clone());
    }
    assert_eq!(
        minted.len(),
        3,
        "round robin reaches every backend: {minted:?}"
    );
    let envoy = through_envoy(port).await;
    for (backend, cookie) in &minted {
        for _ in 0..CALLS {
            let (b, set) = call(envoy.clone(), Some(cookie)).await;
            assert_eq!(&b, backend, "stock Envoy honours the channel's {cookie}");
            assert!(set.is_empty(), "Envoy keeps the channel's cookie: {set:?}");
        }
    }
}
