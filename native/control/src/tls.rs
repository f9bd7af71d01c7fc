//! ADS over TLS: tether-control's certificate and key (and, for mTLS, the
//! CA its clients' certificates must chain to), rustls with the ring
//! provider, ALPN `h2`. Each connection's handshake runs on its own task,
//! so a slow or failing client delays no other.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
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

/// The TLS connections accepted on `listener`, handshakes done (failed
/// ones are logged and dropped).
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<TlsConnection>> {
    let (tx, rx) = mpsc::channel(16);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("accept: {e}");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            if tx.is_closed() {
                return;
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok(tls) => {
                        let _ = tx.send(Ok(TlsConnection(tls))).await;
                    }
                    Err(e) => log::warn!("TLS handshake with {peer} failed: {e}"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
