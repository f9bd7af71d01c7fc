//! A small in-process proxy-wasm host on `wasmi`, for unit-level tests of a
//! built plugin without Envoy.
//!
//! It loads a `.wasm`, provides the proxy-wasm ABI v0.2.1 hostcalls and the
//! WASI basics a `wasm32-wasip1` build imports, and drives the callbacks
//! Envoy drives for an HTTP filter:
//!
//! ```text
//! Wasm::load ─ instantiate ─ configure(json) ─┬─ stream() ─ request_headers ─ response_headers ─ finish
//!  (compile)   (_initialize)  (vm_start,      └─ stream() ─ ...
//!                              on_configure)
//! ```
//!
//! Tests script what Envoy would provide (headers, properties such as
//! `upstream.address` or `response.code`, the clock, whose moves fire the
//! plugin's timer) and read back what the plugin did: headers as it left
//! them and every change, a local response, log lines, properties it set,
//! how many hostcalls it made and how much fuel (about one unit per wasm
//! instruction) each callback used. Where the ABI leaves room, the host behaves
//! as Envoy 1.40 does (see `imports.rs`). In particular request headers can
//! only be read in the request callback (or while the plugin keeps the
//! request paused, as the ABI says): a plugin reading them in the response
//! callback gets `BAD_ARGUMENT`, which the Rust SDK turns into a panic, as in
//! Envoy.
//!
//! Failures are explicit. A trap (a panic in the plugin, which in Envoy
//! takes the VM down for the worker) is [`HostError::Trap`] and kills this
//! VM too: every later call fails with [`HostError::VmFailed`]. An import
//! the host does not provide is linked to a stub, so a module that merely
//! declares it still loads ([`Wasm::missing_imports`] lists them), and a
//! call to it is [`HostError::MissingImport`] naming it. Each callback runs
//! on a fuel budget, so an endless loop is a trap, not a hung test.

/// Defines the host function `$module.$name` in `$linker` as the closure
/// given, which returns `Result<i32, Error>` unless it names another type,
/// and adds `$name` to `$names`. Every call is first counted under `$name`,
/// so `Host::call_counts` covers every import alike.
macro_rules! define_import {
    ($linker:ident, $names:ident, $module:expr, $name:literal,
     |mut $c:ident: $cty:ty $(, $arg:ident: $ty:ty)* $(,)?| -> $ret:ty $body:block) => {{
        $linker
            .func_wrap($module, $name, |mut $c: $cty $(, $arg: $ty)*| -> $ret {
                $c.data_mut().count($name);
                $body
            })
            .map_err(|e| wasmi::Error::new(format!("defining {}.{}: {e}", $module, $name)))?;
        $names.push($name);
    }};
    ($linker:ident, $names:ident, $module:expr, $name:literal,
     |mut $c:ident: $cty:ty $(, $arg:ident: $ty:ty)* $(,)?| $body:block) => {
        define_import!($linker, $names, $module, $name,
            |mut $c: $cty $(, $arg: $ty)*| -> Result<i32, wasmi::Error> $body)
    };
}

mod abi;
mod artifact;
mod guest;
mod imports;
mod state;
mod wasi;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmi::{
    Config, Engine, Error, ExternType, Func, Instance, Linker, Module, Store, TrapCode, Val,
};

pub use abi::{Action, LogLevel, MapType, Pairs};
pub use artifact::{empty_filter_wasm, loaded_plugin, plugin_wasm, wasm_artifact};
pub use state::{ForeignCall, HeaderOp, LocalResponse, LogLine, Metric, OpKind, StreamRecord};

use state::{Phase, State};

/// Fuel (roughly, wasm instructions) one callback may use by default.
pub const DEFAULT_FUEL_PER_CALL: u64 = 400_000_000;

