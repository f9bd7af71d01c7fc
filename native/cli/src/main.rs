//! The `tether` command.

fn main() {
    std::process::exit(tether_cli::run(std::env::args_os()));
}
