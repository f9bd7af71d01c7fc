//! The protobuf payload: Envoy's `Cookie` message (fields 1 and 2) plus
//! tether's extension fields (see `proto/tether/session/v1/cookie.proto`).

use alloc::string::String;
use alloc::vec::Vec;
use prost::encoding::{encode_key, encode_varint, WireType};

use super::signed::{Key, Mac};
use super::{has_control, DecodeError, Format, SessionCookie};
use crate::address::{self, AddressList};

/// Parses a protobuf cookie. Unknown fields are skipped, as Envoy does.
///
/// This reads the bytes the way prost's generated decoder for tether-proto's
/// `SessionCookie` does (the same input is accepted, with the same values; a
/// test holds the two equal), without building the intermediate message: it
/// is the hot path of every pinned request, and the addresses are parsed
/// straight from the input.
pub(super) fn parse(bytes: &[u8]) -> Result<(SessionCookie, Format, Option<Mac>), DecodeError> {
    let mut r = Reader(bytes);
    let (mut address, mut expires, mut cluster, mut mac) = ("", 0, "", &[][..]);
    let mut extra: Vec<&str> = Vec::new();
    // Every protobuf error is found before any address is judged, as when
    // the whole message was decoded first.
    while !r.0.is_empty() {
        let (field, wire) = r.key()?;
        match field {
            1 => address = r.string(wire)?,
            2 => expires = r.uint64(wire)?,
            100 => cluster = r.string(wire)?,
            101 => extra.push(r.string(wire)?),
            102 => mac = r.bytes(wire)?,
            _ => r.skip(field, wire)?,
        }
    }
    if address.is_empty() {
        return Err(DecodeError::MissingAddress);
    }
    let mut list = Vec::with_capacity(1 + extra.len());
    list.push(address::parse(address).map_err(DecodeError::Address)?);
    for a in extra {
        list.push(address::parse(a).map_err(DecodeError::Address)?);
    }
    let addresses = AddressList::new(list).ok_or(DecodeError::MissingAddress)?;
    // The encoders refuse such names, so a cookie carrying one was not minted by a peer.
    if has_control(cluster) {
        return Err(DecodeError::Cluster);
    }
    let cookie = SessionCookie {
        addresses,
        cluster: (!cluster.is_empty()).then(|| String::from(cluster)),
        expires: (expires != 0).then_some(expires),
    };
    let mac = (!mac.is_empty()).then(|| Mac(mac.to_vec()));
    Ok((cookie, Format::Envoy, mac))
}

/// How deep unknown groups may nest (prost's limit).
const RECURSION_LIMIT: u32 = 100;

