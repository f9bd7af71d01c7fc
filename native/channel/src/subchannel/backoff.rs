//! Connection backoff between a subchannel's failed attempts.
//!
//! gRPC's connection backoff (1 s initial delay, ×1.6 per attempt, jitter
//! 0.2, at most 120 s) is exactly the xDS client's backoff with its
//! [`BackoffConfig::default`], so the subchannel reuses that module.

pub use crate::xds::backoff::{Backoff, BackoffConfig};

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_default_is_grpcs_connection_backoff() {
        let config = BackoffConfig::default();
        assert_eq!(config.initial, Duration::from_secs(1));
        assert_eq!(config.multiplier, 1.6);
        assert_eq!(config.jitter, 0.2);
        assert_eq!(config.max, Duration::from_secs(120));
    }
}
