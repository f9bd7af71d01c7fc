//! The proxy-wasm side, on the raw ABI (0.2.1): the exports Envoy calls and
//! the host calls the plugin makes.
//!
//! No SDK: its dispatcher exports every callback (bodies, trailers, logs,
//! `on_done`), so Envoy enters the VM for each of them on every request, and
//! keeps contexts in a SipHash map. Exporting only what the plugin uses cut
//! about 8,700 instructions per request in Envoy (`scripts/bench-plugin.sh`:
//! the empty filter with the SDK against the raw one), and Envoy skips a
//! callback a module does not export. The SDK's `hostcalls` would also panic on
//! a status they do not expect and unwrap UTF-8; the calls below return
//! whatever the host says and read bytes as bytes.

use alloc::collections::BTreeMap;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::ptr::{null_mut, NonNull};
use std::alloc::{alloc, Layout};
use tether_core::config::Problem;
use tether_core::ConfigError;

use crate::config::PluginConfig;
use crate::filter::{Exchange, HeaderMap, Host, Level, Plugin};
use crate::metrics::{Counter, Tally, COUNTERS};

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const PLUGIN_CONFIGURATION: u32 = 7;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_size: usize) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *mut *mut u8,
        value_size: *mut usize,
    ) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    #[link_name = "random_get"]
    fn wasi_random_get(buf: *mut u8, len: usize) -> u32;
}

/// Counts a failed host call (a status other than OK).
#[inline]
fn failed(status: u32) {
    if status != OK {
        host_call_failed();
    }
}

/// Out of line: the calls that can fail stay as short as they were.
#[cold]
#[inline(never)]
fn host_call_failed() {
    TALLY.with(|t| t.add(Counter::HostCallFailures));
}

/// Takes ownership of a buffer the host allocated through
/// `proxy_on_memory_allocate` (exactly `size` bytes, as a `Vec<u8>` holds them).
/// "Not found" is an answer (the header or property is absent); any other
/// failure is counted.
fn owned(status: u32, data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if status != OK {
        if status != NOT_FOUND {
            host_call_failed();
        }
        return None;
    }
    // An empty value is present all the same (a client's empty override
    // header must still be removed); the host need not allocate for it, and
    // `proxy_on_memory_allocate` hands out no memory for zero bytes.
    if size == 0 {
        return Some(Vec::new());
    }
    if data.is_null() {
        host_call_failed();
        return None;
    }
    // SAFETY: on success the host wrote a pointer it got from the plugin's
    // allocator for exactly `size` bytes, and hands its ownership over.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

fn log(level: Level, message: &str) {
    // SAFETY: pointer and length of a live string.
    unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) };
}

fn log_level() -> Option<u32> {
    let mut level = 0;
    // SAFETY: the host writes one u32.
    (unsafe { proxy_get_log_level(&mut level) } == OK).then_some(level)
}

/// The clock in epoch seconds; a failed read or a zero is counted (the last
/// reading stays in use; without one, streams are left alone: see
/// `Plugin::on_request`).
fn clock() -> Option<u64> {
    let mut nanos = 0u64;
    // SAFETY: the host writes one u64.
    let status = unsafe { proxy_get_current_time_nanoseconds(&mut nanos) };
    let now = (status == OK && nanos > 0).then_some(nanos / 1_000_000_000);
    if now.is_none() {
        host_call_failed();
    }
    now
}

fn plugin_configuration() -> Option<Vec<u8>> {
    // SAFETY: out-pointers from `fetch`.
    fetch(|data, size| unsafe {
        proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, usize::MAX, data, size)
    })
}

