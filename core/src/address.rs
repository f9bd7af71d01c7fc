//! Upstream addresses as they appear in cookies and override headers.
//!
//! An address is `ip:port`, IPv6 in brackets (`[::1]:8080`). Lists are written
//! comma-separated, the address actually used first (gRFC A61), which is the
//! form both gRPC C-core's cookie and Envoy's `override_host` header use.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

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
    // Every pinned request parses an address or two: the common IPv4 form is
    // read directly, several times cheaper than the general parser (notably
    // in the wasm plugin), which still decides everything else.
    if let Some(v4) = parse_v4(text.as_bytes()) {
        return Ok(SocketAddr::V4(v4));
    }
    text.parse::<SocketAddr>()
        .map_err(|_| AddressError::Invalid(String::from(text)))
}

/// `a.b.c.d:port` in plain decimal without leading zeros, or `None` for
/// anything else. What it accepts, the general parser accepts with the same
/// value; what it refuses goes to the general parser.
fn parse_v4(text: &[u8]) -> Option<SocketAddrV4> {
    let mut octets = [0u8; 4];
    let mut at = 0;
    for (i, octet) in octets.iter_mut().enumerate() {
        let (n, end) = decimal(text, at, 3)?;
        *octet = u8::try_from(n).ok()?;
        let separator = if i == 3 { b':' } else { b'.' };
        if text.get(end) != Some(&separator) {
            return None;
        }
        at = end + 1;
    }
    let (port, end) = decimal(text, at, 5)?;
    if end != text.len() {
        return None;
    }
    Some(SocketAddrV4::new(
        Ipv4Addr::from(octets),
        u16::try_from(port).ok()?,
    ))
}

/// The decimal number of 1 to `max` digits at `at` and where it ends; `None`
/// without a digit, with more than `max`, or with a leading zero.
fn decimal(text: &[u8], at: usize, max: usize) -> Option<(u32, usize)> {
    let mut n = 0u32;
    let mut end = at;
    while let Some(d) = text.get(end).filter(|b| b.is_ascii_digit()) {
        if end - at == max || (end > at && n == 0) {
            return None;
        }
        n = n * 10 + u32::from(d - b'0');
        end += 1;
    }
    (end > at).then_some((n, end))
}

/// `s` without the spaces and tabs around it: the blanks HTTP allows around
/// list entries and cookie pairs. Byte-wise, because char iteration costs far
/// more in the wasm plugin and both blanks are ASCII.
pub(crate) fn trim_blanks(s: &str) -> &str {
    let bytes = s.as_bytes();
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !blank(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |i| i + 1);
    // ASCII boundaries are always char boundaries.
    s.get(start..end).unwrap_or_default()
}

/// Where address text goes: bytes for cookie payloads, a string for headers.
trait TextOut {
    /// Appends ASCII text.
    fn ascii(&mut self, text: &[u8]);
}

impl TextOut for Vec<u8> {
    fn ascii(&mut self, text: &[u8]) {
        self.extend_from_slice(text);
    }
}

impl TextOut for String {
    fn ascii(&mut self, text: &[u8]) {
        debug_assert!(text.is_ascii());
        // Address text is ASCII: this never drops anything.
        self.push_str(core::str::from_utf8(text).unwrap_or_default());
    }
}

/// Appends the text of `addr` to `out`, exactly as its `Display` writes it.
/// IPv4 (the common case on every request's hot path) is written directly,
/// several times faster than going through the formatter.
pub fn push_text(out: &mut Vec<u8>, addr: &SocketAddr) {
    write_text(out, addr);
}

/// `ip:port` (IPv6 in brackets), as every peer writes an endpoint.
pub fn to_text(addr: &SocketAddr) -> String {
    let mut out = String::with_capacity(24);
    write_text(&mut out, addr);
    out
}

fn write_text(out: &mut impl TextOut, addr: &SocketAddr) {
    match addr {
        SocketAddr::V4(a) => {
            // At most `255.255.255.255:65535`.
            let mut text = [0u8; 21];
            let mut len = 0;
            for (i, octet) in a.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    text[len] = b'.';
                    len += 1;
                }
                len = put_decimal(&mut text, len, u16::from(octet));
            }
            text[len] = b':';
            len = put_decimal(&mut text, len + 1, a.port());
            out.ascii(&text[..len]);
        }
        SocketAddr::V6(_) => {
            let mut s = String::with_capacity(48);
            let _ = fmt::write(&mut s, format_args!("{addr}")); // cannot fail on a String
            out.ascii(s.as_bytes());
        }
    }
}

