//! Session affinity on the client side of a call.
//!
//! - [`jar`], [`layer`], [`service`], [`future`]: a client cookie jar as a
//!   tower layer (tower's layout: the layer, the service, its future), the "recipe" of gRFC
//!   A55: it keeps the cookies a server sets (Envoy's or gRPC's stateful
//!   session cookie among them) and sends them back on later calls, as a
//!   browser does for one origin. It stores and replays values; what a
//!   session cookie's value means is `tether-core`'s business
//!   ([`tether_core::session`]). A jar also goes inside a channel handle,
//!   without a layer: [`crate::Channel::with_cookie_jar`].
//!
//! The stateful session filter itself (reading the cookie, pinning the
//! call, writing Set-Cookie) runs inside the channel: its config selector
//! resolves the session per route, its call path answers with the cookie.

pub mod future;
pub mod jar;
pub mod layer;
pub mod service;

pub use jar::{CookieJar, JarError, SessionId};
pub use layer::CookieJarLayer;
pub use service::CookieJarService;
/// tower's `Layer` trait, so that `CookieJarLayer::new(jar).layer(channel)`
/// needs no tower crate of the caller's.
pub use tower_layer::Layer;