/// Why the host could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    /// The `.wasm` file could not be read.
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        error: String,
    },
    /// The module is not valid WebAssembly (or uses a feature `wasmi` lacks).
    Compile(String),
    /// The module cannot be linked or instantiated.
    Link(String),
    /// The plugin trapped (a panic, `unreachable`, out of bounds, out of fuel).
    Trap {
        /// The callback that was running.
        callback: String,
        /// The trap.
        message: String,
        /// Error-level lines the plugin wrote during that callback (a Rust
        /// panic message arrives this way).
        log: Vec<String>,
    },
    /// The plugin called an import this host does not provide.
    MissingImport {
        /// `module.name` of the import.
        import: String,
        /// The callback that was running.
        callback: String,
    },
    /// A callback has a signature the ABI does not define.
    Abi(String),
    /// An earlier failure killed the VM (as Envoy's would be).
    VmFailed(Box<HostError>),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Read { path, error } => write!(f, "reading {path}: {error}"),
            HostError::Compile(e) => write!(f, "compiling the module: {e}"),
            HostError::Link(e) => write!(f, "linking the module: {e}"),
            HostError::Trap {
                callback,
                message,
                log,
            } => {
                write!(f, "the plugin trapped in {callback}: {message}")?;
                for line in log {
                    write!(f, "\n  plugin error log: {line}")?;
                }
                Ok(())
            }
            HostError::MissingImport { import, callback } => write!(
                f,
                "the plugin called {import} in {callback}, which this host does not provide"
            ),
            HostError::Abi(e) => write!(f, "ABI violation: {e}"),
            HostError::VmFailed(first) => {
                write!(f, "the VM is dead after an earlier failure: {first}")
            }
        }
    }
}

impl std::error::Error for HostError {}

/// A compiled module, linked against the host; instantiate it as often as
/// needed (each [`Host`] is a fresh VM).
pub struct Wasm {
    engine: Engine,
    module: Module,
    linker: Linker<State>,
    imports: Vec<String>,
    missing: Vec<String>,
}

impl Wasm {
    /// Reads and compiles the module at `path`.
    pub fn load(path: &Path) -> Result<Wasm, HostError> {
        let bytes = std::fs::read(path).map_err(|e| HostError::Read {
            path: path.display().to_string(),
            error: e.to_string(),
        })?;
        Wasm::new(&bytes)
    }

    /// Compiles `bytes` (binary WebAssembly).
    pub fn new(bytes: &[u8]) -> Result<Wasm, HostError> {
        let mut config = Config::default();
        config.consume_fuel(true);
        let engine = Engine::new(&config);
        let module = Module::new(&engine, bytes).map_err(|e| HostError::Compile(e.to_string()))?;
        let mut linker = Linker::<State>::new(&engine);
        let provided = link_all(&mut linker).map_err(|e| HostError::Link(e.to_string()))?;
        let mut imports = Vec::new();
        let mut missing = Vec::new();
        for import in module.imports() {
            let full = format!("{}.{}", import.module(), import.name());
            imports.push(full.clone());
            let ExternType::Func(ty) = import.ty() else {
                return Err(HostError::Link(format!(
                    "the module imports {full}, which is not a function; the host provides only functions"
                )));
            };
            if provided
                .iter()
                .any(|(m, n)| *m == import.module() && *n == import.name())
            {
                continue;
            }
            missing.push(full.clone());
            let name = full.clone();
            linker
                .func_new(
                    import.module(),
                    import.name(),
                    ty.clone(),
                    move |mut caller, _params, _results| {
                        caller.data_mut().missing_called = Some(name.clone());
                        Err(Error::new(format!("{name} is not provided by this host")))
                    },
                )
                .map_err(|e| HostError::Link(format!("stub for {full}: {e}")))?;
        }
        Ok(Wasm {
            engine,
            module,
            linker,
            imports,
            missing,
        })
    }

    /// Every import of the module, as `module.name`.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// Imports the module declares that the host does not provide (calling
    /// one is a [`HostError::MissingImport`]).
    pub fn missing_imports(&self) -> &[String] {
        &self.missing
    }

    /// Names of the module's exports.
    pub fn exports(&self) -> Vec<String> {
        self.module
            .exports()
            .map(|e| e.name().to_string())
            .collect()
    }

