//! What one channel, one call and one attempt record (A66's `CallTracer`
//! and `CallAttemptTracer`): a call is measured from when the channel takes
//! it to when its status is known; each attempt from before its LB pick to
//! its end, with the message bytes it sent and received. Whatever is not
//! ended explicitly (the application dropped the call) ends `CANCELLED`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use http_body::{Body as HttpBody, Frame};
use opentelemetry::metrics::{BoundCounter, BoundHistogram};
use opentelemetry::KeyValue;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::Code;

use super::{AttributeFilter, CallLabels, Instruments, MessageBytes, MAX_METHODS};

/// The per-call instruments bound to one method's labels (the SDK resolves
/// a label set once, not on every measurement), each status's bound when
/// a call first ends with it.
pub(crate) struct MethodInstruments {
    /// `grpc.method`, `grpc.target`.
    labels: [KeyValue; 2],
    started: BoundCounter<u64>,
    by_status: [OnceLock<StatusInstruments>; 17],
}

impl std::fmt::Debug for MethodInstruments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodInstruments")
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

/// A method's instruments bound with one `grpc.status` too.
struct StatusInstruments {
    attempt_duration: BoundHistogram<f64>,
    attempt_sent: BoundHistogram<u64>,
    attempt_rcvd: BoundHistogram<u64>,
    call_duration: BoundHistogram<f64>,
}

impl MethodInstruments {
    fn new(instruments: &Instruments, method: KeyValue, target: &KeyValue) -> Self {
        let labels = [method, target.clone()];
        MethodInstruments {
            started: instruments.attempt_started.bind(&labels),
            labels,
            by_status: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    fn status(&self, instruments: &Instruments, code: Code) -> &StatusInstruments {
        self.by_status[(code as usize).min(16)].get_or_init(|| {
            let labels = with_status(&self.labels, code);
            StatusInstruments {
                attempt_duration: instruments.attempt_duration.bind(&labels),
                attempt_sent: instruments.attempt_sent.bind(&labels),
                attempt_rcvd: instruments.attempt_rcvd.bind(&labels),
                call_duration: instruments.call_duration.bind(&labels),
            }
        })
    }
}

/// A channel's instruments and labels; each method's bound once.
pub(crate) struct ChannelMetrics {
    instruments: Arc<Instruments>,
    target: KeyValue,
    method_filter: Option<AttributeFilter>,
    /// Method → its instruments, copied on write (a new method is rare;
    /// calls read it without a lock).
    methods: ArcSwap<HashMap<Box<str>, Arc<MethodInstruments>>>,
    /// `grpc.method` `other`, for the methods past [`MAX_METHODS`] and
    /// those the filter declines.
    other: OnceLock<Arc<MethodInstruments>>,
}

impl std::fmt::Debug for ChannelMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelMetrics")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl ChannelMetrics {
    pub(super) fn new(
        instruments: Arc<Instruments>,
        target: KeyValue,
        method_filter: Option<AttributeFilter>,
    ) -> Self {
        ChannelMetrics {
            instruments,
            target,
            method_filter,
            methods: ArcSwap::default(),
            other: OnceLock::new(),
        }
    }

    fn other(&self) -> Arc<MethodInstruments> {
        self.other
            .get_or_init(|| {
                Arc::new(MethodInstruments::new(
                    &self.instruments,
                    KeyValue::new("grpc.method", "other"),
                    &self.target,
                ))
            })
            .clone()
    }

    /// The instruments of a call to `path` (`/package.Service/Method`).
    fn method(&self, path: &str) -> Arc<MethodInstruments> {
        let method = path.strip_prefix('/').unwrap_or(path);
        let known = self.methods.load();
        if let Some(m) = known.get(method) {
            return m.clone();
        }
        if known.len() >= MAX_METHODS {
            // Past the bound the method is not kept: `other` each time.
            return self.other();
        }
        drop(known);
        let made = if self.method_filter.as_ref().is_some_and(|f| !f(method)) {
            self.other()
        } else {
            let name: Arc<str> = Arc::from(method);
            Arc::new(MethodInstruments::new(
                &self.instruments,
                KeyValue::new("grpc.method", name),
                &self.target,
            ))
        };
        self.methods.rcu(|methods| {
            let mut methods = HashMap::clone(methods);
            methods.entry(method.into()).or_insert_with(|| made.clone());
            methods
        });
        made
    }

    /// What this channel's LB policies record (A78's `weighted_round_robin`
    /// and A91's instruments).
    pub(crate) fn lb(&self) -> Arc<super::LbMetrics> {
        Arc::new(super::LbMetrics::new(
            self.instruments.clone(),
            self.target.clone(),
        ))
    }

    /// What this channel's subchannels record (A94), if enabled.
    pub(crate) fn subchannels(&self) -> Option<Arc<super::SubchannelMetrics>> {
        super::SubchannelMetrics::new(self.instruments.clone(), self.target.clone())
    }

    /// Polls `client` for A78's XdsClient instruments, labelled with this
    /// channel's target.
    pub(crate) fn watch_xds_client(&self, client: &tether_xds::XdsClient) {
        self.instruments
            .xds_clients
            .add(&self.target, client.metrics());
    }

    /// A session call ended: what became of it (`tether.session.call`),
    /// why its response set a cookie (`tether.session.cookie`), and whether
    /// its cookie is one stock Envoy misreads.
    pub(crate) fn session(&self, call: &'static str, cookie: Option<&'static str>, misread: bool) {
        let i = &self.instruments;
        i.session_calls.add(
            1,
            &[
                self.target.clone(),
                KeyValue::new("tether.session.call", call),
            ],
        );
        if let Some(why) = cookie {
            i.session_cookies.add(
                1,
                &[
                    self.target.clone(),
                    KeyValue::new("tether.session.cookie", why),
                ],
            );
        }
        if misread {
            i.session_envoy_misreads
                .add(1, std::slice::from_ref(&self.target));
        }
    }

    /// A call to `path` starts now.
    pub(crate) fn call(self: &Arc<Self>, path: &str) -> CallMetrics {
        CallMetrics {
            shared: Arc::new(CallShared {
                method: self.method(path),
                instruments: self.instruments.clone(),
                start: Instant::now(),
                retries: AtomicU32::new(0),
                transparent_retries: AtomicU32::new(0),
                delay_ns: AtomicU64::new(0),
                last_end_ns: AtomicU64::new(NO_ATTEMPT_ENDED),
            }),
            done: false,
        }
    }
}

/// A66's name of a status code, as `grpc.status` records it.
pub(crate) fn status_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// `grpc.method` and `grpc.target`, then `grpc.status`.
fn with_status(labels: &[KeyValue; 2], code: Code) -> [KeyValue; 3] {
    let [method, target] = labels;
    [
        method.clone(),
        target.clone(),
        KeyValue::new("grpc.status", status_name(code)),
    ]
}

/// The status of a response's `grpc-status` (trailers, or a trailers-only
/// response's headers); `UNKNOWN` when it has none or an unknown one.
pub(crate) fn status_of(headers: &http::HeaderMap) -> Code {
    headers
        .get("grpc-status")
        .map_or(Code::Unknown, |v| Code::from_bytes(v.as_bytes()))
}

/// `CallShared::last_end_ns` before any attempt ended.
const NO_ATTEMPT_ENDED: u64 = u64::MAX;

/// What a call and its attempts share: the labels, and the retries (A96)
/// its attempts count.
#[derive(Debug)]
struct CallShared {
    /// The call's method's instruments (and labels).
    method: Arc<MethodInstruments>,
    instruments: Arc<Instruments>,
    start: Instant,
    /// Attempts after the first that a retry policy made.
    retries: AtomicU32,
    transparent_retries: AtomicU32,
    /// Time with no attempt in flight between the first and the last.
    delay_ns: AtomicU64,
    /// When the last attempt ended (since `start`).
    last_end_ns: AtomicU64,
}

impl CallShared {
    fn since_start_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }
}

