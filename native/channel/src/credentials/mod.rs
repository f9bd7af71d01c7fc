//! Transport credentials of the channel's connections: plaintext HTTP/2
//! (h2c, the default) or TLS and mTLS ([`TlsConfig`], set with
//! [`crate::channel::ChannelBuilder::tls`]).

mod tls;

pub(crate) use tls::HandshakeError;
pub use tls::{TlsConfig, TlsError};
