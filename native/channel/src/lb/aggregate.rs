//! How a parent aggregates its children's connectivity states.

use super::ConnectivityState;

/// The state of a parent whose children are in `states`, by gRPC's rule for
/// `weighted_target` and `xds_cluster_manager`: READY if any child is READY,
/// else CONNECTING if any is, else IDLE if any is, else TRANSIENT_FAILURE
/// (also with no children at all).
pub fn aggregate_state(states: impl IntoIterator<Item = ConnectivityState>) -> ConnectivityState {
    let (mut connecting, mut idle) = (false, false);
    for s in states {
        match s {
            ConnectivityState::Ready => return ConnectivityState::Ready,
            ConnectivityState::Connecting => connecting = true,
            ConnectivityState::Idle => idle = true,
            ConnectivityState::TransientFailure => {}
        }
    }
    if connecting {
        ConnectivityState::Connecting
    } else if idle {
        ConnectivityState::Idle
    } else {
        ConnectivityState::TransientFailure
    }
}

#[cfg(test)]
mod tests {
    use super::ConnectivityState::*;
    use super::*;

    #[test]
    fn ready_wins_then_connecting_then_idle() {
        assert_eq!(aggregate_state([TransientFailure, Idle, Ready]), Ready);
        assert_eq!(
            aggregate_state([TransientFailure, Idle, Connecting]),
            Connecting
        );
        assert_eq!(aggregate_state([TransientFailure, Idle]), Idle);
        assert_eq!(
            aggregate_state([TransientFailure, TransientFailure]),
            TransientFailure
        );
    }

    #[test]
    fn no_children_is_transient_failure() {
        assert_eq!(aggregate_state([]), TransientFailure);
    }
}
