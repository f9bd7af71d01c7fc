//! Validation: what single fields cannot check, in the order
//! [`Config::validate`] reports it: each service (its name, outlier
//! detection, TLS, keepalive, load reporting, drain, drops and endpoints), the aggregate graph, the
//! `envoy` section, then each virtual host and its routes (conditions,
//! services, and each strategy's settings). Every error names the field's
//! path; [`Config::parse`] adds its line and column.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::time::Duration;

use tether_xds::lb_config::least_request::{DEFAULT_CHOICE_COUNT, MAX_CHOICE_COUNT};
use tether_xds::lb_config::weighted_round_robin::Settings as WrrSettings;

use super::analysis::{shared_cluster_conflict, Shared};
use super::schema::service::PER_MILLION_PER_PERCENT;
use super::{
    Condition, Config, CustomPolicySpec, DrainSpec, EnvoyTlsFiles, KeepaliveSpec,
    LoadBalancerPolicy, LoadReportingSpec, ModelError, OutlierDetectionSpec, Protocol, RouteSpec,
    SanMatcherSpec, ServiceSpec, ServiceTlsSpec, SessionClusterSettings, Strategy,
    WeightedRoundRobinSpec,
};

impl Config {
    /// Checks what single fields cannot: unique names, references, and the
    /// settings each strategy needs.
    pub fn validate(&self) -> Result<(), ModelError> {
        let services = self.validate_services()?;
        self.validate_aggregates()?;
        self.validate_envoy()?;
        self.validate_dns()?;
        self.validate_virtual_hosts(&services)
    }

    /// The `dns` section: servers listed when the list is given, a minimum
    /// refresh and a query timeout of at least 1ms, a maximum refresh not
    /// below the minimum (defaults filled in).
    fn validate_dns(&self) -> Result<(), ModelError> {
        let spec = &self.dns;
        if spec.servers.as_ref().is_some_and(Vec::is_empty) {
            return Err(ModelError::invalid(
                "dns.servers",
                "[]",
                "must list at least one server (leave servers out to use the system's resolv.conf)",
            ));
        }
        let s = spec.settings();
        let shown = |d: Duration| Raw(tether_core::duration::display(d).to_string());
        for (field, d) in [("minRefresh", s.min_refresh), ("timeout", s.timeout)] {
            if d < Duration::from_millis(1) {
                return Err(ModelError::invalid(
                    format!("dns.{field}"),
                    shown(d),
                    "must be at least 1ms",
                ));
            }
        }
        if s.max_refresh < s.min_refresh {
            return Err(ModelError::invalid(
                "dns.maxRefresh",
                shown(s.max_refresh),
                format!(
                    "must be at least minRefresh ({})",
                    tether_core::duration::display(s.min_refresh)
                ),
            ));
        }
        Ok(())
    }

    /// Each service in turn: a valid name defined once, then its outlier
    /// detection, TLS, keepalive, load reporting, drain, drops and endpoints.
    /// Returns the names.
    fn validate_services(&self) -> Result<HashSet<&str>, ModelError> {
        let mut services = HashSet::new();
        for (i, s) in self.services.iter().enumerate() {
            let at = format!("services[{i}]");
            if s.name.is_empty()
                || s.name.contains([';', ',', '/'])
                || s.name.contains(char::is_whitespace)
            {
                return Err(ModelError::invalid(
                    format!("{at}.name"),
                    &s.name,
                    "must be non-empty without ';', ',', '/' or spaces",
                ));
            }
            if !services.insert(s.name.as_str()) {
                return Err(ModelError::invalid(
                    format!("{at}.name"),
                    &s.name,
                    "is defined twice",
                ));
            }
            if let Some(od) = &s.outlier_detection {
                if s.is_aggregate() {
                    return Err(ModelError::invalid(
                        format!("{at}.outlierDetection"),
                        &s.name,
                        "belongs on the services an aggregate service names (gRPC applies it per underlying cluster)",
                    ));
                }
                od.validate(&at)?;
            }
            if let Some(t) = &s.tls {
                self.validate_tls(s, t, &at)?;
            }
            if let Some(k) = &s.keepalive {
                keepalive(s, k, &at)?;
            }
            if let Some(l) = &s.load_reporting {
                load_reporting(s, l, &at)?;
            }
            if let Some(d) = &s.drain {
                drain(s, d, &at)?;
            }
            drop_overloads(s, self.serves_envoy(), &at)?;
            endpoints(s, &at)?;
        }
        Ok(services)
    }

    /// A service's `tls` (the service at `at`): not on an aggregate, one
    /// source of roots, Envoy's TLS given or plaintext said, SAN matchers
    /// that each match something, and SANs named with the system's roots.
    fn validate_tls(
        &self,
        s: &ServiceSpec,
        t: &ServiceTlsSpec,
        at: &str,
    ) -> Result<(), ModelError> {
        if s.is_aggregate() {
            return Err(ModelError::invalid(
                format!("{at}.tls"),
                &s.name,
                "belongs on the services an aggregate service names",
            ));
        }
        if t.ca_instance.is_empty() && !t.system_root_certs {
            return Err(ModelError::invalid(
                format!("{at}.tls.caInstance"),
                "",
                "must name a certificate provider instance of the clients' bootstrap \
                 (or set systemRootCerts: true)",
            ));
        }
        if t.envoy.is_some() && t.envoy_plaintext {
            return Err(ModelError::invalid(
                format!("{at}.tls.envoyPlaintext"),
                true,
                "cannot be set with tls.envoy (Envoy gets TLS from one or plaintext by the other)",
            ));
        }
        if t.envoy.is_none() && !t.envoy_plaintext && self.serves_envoy() {
            return Err(ModelError::invalid(
                format!("{at}.tls.envoy"),
                &s.name,
                "is missing: Envoy would speak plaintext to a service whose proxyless clients \
                 use TLS (give tls.envoy the files on the Envoy hosts, or set \
                 envoyPlaintext: true if plaintext from Envoy is meant)",
            ));
        }
        if let Some(e) = &t.envoy {
            e.validate(&format!("{at}.tls.envoy"))?;
        }
        if !t.ca_instance.is_empty() && t.system_root_certs {
            return Err(ModelError::invalid(
                format!("{at}.tls.systemRootCerts"),
                "true",
                "cannot be set with caInstance (the roots come from one or the other)",
            ));
        }
        for (k, m) in t.subject_alt_names.iter().enumerate() {
            m.validate(&format!("{at}.tls.subjectAltNames[{k}]"))?;
        }
        // A82 lets an empty list accept any certificate the system
        // trusts, which is almost never meant: any public CA could
        // then vouch for any endpoint of the service.
        if t.system_root_certs && t.subject_alt_names.is_empty() {
            return Err(ModelError::invalid(
                format!("{at}.tls.subjectAltNames"),
                &s.name,
                "must name the servers' SANs with systemRootCerts: true (without them any \
                 certificate from any publicly trusted CA is accepted)",
            ));
        }
        Ok(())
    }

    /// Each virtual host: a name defined once and its fault, then its
    /// routes, against the services defined (`services`).
    fn validate_virtual_hosts(&self, services: &HashSet<&str>) -> Result<(), ModelError> {
        let mut vhosts = HashSet::new();
        // Per service, what the routes reaching it asked of its shared
        // clusters and the route that asked first.
        let mut shared = Shared::default();
        for (i, vh) in self.virtualhosts.iter().enumerate() {
            let at = format!("virtualhosts[{i}]");
            if vh.name.is_empty() {
                return Err(ModelError::invalid(
                    format!("{at}.name"),
                    "",
                    "must be non-empty",
                ));
            }
            if !vhosts.insert(vh.name.as_str()) {
                return Err(ModelError::invalid(
                    format!("{at}.name"),
                    &vh.name,
                    "is defined twice",
                ));
            }
            if let Some(f) = &vh.fault {
                f.validate(&format!("{at}.fault"))?;
            }
            for (j, r) in vh.routes.iter().enumerate() {
                let rat = format!("{at}.routes[{j}]");
                self.validate_route(r, &rat, services, &mut shared)?;
            }
        }
        Ok(())
    }

