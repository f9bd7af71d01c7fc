//! The host's own tests: hand-written modules that exercise one hostcall
//! each, and the empty filter built from Rust.

use super::*;

fn module(wat: &str) -> Wasm {
    let bytes = wat::parse_str(wat).expect("test module is valid WAT");
    Wasm::new(&bytes).expect("test module compiles")
}

/// A module's exported memory and a bump allocator from address 4096 that
/// serves the host's copies, as WAT module fields for `concat!`.
macro_rules! bump_allocator {
    () => {
        r#"
  (memory (export "memory") 1)
  (global $bump (mut i32) (i32.const 4096))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $bump))
    (global.set $bump (i32.add (global.get $bump) (local.get $n)))
    (local.get $p))"#
    };
}

/// Calls a handful of hostcalls and logs what it saw. A bump allocator
/// serves the host's copies. Scratch words: 0 = pointer, 4 = size.
const PROBE: &str = concat!(
    r#"
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $get_buffer (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_header_map_value" (func $get_header (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_replace_header_map_value" (func $replace (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_remove_header_map_value" (func $remove (param i32 i32 i32) (result i32)))
  (import "env" "proxy_get_property" (func $get_property (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_send_local_response"
    (func $local (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
"#,
    bump_allocator!(),
    r#"
  (data (i32.const 100) "x-probe")
  (data (i32.const 120) "upstream\00address")
  (data (i32.const 140) "replaced")
  (data (i32.const 160) "x-remove")
  (data (i32.const 180) "denied")
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $get_buffer (i32.const 7) (i32.const 0) (i32.const -1) (i32.const 0) (i32.const 4)))
    (drop (call $log (i32.const 2) (i32.load (i32.const 0)) (i32.load (i32.const 4))))
    (i32.ne (local.get 1) (i32.const 0)))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (if (i32.eqz (call $get_header (i32.const 0) (i32.const 100) (i32.const 7) (i32.const 0) (i32.const 4)))
      (then (drop (call $log (i32.const 2) (i32.load (i32.const 0)) (i32.load (i32.const 4))))))
    (drop (call $replace (i32.const 0) (i32.const 100) (i32.const 7) (i32.const 140) (i32.const 8)))
    (drop (call $remove (i32.const 0) (i32.const 160) (i32.const 8)))
    ;; the realtime clock, as seconds, in the log as 8 raw bytes
    (drop (call $clock (i32.const 0) (i64.const 0) (i32.const 208)))
    (i64.store (i32.const 208) (i64.div_u (i64.load (i32.const 208)) (i64.const 1000000000)))
    (drop (call $log (i32.const 1) (i32.const 208) (i32.const 8)))
    (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    ;; the status of reading a request header now, as one digit
    (i32.store8 (i32.const 200)
      (i32.add (i32.const 48)
        (call $get_header (i32.const 0) (i32.const 100) (i32.const 7) (i32.const 0) (i32.const 4))))
    (drop (call $log (i32.const 3) (i32.const 200) (i32.const 1)))
    (if (i32.eqz (call $get_property (i32.const 120) (i32.const 16) (i32.const 0) (i32.const 4)))
      (then (drop (call $log (i32.const 2) (i32.load (i32.const 0)) (i32.load (i32.const 4))))))
    (drop (call $local (i32.const 503) (i32.const 180) (i32.const 6) (i32.const 180) (i32.const 6)
      (i32.const 0) (i32.const 0) (i32.const -1)))
    (i32.const 0))
)
"#
);

/// Calls an import the host lacks, panics (message on stderr, then
/// `unreachable`) and loops forever, each in its own callback.
const BROKEN: &str = r#"
(module
  (import "env" "proxy_http_call"
    (func $http_call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "panicked at filter.rs: boom\n")
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $http_call (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)
      (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)))
    (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 28))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
    unreachable)
  (func (export "proxy_on_log") (param i32)
    (loop $forever (br $forever)))
)
"#;

fn messages(host: &Host) -> Vec<String> {
    host.logs().iter().map(|l| l.message.clone()).collect()
}

#[test]
fn configuration_is_served_in_on_configure_and_false_refuses_it() {
    let wasm = module(PROBE);
    assert!(
        wasm.missing_imports().is_empty(),
        "{:?}",
        wasm.missing_imports()
    );
    let mut host = wasm.instantiate().unwrap();
    assert!(host.configure(r#"{"cookie":{"name":"s"}}"#).unwrap());
    assert_eq!(messages(&host), [r#"{"cookie":{"name":"s"}}"#]);
    // The probe refuses an empty configuration.
    assert!(!host.configure("").unwrap());
}

#[test]
fn request_headers_are_read_first_value_replaced_and_removed() {
    let mut host = module(PROBE).instantiate().unwrap();
    host.set_epoch_seconds(1_795_348_489);
    let mut s = host.stream().unwrap();
    let action = s
        .request_headers(
            &[
                (":path", "/"),
                ("X-Probe", "first"),
                ("x-probe", "second"),
                ("x-remove", "a"),
                ("X-Remove", "b"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(action, Action::Continue);
    let rec = s.record().clone();
    // Envoy hands out only the first value of a repeated header.
    assert_eq!(
        s.host().logs()[0].message,
        "first",
        "{}",
        s.host().log_text()
    );
    // The clock as the test set it (8 raw bytes, so compared as logged: lossy).
    assert_eq!(
        s.host().logs()[1].message,
        String::from_utf8_lossy(&1_795_348_489u64.to_le_bytes())
    );
    // Replace leaves one value; names are stored lowercase.
    assert_eq!(rec.request_headers_named("x-probe"), ["replaced"]);
    assert!(rec.request_headers_named("x-remove").is_empty());
    let kinds: Vec<_> = rec
        .ops
        .iter()
        .map(|o| (o.kind.clone(), o.name.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            (OpKind::Replace, "x-probe".to_string()),
            (OpKind::Remove, "x-remove".to_string())
        ]
    );
}

#[test]
fn response_callback_cannot_read_request_headers_but_reads_properties() {
    let mut host = module(PROBE).instantiate().unwrap();
    let mut s = host.stream().unwrap();
    s.request_headers(&[("x-probe", "v")], true).unwrap();
    s.set_upstream_address("127.0.0.1:19001");
    s.response_headers(&[(":status", "200")], false).unwrap();
    let log = messages(s.host());
    // "2" = BAD_ARGUMENT: the request map is gone once the request continued.
    assert_eq!(log[log.len() - 2], "2", "{log:?}");
    assert_eq!(log[log.len() - 1], "127.0.0.1:19001");
    let local = s.record().local_response.clone().expect("local response");
    assert_eq!(local.status, 503);
    assert_eq!(local.details, "denied");
    assert_eq!(local.body, b"denied");
    let rec = s.finish().unwrap();
    assert_eq!(rec.response_header(":status").as_deref(), Some("200"));
}

#[test]
fn stream_properties_override_host_properties() {
    let mut host = module(PROBE).instantiate().unwrap();
    host.set_property(&["upstream", "address"], "10.0.0.1:80");
    let mut s = host.stream().unwrap();
    s.request_headers(&[], true).unwrap();
    s.response_headers(&[], true).unwrap();
    assert_eq!(messages(s.host()).last().unwrap(), "10.0.0.1:80");
    s.finish().unwrap();
    let mut s = host.stream().unwrap();
    s.set_upstream_address("10.0.0.2:80");
    s.request_headers(&[], true).unwrap();
    s.response_headers(&[], true).unwrap();
    assert_eq!(messages(s.host()).last().unwrap(), "10.0.0.2:80");
}

#[test]
fn an_import_the_host_lacks_is_named_when_called_and_kills_the_vm() {
    let wasm = module(BROKEN);
    assert_eq!(wasm.missing_imports(), ["env.proxy_http_call"]);
    let mut host = wasm.instantiate().unwrap();
    let err = host
        .stream()
        .unwrap()
        .request_headers(&[], true)
        .unwrap_err();
    assert_eq!(
        err,
        HostError::MissingImport {
            import: "env.proxy_http_call".into(),
            callback: "proxy_on_request_headers".into()
        }
    );
    assert!(err.to_string().contains("env.proxy_http_call"), "{err}");
    assert!(matches!(host.stream(), Err(HostError::VmFailed(_))));
}

#[test]
fn a_trap_names_the_callback_and_carries_the_panic_message() {
    let mut host = module(BROKEN).instantiate().unwrap();
    let err = host
        .stream()
        .unwrap()
        .response_headers(&[], true)
        .unwrap_err();
    let HostError::Trap { callback, log, .. } = &err else {
        panic!("expected a trap, got {err}");
    };
    assert_eq!(callback, "proxy_on_response_headers");
    assert_eq!(log, &["panicked at filter.rs: boom"]);
    assert_eq!(host.failure(), Some(&err));
}

#[test]
fn an_endless_loop_runs_out_of_fuel() {
    let mut host = module(BROKEN).instantiate().unwrap();
    host.set_fuel_per_call(100_000);
    let err = host.stream().unwrap().finish().unwrap_err();
    assert!(err.to_string().contains("out of fuel"), "{err}");
}

#[test]
fn a_module_importing_memory_is_refused_with_its_name() {
    let bytes = wat::parse_str(r#"(module (import "env" "memory" (memory 1)))"#).unwrap();
    let err = Wasm::new(&bytes).err().expect("refused");
    assert!(err.to_string().contains("env.memory"), "{err}");
}

#[test]
fn garbage_is_a_compile_error() {
    assert!(matches!(
        Wasm::new(b"\0asm\x01\0\0\0garbage"),
        Err(HostError::Compile(_))
    ));
}

/// The empty filter (built from Rust with the proxy-wasm SDK) runs a whole
/// exchange without a hostcall on the request path, and every import it
/// declares but the host lacks is one the SDK only uses for callouts.
#[test]
fn empty_filter_passes_everything_through() {
    let path = empty_filter_wasm().unwrap_or_else(|e| panic!("{e}"));
    let wasm = Wasm::load(&path).unwrap();
    for m in wasm.missing_imports() {
        assert!(
            ["grpc", "http_call", "shared_queue", "get_status"]
                .iter()
                .any(|k| m.contains(k)),
            "the host should provide {m}"
        );
    }
    let mut host = wasm.instantiate().unwrap();
    assert!(host.configure("").unwrap());
    host.clear_call_counts();
    for _ in 0..3 {
        let mut s = host.stream().unwrap();
        assert_eq!(
            s.request_headers(&[(":path", "/"), ("cookie", "a=b")], true)
                .unwrap(),
            Action::Continue
        );
        assert_eq!(
            s.response_headers(&[(":status", "200")], true).unwrap(),
            Action::Continue
        );
        let rec = s.finish().unwrap();
        assert!(rec.ops.is_empty() && rec.local_response.is_none());
        assert_eq!(rec.request_header("cookie").as_deref(), Some("a=b"));
    }
    assert!(host.call_counts().is_empty(), "{:?}", host.call_counts());
    assert!(host.violations().is_empty(), "{:?}", host.violations());
    assert!(host.logs().is_empty(), "{}", host.log_text());
}

/// Asks for a 1 s timer and logs each tick; pauses every request and, in
/// the response callback, logs the status of reading a request header, then
/// resumes the request and logs the status again.
const TIMED: &str = concat!(
    r#"
(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_set_tick_period_milliseconds" (func $tick_period (param i32) (result i32)))
  (import "env" "proxy_get_header_map_value" (func $get_header (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_continue_stream" (func $continue (param i32) (result i32)))
"#,
    bump_allocator!(),
    r#"
  (data (i32.const 100) "tick")
  (data (i32.const 110) ":path")
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $tick_period (i32.const 1000)))
    (i32.const 1))
  (func (export "proxy_on_tick") (param i32)
    (drop (call $log (i32.const 2) (i32.const 100) (i32.const 4))))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (i32.const 1))
  (func $status_digit
    (i32.store8 (i32.const 200)
      (i32.add (i32.const 48)
        (call $get_header (i32.const 0) (i32.const 110) (i32.const 5) (i32.const 0) (i32.const 4))))
    (drop (call $log (i32.const 2) (i32.const 200) (i32.const 1))))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (call $status_digit)
    (drop (call $continue (i32.const 0)))
    (call $status_digit)
    (i32.const 0))
)
"#
);

#[test]
fn the_timer_fires_once_per_advance_of_at_least_a_period() {
    let mut host = module(TIMED).instantiate().unwrap();
    host.tick().unwrap();
    assert!(host.logs().is_empty(), "no timer before the plugin asks");
    assert!(host.configure("x").unwrap());
    assert_eq!(host.tick_period_ms(), 1000);
    host.advance(Duration::from_millis(999)).unwrap();
    assert!(host.logs().is_empty());
    host.advance(Duration::from_secs(1)).unwrap();
    assert_eq!(messages(&host), ["tick"]);
    // A long gap is one late tick, as with Envoy's timer.
    host.advance(Duration::from_secs(60)).unwrap();
    host.tick().unwrap();
    assert_eq!(messages(&host), ["tick", "tick", "tick"]);
}

#[test]
fn a_paused_request_keeps_its_headers_until_resumed() {
    let mut host = module(TIMED).instantiate().unwrap();
    let mut s = host.stream().unwrap();
    assert_eq!(
        s.request_headers(&[(":path", "/x")], true).unwrap(),
        Action::Pause
    );
    s.response_headers(&[], true).unwrap();
    // "0": readable while paused; "2" (BAD_ARGUMENT) once resumed.
    assert_eq!(messages(s.host()), ["0", "2"]);
    assert_eq!(s.record().continued, [0]);
}
