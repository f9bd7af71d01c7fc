//! The kit itself: a backend answers with its name directly and through a real
//! Envoy, a stopped backend refuses connections, and a bad config fails
//! validation with Envoy's own message.

use tether_testkit::backend::HttpBackend;
use tether_testkit::{client, envoy, free_port, is_listening};

fn proxy_yaml(listen: u16, backend: std::net::SocketAddr) -> String {
    let endpoint = format!(
        " [{{ endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }} }}]",
        backend.ip(),
        backend.port()
    );
    envoy::one_cluster_yaml(listen, "[]", "ROUND_ROBIN", &endpoint)
}

#[tokio::test]
async fn backend_says_who_it_is_directly_and_through_envoy() {
    let b = HttpBackend::start("alpha").await;
    let direct = client::get(b.addr(), "/x?y=1", &[("x-test", "1")])
        .await
        .unwrap();
    assert_eq!(direct.status, 200);
    assert_eq!(direct.header("x-backend"), Some("alpha"));
    let body = direct.json();
    assert_eq!(body["address"], b.addr().to_string());
    assert_eq!(body["path"], "/x?y=1");
    assert_eq!(body["headers"]["x-test"], "1");

    let listen = free_port();
    let e = envoy::Envoy::start(&proxy_yaml(listen, b.addr()))
        .await
        .unwrap();
    let via = client::get(format!("127.0.0.1:{listen}").parse().unwrap(), "/", &[])
        .await
        .unwrap();
    assert_eq!(via.header("x-backend"), Some("alpha"), "{}", e.log());
    assert_eq!(b.hits(), 2);
    assert!(
        e.stat("cluster.backends.upstream_rq_total")
            .await
            .unwrap_or(0)
            >= 1
    );

    b.stop().await;
    assert!(
        !is_listening(b.addr()).await,
        "a stopped backend must refuse connections"
    );
}

#[tokio::test]
async fn validate_reports_envoys_error() {
    let good = proxy_yaml(free_port(), "127.0.0.1:1".parse().unwrap());
    envoy::validate(&good).await.unwrap();
    let bad = good.replace("type: STATIC", "type: NOT_A_TYPE");
    let err = envoy::validate(&bad).await.unwrap_err();
    assert!(err.contains("NOT_A_TYPE"), "{err}");
}
