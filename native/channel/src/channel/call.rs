//! One call through the channel: wait for routes, select the route and
//! cluster, run the route's fault injection, pick a subchannel (queueing
//! until a picker can), send the request on the subchannel's HTTP/2
//! connection, and tell the pick's trackers when the call ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Uri};
use http_body::{Body as HttpBody, Frame};
use tokio::time::Instant;
use tonic::body::Body;
use tonic::Status;

use super::config_selector::SessionCall;
use super::deadline::sleep_within;
use super::replay::Replay;
use super::retry::{self, Backoff, Pushback, RetryPolicy};
use super::work_serializer::{Routing, Shared, Snapshot};
use super::{Inner, WaitForReady};
use crate::lb::{CallAttributes, PickArgs, PickResult, Subchannel, Trackers};
use crate::session::jar::JarCall;
use crate::session::SessionId;
use crate::subchannel::{Connection, SendError};
use tether_core::session::{Emit, Served};

/// The call's session for drain readiness: the channel handle's jar's
/// (`handle`), else the caller's [`SessionId`] (a jar layer's), else the
/// addresses its cookie names (cookies naming the same addresses count as
/// one session); none for a call with neither.
fn session_id(
    handle: Option<SessionId>,
    extensions: &http::Extensions,
    session: &SessionCall,
) -> Option<u64> {
    if let Some(id) = handle.or_else(|| extensions.get::<SessionId>().copied()) {
        return Some(id.0);
    }
    let addresses = session.lookup().addresses()?;
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(addresses.as_slice(), &mut h);
    // The top bit keeps digests apart from jar ids (small counters).
    Some(std::hash::Hasher::finish(&h) | 1 << 63)
}

/// Header names the call path looks up on every call, made once (a
/// lookup by `&str` parses the name each time).
static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// How many times a call the server never saw (given back unsent, or
/// refused by a GOAWAY or REFUSED_STREAM) is picked again.
const MAX_TRANSPARENT_RETRIES: u32 = 5;

/// How many attempts a call made (gRFC A6 retries; transparent retries
/// not counted): in the response's extensions, failed calls' too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts(pub u32);

/// Runs one call; failures become a trailers-only gRPC response (never an
/// error: the channel's service error type is `Infallible`).
pub(crate) async fn call(
    inner: Arc<Inner>,
    request: http::Request<Body>,
    jar: Option<JarCall>,
) -> Result<http::Response<Body>, std::convert::Infallible> {
    let deadline = grpc_timeout(request.headers()).map(|t| Instant::now() + t);
    let mut attempts = 0;
    let session = jar.as_ref().map(JarCall::session_id);
    let mut response = match run(&inner, request, deadline, &mut attempts, session).await {
        Ok(response) => response,
        Err(status) => status.into_http(),
    };
    if let Some(jar) = &jar {
        jar.store(response.headers());
    }
    response.extensions_mut().insert(Attempts(attempts));
    Ok(response)
}

/// Waits a retry's backoff within the call's deadline.
async fn backoff(delay: Duration, deadline: Option<Instant>) -> Result<(), Status> {
    sleep_within(delay, deadline, "while waiting to retry").await
}

/// A call's configured retries (A6, A44): how many attempts it made and
/// when the next may go.
struct Retries<'a> {
    policy: Option<&'a RetryPolicy>,
    /// Attempts made so far (the one that just ended included): the
    /// caller's counter, right however the call ends.
    made: &'a mut u32,
    /// The next pass of the send loop starts a new attempt (not a
    /// transparent retry of the last one).
    new_attempt: bool,
    backoff: Backoff,
}

impl Retries<'_> {
    /// Counts a new attempt and tells the server how many came before it
    /// (a value the caller set is never sent on the first).
    fn start(&mut self, headers: &mut http::HeaderMap) {
        *self.made += 1;
        if *self.made > 1 {
            headers.insert(
                retry::PREVIOUS_ATTEMPTS_HEADER.clone(),
                HeaderValue::from(*self.made - 1),
            );
        } else {
            headers.remove(&retry::PREVIOUS_ATTEMPTS_HEADER);
        }
    }

    /// The delay before retrying an attempt that ended with `code` (and
    /// `trailers`, if the server sent any), or `None` when the call ends
    /// here: the policy does not name the code, the attempts are used up,
    /// the request can no longer be sent again, or the server said stop.
    fn after(
        &mut self,
        code: tonic::Code,
        trailers: Option<&http::HeaderMap>,
        replay: &Replay,
    ) -> Option<Duration> {
        let policy = self.policy?;
        if !policy.retries(code) || *self.made >= policy.max_attempts || !replay.replayable() {
            return None;
        }
        match trailers.map_or(Pushback::None, retry::pushback) {
            Pushback::Stop => None,
            Pushback::After(d) => {
                self.backoff.reset();
                Some(d)
            }
            Pushback::None => Some(self.backoff.next(policy)),
        }
    }
}