    /// The route at `rat`: its fault and retry policy, conditions,
    /// services, then its `loadBalancerPolicy`, whose settings must agree
    /// with those of the routes before it (`shared`) on the clusters they
    /// share.
    fn validate_route<'a>(
        &'a self,
        r: &'a RouteSpec,
        rat: &str,
        services: &HashSet<&str>,
        shared: &mut Shared<'a>,
    ) -> Result<(), ModelError> {
        if let Some(f) = &r.fault {
            f.validate(&format!("{rat}.fault"))?;
        }
        if let Some(p) = &r.retry_policy {
            p.validate(&format!("{rat}.retryPolicy"))?;
            if self.envoy.uses_plugin() && r.load_balancer_policy.strategy == Strategy::Session {
                return Err(ModelError::invalid(
                    format!("{rat}.retryPolicy"),
                    "Session",
                    "cannot be set on a Session route while Envoy runs the tether plugin (its wiring sets the route's retry policy)",
                ));
            }
        }
        for (k, c) in r.conditions.iter().enumerate() {
            condition(c, &format!("{rat}.conditions[{k}]"))?;
        }
        route_services(r, rat, services)?;
        let p = &r.load_balancer_policy;
        let pat = format!("{rat}.loadBalancerPolicy");
        request_hash_policies(p, &pat)?;
        self.validate_session(p, &pat, r, &mut shared.session)?;
        self.validate_choice_count(p, &pat, r, &mut shared.choice_count)?;
        self.validate_strategy_settings(p, &pat, r, shared)
    }

    /// `session`: required with `Session` and only used with it, a
    /// `format` only for the plugin, and one set of cluster settings per
    /// service: the routes that reach a service share its
    /// `<service>/session` cluster, aggregates' services included.
    fn validate_session<'a>(
        &'a self,
        p: &LoadBalancerPolicy,
        pat: &str,
        r: &'a RouteSpec,
        session_settings: &mut BTreeMap<&'a str, (SessionClusterSettings, String)>,
    ) -> Result<(), ModelError> {
        match (p.strategy, &p.session) {
            (Strategy::Session, None) => {
                return Err(ModelError::invalid(
                    format!("{pat}.session"),
                    "",
                    "is required with strategy Session",
                ))
            }
            (Strategy::Session, Some(s)) => {
                if let (Some(f), false) = (s.format, self.envoy.uses_plugin()) {
                    return Err(ModelError::invalid(
                        format!("{pat}.session.format"),
                        f.0.as_str(),
                        "needs envoy.sessionFilter: plugin (Envoy's own filter writes only its own format; proxyless clients choose theirs)",
                    ));
                }
                let format = s.format.map(|f| f.0).unwrap_or_default();
                match (s.keys_file.as_deref(), format) {
                    (None, tether_core::Format::Sealed) => {
                        return Err(ModelError::invalid(
                            format!("{pat}.session.keysFile"),
                            "",
                            "is required with format sealed (a file of base64 secrets of at least 32 bytes, one a line)",
                        ))
                    }
                    (Some(file), _) if !self.envoy.uses_plugin() => {
                        return Err(ModelError::invalid(
                            format!("{pat}.session.keysFile"),
                            file,
                            "needs envoy.sessionFilter: plugin (Envoy's own filter neither signs nor seals)",
                        ))
                    }
                    (Some(file), tether_core::Format::Grpc | tether_core::Format::Legacy) => {
                        return Err(ModelError::invalid(
                            format!("{pat}.session.keysFile"),
                            file,
                            format!("is for formats envoy (signed) and sealed, not {format}"),
                        ))
                    }
                    (Some(""), _) => {
                        return Err(ModelError::invalid(
                            format!("{pat}.session.keysFile"),
                            "",
                            "is empty",
                        ))
                    }
                    _ => {}
                }
                let settings = s.cluster_settings();
                // An aggregate's services get the settings too: their
                // `<service>/session` clusters are the ones that pin.
                for svc in r.services.iter().flat_map(|s| self.closure(&s.name)) {
                    match session_settings.get(svc.name.as_str()) {
                        Some((other, at_other)) if *other != settings => {
                            return Err(ModelError::invalid(
                                format!("{pat}.session"),
                                &svc.name,
                                format!(
                                    "asks for other overrideHostStatus/idleTimeout on this service than {at_other}.session"
                                ),
                            ));
                        }
                        Some(_) => {}
                        None => {
                            session_settings.insert(svc.name.as_str(), (settings, pat.to_owned()));
                        }
                    }
                }
            }
            (other, Some(_)) => {
                return Err(ModelError::invalid(
                    format!("{pat}.session"),
                    other.as_str(),
                    "is only used with strategy Session",
                ))
            }
            (_, None) => {}
        }
        Ok(())
    }

    /// `choiceCount`: only with `WeightedLeastRequest`, from 2 (gRPC refuses
    /// fewer) to 10 (gRPC uses no more), and one value per service: the
    /// routes that reach a service share its `<service>/least-request`
    /// cluster, aggregates' services included.
    fn validate_choice_count<'a>(
        &'a self,
        p: &LoadBalancerPolicy,
        pat: &str,
        r: &'a RouteSpec,
        counts: &mut BTreeMap<&'a str, (u32, String)>,
    ) -> Result<(), ModelError> {
        if p.strategy != Strategy::LeastRequest {
            return match p.choice_count {
                Some(_) => Err(ModelError::invalid(
                    format!("{pat}.choiceCount"),
                    p.strategy.as_str(),
                    "is only used with strategy WeightedLeastRequest",
                )),
                None => Ok(()),
            };
        }
        let n = p.choice_count.unwrap_or(DEFAULT_CHOICE_COUNT);
        if !(2..=MAX_CHOICE_COUNT).contains(&n) {
            return Err(ModelError::invalid(
                format!("{pat}.choiceCount"),
                n,
                format!(
                    "must be from 2 to {MAX_CHOICE_COUNT} (gRPC refuses fewer than 2 and draws at most {MAX_CHOICE_COUNT})"
                ),
            ));
        }
        match self.conflict(r, pat, n, counts) {
            Some((svc, other, at_other)) => Err(ModelError::invalid(
                format!("{pat}.choiceCount"),
                n,
                shared_cluster_conflict(&at_other, "choiceCount", &other, svc),
            )),
            None => Ok(()),
        }
    }

    /// `weightedRoundRobin`, `shuffleAddressList` and `custom`: each only
    /// with its strategy, valid, and one value per service: the routes that
    /// reach a service share its cluster for the strategy, aggregates'
    /// services included.
    fn validate_strategy_settings<'a>(
        &'a self,
        p: &'a LoadBalancerPolicy,
        pat: &str,
        r: &'a RouteSpec,
        shared: &mut Shared<'a>,
    ) -> Result<(), ModelError> {
        let only = |field: &str, strategy: Strategy| {
            Err(ModelError::invalid(
                format!("{pat}.{field}"),
                p.strategy.as_str(),
                format!("is only used with strategy {}", strategy.as_str()),
            ))
        };
        if p.weighted_round_robin.is_some() && p.strategy != Strategy::WeightedRoundRobin {
            return only("weightedRoundRobin", Strategy::WeightedRoundRobin);
        }
        if p.shuffle_address_list.is_some() && p.strategy != Strategy::PickFirst {
            return only("shuffleAddressList", Strategy::PickFirst);
        }
        if p.custom.is_some() && p.strategy != Strategy::Custom {
            return only("custom", Strategy::Custom);
        }
        match p.strategy {
            Strategy::WeightedRoundRobin => {
                let wat = format!("{pat}.weightedRoundRobin");
                let spec = p.weighted_round_robin.unwrap_or_default();
                spec.validate(&wat)?;
                let mine = spec.settings();
                if let Some((svc, other, at_other)) = self.conflict(r, pat, mine, &mut shared.wrr) {
                    let differing = wrr_fields(&mine)
                        .into_iter()
                        .zip(wrr_fields(&other))
                        .find(|(a, b)| a.1 != b.1);
                    let ((field, value), (_, theirs)) = differing.unwrap_or_default();
                    return Err(ModelError::invalid(
                        format!("{wat}.{field}"),
                        Raw(value),
                        shared_cluster_conflict(
                            &at_other,
                            &format!("weightedRoundRobin.{field}"),
                            &theirs,
                            svc,
                        ),
                    ));
                }
            }
            Strategy::PickFirst => {
                let mine = p.shuffle_address_list.unwrap_or(false);
                if let Some((svc, other, at_other)) =
                    self.conflict(r, pat, mine, &mut shared.shuffle)
                {
                    return Err(ModelError::invalid(
                        format!("{pat}.shuffleAddressList"),
                        mine,
                        shared_cluster_conflict(&at_other, "shuffleAddressList", &other, svc),
                    ));
                }
            }
            Strategy::Custom => {
                let cat = format!("{pat}.custom");
                let Some(mine) = &p.custom else {
                    return Err(ModelError::invalid(
                        cat,
                        "",
                        "is required with strategy Custom",
                    ));
                };
                mine.validate(&cat)?;
                if let Some((svc, other, at_other)) =
                    self.conflict(r, pat, mine, &mut shared.custom)
                {
                    return Err(if other.policy != mine.policy {
                        ModelError::invalid(
                            format!("{cat}.policy"),
                            &mine.policy,
                            shared_cluster_conflict(
                                &at_other,
                                "custom.policy",
                                &format_args!("{:?}", other.policy),
                                svc,
                            ),
                        )
                    } else {
                        ModelError::invalid(
                            format!("{cat}.config"),
                            Raw(mine.config.to_string()),
                            shared_cluster_conflict(&at_other, "custom.config", &other.config, svc),
                        )
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The `envoy` section: a plugin needs its file (an absolute path) and
    /// a valid override header; plugin settings need the plugin; each node
    /// is listed once.
    fn validate_envoy(&self) -> Result<(), ModelError> {
        let e = &self.envoy;
        let mut ids = HashSet::new();
        for (i, n) in e.nodes.iter().enumerate() {
            if n.id.is_empty() {
                return Err(ModelError::invalid(
                    format!("envoy.nodes[{i}].id"),
                    "",
                    "must be non-empty",
                ));
            }
            if !ids.insert(n.id.as_str()) {
                return Err(ModelError::invalid(
                    format!("envoy.nodes[{i}].id"),
                    &n.id,
                    "is listed twice",
                ));
            }
        }
        match (e.uses_plugin(), &e.plugin) {
            (false, Some(_)) => Err(ModelError::invalid(
                "envoy.plugin",
                "native",
                "is only used with envoy.sessionFilter: plugin (envoy.sessionFilter is native)",
            )),
            (false, None) => Ok(()),
            (true, plugin) => {
                let plugin = plugin.clone().unwrap_or_default();
                match plugin.filename.as_deref() {
                    None => {
                        return Err(ModelError::invalid(
                            "envoy.plugin.filename",
                            "",
                            "is required with envoy.sessionFilter: plugin (or tether-control --plugin FILE)",
                        ))
                    }
                    Some(f) if !std::path::Path::new(f).is_absolute() => {
                        return Err(ModelError::invalid(
                            "envoy.plugin.filename",
                            f,
                            "must be an absolute path (Envoy opens it from its own working directory)",
                        ))
                    }
                    Some(_) => {}
                }
                if let Some(h) = &plugin.override_header {
                    if !tether_core::http::syntax::is_token(h) {
                        return Err(ModelError::invalid(
                            "envoy.plugin.overrideHeader",
                            h,
                            "is not a valid header name",
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}

/// A service's `keepalive`: only with `h2c`, and durations Envoy takes.
fn keepalive(s: &ServiceSpec, k: &KeepaliveSpec, at: &str) -> Result<(), ModelError> {
    if s.protocol != Protocol::H2c {
        return Err(ModelError::invalid(
            format!("{at}.keepalive"),
            &s.name,
            "needs protocol: h2c (HTTP/2 PINGs keep the connection alive)",
        ));
    }
    for (field, d) in [("interval", k.interval), ("timeout", k.timeout)] {
        if d.0 < Duration::from_millis(1) {
            return Err(ModelError::invalid(
                format!("{at}.keepalive.{field}"),
                format!("{}s", d.0.as_secs_f64()),
                "must be at least 1ms (Envoy's bound)",
            ));
        }
    }
    Ok(())
}

/// A service's `loadReporting`: an interval clients can keep, on a
/// service with endpoints of its own.
fn load_reporting(s: &ServiceSpec, l: &LoadReportingSpec, at: &str) -> Result<(), ModelError> {
    if s.aggregate.is_some() {
        return Err(ModelError::invalid(
            format!("{at}.loadReporting"),
            &s.name,
            "belongs on the services an aggregate service names (load is reported per underlying cluster)",
        ));
    }
    let d = l.interval.0;
    if !(MIN_LOAD_REPORTING..=MAX_LOAD_REPORTING).contains(&d) {
        return Err(ModelError::invalid(
            format!("{at}.loadReporting.interval"),
            format!("{}s", d.as_secs_f64()),
            "must be from 0.1s to 1h",
        ));
    }
    for (i, metric) in l.endpoint_metrics.iter().enumerate() {
        let named = metric.strip_prefix(tether_xds::load_report::NAMED_METRICS_PREFIX);
        let known =
            ORCA_UTILIZATIONS.contains(&metric.as_str()) || named.is_some_and(|k| !k.is_empty());
        if !known {
            return Err(ModelError::invalid(
                format!("{at}.loadReporting.endpointMetrics[{i}]"),
                metric,
                "is not an ORCA metric: cpu_utilization, mem_utilization, \
                 application_utilization, named_metrics.KEY or named_metrics.*",
            ));
        }
    }
    Ok(())
}

/// The ORCA utilizations `loadReporting.endpointMetrics` may name (beside
/// named metrics), as gRFC A85 spells them.
const ORCA_UTILIZATIONS: [&str; 3] = [
    "cpu_utilization",
    "mem_utilization",
    "application_utilization",
];

/// Bounds of `loadReporting.interval`.
const MIN_LOAD_REPORTING: Duration = Duration::from_millis(100);
const MAX_LOAD_REPORTING: Duration = Duration::from_secs(3600);

/// A service's `drain`: on a service with endpoints of its own, at least
/// one key, `removeWhenIdle` only with `loadReporting` (without reports
/// nothing is ever idle), each duration within its bounds, and
/// `removeWhenIdle` shorter than `maxDrain` (else it could never act).
fn drain(s: &ServiceSpec, d: &DrainSpec, at: &str) -> Result<(), ModelError> {
    let shown = |d: Duration| Raw(tether_core::duration::display(d).to_string());
    if s.aggregate.is_some() {
        return Err(ModelError::invalid(
            format!("{at}.drain"),
            &s.name,
            "belongs on the services an aggregate service names (an aggregate has no endpoints of its own)",
        ));
    }
    if d.remove_when_idle.is_none() && d.max_drain.is_none() {
        return Err(ModelError::invalid(
            format!("{at}.drain"),
            Raw("{}".to_owned()),
            "sets neither removeWhenIdle nor maxDrain",
        ));
    }
    if let Some(idle) = d.remove_when_idle {
        if !(MIN_DRAIN..=MAX_REMOVE_WHEN_IDLE).contains(&idle.0) {
            return Err(ModelError::invalid(
                format!("{at}.drain.removeWhenIdle"),
                shown(idle.0),
                "must be from 0.1s to 24h",
            ));
        }
        if s.load_reporting.is_none() {
            return Err(ModelError::invalid(
                format!("{at}.drain.removeWhenIdle"),
                shown(idle.0),
                "needs loadReporting on the service (without load reports no endpoint is ever idle)",
            ));
        }
    }
    if let Some(max) = d.max_drain {
        if !(MIN_DRAIN..=MAX_DRAIN).contains(&max.0) {
            return Err(ModelError::invalid(
                format!("{at}.drain.maxDrain"),
                shown(max.0),
                "must be from 0.1s to 7d (604800s)",
            ));
        }
        if let Some(idle) = d.remove_when_idle.filter(|idle| idle.0 >= max.0) {
            return Err(ModelError::invalid(
                format!("{at}.drain.removeWhenIdle"),
                shown(idle.0),
                format!(
                    "must be shorter than maxDrain ({}), which would always remove first",
                    tether_core::duration::display(max.0)
                ),
            ));
        }
    }
    Ok(())
}

/// Bounds of `drain.removeWhenIdle` and `drain.maxDrain`.
const MIN_DRAIN: Duration = Duration::from_millis(100);
const MAX_REMOVE_WHEN_IDLE: Duration = Duration::from_secs(24 * 3600);
const MAX_DRAIN: Duration = Duration::from_secs(7 * 24 * 3600);

/// A service's `dropOverloads`: on a service with endpoints of its own,
/// each category named once, each share a percent EDS can carry (0 to 100,
/// in millionths), and one category only in a file that serves Envoy.
fn drop_overloads(s: &ServiceSpec, serves_envoy: bool, at: &str) -> Result<(), ModelError> {
    if s.drop_overloads.is_empty() {
        return Ok(());
    }
    if s.is_aggregate() {
        return Err(ModelError::invalid(
            format!("{at}.dropOverloads"),
            &s.name,
            "belongs on the services an aggregate service names (drops are read from each \
             underlying cluster's endpoints)",
        ));
    }
    let mut seen = HashSet::new();
    for (i, d) in s.drop_overloads.iter().enumerate() {
        let dat = format!("{at}.dropOverloads[{i}]");
        // gRPC NACKs an empty category; LRS reports drops under the name.
        if d.category.is_empty() {
            return Err(ModelError::invalid(
                format!("{dat}.category"),
                &d.category,
                "must not be empty (clients report drops under it)",
            ));
        }
        // Clients report each category's drops under its name, so a second
        // entry would add up with the first under one name.
        if !seen.insert(d.category.as_str()) {
            return Err(ModelError::invalid(
                format!("{dat}.category"),
                &d.category,
                "is listed twice in the service (one entry per category)",
            ));
        }
        let shown = Raw(d.percent.to_string());
        // NaN and infinities fall outside the range too.
        if !(0.0..=100.0).contains(&d.percent) {
            return Err(ModelError::invalid(
                format!("{dat}.percent"),
                shown,
                "is not within 0..=100",
            ));
        }
        let millionths = d.percent * PER_MILLION_PER_PERCENT;
        if (millionths - millionths.round()).abs() > 1e-6 {
            return Err(ModelError::invalid(
                format!("{dat}.percent"),
                shown,
                "is finer than a millionth of the calls (at most 4 decimal places: EDS carries \
                 drops per million)",
            ));
        }
        // Envoy refuses a ClusterLoadAssignment with more than one
        // category, which would leave it on the service's old endpoints.
        if i > 0 && serves_envoy {
            return Err(ModelError::invalid(
                dat,
                &d.category,
                "is a second drop category, which Envoy refuses (it takes one per cluster): a \
                 file that serves Envoy gives a service one",
            ));
        }
    }
    Ok(())
}

/// A service's endpoints (weights, addresses each once in the service,
/// localities, priorities contiguous from 0) and its locality weights.
fn endpoints(s: &ServiceSpec, at: &str) -> Result<(), ModelError> {
    let mut addresses = HashSet::new();
    let mut priorities = std::collections::BTreeSet::new();
    for (j, e) in s.endpoints.iter().enumerate() {
        let eat = format!("{at}.endpoints[{j}]");
        if e.weight == 0 {
            return Err(ModelError::invalid(
                format!("{eat}.weight"),
                0,
                "must be greater than 0",
            ));
        }
        if e.address.host().is_some() && !e.additional_addresses.is_empty() {
            return Err(ModelError::invalid(
                format!("{eat}.additionalAddresses"),
                e.address.to_string(),
                "cannot be set beside an address that is a DNS name (each address the name \
                 resolves to becomes an endpoint of its own)",
            ));
        }
        for a in std::iter::once(&e.address).chain(&e.additional_addresses) {
            if !addresses.insert(a) {
                return Err(ModelError::invalid(
                    format!("{eat}.address"),
                    a.to_string(),
                    "is listed twice in this service",
                ));
            }
        }
        if e.locality.split('/').count() > 3 {
            return Err(ModelError::invalid(
                format!("{eat}.locality"),
                &e.locality,
                "has more than region/zone/subzone",
            ));
        }
        priorities.insert(e.priority);
    }
    if let Some(max) = priorities.iter().next_back() {
        if *max as usize + 1 != priorities.len() {
            return Err(ModelError::invalid(
                format!("{at}.endpoints"),
                priorities.iter().collect::<Vec<_>>(),
                "priorities must be contiguous from 0",
            ));
        }
    }
    for (k, w) in &s.locality_weights {
        if *w == 0 {
            return Err(ModelError::invalid(
                format!("{at}.localityWeights.{k}"),
                0,
                "must be greater than 0",
            ));
        }
    }
    Ok(())
}

/// A route's `services`: at least one, each defined in `services`, and
/// some weight above 0.
fn route_services(r: &RouteSpec, rat: &str, services: &HashSet<&str>) -> Result<(), ModelError> {
    if r.services.is_empty() {
        return Err(ModelError::invalid(
            format!("{rat}.services"),
            "[]",
            "must name at least one service",
        ));
    }
    for (k, s) in r.services.iter().enumerate() {
        if !services.contains(s.name.as_str()) {
            return Err(ModelError::invalid(
                format!("{rat}.services[{k}].name"),
                &s.name,
                "is not a service defined in services",
            ));
        }
        if s.weight == 0 && r.services.len() == 1 {
            return Err(ModelError::invalid(
                format!("{rat}.services[{k}].weight"),
                0,
                "must be greater than 0",
            ));
        }
    }
    if r.services.iter().all(|s| s.weight == 0) {
        return Err(ModelError::invalid(
            format!("{rat}.services"),
            "all weights 0",
            "need a weight above 0",
        ));
    }
    Ok(())
}

/// `requestHashPolicies`: given with `RequestHash` and only with it, each
/// entry with one source and a valid header name.
fn request_hash_policies(p: &LoadBalancerPolicy, pat: &str) -> Result<(), ModelError> {
    match p.strategy {
        Strategy::RequestHash if p.request_hash_policies.is_empty() => {
            return Err(ModelError::invalid(
                format!("{pat}.requestHashPolicies"),
                "[]",
                "must not be empty with strategy RequestHash",
            ))
        }
        Strategy::RequestHash => {}
        _ if !p.request_hash_policies.is_empty() => {
            return Err(ModelError::invalid(
                format!("{pat}.requestHashPolicies"),
                p.strategy.as_str(),
                "are only used with strategy RequestHash",
            ))
        }
        _ => {}
    }
    for (k, h) in p.request_hash_policies.iter().enumerate() {
        let set = usize::from(h.header_hash_options.is_some())
            + usize::from(h.query_parameter_hash_options.is_some())
            + usize::from(h.hash_source_ip);
        if set != 1 {
            return Err(ModelError::invalid(
                    format!("{pat}.requestHashPolicies[{k}]"),
                    set,
                    "sources set; exactly one of headerHashOptions, queryParameterHashOptions, hashSourceIP is needed",
                ));
        }
        if let Some(hh) = &h.header_hash_options {
            if !tether_core::http::syntax::is_token(&hh.header_name) {
                return Err(ModelError::invalid(
                    format!("{pat}.requestHashPolicies[{k}].headerHashOptions.headerName"),
                    &hh.header_name,
                    "is not a valid header name",
                ));
            }
        }
    }
    Ok(())
}

/// One entry of a route's `conditions`: exactly one of prefix, path and
/// header, paths from '/', and a header with a valid name and one test.
fn condition(c: &Condition, at: &str) -> Result<(), ModelError> {
    let set = usize::from(c.prefix.is_some())
        + usize::from(c.path.is_some())
        + usize::from(c.header.is_some());
    if set != 1 {
        return Err(ModelError::invalid(
            at,
            set,
            "conditions set; each entry needs exactly one of prefix, path, header",
        ));
    }
    for (field, v) in [("prefix", &c.prefix), ("path", &c.path)] {
        if let Some(p) = v {
            if !p.starts_with('/') {
                return Err(ModelError::invalid(
                    format!("{at}.{field}"),
                    p,
                    "must start with '/'",
                ));
            }
        }
    }
    if let Some(h) = &c.header {
        if !tether_core::http::syntax::is_token(&h.name) {
            return Err(ModelError::invalid(
                format!("{at}.header.name"),
                &h.name,
                "is not a valid header name",
            ));
        }
        let tests = usize::from(h.exact.is_some())
            + usize::from(h.not_exact.is_some())
            + usize::from(h.contains.is_some())
            + usize::from(h.not_contains.is_some())
            + usize::from(h.present.is_some())
            + usize::from(h.not_present.is_some());
        if tests != 1 {
            return Err(ModelError::invalid(
                format!("{at}.header"),
                tests,
                "tests set; exactly one of exact, notexact, contains, notcontains, present, notpresent is needed",
            ));
        }
    }
    Ok(())
}

impl OutlierDetectionSpec {
    /// Percentages above 100, named by their path under `at`.
    fn validate(&self, at: &str) -> Result<(), ModelError> {
        let mut checks = vec![("maxEjectionPercent", self.max_ejection_percent)];
        if let Some(s) = &self.success_rate {
            checks.push((
                "successRate.enforcementPercentage",
                s.enforcement_percentage,
            ));
        }
        if let Some(f) = &self.failure_percentage {
            checks.push(("failurePercentage.threshold", f.threshold));
            checks.push((
                "failurePercentage.enforcementPercentage",
                f.enforcement_percentage,
            ));
        }
        for (field, value) in checks {
            if let Some(v) = value.filter(|v| *v > 100) {
                return Err(ModelError::invalid(
                    format!("{at}.outlierDetection.{field}"),
                    v.to_string(),
                    "must be at most 100",
                ));
            }
        }
        Ok(())
    }
}

impl SanMatcherSpec {
    /// The matcher at `at`: exactly one test, `ignoreCase` not with
    /// `regex`, and a value that is not empty (it would match every SAN,
    /// and Envoy's proto validation refuses it) and, for `regex`, valid on
    /// its own.
    fn validate(&self, at: &str) -> Result<(), ModelError> {
        let set: Vec<(&str, &String)> = [
            ("exact", &self.exact),
            ("prefix", &self.prefix),
            ("suffix", &self.suffix),
            ("contains", &self.contains),
            ("regex", &self.regex),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        .collect();
        let [(field, value)] = set[..] else {
            let names: Vec<&str> = set.iter().map(|(k, _)| *k).collect();
            return Err(ModelError::invalid(
                at,
                names.join(", "),
                "needs exactly one of exact, prefix, suffix, contains, regex",
            ));
        };
        if self.regex.is_some() && self.ignore_case {
            return Err(ModelError::invalid(
                format!("{at}.ignoreCase"),
                true,
                "cannot be combined with regex",
            ));
        }
        if value.is_empty() {
            return Err(ModelError::invalid(
                format!("{at}.{field}"),
                value,
                "is empty (it would match every SAN)",
            ));
        }
        if field == "regex" {
            if let Err(e) = tether_xds::resource::route::full_match(value) {
                return Err(ModelError::invalid(
                    format!("{at}.regex"),
                    value,
                    format!("is not a valid regex: {e}"),
                ));
            }
        }
        Ok(())
    }
}

impl EnvoyTlsFiles {
    /// `tls.envoy` (at `at`): the roots' file, and the client certificate
    /// and key together or not at all.
    fn validate(&self, at: &str) -> Result<(), ModelError> {
        if self.ca_file.is_empty() {
            return Err(ModelError::invalid(
                format!("{at}.caFile"),
                "",
                "must name the roots' file on the Envoy hosts",
            ));
        }
        let (missing, with) = match (&self.certificate_file, &self.private_key_file) {
            (Some(_), None) => ("privateKeyFile", "certificateFile"),
            (None, Some(_)) => ("certificateFile", "privateKeyFile"),
            _ => ("", ""),
        };
        if !missing.is_empty() {
            return Err(ModelError::invalid(
                format!("{at}.{missing}"),
                "",
                format!(
                    "must be set with {with} (or neither, for TLS without a client certificate)"
                ),
            ));
        }
        Ok(())
    }
}

impl WeightedRoundRobinSpec {
    /// A penalty that is negative, NaN or too large for the proto's float
    /// (gRPC NACKs a negative one).
    fn validate(&self, at: &str) -> Result<(), ModelError> {
        if let Some(p) = self.error_utilization_penalty {
            if !(p >= 0.0 && (p as f32).is_finite()) {
                return Err(ModelError::invalid(
                    format!("{at}.errorUtilizationPenalty"),
                    p,
                    "must be a finite number of at least 0",
                ));
            }
        }
        Ok(())
    }
}

/// The settings as the YAML names and writes them, in the file's order,
/// to say which one two routes disagree on.
fn wrr_fields(s: &WrrSettings) -> [(&'static str, String); 6] {
    let d = |d: Duration| tether_core::duration::display(d).to_string();
    [
        ("enableOobLoadReport", s.enable_oob_load_report.to_string()),
        ("oobReportingPeriod", d(s.oob_reporting_period)),
        ("blackoutPeriod", d(s.blackout_period)),
        ("weightExpirationPeriod", d(s.weight_expiration_period)),
        ("weightUpdatePeriod", d(s.weight_update_period)),
        (
            "errorUtilizationPenalty",
            s.error_utilization_penalty.to_string(),
        ),
    ]
}

impl CustomPolicySpec {
    /// A policy name of the characters gRPC allows in one, and a map.
    fn validate(&self, at: &str) -> Result<(), ModelError> {
        if !tether_xds::lb_config::registry::is_valid_name(&self.policy) {
            return Err(ModelError::invalid(
                format!("{at}.policy"),
                &self.policy,
                "must be a non-empty name of letters, digits, '_', '.' and '-' (as gRPC's policy names are)",
            ));
        }
        if !self.config.is_object() {
            return Err(ModelError::invalid(
                format!("{at}.config"),
                Raw(self.config.to_string()),
                "must be a map",
            ));
        }
        Ok(())
    }
}

/// A value shown as it is, unquoted, in an error.
struct Raw(String);

impl fmt::Debug for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    //! Each check on small files through [`Config::parse`], with the
    //! exact message (and line and column, when the field is written).

    use crate::model::Config;

    fn err(yaml: &str) -> String {
        Config::parse(yaml).unwrap_err().to_string()
    }

    /// A service `api` whose `tls` is `tls` (lines indented by six).
    fn tls(tls: &str) -> String {
        format!(
            "services:\n  - name: api\n    tls:\n{tls}    endpoints:\n      - address: 127.0.0.1:9001\n"
        )
    }

    #[test]
    fn a_route_names_an_unknown_service() {
        let yaml = r#"virtualhosts:
  - name: shop
    routes:
      - services:
          - name: apx
services:
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
"#;
        assert_eq!(
            err(yaml),
            "virtualhosts[0].routes[0].services[0].name: \"apx\" is not a service defined in \
             services at line 5 column 19"
        );
    }

    #[test]
    fn an_address_is_listed_once_per_service() {
        let yaml = r#"services:
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
      - address: 127.0.0.1:9001
"#;
        assert_eq!(
            err(yaml),
            "services[0].endpoints[1].address: \"127.0.0.1:9001\" is listed twice in this \
             service at line 5 column 18"
        );
        // An additional address counts too; the error names the endpoint's
        // `address`, where the line points.
        let yaml = r#"services:
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
      - address: 127.0.0.1:9002
        additionalAddresses: [127.0.0.1:9001]
"#;
        assert_eq!(
            err(yaml),
            "services[0].endpoints[1].address: \"127.0.0.1:9001\" is listed twice in this \
             service at line 5 column 18"
        );
    }

    #[test]
    fn a_locality_has_at_most_three_parts() {
        let yaml = r#"services:
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
        locality: us/east/a/b
"#;
        assert_eq!(
            err(yaml),
            "services[0].endpoints[0].locality: \"us/east/a/b\" has more than \
             region/zone/subzone at line 5 column 19"
        );
    }

    #[test]
    fn priorities_are_contiguous_from_zero() {
        let yaml = r#"services:
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
      - address: 127.0.0.1:9002
        priority: 2
"#;
        assert_eq!(
            err(yaml),
            "services[0].endpoints: [0, 2] priorities must be contiguous from 0 at line 4 column 7"
        );
    }

    #[test]
    fn an_empty_san_matcher_is_refused() {
        let yaml = tls("      caInstance: roots\n      subjectAltNames:\n        - prefix: \"\"\n");
        assert_eq!(
            err(&yaml),
            "services[0].tls.subjectAltNames[0].prefix: \"\" is empty (it would match every \
             SAN) at line 6 column 19"
        );
    }

    #[test]
    fn a_san_regex_must_compile() {
        let yaml =
            tls("      caInstance: roots\n      subjectAltNames:\n        - regex: \"x)|(.*\"\n");
        assert_eq!(
            err(&yaml),
            "services[0].tls.subjectAltNames[0].regex: \"x)|(.*\" is not a valid regex: \
             found closing ')' without matching '(' at line 6 column 18"
        );
    }

    #[test]
    fn a_san_matcher_has_one_test_and_no_ignore_case_with_regex() {
        let yaml = tls(
            "      caInstance: roots\n      subjectAltNames:\n        - { exact: a, suffix: b }\n",
        );
        assert_eq!(
            err(&yaml),
            "services[0].tls.subjectAltNames[0]: \"exact, suffix\" needs exactly one of exact, \
             prefix, suffix, contains, regex at line 6 column 11"
        );
        let yaml = tls(
            "      caInstance: roots\n      subjectAltNames:\n        - { regex: a, ignoreCase: true }\n",
        );
        assert_eq!(
            err(&yaml),
            "services[0].tls.subjectAltNames[0].ignoreCase: true cannot be combined with regex \
             at line 6 column 35"
        );
    }

    #[test]
    fn system_roots_need_san_matchers() {
        // `subjectAltNames` is not written: no line to name.
        assert_eq!(
            err(&tls("      systemRootCerts: true\n")),
            "services[0].tls.subjectAltNames: \"api\" must name the servers' SANs with \
             systemRootCerts: true (without them any certificate from any publicly trusted CA \
             is accepted)"
        );
        assert_eq!(
            err(&tls(
                "      caInstance: roots\n      systemRootCerts: true\n"
            )),
            "services[0].tls.systemRootCerts: \"true\" cannot be set with caInstance (the roots \
             come from one or the other) at line 5 column 24"
        );
        assert_eq!(
            err(&tls("      identityInstance: id\n")),
            "services[0].tls.caInstance: \"\" must name a certificate provider instance of the \
             clients' bootstrap (or set systemRootCerts: true)"
        );
    }

    #[test]
    fn a_file_serving_envoy_gives_a_tls_service_tls_envoy() {
        let listener = "listener:\n  port: 10000\n";
        let exact = "      caInstance: roots\n      subjectAltNames: [ { exact: api.test } ]\n";
        assert_eq!(
            err(&format!("{listener}{}", tls(exact))),
            "services[0].tls.envoy: \"api\" is missing: Envoy would speak plaintext to a service \
             whose proxyless clients use TLS (give tls.envoy the files on the Envoy hosts, or \
             set envoyPlaintext: true if plaintext from Envoy is meant)"
        );
        // Without a listener there is no Envoy to speak plaintext.
        assert!(Config::parse(&tls(exact)).is_ok());
        assert!(Config::parse(&format!(
            "{listener}{}",
            tls(&format!("{exact}      envoyPlaintext: true\n"))
        ))
        .is_ok());
    }

    #[test]
    fn envoy_plaintext_and_tls_envoy_exclude_each_other() {
        let yaml = tls(
            "      caInstance: roots\n      envoyPlaintext: true\n      envoy: { caFile: /ca.pem }\n",
        );
        assert_eq!(
            err(&yaml),
            "services[0].tls.envoyPlaintext: true cannot be set with tls.envoy (Envoy gets TLS \
             from one or plaintext by the other) at line 5 column 23"
        );
        let yaml = tls(
            "      caInstance: roots\n      envoy: { caFile: /ca.pem, certificateFile: /c.pem }\n",
        );
        assert_eq!(
            err(&yaml),
            "services[0].tls.envoy.privateKeyFile: \"\" must be set with certificateFile (or \
             neither, for TLS without a client certificate)"
        );
    }

    #[test]
    fn keepalive_needs_h2c_and_at_least_a_millisecond() {
        let yaml = r#"services:
  - name: api
    protocol: h2c
    keepalive: { interval: 0.0005s, timeout: 1s }
"#;
        assert_eq!(
            err(yaml),
            "services[0].keepalive.interval: \"0.0005s\" must be at least 1ms (Envoy's bound) \
             at line 4 column 28"
        );
        let yaml = r#"services:
  - name: api
    keepalive: { interval: 1s, timeout: 1s }
"#;
        assert_eq!(
            err(yaml),
            "services[0].keepalive: \"api\" needs protocol: h2c (HTTP/2 PINGs keep the \
             connection alive) at line 3 column 16"
        );
    }

    #[test]
    fn outlier_detection_belongs_on_the_aggregated_services() {
        let yaml = r#"services:
  - name: all
    aggregate: [api]
    outlierDetection: { maxEjectionPercent: 50 }
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
"#;
        assert_eq!(
            err(yaml),
            "services[0].outlierDetection: \"all\" belongs on the services an aggregate service \
             names (gRPC applies it per underlying cluster) at line 4 column 23"
        );
        let yaml = yaml
            .replace(
                "    aggregate: [api]\n",
                "    endpoints: [{ address: 127.0.0.1:9000 }]\n",
            )
            .replace(
                "maxEjectionPercent: 50",
                "failurePercentage: { threshold: 101 }",
            );
        assert_eq!(
            err(&yaml),
            "services[0].outlierDetection.failurePercentage.threshold: \"101\" must be at most \
             100 at line 4 column 57"
        );
    }

    #[test]
    fn services_are_checked_before_aggregates_envoy_and_virtual_hosts() {
        // Every section below is wrong; the services' error comes first,
        // then the aggregate graph's, then the envoy section's.
        let yaml = r#"envoy:
  nodes: [{ id: "" }]
virtualhosts:
  - name: shop
    routes:
      - services: [{ name: nowhere }]
services:
  - name: all
    aggregate: [missing]
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
        weight: 0
"#;
        assert_eq!(
            err(yaml),
            "services[1].endpoints[0].weight: 0 must be greater than 0 at line 13 column 17"
        );
        let yaml = yaml.replace("        weight: 0\n", "");
        assert_eq!(
            err(&yaml),
            "services[0].aggregate[0]: \"missing\" is not a service defined in services at line 9 \
             column 17"
        );
        let yaml = yaml.replace("[missing]", "[api]");
        assert_eq!(
            err(&yaml),
            "envoy.nodes[0].id: \"\" must be non-empty at line 2 column 17"
        );
        let yaml = yaml.replace("id: \"\"", "id: edge");
        assert_eq!(
            err(&yaml),
            "virtualhosts[0].routes[0].services[0].name: \"nowhere\" is not a service defined in \
             services at line 6 column 28"
        );
    }

    #[test]
    fn a_route_checks_services_then_its_policy() {
        // Both the weights and the policy are wrong: the weights first.
        let yaml = r#"virtualhosts:
  - name: shop
    routes:
      - services: [{ name: api, weight: 0 }]
        loadBalancerPolicy: { strategy: RoundRobin, choiceCount: 3 }
services:
  - name: api
    endpoints: [{ address: 127.0.0.1:9001 }]
"#;
        assert_eq!(
            err(yaml),
            "virtualhosts[0].routes[0].services[0].weight: 0 must be greater than 0 at line 4 \
             column 41"
        );
        let yaml = yaml.replace(", weight: 0", "");
        assert_eq!(
            err(&yaml),
            "virtualhosts[0].routes[0].loadBalancerPolicy.choiceCount: \"RoundRobin\" is only \
             used with strategy WeightedLeastRequest at line 5 column 66"
        );
    }

    #[test]
    fn a_condition_sets_exactly_one_test() {
        let yaml = r#"virtualhosts:
  - name: shop
    routes:
      - conditions: [{ prefix: /a, path: /b }]
        services: [{ name: api }]
services:
  - name: api
    endpoints: [{ address: 127.0.0.1:9001 }]
"#;
        assert_eq!(
            err(yaml),
            "virtualhosts[0].routes[0].conditions[0]: 2 conditions set; each entry needs exactly \
             one of prefix, path, header at line 4 column 22"
        );
        let yaml = yaml.replace("{ prefix: /a, path: /b }", "{ prefix: a }");
        assert_eq!(
            err(&yaml),
            "virtualhosts[0].routes[0].conditions[0].prefix: \"a\" must start with '/' at line 4 \
             column 32"
        );
    }

    /// A service `api` with `extra` (lines indented by four) and one
    /// endpoint.
    fn service(extra: &str) -> String {
        format!(
            "services:\n  - name: api\n{extra}    endpoints:\n      - address: 127.0.0.1:9001\n"
        )
    }

    #[test]
    fn endpoint_metrics_must_be_orca_metrics() {
        let metrics = |list: &str| {
            service(&format!(
                "    loadReporting: {{ interval: 1s, endpointMetrics: {list} }}\n"
            ))
        };
        let good = "[cpu_utilization, mem_utilization, application_utilization, \"named_metrics.*\", named_metrics.foo]";
        let config = Config::parse(&metrics(good)).unwrap();
        let spec = config.services[0].load_reporting.as_ref().unwrap();
        assert_eq!(spec.endpoint_metrics.len(), 5);
        assert_eq!(
            err(&metrics("[cpu_utilization, named_metrics.]")),
            "services[0].loadReporting.endpointMetrics[1]: \"named_metrics.\" is not an ORCA \
             metric: cpu_utilization, mem_utilization, application_utilization, \
             named_metrics.KEY or named_metrics.* at line 3 column 71"
        );
        assert_eq!(
            err(&metrics("[cpu]")),
            "services[0].loadReporting.endpointMetrics[0]: \"cpu\" is not an ORCA metric: \
             cpu_utilization, mem_utilization, application_utilization, named_metrics.KEY or \
             named_metrics.* at line 3 column 54"
        );
    }

    #[test]
    fn drain_errors_name_the_field_and_value() {
        let reporting = "    loadReporting: { interval: 1s }\n";
        assert_eq!(
            err(&service("    drain: { removeWhenIdle: 30s }\n")),
            "services[0].drain.removeWhenIdle: 30s needs loadReporting on the service (without \
             load reports no endpoint is ever idle) at line 3 column 30"
        );
        assert_eq!(
            err(&service(&format!(
                "{reporting}    drain: {{ removeWhenIdle: 0s }}\n"
            ))),
            "services[0].drain.removeWhenIdle: 0s must be from 0.1s to 24h at line 4 column 30"
        );
        assert_eq!(
            err(&service("    drain: { maxDrain: 30d }\n")),
            "services[0].drain.maxDrain: \"30d\" is not a duration (expected e.g. \"120s\" or \
             \"1.5s\") at line 3 column 24"
        );
        assert_eq!(
            err(&service("    drain: { maxDrain: 1000000s }\n")),
            "services[0].drain.maxDrain: 1000000s must be from 0.1s to 7d (604800s) at line 3 \
             column 24"
        );
        assert_eq!(
            err(&service("    drain: { maxDrain: -5s }\n")),
            "services[0].drain.maxDrain: \"-5s\" is negative at line 3 column 24"
        );
        assert_eq!(
            err(&service(&format!(
                "{reporting}    drain: {{ removeWhenIdle: 10m, maxDrain: 300s }}\n"
            ))),
            "services[0].drain.removeWhenIdle: \"10m\" is not a duration (expected e.g. \"120s\" \
             or \"1.5s\") at line 4 column 30"
        );
        assert_eq!(
            err(&service(&format!(
                "{reporting}    drain: {{ removeWhenIdle: 600s, maxDrain: 300s }}\n"
            ))),
            "services[0].drain.removeWhenIdle: 600s must be shorter than maxDrain (300s), which \
             would always remove first at line 4 column 30"
        );
        assert_eq!(
            err(&service("    drain: {}\n")),
            "services[0].drain: {} sets neither removeWhenIdle nor maxDrain at line 3 column 12"
        );
        let e = err(&service("    drain: { removeWhenIdle: 1s, max: 2s }\n"));
        assert!(
            e.starts_with(
                "services[0].drain: unknown field `max`, expected `removeWhenIdle` or `maxDrain`"
            ),
            "{e}"
        );
        let aggregate =
            "services:\n  - name: api\n    endpoints:\n      - address: 127.0.0.1:9001\n  \
                         - name: all\n    aggregate: [api]\n    drain: { maxDrain: 60s }\n";
        assert_eq!(
            err(aggregate),
            "services[1].drain: \"all\" belongs on the services an aggregate service names (an \
             aggregate has no endpoints of its own) at line 7 column 12"
        );
        // Either key alone, or both.
        for drain in [
            "{ maxDrain: 60s }",
            "{ removeWhenIdle: 0.5s }",
            "{ removeWhenIdle: 30s, maxDrain: 600s }",
        ] {
            let c = Config::parse(&service(&format!("{reporting}    drain: {drain}\n")))
                .unwrap_or_else(|e| panic!("{drain}: {e}"));
            assert!(c.services[0].drain.is_some());
        }
    }

    #[test]
    fn drop_overloads_errors_name_the_field_and_value() {
        let drops = |list: &str| service(&format!("    dropOverloads: {list}\n"));
        let c = Config::parse(&drops(
            "[{ category: lb, percent: 0.5 }, { category: throttle, percent: 100 }, \
             { category: fine, percent: 0.0001 }, { category: none, percent: 0 }]",
        ))
        .unwrap();
        let per_million: Vec<u32> = c.services[0]
            .drop_overloads
            .iter()
            .map(|d| d.per_million())
            .collect();
        assert_eq!(per_million, [5_000, 1_000_000, 1, 0]);
        assert_eq!(
            err(&drops(
                "[{ category: lb, percent: 1 }, { category: x, percent: 150 }]"
            )),
            "services[0].dropOverloads[1].percent: 150 is not within 0..=100 at line 3 column 75"
        );
        assert_eq!(
            err(&drops("[{ category: lb, percent: -0.5 }]")),
            "services[0].dropOverloads[0].percent: -0.5 is not within 0..=100 at line 3 column 46"
        );
        assert_eq!(
            err(&drops("[{ category: lb, percent: .nan }]")),
            "services[0].dropOverloads[0].percent: NaN is not within 0..=100 at line 3 column 46"
        );
        assert_eq!(
            err(&drops("[{ category: lb, percent: .inf }]")),
            "services[0].dropOverloads[0].percent: inf is not within 0..=100 at line 3 column 46"
        );
        assert_eq!(
            err(&drops("[{ category: lb, percent: 0.00001 }]")),
            "services[0].dropOverloads[0].percent: 0.00001 is finer than a millionth of the \
             calls (at most 4 decimal places: EDS carries drops per million) at line 3 column 46"
        );
        assert_eq!(
            err(&drops("[{ category: \"\", percent: 1 }]")),
            "services[0].dropOverloads[0].category: \"\" must not be empty (clients report \
             drops under it) at line 3 column 33"
        );
        assert_eq!(
            err(&drops(
                "[{ category: lb, percent: 1 }, { category: lb, percent: 2 }]"
            )),
            "services[0].dropOverloads[1].category: \"lb\" is listed twice in the service (one \
             entry per category) at line 3 column 63"
        );
        let e = err(&drops("[{ category: lb, percent: \"5%\" }]"));
        assert!(
            e.starts_with("services[0].dropOverloads[0].percent: invalid type"),
            "{e}"
        );
        let e = err(&drops("[{ category: lb }]"));
        assert!(e.contains("missing field `percent`"), "{e}");
        let aggregate =
            "services:\n  - name: api\n    endpoints:\n      - address: 127.0.0.1:9001\n  \
                         - name: all\n    aggregate: [api]\n    dropOverloads: [{ category: lb, percent: 1 }]\n";
        assert_eq!(
            err(aggregate),
            "services[1].dropOverloads: \"all\" belongs on the services an aggregate service \
             names (drops are read from each underlying cluster's endpoints) at line 7 column 20"
        );
        // Envoy takes one category per cluster: a second one is refused
        // only in a file that serves Envoy.
        let two = "[{ category: lb, percent: 1 }, { category: x, percent: 2 }]";
        assert!(Config::parse(&drops(two)).is_ok());
        assert_eq!(
            err(&format!("listener: {{ port: 10000 }}\n{}", drops(two))),
            "services[0].dropOverloads[1]: \"x\" is a second drop category, which Envoy refuses \
             (it takes one per cluster): a file that serves Envoy gives a service one at line 4 \
             column 51"
        );
    }

    /// A service `api` with one endpoint at `address`, under a `dns`
    /// section `dns` (lines indented by two).
    fn dns(dns: &str, address: &str) -> String {
        format!("dns:\n{dns}services:\n  - name: api\n    endpoints:\n      - address: {address}\n")
    }

    #[test]
    fn dns_settings_errors_name_the_field_and_value() {
        assert_eq!(
            err(&dns(
                "  servers: [\"127.0.0.1:53\", \"dns.local:53\"]\n",
                "api.test:80"
            )),
            "dns.servers[1]: \"dns.local:53\" is not a DNS server's IP:PORT ([v6]:PORT for \
             IPv6, or an IP alone for port 53) at line 2 column 29"
        );
        assert_eq!(
            err(&dns("  servers: []\n", "api.test:80")),
            "dns.servers: \"[]\" must list at least one server (leave servers out to use the \
             system's resolv.conf) at line 2 column 12"
        );
        assert_eq!(
            err(&dns("  minRefresh: 5 seconds\n", "api.test:80")),
            "dns.minRefresh: \"5 seconds\" is not a duration (expected e.g. \"120s\" or \"1.5s\") at \
             line 2 column 15"
        );
        assert_eq!(
            err(&dns("  drainOnRemoval: -1s\n", "api.test:80")),
            "dns.drainOnRemoval: \"-1s\" is negative at line 2 column 19"
        );
        assert_eq!(
            err(&dns("  minRefresh: 0s\n", "api.test:80")),
            "dns.minRefresh: 0s must be at least 1ms at line 2 column 15"
        );
        assert_eq!(
            err(&dns("  maxRefresh: 1s\n", "api.test:80")),
            "dns.maxRefresh: 1s must be at least minRefresh (5s) at line 2 column 15"
        );
        let e = err(&dns("  refresh: 5s\n", "api.test:80"));
        assert!(
            e.starts_with("dns: unknown field `refresh`, expected one of `servers`, `minRefresh`"),
            "{e}"
        );
        assert!(e.ends_with(" at line 2 column 3"), "{e}");
        // Every setting, valid.
        let c = Config::parse(&dns(
            "  servers: [\"127.0.0.1:5353\", \"::1\"]\n  minRefresh: 0.5s\n  maxRefresh: 30s\n  drainOnRemoval: 0s\n  timeout: 1s\n",
            "API.Test:80",
        ))
        .unwrap();
        let s = c.dns.settings();
        assert_eq!(
            s.servers,
            [
                "127.0.0.1:5353".parse().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
        assert_eq!(
            (s.min_refresh, s.max_refresh, s.drain_on_removal, s.timeout),
            (
                std::time::Duration::from_millis(500),
                std::time::Duration::from_secs(30),
                std::time::Duration::ZERO,
                std::time::Duration::from_secs(1)
            )
        );
        assert_eq!(c.dns_names()[0].host, "api.test", "names are lower case");
    }

    #[test]
    fn name_addresses_are_checked_as_they_are_read() {
        let yaml = |a: &str| {
            format!("services:\n  - name: api\n    endpoints:\n      - address: \"{a}\"\n")
        };
        assert_eq!(
            err(&yaml("10.0.0.256:80")),
            "services[0].endpoints[0].address: \"10.0.0.256:80\": \"10.0.0.256\" is not a DNS \
             name (its last label is all digits) at line 4 column 18"
        );
        assert_eq!(
            err(&yaml("api.test:0")),
            "services[0].endpoints[0].address: \"api.test:0\": port \"0\" must be a number from \
             1 to 65535 at line 4 column 18"
        );
        assert_eq!(
            err(&yaml("api..test:80")),
            "services[0].endpoints[0].address: \"api..test:80\": \"api..test\" is not a DNS \
             name (each label 1 to 63 characters) at line 4 column 18"
        );
        assert_eq!(
            err(&yaml("::1:80")),
            "services[0].endpoints[0].address: invalid socket address syntax: \"::1:80\" is \
             neither IP:PORT ([v6]:PORT for IPv6) nor NAME:PORT at line 4 column 18"
        );
        // A name listed twice with the same port, like an address.
        let yaml = "services:\n  - name: api\n    endpoints:\n      - address: api.test:80\n      - address: API.test:80\n";
        assert_eq!(
            err(yaml),
            "services[0].endpoints[1].address: \"api.test:80\" is listed twice in this service \
             at line 5 column 18"
        );
        // A name's addresses are endpoints of their own.
        let yaml = "services:\n  - name: api\n    endpoints:\n      - address: api.test:80\n        additionalAddresses: [\"[::1]:80\"]\n";
        assert_eq!(
            err(yaml),
            "services[0].endpoints[0].additionalAddresses: \"api.test:80\" cannot be set beside an \
             address that is a DNS name (each address the name resolves to becomes an endpoint of \
             its own) at line 5 column 30"
        );
        // Beside an IP, a name may add addresses.
        let yaml = "services:\n  - name: api\n    endpoints:\n      - address: 127.0.0.1:80\n        additionalAddresses: [v6.api.test:80]\n";
        let c = Config::parse(yaml).unwrap();
        let names = c.dns_names();
        assert_eq!(
            (names[0].field.as_str(), names[0].value.as_str()),
            (
                "services[0].endpoints[0].additionalAddresses[0]",
                "v6.api.test:80"
            )
        );
    }
}
