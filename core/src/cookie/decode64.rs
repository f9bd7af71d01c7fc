//! Base64 decoding of cookie values, on every pinned request.
//!
//! Padding is all or nothing: `=` only where it completes the last quantum.
//! Beyond that rule it accepts exactly what [`super::BASE64`] (the `base64`
//! crate's engine, standard alphabet, padding indifferent) accepts, with the
//! same bytes; a test holds the two equal. Written by hand because the
//! engine's generic decoder costs several times more in the wasm plugin, and
//! because decoding into a buffer on the stack saves the plugin an allocation
//! per request.

/// Marks a byte outside the alphabet in [`SYMBOLS`].
const INVALID: u8 = 0xff;

/// The 6-bit value of each byte of the standard alphabet.
const SYMBOLS: [u8; 256] = {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < alphabet.len() {
        table[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// The most bytes `text` can decode to.
pub(super) fn decoded_len(text: &[u8]) -> usize {
    text.len().div_ceil(4) * 3
}

/// Decodes `text` into `out` (at least [`decoded_len`] bytes) and returns how
/// many bytes it wrote; `None` when `text` is not canonical base64: a byte
/// outside the alphabet, padding that does not complete the last quantum,
/// a length no quantum has, or nonzero bits left over in the last symbol.
pub(super) fn decode(text: &[u8], out: &mut [u8]) -> Option<usize> {
    let body = strip_padding(text)?;
    let quads = body.chunks_exact(4);
    let tail = quads.remainder();
    let (whole, rest) = out.split_at_mut_checked(quads.len() * 3)?;
    for (quad, bytes) in quads.zip(whole.chunks_exact_mut(3)) {
        let v = sextets(quad)?;
        bytes.copy_from_slice(&[(v >> 16) as u8, (v >> 8) as u8, v as u8]);
    }
    let v = sextets(tail)?;
    let last: &[u8] = match tail.len() {
        0 => &[],
        // 12 bits for one byte: the last 4 must be zero.
        2 if v & 0x0f == 0 => &[(v >> 4) as u8],
        // 18 bits for two bytes: the last 2 must be zero.
        3 if v & 0x03 == 0 => &[(v >> 10) as u8, (v >> 2) as u8],
        // Leftover bits, or one symbol, which is not a whole byte.
        _ => return None,
    };
    rest.get_mut(..last.len())?.copy_from_slice(last);
    Some(whole.len() + last.len())
}

/// The symbols of `quad` (at most four) as one big-endian number of 6 bits
/// each; `None` when one is outside the alphabet.
fn sextets(quad: &[u8]) -> Option<u32> {
    let mut v = 0;
    let mut invalid = 0;
    for b in quad {
        let s = SYMBOLS[usize::from(*b)];
        invalid |= s;
        v = (v << 6) | u32::from(s);
    }
    // Only INVALID has the high bit set: one check for the whole quad.
    (invalid & 0x80 == 0).then_some(v)
}

/// `text` without its padding. Padding is optional, but when present it is
/// one or two `=` completing a last quantum of four.
fn strip_padding(text: &[u8]) -> Option<&[u8]> {
    let pad = text.iter().rev().take_while(|b| **b == b'=').count();
    if pad == 0 {
        return Some(text);
    }
    let body = &text[..text.len() - pad];
    let fits = text.len().is_multiple_of(4) && matches!((pad, body.len() % 4), (1, 3) | (2, 2));
    fits.then_some(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cookie::BASE64;
    use alloc::string::String;
    use alloc::vec;
    use alloc::vec::Vec;
    use base64::Engine as _;

    fn ours(text: &[u8]) -> Option<Vec<u8>> {
        let mut out = vec![0; decoded_len(text)];
        let n = decode(text, &mut out)?;
        out.truncate(n);
        Some(out)
    }

    /// The engine, after the all-or-nothing padding rule (the engine alone
    /// also reads `AA=`).
    fn same_as_engine(text: &[u8]) {
        let partial_padding = !text.len().is_multiple_of(4) && text.contains(&b'=');
        let engine = (!partial_padding)
            .then(|| BASE64.decode(text).ok())
            .flatten();
        assert_eq!(ours(text), engine, "{:?}", String::from_utf8_lossy(text));
    }

    #[test]
    fn decodes_what_the_engine_decodes() {
        // Every string of up to 5 bytes over symbols that exercise the
        // leftover bits, padding and bytes outside the alphabet.
        let symbols = b"AQBg/+=z.";
        let mut text = Vec::new();
        for len in 0..=5u32 {
            for mut n in 0..symbols.len().pow(len) {
                text.clear();
                for _ in 0..len {
                    text.push(symbols[n % symbols.len()]);
                    n /= symbols.len();
                }
                same_as_engine(&text);
            }
        }
        // Random text of every length up to 40, and real payloads.
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/==-_ ";
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d_u64);
        for _ in 0..50_000 {
            let len = (next() % 41) as usize;
            let text: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            same_as_engine(&text);
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let encoded = BASE64.encode(&bytes);
            same_as_engine(encoded.as_bytes());
            same_as_engine(encoded.trim_end_matches('=').as_bytes());
        }
    }

    #[test]
    fn refuses_a_short_buffer() {
        let mut out = [0u8; 2];
        assert_eq!(decode(b"QUJD", &mut out), None);
        let mut out = [0u8; 3];
        assert_eq!(decode(b"QUJD", &mut out), Some(3));
        assert_eq!(&out, b"ABC");
    }
}
