//! One HTTP/2 client connection (h2c, prior knowledge) over hyper.
//!
//! [`connect`] dials, handshakes and waits for the server's SETTINGS frame,
//! all within one timeout: hyper's handshake returns as soon as the client
//! preface is written, so without that wait a peer that accepts TCP but
//! never speaks HTTP/2 would look connected. The hyper connection future
//! runs in its own task, watched by a [`ConnectionTask`] that completes
//! when the connection is gone and aborts it when dropped.
//!
//! hyper's connection future ends at the peer's first GOAWAY while the
//! streams already on the connection go on in tasks of their own, so the
//! end of the socket itself is watched too ([`Connection::transport_closed`]):
//! a call still waiting for its response then is not left waiting on a
//! connection that can no longer answer it.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinError, JoinHandle};
use tonic::body::Body;

use super::KeepaliveOptions;
use crate::credentials::{HandshakeError, Transport};

/// HTTP/2 frame type of SETTINGS, which must open the server's preface.
const SETTINGS_FRAME: u8 = 0x4;
/// Length of an HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;

/// A ready HTTP/2 connection to send requests on; clones share it.
#[derive(Clone)]
pub struct Connection {
    sender: SendRequest<Body>,
    address: SocketAddr,
    /// Which of its subchannel's connections this is (they count from 1).
    pub(crate) serial: u64,
    /// Ends (its sender is dropped) when the socket is dropped.
    transport: watch::Receiver<()>,
}

impl Connection {
    /// Whether hyper knows the connection is closed: it takes no request.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Completes once the socket is gone: nothing more can arrive on any
    /// stream of the connection.
    pub(crate) async fn transport_closed(&self) {
        let mut transport = self.transport.clone();
        while transport.changed().await.is_ok() {}
    }

    /// Sends one request on this connection (waits for stream capacity
    /// first: hyper holds it until the peer's stream limit allows). A
    /// plain function around an `async` block: the block holds the request
    /// once (an `async fn` would also keep a moved-from copy), and this
    /// future sits inside every call's.
    pub fn send(
        &self,
        request: http::Request<Body>,
    ) -> impl Future<Output = Result<http::Response<Incoming>, SendError>> + Send + 'static {
        let mut sender = self.sender.clone();
        let address = self.address;
        async move {
            if let Err(error) = sender.ready().await {
                return Err(SendError {
                    error,
                    unsent: Some(request),
                });
            }
            log::trace!("subchannel {address}: sending {}", request.uri());
            sender.try_send_request(request).await.map_err(|mut e| {
                let unsent = e.take_message();
                SendError {
                    error: e.into_error(),
                    unsent,
                }
            })
        }
    }
}

/// A request that failed on a connection.
#[derive(Debug)]
pub struct SendError {
    /// What hyper said.
    pub error: hyper::Error,
    /// The request, when it never reached the connection (it closed
    /// first): it can be sent elsewhere, as gRPC's transparent retry does.
    pub unsent: Option<http::Request<Body>>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("address", &self.address)
            .field("serial", &self.serial)
            .field("closed", &self.sender.is_closed())
            .finish()
    }
}

