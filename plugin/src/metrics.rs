//! The plugin's counters in Envoy's stats, and the VM-local tally that feeds
//! them.
//!
//! Every name is fixed here: nothing from a request ever becomes part of a
//! metric name (or a label), so clients cannot make Envoy create stats.
//! Envoy shows a plugin's stats under `wasmcustom.` (`/stats`), and
//! `/stats/prometheus` prints them without that prefix and without Envoy's
//! `envoy_`, dots as underscores: `tether.session_cookie_written_new_total`
//! is scraped as `tether_session_cookie_written_new_total`.
//!
//! Each call into Envoy costs it 3,800 to 5,000 instructions (the plugin's
//! README, "Benchmark"), and one per pinned request would take wiring (b)
//! past its goal of 1.03 x its floor, so requests never call
//! `proxy_increment_metric`: they add to a [`Tally`]
//! in the VM's memory, and the root context's timer (once a second, the one
//! that refreshes the clock) hands the deltas to Envoy, one call per counter
//! that moved. Envoy's figures therefore lag the requests by at most one
//! tick.

use core::cell::Cell;

/// The plugin's counters. In header mode "session cookie" means the session
/// header: the same decisions apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counter {
    /// A request carried a valid session (decoded, verified where keys are
    /// configured, not expired) and was pinned: the override header was set.
    Pinned,
    /// A request's session cookie did not decode (bad quoting, not base64,
    /// neither a protobuf nor `addr[;cluster]` text, an invalid address):
    /// load balanced, and its response carries a new cookie.
    RefusedInvalid,
    /// A request's session cookie decoded but is not trusted under the
    /// configured keys: its MAC matches no key, a sealed value opens with no
    /// key, or it is unsigned (unsealed) while keys require it.
    RefusedUnverified,
    /// A request's session cookie had expired.
    RefusedExpired,
    /// A response set a cookie for a request without a usable session (none,
    /// or one refused above): a new session.
    WrittenNew,
    /// A response set a cookie because a host other than the session's
    /// answered (the session moved).
    WrittenMoved,
    /// A response re-issued the cookie of a session whose host answered: the
    /// cluster added once (gRFC A60), an unsigned (unsealed) value upgraded,
    /// a value verified by an older key re-signed under the first one, or a
    /// value stock Envoy misreads respelled.
    WrittenReissued,
    /// A request pinned by a cookie stock Envoy's cookie session state would
    /// not read (a plain `legacy` text it takes for a protobuf, or an
    /// unpadded value): its response re-issues the cookie in a form it reads.
    /// Also counted in [`Counter::Pinned`].
    EnvoyMisreads,
    /// A request outside the cookie's `path` (the path gate): left alone, no
    /// pin and no cookie.
    PathGateBypassed,
    /// A plugin configuration was refused (`on_configure` returned false;
    /// the log names the field).
    ConfigErrors,
    /// A call into Envoy failed: a header write or removal, the local reply,
    /// WASI randomness, the clock (unreadable or zero: the last reading stays
    /// in use; with none yet, requests are left alone), the timer, or a read
    /// answering anything but a value or "absent".
    HostCallFailures,
}

/// How many counters there are.
pub const COUNTERS: usize = Counter::ALL.len();

impl Counter {
    /// Every counter, in the order of their names' table in the README.
    pub const ALL: [Counter; 11] = [
        Counter::Pinned,
        Counter::RefusedInvalid,
        Counter::RefusedUnverified,
        Counter::RefusedExpired,
        Counter::WrittenNew,
        Counter::WrittenMoved,
        Counter::WrittenReissued,
        Counter::EnvoyMisreads,
        Counter::PathGateBypassed,
        Counter::ConfigErrors,
        Counter::HostCallFailures,
    ];

