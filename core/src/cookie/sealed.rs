//! Sealed cookies: the session encrypted and authenticated with
//! AES-256-GCM-SIV (RFC 8452), so the value shows a client nothing but its
//! length and the id of the key that sealed it.
//!
//! The value is standard base64 (padded) of:
//!
//! ```text
//! 0x07                  format byte (sealed, version 1)
//! key id     4 bytes    of the sealing key (see below)
//! nonce     12 bytes    chosen by the caller, random where it can be
//! ciphertext n bytes    the session as the `envoy` protobuf payload
//!                       (fields 1, 2, 100, 101; never a MAC)
//! tag       16 bytes    AES-GCM-SIV's, over the ciphertext and the first
//!                       five bytes (format byte and key id) as associated data
//! ```
//!
//! The format byte is a protobuf tag no parser accepts (field 0, wire type
//! 7) and no text: tether tells a sealed value from the other formats by it,
//! and stock Envoy and gRPC C-core never take one for a session.
//!
//! Keys: each secret of the [`KeyRing`] (at least [`MIN_SEALING_KEY_LEN`]
//! bytes) gives, through HMAC-SHA256 under the secret with two labels, a
//! 256-bit AES key and a 4-byte key id, so the id reveals nothing of the key
//! and one secret may both sign and seal. The first key of the ring seals,
//! every key opens (rotation: prepend the new key, drop the old one once its
//! cookies have expired). Opening tries only the keys whose id the value
//! names (the id is public), and the tag check is constant time.
//!
//! Nonces: this crate does no I/O, so the caller hands the nonce in
//! ([`seal`]): the plugin takes it from the host's `random_get`, the
//! JavaScript package from `crypto.getRandomValues`. AES-GCM-SIV is
//! misuse-resistant: a repeated or predictable nonce only shows that two
//! values seal the same session, never the session or the key, and forging
//! stays impossible; that is why it is used here. Values written without a
//! nonce ([`super::encode`]) use the all-zero one: deterministic, with that
//! same bound.

use aes_gcm_siv::aead::AeadInOut;
use aes_gcm_siv::{Nonce, Tag};
use alloc::string::String;
use alloc::vec::Vec;
use base64::Engine as _;

pub use super::sealing_key::{KEY_ID_LEN, MIN_SEALING_KEY_LEN};
use super::signed::{Key, KeyRing};
use super::{DecodeError, Format, SessionCookie, BASE64};

/// The first byte of every sealed payload (format sealed, version 1).
pub const FORMAT_BYTE: u8 = 0x07;
/// Bytes of the nonce.
pub const NONCE_LEN: usize = 12;
/// Bytes of the authentication tag.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed payload adds to the session's protobuf.
pub const OVERHEAD: usize = 1 + KEY_ID_LEN + NONCE_LEN + TAG_LEN;

/// Seals `cookie` under `key` with `nonce` into a cookie value (base64).
/// Fails only on a cluster name the `envoy` payload refuses.
pub fn seal(
    cookie: &SessionCookie,
    key: &Key,
    nonce: &[u8; NONCE_LEN],
) -> Result<String, super::EncodeError> {
    super::check(cookie, Format::Sealed, None)?;
    Ok(BASE64.encode(seal_bytes(cookie, key, nonce)))
}

/// The sealed payload before base64.
pub(super) fn seal_bytes(cookie: &SessionCookie, key: &Key, nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
    let sealing = key.sealing();
    let plain = super::envoy::to_bytes(cookie, None);
    let mut out = Vec::with_capacity(OVERHEAD + plain.len());
    out.push(FORMAT_BYTE);
    out.extend_from_slice(&sealing.id());
    out.extend_from_slice(nonce);
    out.extend_from_slice(&plain);
    let (header, rest) = out.split_at_mut(1 + KEY_ID_LEN);
    let text = &mut rest[NONCE_LEN..];
    // Cookies are far below AES-GCM-SIV's 2^36-byte limits, so this never
    // fails; were it to, the zero tag would make a value nothing opens.
    let tag = sealing
        .cipher
        .encrypt_inout_detached(&Nonce::from(*nonce), header, text.into())
        .unwrap_or_default();
    out.extend_from_slice(&tag);
    out
}

