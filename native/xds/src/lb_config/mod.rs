//! LB policy configs as validation makes them (the channel's policies take
//! these values and never see a proto), and the rules tether-control shares
//! with the clients.
//!
//! - [`outlier_detection`]: gRFC A50's settings.
//! - [`weighted_round_robin`]: gRFC A58's settings.
//! - [`least_request`]: gRFC A48's limits.
//! - [`registry`]: custom policies' names and config parsers (gRFC A52).

pub mod least_request;
pub mod outlier_detection;
pub mod registry;
pub mod weighted_round_robin;
