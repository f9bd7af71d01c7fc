//! The text payloads: gRPC C-core's `addr[,addr...];cluster` and the legacy
//! plain `ip:port`.

use alloc::string::String;
use alloc::vec::Vec;

use super::{has_control, DecodeError, Format, SessionCookie};
use crate::address::AddressList;

/// The payload as text, if it is UTF-8 without control characters. A
/// protobuf payload always starts with a field tag below 0x20 for field 1
/// (`0x0a`), so the two forms cannot be confused.
pub(super) fn as_text(bytes: &[u8]) -> Option<&str> {
    // The ASCII controls first: they reject a protobuf payload at its first
    // byte, before any UTF-8 validation.
    if bytes.iter().any(|b| *b < 0x20 || *b == 0x7f) {
        return None;
    }
    let text = core::str::from_utf8(bytes).ok()?;
    (!has_control(text)).then_some(text)
}

/// Parses `addr[,addr...][;cluster]`. A `;` makes it the `grpc` form (an empty
/// cluster after it means "unknown"); a comma list without `;` is read as
/// `grpc` too, a single address as `legacy`.
pub(super) fn parse(text: &str) -> Result<(SessionCookie, Format), DecodeError> {
    let (list, cluster) = match text.split_once(';') {
        Some((list, cluster)) => (list, Some(cluster)),
        None => (text, None),
    };
    if list.is_empty() {
        return Err(DecodeError::Text);
    }
    let addresses = AddressList::parse(list).map_err(DecodeError::Address)?;
    let format = if cluster.is_some() || addresses.len() > 1 {
        Format::Grpc
    } else {
        Format::Legacy
    };
    let cluster = cluster.filter(|c| !c.is_empty()).map(String::from);
    Ok((
        SessionCookie {
            addresses,
            cluster,
            expires: None,
        },
        format,
    ))
}

/// Writes the text payload; the caller has checked the format can carry it.
pub(super) fn to_text(cookie: &SessionCookie, format: Format) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    cookie.addresses.push_text(&mut out);
    if format == Format::Grpc {
        out.push(b';');
        if let Some(c) = &cookie.cluster {
            out.extend_from_slice(c.as_bytes());
        }
    }
    out
}
