//! [`CookieJarService`]: sends a [`CookieJar`]'s cookies with each request;
//! its [`ResponseFuture`] stores the cookies each response sets.

use std::fmt;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use super::jar::{CookieJar, JarHandle};

/// A service that sends the jar's cookies with each request and stores the
/// cookies each response sets. Its errors are the inner service's.
#[derive(Clone)]
pub struct CookieJarService<S> {
    inner: S,
    jar: JarHandle,
}

impl<S: fmt::Debug> fmt::Debug for CookieJarService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CookieJarService")
            .field("inner", &self.inner)
            .field("jar", self.jar.jar())
            .finish()
    }
}

impl<S> CookieJarService<S> {
    /// Wraps `inner` with `jar`.
    pub fn new(inner: S, jar: CookieJar) -> Self {
        CookieJarService {
            inner,
            jar: JarHandle::new(jar),
        }
    }

    /// The jar.
    pub fn jar(&self) -> &CookieJar {
        self.jar.jar()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<http::Request<B>> for CookieJarService<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let call = self.jar.apply(&mut request);
        request.extensions_mut().insert(call.session_id());
        ResponseFuture::new(self.inner.call(request), call)
    }
}
