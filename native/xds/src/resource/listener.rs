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
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::StatefulSession;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, http_filter, HttpConnectionManager,
};
use prost::Name;

pub use envoy_types::pb::envoy::config::listener::v3::Listener;

use super::fault::{self, FaultConfig};
use super::http_filter::{session_state, STATEFUL_SESSION};
pub use super::http_filter::{FilterOverride, SessionOverride, SessionState};
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
