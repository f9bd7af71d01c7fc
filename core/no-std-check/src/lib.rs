//! Built by CI as `cargo build -p tether-no-std-check --target wasm32-unknown-unknown`.
//!
//! On wasm32 this crate is `no_std` and defines `#[panic_handler]`. If
//! tether-core or any of its dependencies linked `std`, std's own panic
//! handler would clash with this one ("duplicate lang item"), so the build
//! fails the moment std leaks in. On other targets it is an ordinary crate, so
//! workspace-wide `cargo test`/`clippy` runs keep working.
#![cfg_attr(target_arch = "wasm32", no_std)]

#[cfg(target_arch = "wasm32")]
mod wasm {
    use core::alloc::{GlobalAlloc, Layout};
    use core::cell::UnsafeCell;

    const HEAP: usize = 1 << 20;

    /// A bump allocator over a static arena; enough to exercise the codec once.
    struct Bump {
        arena: UnsafeCell<[u8; HEAP]>,
        next: UnsafeCell<usize>,
    }

    // Single-threaded wasm32.
    unsafe impl Sync for Bump {}

    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let next = &mut *self.next.get();
            let start = (*next + layout.align() - 1) & !(layout.align() - 1);
            if start + layout.size() > HEAP {
                return core::ptr::null_mut();
            }
            *next = start + layout.size();
            (self.arena.get() as *mut u8).add(start)
        }
        unsafe fn dealloc(&self, _: *mut u8, _: Layout) {}
    }

    #[global_allocator]
    static ALLOC: Bump = Bump {
        arena: UnsafeCell::new([0; HEAP]),
        next: UnsafeCell::new(0),
    };

    #[panic_handler]
    fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
        core::arch::wasm32::unreachable()
    }
}

/// Decodes a fixed Envoy cookie and re-encodes it in the gRPC format, so the
/// codec, the protobuf messages, base64 and the session logic are all linked.
#[no_mangle]
pub extern "C" fn tether_no_std_check() -> usize {
    use tether_core::cookie::{decode, encode, Format, KeyRing};
    match decode("Cg8xMjcuMC4wLjE6MTkwMDE=", &KeyRing::empty()) {
        Ok(d) => encode(&d.cookie, Format::Grpc, None).map_or(0, |v| v.len()),
        Err(_) => 0,
    }
}
