//! The protobuf payload: Envoy's `Cookie` message (fields 1 and 2) plus
//! tether's extension fields (see `proto/tether/session/v1/cookie.proto`).

use alloc::string::ToString;
use alloc::vec::Vec;
use prost::Message as _;
use tether_proto::session::v1::SessionCookie as Wire;

use super::signed::{Key, Mac};
use super::{DecodeError, Format, SessionCookie};
use crate::address::{self, AddressList};

/// Parses a protobuf cookie. Unknown fields are skipped, as Envoy does.
pub(super) fn parse(bytes: &[u8]) -> Result<(SessionCookie, Format, Option<Mac>), DecodeError> {
    let wire = Wire::decode(bytes).map_err(|_| DecodeError::Proto)?;
    if wire.address.is_empty() {
        return Err(DecodeError::MissingAddress);
    }
    let mut list = Vec::with_capacity(1 + wire.extra_addresses.len());
    list.push(address::parse(&wire.address).map_err(DecodeError::Address)?);
    for extra in &wire.extra_addresses {
        list.push(address::parse(extra).map_err(DecodeError::Address)?);
    }
    let addresses = AddressList::new(list).ok_or(DecodeError::MissingAddress)?;
    // The encoders refuse such names, so a cookie carrying one was not minted by a peer.
    if wire.cluster.chars().any(char::is_control) {
        return Err(DecodeError::Cluster);
    }
    let cookie = SessionCookie {
        addresses,
        cluster: (!wire.cluster.is_empty()).then_some(wire.cluster),
        expires: (wire.expires != 0).then_some(wire.expires),
    };
    let mac = (!wire.mac.is_empty()).then_some(Mac(wire.mac));
    Ok((cookie, Format::Envoy, mac))
}

/// Serialises a cookie, with a MAC from `signer` when given. prost writes
/// fields in number order and omits zero values, so an unsigned cookie with
/// only an address and expiry is byte-identical to Envoy's.
pub(super) fn to_bytes(cookie: &SessionCookie, signer: Option<&Key>) -> Vec<u8> {
    let wire = Wire {
        address: cookie.addresses.primary().to_string(),
        expires: cookie.expires.unwrap_or(0),
        cluster: cookie.cluster.clone().unwrap_or_default(),
        extra_addresses: cookie
            .addresses
            .others()
            .iter()
            .map(ToString::to_string)
            .collect(),
        mac: signer.map(|k| k.sign(cookie).0).unwrap_or_default(),
    };
    wire.encode_to_vec()
}
