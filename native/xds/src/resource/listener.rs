//! Listener validation: a client-side listener is an `ApiListener` holding an
//! `HttpConnectionManager`, whose routes come from RDS or inline, and whose
//! HTTP filters end with the router. The stateful session filter
//! (gRFC A55) is validated with tether-core's cookie rules; the fault
//! injection filter (A33) as C-core reads it.

use std::collections::HashSet;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::{
    stateful_session_per_route, StatefulSession, StatefulSessionPerRoute,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, http_filter, HttpConnectionManager,
};
use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
use envoy_types::pb::google::protobuf as pb;
use prost::Name;
use tether_core::http::set_cookie::{Attribute, CookieSpec};

pub use envoy_types::pb::envoy::config::listener::v3::Listener;

use super::fault::{self, FaultConfig};
use super::route::{self, RouteConfigResource};
use super::{type_name, Check};

/// A validated client-side listener.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerResource {
    /// The listener's name (for a proxyless client, the target's name).
    pub name: String,
    /// Its HTTP connection manager.
    pub http: HttpConnectionManagerConfig,
}

/// The parts of an `HttpConnectionManager` a client uses.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConnectionManagerConfig {
    /// Where the routes come from.
    pub routes: RouteSource,
    /// The HTTP filters in order; the last is the router. Optional filters
    /// of unsupported types are left out.
    pub http_filters: Vec<HttpFilter>,
    /// `common_http_protocol_options.max_stream_duration`, if set.
    pub max_stream_duration: Option<Duration>,
}

/// RDS or an inline route configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteSource {
    /// Fetch the named `RouteConfiguration` over the same ADS stream.
    Rds(String),
    /// Routes given inline.
    Inline(Box<RouteConfigResource>),
}

/// One HTTP filter.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpFilter {
    /// The instance name (the key of per-route overrides).
    pub name: String,
    /// Its validated configuration.
    pub config: FilterConfig,
}

/// Configuration of a supported HTTP filter.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FilterConfig {
    /// `envoy.extensions.filters.http.router.v3.Router`.
    Router,
    /// `envoy.extensions.filters.http.stateful_session.v3.StatefulSession`.
    StatefulSession(SessionState),
    /// `envoy.extensions.filters.http.fault.v3.HTTPFault` (gRFC A33).
    Fault(FaultConfig),
}

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

const STATEFUL_SESSION: &str = "envoy.extensions.filters.http.stateful_session.v3.StatefulSession";
const COOKIE_STATE: &str =
    "envoy.extensions.http.stateful_session.cookie.v3.CookieBasedSessionState";
const TYPED_STRUCTS: [&str; 2] = ["xds.type.v3.TypedStruct", "udpa.type.v1.TypedStruct"];

pub(crate) fn validate(c: &mut Check, l: &Listener) -> ListenerResource {
    let http = c.at("api_listener", |c| match &l.api_listener {
        None => {
            c.fail("field not present (tether's client takes API listeners only)");
            None
        }
        Some(api) => c.at("api_listener", |c| match &api.api_listener {
            None => {
                c.fail("field not present");
                None
            }
            Some(any) => c
                .unpack::<HttpConnectionManager>(any)
                .map(|hcm| http_connection_manager(c, &hcm)),
        }),
    });
    ListenerResource {
        name: l.name.clone(),
        http: http.unwrap_or(HttpConnectionManagerConfig {
            routes: RouteSource::Rds(String::new()),
            http_filters: Vec::new(),
            max_stream_duration: None,
        }),
    }
}

/// Whether a config source points at the ADS stream itself.
pub(crate) fn config_source_is_ads(c: &mut Check, source: Option<&core::ConfigSource>) {
    use core::config_source::ConfigSourceSpecifier as S;
    match source {
        None => c.fail("field not present"),
        Some(s) => match &s.config_source_specifier {
            Some(S::Ads(_)) | Some(S::Self_(_)) => {}
            _ => c.fail("ConfigSource is not ADS or SELF"),
        },
    }
}

