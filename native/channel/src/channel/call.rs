//! One call through the channel, as gRPC C-core's client channel runs it:
//! wait for routes and let the config selector choose the route and the
//! cluster; the filters' request sides in order (fault injection, A33; the
//! stateful session, A55); the retry filter's attempts, each an LB pick
//! and a send on the subchannel's HTTP/2 connection (A6/A44); then the
//! response's initial metadata through the filters in reverse order, and
//! its body watched to its trailers. A new filter is one module that
//! implements `crate::filter::Filter` and one line in each of
//! `on_request` and `on_response`.

use std::future::Future;
use std::sync::Arc;

use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Uri};
use tokio::time::Instant;
use tonic::body::Body;
use tonic::Status;

use super::attempt::{TrackedBody, GRPC_STATUS};
use super::attempts;
use super::config_selector::CallConfig;
use super::deadline::grpc_timeout;
pub use super::deadline::parse_grpc_timeout;
use super::fault::FaultInjection;
use super::pick::next_snapshot;
use super::replay::Replay;
use super::work_serializer::Routing;
use super::{Inner, WaitForReady};
use crate::filter::{Answered, Call, Filter};
use crate::lb::CallAttributes;
use crate::session::filter::StatefulSession;
use crate::session::jar::JarCall;
use crate::telemetry::{status_of, BodyMetrics, CallMetrics};

/// How many attempts a call made (gRFC A6 retries; transparent retries
/// not counted): in the response's extensions, failed calls' too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempts(pub u32);

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