async fn run(
    inner: &Inner,
    mut request: http::Request<Body>,
    mut deadline: Option<Instant>,
    attempts: &mut u32,
    session: Option<SessionId>,
) -> Result<http::Response<Body>, Status> {
    let wait_for_ready = request
        .extensions()
        .get::<WaitForReady>()
        .map_or(inner.wait_for_ready, |w| w.0);
    // A shared buffer (tonic's clients name their methods statically): no
    // copy of the path.
    let path_and_query = request.uri().path_and_query().cloned();
    let path = path_and_query.as_ref().map_or("", PathAndQuery::path);

    // Routes first: queue until the resolver has answered.
    let (call_config, routed_by) = loop {
        let snapshot = inner.shared.snapshot.load_full();
        match &snapshot.routing {
            Routing::Ready(selector) => {
                let config = selector.select(path, request.headers(), &inner.channel_id)?;
                break (config, snapshot);
            }
            Routing::Failed(status) if !wait_for_ready => return Err(status.clone()),
            _ => {}
        }
        Box::pin(next_snapshot(&inner.shared, &snapshot, deadline)).await?;
    };
    if let Some(t) = call_config.timeout {
        let route_deadline = Instant::now() + t;
        if deadline.is_none_or(|d| route_deadline < d) {
            deadline = Some(route_deadline);
        }
    }
    // The first pick reads the snapshot that routed the call (read
    // moments ago), unless a fault delay came between them.
    let mut routed_by = Some(routed_by);
    // Fault injection (A33) runs once the route is known, before any pick.
    if let Some(faults) = &call_config.faults {
        routed_by = None;
        Box::pin(super::fault::inject(faults, request.headers(), deadline)).await?;
    }
    let attributes = CallAttributes {
        cluster: call_config.cluster.name.clone(),
        hash: call_config.hash,
        override_addresses: call_config.session.as_ref().map(|s| s.override_addresses()),
        session_id: call_config
            .session
            .as_ref()
            .and_then(|s| session_id(session, request.extensions(), s)),
    };

    *request.uri_mut() = uri_for(&inner.authority, request.uri())?;
    // Then a subchannel, and the request on its connection. An attempt the
    // server never saw is made again once a picker knows why (gRPC's
    // transparent retry, A6): one a going-away connection gave back
    // unsent, or one a graceful GOAWAY or a REFUSED_STREAM refused, up to
    // MAX_TRANSPARENT_RETRIES times in all. (C-core retries a refused
    // stream once and an unsent one without limit; hyper reports a stream
    // it never put on the wire after a GOAWAY as refused, so one budget
    // serves both.) The request's messages are kept until the call
    // commits (`replay`).
    //
    // Configured retries (A44) come on top: an attempt that ends with a
    // status the route's policy names, before the call committed, is
    // picked again after a backoff, with `grpc-previous-rpc-attempts`.
    let (mut parts, body) = request.into_parts();
    let replay = Replay::new(body);
    let mut transparent_retries = 0;
    let mut retries = Retries {
        policy: call_config.retry.as_deref(),
        made: attempts,
        new_attempt: true,
        backoff: Backoff::default(),
    };
    let mut stale: Option<Arc<Snapshot>> = None;
    let (response, subchannel, guard, endpoint, policy) = loop {
        if let Some(seen) = stale.take() {
            Box::pin(next_snapshot(&inner.shared, &seen, deadline)).await?;
        }
        if std::mem::take(&mut retries.new_attempt) {
            retries.start(&mut parts.headers);
        }
        let (subchannel, guard, connection, endpoint, policy, snapshot) = loop {
            let snapshot = routed_by
                .take()
                .unwrap_or_else(|| inner.shared.snapshot.load_full());
            let args = PickArgs {
                path,
                headers: &parts.headers,
                attributes: &attributes,
            };
            match snapshot.picker.pick(&args) {
                PickResult::Complete(pick) => {
                    let guard = CallGuard::new(pick.subchannel.clone(), pick.trackers);
                    // The connection may have closed since the picker was
                    // made: wait for the picker that knows.
                    if let Some(c) = pick.subchannel.connection() {
                        break (
                            pick.subchannel,
                            guard.start(),
                            c,
                            pick.endpoint,
                            pick.policy,
                            snapshot,
                        );
                    }
                    // Never sent: no outcome for the trackers.
                    guard.release();
                }
                PickResult::Queue => {}
                PickResult::Fail(status) if !wait_for_ready => {
                    // The attempt failed at the pick: retried like any other.
                    match retries.after(status.code(), None, &replay) {
                        Some(delay) => {
                            Box::pin(backoff(delay, deadline)).await?;
                            retries.start(&mut parts.headers);
                            continue;
                        }
                        None => return Err(status),
                    }
                }
                PickResult::Fail(_) => {}
                // Drops are never retried.
                PickResult::Drop(status) => return Err(status),
            }
            Box::pin(next_snapshot(&inner.shared, &snapshot, deadline)).await?;
        };
        log::trace!("{}: {path} -> {}", inner.target, subchannel.address());
        // The deadline as it stands now, not as the caller set it: the
        // call may have waited for resources, a connection or a retry.
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                guard.release();
                return Err(Status::deadline_exceeded(
                    "deadline exceeded before the call was sent",
                ));
            }
            parts
                .headers
                .insert(GRPC_TIMEOUT.clone(), encode_timeout(left));
        }
        let Some(body) = replay.attempt() else {
            guard.release();
            return Err(Status::unavailable(format!(
                "{}: the call's request could not be sent again",
                subchannel.address()
            )));
        };
        let result = match answer(&connection, attempt_request(&parts, body), deadline).await {
            Ok(result) => result,
            Err(DeadlineExceeded) => {
                return Err(Status::deadline_exceeded(format!(
                    "deadline exceeded awaiting the response headers from {}",
                    subchannel.address()
                )))
            }
        };
        let budget = transparent_retries < MAX_TRANSPARENT_RETRIES;
        // Ok: why the unseen attempt is made again at once; Err: how it failed.
        let transparent = match result {
            Some(Ok(response)) => {
                // A trailers-only failure has not committed the call.
                let failed = response
                    .headers()
                    .get(&GRPC_STATUS)
                    .filter(|v| *v != "0")
                    .map(|v| tonic::Code::from_bytes(v.as_bytes()));
                if let Some(delay) =
                    failed.and_then(|code| retries.after(code, Some(response.headers()), &replay))
                {
                    guard.finish_with_trailers(false, response.headers());
                    log::debug!(
                        "{}: {path} attempt {} failed on {} ({:?}): retrying in {delay:?}",
                        inner.target,
                        *retries.made,
                        subchannel.address(),
                        failed
                    );
                    drop(response);
                    Box::pin(backoff(delay, deadline)).await?;
                    retries.new_attempt = true;
                    continue;
                }
                replay.commit();
                break (response, subchannel, guard, endpoint, policy);
            }
            Some(Err(SendError {
                error,
                unsent: Some(_),
            })) if budget => Ok(format!("not sent on {} ({error})", subchannel.address())),
            Some(Err(SendError { error, .. }))
                if budget && refused_unseen(&error) && replay.replayable() =>
            {
                Ok(format!(
                    "refused unseen by {} ({})",
                    subchannel.address(),
                    crate::subchannel::Chain(&error)
                ))
            }
            Some(Err(SendError { error, .. })) => Err(Status::unavailable(format!(
                "{}: request failed: {}",
                subchannel.address(),
                crate::subchannel::Chain(&error)
            ))),
            // The connection is gone with no answer and none of the call's
            // messages left: the server cannot have acted on it.
            None if budget && !replay.started() && replay.replayable() => Ok(format!(
                "{} closed before the call's messages left",
                subchannel.address()
            )),
            None => Err(Status::unavailable(format!(
                "{}: the connection closed before the response",
                subchannel.address()
            ))),
        };
        // The attempt failed: retried if the route's policy says so.
        let retry_because = match transparent {
            Ok(why) => why,
            Err(status) => {
                guard.finish(false);
                let Some(delay) = retries.after(status.code(), None, &replay) else {
                    return Err(status);
                };
                log::debug!(
                    "{}: {path} {}: retrying in {delay:?}",
                    inner.target,
                    status.message()
                );
                Box::pin(backoff(delay, deadline)).await?;
                retries.new_attempt = true;
                continue;
            }
        };
        guard.release();
        transparent_retries += 1;
        log::debug!("{}: {path} {retry_because}: picking again", inner.target);
        subchannel.connection_lost(&connection);
        stale = Some(snapshot);
    };
    {
        {
            let (mut parts, body) = response.into_parts();
            parts.extensions.insert(PickedPeer(
                subchannel.address(),
                call_config.cluster.name.clone(),
                policy,
            ));
            for c in &call_config.hash_cookies {
                match HeaderValue::from_str(c) {
                    Ok(v) => {
                        parts.headers.append(http::header::SET_COOKIE, v);
                    }
                    Err(e) => log::warn!("hash cookie {c:?} is not a header value: {e}"),
                }
            }
            if let Some(session) = &call_config.session {
                set_cookie(
                    session,
                    &mut parts.headers,
                    &subchannel,
                    endpoint.as_deref(),
                    &attributes.cluster,
                );
            }
            if let Some(code) = parts.headers.get(&GRPC_STATUS) {
                // Trailers-only: the call is over.
                guard.finish_with_trailers(code == "0", &parts.headers);
                return Ok(http::Response::from_parts(parts, Body::new(body)));
            }
            let body = TrackedBody {
                inner: body,
                guard: Some(guard),
                deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
                _cluster: call_config.cluster.clone(),
            };
            Ok(http::Response::from_parts(parts, Body::new(body)))
        }
    }
}