/// Runs a host call that returns a buffer through two out-pointers (to
/// locals here) and takes ownership of what it wrote; see `owned`.
fn fetch(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Option<Vec<u8>> {
    let (mut data, mut size) = (null_mut(), 0);
    let status = call(&mut data, &mut size);
    owned(status, data, size)
}

/// Envoy, as the plugin's [`Host`].
struct Envoy;

impl Envoy {
    fn set(map: u32, name: &str, value: &str, add: bool) {
        let (k, v) = (name.as_bytes(), value.as_bytes());
        // SAFETY: pointers and lengths of live strings.
        failed(unsafe {
            if add {
                proxy_add_header_map_value(map, k.as_ptr(), k.len(), v.as_ptr(), v.len())
            } else {
                proxy_replace_header_map_value(map, k.as_ptr(), k.len(), v.as_ptr(), v.len())
            }
        });
    }

    fn value(map: u32, name: &str) -> Option<Vec<u8>> {
        // SAFETY: pointer and length of a live string; out-pointers from `fetch`.
        fetch(|data, size| unsafe {
            proxy_get_header_map_value(map, name.as_ptr(), name.len(), data, size)
        })
    }

    fn remove(map: u32, name: &str) {
        // SAFETY: pointer and length of a live string.
        failed(unsafe { proxy_remove_header_map_value(map, name.as_ptr(), name.len()) });
    }
}

impl Host for Envoy {
    fn request_headers(&mut self) -> Option<HeaderMap> {
        // SAFETY: out-pointers from `fetch`.
        fetch(|data, size| unsafe { proxy_get_header_map_pairs(REQUEST_HEADERS, data, size) })
            .map(HeaderMap)
    }

    fn request_header(&mut self, name: &str) -> Option<Vec<u8>> {
        Envoy::value(REQUEST_HEADERS, name)
    }

    fn set_request_header(&mut self, name: &str, value: &str) {
        Envoy::set(REQUEST_HEADERS, name, value, false);
    }

    fn remove_request_header(&mut self, name: &str) {
        Envoy::remove(REQUEST_HEADERS, name);
    }

    fn property(&mut self, path: &str) -> Option<Vec<u8>> {
        // SAFETY: pointer and length of a live string; out-pointers from `fetch`.
        fetch(|data, size| unsafe { proxy_get_property(path.as_ptr(), path.len(), data, size) })
    }

    fn add_response_header(&mut self, name: &str, value: &str) {
        Envoy::set(RESPONSE_HEADERS, name, value, true);
    }

    fn set_response_header(&mut self, name: &str, value: &str) {
        Envoy::set(RESPONSE_HEADERS, name, value, false);
    }

    fn remove_response_header(&mut self, name: &str) {
        Envoy::remove(RESPONSE_HEADERS, name);
    }

    fn response_header(&mut self, name: &str) -> Option<Vec<u8>> {
        Envoy::value(RESPONSE_HEADERS, name)
    }

    fn local_reply(&mut self, status: u32, details: &str, body: &str) {
        let headers = HeaderMap::from_pairs([("content-type", &b"text/plain"[..])]);
        // SAFETY: pointers and lengths of live buffers.
        failed(unsafe {
            proxy_send_local_response(
                status,
                details.as_ptr(),
                details.len(),
                body.as_ptr(),
                body.len(),
                headers.0.as_ptr(),
                headers.0.len(),
                -1,
            )
        });
    }

    fn log(&mut self, level: Level, message: &str) {
        log(level, message);
    }

    fn random(&mut self, out: &mut [u8]) -> bool {
        // SAFETY: the host writes exactly `out.len()` bytes into `out`.
        let status = unsafe { wasi_random_get(out.as_mut_ptr(), out.len()) };
        failed(status);
        status == OK
    }

    fn count(&mut self, counter: Counter) {
        // VM memory only: the timer hands the counts to Envoy.
        TALLY.with(|t| t.add(counter));
    }
}

std::thread_local! {
    /// Counts not yet in Envoy's stats (see `crate::metrics`).
    static TALLY: Tally = const { Tally::new() };
    /// Envoy's ids of the counters defined in this VM, by index.
    static METRIC_IDS: RefCell<[Option<u32>; COUNTERS]> = const { RefCell::new([None; COUNTERS]) };
}

/// Defines every counter not yet defined in this VM, so that each shows in
/// Envoy's stats (at zero) from the first configuration on.
fn define_metrics() {
    const COUNTER: u32 = 0;
    METRIC_IDS.with_borrow_mut(|ids| {
        for counter in Counter::ALL {
            let slot = &mut ids[counter.index()];
            if slot.is_some() {
                continue;
            }
            let name = counter.name();
            let mut id = 0;
            // SAFETY: pointer and length of a live string; `id` is writable.
            let status =
                unsafe { proxy_define_metric(COUNTER, name.as_ptr(), name.len(), &mut id) };
            if status == OK {
                *slot = Some(id);
            }
        }
    });
}

/// Hands the VM's counts to Envoy: one `proxy_increment_metric` per counter
/// that moved since the last flush; a count Envoy does not take is kept for
/// the next one.
fn flush_metrics() {
    define_metrics();
    METRIC_IDS.with_borrow(|ids| {
        TALLY.with(|t| {
            t.flush(|counter, delta| {
                let (Some(id), Ok(delta)) = (ids[counter.index()], i64::try_from(delta)) else {
                    return false;
                };
                // SAFETY: plain value arguments.
                unsafe { proxy_increment_metric(id, delta) == OK }
            })
        })
    });
}

/// One plugin configuration (a root context) in one VM (per worker).
#[derive(Default)]
struct Root {
    plugin: Option<Rc<Plugin>>,
    /// Epoch seconds, refreshed every second by `proxy_on_tick`.
    now: Option<u64>,
}

/// One HTTP stream.
struct Stream {
    root: u32,
    /// Everything the response side needs, cached on the request side:
    /// request headers cannot be read in the response callback.
    exchange: Option<Exchange>,
}

/// The VM's contexts by id. A VM runs on one thread and Envoy never calls
/// into it re-entrantly, except for `proxy_on_memory_allocate`, which does
/// not touch them.
#[derive(Default)]
struct Contexts {
    roots: BTreeMap<u32, Root>,
    streams: BTreeMap<u32, Stream>,
}

std::thread_local! {
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts::default());
}

fn with<T>(f: impl FnOnce(&mut Contexts) -> T) -> T {
    CONTEXTS.with(|c| f(&mut c.borrow_mut()))
}

const CONTINUE: u32 = 0;
const STOP_ITERATION: u32 = 1;

