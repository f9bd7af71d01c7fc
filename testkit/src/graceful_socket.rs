//! A server socket that ends an HTTP/2 connection the way gRPC servers do
//! (grpc-go, C-core), under a hyper server:
//!
//! - once the server has sent a GOAWAY, frames the client sends on streams
//!   above its last stream id are ignored (RFC 9113 §6.8). h2 ignores such
//!   HEADERS, DATA and RST_STREAM, but takes a WINDOW_UPDATE on one for a
//!   frame on an idle stream and ends the whole connection with
//!   PROTOCOL_ERROR, failing the calls below the id too. C-core sends
//!   exactly that when its new stream crosses the final GOAWAY: HEADERS,
//!   then a WINDOW_UPDATE for the stream. The socket drops WINDOW_UPDATE
//!   and RST_STREAM frames above the last stream id before h2 sees them
//!   (neither counts against flow control, unlike DATA, which passes).
//!   h2 fixes that id when it reads the answer to its shutdown PING, often
//!   in the same read as the frames behind it, so the socket works the id
//!   out as h2 will: the highest stream opened before that answer.
//!   A connection that does not open with HTTP/2's preface (HTTP/1.1) is
//!   passed through untouched.
//! - after the last GOAWAY the peer has time to read it. h2 closes at once
//!   when no stream is open, which would reset streams the client opened
//!   meanwhile before it could read that they were refused; gRPC servers
//!   wait for a PING's answer first. So the socket is not shut down when
//!   hyper is done: it reads and discards for a while, then closes.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How long a closing connection lingers.
const LINGER: Duration = Duration::from_millis(200);

/// The client connection preface, before the client's first frame.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PREFACE_LEN: usize = PREFACE.len();
/// An HTTP/2 frame header: length (3), type, flags, stream id (4).
const HEADER_LEN: usize = 9;
/// How much of a payload a scanner keeps: a PING's 8 bytes, a GOAWAY's
/// last stream id and error code.
const PREFIX_LEN: usize = 8;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const ACK: u8 = 0x1;

/// A server-side TCP stream with the behaviour described in the module
/// documentation.
pub struct GracefulSocket<S: AsyncRead + AsyncWrite + Unpin + Send + 'static = TcpStream> {
    stream: Option<S>,
    /// What the client sends.
    inbound: FrameScanner,
    /// What the server sends.
    outbound: FrameScanner,
    /// What both directions have said about the connection's end.
    limits: Limits,
    /// Filtered client bytes not yet handed to the server.
    pending: Vec<u8>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> GracefulSocket<S> {
    /// Wraps an accepted connection (TCP, or the plaintext side of TLS).
    pub fn new(stream: S) -> Self {
        Self {
            stream: Some(stream),
            inbound: FrameScanner::new(PREFACE_LEN),
            outbound: FrameScanner::new(0),
            limits: Limits::default(),
            pending: Vec::new(),
        }
    }
}

/// A frame's header and the first bytes of its payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    prefix: Vec<u8>,
}

impl Frame {
    fn word(&self, at: usize) -> Option<u32> {
        let b = self.prefix.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff)
    }
}

/// The server's going-away state, as the frames show it.
#[derive(Default)]
struct Limits {
    /// The client did not open with HTTP/2's preface (HTTP/1.1, say):
    /// nothing is scanned or dropped.
    not_http2: bool,
    /// The server has sent a GOAWAY.
    going_away: bool,
    /// The PING the server sent after its first GOAWAY.
    shutdown_ping: Option<Vec<u8>>,
    /// The highest stream the client has opened.
    opened: u32,
    /// The last stream id the server processes.
    last: Option<u32>,
}

impl Limits {
    fn cap(&mut self, id: u32) {
        self.last = Some(self.last.map_or(id, |last| last.min(id)));
    }

    /// Whether a client frame reaches the server.
    fn admits(&mut self, frame: &Frame) -> bool {
        if frame.kind == HEADERS {
            self.opened = self.opened.max(frame.stream);
        }
        let refused = self.last.is_some_and(|last| frame.stream > last);
        let keep = !(refused && matches!(frame.kind, RST_STREAM | WINDOW_UPDATE));
        if !keep {
            eprintln!(
                "DROP kind {} stream {} cap {:?} opened {}",
                frame.kind, frame.stream, self.last, self.opened
            );
            log::debug!(
                "ignored frame type {} on refused stream {}",
                frame.kind,
                frame.stream
            );
        }
        keep
    }

    /// A client frame, payload prefix included.
    fn client_sent(&mut self, frame: &Frame) {
        let answers_shutdown = frame.kind == PING
            && frame.flags & ACK != 0
            && self.shutdown_ping.as_ref() == Some(&frame.prefix);
        if answers_shutdown {
            let opened = self.opened;
            self.cap(opened);
        }
    }

