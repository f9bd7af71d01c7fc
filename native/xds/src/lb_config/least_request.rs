//! `least_request`'s limits (gRFC A48), shared by CDS validation and
//! tether-control's YAML.

/// `choice_count` when the cluster does not set it.
pub const DEFAULT_CHOICE_COUNT: u32 = 2;
/// The most draws per pick (gRFC A48): larger values are used as this.
pub const MAX_CHOICE_COUNT: u32 = 10;
