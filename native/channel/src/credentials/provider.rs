//! Certificate providers (gRFC A29): the bootstrap's `certificate_providers`
//! instances a cluster's TLS names. `file_watcher` reads its PEM files when
//! first used and again every `refresh_interval`; a read or parse that
//! fails keeps the last good material (and says why in the log), so
//! connections made after a rotation use the new files and connections
//! already made are left alone.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;
use tether_xds::bootstrap::{CertificateProvider, FileWatcher};

/// What a provider holds now.
#[derive(Default)]
pub(crate) struct Material {
    /// The roots, when the provider has `ca_certificate_file`.
    pub roots: Option<Arc<RootCertStore>>,
    /// The certificate chain and key, when it has `certificate_file`.
    pub identity: Option<Arc<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>>,
    /// Why the files could never be read, while nothing good was read.
    pub error: Option<String>,
}

/// One provider instance, shared by every cluster that names it.
pub(crate) struct Provider {
    name: String,
    material: ArcSwap<Material>,
    refresh: Option<tokio::task::AbortHandle>,
    /// Reads after the first, good or not.
    rereads: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .finish()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        if let Some(task) = &self.refresh {
            task.abort();
        }
    }
}

impl Provider {
    /// The instance's name in the bootstrap.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// What it holds now (lock-free).
    pub(crate) fn material(&self) -> Arc<Material> {
        self.material.load_full()
    }