    /// A fresh VM: instantiates the module and runs its initialisers
    /// (`_initialize`, then `main` if exported; or `_start`).
    pub fn instantiate(&self) -> Result<Host, HostError> {
        let mut state = State::new();
        state.now_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        state.monotonic_nanos = 1_000_000_000;
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        // A module's own start function runs during instantiation.
        let _ = store.set_fuel(DEFAULT_FUEL_PER_CALL);
        let instance = self
            .linker
            .instantiate_and_start(&mut store, &self.module)
            .map_err(|e| HostError::Link(e.to_string()))?;
        let mut host = Host {
            store,
            instance,
            root_id: 1,
            next_id: 2,
            vm_started: false,
            failed: None,
            fuel_per_call: DEFAULT_FUEL_PER_CALL,
            last_fuel: 0,
        };
        if host.export("_initialize").is_some() {
            host.call("_initialize", 0, Phase::Init, &[])?;
            if host.export("main").is_some() {
                host.call("main", 0, Phase::Init, &[0, 0])?;
            }
        } else if host.export("_start").is_some() {
            host.call("_start", 0, Phase::Init, &[])?;
        }
        Ok(host)
    }
}

/// Registers every host function; returns their `(module, name)`.
fn link_all(linker: &mut Linker<State>) -> Result<Vec<(&'static str, &'static str)>, Error> {
    let mut names: Vec<(&'static str, &'static str)> = imports::link(linker)?
        .into_iter()
        .map(|n| ("env", n))
        .collect();
    names.extend(
        wasi::link(linker)?
            .into_iter()
            .map(|n| ("wasi_snapshot_preview1", n)),
    );
    Ok(names)
}

/// One VM running the plugin, with its root context.
pub struct Host {
    store: Store<State>,
    instance: Instance,
    root_id: u32,
    next_id: u32,
    vm_started: bool,
    failed: Option<HostError>,
    fuel_per_call: u64,
    last_fuel: u64,
}

impl Host {
    fn state(&self) -> &State {
        self.store.data()
    }

    fn state_mut(&mut self) -> &mut State {
        self.store.data_mut()
    }

    fn export(&self, name: &str) -> Option<Func> {
        self.instance.get_func(&self.store, name)
    }

    /// Calls export `name` (if the plugin has it) for context `ctx`; returns
    /// its i32 result, if it has one.
    fn call(
        &mut self,
        name: &str,
        ctx: u32,
        phase: Phase,
        args: &[i32],
    ) -> Result<Option<i32>, HostError> {
        if let Some(first) = &self.failed {
            return Err(HostError::VmFailed(Box::new(first.clone())));
        }
        let Some(func) = self.export(name) else {
            return Ok(None);
        };
        let ty = func.ty(&self.store);
        let params_ok = ty.params().len() == args.len()
            && ty.params().iter().all(|t| *t == wasmi::ValType::I32);
        let results_ok =
            ty.results().len() <= 1 && ty.results().iter().all(|t| *t == wasmi::ValType::I32);
        if !params_ok || !results_ok {
            return Err(HostError::Abi(format!(
                "export {name} has type {ty:?}; expected {} i32 parameters and at most one i32 result",
                args.len()
            )));
        }
        let params: Vec<Val> = args.iter().map(|a| Val::I32(*a)).collect();
        let mut results = vec![Val::I32(0); ty.results().len()];
        let log_mark = self.state().logs.len();
        {
            let st = self.state_mut();
            st.phase = phase;
            st.active = ctx;
            st.effective = 0;
            st.missing_called = None;
        }
        // Fuel bounds the callback: an endless loop traps instead of hanging.
        let _ = self.store.set_fuel(self.fuel_per_call);
        let outcome = func.call(&mut self.store, &params, &mut results);
        self.last_fuel = self
            .fuel_per_call
            .saturating_sub(self.store.get_fuel().unwrap_or(0));
        {
            let st = self.state_mut();
            st.phase = Phase::Idle;
            st.active = 0;
            st.effective = 0;
        }
        match outcome {
            Ok(()) => Ok(results.first().and_then(Val::i32)),
            Err(e) => {
                let err = self.classify(name, log_mark, &e);
                self.failed = Some(err.clone());
                Err(err)
            }
        }
    }

    fn classify(&mut self, callback: &str, log_mark: usize, e: &Error) -> HostError {
        let callback = callback.to_string();
        if let Some(import) = self.state_mut().missing_called.take() {
            return HostError::MissingImport { import, callback };
        }
        let log = self.state().logs[log_mark.min(self.state().logs.len())..]
            .iter()
            .filter(|l| l.level >= LogLevel::Error)
            .map(|l| l.message.clone())
            .collect();
        let message = if let Some(code) = e.i32_exit_status() {
            format!("the plugin called proc_exit({code})")
        } else if e.as_trap_code() == Some(TrapCode::OutOfFuel) {
            format!(
                "out of fuel after {} units: an endless loop?",
                self.fuel_per_call
            )
        } else {
            e.to_string()
        };
        HostError::Trap {
            callback,
            message,
            log,
        }
    }