/// What started an attempt (A96).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptKind {
    /// The call's first attempt.
    Original,
    /// The route's retry policy made it.
    Retry,
    /// The last attempt was never seen by the server (gRPC's transparent
    /// retry).
    Transparent,
}

/// One call's measure.
#[derive(Debug)]
pub(crate) struct CallMetrics {
    shared: Arc<CallShared>,
    done: bool,
}

impl CallMetrics {
    /// An attempt of the call starts now (before its pick).
    pub(crate) fn attempt(&self, kind: AttemptKind) -> AttemptMetrics {
        let shared = &self.shared;
        shared.method.started.add(1);
        match kind {
            AttemptKind::Original => {}
            AttemptKind::Retry => {
                shared.retries.fetch_add(1, Ordering::Relaxed);
            }
            AttemptKind::Transparent => {
                shared.transparent_retries.fetch_add(1, Ordering::Relaxed);
            }
        }
        let ended = shared.last_end_ns.load(Ordering::Relaxed);
        if ended != NO_ATTEMPT_ENDED {
            let gap = shared.since_start_ns().saturating_sub(ended);
            shared.delay_ns.fetch_add(gap, Ordering::Relaxed);
        }
        AttemptMetrics {
            shared: shared.clone(),
            start: Instant::now(),
            sent: None,
            rcvd: MessageBytes::default(),
            labels: None,
            done: false,
        }
    }

    /// The call ended with `code`.
    pub(crate) fn end(mut self, code: Code) {
        self.record(code);
    }

