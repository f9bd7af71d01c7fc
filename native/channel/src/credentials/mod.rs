//! Transport credentials of the channel's connections: plaintext HTTP/2
//! (h2c, the default), TLS and mTLS ([`TlsConfig`], set with
//! [`crate::channel::ChannelBuilder::tls`]), and for `xds:///` targets the
//! TLS a cluster asks for (gRFC A29: [`XdsSecurity`], with the bootstrap's
//! certificate providers), which the channel honours unless
//! [`crate::channel::ChannelBuilder::xds_credentials`] turns it off.

mod provider;
mod san;
mod xds;

pub(crate) use provider::ProviderStore;
pub use tether_xds::tls::{HandshakeError, TlsConfig, TlsError};
pub use xds::XdsSecurity;

use std::sync::Arc;

/// How a subchannel's connections are secured.
#[derive(Debug, Clone, Default)]
pub(crate) enum Transport {
    /// Plaintext HTTP/2.
    #[default]
    Plain,
    /// The channel's TLS configuration.
    Tls(TlsConfig),
    /// A cluster's xDS-managed TLS.
    Xds(Arc<XdsSecurity>),
}
