//! HTTP cookie handling: the pieces of RFC 6265 tether needs.
//!
//! - [`cookie_header`]: find a cookie in the request's `Cookie` headers.
//! - [`set_cookie`]: render a `Set-Cookie` value in Envoy's or C-core's order.
//! - [`path`]: whether a cookie's `Path` applies to a request path.
//! - [`syntax`]: the character classes that keep names and values from
//!   injecting header content.

pub mod cookie_header;
pub mod path;
pub mod set_cookie;
pub mod syntax;
