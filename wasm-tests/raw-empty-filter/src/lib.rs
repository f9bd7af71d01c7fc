//! A proxy-wasm HTTP filter that does nothing, with no SDK: it exports the
//! ABI version, the allocator, and the context, configuration and header
//! callbacks, each returning at once. Envoy skips the callbacks a module does
//! not export (bodies, trailers, `on_log`, `on_done`), so beside the SDK's
//! empty filter (`tether-empty-filter`, which exports them all) this measures
//! what the SDK's dispatcher costs per request.
//!
//! Build: `cargo build -p tether-raw-empty-filter --target wasm32-wasip1 --profile wasm`.

use std::alloc::{alloc, Layout};

/// The ABI this module speaks.
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// Memory for the host's answers (none are asked for here, but the host
/// requires the export).
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    match Layout::from_size_align(size.max(1), 1) {
        // SAFETY: a non-zero size with a valid alignment.
        Ok(layout) => unsafe { alloc(layout) },
        Err(_) => std::ptr::null_mut(),
    }
}

/// Root and stream contexts need no state.
#[no_mangle]
pub extern "C" fn proxy_on_context_create(_context_id: u32, _parent_id: u32) {}

/// The VM starts.
#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_context_id: u32, _size: usize) -> u32 {
    1
}

/// Any configuration is accepted.
#[no_mangle]
pub extern "C" fn proxy_on_configure(_context_id: u32, _size: usize) -> u32 {
    1
}

/// Continue.
#[no_mangle]
pub extern "C" fn proxy_on_request_headers(_context_id: u32, _headers: usize, _eos: u32) -> u32 {
    0
}

/// Continue.
#[no_mangle]
pub extern "C" fn proxy_on_response_headers(_context_id: u32, _headers: usize, _eos: u32) -> u32 {
    0
}

/// Nothing to free.
#[no_mangle]
pub extern "C" fn proxy_on_delete(_context_id: u32) {}
