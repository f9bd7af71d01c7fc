//! A proxy-wasm HTTP filter that overrides no callback.
//!
//! Envoy still creates a context per request and calls into the VM for every
//! event the SDK exports, so this measures what the wasm filter machinery
//! alone costs (the floor of any wasm plugin). Build it like the plugin:
//! `cargo build -p tether-empty-filter --target wasm32-wasip1 --profile wasm`.

use proxy_wasm::traits::{Context, HttpContext};

proxy_wasm::main! {{
    // The SDK's default root context is kept; every request gets an `Empty`.
    proxy_wasm::set_http_context(|_, _| -> Box<dyn HttpContext> { Box::new(Empty) });
}}

/// The per-request context; every callback keeps the SDK's default (continue).
struct Empty;

impl Context for Empty {}

impl HttpContext for Empty {}
