//! `tether::Channel`: a proxyless gRPC channel for tonic, with session
//! affinity (gRFC A55/A60/A75) and gRPC's xDS load-balancing tree.
//!
//! Modules along the data path of a call: [`session`] (the cookie jar a
//! client wraps the channel in), [`channel`] (the tonic-compatible Service,
//! the xDS resolver, the config selector that routes a call, the fault
//! injection filter a routed call passes, retries), [`lb`] (the
//! load-balancing tree, one module per policy), [`subchannel`] (HTTP/2
//! connections with their connectivity state and backoff). Beside them,
//! [`orca`] carries backends' load reports (gRFC A51).
//!
//! Resources arrive validated by [`xds`] (the `tether-xds` crate,
//! re-exported): the policies take its plain config values. This crate
//! has no command line and no control plane: `tether-cli` and
//! `tether-control` are crates of their own.
//!
//! The types a tonic user names are re-exported here, at the crate root:
//! [`Channel`], [`ChannelBuilder`], [`StaticConfig`], [`SessionOptions`],
//! [`CookieJar`], [`ChannelStats`], ... (their modules keep them too).
//! Policy authors find theirs in [`lb`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod channel;
pub mod credentials;
mod filter;
pub mod lb;
pub mod orca;
pub mod session;
pub mod subchannel;
pub mod telemetry;

/// The xDS client and its validated resources (the `tether-xds` crate).
pub use tether_xds as xds;

/// The Client Status Discovery Service (gRFC A40) over every XdsClient of
/// the process: add [`csds::service()`] to a tonic server.
pub use tether_xds::csds;

/// The fault injection filter (gRFC A33), now beside the call path in
/// [`channel`]; kept at this path.
pub use channel::fault;

// What a tonic user names, at the crate root (their modules keep them too).
// The channel, its builder, options and errors:
pub use channel::{
    Attempts, Channel, ChannelBuilder, ChannelError, EndpointPolicy, PickedPeer, SessionOptions,
    StaticConfig, StaticConfigError, StaticEndpoint, TargetProblem, WaitForReady, XdsClientScope,
};
pub use credentials::TlsConfig;
pub use subchannel::{KeepaliveOptions, SubchannelOptions};
// `Channel::stats` and `Channel::state`:
pub use channel::{ChannelStats, ClusterSessions};
pub use lb::{AddressSessions, ConnectivityState, PolicyStats};
pub use subchannel::SubchannelStats;
// gRPC's OpenTelemetry metrics (A66):
pub use telemetry::Telemetry;
// The session cookie jar:
pub use session::{CookieJar, CookieJarLayer, CookieJarService, JarError, SessionId};
