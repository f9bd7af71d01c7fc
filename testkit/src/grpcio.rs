//! gRPC C-core as a test peer: PyPI `grpcio` running the xDS client of
//! `testkit/peers/grpc_xds_client.py` against a bootstrap file, one
//! process per batch of calls.
//!
//! The client calls `tether.demo.v1.Echo/Echo` on an `xds:///` target and
//! prints one JSON line per call (the backend that answered and the
//! `set-cookie` of the response's initial metadata), read here as [`Call`]s.
//!
//! A Python with grpcio is found by [`find_python`] (`$TETHER_PYTHON`,
//! `python3`, then the kit's virtual environment) or made by
//! [`python_or_install`], which installs grpcio [`VERSION`] into that
//! virtual environment once.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The grpcio release [`python_or_install`] installs.
pub const VERSION: &str = "1.85.1";
/// The grpcio-csds release installed beside it (its CSDS service).
pub const CSDS_VERSION: &str = "1.85.0";

/// The longest a batch of calls may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The C-core xDS client script.
pub fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/grpc_xds_client.py")
}

/// The kit's virtual environment under the workspace's target directory
/// (`target/tmp/py-grpcio`), unless `venv` names another.
fn venv_dir(venv: Option<&Path>) -> PathBuf {
    match venv {
        Some(v) => v.to_path_buf(),
        None => kit_venv("py-grpcio"),
    }
}

/// A virtual environment of the kit's, `target/tmp/NAME` in the workspace.
pub(crate) fn kit_venv(name: &str) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .unwrap_or(manifest)
        .join("target/tmp")
        .join(name)
}

async fn imports_grpc(py: &Path) -> bool {
    imports(py, "grpc, grpc_csds").await
}

