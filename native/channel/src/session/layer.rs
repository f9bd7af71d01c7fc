//! [`CookieJarLayer`]: wraps a service in a [`CookieJarService`] sharing one
//! [`CookieJar`].

use tower_layer::Layer;

use super::jar::CookieJar;
use super::service::CookieJarService;

/// A tower [`Layer`] that wraps a service (a [`crate::Channel`], a
/// `tonic::transport::Channel`, ...) in a [`CookieJarService`] sharing
/// one [`CookieJar`].
#[derive(Debug, Clone, Default)]
pub struct CookieJarLayer {
    jar: CookieJar,
}

impl CookieJarLayer {
    /// A layer whose services use `jar` (clone it first to keep a handle).
    pub fn new(jar: CookieJar) -> Self {
        CookieJarLayer { jar }
    }
}

impl<S> Layer<S> for CookieJarLayer {
    type Service = CookieJarService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CookieJarService::new(inner, self.jar.clone())
    }
}