/// Opens a sealed payload (base64 already decoded, starting with
/// [`FORMAT_BYTE`]) with the ring: the session and the index of the key
/// that opened it. Any failure (too short, no key with its id, a tag that
/// does not verify, a payload that is no session) is
/// [`DecodeError::Sealed`], so a caller cannot tell them apart.
pub(super) fn open(bytes: &[u8], keys: &KeyRing) -> Result<(SessionCookie, usize), DecodeError> {
    if bytes.len() < OVERHEAD || bytes[0] != FORMAT_BYTE {
        return Err(DecodeError::Sealed);
    }
    let (header, rest) = bytes.split_at(1 + KEY_ID_LEN);
    let (nonce, rest) = rest.split_at(NONCE_LEN);
    let (text, tag) = rest.split_at(rest.len() - TAG_LEN);
    let id = [header[1], header[2], header[3], header[4]];
    let nonce = Nonce::try_from(nonce).map_err(|_| DecodeError::Sealed)?;
    let tag = Tag::try_from(tag).map_err(|_| DecodeError::Sealed)?;
    // Session cookies are short: opened on the stack, longer ones on the heap.
    let mut small = [0u8; 192];
    let mut large = Vec::new();
    let buf = match small.get_mut(..text.len()) {
        Some(b) => b,
        None => {
            large.resize(text.len(), 0);
            &mut large[..]
        }
    };
    for (index, key) in keys.iter().enumerate() {
        let sealing = key.sealing();
        if sealing.id() != id {
            continue;
        }
        buf.copy_from_slice(text);
        // Constant time in the tag; the buffer is left zeroed on failure.
        if sealing
            .cipher
            .decrypt_inout_detached(&nonce, header, (&mut *buf).into(), &tag)
            .is_ok()
        {
            let (cookie, _, mac) = super::envoy::parse(buf).map_err(|_| DecodeError::Sealed)?;
            // A sealed value never carries a MAC: it has the tag.
            if mac.is_some() {
                return Err(DecodeError::Sealed);
            }
            return Ok((cookie, index));
        }
    }
    Err(DecodeError::Sealed)
}

