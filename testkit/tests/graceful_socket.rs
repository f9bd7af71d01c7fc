//! The race behind GracefulSocket, played frame by frame against a real
//! hyper server as C-core played it in a test run: the client's new
//! stream (HEADERS, then a WINDOW_UPDATE for it) leaves in the write that
//! answers the shutdown PING, so it arrives after the server has capped
//! the last stream id. The call below that id must still be answered.

use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::Arc;
use std::time::Duration;
use tether_testkit::graceful_socket::GracefulSocket;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

const HEADERS: u8 = 0x1;
const WINDOW_UPDATE: u8 = 0x8;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A GET / request: static-table :method, :scheme, :path and a literal
/// :authority, ending the stream.
fn request(stream: u32) -> Vec<u8> {
    frame(
        HEADERS,
        0x4 | 0x1,
        stream,
        &[0x82, 0x86, 0x84, 0x01, 0x01, b'a'],
    )
}

async fn read_frame(conn: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    conn.read_exact(&mut head).await.expect("a frame header");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    conn.read_exact(&mut payload)
        .await
        .expect("a frame payload");
    (head[3], head[4], stream, payload)
}

/// Serves one connection and starts a graceful shutdown once the first
/// request is in; that request is answered 300 ms later.
async fn serve<S>(io: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let arrived = Arc::new(Notify::new());
    let svc = {
        let arrived = arrived.clone();
        service_fn(move |_req| {
            let arrived = arrived.clone();
            async move {
                arrived.notify_one();
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, std::convert::Infallible>(hyper::Response::new(String::new()))
            }
        })
    };
    let conn = http2::Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = arrived.notified() => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// What the server did with stream 1 after stream 3's frames.
#[derive(Debug, PartialEq)]
enum Outcome {
    Answered,
    GoAway { code: u32 },
}

/// Serves one connection (through GracefulSocket when `graceful`), starts
/// a graceful shutdown once stream 1 is in, and plays the race.
async fn race(graceful: bool) -> Outcome {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        if graceful {
            serve(GracefulSocket::new(stream)).await;
        } else {
            serve(stream).await;
        }
    });

    let mut conn = TcpStream::connect(addr).await.expect("connect");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    hello.extend(request(1));
    conn.write_all(&hello).await.expect("write");

    let outcome = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let (kind, flags, stream, payload) = read_frame(&mut conn).await;
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    conn.write_all(&frame(SETTINGS, ACK, 0, &[]))
                        .await
                        .expect("write");
                }
                // The shutdown PING: its answer and a new stream leave in
                // one write, as from a client that picked the connection
                // before it read the first GOAWAY.
                PING if flags & ACK == 0 => {
                    let mut out = frame(PING, ACK, 0, &payload);
                    out.extend(request(3));
                    out.extend(frame(WINDOW_UPDATE, 0, 3, &5u32.to_be_bytes()));
                    conn.write_all(&out).await.expect("write");
                }
                GOAWAY => {
                    let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                    if code != 0 {
                        return Outcome::GoAway { code };
                    }
                }
                HEADERS if stream == 1 => return Outcome::Answered,
                _ => {}
            }
        }
    })
    .await
    .expect("the server answers or ends the connection");
    server.abort();
    outcome
}

#[tokio::test]
async fn frames_on_a_refused_stream_do_not_end_the_connection() {
    assert_eq!(race(true).await, Outcome::Answered);
}

/// Why the socket exists: hyper's h2 alone ends the connection with
/// PROTOCOL_ERROR, failing stream 1. If this starts failing, h2 has
/// fixed it and GracefulSocket's filter can go.
#[tokio::test]
async fn h2_alone_ends_the_connection_on_them() {
    assert_eq!(race(false).await, Outcome::GoAway { code: 1 });
}
