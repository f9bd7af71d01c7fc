//! The session cookie: one model, three wire formats, optional signing.
//!
//! A [`SessionCookie`] names the upstream a session is pinned to: an ordered
//! [`AddressList`] (primary first, then the endpoint's other addresses), the
//! cluster that served it and an expiry. Its value on the wire is always
//! base64 (standard alphabet) of one of:
//!
//! | [`Format`] | payload before base64 | read by |
//! |---|---|---|
//! | `envoy` | protobuf: 1 `address`, 2 `expires`, tether's 100 `cluster`, 101 `extra_addresses`, 102 `mac` | Envoy's cookie session state, tether |
//! | `grpc` | `addr[,addr...];cluster` (`;` always written) | gRPC C-core (A55/A60/A61), tether |
//! | `legacy` | `ip:port` | Envoy (deprecated path), gRPC C-core, tether |
//! | `sealed` | `0x07`, key id, nonce, AES-256-GCM-SIV of the `envoy` payload, tag ([`sealed`]) | tether with the key |
//!
//! [`decode`] reads all four, whichever the configured write format is:
//! - surrounding double quotes are removed (Envoy quotes, C-core does not);
//! - base64 may be padded or unpadded: C-core accepts unpadded values and so
//!   does tether, while Envoy drops them; tether always writes padded values;
//! - a payload starting with [`sealed::FORMAT_BYTE`] is opened with the
//!   keys (a value no key opens is [`DecodeError::Sealed`]);
//! - a payload that is printable text is the `grpc`/`legacy` text form,
//!   anything else is the protobuf form (Envoy's first byte is always a
//!   field tag, never printable);
//! - anything malformed is a [`DecodeError`]: callers treat it as "no
//!   session"; nothing here panics on any input.
//!
//! [`encode`] writes one format and refuses (rather than silently dropping)
//! what the format cannot carry, e.g. a cluster in `legacy`. Signing (see
//! [`signed`]) puts a MAC in protobuf field 102, so only `envoy` carries one.

mod decode64;
mod envoy;
pub mod readers;
pub mod sealed;
mod sealing_key;
pub mod signed;
mod text;

use alloc::string::String;
use alloc::vec::Vec;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use core::fmt;
use core::str::FromStr;

use crate::address::{trim_blanks, AddressError, AddressList};
pub use signed::{Key, KeyRing};

/// Standard alphabet; reads padded and unpadded input, writes padded.
pub(crate) const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Where a session is pinned: the parsed content of a session cookie.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionCookie {
    /// Addresses of the endpoint, the one to use first.
    pub addresses: AddressList,
    /// The cluster that served the session (gRFC A60), when known.
    pub cluster: Option<String>,
    /// Wall-clock expiry in epoch seconds; `None` never expires.
    pub expires: Option<u64>,
}

impl SessionCookie {
    /// A cookie for one address with no cluster and no expiry.
    pub fn new(addresses: AddressList) -> Self {
        SessionCookie {
            addresses,
            cluster: None,
            expires: None,
        }
    }

    /// Whether the cookie has expired at `now` (epoch seconds). As in Envoy,
    /// a cookie is still valid during its `expires` second. An expiry below
    /// [`WALL_CLOCK_FLOOR`] is not a date: Envoy 1.36 to 1.38 wrote seconds
    /// since their host booted, which no other process can judge, so such a
    /// cookie does not expire here (its `Max-Age` bounds the client's copy).
    pub fn is_expired(&self, now: u64) -> bool {
        self.expires
            .is_some_and(|e| e >= WALL_CLOCK_FLOOR && now > e)
    }
}

/// The smallest `expires` read as wall-clock epoch seconds (2001-09-09):
/// below it, an Envoy before 1.39 counted seconds since its host booted.
pub const WALL_CLOCK_FLOOR: u64 = 1_000_000_000;

/// A session cookie wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// Envoy's protobuf cookie, with tether's extension fields.
    #[default]
    Envoy,
    /// gRPC C-core's `addr[,addr];cluster` text.
    Grpc,
    /// Plain `ip:port`, understood by every reader.
    Legacy,
    /// The session encrypted and authenticated under the key ring
    /// ([`sealed`]): read by tether alone, and only with the key.
    Sealed,
}

impl Format {
    /// All formats, for iteration in tests and tools.
    pub const ALL: [Format; 4] = [Format::Envoy, Format::Grpc, Format::Legacy, Format::Sealed];

