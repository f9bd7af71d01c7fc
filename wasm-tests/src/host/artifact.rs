//! Where the built `.wasm` files are. Tests never build them (cargo's build
//! lock would deadlock under `cargo test`); the project's test command does,
//! and a missing file is an error that says how to build it.

use std::path::PathBuf;
use std::sync::OnceLock;

use super::Wasm;

/// The workspace's `target/` (or `$CARGO_TARGET_DIR`).
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(|root| root.join("target"))
            .unwrap_or_else(|| PathBuf::from("target")),
    }
}

/// The `--profile wasm` build of `package` for `wasm32-wasip1`, or `$env`
/// when set; an error naming the build command when the file is missing.
pub fn wasm_artifact(package: &str, env: &str) -> Result<PathBuf, String> {
    let path = match std::env::var_os(env) {
        Some(p) => PathBuf::from(p),
        None => target_dir()
            .join("wasm32-wasip1")
            .join("wasm")
            .join(format!("{}.wasm", package.replace('-', "_"))),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found: build it with `cargo build -p {package} --target wasm32-wasip1 --profile wasm` \
             (or point {env} at a built .wasm)",
            path.display()
        ))
    }
}

/// The tether plugin (`TETHER_PLUGIN_WASM` overrides).
pub fn plugin_wasm() -> Result<PathBuf, String> {
    wasm_artifact("tether-plugin", "TETHER_PLUGIN_WASM")
}

/// The tether plugin, compiled once per test process and shared by its
/// tests; panics with the build command when the file is missing.
pub fn loaded_plugin() -> &'static Wasm {
    static WASM: OnceLock<Result<Wasm, String>> = OnceLock::new();
    let loaded = WASM.get_or_init(|| {
        let path = plugin_wasm()?;
        Wasm::load(&path).map_err(|e| e.to_string())
    });
    match loaded {
        Ok(w) => w,
        Err(e) => panic!("{e}"),
    }
}

/// The empty filter (`TETHER_EMPTY_FILTER_WASM` overrides).
pub fn empty_filter_wasm() -> Result<PathBuf, String> {
    wasm_artifact("tether-empty-filter", "TETHER_EMPTY_FILTER_WASM")
}
