//! The response future of [`CookieJarService`](super::CookieJarService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::CookieJar;

pin_project! {
    /// The inner service's response future; when it yields a response, the
    /// cookies that response sets go into the jar.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        jar: CookieJar,
        // The request's path: the default path of cookies set without one.
        path: Option<http::uri::PathAndQuery>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, jar: CookieJar, path: Option<http::uri::PathAndQuery>) -> Self {
        ResponseFuture { inner, jar, path }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("path", &self.path.as_ref().map(|p| p.path()))
            .finish_non_exhaustive()
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        // A trailers-only gRPC response (an error without a body) carries
        // its metadata as these headers too, so errors store cookies alike.
        if let Ok(response) = &result {
            let path = this.path.as_ref().map_or("/", |p| p.path());
            this.jar.store_response(response.headers(), path);
        }
        Poll::Ready(result)
    }
}