/// Whether `py` runs and imports `modules` (`import MODULES`).
pub(crate) async fn imports(py: &Path, modules: &str) -> bool {
    crate::command(py)
        .args(["-c", &format!("import {modules}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// A Python that imports grpc and grpc_csds: `$TETHER_PYTHON`, `python3`, or the
/// virtual environment `venv` (default `target/tmp/py-grpcio`, where
/// [`python_or_install`] puts it). `None` when there is none.
pub async fn find_python(venv: Option<&Path>) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("TETHER_PYTHON") {
        candidates.push(p.into());
    }
    candidates.push("python3".into());
    candidates.push(venv_dir(venv).join("bin/python"));
    for py in candidates {
        if imports_grpc(&py).await {
            return Some(py);
        }
    }
    None
}

/// [`find_python`], or else a virtual environment made at `venv` (default
/// `target/tmp/py-grpcio`) with grpcio [`VERSION`] installed by pip (three
/// attempts, so one network hiccup does not fail a suite). Calls in one
/// process wait for each other; the environment is reused afterwards.
pub async fn python_or_install(venv: Option<&Path>) -> Result<PathBuf, String> {
    static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _creating = CREATING.lock().await;
    if let Some(py) = find_python(venv).await {
        return Ok(py);
    }
    let venv = venv_dir(venv);
    make_venv(
        &venv,
        &[
            format!("grpcio=={VERSION}"),
            format!("grpcio-csds=={CSDS_VERSION}"),
        ],
    )
    .await?;
    Ok(venv.join("bin/python"))
}

/// Makes a virtual environment at `venv` with `packages` installed by pip
/// (three attempts, so one network hiccup does not fail a suite).
pub async fn make_venv(venv: &Path, packages: &[String]) -> Result<(), String> {
    let py = venv.join("bin/python");
    let made = crate::command("python3")
        .args(["-m", "venv"])
        .arg(venv)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("python3 -m venv: {e}"))?;
    if !made.status.success() {
        return Err(format!(
            "python3 -m venv {} failed: {}",
            venv.display(),
            String::from_utf8_lossy(&made.stderr).trim()
        ));
    }
    let mut failures = Vec::new();
    for attempt in 1..=3 {
        let out = tokio::time::timeout(
            Duration::from_secs(300),
            crate::command(&py)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(packages)
                .stdin(Stdio::null())
                .output(),
        )
        .await;
        match out {
            Ok(Ok(out)) if out.status.success() => return Ok(()),
            Ok(Ok(out)) => failures.push(String::from_utf8_lossy(&out.stderr).into_owned()),
            Ok(Err(e)) => failures.push(format!("cannot run pip: {e}")),
            Err(_) => failures.push("pip did not finish within 5 minutes".to_owned()),
        }
        tokio::time::sleep(Duration::from_secs(5 * attempt)).await;
    }
    Err(format!(
        "pip install {} failed 3 times: {failures:#?}",
        packages.join(" ")
    ))
}

/// One call the C-core client made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The key sent (calls made with [`Client::keys`]).
    pub key: Option<String>,
    /// The backend that answered (the Echo reply's `backend`).
    pub backend: String,
    /// Its address (the Echo reply's `address`).
    pub address: String,
    /// Every `set-cookie` of the response's initial metadata.
    pub set_cookie: Vec<String>,
    /// The call's status code name: `"OK"` for an answered call, else e.g.
    /// `"UNAVAILABLE"` (failed calls are only listed by runs that go on
    /// after a failure, such as [`Client::calls_paced`]).
    pub code: String,
    /// A failed call's status message (empty for an answered call).
    pub message: String,
    /// The client certificate's fingerprint the TLS test backends saw
    /// (runs with `--xds-creds`), if any.
    pub client_cert: Option<String>,
    /// How long the call took, in milliseconds.
    pub ms: u64,
}

impl Call {
    /// Whether the call was answered (status OK).
    pub fn ok(&self) -> bool {
        self.code == "OK"
    }
}

/// The C-core client with a Python and a bootstrap file.
#[derive(Debug, Clone)]
pub struct Client {
    python: PathBuf,
    bootstrap: PathBuf,
    env: Vec<(String, String)>,
}

impl Client {
    /// A client run by `python` (with grpcio) reading the xDS bootstrap at
    /// `bootstrap`.
    pub fn new(python: impl Into<PathBuf>, bootstrap: impl Into<PathBuf>) -> Client {
        Client {
            python: python.into(),
            bootstrap: bootstrap.into(),
            env: Vec::new(),
        }
    }

    /// The client with the environment variable `key` set to `value` (e.g.
    /// one of C-core's `GRPC_EXPERIMENTAL_*` switches).
    pub fn with_env(mut self, key: &str, value: &str) -> Client {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The Python it runs.
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// `calls` calls to `target`, each with the `cookie` metadata when given.
    pub async fn calls(
        &self,
        target: &str,
        calls: usize,
        cookie: Option<&str>,
    ) -> Result<Vec<Call>, String> {
        self.calls_warmed(target, 0, calls, cookie).await
    }

    /// As [`Client::calls`], after unprinted calls without a cookie until
    /// `warm` distinct backends have answered: C-core's round robin only
    /// picks connected subchannels, so a spread is only meaningful once all
    /// have connected.
    pub async fn calls_warmed(
        &self,
        target: &str,
        warm: usize,
        calls: usize,
        cookie: Option<&str>,
    ) -> Result<Vec<Call>, String> {
        let mut args = Vec::new();
        if warm > 0 {
            args.extend(["--warm".to_owned(), warm.to_string()]);
        }
        args.extend([target.to_owned(), calls.to_string()]);
        args.extend(cookie.map(str::to_owned));
        self.run(&args, None).await
    }

    /// `calls` calls to `target` without a cookie from `concurrency` threads
    /// at once over one channel (each thread calls again when its call
    /// answers), after warming up to `warm` distinct backends as
    /// [`Client::calls_warmed`] does. The calls come in the order they ended.
    pub async fn calls_concurrently(
        &self,
        target: &str,
        warm: usize,
        calls: usize,
        concurrency: usize,
    ) -> Result<Vec<Call>, String> {
        let mut args = vec!["--concurrency".to_owned(), concurrency.max(1).to_string()];
        if warm > 0 {
            args.extend(["--warm".to_owned(), warm.to_string()]);
        }
        args.extend([target.to_owned(), calls.to_string()]);
        self.run(&args, None).await
    }

    /// `calls` calls to `target` one after another without a cookie,
    /// waiting `pace` after each; failed calls are listed too (with their
    /// [`Call::code`] and [`Call::message`]) instead of ending the run, so
    /// a test can count which calls failed over time.
    pub async fn calls_paced(
        &self,
        target: &str,
        calls: usize,
        pace: Duration,
    ) -> Result<Vec<Call>, String> {
        let args = [
            "--failures-ok".to_owned(),
            "--pace".to_owned(),
            pace.as_millis().to_string(),
            target.to_owned(),
            calls.to_string(),
        ];
        self.run(&args, None).await
    }

    /// One call to `target` per key, each with the metadata `header: key`.
    pub async fn keys(
        &self,
        target: &str,
        header: &str,
        keys: &[String],
    ) -> Result<Vec<Call>, String> {
        let args = [
            "--keys-header".to_owned(),
            header.to_owned(),
            target.to_owned(),
            "0".to_owned(),
        ];
        let mut stdin = keys.join("\n");
        stdin.push('\n');
        self.run(&args, Some(&stdin)).await
    }

    /// Runs the client with `args` (its usage is in the script) and `stdin`;
    /// one [`Call`] per line it printed.
    pub async fn run(&self, args: &[String], stdin: Option<&str>) -> Result<Vec<Call>, String> {
        let mut child = crate::command(&self.python)
            .arg(client_script())
            .args(args)
            .env("GRPC_XDS_BOOTSTRAP", &self.bootstrap)
            .env_remove("GRPC_XDS_BOOTSTRAP_CONFIG")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("run {}: {e}", self.python.display()))?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(stdin.unwrap_or_default().as_bytes())
                .await
                .map_err(|e| format!("the C-core client's stdin: {e}"))?;
        }
        let out = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| format!("the C-core client did not finish within {RUN_TIMEOUT:?}"))?
            .map_err(|e| format!("the C-core client: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "the C-core client failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(parse_call)
            .collect()
    }
}

impl Client {
    /// The client on `target` making calls in batches ([`Batches::run`])
    /// over one channel, kept open (its LRS stream too) until
    /// [`Batches::finish`], waiting `pace` after each call; failed calls
    /// are listed, not the end of a run.
    pub fn batches(&self, target: &str, pace: Duration) -> Result<Batches, String> {
        let mut child = crate::command(&self.python)
            .arg(client_script())
            .args(["--batches", "--failures-ok", "--pace"])
            .arg(pace.as_millis().to_string())
            .args([target, "0"])
            .env("GRPC_XDS_BOOTSTRAP", &self.bootstrap)
            .env_remove("GRPC_XDS_BOOTSTRAP_CONFIG")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("run {}: {e}", self.python.display()))?;
        let stdin = child.stdin.take();
        let lines = child
            .stdout
            .take()
            .map(|out| tokio::io::BufReader::new(out).lines());
        Ok(Batches {
            child,
            stdin,
            lines,
        })
    }
}

