//! A wait bounded by the call's deadline, shared by the filters that delay
//! a call (an injected fault's delay, a retry's backoff).

use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

/// Waits `delay` (a retry's backoff, an injected fault), failing the call
/// with DEADLINE_EXCEEDED ("deadline exceeded {what}") if its deadline
/// comes first.
pub(crate) async fn sleep_within(
    delay: Duration,
    deadline: Option<Instant>,
    what: &str,
) -> Result<(), Status> {
    let until = Instant::now() + delay;
    match deadline {
        Some(d) if d <= until => {
            tokio::time::sleep_until(d).await;
            Err(Status::deadline_exceeded(format!(
                "deadline exceeded {what}"
            )))
        }
        _ => {
            tokio::time::sleep_until(until).await;
            Ok(())
        }
    }
}
