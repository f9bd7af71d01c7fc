//! `tether-control`: serves a YAML file's services and routes over ADS to
//! Envoy and proxyless gRPC clients, and follows changes to the file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tether_control::{Overrides, Reload, Reloader};

/// tether's xDS control plane.
#[derive(Debug, Parser)]
#[command(name = "tether-control", version, about, long_about = None)]
#[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
struct Args {
    /// What to do instead of serving.
    #[command(subcommand)]
    command: Option<Command>,
    /// The configuration file (YAML; see the tether-control README).
    #[arg(long, short = 'c', value_name = "FILE", required = true)]
    config: Option<PathBuf>,
    /// Address to serve ADS on (port 0 picks a free port; the address is
    /// printed on stdout as `listening on <addr>`).
    #[arg(long, default_value = "127.0.0.1:18000")]
    listen: SocketAddr,
    /// The tether plugin's `.wasm` file as Envoy sees it (an absolute path),
    /// for `envoy.sessionFilter: plugin`; overrides `envoy.plugin.filename`.
    #[arg(long, value_name = "FILE")]
    plugin: Option<PathBuf>,
    /// Serve ADS over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// With --tls-cert: require clients to present a certificate chaining to
    /// the CA certificates in FILE (mTLS).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve the admin pages (`/metrics` for Prometheus) on this address;
    /// none without it. Port 0 picks a free port, printed on stdout as
    /// `admin on <addr>`.
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// Let --admin listen on an address other than loopback (its pages
    /// show every client's node ID and load).
    #[arg(long, requires = "admin")]
    admin_allow_remote: bool,
    /// How often to check the file for changes, in milliseconds.
    #[arg(long, default_value_t = 250)]
    poll_ms: u64,
    /// Log streams, pushes and reloads to stderr too (by default only NACKs,
    /// rejected files and other warnings). RUST_LOG, when set, overrides.
    #[arg(long, short = 'v')]
    verbose: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drain readiness across replicas.
    #[command(subcommand)]
    Drain(DrainCommand),
}

#[derive(Debug, Subcommand)]
enum DrainCommand {
    /// Every DRAINING endpoint's verdict from the admin listeners of every
    /// replica serving the file, merged: idle only when idle on all of them.
    /// Exits 0 when every replica answered, 1 otherwise.
    Status {
        /// A replica's admin listener (its --admin); repeat for each replica.
        #[arg(long, value_name = "ADDR", required = true)]
        admin: Vec<SocketAddr>,
        /// Print the merged status as JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// How long to wait for each replica, in seconds.
        #[arg(long, default_value_t = 5.0)]
        timeout: f64,
    },
}

fn main() {
    let args = Args::parse();
    if let Some(Command::Drain(DrainCommand::Status {
        admin,
        json,
        timeout,
    })) = &args.command
    {
        std::process::exit(drain_status(admin, *json, *timeout));
    }
    // Plain stderr lines with millisecond timestamps; RUST_LOG overrides.
    let level = if args.verbose {
        log::LevelFilter::Info
    } else {
        log::LevelFilter::Warn
    };
    let _ = env_logger::Builder::new()
        .filter_level(level)
        .parse_env(env_logger::Env::default())
        .format_timestamp_millis()
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tether-control: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    std::process::exit(runtime.block_on(run(args)));
}

/// `tether-control drain status`.
fn drain_status(admins: &[SocketAddr], json: bool, timeout: f64) -> i32 {
    let timeout = match Duration::try_from_secs_f64(timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => {
            eprintln!("tether-control: --timeout {timeout}: not a positive number of seconds");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tether-control: cannot start the runtime: {e}");
            return 1;
        }
    };
    let replicas = runtime.block_on(tether_control::fleet::ask(admins, timeout));
    let endpoints = tether_control::fleet::merge(&replicas);
    if json {
        let doc = serde_json::json!({
            "replicas": replicas.iter().map(|r| serde_json::json!({
                "admin": r.admin,
                "error": r.answer.as_ref().err(),
            })).collect::<Vec<_>>(),
            "endpoints": endpoints,
        });
        println!("{doc:#}");
    } else {
        print!("{}", tether_control::fleet::render(&replicas, &endpoints));
    }
    if replicas.iter().all(|r| r.answer.is_ok()) {
        0
    } else {
        1
    }
}

async fn run(args: Args) -> i32 {
    let Some(config) = args.config.clone() else {
        eprintln!("tether-control: --config is required");
        return 2;
    };
    let overrides = Overrides {
        plugin_filename: args.plugin.as_ref().map(|p| p.display().to_string()),
    };
    let (plane, reloader) = match Reloader::start_with(&config, overrides) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tether-control: {e}");
            return 1;
        }
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            match tether_control::tls::server_config(cert, key, args.tls_client_ca.as_deref()) {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("tether-control: TLS: {e}");
                    return 1;
                }
            }
        }
        _ => None,
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tether-control: cannot listen on {}: {e}", args.listen);
            return 1;
        }
    };
    let addr = listener.local_addr().unwrap_or(args.listen);
    let admin = match args.admin {
        Some(at) if !at.ip().is_loopback() && !args.admin_allow_remote => {
            eprintln!(
                "tether-control: --admin {at}: not a loopback address; add --admin-allow-remote to \
                 serve the admin pages beyond this host"
            );
            return 2;
        }
        Some(at) => match tokio::net::TcpListener::bind(at).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("tether-control: --admin {at}: cannot listen: {e}");
                return 1;
            }
        },
        None => None,
    };
    let metrics = plane.metrics().clone();
    let dns = reloader.dns_status();
    // Watch (and take SIGHUP) before announcing the address: whoever waits
    // for that line may signal at once.
    tokio::spawn(reloader.run(
        Duration::from_millis(args.poll_ms.max(10)),
        move |r| match r {
            Reload::Published(v) => {
                metrics.reloaded(true);
                log::info!("reloaded, serving version {v}")
            }
            Reload::Rejected(e) => {
                metrics.reloaded(false);
                log::warn!("rejected: {e}; still serving the last good version")
            }
            Reload::Unchanged => {}
        },
    ));
    println!("listening on {addr}");
    if let Some(listener) = admin {
        let at = listener.local_addr().unwrap_or(addr);
        let pages = tether_control::admin::Admin::new(plane.clone(), Some(dns));
        tokio::spawn(pages.serve(listener, std::future::pending()));
        println!("admin on {at}");
    }
    if args.tls_cert.is_some() {
        log::info!("serving ADS over TLS");
    }
    log::info!(
        "serving {} version {} on {addr}",
        config.display(),
        plane.snapshot().version
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let served = match tls {
        Some(config) => plane.serve_tls(listener, config, shutdown).await,
        None => plane.serve(listener, shutdown).await,
    };
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("tether-control: {e}");
            1
        }
    }
}