/// The key id a sealed value names, if `value` (quoted or not, padded or
/// not) is one: public, shown by tools to say which key sealed a value.
pub fn key_id(value: &str) -> Option<[u8; KEY_ID_LEN]> {
    let (inner, _) = super::unquote(value).ok()?;
    let bytes = BASE64.decode(inner).ok()?;
    if bytes.len() < OVERHEAD || bytes[0] != FORMAT_BYTE {
        return None;
    }
    Some([bytes[1], bytes[2], bytes[3], bytes[4]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::AddressList;
    use crate::cookie::{decode, encode, Signature};
    use alloc::string::ToString;
    use alloc::vec;

    const NONCE: [u8; NONCE_LEN] = [7; NONCE_LEN];

    fn key(byte: u8) -> Key {
        Key::from_secret(&[byte; 32]).unwrap()
    }

    fn session() -> SessionCookie {
        SessionCookie {
            addresses: AddressList::new(vec![
                "10.0.0.1:8080".parse().unwrap(),
                "[2001:db8::1]:8080".parse().unwrap(),
            ])
            .unwrap(),
            cluster: Some("backends/session".into()),
            expires: Some(1_800_000_120),
        }
    }

    #[test]
    fn round_trips_and_reveals_only_length_and_key_id() {
        let ring = KeyRing::new(vec![key(1)]);
        let value = seal(&session(), &key(1), &NONCE).unwrap();
        let d = decode(&value, &ring).unwrap();
        assert_eq!(d.cookie, session());
        assert_eq!(d.format, Format::Sealed);
        assert_eq!(d.signature, Signature::Valid { key: 0 });
        assert!(!d.envoy_misreads && d.padded && !d.quoted);
        let bytes = BASE64.decode(&value).unwrap();
        let plain = super::super::envoy::to_bytes(&session(), None);
        assert_eq!(bytes.len(), OVERHEAD + plain.len());
        assert_eq!(&bytes[1..5], &key(1).sealing().id());
        assert_eq!(key_id(&value), Some(key(1).sealing().id()));
        // Neither the addresses nor the cluster appear.
        for needle in [&b"10.0.0.1"[..], b"backends", b"2001"] {
            assert!(!bytes.windows(needle.len()).any(|w| w == needle));
        }
        // Another nonce: another value, the same session.
        let other = seal(&session(), &key(1), &[8; NONCE_LEN]).unwrap();
        assert_ne!(other, value);
        assert_eq!(decode(&other, &ring).unwrap().cookie, session());
    }

    #[test]
    fn every_modified_byte_and_bit_is_no_session() {
        let ring = KeyRing::new(vec![key(1)]);
        let bytes = seal_bytes(&session(), &key(1), &NONCE);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut m = bytes.clone();
                m[i] ^= 1 << bit;
                let got = decode(&BASE64.encode(&m), &ring);
                assert!(got.is_err(), "byte {i} bit {bit}: {got:?}");
            }
        }
    }

    #[test]
    fn every_truncation_and_extension_is_no_session() {
        let ring = KeyRing::new(vec![key(1)]);
        let bytes = seal_bytes(&session(), &key(1), &NONCE);
        for len in 1..bytes.len() {
            let got = decode(&BASE64.encode(&bytes[..len]), &ring);
            assert_eq!(got.unwrap_err(), DecodeError::Sealed, "{len} bytes");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            decode(&BASE64.encode(&longer), &ring).unwrap_err(),
            DecodeError::Sealed
        );
    }

    #[test]
    fn a_foreign_key_or_no_key_opens_nothing() {
        let value = seal(&session(), &key(2), &NONCE).unwrap();
        for ring in [KeyRing::new(vec![key(1)]), KeyRing::empty()] {
            assert_eq!(decode(&value, &ring).unwrap_err(), DecodeError::Sealed);
        }
        // A forged id (the right one, another key's cipher) fails the tag.
        let mut bytes = seal_bytes(&session(), &key(2), &NONCE);
        bytes[1..5].copy_from_slice(&key(1).sealing().id());
        let ring = KeyRing::new(vec![key(1)]);
        assert_eq!(
            decode(&BASE64.encode(&bytes), &ring).unwrap_err(),
            DecodeError::Sealed
        );
    }

    #[test]
    fn rotation_old_keys_open_the_first_seals() {
        let old = seal(&session(), &key(1), &NONCE).unwrap();
        let ring = KeyRing::new(vec![key(2), key(1)]);
        assert_eq!(
            decode(&old, &ring).unwrap().signature,
            Signature::Valid { key: 1 }
        );
        let new = seal(&session(), ring.signer().unwrap(), &NONCE).unwrap();
        assert_eq!(
            decode(&new, &ring).unwrap().signature,
            Signature::Valid { key: 0 }
        );
        // Once the old key is dropped, its values open no more.
        let rotated = KeyRing::new(vec![key(2)]);
        assert_eq!(decode(&old, &rotated).unwrap_err(), DecodeError::Sealed);
        assert!(decode(&new, &rotated).is_ok());
    }

    #[test]
    fn encode_without_a_nonce_is_deterministic_and_needs_a_key() {
        let ring = KeyRing::new(vec![key(1)]);
        let a = encode(&session(), Format::Sealed, ring.signer()).unwrap();
        assert_eq!(a, seal(&session(), &key(1), &[0; NONCE_LEN]).unwrap());
        assert_eq!(
            encode(&session(), Format::Sealed, None)
                .unwrap_err()
                .to_string(),
            "format sealed needs a key"
        );
    }

    #[test]
    fn an_authentic_payload_that_is_no_session_is_refused() {
        // Sealed by the right key but holding a MAC field, or garbage.
        let sealing = key(1).sealing().clone();
        for plain in [&b"\x0a\x0d10.0.0.1:8080\xb2\x06\x01x"[..], b"\xff\xff"] {
            let mut out = vec![FORMAT_BYTE];
            out.extend_from_slice(&sealing.id());
            out.extend_from_slice(&NONCE);
            let mut text = plain.to_vec();
            let tag = sealing
                .cipher
                .encrypt_inout_detached(&Nonce::from(NONCE), &out, (&mut text[..]).into())
                .unwrap();
            out.extend_from_slice(&text);
            out.extend_from_slice(&tag);
            let ring = KeyRing::new(vec![key(1)]);
            assert_eq!(
                decode(&BASE64.encode(&out), &ring).unwrap_err(),
                DecodeError::Sealed
            );
        }
    }
}
