//! Session header values the VM read recently, and what they pinned: a
//! browser sends the same `Cookie` header on every request of its session,
//! so decoding it (base64, the protobuf or a MAC, a sealed value's AES) and
//! spelling the override header once per value instead of once per request
//! takes the plugin's own work on a pinned request down to a hash and a
//! compare. One per configuration: new keys or settings start an empty one.
//!
//! Only what the value alone decides is kept: the pin and the override
//! header's value. The clock is checked on every hit (an expired cookie is
//! decoded again, and misses as the core says); nothing else of the request
//! takes part in the quick path that uses it.

use alloc::boxed::Box;
use alloc::rc::Rc;
use core::cell::RefCell;

use tether_core::session::Lookup;

/// Values kept; a new one replaces the one in its slot. Sessions beyond
/// this many in one VM decode as before, at the same cost as without it.
const SLOTS: usize = 64;

/// Longest value kept, in bytes: a browser's `Cookie` header is far
/// shorter, and the memo then holds at most 64 KiB a VM however large the
/// headers clients send (longer values decode as before).
const MAX_VALUE: usize = 1024;

/// One remembered value.
#[derive(Debug, Clone)]
struct Remembered {
    raw: Box<[u8]>,
    /// The lookup the value gave: always [`Lookup::Pinned`].
    lookup: Rc<Lookup>,
    /// The override header's value for its addresses.
    value: Rc<str>,
}

/// The memo: a direct-mapped table of [`SLOTS`] values.
#[derive(Debug, Clone)]
pub(crate) struct Memo {
    slots: RefCell<Box<[Option<Remembered>]>>,
}

impl Default for Memo {
    fn default() -> Self {
        Memo {
            slots: RefCell::new(alloc::vec![None; SLOTS].into_boxed_slice()),
        }
    }
}

impl Memo {
    /// What `raw` pinned when last seen, and the override header's value,
    /// if it is still remembered.
    pub(crate) fn get(&self, raw: &[u8]) -> Option<(Rc<Lookup>, Rc<str>)> {
        let slots = self.slots.borrow();
        let r = slots[slot(raw)].as_ref().filter(|r| same(&r.raw, raw))?;
        Some((r.lookup.clone(), r.value.clone()))
    }

    /// Remembers that `raw` pinned `lookup`, with the override `value`.
    pub(crate) fn put(&self, raw: &[u8], lookup: Rc<Lookup>, value: Rc<str>) {
        if raw.len() > MAX_VALUE {
            return;
        }
        self.slots.borrow_mut()[slot(raw)] = Some(Remembered {
            raw: raw.into(),
            lookup,
            value,
        });
    }
}

/// Whether `a` and `b` are the same bytes, compared 8 at a time: the
/// byte-wise `memcmp` a wasm build links costs several times more on a
/// cookie header's 50 to 100 bytes.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tails = a8.remainder() == b8.remainder();
    tails
        && a8.zip(b8).all(|(x, y)| {
            u64::from_ne_bytes(x.try_into().unwrap_or_default())
                == u64::from_ne_bytes(y.try_into().unwrap_or_default())
        })
}

/// The slot of `raw`: FNV-1a over its last 16 bytes and its length. The
/// tail of a cookie value differs between sessions (a MAC, a tag, a port),
/// and a collision costs only a decode.
fn slot(raw: &[u8]) -> usize {
    let tail = &raw[raw.len().saturating_sub(16)..];
    let mut h: u32 = 0x811c_9dc5 ^ raw.len() as u32;
    for &b in tail {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h as usize % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_core::session::Miss;

    #[test]
    fn same_is_byte_equality() {
        let base: alloc::vec::Vec<u8> = (0u8..40).collect();
        for len in 0..40 {
            let a = &base[..len];
            assert!(same(a, a));
            for i in 0..len {
                let mut b = a.to_vec();
                b[i] ^= 0x80;
                assert!(!same(a, &b), "{len} {i}");
            }
            assert!(!same(a, &base[..len + 1]));
        }
    }

    #[test]
    fn a_value_is_found_only_as_it_was_put_and_a_slot_holds_the_last() {
        let memo = Memo::default();
        let lookup = Rc::new(Lookup::Miss(Miss::Absent));
        assert!(memo.get(b"a=1").is_none());
        memo.put(b"a=1", lookup.clone(), "v1".into());
        assert_eq!(&*memo.get(b"a=1").unwrap().1, "v1");
        assert!(memo.get(b"a=2").is_none());
        // Two values of one slot: the later replaces the earlier.
        let first = b"x".repeat(20);
        let (mut other, mut n) = (first.clone(), 0u32);
        while slot(&other) != slot(&first) || other == first {
            n += 1;
            other = alloc::format!("{n:020}").into_bytes();
        }
        // A value longer than MAX_VALUE is not kept.
        let long = b"y".repeat(MAX_VALUE + 1);
        memo.put(&long, lookup.clone(), "long".into());
        assert!(memo.get(&long).is_none());
        memo.put(&first, lookup.clone(), "first".into());
        memo.put(&other, lookup, "other".into());
        assert!(memo.get(&first).is_none());
        assert_eq!(&*memo.get(&other).unwrap().1, "other");
    }
}
