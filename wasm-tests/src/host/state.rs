//! What the host knows and records: scripted inputs (time, properties,
//! headers, configuration) and what the plugin did with them.

use std::collections::{BTreeMap, HashMap};

use wasmi::{StoreLimits, StoreLimitsBuilder};

use super::abi::{LogLevel, MapType, Pairs};

/// Largest linear memory a plugin may grow to.
const MEMORY_LIMIT: usize = 256 << 20;

/// The callback the host is running, which decides what the plugin may
/// touch (as in Envoy: request headers only in the request callback, unless
/// the plugin paused the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// No callback running.
    Idle,
    /// `_initialize` / `_start`.
    Init,
    /// `proxy_on_vm_start`.
    VmStart,
    /// `proxy_on_configure`.
    Configure,
    /// `proxy_on_context_create`, `proxy_on_done`, `proxy_on_delete`.
    Lifecycle,
    /// `proxy_on_request_headers`.
    RequestHeaders,
    /// `proxy_on_response_headers`.
    ResponseHeaders,
    /// `proxy_on_log` (the access-log phase: headers readable, not writable).
    Log,
}

/// One log line the plugin wrote (`proxy_log`, or stdout/stderr via WASI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Level (stdout is info, stderr is error, as in Envoy).
    pub level: LogLevel,
    /// Context that was active.
    pub context_id: u32,
    /// Text (lossy UTF-8).
    pub message: String,
}

/// What a header change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    /// `proxy_add_header_map_value`.
    Add,
    /// `proxy_replace_header_map_value` (all values of the name replaced).
    Replace,
    /// `proxy_remove_header_map_value`.
    Remove,
    /// `proxy_set_header_map_pairs` (the whole map replaced).
    SetAll,
}

/// One header change the plugin made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderOp {
    /// Which map.
    pub map: MapType,
    /// What it did.
    pub kind: OpKind,
    /// Header name as the plugin gave it (empty for `SetAll`).
    pub name: String,
    /// Value (empty for `Remove` and `SetAll`).
    pub value: Vec<u8>,
}

/// A response the plugin asked the host to send instead of proxying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status.
    pub status: u32,
    /// Response code details (Envoy's `%RESPONSE_CODE_DETAILS%`).
    pub details: String,
    /// Body.
    pub body: Vec<u8>,
    /// Extra headers.
    pub headers: Pairs,
    /// gRPC status, if any (`-1`/`u32::MAX` means none).
    pub grpc_status: u32,
}

/// A `proxy_call_foreign_function` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignCall {
    /// Function name.
    pub name: String,
    /// Argument bytes.
    pub args: Vec<u8>,
}

/// A metric the plugin defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    /// 0 counter, 1 gauge, 2 histogram.
    pub kind: i32,
    /// Name.
    pub name: String,
    /// Current value (last recorded for histograms).
    pub value: u64,
}

/// Everything about one HTTP stream (request and response).
#[derive(Debug, Clone, Default)]
pub struct StreamRecord {
    /// The stream's context id.
    pub context_id: u32,
    /// Request headers as the plugin left them.
    pub request_headers: Pairs,
    /// Response headers as the plugin left them.
    pub response_headers: Pairs,
    /// Every header change, in order.
    pub ops: Vec<HeaderOp>,
    /// Local response, if the plugin sent one.
    pub local_response: Option<LocalResponse>,
    /// Properties the plugin set (path segments joined by '.', value).
    pub set_properties: Vec<(String, Vec<u8>)>,
    /// `proxy_continue_stream` calls (stream type).
    pub continued: Vec<i32>,
    /// `proxy_close_stream` calls (stream type).
    pub closed: Vec<i32>,
    pub(crate) properties: BTreeMap<Vec<u8>, Vec<u8>>,
    pub(crate) request_paused: bool,
    pub(crate) response_paused: bool,
    pub(crate) request_seen: bool,
    pub(crate) response_seen: bool,
    pub(crate) pending_done: bool,
}

impl StreamRecord {
    /// First value of request header `name` (any case), lossy UTF-8.
    pub fn request_header(&self, name: &str) -> Option<String> {
        first(&self.request_headers, name)
    }

    /// Every value of request header `name`.
    pub fn request_headers_named(&self, name: &str) -> Vec<String> {
        all(&self.request_headers, name)
    }

    /// First value of response header `name`.
    pub fn response_header(&self, name: &str) -> Option<String> {
        first(&self.response_headers, name)
    }

    /// Every value of response header `name`.
    pub fn response_headers_named(&self, name: &str) -> Vec<String> {
        all(&self.response_headers, name)
    }
}

fn all(pairs: &Pairs, name: &str) -> Vec<String> {
    pairs
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .collect()
}

fn first(pairs: &Pairs, name: &str) -> Option<String> {
    all(pairs, name).into_iter().next()
}

