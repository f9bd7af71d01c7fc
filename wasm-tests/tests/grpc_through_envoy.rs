//! gRPC through a real Envoy 1.40 with the tether plugin: a tonic client calls
//! tonic Echo servers (each reply names the backend) over HTTP/2. The session
//! cookie travels in metadata: `set-cookie` in the response's initial
//! metadata, `cookie` on later calls, and the calls stay on one backend.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use tether_testkit::free_port;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_wasm_tests::scenario::{
    bootstrap, grpc_value, http2_upstream, listener, override_host_cluster, plugin_config,
    plugin_filter, route, start_envoy, COOKIE,
};
use tonic::transport::{Channel, Endpoint};

/// One call with an optional `cookie` metadata value: (backend that answered,
/// the session cookie it set, if any, the cookie the backend received).
async fn call(
    client: &mut EchoClient<Channel>,
    cookie: Option<&str>,
) -> (
    String,
    Option<tether_wasm_tests::scenario::Minted>,
    Option<String>,
) {
    let mut req = tonic::Request::new(EchoRequest {
        message: "hello".into(),
    });
    if let Some(c) = cookie {
        req.metadata_mut().insert("cookie", c.parse().unwrap());
    }
    let resp = client.echo(req).await.expect("the call succeeds");
    let set_cookies = tether_wasm_tests::scenario::metadata_cookies(resp.metadata());
    let seen = resp
        .metadata()
        .get("x-seen-cookie")
        .map(|v| v.to_str().unwrap_or("").to_string());
    let mut minted = set_cookies;
    assert!(minted.len() <= 1, "{minted:?}");
    (resp.into_inner().backend, minted.pop(), seen)
}

#[tokio::test]
async fn grpc_calls_carrying_the_session_cookie_stay_pinned() {
    let backends = [
        GrpcBackend::start("grpc-1").await,
        GrpcBackend::start("grpc-2").await,
        GrpcBackend::start("grpc-3").await,
    ];
    let addrs: Vec<SocketAddr> = backends.iter().map(GrpcBackend::addr).collect();
    let port = free_port();
    let mut cluster = override_host_cluster("echo", &addrs);
    http2_upstream(&mut cluster);
    let yaml = bootstrap(
        vec![listener(
            "grpc",
            port,
            vec![plugin_filter(&plugin_config())],
            vec![route("/", "echo")],
        )],
        vec![cluster],
    );
    let envoy = start_envoy(&yaml).await;
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", envoy.log()));
    let mut client = EchoClient::new(channel);
    let name_at = |a: SocketAddr| {
        backends
            .iter()
            .find(|b| b.addr() == a)
            .map(|b| b.name().to_string())
    };

    // Without a cookie: load balanced, and each reply carries a session cookie
    // for the backend that answered, in the initial metadata.
    let mut seen = BTreeSet::new();
    let mut first = None;
    for _ in 0..6 {
        let (b, m, _) = call(&mut client, None).await;
        let m = m.expect("set-cookie in the response metadata");
        assert_eq!(name_at(m.address()).as_deref(), Some(b.as_str()));
        seen.insert(b.clone());
        first.get_or_insert((b, m));
    }
    assert!(seen.len() > 1, "round robin: {seen:?}");

    // With it: every call goes to that backend, and nothing new is set.
    let (pinned, m) = first.unwrap();
    let cookie = m.cookie_header();
    for _ in 0..30 {
        let (b, again, forwarded) = call(&mut client, Some(&cookie)).await;
        assert_eq!(b, pinned);
        assert!(again.is_none());
        assert_eq!(
            forwarded.as_deref(),
            Some(cookie.as_str()),
            "the backend sees the cookie"
        );
    }

    // A cookie in gRPC C-core's own format pins too.
    let target = backends[2].addr();
    let grpc_cookie = format!("{COOKIE}={}", grpc_value(target, "echo"));
    for _ in 0..10 {
        let (b, again, _) = call(&mut client, Some(&grpc_cookie)).await;
        assert_eq!(b, "grpc-3");
        assert!(again.is_none(), "same host and cluster: nothing to rewrite");
    }
}
