//! One attempt on a subchannel: the request sent on its HTTP/2 connection,
//! hyper's outcome awaited within the call's deadline and the life of the
//! socket, and the pick's trackers told exactly once how the attempt ended
//! (at the response's trailers, when the body is read to its end).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body as HttpBody, Frame};
use tokio::time::Instant;
use tonic::body::Body;
use tonic::Status;

use crate::lb::{Subchannel, Trackers};
use crate::subchannel::{Connection, SendError};
use crate::telemetry::{status_of, BodyMetrics};

/// The header name made once (a lookup by `&str` parses it every time).
pub(super) static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// Whether the server refused the stream without processing it: a
/// graceful GOAWAY whose last stream came before it (h2 fails the streams
/// above with the GOAWAY's NO_ERROR), or a REFUSED_STREAM reset.
pub(super) fn refused_unseen(error: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_remote()
                && ((h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR))
                    || (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM)));
        }
        source = e.source();
    }
    false
}

/// How long hyper may take, once the socket is gone, to hand over an
/// outcome it already holds (its stream tasks run on their own).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The call's deadline came before hyper's outcome ([`answer`]).
pub(super) struct DeadlineExceeded;

/// hyper's outcome of an attempt, or `None` when the socket closed and
/// hyper gave none within [`CLOSE_GRACE`].
pub(super) type Sent = Option<Result<http::Response<hyper::body::Incoming>, SendError>>;

/// Sends `request` on `connection` and waits for hyper's outcome (the
/// response headers, or why there are none), within the call's deadline,
/// but not past the end of the socket: `None` when it closed and hyper
/// gave no outcome within [`CLOSE_GRACE`]. Around a
/// GOAWAY hyper can keep a request's outcome pending after its connection
/// is gone (seen under load with servers rotating connections every
/// 100 ms), which would hold the call until its deadline.
///
/// One future for all of it, awaited where it is made: a call's future is
/// moved as a whole, and each nested timeout made it bigger.
pub(super) async fn answer(
    connection: &Connection,
    request: http::Request<Body>,
    deadline: Option<Instant>,
) -> Result<Sent, DeadlineExceeded> {
    let until = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until);
    let sent = connection.send(request);
    tokio::pin!(sent);
    tokio::select! {
        biased;
        result = &mut sent => return Ok(Some(result)),
        () = connection.transport_closed() => {}
        () = &mut until => return Err(DeadlineExceeded),
    }
    tokio::select! {
        biased;
        result = &mut sent => Ok(Some(result)),
        () = tokio::time::sleep(CLOSE_GRACE) => Ok(None),
        () = &mut until => Err(DeadlineExceeded),
    }
}

/// The request of one attempt: the call's head (kept for the next attempt)
/// and this attempt's body. Extensions stay behind: nothing below reads
/// them, and cloning them cost allocations on every call.
pub(super) fn attempt_request(parts: &http::request::Parts, body: Body) -> http::Request<Body> {
    let mut request = http::Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    request
}

/// Tells the pick's trackers and the subchannel's counters how the call
/// ended, exactly once (a call dropped half-way counts as failed).
pub(super) struct CallGuard {
    subchannel: Subchannel,
    trackers: Trackers,
    /// The call went out on the subchannel (its counters saw it).
    started: bool,
    done: bool,
}

impl CallGuard {
    pub(super) fn new(subchannel: Subchannel, trackers: Trackers) -> Self {
        CallGuard {
            subchannel,
            trackers,
            started: false,
            done: false,
        }
    }

    pub(super) fn start(mut self) -> Self {
        self.subchannel.call_started();
        self.started = true;
        self
    }

    pub(super) fn finish(mut self, ok: bool) {
        self.end(ok, None);
    }

    /// The pick was never sent: the trackers give back what they counted
    /// and record no outcome; the subchannel saw nothing.
    pub(super) fn release(mut self) {
        self.done = true;
        if self.started {
            self.subchannel.call_released();
        }
        self.trackers.released();
    }

    /// Ends the call with its trailers, which trackers may read (ORCA).
    pub(super) fn finish_with_trailers(mut self, ok: bool, trailers: &http::HeaderMap) {
        self.end(ok, Some(trailers));
    }

    fn end(&mut self, ok: bool, trailers: Option<&http::HeaderMap>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        if self.started {
            self.subchannel.call_finished(ok);
        }
        self.trackers.finished_with_trailers(ok, trailers);
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.end(false, None);
    }
}

/// The response body, watched for its trailers' `grpc-status` and bounded
/// by the call's deadline (a server that stalls after its headers).
pub(super) struct TrackedBody {
    inner: hyper::body::Incoming,
    guard: Option<CallGuard>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A stream keeps its cluster in the tree until it ends.
    _cluster: Arc<super::ClusterRef>,
    /// The committed attempt's and the call's measure (A66), ended with
    /// the body.
    metrics: Option<Box<BodyMetrics>>,
}

impl TrackedBody {
    /// `body`, ending `guard` at its trailers (or at its end, or at the
    /// call's `deadline`), holding `cluster` while it is read, and ending
    /// `metrics` with it.
    pub(super) fn new(
        body: hyper::body::Incoming,
        guard: CallGuard,
        deadline: Option<Instant>,
        cluster: Arc<super::ClusterRef>,
        metrics: Option<Box<BodyMetrics>>,
    ) -> Self {
        TrackedBody {
            inner: body,
            guard: Some(guard),
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
            _cluster: cluster,
            metrics,
        }
    }

    /// Ends the measure, if any, with `code`.
    fn end_metrics(&mut self, code: tonic::Code) {
        if let Some(m) = self.metrics.take() {
            m.end(code);
        }
    }
}

impl HttpBody for TrackedBody {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.guard.is_some()
            && self
                .deadline
                .as_mut()
                .is_some_and(|d| d.as_mut().poll(cx).is_ready())
        {
            if let Some(g) = self.guard.take() {
                g.finish(false);
            }
            self.end_metrics(tonic::Code::DeadlineExceeded);
            return Poll::Ready(Some(Err(Status::deadline_exceeded(
                "deadline exceeded reading the response",
            ))));
        }
        let polled = Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(|e| Status::from_error(Box::new(e)));
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Some(m) = self.metrics.as_mut() {
                        m.received(data);
                    }
                } else if let Some(trailers) = frame.trailers_ref() {
                    let ok = trailers.get(&GRPC_STATUS).is_some_and(|c| c == "0");
                    if let Some(g) = self.guard.take() {
                        g.finish_with_trailers(ok, trailers);
                    }
                    if let Some(m) = self.metrics.take() {
                        m.end(status_of(trailers));
                    }
                }
            }
            Poll::Ready(Some(Err(status))) => {
                let code = status.code();
                if let Some(g) = self.guard.take() {
                    g.finish(false);
                }
                self.end_metrics(code);
            }
            Poll::Ready(None) => {
                if let Some(g) = self.guard.take() {
                    g.finish(false);
                }
                // A body without trailers carries no status.
                self.end_metrics(tonic::Code::Internal);
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
