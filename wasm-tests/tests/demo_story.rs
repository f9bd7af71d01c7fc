//! The demo's story (`scripts/demo.sh`, `examples/demo.rs`) as a test, so
//! it cannot rot: every step passes against real Envoy 1.40, the tether
//! plugin, tether-control and `tether::Channel` (and gRPC C-core when a
//! Python with grpcio is found).

use tether_wasm_tests::demo;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_story_passes() {
    let python = demo::find_python().await;
    // CI installs grpcio (scripts/setup.sh): there the C-core column must run.
    if std::env::var("CI").as_deref() == Ok("true") {
        assert!(python.is_some(), "CI=true but no Python imports grpc");
    }
    let steps = demo::run(python).await.expect("the demo starts");
    let table = demo::render(&steps);
    println!("{table}");
    assert_eq!(steps.len(), 3, "{table}");
    assert!(steps.iter().all(|s| s.ok), "{table}");
}