    /// The name used in configuration and output: `envoy`, `grpc`,
    /// `legacy`, `sealed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Envoy => "envoy",
            Format::Grpc => "grpc",
            Format::Legacy => "legacy",
            Format::Sealed => "sealed",
        }
    }

    /// Whether the format can hold a cluster name.
    pub fn carries_cluster(self) -> bool {
        matches!(self, Format::Envoy | Format::Grpc | Format::Sealed)
    }

    /// Whether the format can hold more than one address.
    pub fn carries_address_list(self) -> bool {
        matches!(self, Format::Envoy | Format::Grpc | Format::Sealed)
    }

    /// Whether the format can hold an expiry.
    pub fn carries_expiry(self) -> bool {
        matches!(self, Format::Envoy | Format::Sealed)
    }

    /// Whether values in this format are written and read with keys
    /// (`sealed`: keys are required).
    pub fn is_sealed(self) -> bool {
        self == Format::Sealed
    }

    /// Whether the format can hold a MAC.
    pub fn carries_mac(self) -> bool {
        self == Format::Envoy
    }

    /// The expiry a cookie minted at `now` (epoch seconds) with `ttl` carries
    /// in this format: `now + ttl` in whole seconds when the format holds an
    /// expiry and the ttl is at least a second; otherwise none, and only the
    /// `Set-Cookie`'s `Max-Age` bounds the session (as in gRPC C-core).
    pub fn expiry_after(self, ttl: core::time::Duration, now: u64) -> Option<u64> {
        let secs = ttl.as_secs();
        (self.carries_expiry() && secs > 0).then(|| now.saturating_add(secs))
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown format name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFormat(pub String);

impl fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a cookie format (envoy, grpc, legacy, sealed)",
            self.0
        )
    }
}

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| UnknownFormat(String::from(s)))
    }
}

/// The MAC state of a decoded cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signature {
    /// The cookie carries no MAC.
    Unsigned,
    /// The MAC (or a sealed value's tag) verified with the key at this
    /// index of the key ring.
    Valid {
        /// Index of the verifying key (0 is the signing key).
        key: usize,
    },
    /// The MAC matches no key of the ring: the cookie must be ignored.
    Invalid,
    /// The cookie carries a MAC but no keys were given to check it.
    Unchecked,
}

/// A successfully decoded session cookie value and how it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The session it names.
    pub cookie: SessionCookie,
    /// The wire format it was written in.
    pub format: Format,
    /// Its MAC state.
    pub signature: Signature,
    /// Whether the value was in double quotes.
    pub quoted: bool,
    /// Whether its base64 carried `=` padding (or needed none).
    pub padded: bool,
    /// Whether stock Envoy's cookie session state would not read this value
    /// as the session it is: a plain `legacy` text that Envoy parses as a
    /// protobuf without an address (see [`readers`]), or an unpadded value.
    pub envoy_misreads: bool,
}

/// Why a cookie value names no session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The value is empty.
    Empty,
    /// An opening or closing double quote without its pair, or a quote inside.
    Quotes,
    /// Not standard base64.
    Base64,
    /// Base64 of a protobuf that does not parse.
    Proto,
    /// A protobuf cookie without an address.
    MissingAddress,
    /// An address in the cookie is not `ip:port`.
    Address(AddressError),
    /// Text that is not `addr[,addr...][;cluster]`.
    Text,
    /// A cluster name with control characters (never written by an encoder).
    Cluster,
    /// A sealed value that no configured key opens: modified, truncated,
    /// sealed under another key, or no keys given.
    Sealed,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Empty => f.write_str("the cookie value is empty"),
            DecodeError::Quotes => f.write_str("the cookie value has unbalanced double quotes"),
            DecodeError::Base64 => f.write_str("the cookie value is not standard base64"),
            DecodeError::Proto => {
                f.write_str("the cookie payload is neither text nor a valid protobuf")
            }
            DecodeError::MissingAddress => {
                f.write_str("the protobuf cookie has no address (field 1)")
            }
            DecodeError::Address(e) => write!(f, "the cookie names an invalid address: {e}"),
            DecodeError::Text => f.write_str("the cookie text is not addr[,addr...][;cluster]"),
            DecodeError::Cluster => {
                f.write_str("the cookie's cluster name contains control characters")
            }
            DecodeError::Sealed => f.write_str(
                "the sealed cookie opens with no configured key (modified, truncated or sealed under another key)",
            ),
        }
    }
}

