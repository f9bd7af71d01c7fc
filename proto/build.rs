//! Compiles the project's .proto files with protox (a pure-Rust compiler, so no
//! protoc is needed) and generates prost messages; with the `grpc` feature the
//! tonic service code is generated too.

use std::path::PathBuf;

const FILES: &[&str] = &[
    "tether/session/v1/cookie.proto",
    "tether/demo/v1/echo.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    for file in FILES {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let fds = protox::compile(FILES, [&root])?;

    #[cfg(feature = "grpc")]
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .compile_fds(fds)?;

    #[cfg(not(feature = "grpc"))]
    prost_build::Config::new().compile_fds(fds)?;

    Ok(())
}
