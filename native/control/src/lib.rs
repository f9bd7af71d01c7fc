//! tether's control plane: an ADS management server that serves snapshots
//! translated from a YAML file a person writes.
//!
//! - [`admin`]: the admin listener (`--admin`): the status page, `/drain`,
//!   `/load`, `/metrics` for Prometheus.
//! - [`dns`]: endpoints written as `NAME:PORT`: resolving the names,
//!   keeping the last good addresses through DNS trouble, draining the
//!   addresses that leave an answer.
//! - [`drain`]: removing DRAINING endpoints once idle or after
//!   `maxDrain` (a service's `drain`).
//! - [`fault`]: a route's fault injection (gRFC A33) and its `HTTPFault`.
//! - [`fleet`]: drain readiness across replicas (`tether-control drain
//!   status`).
//! - [`load`]: what load reports say of draining endpoints (drain
//!   readiness: busy, idle, unknown).
//! - [`lrs`]: the load reporting service (LRS, gRFC A27) on the ADS port.
//! - [`mod@retry`]: a route's retry policy (gRFC A44) and its `RetryPolicy`.
//! - [`metrics`]: the control plane's own metrics (clients, pushes,
//!   ACK/NACK, reloads, DNS names).
//! - [`reports`]: the clients' recent load reports as they came (`GET
//!   /load`).
//! - [`model`]: the YAML schema (services, endpoints, virtual hosts, routes,
//!   affinity strategies in Contour's vocabulary) and its validation.
//! - [`mod@translate`]: model → Listener, RouteConfiguration, Cluster and
//!   ClusterLoadAssignment, for Envoy and for proxyless gRPC.
//! - [`server`]: the ADS state-of-the-world server with versioned snapshots.
//! - [`session_keys`]: the keys of signed and sealed session cookies, read
//!   from `session.keysFile`.
//! - [`status`]: the status page (`GET /`) and its JSON (`GET /status`).
//! - [`watch`]: reloading the file on change or SIGHUP, keeping the last
//!   good snapshot when a new file is bad.
//!
//! The rules it shares with the clients (policy settings, names, limits)
//! are tether-xds's; it never depends on the channel (`tether`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod admin;
pub mod dns;
pub mod drain;
pub mod fault;
pub mod fleet;
pub mod load;
pub mod lrs;
pub mod metrics;
pub mod model;
pub mod reports;
pub mod retry;
pub mod server;
pub mod session_keys;
pub mod status;
pub mod tls;
pub mod translate;
pub mod watch;

pub use model::{Config, ModelError, Overrides};
pub use server::{ControlPlane, Snapshot};
pub use translate::{translate, translate_with, Flavor, Translated};
pub use watch::{LoadError, Reload, Reloader};
