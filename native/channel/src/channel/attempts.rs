//! The retry filter (gRFC A6, A44): a call's attempts, each a pick and a send, until one
//! commits the call. An attempt the server never saw is made again at once
//! when a picker knows why (gRPC's transparent retry, A6): one a going-away
//! connection gave back unsent, or one a graceful GOAWAY or a
//! REFUSED_STREAM refused, up to [`MAX_TRANSPARENT_RETRIES`] times in all.
//! (C-core retries a refused stream once and an unsent one without limit;
//! hyper reports a stream it never put on the wire after a GOAWAY as
//! refused, so one budget serves both.) Configured retries (A44) come on
//! top: an attempt that ends with a status the route's policy names,
//! before the call committed, is picked again after a backoff, with
//! `grpc-previous-rpc-attempts`. The request's messages are kept until the
//! call commits ([`Replay`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use tokio::time::Instant;
use tonic::Status;

use super::attempt::{
    answer, attempt_request, refused_unseen, CallGuard, DeadlineExceeded, GRPC_STATUS,
};
use super::deadline::{encode_timeout, sleep_within, GRPC_TIMEOUT};
use super::pick::{next_snapshot, pick, PickError, Picked};
use super::replay::Replay;
use super::retry::{self, Backoff, Pushback, RetryPolicy, PREVIOUS_ATTEMPTS_HEADER};
use super::work_serializer::Snapshot;
use super::Inner;
use crate::filter::Call;
use crate::lb::{PickArgs, Subchannel};
use crate::subchannel::SendError;
use crate::telemetry::{end_attempt, AttemptKind, AttemptMetrics, CallMetrics};

/// How many times a call the server never saw (given back unsent, or
/// refused by a GOAWAY or REFUSED_STREAM) is picked again.
const MAX_TRANSPARENT_RETRIES: u32 = 5;

/// The attempt that committed the call: its response headers and where it
/// went.
pub(super) struct Committed {
    pub(super) response: http::Response<hyper::body::Incoming>,
    pub(super) subchannel: Subchannel,
    /// Ends the attempt at the response's trailers.
    pub(super) guard: CallGuard,
    /// The endpoint's addresses, the picked one first (A61).
    pub(super) endpoint: Option<Arc<[SocketAddr]>>,
    /// The LB policy that picked it.
    pub(super) policy: &'static str,
    /// Its measure (A66), when the channel records metrics.
    pub(super) attempt: Option<AttemptMetrics>,
}

/// A call's attempts: what the request side of the call decided, the
/// request's head (`parts`, whose headers each attempt updates) and its
/// messages (`replay`). `routed_by` is the snapshot that routed the call,
/// for the first pick; `made` counts the attempts (A6; transparent retries
/// not counted), right however the call ends.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    inner: &Inner,
    call: &Call,
    policy: Option<&RetryPolicy>,
    path: &str,
    parts: &mut http::request::Parts,
    replay: &Replay,
    mut routed_by: Option<Arc<Snapshot>>,
    wait_for_ready: bool,
    made: &mut u32,
    metrics: Option<&CallMetrics>,
) -> Result<Committed, Status> {
    let deadline = call.deadline;
    let mut transparent_retries = 0;
    let mut retries = Retries {
        policy,
        made,
        new_attempt: true,
        backoff: Backoff::default(),
    };
    let mut stale: Option<Arc<Snapshot>> = None;
    loop {
        if let Some(seen) = stale.take() {
            Box::pin(next_snapshot(&inner.shared, &seen, deadline)).await?;
        }
        let kind = if std::mem::take(&mut retries.new_attempt) {
            retries.start(&mut parts.headers);
            if *retries.made == 1 {
                AttemptKind::Original
            } else {
                AttemptKind::Retry
            }
        } else {
            AttemptKind::Transparent
        };
        // A66: each attempt, transparent retries too, from before its pick.
        let mut attempt = metrics.map(|m| m.attempt(kind));
        let picked = {
            let args = PickArgs {
                path,
                headers: &parts.headers,
                attributes: &call.attributes,
            };
            pick(
                &inner.shared,
                &mut routed_by,
                &args,
                wait_for_ready,
                deadline,
            )
            .await
        };
        let Picked {
            subchannel,
            guard,
            connection,
            endpoint,
            policy: picked_by,
            snapshot,
            labels,
        } = match picked {
            Ok(picked) => picked,
            Err(PickError::Final(status)) => {
                end_attempt(&mut attempt, status.code());
                return Err(status);
            }
            Err(PickError::Failed(status)) => {
                end_attempt(&mut attempt, status.code());
                // The attempt failed at the pick: retried like any other.
                let Some(delay) = retries.after(status.code(), None, replay) else {
                    return Err(status);
                };
                Box::pin(backoff(delay, deadline)).await?;
                retries.new_attempt = true;
                continue;
            }
        };
        log::trace!("{}: {path} -> {}", inner.target, subchannel.address());
        // The deadline as it stands now, not as the caller set it: the
        // call may have waited for resources, a connection or a retry.
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                guard.release();
                end_attempt(&mut attempt, tonic::Code::DeadlineExceeded);
                return Err(Status::deadline_exceeded(
                    "deadline exceeded before the call was sent",
                ));
            }
            parts
                .headers
                .insert(GRPC_TIMEOUT.clone(), encode_timeout(left));
        }
        if let (Some(a), Some(l)) = (attempt.as_mut(), labels) {
            a.set_labels(l);
        }
        let Some(body) = replay.attempt() else {
            guard.release();
            end_attempt(&mut attempt, tonic::Code::Unavailable);
            return Err(Status::unavailable(format!(
                "{}: the call's request could not be sent again",
                subchannel.address()
            )));
        };
        let body = match attempt.as_mut() {
            Some(a) => a.count_sent(body),
            None => body,
        };
        let result = match answer(&connection, attempt_request(parts, body), deadline).await {
            Ok(result) => result,
            Err(DeadlineExceeded) => {
                end_attempt(&mut attempt, tonic::Code::DeadlineExceeded);
                return Err(Status::deadline_exceeded(format!(
                    "deadline exceeded awaiting the response headers from {}",
                    subchannel.address()
                )));
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
                    failed.and_then(|code| retries.after(code, Some(response.headers()), replay))
                {
                    guard.finish_with_trailers(false, response.headers());
                    if let Some(code) = failed {
                        end_attempt(&mut attempt, code);
                    }
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
                return Ok(Committed {
                    response,
                    subchannel,
                    guard,
                    endpoint,
                    policy: picked_by,
                    attempt,
                });
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
                end_attempt(&mut attempt, status.code());
                let Some(delay) = retries.after(status.code(), None, replay) else {
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
        // Unseen by the server, but an attempt that failed (as in C-core).
        end_attempt(&mut attempt, tonic::Code::Unavailable);
        transparent_retries += 1;
        log::debug!("{}: {path} {retry_because}: picking again", inner.target);
        subchannel.connection_lost(&connection);
        stale = Some(snapshot);
    }
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
                PREVIOUS_ATTEMPTS_HEADER.clone(),
                HeaderValue::from(*self.made - 1),
            );
        } else {
            headers.remove(&PREVIOUS_ATTEMPTS_HEADER);
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