impl DecodeError {
    /// A stable short name of the error kind (`empty`, `quotes`, `base64`,
    /// `proto`, `missing-address`, `address`, `text`, `cluster`, `sealed`), for bindings and test
    /// vectors that must match on the kind rather than on the message text.
    pub fn code(&self) -> &'static str {
        match self {
            DecodeError::Empty => "empty",
            DecodeError::Quotes => "quotes",
            DecodeError::Base64 => "base64",
            DecodeError::Proto => "proto",
            DecodeError::MissingAddress => "missing-address",
            DecodeError::Address(_) => "address",
            DecodeError::Text => "text",
            DecodeError::Cluster => "cluster",
            DecodeError::Sealed => "sealed",
        }
    }
}

/// Why a cookie could not be written in a format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// The cookie holds something the format has no place for.
    Unrepresentable {
        /// The format asked for.
        format: Format,
        /// What it cannot carry: `cluster`, `extra addresses`, `expires` or `mac`.
        field: &'static str,
    },
    /// The cluster name is empty or contains control characters.
    Cluster(String),
    /// The format is written with a key and none was given.
    NoKey {
        /// The format asked for.
        format: Format,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::Unrepresentable { format, field } => {
                write!(f, "format {format} cannot carry {field}")
            }
            EncodeError::Cluster(c) => {
                write!(f, "cluster {c:?} is empty or contains control characters")
            }
            EncodeError::NoKey { format } => write!(f, "format {format} needs a key"),
        }
    }
}

/// Decodes a cookie value (quoted or not) in any format. `keys` verify a MAC
/// when the value carries one and open a sealed value; pass an empty ring
/// when neither is used.
pub fn decode(value: &str, keys: &KeyRing) -> Result<Decoded, DecodeError> {
    let (inner, quoted) = unquote(value)?;
    if inner.is_empty() {
        return Err(DecodeError::Empty);
    }
    let padded = inner.len() % 4 == 0;
    // Padding is all or nothing (see `decode64`). Session cookies are short:
    // they are decoded on the stack, longer values on the heap.
    let mut small = [0u8; 192];
    let mut large = Vec::new();
    let buf = if decode64::decoded_len(inner.as_bytes()) <= small.len() {
        &mut small[..]
    } else {
        large.resize(decode64::decoded_len(inner.as_bytes()), 0);
        &mut large[..]
    };
    let len = decode64::decode(inner.as_bytes(), buf).ok_or(DecodeError::Base64)?;
    let bytes = buf.get(..len).ok_or(DecodeError::Base64)?;
    let mut envoy_misreads = !padded;
    if bytes.first() == Some(&sealed::FORMAT_BYTE) {
        let (cookie, key) = sealed::open(bytes, keys)?;
        // Stock Envoy reads no sealed value in any spelling: nothing to respell.
        return Ok(Decoded {
            cookie,
            format: Format::Sealed,
            signature: Signature::Valid { key },
            quoted,
            padded,
            envoy_misreads: false,
        });
    }
    let (cookie, format, mac) = if let Some(text) = text::as_text(bytes) {
        let (cookie, format) = text::parse(text)?;
        if format == Format::Legacy && !envoy_misreads {
            // The bytes as sent are what Envoy parses.
            envoy_misreads = !readers::text_read_by_envoy(bytes);
        }
        (cookie, format, None)
    } else if let Some(addr) = readers::guarded_address(bytes) {
        (
            SessionCookie::new(AddressList::one(addr)),
            Format::Legacy,
            None,
        )
    } else {
        envoy::parse(bytes)?
    };
    let signature = match mac {
        None => Signature::Unsigned,
        Some(mac) => keys.verify(&cookie, &mac),
    };
    Ok(Decoded {
        cookie,
        format,
        signature,
        quoted,
        padded,
        envoy_misreads,
    })
}

/// Encodes `cookie` as a base64 cookie value in `format`, signed with
/// `signer` when given. Fails when the format cannot carry part of the
/// cookie. A `legacy` address whose plain text stock Envoy's cookie reader
/// would take for a protobuf is written in the guarded form every cookie
/// reader takes (see [`readers`]). `sealed` seals with `signer` and the
/// all-zero nonce (deterministic; [`sealed::seal`] takes a random one).
pub fn encode(
    cookie: &SessionCookie,
    format: Format,
    signer: Option<&Key>,
) -> Result<String, EncodeError> {
    encode_for(cookie, format, signer, true)
}

