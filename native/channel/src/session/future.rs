//! The response future of [`CookieJarService`](super::CookieJarService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::jar::JarCall;

pin_project! {
    /// The inner service's response future; when it yields a response, the
    /// cookies that response sets go into the jar.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        call: JarCall,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, call: JarCall) -> Self {
        ResponseFuture { inner, call }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("path", &self.call.path())
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
            this.call.store(response.headers());
        }
        Poll::Ready(result)
    }
}
