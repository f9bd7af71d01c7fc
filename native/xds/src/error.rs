//! Errors the XdsClient reports to watchers.

use std::fmt;

use super::resource::{ResourceKind, ValidationError};

/// An error a watcher sees, either instead of a resource (when none is
/// cached) or beside the cached one (an "ambient" error).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum XdsError {
    /// The ADS stream ended before any response arrived, or the connection
    /// to the server could not be made (gRFC A57).
    Connectivity {
        /// The server's URI as written in the bootstrap.
        server_uri: String,
        /// The node ID from the bootstrap.
        node_id: String,
        /// The gRPC status code of the failed call, e.g. `UNAVAILABLE`.
        code: String,
        /// The status message.
        message: String,
    },
    /// The server sent a version of the resource that failed validation; the
    /// version was NACKed.
    Nacked {
        /// The rejected version.
        version: String,
        /// What was wrong with it.
        error: ValidationError,
    },
    /// The server did not send the resource within the does-not-exist
    /// timeout, or removed it from a state-of-the-world response.
    DoesNotExist {
        /// Which kind of resource.
        kind: ResourceKind,
        /// Its name.
        name: String,
        /// The node ID from the bootstrap.
        node_id: String,
    },
    /// The server did not send the resource within the resource timer, and
    /// its bootstrap entry has `resource_timer_is_transient_error` (gRFC
    /// A88): a transient error, not a verdict on the resource.
    Timeout {
        /// Which kind of resource.
        kind: ResourceKind,
        /// Its name.
        name: String,
        /// The server's URI as written in the bootstrap.
        server_uri: String,
        /// The node ID from the bootstrap.
        node_id: String,
    },
    /// The server reported an error for the resource in the response's
    /// `resource_errors` (xRFC TP3, gRFC A88).
    ReceivedError {
        /// Which kind of resource.
        kind: ResourceKind,
        /// Its name.
        name: String,
        /// The status the server reported.
        code: tonic::Code,
        /// Its message.
        message: String,
        /// The node ID from the bootstrap.
        node_id: String,
    },
}

impl fmt::Display for XdsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XdsError::Connectivity {
                server_uri,
                node_id,
                code,
                message,
            } => write!(
                f,
                "xDS channel for server {server_uri}: xDS call failed with no responses received; \
                 status: {code}: {message} (node ID:{node_id})"
            ),
            XdsError::Nacked { version, error } => {
                write!(f, "version {version:?} rejected: {error}")
            }
            XdsError::DoesNotExist {
                kind,
                name,
                node_id,
            } => write!(
                f,
                "{} resource {name:?} does not exist (node ID:{node_id})",
                kind.short_name()
            ),
            XdsError::Timeout {
                kind,
                name,
                server_uri,
                node_id,
            } => write!(
                f,
                "timeout obtaining {} resource {name:?} from xDS server {server_uri} (node ID:{node_id})",
                kind.short_name()
            ),
            XdsError::ReceivedError {
                kind,
                name,
                code,
                message,
                node_id,
            } => write!(
                f,
                "{} resource {name:?}: the xDS server reported {}: {message} (node ID:{node_id})",
                kind.short_name(),
                code_name(*code)
            ),
        }
    }
}

impl std::error::Error for XdsError {}

/// The name of a gRPC status code as gRPC prints it (`UNAVAILABLE`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
