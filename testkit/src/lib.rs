//! Fixtures for tether's integration tests, all on loopback:
//!
//! - [`envoy`]: a real Envoy process started from a YAML config, killed on drop;
//! - [`backend`]: HTTP backends that answer with who they are;
//! - [`client`]: a minimal HTTP/1.1 client that shows every response header;
//! - [`dns`]: an in-process DNS server whose records the test changes;
//! - `grpc` (feature `grpc`): gRPC backends serving the demo Echo service,
//!   whose replies say which backend answered;
//! - [`grpcio`]: gRPC C-core (PyPI `grpcio`) as a peer, through the xDS
//!   client in `testkit/peers`;
//! - [`graceful_socket`]: a server socket that closes an HTTP/2 connection
//!   as gRPC servers do;
//! - [`partition`]: a TCP proxy a test cuts off like a network partition.
//!
//! Ports come from [`free_port`]; tests format them into their YAML. Child
//! processes are made with [`command`], so none outlives the test process.

pub mod backend;
pub mod client;
pub mod dns;
pub mod envoy;
pub mod graceful_socket;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod grpcio;
pub mod grpcio_otel;
pub mod partition;
pub mod prometheus;
pub mod tls;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// A TCP port on 127.0.0.1 that nothing listens on, for a test to write
/// into a config that another process (Envoy) binds later.
///
/// The port is taken below the kernel's ephemeral range, so nothing binding
/// port 0 (Envoy's own admin listener, a backend) and no outgoing
/// connection can be handed it in the meantime, and no two calls in one
/// process return the same port. Each process starts at its own offset.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // The range and this process's offset in it, worked out once.
    static PLAN: OnceLock<(u16, u16, u32)> = OnceLock::new();
    let &(lo, hi, start) = PLAN.get_or_init(|| {
        let (lo, hi) = fixed_port_range();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = std::process::id().wrapping_mul(7919) ^ nanos;
        (lo, hi, start)
    });
    let span = u32::from(hi - lo) + 1;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + (start.wrapping_add(n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {lo}-{hi}");
}

/// Ports outside the ephemeral range (`ip_local_port_range`, 32768-60999 by
/// default): the 10,000 below it, or those above it when it starts too low.
fn fixed_port_range() -> (u16, u16) {
    let (eph_lo, eph_hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    if eph_lo >= 11_024 {
        (eph_lo - 10_000, eph_lo - 1)
    } else if eph_hi <= 64_535 {
        (eph_hi + 1, 65_535)
    } else {
        // The whole range is ephemeral: distinct ports are the best on offer.
        (1_024, 65_535)
    }
}

/// A listener on a random 127.0.0.0/8 address and port that `accept`
/// takes (e.g. an address whose cookie text some peer misreads); panics
/// after 10,000 draws.
pub async fn loopback_listener(
    accept: impl Fn(std::net::SocketAddr) -> bool,
) -> tokio::net::TcpListener {
    use std::sync::atomic::AtomicU64;
    static SEED: AtomicU64 = AtomicU64::new(0);
    let _ = SEED.compare_exchange(
        0,
        0x2545_f491_4f6c_dd1d ^ u64::from(std::process::id()),
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..10_000 {
        let mut x = SEED.load(Ordering::SeqCst);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        SEED.store(x, Ordering::SeqCst);
        let ip = std::net::Ipv4Addr::from(0x7f00_0000 | (x as u32 & 0x00ff_ffff) | 1);
        let Ok(listener) = tokio::net::TcpListener::bind((ip, 0)).await else {
            continue;
        };
        if listener.local_addr().is_ok_and(&accept) {
            return listener;
        }
    }
    panic!("no 127.0.0.0/8 address the caller accepts in 10,000 draws");
}

/// Polls `check` every 50 ms until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether something accepts TCP connections at `addr`.
pub async fn is_listening(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}

/// A command for `program` whose process is killed when the thread that
/// spawns it ends, through Linux's parent-death signal (util-linux
/// `setpriv --pdeathsig`, when installed), and when its handle is dropped.
///
/// `kill_on_drop` alone leaves a child running when the test process is
/// killed, or when the handle is never dropped (a fixture in a `static`
/// shared by a file's tests). Spawn from a thread that lives as long as the
/// child should: a test's own thread, or a worker of a runtime kept for the
/// whole process.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
    static SETPRIV: OnceLock<bool> = OnceLock::new();
    let setpriv = *SETPRIV.get_or_init(|| {
        std::process::Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "true"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    // setpriv sets the signal and then execs the program: same process.
    let mut cmd = if setpriv {
        let mut c = tokio::process::Command::new("setpriv");
        c.args(["--pdeathsig", "KILL", "--"]).arg(program);
        c
    } else {
        tokio::process::Command::new(program)
    };
    cmd.kill_on_drop(true);
    cmd
}

/// Removes, once per process, the temporary directories of test processes
/// that are gone: directories named `tether-<tag>-<pid>-<n>` in the system's
/// temporary directory (as the kit's fixtures name theirs) whose process no
/// longer runs. A fixture kept for a whole test process (in a `static`) is
/// never dropped, and a killed test drops nothing; the next run cleans up.
pub fn sweep_stale_temp_dirs() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        // Without /proc nothing tells a finished process from a running one.
        if !std::path::Path::new("/proc/self").exists() {
            return;
        }
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(stale_pid) else {
                continue;
            };
            let dir = entry.path();
            if dir.is_dir() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    });
}

/// The process ID in a name `tether-<tag>-<pid>-<n>`.
fn stale_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("tether-")?;
    let mut parts = rest.rsplitn(3, '-');
    let n = parts.next()?;
    let pid = parts.next()?;
    let tag = parts.next()?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(n) || tag.is_empty() {
        return None;
    }
    pid.parse().ok()
}