    /// The stat's name, as the plugin defines it (Envoy adds `wasmcustom.`).
    pub fn name(self) -> &'static str {
        match self {
            Counter::Pinned => "tether.session_cookie_pinned_total",
            Counter::RefusedInvalid => "tether.session_cookie_refused_invalid_total",
            Counter::RefusedUnverified => "tether.session_cookie_refused_unverified_total",
            Counter::RefusedExpired => "tether.session_cookie_refused_expired_total",
            Counter::WrittenNew => "tether.session_cookie_written_new_total",
            Counter::WrittenMoved => "tether.session_cookie_written_moved_total",
            Counter::WrittenReissued => "tether.session_cookie_written_reissued_total",
            // Named before the others; kept for the dashboards that read it.
            Counter::EnvoyMisreads => "tether.session_cookie_envoy_misreads",
            Counter::PathGateBypassed => "tether.path_gate_bypassed_requests_total",
            Counter::ConfigErrors => "tether.config_errors_total",
            Counter::HostCallFailures => "tether.host_call_failures_total",
        }
    }

    /// Its index in [`Counter::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Counts not yet handed to Envoy, one cell per counter.
#[derive(Debug)]
pub struct Tally([Cell<u64>; COUNTERS]);

impl Default for Tally {
    fn default() -> Self {
        Tally::new()
    }
}

impl Tally {
    /// All zero.
    pub const fn new() -> Self {
        Tally([const { Cell::new(0) }; COUNTERS])
    }

    /// One more `counter`.
    #[inline]
    pub fn add(&self, counter: Counter) {
        let cell = &self.0[counter.index()];
        cell.set(cell.get().saturating_add(1));
    }

    /// Takes `counter`'s count so far (zero afterwards).
    pub fn take(&self, counter: Counter) -> u64 {
        self.0[counter.index()].take()
    }

    /// Puts back a count that could not be handed over (the next flush
    /// tries again).
    pub fn restore(&self, counter: Counter, count: u64) {
        let cell = &self.0[counter.index()];
        cell.set(cell.get().saturating_add(count));
    }

    /// Hands every non-zero count to `send` (counter, delta) and keeps the
    /// ones it refuses (returns false) for the next time. Returns how many
    /// counters were sent.
    pub fn flush(&self, mut send: impl FnMut(Counter, u64) -> bool) -> usize {
        let mut sent = 0;
        for counter in Counter::ALL {
            let delta = self.take(counter);
            if delta == 0 {
                continue;
            }
            if send(counter, delta) {
                sent += 1;
            } else {
                self.restore(counter, delta);
            }
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn names_are_fixed_distinct_prometheus_names_under_tether() {
        let mut seen = Vec::new();
        for (i, c) in Counter::ALL.into_iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
            let name = c.name();
            let rest = name.strip_prefix("tether.").expect(name);
            // Valid in Prometheus once Envoy turns dots into underscores:
            // lowercase snake case, counters ending in `_total` (but the
            // one named before these).
            assert!(
                rest.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
            assert!(
                name.ends_with("_total") || c == Counter::EnvoyMisreads,
                "{name}"
            );
            assert!(!seen.contains(&name), "{name} twice");
            seen.push(name);
        }
        assert_eq!(
            Counter::EnvoyMisreads.name(),
            "tether.session_cookie_envoy_misreads"
        );
    }

    #[test]
    fn a_flush_hands_over_each_moved_counter_once_and_keeps_what_was_refused() {
        let tally = Tally::new();
        assert_eq!(tally.flush(|_, _| panic!("nothing moved")), 0);
        for _ in 0..3 {
            tally.add(Counter::Pinned);
        }
        tally.add(Counter::WrittenNew);
        tally.add(Counter::HostCallFailures);
        let mut got = Vec::new();
        // Envoy refuses the failures' increment this time.
        let sent = tally.flush(|c, d| {
            got.push((c, d));
            c != Counter::HostCallFailures
        });
        assert_eq!(sent, 2);
        assert_eq!(
            got,
            [
                (Counter::Pinned, 3),
                (Counter::WrittenNew, 1),
                (Counter::HostCallFailures, 1)
            ]
        );
        // What was sent is gone; what was refused is sent with the next.
        tally.add(Counter::HostCallFailures);
        let mut got = Vec::new();
        assert_eq!(
            tally.flush(|c, d| {
                got.push((c, d));
                true
            }),
            1
        );
        assert_eq!(got, [(Counter::HostCallFailures, 2)]);
        assert_eq!(tally.flush(|_, _| panic!("all sent")), 0);
    }
}