/// The stateful session filter on the response (A55/A61): a `Set-Cookie`
/// in the initial metadata when the endpoint that answered, its address
/// list or the cluster differs from what the cookie named. Only for a call
/// that reached its endpoint.
fn set_cookie(
    s: &SessionCall,
    headers: &mut http::HeaderMap,
    subchannel: &Subchannel,
    endpoint: Option<&[std::net::SocketAddr]>,
    cluster: &str,
) {
    let others = endpoint.map_or(&[][..], |e| e.get(1..).unwrap_or(&[]));
    let served = Served {
        address: Some(subchannel.address()),
        other_addresses: others,
        cluster: Some(cluster),
        connect_failed: false,
    };
    // Most answers keep the session where it is: decide before reading
    // the clock, which only a new cookie needs.
    if !s.session.wants_cookie(s.lookup(), &served) {
        return;
    }
    let now = super::config_selector::epoch_seconds();
    if let Some(Emit::SetCookie(value)) = s.session.respond(s.lookup(), &served, now) {
        match HeaderValue::from_str(&value) {
            Ok(v) => {
                headers.append(http::header::SET_COOKIE, v);
            }
            Err(e) => log::warn!("session cookie {value:?} is not a header value: {e}"),
        }
    }
}

/// Whether the server refused the stream without processing it: a
/// graceful GOAWAY whose last stream came before it (h2 fails the streams
/// above with the GOAWAY's NO_ERROR), or a REFUSED_STREAM reset.
fn refused_unseen(error: &hyper::Error) -> bool {
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
struct DeadlineExceeded;

/// hyper's outcome of an attempt, or `None` when the socket closed and
/// hyper gave none within [`CLOSE_GRACE`].
type Sent = Option<Result<http::Response<hyper::body::Incoming>, SendError>>;

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
async fn answer(
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
fn attempt_request(parts: &http::request::Parts, body: Body) -> http::Request<Body> {
    let mut request = http::Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    request
}

/// Waits for a snapshot newer than `seen`, or fails at the deadline. Only
/// calls that must wait get here: the fast path reads the snapshot and
/// picks without registering anywhere.
async fn next_snapshot(
    shared: &Shared,
    seen: &Arc<Snapshot>,
    deadline: Option<Instant>,
) -> Result<(), Status> {
    let mut generation = shared.generation.subscribe();
    // Published between the pick and the subscription: not missed.
    if !Arc::ptr_eq(&shared.snapshot.load(), seen) {
        return Ok(());
    }
    let changed = generation.changed();
    let result = match deadline {
        Some(d) => tokio::time::timeout_at(d, changed).await.map_err(|_| {
            Status::deadline_exceeded("deadline exceeded while waiting for a subchannel")
        })?,
        None => changed.await,
    };
    result.map_err(|_| Status::unavailable("channel shut down"))
}

/// Which address, cluster and policy served a call: in the response's
/// extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickedPeer(
    /// The subchannel's address.
    pub std::net::SocketAddr,
    /// The cluster the route chose.
    pub Arc<str>,
    /// The policy that chose the subchannel ([`crate::lb::Pick::policy`]).
    pub &'static str,
);

fn uri_for(authority: &http::uri::Authority, uri: &Uri) -> Result<Uri, Status> {
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|e| Status::internal(format!("cannot build the request URI: {e}")))
}

