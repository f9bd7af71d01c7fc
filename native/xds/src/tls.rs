//! TLS for gRPC connections, the channel's and the XdsClient's: rustls
//! with the ring provider, ALPN `h2` (gRPC refuses a server that does not
//! agree to it), roots from PEM or the system's, an optional client
//! identity for mTLS.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// TLS settings for gRPC connections (`tether::ChannelBuilder::tls`, the
/// bootstrap's `tls` channel credentials):
/// the roots a server's chain must end in, an optional client certificate
/// and key (mTLS), and the name the server's certificate must carry.
/// Validated when made; cheap to clone.
#[derive(Clone)]
#[non_exhaustive]
pub struct TlsConfig {
    roots: Arc<RootCertStore>,
    identity: Option<Arc<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>>,
    server_name: Option<ServerName<'static>>,
    client: Arc<ClientConfig>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("roots", &self.roots.len())
            .field("identity", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// Why a TLS configuration could not be made; each names what it read.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// PEM text that holds no certificate, or an unreadable one.
    Certificates {
        /// What was read (e.g. `CA certificates from ca.pem`).
        what: String,
        /// Why it is unusable.
        problem: String,
    },
    /// A private key that is missing, unreadable or of a kind rustls
    /// cannot sign with.
    Key {
        /// What was read.
        what: String,
        /// Why it is unusable.
        problem: String,
    },
    /// A server name that is neither a DNS name nor an IP address.
    ServerName {
        /// The name given.
        name: String,
    },
    /// rustls refused the configuration.
    Config(rustls::Error),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Read { path, source } => write!(f, "reading {}: {source}", path.display()),
            TlsError::Certificates { what, problem } => write!(f, "{what}: {problem}"),
            TlsError::Key { what, problem } => write!(f, "{what}: {problem}"),
            TlsError::ServerName { name } => {
                write!(
                    f,
                    "server name {name:?} is neither a DNS name nor an IP address"
                )
            }
            TlsError::Config(e) => write!(f, "TLS configuration refused: {e}"),
        }
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsError::Read { source, .. } => Some(source),
            TlsError::Config(e) => Some(e),
            _ => None,
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in `pem`; at least one.
fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificates {
            what: what.to_owned(),
            problem: format!("not PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Certificates {
            what: what.to_owned(),
            problem: "no CERTIFICATE block".to_owned(),
        });
    }
    Ok(certs)
}

impl TlsConfig {
    /// TLS whose servers must chain to one of the certificates in `pem`
    /// (one or more `CERTIFICATE` blocks).
    pub fn from_ca_pem(pem: impl AsRef<[u8]>) -> Result<TlsConfig, TlsError> {
        Self::with_roots(pem.as_ref(), "CA certificates")
    }

    /// [`TlsConfig::from_ca_pem`] with the PEM read from `path`.
    pub fn from_ca_file(path: impl AsRef<Path>) -> Result<TlsConfig, TlsError> {
        let path = path.as_ref();
        Self::with_roots(
            &read(path)?,
            &format!("CA certificates from {}", path.display()),
        )
    }

