//! A proxy-wasm HTTP filter that makes the host calls its configuration lists
//! on every request, and nothing else.
//!
//! `scripts/bench-plugin.sh` runs it in Envoy beside the empty filter: the
//! difference in instructions per request is what those host calls cost
//! (Envoy's side plus the few wasm instructions that make them), which tells
//! the plugin's own work apart from the price of asking Envoy.
//!
//! The configuration is a comma-separated list of calls, made in that order:
//!
//! | call | when | host call |
//! |---|---|---|
//! | `request_headers` | request | the whole request header map |
//! | `request_header:NAME` | request | one request header's value |
//! | `set_request_header:NAME` | request | replace (or add) a request header |
//! | `remove_request_header:NAME` | request | remove a request header |
//! | `property:A.B` | response | a property, e.g. `upstream.address` |
//! | `response_header:NAME` | response | one response header's value |
//! | `add_response_header:NAME` | response | add a response header |
//!
//! An unknown call makes the configuration fail, naming it.
//!
//! Build: `cargo build -p tether-host-call-filter --target wasm32-wasip1 --profile wasm`.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

/// One host call of the configuration.
#[derive(Clone, Debug)]
enum Call {
    RequestHeaders,
    RequestHeader(String),
    SetRequestHeader(String),
    RemoveRequestHeader(String),
    Property(Vec<String>),
    ResponseHeader(String),
    AddResponseHeader(String),
}

impl Call {
    fn parse(item: &str) -> Result<Call, String> {
        let (call, arg) = match item.split_once(':') {
            Some((call, arg)) if !arg.is_empty() => (call, Some(arg.to_string())),
            _ => (item, None),
        };
        Ok(match (call, arg) {
            ("request_headers", None) => Call::RequestHeaders,
            ("request_header", Some(n)) => Call::RequestHeader(n),
            ("set_request_header", Some(n)) => Call::SetRequestHeader(n),
            ("remove_request_header", Some(n)) => Call::RemoveRequestHeader(n),
            ("property", Some(p)) => Call::Property(p.split('.').map(String::from).collect()),
            ("response_header", Some(n)) => Call::ResponseHeader(n),
            ("add_response_header", Some(n)) => Call::AddResponseHeader(n),
            _ => return Err(format!("unknown host call {item:?} in the configuration")),
        })
    }

    fn on_request(&self) -> bool {
        matches!(
            self,
            Call::RequestHeaders
                | Call::RequestHeader(_)
                | Call::SetRequestHeader(_)
                | Call::RemoveRequestHeader(_)
        )
    }
}

#[derive(Default)]
struct Root {
    calls: Rc<Vec<Call>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let parsed: Result<Vec<Call>, String> = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Call::parse)
            .collect();
        match parsed {
            Ok(calls) => {
                self.calls = Rc::new(calls);
                true
            }
            Err(e) => {
                proxy_wasm::hostcalls::log(LogLevel::Error, &e).ok();
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            calls: self.calls.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream {
    calls: Rc<Vec<Call>>,
}

impl Context for Stream {}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        for call in self.calls.iter().filter(|c| c.on_request()) {
            match call {
                Call::RequestHeaders => {
                    std::hint::black_box(self.get_http_request_headers_bytes());
                }
                Call::RequestHeader(name) => {
                    std::hint::black_box(self.get_http_request_header_bytes(name));
                }
                // An address, as the plugin's override header carries.
                Call::SetRequestHeader(name) => {
                    self.set_http_request_header(name, Some("127.0.0.1:8080"))
                }
                Call::RemoveRequestHeader(name) => self.set_http_request_header(name, None),
                _ => {}
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        for call in self.calls.iter().filter(|c| !c.on_request()) {
            match call {
                Call::Property(path) => {
                    let path: Vec<&str> = path.iter().map(String::as_str).collect();
                    std::hint::black_box(self.get_property(path));
                }
                Call::ResponseHeader(name) => {
                    std::hint::black_box(self.get_http_response_header_bytes(name));
                }
                Call::AddResponseHeader(name) => {
                    self.add_http_response_header(name, "probe=1; Path=/; HttpOnly")
                }
                _ => {}
            }
        }
        Action::Continue
    }
}
