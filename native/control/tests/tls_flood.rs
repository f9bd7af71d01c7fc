//! tether-control's TLS accept loop under clients that never authenticate,
//! on real sockets on 127.0.0.1:
//!
//! - a flood of idle TCP connections (no ClientHello ever) holds at most
//!   `max_handshakes` accepted sockets, each closed after the handshake
//!   timeout, costs little CPU, logs a summary rather than a line each at
//!   warn, and a real TLS client still gets through;
//! - accept errors (EMFILE: out of file descriptors) back off instead of
//!   spinning, with one warn for the episode, and accepting resumes when
//!   descriptors are free again.
//!
//! The tests wait on signals (a connection closed by the server, a
//! handshake done, a log record), each bounded by a deadline. They share
//! the process's descriptor table, its CPU time and the logger, so they
//! run one at a time.

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tether_control::tls::{incoming_with, AcceptLimits};
use tether_testkit::tls::{self as testtls, Ca};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Notify;
use tokio_rustls::TlsConnector;
use tokio_stream::StreamExt;

/// Idle TCP connections in the flood.
const FLOOD: usize = 300;
/// The flood's handshake slots and timeout: the flood clears in about
/// FLOOD / MAX_HANDSHAKES * HANDSHAKE_TIMEOUT (10 s), so the real client,
/// queued behind it in the listen backlog, gets through within the test.
const MAX_HANDSHAKES: usize = 16;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long any one awaited signal may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(60);

/// One test at a time (see the module comment), from before its runtime
/// exists: building one needs descriptors too.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[test]
fn idle_connection_flood_is_bounded_timed_out_and_cheap() {
    let _serial = serial();
    runtime().block_on(flood());
}

async fn flood() {
    let logs = Capture::start();
    let pki = Pki::new();
    // A backlog the whole flood fits in (TcpListener::bind's is 128): no
    // client waits on SYN retransmissions, so the phase's length is the
    // server's doing.
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let listener = socket.listen(1024).expect("listen");
    let addr = listener.local_addr().expect("local address");
    let mut limits = AcceptLimits::default();
    limits.max_handshakes = MAX_HANDSHAKES;
    limits.handshake_timeout = HANDSHAKE_TIMEOUT;

    let fds_before = open_fds();
    let (cpu_before, start) = (cpu_time(), Instant::now());
    let mut incoming = incoming_with(listener, pki.server.clone(), limits);
    let mut idle = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        let conn = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("idle connection {i} to {addr}: {e}"));
        idle.push(conn);
    }

    // The first idle connection was accepted first: the server closes it
    // once its handshake timeout passes (without one, never).
    within("the server to close the first idle connection", async {
        closed_by_server(&mut idle[0]).await
    })
    .await;
    assert!(
        start.elapsed() >= HANDSHAKE_TIMEOUT,
        "the first idle connection was closed after {:?}, before the handshake timeout {HANDSHAKE_TIMEOUT:?}",
        start.elapsed()
    );
    // Every client socket is still open; any descriptor beyond them is a
    // connection the server accepted and holds: at most one per slot, the
    // rest wait in the kernel's backlog.
    let server_side = open_fds() as i64 - fds_before as i64 - FLOOD as i64;
    eprintln!(
        "first idle connection closed after {:?}; the server held {server_side} of them",
        start.elapsed()
    );
    assert!(
        server_side <= MAX_HANDSHAKES as i64,
        "the server holds {server_side} accepted connections of the {FLOOD} idle ones; \
         max_handshakes is {MAX_HANDSHAKES}"
    );

    // A real client, queued behind the whole flood, completes its handshake
    // and its connection comes out of the stream.
    let connector = TlsConnector::from(pki.client.clone());
    let client = async {
        let tcp = TcpStream::connect(addr).await?;
        connector.connect(server_name(), tcp).await
    };
    let (client, server) = within("the real client's handshake", async {
        tokio::join!(client, incoming.next())
    })
    .await;
    let mut client = client.expect("the real client's TLS handshake");
    let mut server = server
        .expect("the incoming stream ended")
        .expect("the server side of the real client's connection");
    assert_eq!(client.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    server.write_all(b"hello").await.expect("server write");
    let mut hello = [0u8; 5];
    client.read_exact(&mut hello).await.expect("client read");
    assert_eq!(&hello, b"hello");

    // Every idle connection was closed by the server (the last few slots'
    // timeouts may still be running).
    for (i, conn) in idle.iter_mut().enumerate() {
        within(&format!("the server to close idle connection {i}"), async {
            closed_by_server(conn).await
        })
        .await;
    }
    let timed_out = |r: &[Rec]| {
        r.iter()
            .filter(|r| r.level == log::Level::Debug && r.message.contains("timed out"))
            .count()
    };
    within("a debug record for each idle connection", async {
        logs.wait(|r| timed_out(r) >= FLOOD).await
    })
    .await;
    let (cpu, elapsed) = (cpu_time() - cpu_before, start.elapsed());
    eprintln!("flood phase: {elapsed:?}, {cpu:?} of CPU");

    // A busy loop or per-connection spinning would burn seconds here; the
    // flood's real work is FLOOD accepts, timers and closes.
    assert!(
        cpu < Duration::from_millis(500),
        "the flood phase ({elapsed:?}) took {cpu:?} of CPU"
    );
    let records = logs.records();
    assert_eq!(
        timed_out(&records),
        FLOOD,
        "the real client's handshake must not time out"
    );
    // At warn only a summary every 10 s, not a line per connection.
    let warns: Vec<&Rec> = records
        .iter()
        .filter(|r| r.level <= log::Level::Warn)
        .collect();
    assert!(
        warns.len() as u64 <= elapsed.as_secs() / 10 + 1
            && warns.iter().all(|r| r.message.contains("in the last")),
        "{} warn records in {elapsed:?}: {warns:?}",
        warns.len()
    );
}

