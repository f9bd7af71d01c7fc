//! Which peers will honour a session cookie value, judged the way each one
//! parses it.
//!
//! A value is only as good as its readers' parsers. Stock Envoy's cookie
//! session state decodes the base64, then tries its protobuf `Cookie` first
//! and reads the bytes as plain `ip:port` text only when that parse fails; a
//! `legacy` text whose ASCII bytes happen to form a valid protobuf (unknown
//! fields only, no `address`) is therefore no session to Envoy, which balances
//! the request and mints its own cookie. For IPv4 that is common:
//! `10.0.0.1:8080` is a fixed64 field 6 (`1` then eight bytes) and two varint
//! fields 7 (`80`, `80`). [`read`] follows each reader's parse order exactly;
//! [`honours`] says whether it pins a given endpoint.
//!
//! Where plain text fails Envoy, [`guard_legacy`] spells the same address so
//! that every cookie reader takes it: the text, then `;<` (an empty
//! protobuf group 7, and for gRPC the end of the address list), then the
//! address again as Envoy's field 1. Envoy parses the whole as a `Cookie`
//! whose `address` is the endpoint; C-core reads the address before `;`
//! (the rest is a cluster name no route has, which C-core ignores as it
//! ignores a `legacy` cookie's missing one); tether recognises the form.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::SocketAddr;

use super::{decode64, Format, BASE64};
use crate::address;
use base64::Engine as _;

/// A peer that reads session values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reader {
    /// Stock Envoy's cookie-based session state
    /// (`envoy.http.stateful_session.cookie`).
    EnvoyCookie,
    /// Stock Envoy's header-based session state
    /// (`envoy.http.stateful_session.header`).
    EnvoyHeader,
    /// gRPC C-core's stateful session filter and `xds_override_host` policy.
    Grpc,
    /// tether: the plugin, the channel, the CLI and the JavaScript package.
    Tether,
}

impl Reader {
    /// Every reader.
    pub const ALL: [Reader; 4] = [
        Reader::EnvoyCookie,
        Reader::EnvoyHeader,
        Reader::Grpc,
        Reader::Tether,
    ];

    /// The reader as logs and tools name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reader::EnvoyCookie => "envoy-cookie",
            Reader::EnvoyHeader => "envoy-header",
            Reader::Grpc => "grpc",
            Reader::Tether => "tether",
        }
    }

    /// A human description, for warnings.
    pub fn describe(self) -> &'static str {
        match self {
            Reader::EnvoyCookie => "stock Envoy's cookie session state",
            Reader::EnvoyHeader => "stock Envoy's header session state",
            Reader::Grpc => "gRPC C-core",
            Reader::Tether => "tether",
        }
    }
}

impl fmt::Display for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a reader makes of a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// It looks these address texts up among its endpoints, in order, and
    /// pins the first it knows (Envoy's readers have exactly one).
    Pins(Vec<String>),
    /// It sees no session: it balances the request and mints its own value.
    NoSession(Miss),
}

/// Why a reader sees no session in a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Miss {
    /// Its base64 decoder refuses the value.
    Base64,
    /// The bytes form a protobuf `Cookie` without an address: Envoy never
    /// gets to its plain-text fallback.
    ProtobufWithoutAddress,
    /// An Envoy `Cookie` whose `expires` has passed.
    Expired,
    /// The decoded value is empty, or not text the reader understands.
    Unreadable,
}

impl Miss {
    /// A stable short name: `base64`, `protobuf-without-address`, `expired`,
    /// `unreadable`.
    pub fn code(self) -> &'static str {
        match self {
            Miss::Base64 => "base64",
            Miss::ProtobufWithoutAddress => "protobuf-without-address",
            Miss::Expired => "expired",
            Miss::Unreadable => "unreadable",
        }
    }
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Miss::Base64 => "its base64 decoder refuses the value",
            Miss::ProtobufWithoutAddress => {
                "the bytes parse as a protobuf Cookie without an address, so the plain-text \
                 fallback is never tried"
            }
            Miss::Expired => "the cookie has expired",
            Miss::Unreadable => "the value names no address it can read",
        })
    }
}

