//! Connectivity states of subchannels (and of the policies above them).

use std::fmt;

/// A subchannel's or a policy's connectivity state (gRPC's, less SHUTDOWN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ConnectivityState {
    /// Not connected and not trying to.
    Idle,
    /// Trying to connect.
    Connecting,
    /// Connected: calls can go.
    Ready,
    /// The last attempt failed; backing off.
    TransientFailure,
}

impl ConnectivityState {
    /// gRPC's spelling: `IDLE`, `CONNECTING`, `READY`, `TRANSIENT_FAILURE`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectivityState::Idle => "IDLE",
            ConnectivityState::Connecting => "CONNECTING",
            ConnectivityState::Ready => "READY",
            ConnectivityState::TransientFailure => "TRANSIENT_FAILURE",
        }
    }
}

impl fmt::Display for ConnectivityState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
