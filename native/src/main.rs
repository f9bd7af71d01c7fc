//! The `tether` command.

fn main() {
    std::process::exit(tether::cli::run(std::env::args_os()));
}
