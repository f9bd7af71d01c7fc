//! What a channel notices about the session cookies its calls carry: cookies
//! stock Envoy's cookie session state would not read
//! (`tether_core::cookie::readers`), counted for [`crate::ChannelStats`] and
//! logged once per address.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tether_core::session::Pin;
use tether_core::Format;

/// The channel's cookie notes, shared by its config selectors.
#[derive(Debug, Default)]
pub(crate) struct CookieNotes {
    misreads: AtomicU64,
    /// Addresses already logged. Locked only for a misread cookie, which
    /// the channel then re-issues in a form Envoy reads.
    logged: Mutex<HashSet<SocketAddr>>,
}

impl CookieNotes {
    /// Notes a call pinned by `pin`.
    pub(crate) fn pinned(&self, target: &str, pin: &Pin) {
        if !pin.envoy_misreads {
            return;
        }
        self.misreads.fetch_add(1, Ordering::Relaxed);
        let address = pin.cookie.addresses.primary();
        let first = self
            .logged
            .lock()
            .map(|mut l| l.insert(address))
            .unwrap_or(false);
        if first {
            log::warn!(
                "{target}: a session cookie names {address} in a form stock Envoy's cookie session \
                 state does not read ({}); the channel re-issues it in the format it writes",
                if pin.format == Format::Legacy {
                    "plain legacy text that Envoy parses as a protobuf without an address"
                } else {
                    "base64 without padding"
                }
            );
        }
    }

    /// Calls pinned by such a cookie so far.
    pub(crate) fn misreads(&self) -> u64 {
        self.misreads.load(Ordering::Relaxed)
    }
}