/// Why a connection attempt failed.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The TCP connect failed (e.g. refused).
    Connect {
        address: SocketAddr,
        source: io::Error,
    },
    /// The Unix socket's connect failed.
    ConnectUnix {
        path: std::sync::Arc<std::path::Path>,
        source: io::Error,
    },
    /// The TLS handshake failed, or the server did not agree to `h2`.
    Tls {
        address: SocketAddr,
        source: HandshakeError,
    },
    /// hyper's HTTP/2 handshake failed.
    Handshake {
        address: SocketAddr,
        source: hyper::Error,
    },
    /// The server's first frame was not SETTINGS: not an HTTP/2 server.
    NotHttp2 { address: SocketAddr, frame_type: u8 },
    /// The connection ended before the server's SETTINGS arrived.
    Closed { address: SocketAddr, reason: Closed },
    /// The whole attempt took longer than its timeout.
    TimedOut {
        address: SocketAddr,
        after: Duration,
    },
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Connect { address, source } => {
                write!(f, "connect {address} failed: {source}")
            }
            ConnectError::ConnectUnix { path, source } => {
                write!(f, "connect unix:{} failed: {source}", path.display())
            }
            ConnectError::Tls { address, source } => {
                write!(f, "TLS handshake with {address} failed: {source}")
            }
            ConnectError::Handshake { address, source } => {
                write!(f, "HTTP/2 handshake with {address} failed: {}", Chain(source))
            }
            ConnectError::NotHttp2 {
                address,
                frame_type,
            } => write!(
                f,
                "{address} is not an HTTP/2 server: its first frame has type {frame_type:#x}, not SETTINGS"
            ),
            ConnectError::Closed { address, reason } => {
                write!(f, "HTTP/2 handshake with {address} failed: {reason}")
            }
            ConnectError::TimedOut { address, after } => {
                write!(f, "connect {address} timed out after {after:?}")
            }
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Connect { source, .. } | ConnectError::ConnectUnix { source, .. } => {
                Some(source)
            }
            ConnectError::Tls { source, .. } => Some(source),
            ConnectError::Handshake { source, .. } => Some(source),
            ConnectError::Closed { reason, .. } => reason.source(),
            ConnectError::NotHttp2 { .. } | ConnectError::TimedOut { .. } => None,
        }
    }
}

/// How a connection ended.
#[derive(Debug)]
pub(crate) enum Closed {
    /// hyper finished the connection without error (peer closed or GOAWAY).
    Graceful,
    /// hyper reported a connection error.
    Error(hyper::Error),
    /// The task driving the connection was cancelled or panicked.
    Task(JoinError),
    /// [`ConnectionTask::closed`] had already reported the end.
    AlreadyReported,
}

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Closed::Graceful => f.write_str("connection closed"),
            Closed::Error(e) => write!(f, "{}", Chain(e)),
            Closed::Task(e) => write!(f, "connection task ended: {e}"),
            Closed::AlreadyReported => f.write_str("connection already closed"),
        }
    }
}

impl std::error::Error for Closed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Closed::Error(e) => Some(e),
            Closed::Task(e) => Some(e),
            Closed::Graceful | Closed::AlreadyReported => None,
        }
    }
}

impl Closed {
    /// Whether the server ended the connection for pinging too often
    /// (gRFC A8): a GOAWAY with ENHANCE_YOUR_CALM. C-core also reads the
    /// GOAWAY's debug data ("too_many_pings"), which hyper does not expose.
    pub(crate) fn too_many_pings(&self) -> bool {
        let Closed::Error(e) = self else {
            return false;
        };
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(e) = source {
            if let Some(h2) = e.downcast_ref::<h2::Error>() {
                return h2.is_go_away()
                    && h2.is_remote()
                    && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
            }
            source = e.source();
        }
        false
    }
}

/// Shows an error with its sources: hyper's own message is only the kind
/// ("connection error"), the cause is in the source.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

/// The task driving one hyper connection; dropping this aborts it, which
/// closes the socket.
#[derive(Debug)]
pub(crate) struct ConnectionTask {
    handle: Option<JoinHandle<Result<(), hyper::Error>>>,
}

impl ConnectionTask {
    /// Completes when the connection is gone, saying why. Cancel-safe.
    pub(crate) async fn closed(&mut self) -> Closed {
        let Some(handle) = self.handle.as_mut() else {
            return Closed::AlreadyReported;
        };
        let outcome = handle.await;
        // A finished JoinHandle must not be polled again.
        self.handle = None;
        match outcome {
            Ok(Ok(())) => Closed::Graceful,
            Ok(Err(e)) => Closed::Error(e),
            Err(e) => Closed::Task(e),
        }
    }
}