    /// A server frame, payload prefix included.
    fn server_sent(&mut self, frame: &Frame) {
        match frame.kind {
            GOAWAY => {
                self.going_away = true;
                if let Some(last) = frame.word(0) {
                    self.cap(last);
                }
            }
            PING if frame.flags & ACK == 0 && self.going_away && self.shutdown_ping.is_none() => {
                self.shutdown_ping = Some(frame.prefix.clone());
            }
            _ => {}
        }
    }
}

/// Where a byte stream of HTTP/2 frames is.
enum Position {
    /// Inside the connection preface, this many bytes left.
    Preface(usize),
    /// Collecting a frame header.
    Header,
    /// Inside a frame's payload.
    Payload { left: usize, keep: bool },
}

/// Which way a scanner reads.
#[derive(Clone, Copy)]
enum Direction {
    FromClient,
    FromServer,
}

/// Follows frame boundaries across reads and writes of any size.
struct FrameScanner {
    at: Position,
    header: Vec<u8>,
    /// The frame being read, once its header is in.
    frame: Option<Frame>,
}

impl FrameScanner {
    fn new(preface: usize) -> Self {
        Self {
            at: if preface > 0 {
                Position::Preface(preface)
            } else {
                Position::Header
            },
            header: Vec::with_capacity(HEADER_LEN),
            frame: None,
        }
    }

    /// Runs over `bytes` in `direction`, telling `limits` of each frame,
    /// and appends to `out` the bytes of every frame `limits` admits.
    fn scan(&mut self, bytes: &[u8], direction: Direction, limits: &mut Limits, out: &mut Vec<u8>) {
        let mut rest = bytes;
        while !rest.is_empty() {
            if limits.not_http2 {
                out.extend_from_slice(rest);
                return;
            }
            match &mut self.at {
                Position::Preface(left) => {
                    let n = (*left).min(rest.len());
                    let at = PREFACE_LEN - *left;
                    if rest[..n] != PREFACE[at..at + n] {
                        limits.not_http2 = true;
                        continue;
                    }
                    out.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    *left -= n;
                    if *left == 0 {
                        self.at = Position::Header;
                    }
                }
                Position::Header => {
                    let n = (HEADER_LEN - self.header.len()).min(rest.len());
                    self.header.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    if self.header.len() < HEADER_LEN {
                        continue;
                    }
                    let h = &self.header;
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let frame = Frame {
                        kind: h[3],
                        flags: h[4],
                        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                        prefix: Vec::new(),
                    };
                    let keep = match direction {
                        Direction::FromClient => limits.admits(&frame),
                        Direction::FromServer => true,
                    };
                    if keep {
                        out.extend_from_slice(&self.header);
                    }
                    self.header.clear();
                    self.frame = Some(frame);
                    self.at = Position::Payload { left: len, keep };
                    if len == 0 {
                        self.end_frame(direction, limits);
                    }
                }
                Position::Payload { left, keep } => {
                    let n = (*left).min(rest.len());
                    if *keep {
                        out.extend_from_slice(&rest[..n]);
                    }
                    *left -= n;
                    let done = *left == 0;
                    if let Some(frame) = self.frame.as_mut() {
                        let want = (PREFIX_LEN - frame.prefix.len()).min(n);
                        frame.prefix.extend_from_slice(&rest[..want]);
                    }
                    rest = &rest[n..];
                    if done {
                        self.end_frame(direction, limits);
                    }
                }
            }
        }
    }

