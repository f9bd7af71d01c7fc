//! gRPC C-core's OpenTelemetry plugin as a test peer: PyPI
//! `grpcio-observability` with the OpenTelemetry SDK's in-memory reader,
//! running `testkit/peers/grpc_otel_client.py` against a bootstrap file.
//! It has a virtual environment of its own (`target/tmp/py-grpcio-otel`):
//! grpcio-observability pins the grpcio release it goes with.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The grpcio and grpcio-observability release installed.
pub const VERSION: &str = "1.85.0";
/// The OpenTelemetry SDK release installed beside them.
pub const OTEL_SDK_VERSION: &str = "1.45.2";

/// The longest a run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The environment's Python, made (pip, three attempts) the first time.
/// Calls in one process wait for each other.
pub async fn python() -> Result<PathBuf, String> {
    static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _creating = CREATING.lock().await;
    let venv = crate::grpcio::kit_venv("py-grpcio-otel");
    let py = venv.join("bin/python");
    if crate::grpcio::imports(&py, "grpc, grpc_observability, opentelemetry.sdk").await {
        return Ok(py);
    }
    crate::grpcio::make_venv(
        &venv,
        &[
            format!("grpcio=={VERSION}"),
            format!("grpcio-observability=={VERSION}"),
            format!("opentelemetry-sdk=={OTEL_SDK_VERSION}"),
        ],
    )
    .await?;
    Ok(py)
}

/// Runs the client on `target` with `bootstrap`, making the calls `steps`
/// says (`CASE:FAIL_UNTIL:COUNT`, see the script); its JSON output:
/// `{"calls": [[case, code]...], "metrics": [...]}`.
pub async fn run(
    python: &Path,
    bootstrap: &Path,
    target: &str,
    steps: &[String],
) -> Result<serde_json::Value, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/grpc_otel_client.py");
    let out = tokio::time::timeout(
        RUN_TIMEOUT,
        crate::command(python)
            .arg(&script)
            .arg(target)
            .args(steps)
            .env("GRPC_XDS_BOOTSTRAP", bootstrap)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("grpc_otel_client.py did not finish within {RUN_TIMEOUT:?}"))?
    .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "grpc_otel_client.py: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "grpc_otel_client.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
