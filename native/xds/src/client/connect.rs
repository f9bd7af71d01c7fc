//! The connection to the management server: TCP, TLS (gRFC A65) or a
//! Unix domain socket (plain or TLS), as the bootstrap's server says.

use std::sync::{Arc, Mutex};

use tokio_rustls::client::TlsStream;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

use crate::bootstrap::{BootstrapError, ChannelCreds, ServerAddress, XdsServer};

/// The lazy channel to `server`, and whether it is TLS.
pub(super) fn channel(server: &XdsServer) -> Result<(Channel, bool), BootstrapError> {
    // `secure` comes from the connector each arm builds, so no transport
    // can be plaintext while the stream believes it is encrypted.
    let (channel, secure) = match (server.address(), &server.channel_creds) {
        (ServerAddress::Unix(path), ChannelCreds::Tls(creds)) => (
            Endpoint::from_static(UNIX_ENDPOINT)
                .connect_with_connector_lazy(TlsConnector::new(creds.clone()).unix_connector(path)),
            true,
        ),
        (ServerAddress::Unix(path), ChannelCreds::Insecure) => (
            Endpoint::from_static(UNIX_ENDPOINT).connect_with_connector_lazy(unix_connector(path)),
            false,
        ),
        (ServerAddress::Tcp(uri), creds) => {
            let endpoint = Endpoint::from_shared(uri).map_err(|e| BootstrapError {
                field: "xds_servers[0].server_uri".into(),
                value: server.server_uri.clone(),
                problem: format!("is not a valid URI: {e}"),
            })?;
            match creds {
                ChannelCreds::Tls(creds) => (
                    endpoint
                        .connect_with_connector_lazy(TlsConnector::new(creds.clone()).connector()),
                    true,
                ),
                ChannelCreds::Insecure => (endpoint.connect_lazy(), false),
            }
        }
    };
    Ok((channel, secure))
}

/// A connection future a [`Connector`] hands to tonic.
type Dialing<S> = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<S>> + Send>>;

/// A tonic connector made of a function from the URI to a connection (a
/// Unix socket, TLS over TCP).
#[derive(Clone)]
struct Connector<F>(F);

impl<F, S> tower_service::Service<Uri> for Connector<F>
where
    F: Fn(Uri) -> Dialing<S>,
    S: Send + 'static,
{
    type Response = hyper_util::rt::TokioIo<S>;
    type Error = std::io::Error;
    type Future = Dialing<Self::Response>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dialing = (self.0)(uri);
        Box::pin(async move { dialing.await.map(hyper_util::rt::TokioIo::new) })
    }
}

/// gRPC's authority for a Unix socket, the name a TLS server there must
/// carry.
const UNIX_AUTHORITY: &str = "localhost";
/// The URI tonic's endpoint takes for a Unix socket (its connector ignores it).
const UNIX_ENDPOINT: &str = "http://localhost";

/// Dials the management server's Unix domain socket (the URI is ignored).
fn unix_connector(
    path: std::path::PathBuf,
) -> Connector<impl Fn(Uri) -> Dialing<tokio::net::UnixStream> + Clone> {
    let path = Arc::new(path);
    Connector(move |_| {
        let path = path.clone();
        Box::pin(async move {
            tokio::net::UnixStream::connect(path.as_path())
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        }) as Dialing<_>
    })
}

/// Dials the management server over TLS (gRFC A65): the files are read
/// for each new connection, so rotated certificates are used by the next
/// one; a read that fails uses the last good ones. The server's
/// certificate must carry the server URI's host.
#[derive(Clone)]
struct TlsConnector {
    creds: Arc<crate::bootstrap::TlsCreds>,
    last_good: Arc<Mutex<Option<crate::tls::TlsConfig>>>,
}

impl TlsConnector {
    fn new(creds: crate::bootstrap::TlsCreds) -> Self {
        TlsConnector {
            creds: Arc::new(creds),
            last_good: Arc::default(),
        }
    }

    fn config(&self) -> Result<crate::tls::TlsConfig, String> {
        let read = || -> Result<crate::tls::TlsConfig, crate::tls::TlsError> {
            let tls = match &self.creds.ca_certificate_file {
                Some(ca) => crate::tls::TlsConfig::from_ca_file(ca)?,
                None => crate::tls::TlsConfig::from_system_roots()?,
            };
            match (&self.creds.certificate_file, &self.creds.private_key_file) {
                (Some(cert), Some(key)) => tls.with_identity_files(cert, key),
                _ => Ok(tls),
            }
        };
        let mut last = self.last_good.lock().unwrap_or_else(|e| e.into_inner());
        match read() {
            Ok(tls) => {
                *last = Some(tls.clone());
                Ok(tls)
            }
            Err(e) => match &*last {
                Some(tls) => {
                    log::warn!("xDS server TLS: {e}; using the certificates read before");
                    Ok(tls.clone())
                }
                None => Err(format!("xDS server TLS: {e}")),
            },
        }
    }
}

impl TlsConnector {
    /// The connector tonic takes.
    fn connector(
        self,
    ) -> Connector<impl Fn(Uri) -> Dialing<TlsStream<tokio::net::TcpStream>> + Clone> {
        Connector(move |uri| {
            let this = self.clone();
            Box::pin(async move { this.dial(uri).await }) as Dialing<_>
        })
    }

    /// The connector tonic takes for a `unix:` server: TLS over the Unix
    /// stream, as C-core runs its channel credentials over any transport.
    /// The certificate must name `localhost`, gRPC's authority for Unix
    /// sockets.
    fn unix_connector(
        self,
        path: std::path::PathBuf,
    ) -> Connector<impl Fn(Uri) -> Dialing<TlsStream<tokio::net::UnixStream>> + Clone> {
        let path = Arc::new(path);
        Connector(move |_| {
            let (this, path) = (self.clone(), path.clone());
            Box::pin(async move {
                let other = |e: String| std::io::Error::other(e);
                let tls = this
                    .config()
                    .and_then(|t| {
                        t.with_server_name(UNIX_AUTHORITY)
                            .map_err(|e| e.to_string())
                    })
                    .map_err(other)?;
                let unix = tokio::net::UnixStream::connect(path.as_path())
                    .await
                    .map_err(|e| {
                        std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                    })?;
                tls.handshake_named(unix).await.map_err(|e| {
                    other(format!("TLS handshake over {} failed: {e}", path.display()))
                })
            }) as Dialing<_>
        })
    }

    async fn dial(&self, uri: Uri) -> std::io::Result<TlsStream<tokio::net::TcpStream>> {
        let other = |e: String| std::io::Error::other(e);
        let host = uri
            .host()
            .ok_or_else(|| other(format!("{uri} has no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let tls = self
            .config()
            .and_then(|t| t.with_server_name(&host).map_err(|e| e.to_string()))
            .map_err(other)?;
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        let _ = tcp.set_nodelay(true);
        let peer = tcp.peer_addr()?;
        tls.handshake(peer, tcp)
            .await
            .map_err(|e| other(format!("TLS handshake with {host}:{port} failed: {e}")))
    }
}