impl Drop for ConnectionTask {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.abort();
        }
    }
}

/// What a connection's socket and HTTP/2 settings are made with, from
/// [`SubchannelOptions`](super::SubchannelOptions).
#[derive(Debug, Clone)]
pub(crate) struct SocketOptions {
    nodelay: bool,
    tcp_keepalive: Option<Duration>,
    stream_window: Option<u32>,
    connection_window: Option<u32>,
    adaptive_window: bool,
    unix: Option<std::sync::Arc<std::path::Path>>,
}

impl From<&super::SubchannelOptions> for SocketOptions {
    fn from(o: &super::SubchannelOptions) -> Self {
        SocketOptions {
            nodelay: o.tcp_nodelay,
            tcp_keepalive: o.tcp_keepalive,
            stream_window: o.initial_stream_window_size,
            connection_window: o.initial_connection_window_size,
            adaptive_window: o.http2_adaptive_window,
            unix: o.unix.clone(),
        }
    }
}

/// Connects to `address` (or the Unix socket `socket` names): TCP, HTTP/2
/// handshake and the server's SETTINGS, the whole attempt bounded by
/// `timeout`.
pub(crate) async fn connect(
    address: SocketAddr,
    timeout: Duration,
    keepalive: Option<KeepaliveOptions>,
    transport: &Transport,
    socket: &SocketOptions,
) -> Result<(Connection, ConnectionTask), ConnectError> {
    match tokio::time::timeout(timeout, attempt(address, keepalive, transport, socket)).await {
        Ok(result) => result,
        // Dropping the attempt dropped its ConnectionTask, if any: aborted.
        Err(_) => Err(ConnectError::TimedOut {
            address,
            after: timeout,
        }),
    }
}

/// Opens the TCP connection. With keepalive on, the socket gets
/// TCP_USER_TIMEOUT = the keepalive timeout first, as C-core's client
/// sockets do: data (the SYN included) unacknowledged that long fails the
/// socket, so a connection attempt to a peer that drops packets (a
/// partition) fails within the timeout instead of after the connect
/// timeout, and a session pinned there moves that much sooner.
async fn dial(address: SocketAddr, keepalive: Option<KeepaliveOptions>) -> io::Result<TcpStream> {
    let Some(k) = keepalive else {
        return TcpStream::connect(address).await;
    };
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    if let Err(e) = socket2::SockRef::from(&socket).set_tcp_user_timeout(Some(k.timeout)) {
        // Keepalive still finds a dead peer; only the attempt may take longer.
        log::debug!("subchannel {address}: TCP_USER_TIMEOUT not set: {e}");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "fuchsia")))]
    let _ = k;
    socket.connect(address).await
}

async fn attempt(
    address: SocketAddr,
    keepalive: Option<KeepaliveOptions>,
    transport: &Transport,
    socket: &SocketOptions,
) -> Result<(Connection, ConnectionTask), ConnectError> {
    let tls = |source| ConnectError::Tls { address, source };
    if let Some(path) = &socket.unix {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|source| ConnectError::ConnectUnix {
                path: path.clone(),
                source,
            })?;
        return match transport {
            Transport::Plain => establish(address, keepalive, socket, stream).await,
            // No address to verify against: the config's server name.
            Transport::Tls(config) => {
                let stream = config.handshake_named(stream).await.map_err(tls)?;
                establish(address, keepalive, socket, stream).await
            }
            Transport::Xds(_) => Err(tls(HandshakeError::Credentials(
                "xDS credentials do not apply to a unix: socket".into(),
            ))),
        };
    }
    let stream = dial(address, keepalive)
        .await
        .map_err(|source| ConnectError::Connect { address, source })?;
    if let Err(e) = stream.set_nodelay(socket.nodelay) {
        // Only latency suffers; the connection is still usable.
        log::debug!("subchannel {address}: TCP_NODELAY not set: {e}");
    }
    if let Some(idle) = socket.tcp_keepalive {
        let keepalive = socket2::TcpKeepalive::new().with_time(idle);
        if let Err(e) = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive) {
            log::debug!("subchannel {address}: TCP keepalive not set: {e}");
        }
    }
    match transport {
        Transport::Plain => establish(address, keepalive, socket, stream).await,
        Transport::Tls(config) => {
            let stream = config.handshake(address, stream).await.map_err(tls)?;
            establish(address, keepalive, socket, stream).await
        }
        Transport::Xds(security) => {
            let stream = security.handshake(address, stream).await.map_err(tls)?;
            establish(address, keepalive, socket, stream).await
        }
    }
}

