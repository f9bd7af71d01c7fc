//! A request body that can be sent again: gRPC caches a call's outgoing
//! messages until the call commits (its response headers arrived, or more
//! was sent than the buffer holds), so that an attempt the server never saw
//! can be replayed on another connection (gRFC A6; C-core's retry buffer).
//!
//! The caller's body is read once, by whichever attempt is ahead; each
//! frame read is kept (while the buffer allows) so that a later attempt
//! first gets the frames already read, then continues reading. Only one
//! attempt is sent at a time, so the lock is never contended.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;
use tonic::Status;

/// How much of a call's messages is kept for a replay, as C-core's
/// `grpc.per_rpc_retry_buffer_size` (256 KiB); a call that sends more is
/// committed to its attempt.
pub(crate) const BUFFER_LIMIT: usize = 256 * 1024;

/// The caller's body, the frames read from it and whether a replay is
/// still possible.
struct State {
    source: Body,
    frames: Vec<Frame<Bytes>>,
    buffered: usize,
    /// The source ended (its last frame is in `frames` when kept).
    ended: bool,
    /// Frames were dropped (buffer full, or committed): no replay.
    committed: bool,
    /// The latest attempt, and whether its body has given a frame.
    attempt: u32,
    started: bool,
}

/// A call's request body, shared by its attempts.
#[derive(Clone)]
pub(crate) struct Replay(Arc<Mutex<State>>);

impl Replay {
    /// Keeps `source` for the call's attempts.
    pub(crate) fn new(source: Body) -> Self {
        Replay(Arc::new(Mutex::new(State {
            source,
            frames: Vec::new(),
            buffered: 0,
            ended: false,
            committed: false,
            attempt: 0,
            started: false,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A body for a new attempt, or `None` once the call is committed (its
    /// frames are no longer all kept).
    pub(crate) fn attempt(&self) -> Option<Body> {
        let attempt = {
            let mut s = self.state();
            if s.committed {
                return None;
            }
            s.attempt += 1;
            s.started = false;
            s.attempt
        };
        // Unlocked: wrapping the body asks it whether it has ended.
        Some(Body::new(AttemptBody {
            replay: self.clone(),
            next: 0,
            attempt,
        }))
    }

    /// Whether the latest attempt's body has given any frame to its
    /// connection: until then no message of the call has left.
    pub(crate) fn started(&self) -> bool {
        self.state().started
    }

    /// Whether another attempt can still be made.
    pub(crate) fn replayable(&self) -> bool {
        !self.state().committed
    }

    /// The call is committed to its attempt: what was kept is dropped and
    /// no other attempt is made.
    pub(crate) fn commit(&self) {
        let mut s = self.state();
        s.committed = true;
        s.frames = Vec::new();
        s.buffered = 0;
    }
}

/// One attempt's view: the kept frames from `next` on, then the source.
struct AttemptBody {
    replay: Replay,
    next: usize,
    attempt: u32,
}

impl HttpBody for AttemptBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let replay = self.replay.clone();
        let mut s = replay.state();
        if s.attempt == self.attempt {
            // Set before any frame leaves: a frame given is a frame sent.
            s.started = true;
        }
        if let Some(frame) = s.frames.get(self.next) {
            let copy = match frame.data_ref() {
                Some(data) => Frame::data(data.clone()),
                None => Frame::trailers(frame.trailers_ref().cloned().unwrap_or_default()),
            };
            self.next += 1;
            return Poll::Ready(Some(Ok(copy)));
        }
        if s.ended {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut s.source).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let size = frame.data_ref().map_or(0, Bytes::len);
                if !s.committed && s.buffered + size <= BUFFER_LIMIT {
                    let kept = match frame.data_ref() {
                        Some(data) => Frame::data(data.clone()),
                        None => Frame::trailers(frame.trailers_ref().cloned().unwrap_or_default()),
                    };
                    s.buffered += size;
                    s.frames.push(kept);
                    self.next = s.frames.len();
                } else {
                    s.committed = true;
                    s.frames = Vec::new();
                    s.buffered = 0;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                s.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                // The caller's own body failed: nothing to replay.
                s.committed = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        let s = self.replay.state();
        s.ended && self.next >= s.frames.len()
    }

    fn size_hint(&self) -> SizeHint {
        let s = self.replay.state();
        let kept: usize = s.frames[self.next.min(s.frames.len())..]
            .iter()
            .filter_map(|f| f.data_ref().map(Bytes::len))
            .sum();
        let rest = s.source.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + kept as u64);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + kept as u64);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn body(chunks: &[&'static str]) -> Body {
        let frames: Vec<Result<Frame<Bytes>, Status>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect();
        Body::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)))
    }

    async fn read(b: Body) -> Vec<u8> {
        b.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn a_second_attempt_sends_the_same_bytes() {
        let r = Replay::new(body(&["ab", "cd", "ef"]));
        assert_eq!(read(r.attempt().unwrap()).await, b"abcdef");
        assert_eq!(read(r.attempt().unwrap()).await, b"abcdef");
    }

    #[tokio::test]
    async fn an_attempt_cut_short_is_continued_by_the_next() {
        let r = Replay::new(body(&["ab", "cd", "ef"]));
        let mut first = r.attempt().unwrap();
        let f = first.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), "ab");
        drop(first);
        // The next attempt replays "ab", then reads on from the source.
        assert_eq!(read(r.attempt().unwrap()).await, b"abcdef");
    }

    #[tokio::test]
    async fn started_tells_whether_the_latest_attempt_gave_a_frame() {
        let r = Replay::new(body(&["ab", "cd"]));
        let mut first = r.attempt().unwrap();
        assert!(!r.started(), "nothing read yet");
        first.frame().await.unwrap().unwrap();
        assert!(r.started());
        let mut second = r.attempt().unwrap();
        assert!(!r.started(), "a new attempt starts unsent");
        // The first attempt, still held somewhere, reads on: not the latest.
        first.frame().await.unwrap().unwrap();
        assert!(!r.started());
        second.frame().await.unwrap().unwrap();
        assert!(r.started());
    }

    #[tokio::test]
    async fn a_committed_call_makes_no_other_attempt() {
        let r = Replay::new(body(&["ab"]));
        assert_eq!(read(r.attempt().unwrap()).await, b"ab");
        r.commit();
        assert!(r.attempt().is_none());
    }

    #[tokio::test]
    async fn more_than_the_buffer_commits_the_call() {
        let big: &'static str = Box::leak("x".repeat(BUFFER_LIMIT).into_boxed_str());
        let r = Replay::new(body(&[big, "y"]));
        assert_eq!(read(r.attempt().unwrap()).await.len(), BUFFER_LIMIT + 1);
        assert!(r.attempt().is_none(), "the buffer overflowed: committed");
    }
}
