//! The HTTP filters' configs that listeners and routes share: the stateful
//! session filter (gRFC A55, with tether-core's cookie rules) and the
//! overrides a virtual host, route or weighted cluster gives a filter in
//! `typed_per_filter_config` (session and fault injection, A33).

use std::time::Duration;

use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::{
    stateful_session_per_route, StatefulSession, StatefulSessionPerRoute,
};
use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
use envoy_types::pb::google::protobuf as pb;
use prost::Name;
use tether_core::http::set_cookie::{Attribute, CookieSpec};

use super::fault::{self, FaultConfig};
use super::{type_name, Check};

/// A stateful session configuration (A55). `cookie` is `None` when
/// `session_state` is unset: a valid filter that does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionState {
    /// The session cookie: name, path, ttl and attributes.
    pub cookie: Option<CookieSpec>,
    /// Envoy's `strict` (read for Envoy parity; gRPC ignores it).
    pub strict: bool,
}

/// A filter's override in a virtual host's, route's or weighted cluster's
/// `typed_per_filter_config`, keyed there by the filter's instance name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FilterOverride {
    /// A `FilterConfig` wrapper with `disabled: true`: the filter does
    /// nothing in this scope.
    Disabled,
    /// A stateful session override.
    Session(SessionOverride),
    /// A fault injection config, replacing the listener's in this scope.
    Fault(FaultConfig),
}

/// A per-route stateful session override (`StatefulSessionPerRoute`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionOverride {
    /// `disabled: true`, or an override with neither field set.
    Disabled,
    /// A full session configuration for this scope.
    Enabled(SessionState),
}

pub(crate) const STATEFUL_SESSION: &str =
    "envoy.extensions.filters.http.stateful_session.v3.StatefulSession";
const COOKIE_STATE: &str =
    "envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState";

/// Validates a `StatefulSession` (A55, with tether-core's cookie rules).
pub(crate) fn session_state(c: &mut Check, s: &StatefulSession) -> SessionState {
    let cookie = c.at("session_state", |c| {
        let ext = s.session_state.as_ref()?;
        c.at("typed_config", |c| {
            let Some(any) = &ext.typed_config else {
                c.fail("field not present");
                return None;
            };
            if type_name(&any.type_url) != COOKIE_STATE {
                c.at("type_url", |c| {
                    c.fail_value(&any.type_url, "unsupported session state type")
                });
                return None;
            }
            let state = c.unpack::<CookieBasedSessionState>(any)?;
            c.at("cookie", |c| match &state.cookie {
                None => {
                    c.fail("field not present");
                    None
                }
                Some(cookie) => cookie_spec(c, cookie),
            })
        })
    });
    SessionState {
        cookie,
        strict: s.strict,
    }
}

/// Validates a `envoy.type.http.v3.Cookie` into tether-core's [`CookieSpec`].
fn cookie_spec(
    c: &mut Check,
    cookie: &envoy_types::pb::envoy::r#type::http::v3::Cookie,
) -> Option<CookieSpec> {
    if cookie.name.is_empty() {
        c.fail_at("name", "field not present");
        return None;
    }
    let ttl = match &cookie.ttl {
        None => Duration::ZERO,
        Some(d) => c.at("ttl", |c| c.duration(d))?,
    };
    let mut attributes = Vec::new();
    for (i, a) in cookie.attributes.iter().enumerate() {
        match Attribute::new(&a.name, &a.value) {
            Ok(a) => attributes.push(a),
            Err(e) => {
                c.at("attributes", |c| {
                    c.index(i, |c| core_error(c, &e));
                });
                return None;
            }
        }
    }
    match CookieSpec::new(&cookie.name, &cookie.path, ttl, attributes) {
        Ok(spec) => Some(spec),
        Err(e) => {
            core_error(c, &e);
            None
        }
    }
}

/// Records a tether-core configuration error under the current path.
fn core_error(c: &mut Check, e: &tether_core::ConfigError) {
    let problem = e.problem.to_string();
    c.at(&e.field, |c| {
        if e.value.is_empty() {
            c.fail(problem);
        } else {
            c.fail_value(&e.value, problem);
        }
    });
}

/// Validates a per-filter override (`typed_per_filter_config` value) of a
/// route, virtual host or weighted cluster. Returns `None` for optional
/// overrides of unsupported types, which are skipped.
pub(crate) fn filter_override(c: &mut Check, any: &pb::Any) -> Option<FilterOverride> {
    use envoy_types::pb::envoy::config::route::v3::FilterConfig as Wrapper;
    let name = type_name(&any.type_url);
    if name == Wrapper::full_name() {
        let w = c.unpack::<Wrapper>(any)?;
        if w.disabled {
            return Some(FilterOverride::Disabled);
        }
        return match &w.config {
            Some(inner) => c.at("config", |c| filter_override_inner(c, inner, w.is_optional)),
            None => None,
        };
    }
    filter_override_inner(c, any, false)
}

fn filter_override_inner(c: &mut Check, any: &pb::Any, optional: bool) -> Option<FilterOverride> {
    let name = type_name(&any.type_url);
    if name == HttpFault::full_name() {
        // The fault filter's override is its listener config's message.
        let f = c.unpack::<HttpFault>(any)?;
        return Some(FilterOverride::Fault(fault::validate(c, &f)));
    }
    if name == StatefulSessionPerRoute::full_name() {
        let p = c.unpack::<StatefulSessionPerRoute>(any)?;
        return Some(FilterOverride::Session(match &p.r#override {
            None | Some(stateful_session_per_route::Override::Disabled(_)) => {
                SessionOverride::Disabled
            }
            Some(stateful_session_per_route::Override::StatefulSession(s)) => {
                SessionOverride::Enabled(c.at("stateful_session", |c| session_state(c, s)))
            }
        }));
    }
    if name == STATEFUL_SESSION {
        // A base config in the override slot acts as a full override.
        let s = c.unpack::<StatefulSession>(any)?;
        return Some(FilterOverride::Session(SessionOverride::Enabled(
            session_state(c, &s),
        )));
    }
    if !optional {
        c.at("type_url", |c| {
            c.fail_value(&any.type_url, "is an unsupported filter override type")
        });
    }
    None
}
