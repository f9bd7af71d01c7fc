//! What a filter on the call path is (gRPC C-core's filter stack, grpc-go's
//! interceptors): one job on every call its route turns it on for, with a
//! request side that runs once the route is known and before any pick, and
//! a response side that sees the initial metadata of the attempt that
//! committed. The channel composes them in C-core's order
//! ([`crate::channel::call`]): fault injection (A33), then the stateful
//! session (A55); the retries (A6/A44), the LB pick and the subchannel come
//! below them. A filter's config for the call comes from its route.

use std::future::Future;
use std::net::SocketAddr;

use tokio::time::Instant;
use tonic::Status;

use crate::lb::CallAttributes;

/// One call as its filters see it, from its request side to its response.
#[derive(Debug)]
pub(crate) struct Call {
    /// The call's deadline, the route's timeout included.
    pub(crate) deadline: Option<Instant>,
    /// What the LB pick will see of the call; filters add to it.
    pub(crate) attributes: CallAttributes,
    /// The session of the channel handle's cookie jar, if it has one.
    pub(crate) jar_session: Option<u64>,
    /// A filter waited (an injected delay): the routing snapshot read
    /// before it may be stale by the pick.
    pub(crate) waited: bool,
}

/// Where the attempt that committed went.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answered<'a> {
    /// The subchannel's address.
    pub(crate) address: SocketAddr,
    /// The endpoint's addresses, the picked one first, when the LB tree
    /// knows them (A61).
    pub(crate) endpoint: Option<&'a [SocketAddr]>,
    /// The cluster the route chose.
    pub(crate) cluster: &'a str,
}

/// A filter on the call path.
pub(crate) trait Filter {
    /// The filter's config for one call, from the call's route.
    type Config: ?Sized;

    /// The request side: may add to the call's pick attributes, delay the
    /// call, or end it with a status.
    fn on_request(
        &self,
        config: &Self::Config,
        call: &mut Call,
        request: &http::request::Parts,
    ) -> impl Future<Output = Result<(), Status>> + Send;

    /// The response side: the initial metadata of the attempt that
    /// committed (a trailers-only response's too).
    fn on_response(
        &self,
        config: &Self::Config,
        call: &Call,
        answered: &Answered<'_>,
        response: &mut http::response::Parts,
    );
}