/// Runs one call; failures become a trailers-only gRPC response (never an
/// error: the channel's service error type is `Infallible`).
///
/// A plain function around an `async` block rather than an `async fn`: the
/// block captures the request once, where an `async fn` would also keep a
/// moved-from copy of each argument in the boxed future (a larger box,
/// copied on every call).
pub(crate) fn call(
    inner: Arc<Inner>,
    request: http::Request<Body>,
    jar: Option<JarCall>,
) -> impl Future<Output = Result<http::Response<Body>, std::convert::Infallible>> + Send {
    // The shorter of the call's own and the channel's default, as tonic's
    // `Endpoint::timeout` does.
    let timeout = match (grpc_timeout(request.headers()), inner.default_timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let deadline = timeout.map(|t| Instant::now() + t);
    let session = jar.as_ref().map(|j| j.session_id().0);
    let mut metrics = inner.metrics.as_ref().map(|m| m.call(request.uri().path()));
    async move {
        let mut attempts = 0;
        let mut response = match run(
            &inner,
            request,
            deadline,
            &mut attempts,
            session,
            &mut metrics,
        )
        .await
        {
            Ok(response) => response,
            Err(status) => status.into_http(),
        };
        // Still here when the call ended without a body to read (an error,
        // a trailers-only response): its status is in the headers.
        if let Some(m) = metrics.take() {
            m.end(status_of(response.headers()));
        }
        if let Some(jar) = &jar {
            jar.store(response.headers());
        }
        response.extensions_mut().insert(Attempts(attempts));
        Ok(response)
    }
}

/// The filters' request sides, in C-core's order: fault injection (A33),
/// then the stateful session (A55), each where the call's route turns it
/// on.
async fn on_request(
    config: &CallConfig,
    call: &mut Call,
    request: &http::request::Parts,
) -> Result<(), Status> {
    if let Some(faults) = &config.faults {
        FaultInjection.on_request(faults, call, request).await?;
    }
    if let Some(session) = &config.session {
        StatefulSession.on_request(session, call, request).await?;
    }
    Ok(())
}

/// The filters' response sides, in the reverse order.
fn on_response(
    config: &CallConfig,
    call: &Call,
    answered: &Answered<'_>,
    response: &mut http::response::Parts,
) {
    if let Some(session) = &config.session {
        StatefulSession.on_response(session, call, answered, response);
    }
    if let Some(faults) = &config.faults {
        FaultInjection.on_response(faults, call, answered, response);
    }
}

/// The call after its deadline is known: a plain function around an
/// `async` block, as [`call`] is.
// Not an `async fn`: see the comment above.
#[allow(clippy::manual_async_fn)]
fn run<'a>(
    inner: &'a Inner,
    request: http::Request<Body>,
    deadline: Option<Instant>,
    attempts: &'a mut u32,
    jar_session: Option<u64>,
    metrics: &'a mut Option<CallMetrics>,
) -> impl Future<Output = Result<http::Response<Body>, Status>> + Send + 'a {
    async move {
        let mut deadline = deadline;
        let wait_for_ready = request
            .extensions()
            .get::<WaitForReady>()
            .map_or(inner.wait_for_ready, |w| w.0);
        // A shared buffer (tonic's clients name their methods statically): no
        // copy of the path.
        let path_and_query = request.uri().path_and_query().cloned();
        let path = path_and_query.as_ref().map_or("", PathAndQuery::path);

        // Routes first: queue until the resolver has answered.
        let (config, routed_by) = loop {
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
        if let Some(t) = config.timeout {
            let route_deadline = Instant::now() + t;
            if deadline.is_none_or(|d| route_deadline < d) {
                deadline = Some(route_deadline);
            }
        }
        let mut call = Call {
            deadline,
            attributes: CallAttributes {
                cluster: config.cluster.name.clone(),
                hash: config.hash,
                override_addresses: None,
                session_id: None,
            },
            jar_session,
            waited: false,
        };
        let (mut parts, body) = request.into_parts();
        on_request(&config, &mut call, &parts).await?;
        parts.uri = uri_for(&inner.scheme, &inner.authority, &parts.uri)?;
        if let Some(ua) = &inner.user_agent {
            parts.headers.insert(http::header::USER_AGENT, ua.clone());
        }
        // The first pick reads the snapshot that routed the call (read
        // moments ago), unless a filter waited in between.
        let routed_by = (!call.waited).then_some(routed_by);
        let replay = Replay::new(body);
        let committed = attempts::run(
            inner,
            &call,
            config.retry.as_deref(),
            path,
            &mut parts,
            &replay,
            routed_by,
            wait_for_ready,
            attempts,
            metrics.as_ref(),
        )
        .await?;

        let (mut parts, body) = committed.response.into_parts();
        let address = committed.subchannel.address();
        parts.extensions.insert(PickedPeer(
            address,
            config.cluster.name.clone(),
            committed.policy,
        ));
        // The route's generated hash cookies first, as Envoy's router (the
        // last filter) adds them before the response passes the filters.
        for c in &config.hash_cookies {
            match HeaderValue::from_str(c) {
                Ok(v) => {
                    parts.headers.append(http::header::SET_COOKIE, v);
                }
                Err(e) => log::warn!("hash cookie {c:?} is not a header value: {e}"),
            }
        }
        let answered = Answered {
            address,
            endpoint: committed.endpoint.as_deref(),
            cluster: &call.attributes.cluster,
        };
        on_response(&config, &call, &answered, &mut parts);
        if let (Some(m), Some(session)) = (&inner.metrics, &config.session) {
            let o = session.outcome(&answered);
            m.session(
                o.call.label(),
                o.cookie.map(|c| c.label()),
                o.envoy_misreads,
            );
        }
        if let Some(code) = parts.headers.get(&GRPC_STATUS) {
            // Trailers-only: the call is over.
            committed
                .guard
                .finish_with_trailers(code == "0", &parts.headers);
            if let Some(a) = committed.attempt {
                a.end(status_of(&parts.headers));
            }
            return Ok(http::Response::from_parts(parts, Body::new(body)));
        }
        // The body's end ends the attempt and the call.
        let measured = match (committed.attempt, metrics.take()) {
            (Some(attempt), Some(call)) => Some(Box::new(BodyMetrics { attempt, call })),
            _ => None,
        };
        let body = TrackedBody::new(
            body,
            committed.guard,
            deadline,
            config.cluster.clone(),
            measured,
        );
        Ok(http::Response::from_parts(parts, Body::new(body)))
    }
}

fn uri_for(scheme: &Scheme, authority: &http::uri::Authority, uri: &Uri) -> Result<Uri, Status> {
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Uri::builder()
        .scheme(scheme.clone())
        .authority(authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|e| Status::internal(format!("cannot build the request URI: {e}")))
}