/// The ABI version this module speaks.
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// Memory for what the host hands over (header values, properties): a byte
/// buffer of exactly `size`, which `owned` takes back as a `Vec`.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    if size == 0 {
        return NonNull::dangling().as_ptr();
    }
    match Layout::array::<u8>(size) {
        // SAFETY: a non-zero size; the layout is what `Vec<u8>` uses for
        // this capacity, so `Vec::from_raw_parts` may free it.
        Ok(layout) => unsafe { alloc(layout) },
        Err(_) => null_mut(),
    }
}

/// A root context (no parent) or a stream of the root `parent`.
#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent: u32) {
    with(|c| {
        if parent == 0 {
            c.roots.insert(context_id, Root::default());
        } else {
            c.streams.insert(
                context_id,
                Stream {
                    root: parent,
                    exchange: None,
                },
            );
        }
    });
}

/// The VM starts: nothing to do before the configuration.
#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root: u32, _size: usize) -> u32 {
    1
}

/// Reads and checks the configuration; false makes Envoy refuse it.
#[no_mangle]
pub extern "C" fn proxy_on_configure(root: u32, _size: usize) -> u32 {
    let bytes = plugin_configuration().unwrap_or_default();
    let parsed = match core::str::from_utf8(&bytes) {
        Ok(text) => PluginConfig::from_json(text),
        Err(_) => Err(ConfigError::new(
            "",
            "",
            Problem::Json(String::from("the configuration is not UTF-8")),
        )),
    };
    match parsed {
        Ok(config) => {
            log(Level::Info, &describe(&config));
            let debug = log_level().is_some_and(|l| l <= Level::Debug as u32);
            let plugin = Rc::new(Plugin::new(config, debug));
            let now = clock();
            with(|c| {
                let r = c.roots.entry(root).or_default();
                r.plugin = Some(plugin);
                r.now = now;
            });
            define_metrics();
            // SAFETY: a plain value argument.
            failed(unsafe { proxy_set_tick_period_milliseconds(1000) });
            1
        }
        Err(e) => {
            // One line naming the field and the value; Envoy then refuses
            // the configuration (start-up fails, an update is rejected).
            log(
                Level::Error,
                &alloc::format!("tether: invalid plugin configuration: {e}"),
            );
            // At once: a refused configuration may never tick.
            TALLY.with(|t| t.add(Counter::ConfigErrors));
            flush_metrics();
            0
        }
    }
}

/// Once a second: the clock streams read (cookie expiries are whole seconds),
/// and the counts of the last second handed to Envoy's stats.
#[no_mangle]
pub extern "C" fn proxy_on_tick(root: u32) {
    if let Some(now) = clock() {
        with(|c| {
            if let Some(r) = c.roots.get_mut(&root) {
                r.now = Some(now);
            }
        });
    }
    flush_metrics();
}

/// The plugin and clock of `stream`'s root, outside the borrow (host calls
/// follow).
fn plugin_of(stream: u32) -> Option<(Rc<Plugin>, Option<u64>)> {
    with(|c| {
        let root = c.roots.get(&c.streams.get(&stream)?.root)?;
        Some((root.plugin.clone()?, root.now))
    })
}

/// Request headers: decide, and tell Envoy where a pinned request goes.
#[no_mangle]
pub extern "C" fn proxy_on_request_headers(stream: u32, _headers: usize, _eos: u32) -> u32 {
    if let Some((plugin, now)) = plugin_of(stream) {
        let exchange = plugin.on_request(&mut Envoy, now);
        with(|c| {
            if let Some(s) = c.streams.get_mut(&stream) {
                s.exchange = Some(exchange);
            }
        });
    }
    CONTINUE
}

/// Response headers: a cookie when another host answered; strict replies.
#[no_mangle]
pub extern "C" fn proxy_on_response_headers(stream: u32, _headers: usize, _eos: u32) -> u32 {
    let Some((plugin, _)) = plugin_of(stream) else {
        return CONTINUE;
    };
    let exchange = with(|c| c.streams.get_mut(&stream).and_then(|s| s.exchange.take()));
    if plugin.on_response(&mut Envoy, exchange.as_ref()) {
        STOP_ITERATION
    } else {
        CONTINUE
    }
}

/// A context is gone. When it is the VM's last root context (the plugin
/// is being removed), the counts since the last tick go to Envoy now.
#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    let last_root = with(|c| {
        c.streams.remove(&context_id).is_none()
            && c.roots.remove(&context_id).is_some()
            && c.roots.is_empty()
    });
    if last_root {
        flush_metrics();
    }
}

fn describe(config: &PluginConfig) -> String {
    let s = &config.session;
    let state = match (s.cookie_name(), s.header_name()) {
        (Some(c), _) => alloc::format!("cookie {c:?}"),
        (_, Some(h)) => alloc::format!("header {h:?}"),
        _ => String::new(),
    };
    alloc::format!(
        "tether: session {state}, format {}, strict {}, {} key(s); writes {} ({}); {}",
        s.config().format,
        s.strict(),
        s.config().keys.len(),
        config.override_header,
        config.encoding.as_str(),
        tether_core::cookie::readers::explain(s.config().format, s.cookie_name().is_none())
    )
}
