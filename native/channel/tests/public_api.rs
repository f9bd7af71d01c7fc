//! The public API's promises a library builds on: the channel and the jar
//! are shareable handles a generated tonic client takes; making a channel
//! never panics (outside a runtime, with a bootstrap without servers);
//! errors chain their causes.

use std::error::Error as _;
use std::net::SocketAddr;

use tether::channel::{ChannelError, StaticConfig, StaticConfigError, StaticEndpoint};
use tether::session::{CookieJar, CookieJarLayer, CookieJarService, Layer};
use tether::xds::bootstrap::BootstrapError;
use tether::xds::Bootstrap;
use tether::Channel;
use tether_testkit::grpc::EchoClient;

fn shareable<T: Clone + Send + Sync + 'static>() {}

/// Compiles only while both are `Clone + Send + Sync + 'static` and a
/// generated tonic client accepts them as its transport.
#[allow(dead_code)]
fn clients_take_the_channel_and_the_jar(channel: Channel, jar: CookieJar) {
    shareable::<Channel>();
    shareable::<CookieJarService<Channel>>();
    let _plain: EchoClient<Channel> = EchoClient::new(channel.clone());
    let _with_jar: EchoClient<CookieJarService<Channel>> =
        EchoClient::new(CookieJarLayer::new(jar).layer(channel));
}

fn one_endpoint() -> StaticConfig {
    StaticConfig::new(
        "api",
        vec![StaticEndpoint::new(SocketAddr::from(([127, 0, 0, 1], 9)))],
    )
}

#[test]
fn connecting_outside_a_runtime_is_an_error_not_a_panic() {
    let err = Channel::builder()
        .connect_static(one_endpoint())
        .unwrap_err();
    assert_eq!(err, ChannelError::NoRuntime);
    assert!(err.to_string().contains("inside a tokio runtime"), "{err}");
    let bootstrap = Bootstrap::from_json(
        r#"{"xds_servers":[{"server_uri":"127.0.0.1:9","channel_creds":[{"type":"insecure"}]}],"node":{"id":"n"}}"#,
    )
    .unwrap();
    let err = Channel::builder()
        .bootstrap(bootstrap)
        .connect("xds:///api")
        .unwrap_err();
    assert_eq!(err, ChannelError::NoRuntime);
    let err = Channel::builder()
        .connect("static:///127.0.0.1:9")
        .unwrap_err();
    assert_eq!(err, ChannelError::NoRuntime);
}

#[tokio::test]
async fn a_bootstrap_without_servers_is_an_error_naming_the_field() {
    let mut bootstrap = Bootstrap::from_json(
        r#"{"xds_servers":[{"server_uri":"127.0.0.1:9","channel_creds":[{"type":"insecure"}]}],"node":{"id":"n"}}"#,
    )
    .unwrap();
    bootstrap.servers.clear();
    assert_eq!(
        bootstrap.server().unwrap_err().to_string(),
        "bootstrap xds_servers: [] has no server"
    );
    let err = Channel::builder()
        .bootstrap(bootstrap)
        .connect("xds:///api")
        .unwrap_err();
    assert_eq!(err.to_string(), "bootstrap xds_servers: [] has no server");
    let source = err.source().expect("the bootstrap error is the source");
    assert!(source.downcast_ref::<BootstrapError>().is_some());
}

#[tokio::test]
async fn static_config_errors_are_typed_and_chained() {
    let err = Channel::from_static(StaticConfig::new("api", Vec::new())).unwrap_err();
    assert_eq!(err, ChannelError::Static(StaticConfigError::NoEndpoints));
    assert_eq!(err.to_string(), "static channel: no endpoints");
    let source = err.source().expect("the config error is the source");
    assert_eq!(
        source.downcast_ref::<StaticConfigError>(),
        Some(&StaticConfigError::NoEndpoints)
    );
    let mut zero = one_endpoint();
    zero.endpoints[0].weight = 0;
    assert_eq!(
        Channel::from_static(zero).unwrap_err().to_string(),
        "static channel: endpoints[0] has a weight of 0"
    );
    // A runtime is there and the config is good: a channel.
    assert!(Channel::from_static(one_endpoint()).is_ok());
}
