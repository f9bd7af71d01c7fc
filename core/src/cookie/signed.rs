//! Signed cookies: an HMAC-SHA256 (truncated to 128 bits) over the session's
//! canonical fields, carried in protobuf field 102 of the `envoy` format.
//!
//! A key ring holds one or more secrets: the first signs, all verify, so keys
//! can be rotated by prepending the new one and dropping the old one once its
//! cookies have expired. The MAC covers a canonical serialisation, not the wire
//! bytes, so it does not depend on field order or unknown fields:
//!
//! ```text
//! "tether-session-mac-v1" 0x00
//! expires    u64 big-endian (0 = none)
//! cluster    u32 big-endian length, UTF-8 bytes (length 0 = none)
//! addresses  u32 big-endian count, then per address: u32 length, "ip:port" text
//! ```
//!
//! Envoy ignores field 102, so a signed cookie still pins in stock Envoy.

use alloc::vec::Vec;
use core::fmt;
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use super::sealing_key::{SealingKey, KEY_ID_LEN, MIN_SEALING_KEY_LEN};
use super::{SessionCookie, Signature, BASE64};
use crate::error::{ConfigError, Problem};
use base64::Engine as _;

/// Bytes of MAC kept in a cookie.
pub const MAC_LEN: usize = 16;
/// Shortest secret accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;

/// A MAC as found in a cookie.
#[derive(Clone, PartialEq, Eq)]
pub struct Mac(pub Vec<u8>);

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mac({} bytes)", self.0.len())
    }
}

/// One secret: it signs (`envoy` format) and, when at least
/// [`super::sealing_key::MIN_SEALING_KEY_LEN`] bytes long, seals (`sealed`).
#[derive(Clone)]
pub struct Key {
    hmac: Hmac<Sha256>,
    sealing: SealingKey,
    secret_len: usize,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)") // never print secrets
    }
}

impl Key {
    /// A key from raw secret bytes (at least [`MIN_KEY_LEN`]).
    pub fn from_secret(secret: &[u8]) -> Option<Key> {
        if secret.len() < MIN_KEY_LEN {
            return None;
        }
        let hmac = Hmac::<Sha256>::new_from_slice(secret).ok()?;
        Some(Key {
            sealing: SealingKey::derive(&hmac),
            hmac,
            secret_len: secret.len(),
        })
    }

    /// The id sealed values name this key by (public: derived one way
    /// from the secret).
    pub fn sealing_id(&self) -> [u8; KEY_ID_LEN] {
        self.sealing.id()
    }

    pub(super) fn sealing(&self) -> &SealingKey {
        &self.sealing
    }

    /// A key from its base64 text form (standard alphabet, padding optional).
    pub fn from_base64(text: &str) -> Result<Key, Problem> {
        let secret = BASE64.decode(text.trim()).map_err(|_| Problem::NotBase64)?;
        Key::from_secret(&secret).ok_or(Problem::KeyTooShort(secret.len()))
    }

    /// The MAC of `cookie` under this key.
    pub fn sign(&self, cookie: &SessionCookie) -> Mac {
        let mut h = self.hmac.clone();
        feed(&mut h, cookie);
        let full = h.finalize().into_bytes();
        Mac(full[..MAC_LEN].to_vec())
    }

    fn verifies(&self, cookie: &SessionCookie, mac: &Mac) -> bool {
        if mac.0.len() != MAC_LEN {
            return false;
        }
        let mut h = self.hmac.clone();
        feed(&mut h, cookie);
        h.verify_truncated_left(&mac.0).is_ok() // constant time
    }
}

fn feed(h: &mut Hmac<Sha256>, cookie: &SessionCookie) {
    h.update(b"tether-session-mac-v1\0");
    h.update(&cookie.expires.unwrap_or(0).to_be_bytes());
    let cluster = cookie.cluster.as_deref().unwrap_or("");
    put(h, cluster.as_bytes());
    h.update(&(cookie.addresses.len() as u32).to_be_bytes());
    let mut buf = Vec::with_capacity(48);
    for a in cookie.addresses.as_slice() {
        buf.clear();
        crate::address::push_text(&mut buf, a);
        put(h, &buf);
    }
}

fn put(h: &mut Hmac<Sha256>, bytes: &[u8]) {
    h.update(&(bytes.len() as u32).to_be_bytes());
    h.update(bytes);
}

/// The signing keys: the first signs, every one verifies.
#[derive(Clone, Debug, Default)]
pub struct KeyRing {
    keys: Vec<Key>,
}

impl KeyRing {
    /// An empty ring: nothing is signed, MACs are reported as unchecked.
    pub fn empty() -> Self {
        KeyRing::default()
    }

    /// A ring from keys, signing key first.
    pub fn new(keys: Vec<Key>) -> Self {
        KeyRing { keys }
    }

    /// Parses base64 secrets; an error names the entry (`keys[1]`).
    pub fn from_base64<'a, I: IntoIterator<Item = &'a str>>(
        secrets: I,
    ) -> Result<Self, ConfigError> {
        let mut keys = Vec::new();
        for (i, s) in secrets.into_iter().enumerate() {
            // The value is a secret: the error shows only its length.
            let shown = alloc::format!("<{} characters>", s.len());
            let key = Key::from_base64(s)
                .map_err(|p| ConfigError::new(&alloc::format!("keys[{i}]"), &shown, p))?;
            keys.push(key);
        }
        Ok(KeyRing { keys })
    }

    /// Whether the ring has no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The key that signs (and seals) new cookies.
    pub fn signer(&self) -> Option<&Key> {
        self.keys.first()
    }

    /// The keys, the signing one first.
    pub fn iter(&self) -> core::slice::Iter<'_, Key> {
        self.keys.iter()
    }

    /// Parses a key file's text: one base64 secret a line, the first
    /// signing (and sealing); blank lines and lines starting with `#` are
    /// skipped. An error names the line (`line 3`) and never the secret.
    pub fn from_key_file(text: &str) -> Result<Self, ConfigError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let shown = alloc::format!("<{} characters>", line.len());
            let key = Key::from_base64(line)
                .map_err(|p| ConfigError::new(&alloc::format!("line {}", i + 1), &shown, p))?;
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(ConfigError::new("keys", "", Problem::NoKeys));
        }
        Ok(KeyRing { keys })
    }

    /// Checks that every key may seal: an error names the entry
    /// (`keys[1]`) and the secret's length only.
    pub fn check_sealing(&self) -> Result<(), ConfigError> {
        for (i, k) in self.keys.iter().enumerate() {
            if k.secret_len < MIN_SEALING_KEY_LEN {
                return Err(ConfigError::new(
                    &alloc::format!("keys[{i}]"),
                    "<not shown>",
                    Problem::SealingKeyTooShort(k.secret_len),
                ));
            }
        }
        Ok(())
    }

    /// Checks `mac` against every key.
    pub fn verify(&self, cookie: &SessionCookie, mac: &Mac) -> Signature {
        if self.keys.is_empty() {
            return Signature::Unchecked;
        }
        match self.keys.iter().position(|k| k.verifies(cookie, mac)) {
            Some(key) => Signature::Valid { key },
            None => Signature::Invalid,
        }
    }
}