    fn record(&mut self, code: Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let shared = &self.shared;
        let i = &shared.instruments;
        shared
            .method
            .status(i, code)
            .call_duration
            .record(shared.start.elapsed().as_secs_f64());
        let labels = &shared.method.labels;
        // A96: counts only for calls that retried, 0 is not recorded.
        let retries = shared.retries.load(Ordering::Relaxed);
        let transparent = shared.transparent_retries.load(Ordering::Relaxed);
        if let Some(h) = i.call_retries.as_ref().filter(|_| retries > 0) {
            h.record(u64::from(retries), labels);
        }
        if let Some(h) = i
            .call_transparent_retries
            .as_ref()
            .filter(|_| transparent > 0)
        {
            h.record(u64::from(transparent), labels);
        }
        if let Some(h) = i.call_retry_delay.as_ref() {
            if retries + transparent > 0 {
                let delay = shared.delay_ns.load(Ordering::Relaxed) as f64 / 1e9;
                h.record(delay, labels);
            }
        }
    }
}

impl Drop for CallMetrics {
    fn drop(&mut self) {
        self.record(Code::Cancelled);
    }
}

/// One attempt's measure.
#[derive(Debug)]
pub(crate) struct AttemptMetrics {
    shared: Arc<CallShared>,
    start: Instant,
    /// Message bytes its request body sent, counted as hyper reads it.
    sent: Option<Arc<AtomicU64>>,
    /// Message bytes of its response read so far.
    rcvd: MessageBytes,
    /// The optional labels its pick knew (A78's locality, A89's backend
    /// service), when the channel records them.
    labels: Option<Arc<CallLabels>>,
    done: bool,
}

impl AttemptMetrics {
    /// `body`, its message bytes counted as they are sent.
    pub(crate) fn count_sent(&mut self, body: Body) -> Body {
        let sent = Arc::new(AtomicU64::new(0));
        self.sent = Some(sent.clone());
        Body::new(SentBody {
            inner: body,
            bytes: MessageBytes::default(),
            sent,
        })
    }

    /// A chunk of the response's messages arrived.
    pub(crate) fn received(&mut self, chunk: &[u8]) {
        self.rcvd.feed(chunk);
    }

    /// The pick's optional labels (the last pick's, as A89 says).
    pub(crate) fn set_labels(&mut self, labels: Arc<CallLabels>) {
        self.labels = Some(labels);
    }

    /// The attempt ended with `code`.
    pub(crate) fn end(mut self, code: Code) {
        self.record(code);
    }

    fn record(&mut self, code: Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let shared = &self.shared;
        shared
            .last_end_ns
            .store(shared.since_start_ns(), Ordering::Relaxed);
        let duration = self.start.elapsed().as_secs_f64();
        let sent = self.sent.as_ref().map_or(0, |s| s.load(Ordering::Relaxed));
        let rcvd = self.rcvd.total();
        let i = &shared.instruments;
        if i.optional_labels.any() {
            // With optional labels: unbound, the label set made here (only
            // channels that turned a label on pay for it); empty where the
            // pick knew none (it failed, or the cluster is not xDS's).
            let mut labels = with_status(&shared.method.labels, code).to_vec();
            let pick = self.labels.as_deref();
            i.optional_labels.append(
                &mut labels,
                pick.map(|l| &l.backend_service),
                pick.map(|l| &l.locality),
            );
            i.attempt_duration.record(duration, &labels);
            i.attempt_sent.record(sent, &labels);
            i.attempt_rcvd.record(rcvd, &labels);
            return;
        }
        let bound = shared.method.status(i, code);
        bound.attempt_duration.record(duration);
        bound.attempt_sent.record(sent);
        bound.attempt_rcvd.record(rcvd);
    }
}

impl Drop for AttemptMetrics {
    fn drop(&mut self) {
        self.record(Code::Cancelled);
    }
}

/// A request body whose message bytes are counted as they go.
struct SentBody {
    inner: Body,
    bytes: MessageBytes,
    sent: Arc<AtomicU64>,
}

impl HttpBody for SentBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.bytes.feed(data);
                this.sent.store(this.bytes.total(), Ordering::Relaxed);
            }
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

/// The committed attempt and its call, ended together when the response
/// body ends.
#[derive(Debug)]
pub(crate) struct BodyMetrics {
    pub(crate) attempt: AttemptMetrics,
    pub(crate) call: CallMetrics,
}

impl BodyMetrics {
    /// A chunk of the response's messages arrived.
    pub(crate) fn received(&mut self, chunk: &[u8]) {
        self.attempt.received(chunk);
    }

    /// The response ended with `code`.
    pub(crate) fn end(self, code: Code) {
        let BodyMetrics { attempt, call } = self;
        attempt.end(code);
        call.end(code);
    }
}

/// Ends `attempt`, if it is measured, with `code`.
pub(crate) fn end_attempt(attempt: &mut Option<AttemptMetrics>, code: Code) {
    if let Some(a) = attempt.take() {
        a.end(code);
    }
}
