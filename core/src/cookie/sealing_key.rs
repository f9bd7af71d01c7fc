//! The sealing half of a key: the AES-256-GCM-SIV key and the public key
//! id that sealed values name it by, both derived one way from the secret
//! (HMAC-SHA256 with a label each). Kept apart from the format
//! ([`super::sealed`]) and the key ring ([`super::signed`]), which both use it.

use aes_gcm_siv::aead::KeyInit;
use aes_gcm_siv::Aes256GcmSiv;
use core::fmt;
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// Bytes of the key id.
pub const KEY_ID_LEN: usize = 4;
/// Shortest secret that may seal, in bytes (AES-256 wants 256 bits).
pub const MIN_SEALING_KEY_LEN: usize = 32;

/// Labels of the two HMAC-SHA256 derivations from a secret.
const KEY_LABEL: &[u8] = b"tether-sealed-v1 key\0";
const ID_LABEL: &[u8] = b"tether-sealed-v1 key id\0";

/// The sealing half of a [`super::signed::Key`]: its id and AES-GCM-SIV
/// cipher.
#[derive(Clone)]
pub(super) struct SealingKey {
    id: [u8; KEY_ID_LEN],
    pub(super) cipher: Aes256GcmSiv,
}

impl fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealingKey(..)") // never print key material
    }
}

impl SealingKey {
    /// Derives the sealing key and id from the secret's HMAC state.
    pub(super) fn derive(secret_hmac: &Hmac<Sha256>) -> SealingKey {
        let label = |l: &[u8]| {
            let mut h = secret_hmac.clone();
            h.update(l);
            h.finalize().into_bytes()
        };
        let mut key = [0u8; 32];
        key.copy_from_slice(&label(KEY_LABEL));
        let id = label(ID_LABEL);
        SealingKey {
            id: [id[0], id[1], id[2], id[3]],
            cipher: Aes256GcmSiv::new(&key.into()),
        }
    }

    pub(super) fn id(&self) -> [u8; KEY_ID_LEN] {
        self.id
    }
}