/// The HTTP/2 handshake over `io` (TCP or TLS), up to the server's SETTINGS.
async fn establish<T>(
    address: SocketAddr,
    keepalive: Option<KeepaliveOptions>,
    socket: &SocketOptions,
    stream: T,
) -> Result<(Connection, ConnectionTask), ConnectError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (settings_tx, settings_rx) = oneshot::channel();
    let (transport_tx, transport) = watch::channel(());
    let io = TokioIo::new(PrefaceWatch::new(stream, settings_tx, transport_tx));
    let mut builder = http2::Builder::new(BoxingExecutor);
    builder.timer(TokioTimer::new());
    if socket.adaptive_window {
        builder.adaptive_window(true);
    }
    if let Some(w) = socket.stream_window {
        builder.initial_stream_window_size(w);
    }
    if let Some(w) = socket.connection_window {
        builder.initial_connection_window_size(w);
    }
    if let Some(k) = keepalive {
        // gRFC A8: a PING every `time`; no answer within `timeout` ends
        // the connection (hyper's keep-alive error).
        builder
            .keep_alive_interval(k.time)
            .keep_alive_timeout(k.timeout)
            .keep_alive_while_idle(k.permit_without_calls);
    }
    let (sender, connection) = builder
        .handshake::<_, Body>(io)
        .await
        .map_err(|source| ConnectError::Handshake { address, source })?;
    let mut task = ConnectionTask {
        handle: Some(tokio::spawn(connection)),
    };
    let first = tokio::select! {
        // The first frame is seen before hyper can fail on it.
        biased;
        first = settings_rx => first,
        reason = task.closed() => return Err(ConnectError::Closed { address, reason }),
    };
    match first {
        Ok(FirstFrame::Settings) => Ok((
            Connection {
                sender,
                address,
                serial: 0,
                transport,
            },
            task,
        )),
        Ok(FirstFrame::Other(frame_type)) => Err(ConnectError::NotHttp2 {
            address,
            frame_type,
        }),
        // The socket was dropped unread: the connection is ending.
        Err(_) => Err(ConnectError::Closed {
            address,
            reason: task.closed().await,
        }),
    }
}

/// Spawns hyper's futures boxed. For each request hyper spawns a value of
/// one enum whose largest variant is the whole connection's state (some
/// kilobytes); spawned as it is, tokio moved it into a task cell of that
/// size on every call (2,000 instructions of copying a call under
/// callgrind). Boxed once, the task holds a pointer, as tonic's executor
/// does.
#[derive(Clone, Copy, Debug)]
struct BoxingExecutor;

impl<F> hyper::rt::Executor<F> for BoxingExecutor
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        tokio::spawn(Box::pin(future));
    }
}

/// What the server's first frame was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstFrame {
    Settings,
    Other(u8),
}

/// A socket that reports the type of the first frame it reads; otherwise
/// passes everything through.
struct PrefaceWatch<T> {
    io: T,
    header: [u8; FRAME_HEADER_LEN],
    seen: usize,
    report: Option<oneshot::Sender<FirstFrame>>,
    /// Dropped with the socket, telling the connection's calls.
    _alive: watch::Sender<()>,
}

