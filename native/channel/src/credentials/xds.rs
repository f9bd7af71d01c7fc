//! xDS-managed TLS (gRFC A29): a cluster's `UpstreamTlsContext` applied to
//! the connections of its endpoints. The server's chain must end in the
//! roots of the cluster's CA provider instance (no host name is checked)
//! and one of its SANs must satisfy the cluster's matchers; the client
//! presents the identity provider's certificate when there is one. Each
//! connection attempt takes the providers' material as it is then, so a
//! rotated certificate is used by new connections.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tether_xds::resource::security::{Roots, SanMatcher, UpstreamTls};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::provider::{Provider, ProviderStore};
use super::san;
use super::HandshakeError;

/// A cluster's TLS with its provider instances; subchannels made for the
/// cluster carry it, and subchannels with equal ones are shared.
pub struct XdsSecurity {
    config: UpstreamTls,
    /// The roots' provider; `None`: the system's roots (gRFC A82).
    roots: Option<Arc<Provider>>,
    identity: Option<Arc<Provider>>,
}

impl fmt::Debug for XdsSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdsSecurity")
            .field(
                "roots",
                &self.roots.as_ref().map_or("(system)", |p| p.name()),
            )
            .field("identity", &self.identity.as_ref().map(|p| p.name()))
            .field("san_matchers", &self.config.san_matchers.len())
            .finish()
    }
}

impl PartialEq for XdsSecurity {
    fn eq(&self, other: &Self) -> bool {
        self.config == other.config
    }
}

impl XdsSecurity {
    /// The cluster's TLS over the store's provider instances.
    pub(crate) fn new(config: &UpstreamTls, store: &ProviderStore) -> Result<Self, String> {
        Ok(XdsSecurity {
            roots: match &config.roots {
                Roots::Provider(p) => Some(store.get(&p.instance_name)?),
                Roots::System => None,
                other => return Err(format!("roots {other:?} are not supported")),
            },
            identity: config
                .identity
                .as_ref()
                .map(|i| store.get(&i.instance_name))
                .transpose()?,
            config: config.clone(),
        })
    }

    /// A rustls config from the providers' material as it is now.
    fn client_config(&self) -> Result<ClientConfig, String> {
        let roots = match &self.roots {
            None => system_roots()?,
            Some(p) => {
                let m = p.material();
                match (&m.roots, &m.error) {
                    (Some(r), _) => r.clone(),
                    (None, Some(e)) => {
                        return Err(format!("certificate provider {:?}: {e}", p.name()))
                    }
                    (None, None) => {
                        return Err(format!(
                        "certificate provider {:?} has no CA certificates (ca_certificate_file)",
                        p.name()
                    ))
                    }
                }
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(SanVerifier {
            roots,
            matchers: self.config.san_matchers.clone(),
            provider: provider.clone(),
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some(p) => {
                let m = p.material();
                let Some(id) = &m.identity else {
                    return Err(match &m.error {
                        Some(e) => format!("certificate provider {:?}: {e}", p.name()),
                        None => format!(
                            "certificate provider {:?} has no identity (certificate_file)",
                            p.name()
                        ),
                    });
                };
                builder
                    .with_client_auth_cert(id.0.clone(), id.1.clone_key())
                    .map_err(|e| format!("certificate provider {:?}: {e}", p.name()))?
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }

    /// Runs the handshake over `stream` and checks ALPN `h2`.
    pub(crate) async fn handshake(
        &self,
        address: SocketAddr,
        stream: TcpStream,
    ) -> Result<TlsStream<TcpStream>, HandshakeError> {
        let config = self.client_config().map_err(HandshakeError::Credentials)?;
        // No host name is checked (SanVerifier): the name is only sent.
        let name = ServerName::IpAddress(address.ip().into());
        tether_xds::tls::connect_h2(Arc::new(config), name, stream).await
    }
}

/// The system's roots, read once per process (the platform's store, or
/// the file `SSL_CERT_FILE` names).
fn system_roots() -> Result<Arc<RootCertStore>, String> {
    static ROOTS: std::sync::OnceLock<Result<Arc<RootCertStore>, String>> =
        std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            tether_xds::tls::TlsConfig::from_system_roots()
                .map(|c| c.roots())
                .map_err(|e| e.to_string())
        })
        .clone()
}

/// Verifies the chain against the roots without a host name, then the
/// SANs against the cluster's matchers.
#[derive(Debug)]
struct SanVerifier {
    roots: Arc<RootCertStore>,
    matchers: Vec<SanMatcher>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|e| rustls::Error::InvalidCertificate(webpki_error(e)))?;
        cert.verify_for_usage(
            self.provider.signature_verification_algorithms.all,
            &self.roots.roots,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(|e| rustls::Error::InvalidCertificate(webpki_error(e)))?;
        let sans = san::sans(end_entity);
        if tether_xds::resource::san::verify(&sans, &self.matchers) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "no SAN of the server's certificate {sans:?} matches the cluster's match_subject_alt_names"
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// webpki's error as rustls names it.
fn webpki_error(e: webpki::Error) -> rustls::CertificateError {
    use rustls::CertificateError as C;
    match e {
        webpki::Error::UnknownIssuer => C::UnknownIssuer,
        webpki::Error::CertExpired { .. } => C::Expired,
        webpki::Error::CertNotValidYet { .. } => C::NotValidYet,
        webpki::Error::InvalidSignatureForPublicKey => C::BadSignature,
        other => C::Other(rustls::OtherError(Arc::new(WebpkiError(other)))),
    }
}

#[derive(Debug)]
struct WebpkiError(webpki::Error);

impl fmt::Display for WebpkiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for WebpkiError {}