#[test]
fn accept_errors_back_off_instead_of_spinning() {
    let _serial = serial();
    runtime().block_on(accept_errors());
}

async fn accept_errors() {
    let logs = Capture::start();
    let pki = Pki::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local address");
    // A connection waiting in the backlog keeps the listener readable, so
    // every accept fails at once while descriptors are out.
    let tcp = TcpStream::connect(addr).await.expect("connect");

    let exhausted = FdLimit::exhaust();
    let (cpu_before, start) = (cpu_time(), Instant::now());
    let mut incoming = incoming_with(listener, pki.server.clone(), AcceptLimits::default());
    // Records naming EMFILE: one per error at debug (at warn in the old
    // loop), and the episode's warn.
    let emfile = |r: &[Rec]| {
        r.iter()
            .filter(|r| r.message.contains("os error 24"))
            .count()
    };
    // 5 + 10 + ... + 320 ms between the first error and the eighth.
    const ERRORS: usize = 8;
    const BACKED_OFF: Duration = Duration::from_millis(635);
    within("8 accept errors", async {
        logs.wait(|r| emfile(r) > ERRORS).await
    })
    .await;
    let (cpu, elapsed) = (cpu_time() - cpu_before, start.elapsed());
    eprintln!("{ERRORS} accept errors: {elapsed:?}, {cpu:?} of CPU");
    let records = logs.records();
    assert!(
        elapsed >= BACKED_OFF,
        "{} accept error records within {elapsed:?}: no back-off ({:?} ...)",
        logs.total(),
        records.first()
    );
    assert!(
        cpu < Duration::from_millis(250),
        "{elapsed:?} of failing accepts took {cpu:?} of CPU"
    );
    let warns: Vec<&Rec> = records
        .iter()
        .filter(|r| r.level <= log::Level::Warn)
        .collect();
    assert!(
        warns.len() == 1 && warns[0].message.contains("os error 24"),
        "one warn per episode, naming the error: {warns:?}"
    );

    // Descriptors are free again: the waiting client gets through.
    drop(exhausted);
    let connector = TlsConnector::from(pki.client.clone());
    let (client, server) = within("the handshake after the accept errors", async {
        tokio::join!(connector.connect(server_name(), tcp), incoming.next())
    })
    .await;
    client.expect("the client's TLS handshake");
    server
        .expect("the incoming stream ended")
        .expect("the server side of the connection");
    within("the recovery record", async {
        logs.wait(|r| {
            r.iter()
                .any(|r| r.level == log::Level::Info && r.message.contains("succeeds again"))
        })
        .await
    })
    .await;
}

/// A test CA, the server's config (a certificate for 127.0.0.1) and a
/// client config trusting the CA, both with ALPN `h2`.
struct Pki {
    server: Arc<rustls::ServerConfig>,
    client: Arc<ClientConfig>,
}