/// The store's data: shared by every host function.
pub(crate) struct State {
    pub now_nanos: u64,
    pub monotonic_nanos: u64,
    pub rng: u64,
    pub log_level: LogLevel,
    pub vm_config: Vec<u8>,
    pub plugin_config: Vec<u8>,
    /// Properties every context sees unless its stream overrides them.
    pub properties: BTreeMap<Vec<u8>, Vec<u8>>,
    pub env: Vec<(String, String)>,
    pub phase: Phase,
    /// Context of the running callback (0: none).
    pub active: u32,
    /// Set by `proxy_set_effective_context` for the rest of the callback.
    pub effective: u32,
    pub root_id: u32,
    pub streams: HashMap<u32, StreamRecord>,
    pub logs: Vec<LogLine>,
    pub violations: Vec<String>,
    pub foreign_calls: Vec<ForeignCall>,
    pub foreign_functions: HashMap<String, Vec<u8>>,
    pub metrics: Vec<Metric>,
    pub shared: HashMap<Vec<u8>, (Vec<u8>, u32)>,
    pub tick_period_ms: u32,
    pub calls: BTreeMap<&'static str, u64>,
    /// Set when the plugin called an import the host does not provide.
    pub missing_called: Option<String>,
    /// Bounds the plugin's memory growth.
    pub limits: StoreLimits,
}

impl State {
    pub fn new() -> State {
        State {
            now_nanos: 0,
            monotonic_nanos: 0,
            rng: 0x7e7e_7e7e_0bad_cafe,
            log_level: LogLevel::Trace,
            vm_config: Vec::new(),
            plugin_config: Vec::new(),
            properties: BTreeMap::new(),
            env: Vec::new(),
            phase: Phase::Idle,
            active: 0,
            effective: 0,
            root_id: 0,
            streams: HashMap::new(),
            logs: Vec::new(),
            violations: Vec::new(),
            foreign_calls: Vec::new(),
            foreign_functions: HashMap::new(),
            metrics: Vec::new(),
            shared: HashMap::new(),
            tick_period_ms: 0,
            calls: BTreeMap::new(),
            missing_called: None,
            limits: StoreLimitsBuilder::new().memory_size(MEMORY_LIMIT).build(),
        }
    }

    /// The context hostcalls act on.
    pub fn context(&self) -> u32 {
        if self.effective != 0 {
            self.effective
        } else {
            self.active
        }
    }

    pub fn count(&mut self, name: &'static str) {
        *self.calls.entry(name).or_insert(0) += 1;
    }

    pub fn violation(&mut self, what: String) {
        // Bounded: a plugin in a loop must not exhaust the test's memory.
        if self.violations.len() < 1000 {
            self.violations.push(what);
        }
    }

    pub fn log(&mut self, level: LogLevel, message: String) {
        let context_id = self.context();
        if self.logs.len() < 100_000 {
            self.logs.push(LogLine {
                level,
                context_id,
                message,
            });
        }
    }

    /// SplitMix64: deterministic "randomness" so a failing run can be replayed.
    pub fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The value of property `path` (NUL-separated segments) in the current
    /// context: the stream's own, else the host-wide one.
    pub fn property(&self, path: &[u8]) -> Option<&Vec<u8>> {
        self.streams
            .get(&self.context())
            .and_then(|s| s.properties.get(path))
            .or_else(|| self.properties.get(path))
    }

    /// The header map `map` of the current context, if the plugin may read
    /// it (`write == false`) or change it (`write == true`) now.
    pub fn map(&mut self, map: MapType, write: bool) -> Option<&mut Pairs> {
        let phase = self.phase;
        let stream = self.streams.get_mut(&self.context())?;
        let (here, paused, pairs) = match map {
            MapType::RequestHeaders => (
                Phase::RequestHeaders,
                stream.request_paused,
                &mut stream.request_headers,
            ),
            MapType::ResponseHeaders => (
                Phase::ResponseHeaders,
                stream.response_paused,
                &mut stream.response_headers,
            ),
            // Trailers, gRPC and HTTP-call maps are never scripted.
            _ => return None,
        };
        let available = phase == here || paused || (phase == Phase::Log && !write);
        available.then_some(pairs)
    }
}

/// A header name as Envoy stores it (lowercase).
pub(crate) fn lower(name: &[u8]) -> Vec<u8> {
    name.to_ascii_lowercase()
}

/// Whether a header value may be put on the wire: no NUL, CR or LF.
pub(crate) fn valid_value(v: &[u8]) -> bool {
    !v.iter().any(|&b| b == 0 || b == b'\r' || b == b'\n')
}

/// Whether a header name is a token (or an HTTP/2 pseudo-header).
pub(crate) fn valid_name(n: &[u8]) -> bool {
    let n = n.strip_prefix(b":").unwrap_or(n);
    !n.is_empty()
        && n.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