    fn end_frame(&mut self, direction: Direction, limits: &mut Limits) {
        if let Some(frame) = self.frame.take() {
            match direction {
                Direction::FromClient => limits.client_sent(&frame),
                Direction::FromServer => limits.server_sent(&frame),
            }
        }
        self.at = Position::Header;
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncRead for GracefulSocket<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.drain(..n);
                return Poll::Ready(Ok(()));
            }
            let Some(stream) = this.stream.as_mut() else {
                return Poll::Ready(Ok(()));
            };
            let mut raw = [0u8; 16 * 1024];
            let mut raw_buf = ReadBuf::new(&mut raw);
            match Pin::new(stream).poll_read(cx, &mut raw_buf) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            let read = raw_buf.filled();
            if read.is_empty() {
                return Poll::Ready(Ok(()));
            }
            let mut kept = std::mem::take(&mut this.pending);
            this.inbound
                .scan(read, Direction::FromClient, &mut this.limits, &mut kept);
            this.pending = kept;
            // A read that was all dropped frames reads again.
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncWrite for GracefulSocket<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(Ok(buf.len()));
        };
        let written = match Pin::new(stream).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        this.outbound.scan(
            &buf[..written],
            Direction::FromServer,
            &mut this.limits,
            &mut Vec::new(),
        );
        Poll::Ready(Ok(written))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.stream.as_mut() {
            Some(s) => Pin::new(s).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Closed on drop, after the linger.
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Drop for GracefulSocket<S> {
    fn drop(&mut self) {
        let Some(mut stream) = self.stream.take() else {
            return;
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut sink = [0u8; 4096];
                let until = tokio::time::Instant::now() + LINGER;
                while let Ok(Ok(n)) = tokio::time::timeout_at(until, stream.read(&mut sink)).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn goaway(last: u32) -> Vec<u8> {
        let mut payload = last.to_be_bytes().to_vec();
        payload.extend_from_slice(&0u32.to_be_bytes());
        frame(GOAWAY, 0, 0, &payload)
    }

    /// Scans `bytes` from the client in chunks of `size`, returning what
    /// passes.
    fn client(bytes: &[u8], size: usize, limits: &mut Limits) -> Vec<u8> {
        let mut scanner = FrameScanner::new(PREFACE_LEN);
        let mut out = Vec::new();
        for chunk in bytes.chunks(size) {
            scanner.scan(chunk, Direction::FromClient, limits, &mut out);
        }
        out
    }

    #[test]
    fn http1_passes_untouched() {
        let mut request = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n".to_vec();
        // Bytes that would read as a WINDOW_UPDATE frame were it HTTP/2.
        request.extend(frame(WINDOW_UPDATE, 0, 9, &5u32.to_be_bytes()));
        for size in [1, 3, request.len()] {
            let mut limits = Limits::default();
            limits.cap(0);
            assert_eq!(
                client(&request, size, &mut limits),
                request,
                "chunks of {size}"
            );
            assert!(limits.not_http2);
        }
    }

    #[test]
    fn a_goaway_split_across_writes_caps_the_streams() {
        let mut bytes = frame(0x4, 0, 0, &[]);
        bytes.extend(goaway(7));
        let mut limits = Limits::default();
        let mut scanner = FrameScanner::new(0);
        for chunk in bytes.chunks(3) {
            scanner.scan(chunk, Direction::FromServer, &mut limits, &mut Vec::new());
        }
        assert_eq!(limits.last, Some(7));
    }

    #[test]
    fn drops_only_resets_and_window_updates_above_the_last_stream_id() {
        let mut bytes = PREFACE.to_vec();
        let headers = frame(HEADERS, 0x4, 9, b"hdrs");
        let below = frame(RST_STREAM, 0, 7, &8u32.to_be_bytes());
        let above = frame(RST_STREAM, 0, 9, &8u32.to_be_bytes());
        let window = frame(WINDOW_UPDATE, 0, 9, &5u32.to_be_bytes());
        let data = frame(0x0, 0, 9, b"data");
        for f in [&headers, &below, &window, &above, &data] {
            bytes.extend_from_slice(f);
        }
        for size in [1, 5, 13, bytes.len()] {
            let mut limits = Limits::default();
            limits.cap(7);
            let mut want = PREFACE.to_vec();
            for f in [&headers, &below, &data] {
                want.extend_from_slice(f);
            }
            assert_eq!(client(&bytes, size, &mut limits), want, "chunks of {size}");
        }
    }

    #[test]
    fn the_answer_to_the_shutdown_ping_caps_the_streams_in_the_same_read() {
        let ping = *b"shutdown";
        let mut limits = Limits::default();
        let mut server = FrameScanner::new(0);
        let mut sent = goaway(0x7fff_ffff);
        sent.extend(frame(PING, 0, 0, &ping));
        server.scan(&sent, Direction::FromServer, &mut limits, &mut Vec::new());

        let mut bytes = PREFACE.to_vec();
        let first = frame(HEADERS, 0x4, 1, b"hdrs");
        let early = frame(WINDOW_UPDATE, 0, 1, &5u32.to_be_bytes());
        let answer = frame(PING, ACK, 0, &ping);
        let late = frame(HEADERS, 0x4, 3, b"hdrs");
        let refused = frame(WINDOW_UPDATE, 0, 3, &5u32.to_be_bytes());
        for f in [&first, &early, &answer, &late, &refused] {
            bytes.extend_from_slice(f);
        }
        let mut want = PREFACE.to_vec();
        for f in [&first, &early, &answer, &late] {
            want.extend_from_slice(f);
        }
        assert_eq!(client(&bytes, bytes.len(), &mut limits), want);
        assert_eq!(limits.last, Some(1));
    }
}