/// The path of binary `bin` of workspace package `package`, for tests of
/// other packages (cargo gives `CARGO_BIN_EXE_*` only to the binary's own
/// package). `cargo test --workspace` has built it beside the test
/// executables; when it is missing (one package tested alone), it is built
/// into a target directory of its own, since the running `cargo test`
/// holds the lock of the shared one.
pub fn workspace_bin(package: &str, bin: &str) -> std::path::PathBuf {
    workspace_target(package, "bin", bin)
}

/// As [`workspace_bin`], for example `example` of workspace package
/// `package` (`cargo test` builds examples into `<profile>/examples`).
pub fn workspace_example(package: &str, example: &str) -> std::path::PathBuf {
    workspace_target(package, "example", example)
}

/// A binary (`kind` `bin`) or an example of a workspace package, built
/// apart when the running `cargo test` did not build it.
fn workspace_target(package: &str, kind: &str, name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test executable is in <target>/<profile>/deps");
    let within = |dir: &std::path::Path| match kind {
        "example" => dir.join("examples").join(name),
        _ => dir.join(name),
    };
    let beside = within(profile_dir);
    if beside.is_file() {
        return beside;
    }
    let own_target = profile_dir.join("workspace-bins");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let what = format!("cargo build -p {package} --{kind} {name}");
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            package,
            &format!("--{kind}"),
            name,
        ])
        .arg("--target-dir")
        .arg(&own_target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(status.success(), "{what}: {status}");
    within(&own_target.join("debug"))
}

/// Logs the test's `log` lines by `RUST_LOG` (nothing when unset), through
/// the test harness, so they show with a failing test's output only. Safe
/// to call from every test.
pub fn init_logging() {
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("off"))
        .is_test(true)
        .format_timestamp_millis()
        .try_init();
}

/// Logging for the testkit's programs (`tether-demo-backend`,
/// `tether-demo-certs`): info and up on stderr with millisecond
/// timestamps, `RUST_LOG` to change it.
pub fn init_program_logging() {
    env_logger::Builder::new()
        .filter_level(log::LevelFilter::Info)
        .parse_default_env()
        .format_timestamp_millis()
        .init();
}

#[cfg(test)]
mod tests {
    #[test]
    fn stale_pid_reads_the_kits_directory_names() {
        use super::stale_pid;
        assert_eq!(stale_pid("tether-envoy-1302-0"), Some(1302));
        assert_eq!(stale_pid("tether-grpc-bootstrap-77-123456789"), Some(77));
        assert_eq!(stale_pid("tether-bench.XQZFkC"), None);
        assert_eq!(stale_pid("tether-envoy-x-0"), None);
        assert_eq!(stale_pid("tether-12-0"), None);
        assert_eq!(stale_pid("other-envoy-1-0"), None);
    }
}
