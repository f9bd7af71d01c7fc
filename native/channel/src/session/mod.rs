//! Session affinity on the client side of a call.
//!
//! - `filter`: the stateful session filter (gRFCs A55, A60, A61) that
//!   the channel runs on every call its route turns it on for: the session
//!   configuration per route, the cookie read once per session
//!   (`memo`), the pick pinned to the cookie's endpoint, the
//!   `Set-Cookie` on the response, and cookies stock Envoy would misread
//!   noted (`notes`). What a cookie's value means is `tether-core`'s
//!   business ([`tether_core::session`]).
//! - [`jar`], [`layer`], [`service`], [`future`]: a client cookie jar as a
//!   tower layer (tower's layout: the layer, the service, its future), the
//!   "recipe" of gRFC A55: it keeps the cookies a server sets (Envoy's or
//!   gRPC's stateful session cookie among them) and sends them back on
//!   later calls, as a browser does for one origin. A jar also goes inside
//!   a channel handle, without a layer: [`crate::Channel::with_cookie_jar`].

pub(crate) mod filter;
pub mod future;
pub mod jar;
pub mod layer;
pub(crate) mod memo;
pub(crate) mod notes;
pub mod service;

pub use filter::SessionOptions;
pub use jar::{CookieJar, JarError, SessionId};
pub use layer::CookieJarLayer;
pub use service::CookieJarService;
/// tower's `Layer` trait, so that `CookieJarLayer::new(jar).layer(channel)`
/// needs no tower crate of the caller's.
pub use tower_layer::Layer;
