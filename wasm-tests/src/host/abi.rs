//! Numbers and encodings of the proxy-wasm ABI v0.2.1 and the WASI subset a
//! `wasm32-wasip1` plugin imports.

use std::fmt;

/// `proxy_status_t`: what a proxy-wasm hostcall returns.
pub mod status {
    /// Success.
    pub const OK: i32 = 0;
    /// No such key, property or buffer.
    pub const NOT_FOUND: i32 = 1;
    /// Unknown enum value, or a map or buffer not available now.
    pub const BAD_ARGUMENT: i32 = 2;
    /// Invalid pointer or size, or the guest could not allocate.
    pub const INVALID_MEMORY_ACCESS: i32 = 6;
    /// Compare-and-swap value does not match.
    pub const CAS_MISMATCH: i32 = 8;
}

/// `wasi_errno_t` values the host returns.
pub mod errno {
    /// Success.
    pub const SUCCESS: i32 = 0;
    /// Bad file descriptor.
    pub const BADF: i32 = 8;
    /// Bad address.
    pub const FAULT: i32 = 21;
    /// Invalid argument.
    pub const INVAL: i32 = 28;
    /// Function not supported.
    pub const NOSYS: i32 = 52;
    /// Not supported (clock id).
    pub const NOTSUP: i32 = 58;
}

/// `proxy_log_level_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// 0
    Trace,
    /// 1
    Debug,
    /// 2
    Info,
    /// 3
    Warn,
    /// 4
    Error,
    /// 5
    Critical,
}

impl LogLevel {
    /// The level for an ABI number, if it is one.
    pub fn from_abi(n: i32) -> Option<LogLevel> {
        Some(match n {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }

    /// Its ABI number.
    pub fn to_abi(self) -> i32 {
        self as i32
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
        })
    }
}

/// `proxy_action_t`: what an HTTP callback returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// 0: go on with the next filter.
    Continue,
    /// 1: stop iteration until the plugin resumes the stream.
    Pause,
    /// Any other number (an ABI violation).
    Other(i32),
}

impl Action {
    /// The action for an ABI number.
    pub fn from_abi(n: i32) -> Action {
        match n {
            0 => Action::Continue,
            1 => Action::Pause,
            n => Action::Other(n),
        }
    }
}

/// `proxy_map_type_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapType {
    /// 0
    RequestHeaders,
    /// 1
    RequestTrailers,
    /// 2
    ResponseHeaders,
    /// 3
    ResponseTrailers,
    /// 4
    GrpcInitialMetadata,
    /// 5
    GrpcTrailingMetadata,
    /// 6
    HttpCallResponseHeaders,
    /// 7
    HttpCallResponseTrailers,
}

impl MapType {
    /// The map for an ABI number, if it is one.
    pub fn from_abi(n: i32) -> Option<MapType> {
        Some(match n {
            0 => MapType::RequestHeaders,
            1 => MapType::RequestTrailers,
            2 => MapType::ResponseHeaders,
            3 => MapType::ResponseTrailers,
            4 => MapType::GrpcInitialMetadata,
            5 => MapType::GrpcTrailingMetadata,
            6 => MapType::HttpCallResponseHeaders,
            7 => MapType::HttpCallResponseTrailers,
            _ => return None,
        })
    }
}

/// `proxy_buffer_type_t` values the host serves.
pub mod buffer {
    /// Read in `proxy_on_vm_start`.
    pub const VM_CONFIGURATION: i32 = 6;
    /// Read in `proxy_on_configure`.
    pub const PLUGIN_CONFIGURATION: i32 = 7;
    /// The largest defined buffer type.
    pub const MAX: i32 = 8;
}

/// `proxy_metric_type_t` bound.
pub const METRIC_TYPE_MAX: i32 = 2;

/// `proxy_stream_type_t` bound.
pub const STREAM_TYPE_MAX: i32 = 3;

/// Largest `random_get` request served (Envoy's cap).
pub const RANDOM_GET_MAX: u32 = 64 * 1024;

/// Header or metadata pairs, in order; names and values are bytes.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Serialises `pairs` the ABI way: a little-endian u32 count, then a u32
/// pair of sizes per entry, then each name and value followed by a NUL.
pub fn encode_pairs(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let data: usize = pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + pairs.len() * 8 + data);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Parses serialised pairs; `None` when the bytes are not a well-formed map.
/// An empty input and a single NUL byte are both the empty map.
pub fn decode_pairs(bytes: &[u8]) -> Option<Pairs> {
    if bytes.is_empty() || bytes == [0] {
        return Some(Vec::new());
    }
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = word(0)?;
    // Each entry needs 8 bytes of sizes and 2 NULs: reject absurd counts early.
    if count > bytes.len() / 10 + 1 {
        return None;
    }
    let mut pos = 4usize.checked_add(count.checked_mul(8)?)?;
    let mut pairs = Vec::with_capacity(count);
    for i in 0..count {
        let klen = word(4 + i * 8)?;
        let vlen = word(8 + i * 8)?;
        let key = bytes.get(pos..pos.checked_add(klen)?)?.to_vec();
        pos += klen;
        if bytes.get(pos) != Some(&0) {
            return None;
        }
        pos += 1;
        let value = bytes.get(pos..pos.checked_add(vlen)?)?.to_vec();
        pos += vlen;
        if bytes.get(pos) != Some(&0) {
            return None;
        }
        pos += 1;
        pairs.push((key, value));
    }
    Some(pairs)
}

/// Splits a property path (segments separated by NUL) for display.
pub fn path_display(path: &[u8]) -> String {
    String::from_utf8_lossy(path).replace('\0', ".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_match_the_spec_example() {
        let pairs = vec![
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), b"22".to_vec()),
        ];
        let bytes = encode_pairs(&pairs);
        let mut expect = vec![2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0];
        expect.extend_from_slice(b"a\x001\x00b\x0022\x00");
        assert_eq!(bytes, expect);
        assert_eq!(decode_pairs(&bytes), Some(pairs));
        assert_eq!(decode_pairs(&[]), Some(vec![]));
        assert_eq!(decode_pairs(&[0]), Some(vec![]));
    }

    #[test]
    fn malformed_pairs_are_rejected() {
        let good = encode_pairs(&[(b"k".to_vec(), b"v".to_vec())]);
        for cut in 1..good.len() {
            assert_eq!(decode_pairs(&good[..cut]), None, "cut at {cut}");
        }
        let mut no_nul = good.clone();
        let last = no_nul.len() - 1;
        no_nul[last] = b'x';
        assert_eq!(decode_pairs(&no_nul), None);
        assert_eq!(decode_pairs(&[0xff, 0xff, 0xff, 0xff]), None);
    }
}
