//! A TCP proxy in front of one backend that a test can cut off the way a
//! network partition or a hung host does: [`Partition::cut`] stops
//! forwarding in both directions without closing anything (no FIN, no RST:
//! the peers see silence), and connections made meanwhile are accepted and
//! left silent; [`Partition::heal`] forwards again. Everything stops when
//! the [`Partition`] is dropped.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy.
pub struct Partition {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Partition {
    /// A proxy on a random 127.0.0.1 port forwarding to `backend`.
    pub async fn start(backend: SocketAddr) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (cut, _) = watch::channel(false);
        let state = cut.subscribe();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let _ = client.set_nodelay(true);
                connections.spawn(forward(client, backend, state.clone()));
                while connections.try_join_next().is_some() {}
            }
        });
        Partition { addr, cut, task }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding: bytes sent either way are held, nothing closes.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again, the held bytes first.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection: waits while cut, then pipes both ways, each chunk held
/// while cut.
async fn forward(client: TcpStream, backend: SocketAddr, mut cut: watch::Receiver<bool>) {
    if cut.wait_for(|c| !c).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(backend).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    tokio::select! {
        () = pipe(client_r, server_w, cut.clone()) => {}
        () = pipe(server_r, client_w, cut) => {}
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cut.wait_for(|c| !c).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
