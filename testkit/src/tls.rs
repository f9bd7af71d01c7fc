//! Certificates the tests generate (rcgen; no key is ever checked in) and
//! rustls server configs for the test backends
//! ([`crate::grpc::GrpcBackend::start_tls`]).
//!
//! A [`Ca`] issues leaf certificates with the SANs a test names: DNS
//! names, IP addresses (`127.0.0.1`, `::1`) and URIs (`spiffe://...`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// A certificate authority made for one test.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate a [`Ca`] issued, with its key, as PEM.
#[derive(Clone)]
pub struct Issued {
    /// The certificate chain, leaf first (the leaf alone: the CA signed it).
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
    /// The leaf's DER, to compare with what a peer presented.
    pub cert_der: Vec<u8>,
}

impl Ca {
    /// A self-signed CA called `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca { cert, key }
    }

    /// The CA's certificate as PEM (the roots a peer trusts).
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A leaf certificate with these SANs: an IP address, a URI (with
    /// `://`, or any text after `uri:`), an e-mail address (after
    /// `email:`) or else a DNS name.
    pub fn issue(&self, sans: &[&str]) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, sans.first().copied().unwrap_or("leaf"));
        for san in sans {
            params
                .subject_alt_names
                .push(if let Ok(ip) = san.parse::<IpAddr>() {
                    SanType::IpAddress(ip)
                } else if let Some(uri) = san.strip_prefix("uri:") {
                    SanType::URI(uri.try_into().expect("a URI SAN"))
                } else if let Some(email) = san.strip_prefix("email:") {
                    SanType::Rfc822Name(email.try_into().expect("an e-mail SAN"))
                } else if san.contains("://") {
                    SanType::URI((*san).try_into().expect("a URI SAN"))
                } else {
                    SanType::DnsName((*san).try_into().expect("a DNS SAN"))
                });
        }
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("leaf certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
        }
    }
}

impl Issued {
    /// Writes the certificate and key into `dir` as `NAME.pem` and
    /// `NAME.key`; their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write the certificate");
        std::fs::write(&key, &self.key_pem).expect("write the key");
        (cert, key)
    }
}

/// A server config presenting `identity`, offering ALPN `h2`; with
/// `clients`, it requires a client certificate issued by that CA (mTLS).
pub fn server_config(identity: &Issued, clients: Option<&Ca>) -> Arc<ServerConfig> {
    let chain = CertificateDer::pem_slice_iter(identity.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("server chain");
    let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes()).expect("server key");
    let roots = clients.map(|ca| vec![ca.cert.der().clone()]);
    build_server_config(chain, key, roots).expect("server config")
}

/// [`server_config`] from PEM files: the certificate chain (leaf first),
/// its key and, for mTLS, the CA certificates client certificates must
/// chain to. Errors name the file and what is wrong with it.
pub fn server_config_from_files(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, String> {
    let certs = |path: &Path| {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("{}: no PEM certificate in it", path.display()));
        }
        Ok(certs)
    };
    let chain = certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let roots = client_ca.map(certs).transpose()?;
    build_server_config(chain, key, roots)
}

fn build_server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: Option<Vec<CertificateDer<'static>>>,
) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?;
    let builder = match client_roots {
        Some(certs) => {
            let mut roots = RootCertStore::empty();
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("a client CA certificate: {e}"))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("the client certificate verifier: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("the server certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The client certificate (DER) a TLS connection's peer presented, put in
/// each request's extensions by the TLS backends.
#[derive(Clone, Debug)]
pub struct ClientCertificate(pub Vec<u8>);

/// A short stable fingerprint of a certificate's DER (FNV-1a, 64 bits,
/// hex): what the TLS backends answer in `x-client-cert`.
pub fn fingerprint(der: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in der {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}