fn http_connection_manager(
    c: &mut Check,
    hcm: &HttpConnectionManager,
) -> HttpConnectionManagerConfig {
    let routes = match &hcm.route_specifier {
        Some(RouteSpecifier::Rds(rds)) => c.at("rds", |c| {
            c.at("config_source", |c| {
                config_source_is_ads(c, rds.config_source.as_ref())
            });
            if rds.route_config_name.is_empty() {
                c.fail_at("route_config_name", "field not present");
            }
            RouteSource::Rds(rds.route_config_name.clone())
        }),
        Some(RouteSpecifier::RouteConfig(rc)) => c.at("route_config", |c| {
            RouteSource::Inline(Box::new(route::validate(c, rc)))
        }),
        Some(RouteSpecifier::ScopedRoutes(_)) => {
            c.fail_at("scoped_routes", "is not supported");
            RouteSource::Rds(String::new())
        }
        None => {
            c.fail("neither rds nor route_config is set");
            RouteSource::Rds(String::new())
        }
    };
    let mut filters = Vec::new();
    c.at("http_filters", |c| {
        if hcm.http_filters.is_empty() {
            c.fail("expected at least one HTTP filter");
        }
        let mut names = HashSet::new();
        let last = hcm.http_filters.len().saturating_sub(1);
        for (i, f) in hcm.http_filters.iter().enumerate() {
            c.index(i, |c| {
                if f.name.is_empty() {
                    c.fail_at("name", "field not present");
                } else if !names.insert(f.name.as_str()) {
                    c.at("name", |c| {
                        c.fail_value(&f.name, "is a duplicate filter name")
                    });
                }
                let Some(config) = filter_config(c, f.is_optional, f.config_type.as_ref()) else {
                    return;
                };
                let is_router = config == FilterConfig::Router;
                if is_router && i != last {
                    c.fail("the router filter must be the last HTTP filter");
                } else if !is_router && i == last {
                    c.fail("the last HTTP filter must be the router");
                }
                filters.push(HttpFilter {
                    name: f.name.clone(),
                    config,
                });
            });
        }
    });
    let max_stream_duration = hcm
        .common_http_protocol_options
        .as_ref()
        .and_then(|o| o.max_stream_duration.as_ref())
        .and_then(|d| {
            c.at("common_http_protocol_options", |c| {
                c.at("max_stream_duration", |c| c.duration(d))
            })
        });
    HttpConnectionManagerConfig {
        routes,
        http_filters: filters,
        max_stream_duration,
    }
}

fn filter_config(
    c: &mut Check,
    optional: bool,
    config: Option<&http_filter::ConfigType>,
) -> Option<FilterConfig> {
    let any = match config {
        Some(http_filter::ConfigType::TypedConfig(any)) => any,
        Some(http_filter::ConfigType::ConfigDiscovery(_)) => {
            if !optional {
                c.fail_at("config_discovery", "is not supported");
            }
            return None;
        }
        None => {
            if !optional {
                c.fail_at("typed_config", "field not present");
            }
            return None;
        }
    };
    c.at("typed_config", |c| {
        let name = type_name(&any.type_url);
        if name == Router::full_name() {
            return Some(FilterConfig::Router);
        }
        if name == STATEFUL_SESSION {
            let s = c.unpack::<StatefulSession>(any)?;
            return Some(FilterConfig::StatefulSession(session_state(c, &s)));
        }
        if name == HttpFault::full_name() {
            let f = c.unpack::<HttpFault>(any)?;
            return Some(FilterConfig::Fault(fault::validate(c, &f)));
        }
        if !optional {
            let what = if TYPED_STRUCTS.contains(&name) {
                "a TypedStruct filter config is not supported"
            } else {
                "is an unsupported filter type"
            };
            c.at("type_url", |c| c.fail_value(&any.type_url, what));
        }
        None
    })
}

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

impl HttpConnectionManagerConfig {
    /// The HCM-level session configuration and the filter's instance name,
    /// if the filter is present.
    pub fn stateful_session(&self) -> Option<(&str, &SessionState)> {
        self.http_filters.iter().find_map(|f| match &f.config {
            FilterConfig::StatefulSession(s) => Some((f.name.as_str(), s)),
            _ => None,
        })
    }

    /// The fault injection filters with their instance names, in order.
    pub fn faults(&self) -> impl Iterator<Item = (&str, &FaultConfig)> {
        self.http_filters.iter().filter_map(|f| match &f.config {
            FilterConfig::Fault(config) => Some((f.name.as_str(), config)),
            _ => None,
        })
    }
}