/// `grpc-timeout` as gRPC encodes it: at most 8 digits and a unit.
fn encode_timeout(t: Duration) -> HeaderValue {
    let micros = t.as_micros();
    let text = if micros < 100_000_000 {
        format!("{micros}u")
    } else if t.as_millis() < 100_000_000 {
        format!("{}m", t.as_millis())
    } else {
        format!("{}S", t.as_secs().min(99_999_999))
    };
    HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("99999999S"))
}

/// The call's `grpc-timeout`, if it has a valid one.
pub(crate) fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    parse_grpc_timeout(headers.get(&GRPC_TIMEOUT)?.to_str().ok()?)
}

/// A `grpc-timeout` value as gRPC writes it (at most 8 digits and a unit:
/// `H`, `M`, `S`, `m`, `u`, `n`), e.g. what a server was given.
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Tells the pick's trackers and the subchannel's counters how the call
/// ended, exactly once (a call dropped half-way counts as failed).
struct CallGuard {
    subchannel: Subchannel,
    trackers: Trackers,
    /// The call went out on the subchannel (its counters saw it).
    started: bool,
    done: bool,
}

impl CallGuard {
    fn new(subchannel: Subchannel, trackers: Trackers) -> Self {
        CallGuard {
            subchannel,
            trackers,
            started: false,
            done: false,
        }
    }

