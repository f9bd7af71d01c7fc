//! The `GRPC_EXPERIMENTAL_*` switches gRPC reads from the environment,
//! read the way C-core reads them.

/// Whether the environment variable `name` is set to a true value (`true`,
/// `yes`, `1`, any case).
pub(crate) fn flag(name: &str) -> bool {
    std::env::var(name)
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "yes" | "1"))
}
