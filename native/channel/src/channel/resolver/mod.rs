//! Resolvers: what turns the channel's target into the configs its LB
//! task runs. [`xds`] follows an `xds:///` listener's graph; [`dns`]
//! resolves a name (`dns:`, `http(s)://`) into one endpoint per address,
//! again whenever a connection is lost or fails (at most once per
//! cooldown), as gRPC C-core's DNS resolver does.

pub(crate) mod dns;
pub(crate) mod xds;