    fn file_watcher(name: &str, config: &FileWatcher) -> Arc<Provider> {
        let first = match read(config) {
            Ok(m) => m,
            Err(e) => {
                log::warn!("certificate provider {name:?}: {e}");
                Material {
                    error: Some(e),
                    ..Material::default()
                }
            }
        };
        // The refresh task holds the provider weakly: it ends with it.
        Arc::new_cyclic(|weak: &std::sync::Weak<Provider>| {
            let refresh = tokio::runtime::Handle::try_current().ok().map(|rt| {
                let (name, config, weak) = (name.to_owned(), config.clone(), weak.clone());
                rt.spawn(async move {
                    let mut tick = tokio::time::interval(config.refresh_interval);
                    tick.tick().await;
                    loop {
                        tick.tick().await;
                        let Some(provider) = weak.upgrade() else {
                            return;
                        };
                        provider
                            .rereads
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        match read(&config) {
                            Ok(m) => provider.material.store(Arc::new(m)),
                            // The last good material stays.
                            Err(e) => log::warn!(
                                "certificate provider {name:?}: {e}; keeping what was read before"
                            ),
                        }
                    }
                })
                .abort_handle()
            });
            Provider {
                name: name.to_owned(),
                material: ArcSwap::from_pointee(first),
                refresh,
                rereads: std::sync::atomic::AtomicU64::new(0),
            }
        })
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Reads and checks every file of `config`.
fn read(config: &FileWatcher) -> Result<Material, String> {
    let mut material = Material::default();
    if let Some(path) = &config.ca_certificate_file {
        let pem = read_file(path)?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("{}: not PEM: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
        }
        if roots.is_empty() {
            return Err(format!("{}: no CERTIFICATE block", path.display()));
        }
        material.roots = Some(Arc::new(roots));
    }
    if let (Some(cert), Some(key)) = (&config.certificate_file, &config.private_key_file) {
        let chain = CertificateDer::pem_slice_iter(&read_file(cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: not PEM: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!("{}: no CERTIFICATE block", cert.display()));
        }
        let key_der = PrivateKeyDer::from_pem_slice(&read_file(key)?)
            .map_err(|e| format!("{}: no usable PRIVATE KEY block: {e}", key.display()))?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key_der)
            .map_err(|e| format!("{}: cannot sign with it: {e}", key.display()))?;
        // A pair read halfway through a rotation (the new certificate, the
        // old key) is no identity: the last good one stays, as in C-core.
        rustls::sign::CertifiedKey::new(chain.clone(), signer)
            .keys_match()
            .map_err(|e| {
                format!(
                    "{} and {} do not belong together: {e}",
                    cert.display(),
                    key.display()
                )
            })?;
        material.identity = Some(Arc::new((chain, key_der)));
    }
    Ok(material)
}

/// The channel's provider instances, made on first use from the
/// bootstrap's definitions.
#[derive(Clone, Default)]
pub(crate) struct ProviderStore {
    definitions: Arc<std::collections::BTreeMap<String, CertificateProvider>>,
    made: Arc<Mutex<HashMap<String, std::sync::Weak<Provider>>>>,
}

impl fmt::Debug for ProviderStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderStore")
            .field("definitions", &self.definitions.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ProviderStore {
    /// A store over the bootstrap's `certificate_providers`.
    pub(crate) fn new(
        definitions: std::collections::BTreeMap<String, CertificateProvider>,
    ) -> Self {
        ProviderStore {
            definitions: Arc::new(definitions),
            made: Arc::default(),
        }
    }

    /// The instance called `name` (shared while anyone holds it).
    pub(crate) fn get(&self, name: &str) -> Result<Arc<Provider>, String> {
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = made.get(name).and_then(std::sync::Weak::upgrade) {
            return Ok(p);
        }
        let provider = match self.definitions.get(name) {
            Some(CertificateProvider::FileWatcher(config)) => Provider::file_watcher(name, config),
            Some(other) => {
                return Err(format!(
                    "certificate provider {name:?}: {other:?} is not supported"
                ))
            }
            None => {
                return Err(format!(
                    "certificate provider instance {name:?} is not in the channel's bootstrap"
                ))
            }
        };
        made.insert(name.to_owned(), Arc::downgrade(&provider));
        Ok(provider)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use tether_testkit::tls::Ca;

    fn leaf(p: &Provider) -> Option<Vec<u8>> {
        p.material().identity.as_ref().map(|id| id.0[0].to_vec())
    }

    async fn rereads_after(p: &Provider, n: u64) {
        let from = p.rereads.load(Ordering::Relaxed);
        let ok = tether_testkit::wait_until(Duration::from_secs(5), || async {
            p.rereads.load(Ordering::Relaxed) >= from + n
        })
        .await;
        assert!(ok, "the files were not read again");
    }

    /// New files are taken on the next read; a read that fails keeps what
    /// was read before; files missing from the start are an error naming
    /// the file.
    #[tokio::test]
    async fn file_watcher_rotates_and_keeps_the_last_good_material() {
        let dir = std::env::temp_dir().join(format!("tether-provider-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = Ca::new("CA");
        let (first, second) = (ca.issue(&["one"]), ca.issue(&["two"]));
        let (cert, key) = first.write(&dir, "id");
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        let config = FileWatcher::new(
            Some(cert.clone()),
            Some(key.clone()),
            Some(dir.join("ca.pem")),
            Duration::from_millis(50),
        );
        let p = Provider::file_watcher("id", &config);
        assert_eq!(leaf(&p), Some(first.cert_der.clone()));
        assert_eq!(p.material().roots.as_ref().map(|r| r.len()), Some(1));

        second.write(&dir, "id");
        let rotated = tether_testkit::wait_until(Duration::from_secs(5), || async {
            leaf(&p) == Some(second.cert_der.clone())
        })
        .await;
        assert!(rotated, "the rotated certificate was not taken");

        // Halfway through a rotation: a new certificate beside the old key.
        let third = ca.issue(&["three"]);
        std::fs::write(&cert, &third.cert_pem).unwrap();
        rereads_after(&p, 2).await;
        assert_eq!(
            leaf(&p),
            Some(second.cert_der.clone()),
            "a certificate without its key is not taken"
        );
        third.write(&dir, "id");
        let rotated = tether_testkit::wait_until(Duration::from_secs(5), || async {
            leaf(&p) == Some(third.cert_der.clone())
        })
        .await;
        assert!(rotated, "the completed rotation was not taken");

        std::fs::write(&cert, "not a certificate").unwrap();
        rereads_after(&p, 2).await;
        assert_eq!(
            leaf(&p),
            Some(third.cert_der.clone()),
            "the last good one stays"
        );
        std::fs::remove_file(&key).unwrap();
        rereads_after(&p, 2).await;
        assert_eq!(leaf(&p), Some(third.cert_der.clone()));

        let missing = Provider::file_watcher("id", &config);
        let error = missing.material().error.clone().expect("an error");
        assert!(error.ends_with("id.pem: no CERTIFICATE block"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