    /// Sets the wall clock (epoch time) the plugin reads. A plugin that
    /// reads the clock from its timer sees it after the next [`Host::tick`].
    pub fn set_time(&mut self, since_epoch: Duration) {
        self.state_mut().now_nanos = since_epoch.as_nanos() as u64;
    }

    /// Sets the wall clock to `secs` seconds after the epoch (see
    /// [`Host::set_time`]).
    pub fn set_epoch_seconds(&mut self, secs: u64) {
        self.set_time(Duration::from_secs(secs));
    }

    /// Moves both clocks forward; when the plugin asked for a timer and at
    /// least one period passed, its `proxy_on_tick` runs once (Envoy's timer
    /// fires once, late, when the worker was busy longer than a period).
    pub fn advance(&mut self, by: Duration) -> Result<(), HostError> {
        let n = by.as_nanos() as u64;
        let st = self.state_mut();
        st.now_nanos = st.now_nanos.saturating_add(n);
        st.monotonic_nanos = st.monotonic_nanos.saturating_add(n);
        let period = u64::from(self.tick_period_ms()) * 1_000_000;
        if period > 0 && n >= period {
            self.tick()?;
        }
        Ok(())
    }

    /// Fires the plugin's timer now: `proxy_on_tick` on the root context
    /// (nothing when the plugin never asked for one).
    pub fn tick(&mut self) -> Result<(), HostError> {
        if self.tick_period_ms() == 0 {
            return Ok(());
        }
        let root = self.root_id;
        self.call("proxy_on_tick", root, Phase::Lifecycle, &[root as i32])?;
        Ok(())
    }

    /// Sets a property every context sees (a stream can override it), e.g.
    /// `set_property(&["xds", "cluster_name"], "backends")`.
    pub fn set_property(&mut self, path: &[&str], value: impl Into<Vec<u8>>) {
        let key = path.join("\0").into_bytes();
        self.state_mut().properties.insert(key, value.into());
    }

    /// The log level `proxy_get_log_level` reports (default: trace).
    pub fn set_log_level(&mut self, level: LogLevel) {
        self.state_mut().log_level = level;
    }

