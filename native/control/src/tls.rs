//! ADS over TLS: tether-control's certificate and key (and, for mTLS, the
//! CA its clients' certificates must chain to), rustls with the ring
//! provider, ALPN `h2`. Each connection's handshake runs on its own task,
//! so a slow or failing client delays no other; [`AcceptLimits`] bound how
//! long a handshake may take and how many run at once, so clients that never
//! authenticate cannot exhaust the server.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_rustls::server::TlsStream;

/// A TLS server config from PEM files; errors name the file.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()));
    let certs = |p: &Path| -> Result<Vec<CertificateDer<'static>>, String> {
        let chain = CertificateDer::pem_slice_iter(&read(p)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: not PEM: {e}", p.display()))?;
        if chain.is_empty() {
            return Err(format!("{}: no CERTIFICATE block", p.display()));
        }
        Ok(chain)
    };
    let chain = certs(cert)?;
    let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| format!("{}: no usable PRIVATE KEY block: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certs(ca)? {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key_der)
        .map_err(|e| format!("{} with {}: {e}", cert.display(), key.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// One accepted TLS connection, as tonic's server takes it.
pub struct TlsConnection(TlsStream<TcpStream>);

impl tonic::transport::server::Connected for TlsConnection {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Limits on what [`incoming_with`] spends on clients that have not
/// authenticated yet: how long a TLS handshake may take and how many may be
/// in progress at once.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcceptLimits {
    /// How long a client has from accept to complete its TLS handshake;
    /// then its TCP connection is closed. Default 10 s.
    pub handshake_timeout: Duration,
    /// How many TLS handshakes may be in progress at once. With that many
    /// in progress no further connection is accepted until one ends (the
    /// kernel's listen backlog holds them meanwhile). Default 256; 0 is
    /// taken as 1.
    pub max_handshakes: usize,
}

impl Default for AcceptLimits {
    fn default() -> Self {
        AcceptLimits {
            // A real client handshakes in a few round trips; 10 s leaves a
            // slow, lossy link several retransmissions, yet frees a slot an
            // idle peer holds soon. Go's http.Transport gives a TLS handshake
            // 10 s (TLSHandshakeTimeout), Envoy its listener filters (the TLS
            // inspector) 15 s (listener_filters_timeout).
            handshake_timeout: Duration::from_secs(10),
            // ADS clients (Envoys, proxyless gRPC clients) hold one long-lived
            // stream each: 256 concurrent handshakes absorb a fleet
            // reconnecting at once, while bounding the tasks and buffers (a
            // rustls connection's are tens of KB) a flood of idle TCP
            // connections can claim.
            max_handshakes: 256,
        }
    }
}

/// The TLS connections accepted on `listener`, handshakes done, with the
/// default [`AcceptLimits`] (see [`incoming_with`]).
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsConnection>> {
    incoming_with(listener, config, AcceptLimits::default())
}

/// The TLS connections accepted on `listener`, handshakes done, within
/// `limits`: a handshake that fails or outlasts `limits.handshake_timeout`
/// closes its connection (each is logged at debug, with a warn summary at
/// most every 10 s), and at most `limits.max_handshakes` run at once. After
/// an accept error such as EMFILE (out of file descriptors) accepting backs
/// off, 5 ms doubling to 1 s, logged once at warn until an accept succeeds.
/// Accepting stops when the stream is dropped.
pub fn incoming_with(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    limits: AcceptLimits,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsConnection>> {
    let (tx, rx) = mpsc::channel(16);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(accept_loop(listener, acceptor, limits, tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// How often failed and timed-out handshakes are summed up at warn: each
/// one is only logged at debug, so a flood of them cannot flood the log.
const FAILURE_SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    limits: AcceptLimits,
    tx: mpsc::Sender<io::Result<TlsConnection>>,
) {
    let local = listener
        .local_addr()
        .map_or_else(|e| format!("(address unknown: {e})"), |a| a.to_string());
    let max_handshakes = limits.max_handshakes.clamp(1, Semaphore::MAX_PERMITS);
    if max_handshakes != limits.max_handshakes {
        log::warn!(
            "TLS on {local}: max_handshakes {} is out of range; using {max_handshakes}",
            limits.max_handshakes
        );
    }
    let timeout = limits.handshake_timeout;
    let slots = Arc::new(Semaphore::new(max_handshakes));
    let failures = Arc::new(HandshakeFailures::default());
    let mut last_summary = Instant::now();
    let mut summary = tokio::time::interval_at(
        last_summary + FAILURE_SUMMARY_INTERVAL,
        FAILURE_SUMMARY_INTERVAL,
    );
    summary.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut backoff = Backoff::default();
    loop {
        // A slot first, then a connection: with every slot taken, further
        // connections wait in the kernel's listen backlog, not as tasks
        // here. Both awaits are cancel-safe (a summary tick drops them).
        let next = async {
            let slot = Arc::clone(&slots).acquire_owned().await;
            (slot, listener.accept().await)
        };
        let (slot, accepted) = tokio::select! {
            () = tx.closed() => break,
            _ = summary.tick() => {
                last_summary = failures.summarize(&local, last_summary, timeout);
                continue;
            }
            next = next => next,
        };
        // The semaphore is never closed.
        let Ok(slot) = slot else { break };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            // One connection gone before it was accepted: nothing to wait
            // for (hyper's accept loop does the same).
            Err(e) if is_connection_error(&e) => {
                log::debug!("accept on {local}: {e}");
                continue;
            }
            Err(e) => {
                let (delay, first) = backoff.failed();
                if first {
                    log::warn!(
                        "accept on {local}: {e}; retrying from {:?} up to {:?} apart \
                         (further errors at debug until an accept succeeds)",
                        Backoff::FIRST,
                        Backoff::MAX,
                    );
                }
                log::debug!(
                    "accept on {local}: {e} ({} in a row); retrying in {delay:?}",
                    backoff.errors
                );
                tokio::select! {
                    () = tx.closed() => break,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
        };
        if let Some(errors) = backoff.succeeded() {
            log::info!("accept on {local} succeeds again after {errors} errors in a row");
        }
        let _ = tcp.set_nodelay(true);
        let (acceptor, tx, failures) = (acceptor.clone(), tx.clone(), Arc::clone(&failures));
        tokio::spawn(async move {
            // The TCP connection is dropped (closed) with this future by
            // the end of the statement, before the slot is released below:
            // the slots bound open sockets as well as tasks.
            let handshake = tokio::time::timeout(timeout, acceptor.accept(tcp)).await;
            match handshake {
                Ok(Ok(tls)) => {
                    let _ = tx.send(Ok(TlsConnection(tls))).await;
                }
                Ok(Err(e)) => {
                    log::debug!("TLS handshake with {peer} failed: {e}");
                    failures.failed.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    log::debug!(
                        "TLS handshake with {peer} timed out after {timeout:?}; connection closed"
                    );
                    failures.timed_out.fetch_add(1, Ordering::Relaxed);
                }
            }
            drop(slot);
        });
    }
    failures.summarize(&local, last_summary, timeout);
}

/// Errors that concern one connection, not the listener: hyper's list.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Handshakes that failed or timed out since the last summary.
#[derive(Default)]
struct HandshakeFailures {
    failed: AtomicU64,
    timed_out: AtomicU64,
}

impl HandshakeFailures {
    /// Logs (at warn) the handshakes that failed or timed out since `since`,
    /// if any, and starts counting anew; the new start.
    fn summarize(&self, local: &str, since: Instant, timeout: Duration) -> Instant {
        let failed = self.failed.swap(0, Ordering::Relaxed);
        let timed_out = self.timed_out.swap(0, Ordering::Relaxed);
        if failed + timed_out > 0 {
            log::warn!(
                "{local}: {} TLS handshakes failed or timed out in the last {} s \
                 ({failed} failed, {timed_out} timed out after {timeout:?}; each is logged at debug)",
                failed + timed_out,
                since.elapsed().as_secs(),
            );
        }
        Instant::now()
    }
}

/// The delay between accepts after an error such as EMFILE: without one
/// the loop would spin, since the listener stays readable while its backlog
/// holds connections. 5 ms doubling to 1 s, reset by a successful accept:
/// Go's net/http server's schedule.
#[derive(Debug, Default)]
struct Backoff {
    /// Errors in a row, since the last successful accept.
    errors: u32,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);

    /// After an error: the delay before accepting again, and whether this
    /// error starts an episode of them (the only one to log at warn).
    fn failed(&mut self) -> (Duration, bool) {
        self.errors = self.errors.saturating_add(1);
        // 5 ms << 8 is past 1 s already; the shift stays small.
        let delay = Self::FIRST.saturating_mul(1 << (self.errors - 1).min(8));
        (delay.min(Self::MAX), self.errors == 1)
    }

    /// After a successful accept: how many errors in a row it ends, if any.
    fn succeeded(&mut self) -> Option<u32> {
        let errors = std::mem::take(&mut self.errors);
        (errors > 0).then_some(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5ms_to_1s_and_resets_on_success() {
        let mut b = Backoff::default();
        let delays: Vec<(Duration, bool)> = (0..12).map(|_| b.failed()).collect();
        let ms: Vec<u128> = delays.iter().map(|d| d.0.as_millis()).collect();
        assert_eq!(
            ms,
            [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000]
        );
        assert_eq!(
            delays.iter().filter(|d| d.1).count(),
            1,
            "one warn per episode: {delays:?}"
        );
        assert_eq!(b.succeeded(), Some(12));
        assert_eq!(b.succeeded(), None);
        assert_eq!(b.failed(), (Duration::from_millis(5), true));
    }

    #[test]
    fn default_limits() {
        let limits = AcceptLimits::default();
        assert_eq!(limits.handshake_timeout, Duration::from_secs(10));
        assert_eq!(limits.max_handshakes, 256);
    }
}
