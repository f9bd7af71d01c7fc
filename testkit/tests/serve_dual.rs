//! `serve_dual` bound to every address, as a scaled service's replica runs
//! it (`tether-demo-backend --listen 0.0.0.0:8080`): each answer names the
//! address its connection reached, not 0.0.0.0.

use std::time::Duration;
use tether_testkit::grpc::serve_dual;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 GET to `addr`: the answer's JSON body.
async fn get(addr: std::net::SocketAddr) -> serde_json::Value {
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .expect("read");
    let text = String::from_utf8(answer).expect("UTF-8");
    let body = text.split("\r\n\r\n").nth(1).expect("a body");
    serde_json::from_str(body).expect("JSON")
}

#[tokio::test]
async fn bound_to_every_address_answers_name_the_address_reached() {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_dual(
        "replica",
        listener,
        async {
            let _ = stopped.await;
        },
        Duration::from_secs(1),
        None,
        None,
    ));
    for ip in ["127.0.0.2", "127.0.0.3"] {
        let addr = format!("{ip}:{port}").parse().expect("addr");
        let body = get(addr).await;
        assert_eq!(body["backend"], "replica");
        assert_eq!(body["address"], addr.to_string(), "{body}");
    }
    let _ = stop.send(());
    let drained = server.await.expect("join").expect("serve");
    assert!(drained.in_time);
}