/// [`encode`] for a header value (a session header, Envoy's header session
/// state): `legacy` is always the plain text, which header readers take as
/// it is.
pub fn encode_header(
    cookie: &SessionCookie,
    format: Format,
    signer: Option<&Key>,
) -> Result<String, EncodeError> {
    encode_for(cookie, format, signer, false)
}

fn encode_for(
    cookie: &SessionCookie,
    format: Format,
    signer: Option<&Key>,
    guard: bool,
) -> Result<String, EncodeError> {
    check(cookie, format, signer)?;
    Ok(match format {
        Format::Sealed => {
            let key = signer.ok_or(EncodeError::NoKey { format })?;
            BASE64.encode(sealed::seal_bytes(cookie, key, &[0; sealed::NONCE_LEN]))
        }
        Format::Envoy => BASE64.encode(envoy::to_bytes(cookie, signer)),
        Format::Legacy if guard => BASE64.encode(readers::guard_legacy(cookie.addresses.primary())),
        Format::Grpc | Format::Legacy => BASE64.encode(text::to_text(cookie, format)),
    })
}

/// Whether `format` can carry everything `cookie` holds.
fn check(cookie: &SessionCookie, format: Format, signer: Option<&Key>) -> Result<(), EncodeError> {
    let unrepresentable = |field| Err(EncodeError::Unrepresentable { format, field });
    if let Some(c) = &cookie.cluster {
        if c.is_empty() || has_control(c) {
            return Err(EncodeError::Cluster(c.clone()));
        }
        if !format.carries_cluster() {
            return unrepresentable("cluster");
        }
    }
    if cookie.addresses.len() > 1 && !format.carries_address_list() {
        return unrepresentable("extra addresses");
    }
    if cookie.expires.is_some() && !format.carries_expiry() {
        return unrepresentable("expires");
    }
    if signer.is_some() && !format.carries_mac() && !format.is_sealed() {
        return unrepresentable("mac");
    }
    Ok(())
}

/// Whether `s` holds a control character ([`char::is_control`]: U+0000 to
/// U+001F and U+007F to U+009F). Byte-wise, as char iteration costs far more
/// in the wasm plugin: in UTF-8 the second range is `0xC2` then `0x80..=0x9F`.
pub(crate) fn has_control(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter().enumerate().any(|(i, &c)| {
        c < 0x20 || c == 0x7f || (c == 0xc2 && matches!(b.get(i + 1), Some(0x80..=0x9f)))
    })
}

/// Strips one pair of surrounding double quotes and surrounding spaces.
fn unquote(value: &str) -> Result<(&str, bool), DecodeError> {
    let v = trim_blanks(value);
    let (inner, quoted) = match v.strip_prefix('"') {
        Some(rest) => (rest.strip_suffix('"').ok_or(DecodeError::Quotes)?, true),
        None => (v, false),
    };
    if inner.contains('"') {
        return Err(DecodeError::Quotes);
    }
    Ok((inner, quoted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn decode_error_codes_name_the_kind() {
        let ring = KeyRing::empty();
        let code = |v: &str| decode(v, &ring).unwrap_err().code();
        assert_eq!(code(""), "empty");
        assert_eq!(code("\"abc"), "quotes");
        assert_eq!(code("not base64!"), "base64");
        assert_eq!(code("CiAxMjcuMC4w"), "proto");
        assert_eq!(code("EAU="), "missing-address");
        assert_eq!(code("aGVsbG8="), "address");
        assert_eq!(code("O2NsdXN0ZXI="), "text");
    }

    #[test]
    fn has_control_is_char_is_control() {
        let mut buf = [0u8; 4];
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let one = c.encode_utf8(&mut buf);
            assert_eq!(has_control(one), c.is_control(), "{c:?}");
        }
        assert!(has_control("ok\u{9f}"));
        assert!(!has_control("ok\u{a0}é"));
    }

    #[test]
    fn expiry_only_where_the_format_holds_one() {
        let ttl = Duration::from_millis(120_900);
        assert_eq!(Format::Envoy.expiry_after(ttl, 1_000), Some(1_120));
        assert_eq!(
            Format::Envoy.expiry_after(Duration::from_millis(999), 1_000),
            None
        );
        assert_eq!(Format::Envoy.expiry_after(ttl, u64::MAX), Some(u64::MAX));
        assert_eq!(Format::Grpc.expiry_after(ttl, 1_000), None);
        assert_eq!(Format::Legacy.expiry_after(ttl, 1_000), None);
    }
}