/// Writes `n` in decimal at `text[at..]`; returns where it ends. The caller
/// leaves room for five digits.
fn put_decimal(text: &mut [u8; 21], at: usize, n: u16) -> usize {
    let digits = match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        1000..=9999 => 4,
        _ => 5,
    };
    let mut rest = n;
    for i in (at..at + digits).rev() {
        text[i] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    at + digits
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
        // One entry is by far the most common list.
        let mut out = Vec::with_capacity(1);
        for part in text.split(',') {
            out.push(parse(trim_blanks(part))?);
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
        self.write_text(out);
    }

    /// `a,b,c` (the [`fmt::Display`] form), written without the formatter:
    /// the value of Envoy's `override_host` header on every pinned request.
    pub fn to_text(&self) -> String {
        let mut out = String::with_capacity(24 * self.0.len());
        self.write_text(&mut out);
        out
    }

    fn write_text(&self, out: &mut impl TextOut) {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                out.ascii(b",");
            }
            write_text(out, a);
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
    fn ipv4_fast_path_agrees_with_the_general_parser() {
        // Canonical forms take the fast path...
        for text in [
            "0.0.0.0:0",
            "127.0.0.1:8080",
            "255.255.255.255:65535",
            "10.0.0.9:1",
        ] {
            let fast = parse_v4(text.as_bytes()).map(SocketAddr::V4);
            assert_eq!(fast, Some(text.parse().unwrap()), "{text}");
        }
        // ...and what it refuses is left to the general parser.
        let refused = [
            "01.2.3.4:5",
            "1.2.3.4:05",
            "1.2.3.4:00",
            "256.1.1.1:1",
            "1.2.3.4:65536",
            "1.2.3.4:123456",
            "1.2.3:4",
            "1.2.3.4.5:6",
            "1.2.3.4:",
            "1.2.3.4",
            ".1.2.3:4",
            "1..2.3:4",
            "1.2.3.4:5 ",
            " 1.2.3.4:5",
            "1.2.3.4:+5",
            "1.2.3.1000:5",
            "[::1]:80",
        ];
        for text in refused {
            assert_eq!(parse_v4(text.as_bytes()), None, "{text}");
        }
        // Random text over the characters that matter: the fast path never
        // accepts what the general parser refuses or reads differently, and
        // `parse` answers exactly as the general parser does.
        let alphabet = b"0123456789.:0125.:[]a ";
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d_u64);
        for _ in 0..100_000 {
            let len = (next() % 24) as usize;
            let text: String = (0..len)
                .map(|_| char::from(alphabet[(next() % alphabet.len() as u64) as usize]))
                .collect();
            let general = text.parse::<SocketAddr>().ok();
            if let Some(fast) = parse_v4(text.as_bytes()) {
                assert_eq!(Some(SocketAddr::V4(fast)), general, "{text}");
            }
            assert_eq!(parse(&text).ok(), general, "{text}");
        }
        // Random canonical IPv4 addresses, which the generator above rarely builds.
        for _ in 0..20_000 {
            let n = next();
            let addr = SocketAddr::from((
                [n as u8, (n >> 8) as u8, (n >> 16) as u8, (n >> 24) as u8],
                (n >> 32) as u16,
            ));
            let text = addr.to_string();
            assert_eq!(
                parse_v4(text.as_bytes()).map(SocketAddr::V4),
                Some(addr),
                "{text}"
            );
            let mut out = Vec::new();
            push_text(&mut out, &addr);
            assert_eq!(out, text.as_bytes());
        }
    }

    #[test]
    fn to_text_writes_what_display_writes() {
        for text in [
            "1.2.3.4:5",
            "10.0.0.1:80,[2001:db8::1]:443,[::ffff:1.2.3.4]:65535",
        ] {
            let list = AddressList::parse(text).unwrap();
            assert_eq!(list.to_text(), list.to_string());
            assert_eq!(list.to_text(), text);
        }
    }

    #[test]
    fn trim_blanks_drops_only_spaces_and_tabs() {
        assert_eq!(trim_blanks(" \t a b\t "), "a b");
        assert_eq!(trim_blanks("\n a \r"), "\n a \r");
        assert_eq!(trim_blanks(" \t "), "");
        assert_eq!(trim_blanks(""), "");
        assert_eq!(trim_blanks(" é "), "é");
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
