//! Upstream addresses as they appear in cookies and override headers.
//!
//! An address is `ip:port`, IPv6 in brackets (`[::1]:8080`). Lists are written
//! comma-separated, the address actually used first (gRFC A61), which is the
//! form both gRPC C-core's cookie and Envoy's `override_host` header use.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::SocketAddr;

/// Why an address (or an address list) was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressError {
    /// The list was empty.
    Empty,
    /// An entry is not `ip:port` (IPv6 in brackets).
    Invalid(String),
}

impl fmt::Display for AddressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddressError::Empty => f.write_str("no address"),
            AddressError::Invalid(v) => {
                write!(f, "{v:?} is not an ip:port address (IPv6 in brackets)")
            }
        }
    }
}

/// Parses one `ip:port` address, IPv6 in brackets. Surrounding whitespace is
/// not accepted: callers trim where a format allows it.
pub fn parse(text: &str) -> Result<SocketAddr, AddressError> {
    text.parse::<SocketAddr>()
        .map_err(|_| AddressError::Invalid(String::from(text)))
}

/// Appends the text of `addr` to `out`, exactly as its `Display` writes it.
/// IPv4 (the common case on every request's hot path) is written directly,
/// several times faster than going through the formatter.
pub fn push_text(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr {
        SocketAddr::V4(a) => {
            for (i, octet) in a.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                push_decimal(out, u32::from(octet));
            }
            out.push(b':');
            push_decimal(out, u32::from(a.port()));
        }
        SocketAddr::V6(_) => {
            let mut s = String::with_capacity(48);
            let _ = fmt::write(&mut s, format_args!("{addr}")); // cannot fail on a String
            out.extend_from_slice(s.as_bytes());
        }
    }
}

fn push_decimal(out: &mut Vec<u8>, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// A non-empty, ordered list of addresses: the primary first, then the
/// endpoint's other addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AddressList(Vec<SocketAddr>);

impl AddressList {
    /// A list holding only `primary`.
    pub fn one(primary: SocketAddr) -> Self {
        AddressList(alloc::vec![primary])
    }

    /// A list from addresses in order; `None` when `addresses` is empty.
    pub fn new(addresses: Vec<SocketAddr>) -> Option<Self> {
        if addresses.is_empty() {
            None
        } else {
            Some(AddressList(addresses))
        }
    }

    /// Parses `ip:port[,ip:port...]`. Spaces around entries are trimmed, as
    /// Envoy's override_host header reader does; empty entries are errors.
    pub fn parse(text: &str) -> Result<Self, AddressError> {
        let mut out = Vec::new();
        for part in text.split(',') {
            out.push(parse(part.trim_matches([' ', '\t']))?);
        }
        AddressList::new(out).ok_or(AddressError::Empty)
    }

    /// The address the session is pinned to.
    pub fn primary(&self) -> SocketAddr {
        self.0[0]
    }

    /// All addresses, primary first.
    pub fn as_slice(&self) -> &[SocketAddr] {
        &self.0
    }

    /// The addresses after the primary.
    pub fn others(&self) -> &[SocketAddr] {
        &self.0[1..]
    }

    /// Appends `a,b,c` (the [`fmt::Display`] form) to `out`.
    pub fn push_text(&self, out: &mut Vec<u8>) {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            push_text(out, a);
        }
    }

    /// Number of addresses (at least 1).
    #[allow(clippy::len_without_is_empty)] // never empty by construction
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Display for AddressList {
    /// `a,b,c`: the form of gRPC's cookie and Envoy's override_host header.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn parses_and_formats_v4_and_v6() {
        let l = AddressList::parse("10.0.0.1:80, [2001:db8::1]:80").unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l.to_string(), "10.0.0.1:80,[2001:db8::1]:80");
        assert_eq!(l.others().len(), 1);
    }

    #[test]
    fn push_text_writes_what_display_writes() {
        let samples = [
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.20.3.4:8080",
            "[::1]:80",
            "[2001:db8::1]:443",
            "[::ffff:1.2.3.4]:1",
            "[fe80::1%7]:9",
        ];
        for text in samples {
            let a = parse(text).unwrap();
            let mut out = Vec::new();
            push_text(&mut out, &a);
            assert_eq!(core::str::from_utf8(&out).unwrap(), a.to_string());
        }
        let list = AddressList::parse("1.2.3.4:5,[::1]:6").unwrap();
        let mut out = Vec::new();
        list.push_text(&mut out);
        assert_eq!(out, list.to_string().into_bytes());
    }

    #[test]
    fn rejects_bad_entries() {
        assert_eq!(
            AddressList::parse("10.0.0.1:80,,10.0.0.2:80"),
            Err(AddressError::Invalid(String::new()))
        );
        assert!(AddressList::parse("::1:80").is_err());
        assert!(AddressList::parse("host:80").is_err());
        assert!(AddressList::parse("10.0.0.1").is_err());
        assert!(AddressList::parse("10.0.0.1:99999").is_err());
        assert_eq!(
            parse("x").unwrap_err().to_string(),
            "\"x\" is not an ip:port address (IPv6 in brackets)"
        );
    }
}
