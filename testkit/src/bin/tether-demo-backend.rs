//! `tether-demo-backend`: the demo's backend as a program, for containers.
//!
//! Answers HTTP/1.1 (and HTTP/2) requests and gRPC calls of
//! `tether.demo.v1.Echo` on one port, each answer naming the backend and its
//! address ([`tether_testkit::grpc::serve_dual`]). On SIGTERM or SIGINT it
//! stops accepting, lets every call in flight finish (HTTP/2 GOAWAY), then
//! keeps refusing connections for `--refuse-for` before it exits.
//!
//! Why the refusing: a client that sees GOAWAY reconnects at once. While
//! the process lives, its port answers that attempt with a reset, so the
//! client fails over within a round trip; once the container is gone, an
//! attempt to its address waits for ARP to give up (seconds) or for the
//! connect timeout.
//!
//! With `--tls-cert` and `--tls-key` it serves TLS only (ALPN h2), and with
//! `--tls-client-ca` mTLS: a client without a certificate chaining to that
//! CA is refused at the handshake. Answers (Echo replies' metadata, HTTP
//! headers) then carry the client certificate's fingerprint in
//! `x-client-cert`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tether_testkit::grpc::serve_dual;
use tether_testkit::tls::server_config_from_files;

/// A backend that says who it is, over HTTP/1.1 and gRPC on one port.
#[derive(Debug, Parser)]
#[command(name = "tether-demo-backend", version, about, long_about = None)]
struct Args {
    /// The name every answer carries (`x-backend`, the Echo reply's
    /// `backend`); default: the host's name (a container's, for the
    /// replicas of a scaled service, which share one command line).
    #[arg(long)]
    name: Option<String>,
    /// The address to listen on; answers name it. With `0.0.0.0` (or `[::]`)
    /// answers name the address each connection reached instead.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// After SIGTERM, how long calls in flight may take to finish, in seconds.
    #[arg(long, default_value_t = 8.0, value_parser = seconds)]
    grace: f64,
    /// After draining, how long to keep refusing connections before exiting,
    /// in seconds (0: exit at once).
    #[arg(long, default_value_t = 1.0, value_parser = seconds)]
    refuse_for: f64,
    /// End every connection gracefully (GOAWAY, its calls finish) once it is
    /// this old, in seconds, as gRPC's `max_connection_age` does (0: never).
    #[arg(long, default_value_t = 0.0, value_parser = seconds)]
    max_connection_age: f64,
    /// Serve TLS only, presenting this certificate chain (PEM, leaf first);
    /// needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// With --tls-cert: require client certificates chaining to these CA
    /// certificates (PEM), i.e. mTLS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
}

fn seconds(text: &str) -> Result<f64, String> {
    match text.trim_end_matches('s').parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{text:?} is not a number of seconds between 0 and 3600"
        )),
    }
}

/// The host's name: what a container's `/etc/hostname` holds (its ID
/// unless the container was given a hostname), else `$HOSTNAME`.
fn host_name() -> Option<String> {
    let from_file = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned());
    from_file
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
}

fn main() -> ExitCode {
    let args = Args::parse();
    tether_testkit::init_program_logging();
    let Some(name) = args.name.clone().or_else(host_name) else {
        log::error!(
            "--name: not given, and the host has no name (/etc/hostname and $HOSTNAME are empty)"
        );
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            log::error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(name, args))
}

async fn run(name: String, args: Args) -> ExitCode {
    use tokio::signal::unix::{signal, SignalKind};
    // Handlers first: as a container's PID 1 the process would otherwise
    // ignore SIGTERM and be killed 10 s later with its calls.
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            log::error!("cannot handle SIGTERM/SIGINT: {e}");
            return ExitCode::FAILURE;
        }
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            match server_config_from_files(cert, key, args.tls_client_ca.as_deref()) {
                Ok(config) => Some(config),
                Err(e) => {
                    log::error!("--tls-cert/--tls-key/--tls-client-ca: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => None,
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            log::error!("--listen {}: cannot listen: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    log::info!(
        "{} serving HTTP/1.1 and gRPC (tether.demo.v1.Echo) on {}{}{}",
        name,
        args.listen,
        match (&tls, &args.tls_client_ca) {
            (None, _) => "",
            (Some(_), None) => " over TLS",
            (Some(_), Some(_)) => " over mTLS",
        },
        if args.max_connection_age > 0.0 {
            format!(", connections end after {} s", args.max_connection_age)
        } else {
            String::new()
        }
    );
    let shutdown = async {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        log::info!("{which}: closing the listener, draining the open connections");
    };
    let grace = Duration::from_secs_f64(args.grace);
    let max_age =
        (args.max_connection_age > 0.0).then(|| Duration::from_secs_f64(args.max_connection_age));
    let drained = match serve_dual(&name, listener, shutdown, grace, max_age, tls).await {
        Ok(d) => d,
        Err(e) => {
            log::error!("{}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    if drained.in_time {
        log::info!(
            "drained {} connection(s) in {} ms",
            drained.connections,
            drained.took.as_millis()
        );
    } else {
        log::warn!(
            "{} connection(s) still open after the {} s grace period",
            drained.connections,
            args.grace
        );
    }
    if args.refuse_for > 0.0 {
        log::info!(
            "refusing connections for {} s, then exiting",
            args.refuse_for
        );
        tokio::time::sleep(Duration::from_secs_f64(args.refuse_for)).await;
    }
    ExitCode::SUCCESS
}
