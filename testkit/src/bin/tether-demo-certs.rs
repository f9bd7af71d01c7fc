//! `tether-demo-certs`: the certificates of the compose demo's mTLS variant
//! (`envoy-configs/docker-compose.mtls.yml`), made at start by its `certs`
//! service into a volume the other containers mount.
//!
//! One CA issues three leaves, each written as `NAME.pem` and `NAME.key`
//! next to `ca.pem`: `backend` (what the backends present, SPIFFE URI SAN),
//! `client` (what Envoy, tether::Channel and gRPC C-core present to the
//! backends and to the control plane) and `control` (tether-control's ADS
//! over TLS, a DNS SAN of its service name). The CA's key is never written:
//! nothing else can be issued. When `ca.pem` already exists the files are
//! kept, so a restarted project keeps its identities.
//!
//! The keys are made readable by every user (0644): the Envoy and Python
//! images may run as other users than the one writing them. That is for a
//! demo's throwaway keys only.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use tether_testkit::tls::{Ca, Issued};

/// Writes the demo's CA and the backend, client and control-plane
/// certificates into a folder.
#[derive(Debug, Parser)]
#[command(name = "tether-demo-certs", version, about, long_about = None)]
struct Args {
    /// The folder to write into (created when missing).
    #[arg(long)]
    out: PathBuf,
    /// The backends' SANs (repeat for more): a URI, an IP address or a DNS name.
    #[arg(long, default_values_t = ["spiffe://tether.demo/ns/shop/sa/backend".to_string()])]
    backend_san: Vec<String>,
    /// The clients' SANs (repeat for more).
    #[arg(long, default_values_t = ["spiffe://tether.demo/ns/shop/sa/client".to_string()])]
    client_san: Vec<String>,
    /// tether-control's SANs (repeat for more); clients verify its address's
    /// host name against them (gRFC A65).
    #[arg(long, default_values_t = ["tether-control".to_string()])]
    control_san: Vec<String>,
    /// Replace existing files instead of keeping them.
    #[arg(long)]
    force: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tether_testkit::init_program_logging();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let out = &args.out;
    std::fs::create_dir_all(out).map_err(|e| format!("--out {}: {e}", out.display()))?;
    if out.join("ca.pem").exists() && !args.force {
        log::info!(
            "{} already has ca.pem: keeping the certificates there",
            out.display()
        );
        return Ok(());
    }
    let sans = |flag: &str, list: &[String]| -> Result<Vec<String>, String> {
        if let Some(bad) = list
            .iter()
            .find(|s| s.trim().is_empty() || !s.is_ascii() || s.contains(char::is_whitespace))
        {
            return Err(format!(
                "--{flag} {bad:?}: a SAN is a URI, an IP address or a DNS name (ASCII, no spaces)"
            ));
        }
        Ok(list.to_vec())
    };
    let leaves = [
        ("backend", sans("backend-san", &args.backend_san)?),
        ("client", sans("client-san", &args.client_san)?),
        ("control", sans("control-san", &args.control_san)?),
    ];
    let ca = Ca::new("tether demo CA");
    for (name, sans) in &leaves {
        let sans: Vec<&str> = sans.iter().map(String::as_str).collect();
        let issued: Issued = ca.issue(&sans);
        write(out, &format!("{name}.pem"), &issued.cert_pem)?;
        write(out, &format!("{name}.key"), &issued.key_pem)?;
        log::info!("{name}.pem, {name}.key: SANs {sans:?}");
    }
    // Last: its presence says the set is complete.
    write(out, "ca.pem", &ca.pem())?;
    log::info!("ca.pem: the CA every peer trusts, in {}", out.display());
    Ok(())
}

fn write(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| format!("{}: {e}", path.display()))
}