    /// The environment WASI `environ_get` returns (default: empty, as Envoy
    /// exposes none unless configured).
    pub fn set_env(&mut self, env: &[(&str, &str)]) {
        self.state_mut().env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// Seeds `random_get`.
    pub fn set_seed(&mut self, seed: u64) {
        self.state_mut().rng = seed;
    }

    /// Fuel per callback (default [`DEFAULT_FUEL_PER_CALL`]).
    pub fn set_fuel_per_call(&mut self, fuel: u64) {
        self.fuel_per_call = fuel;
    }

    /// Fuel (about one unit per wasm instruction) the last callback used: a
    /// deterministic measure of the plugin's work, independent of the
    /// machine.
    pub fn last_fuel_used(&self) -> u64 {
        self.last_fuel
    }

    /// Makes foreign function `name` known; calls return `result`.
    pub fn register_foreign_function(&mut self, name: &str, result: &[u8]) {
        self.state_mut()
            .foreign_functions
            .insert(name.to_string(), result.to_vec());
    }

    /// Creates the root context and calls `proxy_on_vm_start` with
    /// `vm_config`; returns what the plugin answered (true when it does not
    /// export the callback).
    pub fn start_vm(&mut self, vm_config: &str) -> Result<bool, HostError> {
        let root = self.root_id;
        self.state_mut().root_id = root;
        self.state_mut().vm_config = vm_config.as_bytes().to_vec();
        self.call(
            "proxy_on_context_create",
            root,
            Phase::Lifecycle,
            &[root as i32, 0],
        )?;
        self.vm_started = true;
        let ok = self.call(
            "proxy_on_vm_start",
            root,
            Phase::VmStart,
            &[root as i32, vm_config.len() as i32],
        )?;
        Ok(ok.is_none_or(|r| r != 0))
    }

    /// Calls `proxy_on_configure` with `config` (the filter's
    /// `configuration` string), starting the VM first if needed; returns
    /// whether the plugin accepted it (Envoy refuses to start on false).
    pub fn configure(&mut self, config: &str) -> Result<bool, HostError> {
        self.configure_bytes(config.as_bytes())
    }

    /// [`Host::configure`] with arbitrary bytes (Envoy passes the string's
    /// bytes as they are).
    pub fn configure_bytes(&mut self, config: &[u8]) -> Result<bool, HostError> {
        if !self.vm_started && !self.start_vm("")? {
            return Ok(false);
        }
        let root = self.root_id;
        self.state_mut().plugin_config = config.to_vec();
        let ok = self.call(
            "proxy_on_configure",
            root,
            Phase::Configure,
            &[root as i32, config.len() as i32],
        )?;
        Ok(ok.is_none_or(|r| r != 0))
    }

    /// Opens an HTTP stream: a new context under the root context.
    pub fn stream(&mut self) -> Result<Stream<'_>, HostError> {
        if !self.vm_started {
            self.start_vm("")?;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(2);
        self.state_mut().streams.insert(
            id,
            StreamRecord {
                context_id: id,
                ..StreamRecord::default()
            },
        );
        let root = self.root_id;
        self.call(
            "proxy_on_context_create",
            id,
            Phase::Lifecycle,
            &[id as i32, root as i32],
        )?;
        Ok(Stream { host: self, id })
    }

    /// Every log line so far.
    pub fn logs(&self) -> &[LogLine] {
        &self.state().logs
    }

    /// The log as text, one `level: message` per line.
    pub fn log_text(&self) -> String {
        self.state()
            .logs
            .iter()
            .map(|l| format!("{}: {}\n", l.level, l.message))
            .collect()
    }

    /// Forgets the log lines so far.
    pub fn clear_logs(&mut self) {
        self.state_mut().logs.clear();
    }

    /// ABI misuse seen so far: header names or values Envoy would not put on
    /// the wire, malformed maps, impossible statuses.
    pub fn violations(&self) -> &[String] {
        &self.state().violations
    }

    /// The failure that killed this VM, if any.
    pub fn failure(&self) -> Option<&HostError> {
        self.failed.as_ref()
    }

    /// How often each hostcall was made (every hostcall costs in Envoy).
    pub fn call_counts(&self) -> &BTreeMap<&'static str, u64> {
        &self.state().calls
    }

    /// Forgets the hostcall counts.
    pub fn clear_call_counts(&mut self) {
        self.state_mut().calls.clear();
    }

    /// Metrics the plugin defined.
    pub fn metrics(&self) -> &[Metric] {
        &self.state().metrics
    }

    /// Foreign function calls the plugin made.
    pub fn foreign_calls(&self) -> &[ForeignCall] {
        &self.state().foreign_calls
    }

    /// The tick period the plugin asked for (0: none).
    pub fn tick_period_ms(&self) -> u32 {
        self.state().tick_period_ms
    }

    /// Properties as the root context sees them (host-wide), path segments
    /// joined by '.'.
    pub fn properties(&self) -> Vec<(String, Vec<u8>)> {
        self.state()
            .properties
            .iter()
            .map(|(k, v)| (abi::path_display(k), v.clone()))
            .collect()
    }
}

/// One HTTP request/response exchange through the plugin.
pub struct Stream<'h> {
    host: &'h mut Host,
    id: u32,
}

