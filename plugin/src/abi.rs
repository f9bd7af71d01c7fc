//! The proxy-wasm side: contexts for the SDK's dispatcher, and host calls
//! made through the raw ABI.
//!
//! The SDK's `hostcalls` panic on any status they do not expect and its header
//! readers unwrap UTF-8; either would take down the worker's VM on a host
//! quirk or a non-UTF-8 header. The calls below return whatever the host says
//! and read bytes as bytes.

use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::Cell;
use core::ptr::null_mut;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use tether_core::config::Problem;
use tether_core::ConfigError;

use crate::config::PluginConfig;
use crate::filter::{Exchange, HeaderMap, Host, Level, Plugin};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

const OK: u32 = 0;
const REQUEST_HEADERS: u32 = 0;
const RESPONSE_HEADERS: u32 = 2;
const PLUGIN_CONFIGURATION: u32 = 7;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
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

/// Takes ownership of a buffer the host allocated through the SDK's
/// `proxy_on_memory_allocate` (a boxed slice of exactly `size` bytes).
fn owned(status: u32, data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if status != OK || data.is_null() {
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

fn clock() -> Option<u64> {
    let mut nanos = 0u64;
    // SAFETY: the host writes one u64.
    let status = unsafe { proxy_get_current_time_nanoseconds(&mut nanos) };
    (status == OK && nanos > 0).then_some(nanos / 1_000_000_000)
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
        unsafe {
            if add {
                proxy_add_header_map_value(map, k.as_ptr(), k.len(), v.as_ptr(), v.len());
            } else {
                proxy_replace_header_map_value(map, k.as_ptr(), k.len(), v.as_ptr(), v.len());
            }
        }
    }

    fn remove(map: u32, name: &str) {
        // SAFETY: pointer and length of a live string.
        unsafe { proxy_remove_header_map_value(map, name.as_ptr(), name.len()) };
    }
}

impl Host for Envoy {
    fn request_headers(&mut self) -> Option<HeaderMap> {
        // SAFETY: out-pointers from `fetch`.
        fetch(|data, size| unsafe { proxy_get_header_map_pairs(REQUEST_HEADERS, data, size) })
            .map(HeaderMap)
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
        let map = RESPONSE_HEADERS;
        // SAFETY: pointer and length of a live string; out-pointers from `fetch`.
        fetch(|data, size| unsafe {
            proxy_get_header_map_value(map, name.as_ptr(), name.len(), data, size)
        })
    }

    fn local_reply(&mut self, status: u32, details: &str, body: &str) {
        let headers = HeaderMap::from_pairs([("content-type", &b"text/plain"[..])]);
        // SAFETY: pointers and lengths of live buffers.
        unsafe {
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
        };
    }

    fn log(&mut self, level: Level, message: &str) {
        log(level, message);
    }
}

/// One plugin configuration in one VM (per worker).
#[derive(Default)]
struct Root {
    plugin: Option<Rc<Plugin>>,
    /// Epoch seconds, refreshed every second by `on_tick`.
    now: Rc<Cell<Option<u64>>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
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
                self.plugin = Some(Rc::new(Plugin::new(config, debug)));
                self.now.set(clock());
                // SAFETY: a plain value argument.
                unsafe { proxy_set_tick_period_milliseconds(1000) };
                true
            }
            Err(e) => {
                // One line naming the field and the value; Envoy then refuses
                // the configuration (start-up fails, an update is rejected).
                log(
                    Level::Error,
                    &alloc::format!("tether: invalid plugin configuration: {e}"),
                );
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(now) = clock() {
            self.now.set(Some(now));
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            plugin: self.plugin.clone(),
            now: self.now.clone(),
            exchange: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
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
        "tether: session {state}, format {}, strict {}, {} key(s); writes {} ({})",
        s.config().format,
        s.strict(),
        s.config().keys.len(),
        config.override_header,
        config.encoding.as_str()
    )
}

/// One HTTP stream.
struct Stream {
    plugin: Option<Rc<Plugin>>,
    now: Rc<Cell<Option<u64>>>,
    /// Everything the response side needs, cached on the request side:
    /// request headers cannot be read in the response callback.
    exchange: Option<Exchange>,
}

impl Context for Stream {}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        if let Some(plugin) = &self.plugin {
            self.exchange = Some(plugin.on_request(&mut Envoy, self.now.get()));
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let replaced = match &self.plugin {
            Some(plugin) => plugin.on_response(&mut Envoy, self.exchange.as_ref()),
            None => false,
        };
        if replaced {
            Action::Pause
        } else {
            Action::Continue
        }
    }
}
