//! Message bytes in a gRPC body: each message is a 5-byte prefix (a
//! compressed flag and a big-endian length) and its (possibly compressed)
//! bytes. A66 counts the messages' bytes, not the prefixes; chunks may
//! split a prefix anywhere.

/// Counts the message bytes of a gRPC body fed in chunks.
#[derive(Debug, Default, Clone)]
pub(crate) struct MessageBytes {
    /// Message bytes seen so far.
    total: u64,
    /// Bytes of the current prefix read (0..5).
    prefix_read: u8,
    /// The length being read from the prefix.
    length: u32,
    /// Bytes of the current message still to come.
    left: u32,
}

impl MessageBytes {
    /// Feeds one chunk of the body.
    pub(crate) fn feed(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            if self.left > 0 {
                let n = chunk.len().min(self.left as usize);
                self.total += n as u64;
                self.left -= n as u32;
                chunk = &chunk[n..];
                continue;
            }
            let byte = chunk[0];
            chunk = &chunk[1..];
            match self.prefix_read {
                // The compressed flag.
                0 => self.length = 0,
                _ => self.length = (self.length << 8) | u32::from(byte),
            }
            self.prefix_read += 1;
            if self.prefix_read == 5 {
                self.prefix_read = 0;
                self.left = self.length;
            }
        }
    }

    /// Message bytes seen so far.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0];
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn counts_payloads_however_the_body_is_cut() {
        let mut body = frame(b"hello");
        body.extend(frame(b""));
        body.extend(frame(&[7; 300]));
        for cut in 1..body.len() {
            let mut m = MessageBytes::default();
            for chunk in body.chunks(cut) {
                m.feed(chunk);
            }
            assert_eq!(m.total(), 305, "chunks of {cut}");
        }
    }

    #[test]
    fn a_large_length_prefix_is_read_big_endian() {
        let mut m = MessageBytes::default();
        m.feed(&[1, 0, 1, 0, 0]);
        m.feed(&[0; 65536]);
        assert_eq!(m.total(), 65536);
        m.feed(&[0, 0, 0, 0, 2, 9, 9]);
        assert_eq!(m.total(), 65538);
    }
}