/// Protobuf wire types.
pub(super) const VARINT: u8 = 0;
const FIXED64: u8 = 1;
pub(super) const LENGTH_DELIMITED: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// The unread rest of a protobuf message. Every malformed input is
/// [`DecodeError::Proto`], wherever prost fails on it.
pub(super) struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A reader of `bytes`.
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader(bytes)
    }

    /// Whether everything was read.
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A base-128 varint of at most ten bytes, the tenth at most 1.
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for (i, &b) in self.0.iter().enumerate().take(10) {
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                if i == 9 && b > 1 {
                    break;
                }
                self.0 = self.0.get(i + 1..).unwrap_or_default();
                return Ok(value);
            }
        }
        Err(DecodeError::Proto)
    }

    /// A field key: its number (at least 1) and a known wire type.
    pub(super) fn key(&mut self) -> Result<(u32, u8), DecodeError> {
        let key = u32::try_from(self.varint()?).map_err(|_| DecodeError::Proto)?;
        let wire = (key & 7) as u8;
        let field = key >> 3;
        if wire > FIXED32 || field == 0 {
            return Err(DecodeError::Proto);
        }
        Ok((field, wire))
    }

    /// The next `len` bytes.
    fn take(&mut self, len: u64) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(len).map_err(|_| DecodeError::Proto)?;
        let (taken, rest) = self.0.split_at_checked(len).ok_or(DecodeError::Proto)?;
        self.0 = rest;
        Ok(taken)
    }

    /// A `bytes` field's value.
    fn bytes(&mut self, wire: u8) -> Result<&'a [u8], DecodeError> {
        if wire != LENGTH_DELIMITED {
            return Err(DecodeError::Proto);
        }
        let len = self.varint()?;
        self.take(len)
    }

    /// A `string` field's value, which must be UTF-8.
    pub(super) fn string(&mut self, wire: u8) -> Result<&'a str, DecodeError> {
        let bytes = self.bytes(wire)?;
        core::str::from_utf8(bytes).map_err(|_| DecodeError::Proto)
    }

    /// A `uint64` field's value.
    pub(super) fn uint64(&mut self, wire: u8) -> Result<u64, DecodeError> {
        if wire != VARINT {
            return Err(DecodeError::Proto);
        }
        self.varint()
    }

    /// Skips an unknown field.
    pub(super) fn skip(&mut self, field: u32, wire: u8) -> Result<(), DecodeError> {
        self.skip_within(field, wire, RECURSION_LIMIT)
    }

    /// Skips an unknown field; groups nest at most `depth` deep.
    fn skip_within(&mut self, field: u32, wire: u8, depth: u32) -> Result<(), DecodeError> {
        if depth == 0 {
            return Err(DecodeError::Proto);
        }
        let len = match wire {
            VARINT => self.varint().map(|_| 0)?,
            FIXED64 => 8,
            FIXED32 => 4,
            LENGTH_DELIMITED => self.varint()?,
            START_GROUP => loop {
                let (inner, inner_wire) = self.key()?;
                if inner_wire == END_GROUP {
                    if inner != field {
                        return Err(DecodeError::Proto);
                    }
                    break 0;
                }
                self.skip_within(inner, inner_wire, depth - 1)?;
            },
            _ => return Err(DecodeError::Proto), // an end-group without its start
        };
        self.take(len).map(|_| ())
    }
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
    use alloc::string::ToString;
    use prost::Message as _;
    use tether_proto::session::v1::SessionCookie as Wire;

    /// What `parse` did before it read the bytes itself: prost's generated
    /// decoder, then the same checks.
    fn parse_with_prost(bytes: &[u8]) -> Result<(SessionCookie, Format, Option<Mac>), DecodeError> {
        let wire = Wire::decode(bytes).map_err(|_| DecodeError::Proto)?;
        if wire.address.is_empty() {
            return Err(DecodeError::MissingAddress);
        }
        let mut list = alloc::vec![address::parse(&wire.address).map_err(DecodeError::Address)?];
        for extra in &wire.extra_addresses {
            list.push(address::parse(extra).map_err(DecodeError::Address)?);
        }
        if wire.cluster.chars().any(char::is_control) {
            return Err(DecodeError::Cluster);
        }
        let cookie = SessionCookie {
            addresses: AddressList::new(list).unwrap(),
            cluster: (!wire.cluster.is_empty()).then_some(wire.cluster),
            expires: (wire.expires != 0).then_some(wire.expires),
        };
        Ok((
            cookie,
            Format::Envoy,
            (!wire.mac.is_empty()).then_some(Mac(wire.mac)),
        ))
    }

    fn same_as_prost(bytes: &[u8]) {
        assert_eq!(parse(bytes), parse_with_prost(bytes), "{bytes:02x?}");
    }

    fn varint(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_varint(v, &mut out);
        out
    }

    fn field(number: u32, wire: u64, body: &[u8]) -> Vec<u8> {
        let mut out = varint((u64::from(number) << 3) | wire);
        out.extend_from_slice(body);
        out
    }

    fn string_field(number: u32, text: &[u8]) -> Vec<u8> {
        let mut body = varint(text.len() as u64);
        body.extend_from_slice(text);
        field(number, 2, &body)
    }

    #[test]
    fn reads_what_prost_reads_for_edge_cases() {
        let addr = string_field(1, b"127.0.0.1:80");
        let cat = |parts: &[&[u8]]| parts.concat();
        let mut cases: Vec<Vec<u8>> = alloc::vec![
            Vec::new(),
            addr.clone(),
            // Last value wins for singular fields; repeated ones append.
            cat(&[&addr, &string_field(1, b"10.0.0.1:1")]),
            cat(&[
                &addr,
                &string_field(101, b"10.0.0.2:2"),
                &string_field(101, b"[::1]:3")
            ]),
            cat(&[&addr, &string_field(101, b"nope")]),
            cat(&[&string_field(1, b"nope"), &[0xff]]),
            cat(&[&addr, &string_field(100, b"c1"), &string_field(100, b"")]),
            cat(&[&addr, &string_field(100, b"a\x7fb")]),
            cat(&[&addr, &string_field(100, "a\u{85}b".as_bytes())]),
            cat(&[&addr, &string_field(102, &[0xff, 0])]),
            cat(&[&addr, &string_field(102, b"")]),
            // Strings must be UTF-8, bytes need not.
            cat(&[&addr, &string_field(100, &[0xff])]),
            string_field(1, &[0xc3]),
            // Varints: ten bytes at most, the tenth 0 or 1.
            cat(&[&addr, &field(2, 0, &[0xff; 9]), &[0x01]]),
            cat(&[&addr, &field(2, 0, &[0xff; 9]), &[0x02]]),
            cat(&[&addr, &field(2, 0, &[0x80; 10]), &[0x00]]),
            cat(&[&addr, &field(2, 0, &[0x80, 0x00])]),
            cat(&[&addr, &field(2, 0, &[0x80])]),
            cat(&[&addr, &field(2, 0, &varint(0))]),
            // Keys: a field number of 0, wire types 6 and 7, beyond u32.
            cat(&[&addr, &[0x00, 0x00]]),
            cat(&[&addr, &[0x06]]),
            cat(&[&addr, &[0x0f]]),
            cat(&[&addr, &varint(1 << 32 | 8), &[0]]),
            cat(&[&addr, &varint((1 << 32) - 8), &[0]]),
            // Known fields with the wrong wire type.
            cat(&[&addr, &field(2, 2, &[0])]),
            cat(&[&field(1, 0, &[1])]),
            cat(&[&addr, &field(102, 5, &[0; 4])]),
            cat(&[&addr, &field(1, 3, &[]), &field(1, 4, &[])]),
            // Unknown fields of every wire type, whole and cut short.
            cat(&[&addr, &field(7, 0, &[0x96, 0x01])]),
            cat(&[&addr, &field(7, 1, &[0; 8])]),
            cat(&[&addr, &field(7, 1, &[0; 7])]),
            cat(&[&addr, &field(7, 5, &[0; 4])]),
            cat(&[&addr, &field(7, 5, &[0; 3])]),
            cat(&[&addr, &field(7, 2, &[3, 1, 2, 3])]),
            cat(&[&addr, &field(7, 2, &[4, 1, 2, 3])]),
            cat(&[&addr, &field(7, 2, &varint(u64::MAX))]),
            cat(&[&addr, &field(7, 3, &[]), &field(7, 4, &[])]),
            cat(&[&addr, &field(7, 3, &[]), &field(8, 4, &[])]),
            cat(&[
                &addr,
                &field(7, 3, &[]),
                &field(1, 2, &[0]),
                &field(7, 4, &[])
            ]),
            cat(&[&addr, &field(7, 3, &[])]),
            cat(&[&addr, &field(7, 4, &[])]),
        ];
        // Groups nested up to prost's limit, and one deeper.
        for depth in [99, 100, 101] {
            let mut bytes = addr.clone();
            for _ in 0..depth {
                bytes.extend(field(9, 3, &[]));
            }
            for _ in 0..depth {
                bytes.extend(field(9, 4, &[]));
            }
            cases.push(bytes);
        }
        for bytes in &cases {
            same_as_prost(bytes);
        }
        assert!(parse(&cases[3]).is_ok_and(|(c, _, _)| c.addresses.len() == 3));
    }

    #[test]
    fn reads_what_prost_reads_for_mutated_cookies() {
        let key = Key::from_secret(b"0123456789abcdef").unwrap();
        let mut c = SessionCookie::new(AddressList::parse("10.1.2.3:8080,[::1]:9").unwrap());
        c.cluster = Some("backends".into());
        c.expires = Some(1_800_000_000);
        let seeds = [to_bytes(&c, Some(&key)), to_bytes(&c, None)];
        let mut next = crate::testing::xorshift(0x853c_49e6_748f_ea9b_u64);
        for _ in 0..50_000 {
            let mut bytes = seeds[(next() % 2) as usize].clone();
            for _ in 0..1 + next() % 3 {
                let at = (next() as usize) % (bytes.len() + 1);
                match next() % 4 {
                    0 if at < bytes.len() => bytes[at] ^= 1 << (next() % 8),
                    1 if at < bytes.len() => bytes[at] = next() as u8,
                    2 => bytes.insert(at, next() as u8),
                    _ => bytes.truncate(at),
                }
            }
            same_as_prost(&bytes);
        }
        for _ in 0..50_000 {
            let len = (next() % 24) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            same_as_prost(&bytes);
        }
    }

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