impl Pki {
    fn new() -> Pki {
        let ca = Ca::new("tls-flood CA");
        let server = testtls::server_config(&ca.issue(&["127.0.0.1"]), None);
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).expect("CA PEM"))
            .expect("CA certificate");
        let mut client =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        client.alpn_protocols = vec![b"h2".to_vec()];
        Pki {
            server,
            client: Arc::new(client),
        }
    }
}

fn server_name() -> ServerName<'static> {
    ServerName::try_from("127.0.0.1").expect("an IP address server name")
}

/// `signal` within [`DEADLINE`], else the test fails naming `what`.
async fn within<T>(what: &str, signal: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, signal)
        .await
        .unwrap_or_else(|_| panic!("waited {DEADLINE:?} for {what} in vain"))
}

/// Returns when the server closes `conn` (EOF or reset); it must send nothing.
async fn closed_by_server(conn: &mut TcpStream) {
    let mut byte = [0u8; 1];
    if let Ok(n @ 1..) = conn.read(&mut byte).await {
        panic!("the server sent {n} bytes to a client that sent none");
    }
}

/// The process's open file descriptors.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// The process's CPU time so far, user and system.
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a rusage into the pointer it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage: {}", std::io::Error::last_os_error());
    // SAFETY: initialised by getrusage (and zeroed before).
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// RLIMIT_NOFILE lowered to the lowest free descriptor, so opening any
/// new one fails with EMFILE; restored on drop (also when a test fails).
struct FdLimit(libc::rlimit);

impl FdLimit {
    fn exhaust() -> FdLimit {
        use std::os::fd::AsRawFd;
        let lowest_free = std::fs::File::open("/dev/null")
            .expect("/dev/null")
            .as_raw_fd();
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes an rlimit into the pointer it is given.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) };
        assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
        let low = libc::rlimit {
            rlim_cur: lowest_free as libc::rlim_t,
            rlim_max: old.rlim_max,
        };
        // SAFETY: setrlimit reads the rlimit it is given.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) };
        assert_eq!(
            rc,
            0,
            "setrlimit(RLIMIT_NOFILE, {lowest_free}): {}",
            std::io::Error::last_os_error()
        );
        FdLimit(old)
    }
}

impl Drop for FdLimit {
    fn drop(&mut self) {
        // SAFETY: setrlimit reads the rlimit it is given.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.0) };
        if rc != 0 {
            eprintln!(
                "restoring RLIMIT_NOFILE: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// A log record of tether-control's TLS module.
#[derive(Debug, Clone)]
struct Rec {
    level: log::Level,
    message: String,
}

/// The process's logger: keeps tether_control::tls's records (debug and
/// up) for the running test, and wakes those waiting for one.
struct Capture {
    /// The first records (kept bounded should a busy loop log without end)
    /// and how many there were in all.
    records: Mutex<(Vec<Rec>, usize)>,
    logged: Notify,
}

static CAPTURE: LazyLock<Capture> = LazyLock::new(|| Capture {
    records: Mutex::new((Vec::new(), 0)),
    logged: Notify::new(),
});

/// Records kept at most.
const KEPT: usize = 10_000;

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target().starts_with("tether_control::tls")
            && metadata.level() <= log::Level::Debug
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        {
            let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
            records.1 += 1;
            if records.0.len() < KEPT {
                records.0.push(Rec {
                    level: record.level(),
                    message: record.args().to_string(),
                });
            }
        }
        self.logged.notify_waiters();
    }

    fn flush(&self) {}
}

impl Capture {
    /// The logger, installed once, with the records of earlier tests
    /// cleared.
    fn start() -> &'static Capture {
        let capture: &'static Capture = &CAPTURE;
        // Fails only when already installed (by an earlier test).
        let _ = log::set_logger(capture);
        log::set_max_level(log::LevelFilter::Debug);
        *capture.records.lock().unwrap_or_else(|e| e.into_inner()) = (Vec::new(), 0);
        capture
    }

    fn records(&self) -> Vec<Rec> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// All records logged, kept or not.
    fn total(&self) -> usize {
        self.records.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Returns once the kept records satisfy `done`.
    async fn wait(&self, done: impl Fn(&[Rec]) -> bool) {
        loop {
            // Registered before the check, so no record slips in between.
            let logged = self.logged.notified();
            tokio::pin!(logged);
            logged.as_mut().enable();
            if done(&self.records.lock().unwrap_or_else(|e| e.into_inner()).0) {
                return;
            }
            logged.await;
        }
    }
}
