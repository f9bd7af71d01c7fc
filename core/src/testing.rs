//! Helpers for core's unit tests.

/// A xorshift64 generator: reproducible random input for the property tests
/// without a dependency. `seed` must not be zero.
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}
