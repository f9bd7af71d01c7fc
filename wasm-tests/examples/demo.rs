//! tether's cross-compatibility demo: one session across Envoy 1.40 with
//! the tether plugin, gRPC C-core (PyPI grpcio) and `tether::Channel`, all
//! configured by one tether-control file, on 127.0.0.1. Prints a table of
//! what happened with a verdict per step and exits 1 when a step fails.
//!
//! Run it with `scripts/demo.sh` (installs Envoy and grpcio if needed and
//! builds the plugin first), or `cargo run -p tether-wasm-tests --example
//! demo`. The story itself is `tether_wasm_tests::demo`.

use std::time::Instant;

use tether_wasm_tests::demo;
use tether_wasm_tests::scenario::plugin_path;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let started = Instant::now();
    // Fail early, with the command that builds it, if the plugin is missing.
    let plugin = plugin_path();
    let python = demo::find_python().await;
    println!("tether demo: tether-control, three backends (HTTP/1.1 + gRPC), Envoy 1.40 with the");
    println!(
        "tether plugin ({plugin}), tether::Channel and {}",
        match &python {
            Some(p) => format!("gRPC C-core ({} with grpcio)", p.display()),
            None => "no gRPC C-core (no Python with grpcio found)".to_owned(),
        }
    );
    println!();
    // Ctrl-C drops the story, which stops everything it started.
    let steps = tokio::select! {
        r = demo::run(python) => r,
        _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
    };
    let steps = match steps {
        Ok(s) => s,
        Err(e) => {
            println!("FAIL: the demo could not start: {e}");
            std::process::exit(1);
        }
    };
    print!("{}", demo::render(&steps));
    let failed = steps.iter().filter(|s| !s.ok).count();
    println!(
        "{} of {} steps passed in {:.1} s; everything the demo started is stopped.",
        steps.len() - failed,
        steps.len(),
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