impl Stream<'_> {
    /// The stream's context id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The host, e.g. to read its log.
    pub fn host(&self) -> &Host {
        self.host
    }

    /// The host, e.g. to move its clock.
    pub fn host_mut(&mut self) -> &mut Host {
        self.host
    }

    fn record_mut(&mut self) -> &mut StreamRecord {
        self.host.state_mut().streams.entry(self.id).or_default()
    }

    /// What the plugin did so far on this stream.
    pub fn record(&self) -> &StreamRecord {
        // The entry exists from `Host::stream` until `finish` consumes it.
        static EMPTY: std::sync::OnceLock<StreamRecord> = std::sync::OnceLock::new();
        self.host
            .state()
            .streams
            .get(&self.id)
            .unwrap_or_else(|| EMPTY.get_or_init(StreamRecord::default))
    }

    /// Sets a property for this stream only, e.g. `upstream.address`
    /// (`&["upstream", "address"]`, bytes `127.0.0.1:8080`).
    pub fn set_property(&mut self, path: &[&str], value: impl Into<Vec<u8>>) {
        let key = path.join("\0").into_bytes();
        self.record_mut().properties.insert(key, value.into());
    }

    /// Sets `response.code` as Envoy gives it: an 8-byte little-endian integer.
    pub fn set_response_code(&mut self, code: u16) {
        self.set_property(&["response", "code"], (code as u64).to_le_bytes().to_vec());
    }

    /// Sets `upstream.address` (`ip:port` text).
    pub fn set_upstream_address(&mut self, addr: &str) {
        self.set_property(&["upstream", "address"], addr.as_bytes().to_vec());
    }

    /// Calls `proxy_on_request_headers` with `headers` (names are stored
    /// lowercase, as Envoy does).
    pub fn request_headers(
        &mut self,
        headers: &[(&str, &str)],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        self.request_headers_bytes(&as_bytes(headers), end_of_stream)
    }

    /// [`Stream::request_headers`] with arbitrary bytes (Envoy passes
    /// obs-text bytes 0x80-0xFF through in values).
    pub fn request_headers_bytes(
        &mut self,
        headers: &[(&[u8], &[u8])],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        self.headers_callback(true, headers, end_of_stream)
    }

    /// Calls `proxy_on_response_headers` with `headers`.
    pub fn response_headers(
        &mut self,
        headers: &[(&str, &str)],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        self.response_headers_bytes(&as_bytes(headers), end_of_stream)
    }

    /// [`Stream::response_headers`] with arbitrary bytes.
    pub fn response_headers_bytes(
        &mut self,
        headers: &[(&[u8], &[u8])],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        self.headers_callback(false, headers, end_of_stream)
    }

    /// Stores the request's (or the response's) `headers` in the record,
    /// calls the plugin's headers callback for that side and records
    /// whether it paused the stream.
    fn headers_callback(
        &mut self,
        request: bool,
        headers: &[(&[u8], &[u8])],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        let pairs: Pairs = headers
            .iter()
            .map(|(k, v)| (state::lower(k), v.to_vec()))
            .collect();
        let n = pairs.len() as i32;
        let rec = self.record_mut();
        let (callback, phase) = if request {
            rec.request_headers = pairs;
            rec.request_seen = true;
            ("proxy_on_request_headers", Phase::RequestHeaders)
        } else {
            rec.response_headers = pairs;
            rec.response_seen = true;
            ("proxy_on_response_headers", Phase::ResponseHeaders)
        };
        let r = self.host.call(
            callback,
            self.id,
            phase,
            &[self.id as i32, n, end_of_stream as i32],
        )?;
        let action = r.map_or(Action::Continue, Action::from_abi);
        let paused = action == Action::Pause;
        let rec = self.record_mut();
        if request {
            rec.request_paused = paused;
        } else {
            rec.response_paused = paused;
        }
        Ok(action)
    }

    /// Ends the stream as Envoy does: `proxy_on_done`, then (unless the
    /// plugin deferred with false) `proxy_on_log` and `proxy_on_delete`;
    /// returns the stream's record.
    pub fn finish(mut self) -> Result<StreamRecord, HostError> {
        let id = self.id as i32;
        let done = self
            .host
            .call("proxy_on_done", self.id, Phase::Lifecycle, &[id])?;
        if done == Some(0) {
            self.record_mut().pending_done = true;
        } else {
            self.record_mut().request_paused = false;
            self.record_mut().response_paused = false;
            self.host.call("proxy_on_log", self.id, Phase::Log, &[id])?;
            self.host
                .call("proxy_on_delete", self.id, Phase::Lifecycle, &[id])?;
        }
        Ok(self
            .host
            .state_mut()
            .streams
            .remove(&self.id)
            .unwrap_or_default())
    }
}

/// Text headers as the byte pairs the `*_bytes` calls take.
fn as_bytes<'a>(headers: &[(&'a str, &'a str)]) -> Vec<(&'a [u8], &'a [u8])> {
    headers
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect()
}

#[cfg(test)]
mod tests;