/// The readers that take every value tether writes in `format`: as a
/// cookie, or (`header`) as a session header's value.
pub fn promised(format: Format, header: bool) -> &'static [Reader] {
    match (format, header) {
        (Format::Legacy, false) => &[Reader::EnvoyCookie, Reader::Grpc, Reader::Tether],
        (Format::Legacy, true) => &[Reader::EnvoyHeader, Reader::Tether],
        (Format::Envoy, false) => &[Reader::EnvoyCookie, Reader::Tether],
        (Format::Grpc, false) => &[Reader::Grpc, Reader::Tether],
        (Format::Envoy | Format::Grpc, true) => &[Reader::Tether],
        // Only tether holds the keys; stock Envoy and C-core see no session.
        (Format::Sealed, _) => &[Reader::Tether],
    }
}

/// One sentence naming who reads `format` and who does not, for logs and
/// configuration checks.
pub fn explain(format: Format, header: bool) -> String {
    let names = |list: &[Reader]| {
        list.iter()
            .map(|r| r.describe())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let readers = promised(format, header);
    let candidates: &[Reader] = if header {
        &[Reader::EnvoyHeader, Reader::Tether]
    } else {
        &[Reader::EnvoyCookie, Reader::Grpc, Reader::Tether]
    };
    let others: Vec<Reader> = candidates
        .iter()
        .copied()
        .filter(|r| !readers.contains(r))
        .collect();
    let mut out = alloc::format!(
        "format {format}{}: read by {}",
        if header { " (header)" } else { "" },
        names(readers)
    );
    if !others.is_empty() {
        out.push_str("; not by ");
        out.push_str(&names(&others));
    }
    out
}

/// How `reader` reads a session value (a cookie's value, or a header's) at
/// `now` (wall-clock epoch seconds).
pub fn read(reader: Reader, value: &str, now: u64) -> Reading {
    match reader {
        Reader::EnvoyCookie => envoy_cookie(value, now),
        Reader::EnvoyHeader => envoy_header(value),
        Reader::Grpc => grpc(value),
        Reader::Tether => match super::decode(value, &super::KeyRing::empty()) {
            Ok(d) if d.cookie.is_expired(now) => Reading::NoSession(Miss::Expired),
            Ok(d) => Reading::Pins(
                d.cookie
                    .addresses
                    .as_slice()
                    .iter()
                    .map(address::to_text)
                    .collect(),
            ),
            Err(super::DecodeError::Base64 | super::DecodeError::Quotes) => {
                Reading::NoSession(Miss::Base64)
            }
            Err(_) => Reading::NoSession(Miss::Unreadable),
        },
    }
}

/// Whether `reader` pins `endpoint` when it gets `value` at `now`: the
/// address text it looks up is the endpoint's, as every peer writes it.
pub fn honours(reader: Reader, value: &str, endpoint: SocketAddr, now: u64) -> bool {
    match read(reader, value, now) {
        Reading::Pins(list) => {
            let text = address::to_text(&endpoint);
            list.contains(&text)
        }
        Reading::NoSession(_) => false,
    }
}

/// Envoy's `Base64::decode`: padded standard base64 only (a length that is
/// not a multiple of four, or any symbol outside the alphabet, is nothing).
fn envoy_base64(value: &str) -> Option<Vec<u8>> {
    let text = value.as_bytes();
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = alloc::vec![0; decode64::decoded_len(text)];
    let n = decode64::decode(text, &mut out)?;
    out.truncate(n);
    Some(out)
}

/// Envoy's cookie reader: the cookie's value without its double quotes,
/// base64, then the protobuf `Cookie` (an empty address or a passed expiry
/// is no session), else the bytes as `ip:port`.
fn envoy_cookie(value: &str, now: u64) -> Reading {
    let v = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    let Some(bytes) = envoy_base64(v).filter(|b| !b.is_empty()) else {
        return Reading::NoSession(Miss::Base64);
    };
    match envoy_proto(&bytes) {
        Some((address, expires)) => {
            if address.is_empty() {
                Reading::NoSession(Miss::ProtobufWithoutAddress)
            } else if expires != 0 && now > expires {
                Reading::NoSession(Miss::Expired)
            } else {
                Reading::Pins(alloc::vec![String::from(address)])
            }
        }
        None => Reading::Pins(alloc::vec![String::from_utf8_lossy(&bytes).into_owned()]),
    }
}

/// Envoy's header reader: base64 of `ip:port`, no protobuf.
fn envoy_header(value: &str) -> Reading {
    match envoy_base64(value).filter(|b| !b.is_empty()) {
        Some(bytes) => Reading::Pins(alloc::vec![String::from_utf8_lossy(&bytes).into_owned()]),
        None => Reading::NoSession(Miss::Base64),
    }
}

/// C-core's reader: base64 (padded or not), the text before the first `;`
/// split on `,`.
fn grpc(value: &str) -> Reading {
    let Ok(bytes) = BASE64.decode(value) else {
        return Reading::NoSession(Miss::Base64);
    };
    let hosts = match bytes.iter().position(|b| *b == b';') {
        Some(i) => &bytes[..i],
        None => &bytes[..],
    };
    if hosts.is_empty() {
        return Reading::NoSession(Miss::Unreadable);
    }
    Reading::Pins(
        hosts
            .split(|b| *b == b',')
            .map(|h| String::from_utf8_lossy(h).into_owned())
            .collect(),
    )
}

/// Envoy's `Cookie` (proto3: 1 `address` string, 2 `expires` uint64) parsed
/// as protobuf's C++ runtime parses it: unknown fields skipped, a known
/// field with another wire type kept as unknown, the last value of a field
/// winning, a string that is not UTF-8 failing the parse. `None` when the
/// bytes are not such a message.
fn envoy_proto(bytes: &[u8]) -> Option<(&str, u64)> {
    let mut r = super::envoy::Reader::new(bytes);
    let (mut address, mut expires) = ("", 0);
    while !r.is_empty() {
        let (field, wire) = r.key().ok()?;
        match (field, wire) {
            (1, super::envoy::LENGTH_DELIMITED) => address = r.string(wire).ok()?,
            (2, super::envoy::VARINT) => expires = r.uint64(wire).ok()?,
            _ => r.skip(field, wire).ok()?,
        }
    }
    Some((address, expires))
}

/// Whether a plain `legacy` text for `addr` is read by stock Envoy's cookie
/// reader (it is by every other reader).
pub fn legacy_text_read_by_envoy(addr: SocketAddr) -> bool {
    text_read_by_envoy(address::to_text(&addr).as_bytes())
}

/// Whether stock Envoy's cookie reader falls back to reading `text` (a
/// decoded text payload) as `ip:port`: it does unless the bytes parse as its
/// protobuf `Cookie` (which, for text, never holds an address).
pub(super) fn text_read_by_envoy(text: &[u8]) -> bool {
    envoy_proto(text).is_none()
}

/// The `legacy` payload for `addr` that every cookie reader takes: the plain
/// text when Envoy's cookie reader falls back to it, else the guarded form
/// (see the module's documentation). Header values never need it.
pub fn guard_legacy(addr: SocketAddr) -> Vec<u8> {
    let text = address::to_text(&addr);
    let mut out = Vec::with_capacity(2 * text.len() + 4);
    out.extend_from_slice(text.as_bytes());
    if envoy_proto(text.as_bytes()).is_some() {
        out.extend_from_slice(b";<");
        out.push(0x0a);
        out.push(text.len() as u8);
        out.extend_from_slice(text.as_bytes());
    }
    out
}

/// The address of a guarded `legacy` payload, if `bytes` is one.
pub(super) fn guarded_address(bytes: &[u8]) -> Option<SocketAddr> {
    // Only IPv4 texts need the guard; a protobuf cookie starts with 0x0a.
    if !bytes.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let at = bytes.windows(3).position(|w| w == b";<\n")?;
    let text = core::str::from_utf8(&bytes[..at]).ok()?;
    let addr = address::parse(text).ok()?;
    (guard_legacy(addr) == bytes).then_some(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_each_format() {
        assert_eq!(
            explain(Format::Legacy, false),
            "format legacy: read by stock Envoy's cookie session state, gRPC C-core, tether"
        );
        assert_eq!(
            explain(Format::Grpc, false),
            "format grpc: read by gRPC C-core, tether; not by stock Envoy's cookie session state"
        );
        assert_eq!(
            explain(Format::Envoy, true),
            "format envoy (header): read by tether; not by stock Envoy's header session state"
        );
    }
}
