//! The protobuf payload: Envoy's `Cookie` message (fields 1 and 2) plus
//! tether's extension fields (see `proto/tether/session/v1/cookie.proto`).

use alloc::vec::Vec;
use prost::encoding::{encode_key, encode_varint, WireType};
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

/// Serialises a cookie, with a MAC from `signer` when given. Fields go out in
/// number order and zero values are omitted, as prost writes them (a test
/// holds the two byte-identical), so an unsigned cookie with only an address
/// and expiry is byte-identical to Envoy's. Written by hand because this is
/// the hot path of every re-pinned request: addresses are formatted straight
/// into the output instead of through intermediate strings.
pub(super) fn to_bytes(cookie: &SessionCookie, signer: Option<&Key>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    for (i, addr) in cookie.addresses.as_slice().iter().enumerate() {
        put_address(&mut out, if i == 0 { 1 } else { 101 }, addr);
        if i == 0 {
            if let Some(e) = cookie.expires.filter(|e| *e != 0) {
                encode_key(2, WireType::Varint, &mut out);
                encode_varint(e, &mut out);
            }
            if let Some(c) = cookie.cluster.as_deref().filter(|c| !c.is_empty()) {
                put_bytes(&mut out, 100, c.as_bytes());
            }
        }
    }
    if let Some(k) = signer {
        put_bytes(&mut out, 102, &k.sign(cookie).0);
    }
    out
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Writes `addr` as a length-delimited string field. The text of a socket
/// address is at most 58 bytes, so its length always fits one varint byte.
fn put_address(out: &mut Vec<u8>, field: u32, addr: &core::net::SocketAddr) {
    encode_key(field, WireType::LengthDelimited, out);
    let len_at = out.len();
    out.push(0);
    address::push_text(out, addr);
    let len = out.len() - len_at - 1;
    debug_assert!(len < 128);
    out[len_at] = len as u8;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cookie::Key;
    use alloc::string::{String, ToString};

    /// The hand-written encoder and prost's generated one agree byte for byte.
    #[test]
    fn matches_prost_encoding() {
        let key = Key::from_secret(b"0123456789abcdef").unwrap();
        let lists = [
            "127.0.0.1:1",
            "10.0.0.1:80,[2001:db8::1]:80,[::ffff:1.2.3.4]:65535",
        ];
        for list in lists {
            for cluster in [None, Some("cluster_a")] {
                for expires in [None, Some(1u64), Some(u64::MAX)] {
                    for signer in [None, Some(&key)] {
                        let cookie = SessionCookie {
                            addresses: AddressList::parse(list).unwrap(),
                            cluster: cluster.map(String::from),
                            expires,
                        };
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
                            mac: signer.map(|k| k.sign(&cookie).0).unwrap_or_default(),
                        };
                        assert_eq!(
                            to_bytes(&cookie, signer),
                            wire.encode_to_vec(),
                            "{cookie:?}"
                        );
                    }
                }
            }
        }
    }
}