impl<T> PrefaceWatch<T> {
    fn new(io: T, report: oneshot::Sender<FirstFrame>, alive: watch::Sender<()>) -> Self {
        PrefaceWatch {
            io,
            header: [0; FRAME_HEADER_LEN],
            seen: 0,
            report: Some(report),
            _alive: alive,
        }
    }

    fn observe(&mut self, bytes: &[u8]) {
        if self.report.is_none() {
            return;
        }
        let take = bytes.len().min(FRAME_HEADER_LEN - self.seen);
        self.header[self.seen..self.seen + take].copy_from_slice(&bytes[..take]);
        self.seen += take;
        if self.seen == FRAME_HEADER_LEN {
            let frame_type = self.header[3];
            let first = if frame_type == SETTINGS_FRAME {
                FirstFrame::Settings
            } else {
                FirstFrame::Other(frame_type)
            };
            if let Some(report) = self.report.take() {
                // The attempt may have given up already; nothing to tell then.
                let _ = report.send(first);
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for PrefaceWatch<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.observe(&buf.filled()[before..]);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for PrefaceWatch<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A94's name for why a connection ended: the first reason seen, a
/// GOAWAY's code, or the socket error's kind.
pub(crate) fn disconnect_error(closed: &Closed) -> &'static str {
    let error: &(dyn std::error::Error + 'static) = match closed {
        // hyper ends a connection without error when the peer closed it
        // after a GOAWAY (or at a frame boundary): as a graceful GOAWAY.
        Closed::Graceful | Closed::AlreadyReported => return "GOAWAY NO_ERROR",
        Closed::Task(e) if e.is_cancelled() => return "subchannel shutdown",
        Closed::Task(_) => return "unknown",
        Closed::Error(e) => e,
    };
    if error
        .downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout)
    {
        // hyper's keepalive timeout (gRFC A8).
        return "connection timed out";
    }
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if h2.is_go_away() && h2.is_remote() {
                return goaway(h2.reason());
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionReset => "connection reset",
                std::io::ErrorKind::TimedOut => "connection timed out",
                std::io::ErrorKind::ConnectionAborted => "connection aborted",
                _ => "socket error",
            };
        }
        source = e.source();
    }
    "unknown"
}