/// A C-core client process making calls in batches over one channel
/// ([`Client::batches`]); killed when dropped.
#[derive(Debug)]
pub struct Batches {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    lines: Option<tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>>,
}

impl Batches {
    /// `calls` calls, each with the `cookie` metadata when given, one
    /// after another; every call, answered or failed, once all ended.
    pub async fn run(&mut self, calls: usize, cookie: Option<&str>) -> Result<Vec<Call>, String> {
        let (Some(stdin), Some(lines)) = (self.stdin.as_mut(), self.lines.as_mut()) else {
            return Err("the C-core client is finished".to_owned());
        };
        let batch = format!("{calls} {}\n", cookie.unwrap_or_default());
        stdin
            .write_all(batch.as_bytes())
            .await
            .map_err(|e| format!("the C-core client's stdin: {e}"))?;
        let mut out = Vec::new();
        let read = async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .map_err(|e| format!("the C-core client's output: {e}"))?
                    .ok_or("the C-core client ended in a batch")?;
                if line.contains("\"batch_done\"") {
                    return Ok::<_, String>(());
                }
                out.push(parse_call(&line)?);
            }
        };
        tokio::time::timeout(RUN_TIMEOUT, read)
            .await
            .map_err(|_| format!("a batch did not finish within {RUN_TIMEOUT:?}"))??;
        Ok(out)
    }

    /// Closes the channel (standard input ends) and waits for the process.
    pub async fn finish(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        let status = tokio::time::timeout(RUN_TIMEOUT, self.child.wait())
            .await
            .map_err(|_| format!("the C-core client did not end within {RUN_TIMEOUT:?}"))?
            .map_err(|e| format!("the C-core client: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("the C-core client failed ({status})"))
        }
    }
}

fn parse_call(line: &str) -> Result<Call, String> {
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("C-core client output {line:?}: {e}"))?;
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
    Ok(Call {
        key: v["key"].as_str().map(str::to_owned),
        backend: text("backend"),
        address: text("address"),
        set_cookie: v["set_cookie"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        // Lines of runs that stop at a failure carry no code: answered.
        code: v["code"].as_str().unwrap_or("OK").to_owned(),
        message: text("message"),
        client_cert: v["client_cert"].as_str().map(str::to_owned),
        ms: v["ms"].as_u64().unwrap_or_default(),
    })
}