    fn start(mut self) -> Self {
        self.subchannel.call_started();
        self.started = true;
        self
    }

    fn finish(mut self, ok: bool) {
        self.end(ok, None);
    }

    /// The pick was never sent: the trackers give back what they counted
    /// and record no outcome; the subchannel saw nothing.
    fn release(mut self) {
        self.done = true;
        if self.started {
            self.subchannel.call_released();
        }
        self.trackers.released();
    }

    /// Ends the call with its trailers, which trackers may read (ORCA).
    fn finish_with_trailers(mut self, ok: bool, trailers: &http::HeaderMap) {
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
struct TrackedBody {
    inner: hyper::body::Incoming,
    guard: Option<CallGuard>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A stream keeps its cluster in the tree until it ends.
    _cluster: Arc<super::ClusterRef>,
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
            return Poll::Ready(Some(Err(Status::deadline_exceeded(
                "deadline exceeded reading the response",
            ))));
        }
        let polled = Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(|e| Status::from_error(Box::new(e)));
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let ok = trailers.get(&GRPC_STATUS).is_some_and(|c| c == "0");
                    if let Some(g) = self.guard.take() {
                        g.finish_with_trailers(ok, trailers);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Ready(None) => {
                if let Some(g) = self.guard.take() {
                    g.finish(false);
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_round_trip() {
        for (text, d) in [
            ("5S", Duration::from_secs(5)),
            ("250m", Duration::from_millis(250)),
            ("7u", Duration::from_micros(7)),
            ("2H", Duration::from_secs(7200)),
            ("3M", Duration::from_secs(180)),
            ("9n", Duration::from_nanos(9)),
        ] {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-timeout", HeaderValue::from_static(text));
            assert_eq!(grpc_timeout(&h), Some(d), "{text}");
        }
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", encode_timeout(Duration::from_millis(1500)));
        assert_eq!(grpc_timeout(&h), Some(Duration::from_millis(1500)));
        for bad in ["", "S", "123456789S", "5x", "-1S"] {
            h.insert("grpc-timeout", HeaderValue::from_str(bad).unwrap());
            assert_eq!(grpc_timeout(&h), None, "{bad:?}");
        }
    }
}