/// `GOAWAY <ERROR_CODE>` with RFC 9113's name of the code.
fn goaway(reason: Option<h2::Reason>) -> &'static str {
    match reason.map(u32::from) {
        Some(0x0) => "GOAWAY NO_ERROR",
        Some(0x1) => "GOAWAY PROTOCOL_ERROR",
        Some(0x2) => "GOAWAY INTERNAL_ERROR",
        Some(0x3) => "GOAWAY FLOW_CONTROL_ERROR",
        Some(0x4) => "GOAWAY SETTINGS_TIMEOUT",
        Some(0x5) => "GOAWAY STREAM_CLOSED",
        Some(0x6) => "GOAWAY FRAME_SIZE_ERROR",
        Some(0x7) => "GOAWAY REFUSED_STREAM",
        Some(0x8) => "GOAWAY CANCEL",
        Some(0x9) => "GOAWAY COMPRESSION_ERROR",
        Some(0xa) => "GOAWAY CONNECT_ERROR",
        Some(0xb) => "GOAWAY ENHANCE_YOUR_CALM",
        Some(0xc) => "GOAWAY INADEQUATE_SECURITY",
        Some(0xd) => "GOAWAY HTTP_1_1_REQUIRED",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subchannel::tests::{echo, refused_addr, settings_server, silent_server, WAIT};
    use tether_testkit::backend::HttpBackend;
    use tether_testkit::grpc::GrpcBackend;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    fn plain() -> SocketOptions {
        SocketOptions::from(&crate::subchannel::SubchannelOptions::default())
    }

    async fn connect_ok(address: SocketAddr) -> (Connection, ConnectionTask) {
        connect(address, WAIT, None, &Transport::Plain, &plain())
            .await
            .expect("connect")
    }

    #[tokio::test]
    async fn connects_and_sends_grpc_calls() {
        let backend = GrpcBackend::start("c1").await;
        let (conn, _task) = connect_ok(backend.addr()).await;
        let reply = echo(&conn, backend.addr(), "hi").await;
        assert_eq!(reply.backend, "c1");
        assert_eq!(reply.message, "hi");
        // Clones share the connection.
        let reply = echo(&conn.clone(), backend.addr(), "two").await;
        assert_eq!(reply.served, 2);
    }

    #[tokio::test]
    async fn refused_says_so() {
        let addr = refused_addr().await;
        let error = connect(addr, WAIT, None, &Transport::Plain, &plain())
            .await
            .expect_err("refused");
        assert!(matches!(error, ConnectError::Connect { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("connect {addr} failed: ")) && message.contains("refused"),
            "{message}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_server_times_out() {
        let (addr, _closed) = silent_server().await;
        let started = tokio::time::Instant::now();
        let error = connect(
            addr,
            Duration::from_secs(3),
            None,
            &Transport::Plain,
            &plain(),
        )
        .await
        .expect_err("silent");
        assert!(matches!(error, ConnectError::TimedOut { .. }), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!("connect {addr} timed out after 3s")
        );
        assert!(started.elapsed() >= Duration::from_secs(3));
    }

    #[tokio::test]
    async fn a_server_that_is_not_http2_is_rejected() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            if let Ok((mut socket, _)) = listener.accept().await {
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
                tokio::time::sleep(WAIT).await;
            }
        });
        let error = connect(addr, WAIT, None, &Transport::Plain, &plain())
            .await
            .expect_err("HTTP/1.1");
        assert!(
            matches!(
                error,
                ConnectError::NotHttp2 {
                    frame_type: b'P',
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("not an HTTP/2 server"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_server_that_closes_before_settings_fails_the_attempt() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            // Accept and close at once.
            let _ = listener.accept().await;
        });
        let error = connect(addr, WAIT, None, &Transport::Plain, &plain())
            .await
            .expect_err("closed");
        assert!(matches!(error, ConnectError::Closed { .. }), "{error:?}");
        log::info!("closed before SETTINGS: {error}");
    }

    #[tokio::test]
    async fn closed_completes_when_the_server_goes_away() {
        let backend = HttpBackend::start("h").await;
        let (conn, mut task) = connect_ok(backend.addr()).await;
        backend.stop().await;
        let reason = tokio::time::timeout(WAIT, task.closed())
            .await
            .expect("close not seen");
        assert!(
            matches!(reason, Closed::Graceful | Closed::Error(_)),
            "{reason:?}"
        );
        assert!(matches!(task.closed().await, Closed::AlreadyReported));
        let request = http::Request::new(Body::empty());
        assert!(conn.send(request).await.is_err());
    }

    #[tokio::test]
    async fn dropping_the_task_closes_the_socket() {
        let (addr, mut closed) = settings_server().await;
        let (conn, task) = connect_ok(addr).await;
        drop(task);
        tokio::time::timeout(WAIT, closed.recv())
            .await
            .expect("socket not closed")
            .expect("server gone");
        let request = http::Request::new(Body::empty());
        let sent = tokio::time::timeout(WAIT, conn.send(request)).await;
        assert!(matches!(sent, Ok(Err(_))), "{sent:?}");
    }
}

#[cfg(test)]
mod disconnect_error_tests {
    use super::*;

    #[test]
    fn goaway_codes_are_named_as_rfc_9113_does() {
        assert_eq!(goaway(Some(h2::Reason::NO_ERROR)), "GOAWAY NO_ERROR");
        assert_eq!(
            goaway(Some(h2::Reason::ENHANCE_YOUR_CALM)),
            "GOAWAY ENHANCE_YOUR_CALM"
        );
        assert_eq!(goaway(Some(h2::Reason::from(0x99))), "unknown");
        assert_eq!(disconnect_error(&Closed::Graceful), "GOAWAY NO_ERROR");
    }
}
