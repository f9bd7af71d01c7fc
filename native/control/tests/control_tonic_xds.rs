//! tether-control serves any gRPC xDS client: tonic-xds (grpc-rust's xDS
//! for tonic, crates.io 0.1.0-alpha) resolves a virtual host from
//! tether-control's resources and calls its backends, spreading calls across
//! both endpoints (round robin, as tether-control's clusters say), and
//! follows an endpoint's removal from the file.

mod control_support;

use std::collections::BTreeMap;
use std::time::Duration;

use control_support::Control;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};

const TARGET: &str = "echo.tether.test";

fn yaml(backends: &[&GrpcBackend]) -> String {
    let mut y = format!(
        "virtualhosts:\n  - name: {TARGET}\n    routes:\n      - services: [{{ name: echo }}]\n\
         services:\n  - name: echo\n    protocol: h2c\n    endpoints:\n"
    );
    for b in backends {
        y += &format!("      - address: \"{}\"\n", b.addr());
    }
    y
}

/// Which backends answered `n` calls.
async fn answers<C>(client: &mut EchoClient<C>, n: usize) -> BTreeMap<String, usize>
where
    C: tonic::client::GrpcService<tonic::body::Body>,
    C::Error: Into<tonic::codegen::StdError>,
    C::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <C::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut seen = BTreeMap::new();
    for i in 0..n {
        let mut request = tonic::Request::new(EchoRequest {
            message: format!("call {i}"),
        });
        request.set_timeout(Duration::from_secs(10));
        let reply = client
            .echo(request)
            .await
            .expect("a call through tonic-xds");
        *seen.entry(reply.into_inner().backend).or_default() += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_xds_resolves_and_calls_through_tether_control() {
    let a = GrpcBackend::start("a").await;
    let b = GrpcBackend::start("b").await;
    let control = Control::start(&yaml(&[&a, &b])).await;
    // tonic-xds takes a scheme-less server_uri for TLS (gRPC's clients take
    // it for plaintext with insecure creds): the same bootstrap, with
    // http:// spelled out.
    let bootstrap = tonic_xds::BootstrapConfig::from_json(
        &control
            .bootstrap_json("tonic-xds")
            .replace("\"server_uri\":\"", "\"server_uri\":\"http://"),
    )
    .expect("tonic-xds reads tether-control's bootstrap");
    let target = tonic_xds::XdsUri::parse(&format!("xds:///{TARGET}")).unwrap();
    let channel = tonic_xds::XdsChannelBuilder::new(
        tonic_xds::XdsChannelConfig::new(target).with_bootstrap(bootstrap),
    )
    .build_grpc_channel()
    .expect("a tonic-xds channel");
    let mut client = EchoClient::new(channel);
    let seen = answers(&mut client, 20).await;
    assert_eq!(
        seen.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a", "b"],
        "both endpoints: {seen:?}"
    );
    assert!(control.nacks_none(), "{}", control.stderr());
    // b leaves the file: tonic-xds follows tether-control's EDS push.
    control.write(&yaml(&[&a]));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen = answers(&mut client, 10).await;
        if seen.keys().eq(["a"].iter()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b still called 20 s after its removal: {seen:?}"
        );
    }
}