    fn with_roots(pem: &[u8], what: &str) -> Result<TlsConfig, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in certificates(pem, what)? {
            roots.add(cert).map_err(|e| TlsError::Certificates {
                what: what.to_owned(),
                problem: format!("not a usable CA certificate: {e}"),
            })?;
        }
        TlsConfig::build(Arc::new(roots), None, None)
    }

    /// This with a client certificate chain (leaf first) and its private
    /// key (PKCS#8, PKCS#1 or SEC1 PEM), presented to servers that ask
    /// (mTLS).
    pub fn with_identity_pem(
        self,
        chain_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<TlsConfig, TlsError> {
        self.identity(
            chain_pem.as_ref(),
            "client certificate",
            key_pem.as_ref(),
            "client key",
        )
    }

    /// [`TlsConfig::with_identity_pem`] with the PEM read from files.
    pub fn with_identity_files(
        self,
        chain: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<TlsConfig, TlsError> {
        let (chain, key) = (chain.as_ref(), key.as_ref());
        self.identity(
            &read(chain)?,
            &format!("client certificate {}", chain.display()),
            &read(key)?,
            &format!("client key {}", key.display()),
        )
    }

    fn identity(
        self,
        chain_pem: &[u8],
        chain_what: &str,
        key_pem: &[u8],
        key_what: &str,
    ) -> Result<TlsConfig, TlsError> {
        let chain = certificates(chain_pem, chain_what)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key {
            what: key_what.to_owned(),
            problem: format!("no usable PRIVATE KEY block: {e}"),
        })?;
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| TlsError::Key {
            what: key_what.to_owned(),
            problem: format!("cannot sign with it: {e}"),
        })?;
        TlsConfig::build(self.roots, Some(Arc::new((chain, key))), self.server_name)
    }

    /// This verifying servers against `name` (a DNS name or an IP address)
    /// instead of the default: the target's name for `xds:///` targets,
    /// the endpoint's IP address for static ones.
    pub fn with_server_name(self, name: &str) -> Result<TlsConfig, TlsError> {
        let name = ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName {
            name: name.to_owned(),
        })?;
        Ok(TlsConfig {
            server_name: Some(name),
            ..self
        })
    }

    /// The roots a server's chain must end in.
    pub fn roots(&self) -> Arc<RootCertStore> {
        self.roots.clone()
    }

    /// Whether a server name was set.
    pub fn has_server_name(&self) -> bool {
        self.server_name.is_some()
    }

    /// TLS whose servers must chain to the system's roots (the platform's
    /// certificate store).
    pub fn from_system_roots() -> Result<TlsConfig, TlsError> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(TlsError::Certificates {
                what: "the system's CA certificates".to_owned(),
                problem: match found.errors.first() {
                    Some(e) => format!("none could be read: {e}"),
                    None => "none found".to_owned(),
                },
            });
        }
        TlsConfig::build(Arc::new(roots), None, None)
    }

    fn build(
        roots: Arc<RootCertStore>,
        identity: Option<Arc<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>>,
        server_name: Option<ServerName<'static>>,
    ) -> Result<TlsConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_root_certificates(roots.clone());
        let mut client = match &identity {
            Some(id) => builder
                .with_client_auth_cert(id.0.clone(), id.1.clone_key())
                .map_err(TlsError::Config)?,
            None => builder.with_no_client_auth(),
        };
        client.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsConfig {
            roots,
            identity,
            server_name,
            client: Arc::new(client),
        })
    }

    /// Runs the TLS handshake over `stream` to `address` and checks that
    /// the server agreed to HTTP/2.
    pub async fn handshake(
        &self,
        address: SocketAddr,
        stream: TcpStream,
    ) -> Result<TlsStream<TcpStream>, HandshakeError> {
        let name = self
            .server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(address.ip().into()));
        connect_h2(self.client.clone(), name, stream).await
    }

    /// Runs the TLS handshake over any stream (a Unix socket's), verifying
    /// the server name given by [`TlsConfig::with_server_name`].
    pub async fn handshake_named<S>(&self, stream: S) -> Result<TlsStream<S>, HandshakeError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let name = self.server_name.clone().ok_or_else(|| {
            HandshakeError::Credentials("no server name to verify the certificate against".into())
        })?;
        connect_h2(self.client.clone(), name, stream).await
    }
}

/// The TLS handshake with `config` over `stream`; the server must agree to
/// ALPN `h2`, as gRPC requires.
pub async fn connect_h2<S>(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    stream: S,
) -> Result<TlsStream<S>, HandshakeError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let tls = TlsConnector::from(config)
        .connect(name, stream)
        .await
        .map_err(HandshakeError::Tls)?;
    match tls.get_ref().1.alpn_protocol() {
        Some(b"h2") => Ok(tls),
        other => Err(HandshakeError::Alpn(other.map(<[u8]>::to_vec))),
    }
}

/// Why a TLS handshake failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum HandshakeError {
    /// rustls's error (a certificate that does not verify, a name that
    /// does not match, no shared protocol...), or the socket's.
    Tls(std::io::Error),
    /// The server did not agree to ALPN `h2` (what it chose, if anything).
    Alpn(Option<Vec<u8>>),
    /// The certificates to use could not be had (an xDS certificate
    /// provider's files).
    Credentials(String),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Tls(e) => write!(f, "{e}"),
            HandshakeError::Alpn(None) => {
                f.write_str("the server chose no ALPN protocol (gRPC needs h2)")
            }
            HandshakeError::Credentials(e) => f.write_str(e),
            HandshakeError::Alpn(Some(p)) => write!(
                f,
                "the server chose ALPN {:?} (gRPC needs h2)",
                String::from_utf8_lossy(p)
            ),
        }
    }
}

impl std::error::Error for HandshakeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HandshakeError::Tls(e) => Some(e),
            HandshakeError::Alpn(_) | HandshakeError::Credentials(_) => None,
        }
    }
}
