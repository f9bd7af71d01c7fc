//! The control plane's YAML model, its errors (field and line), the
//! translation to Envoy and proxyless resources, and reloading that keeps
//! the last good snapshot.

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::listener::v3 as lpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use prost::Message;
use tether_control::model::SessionFilter;
use tether_control::{translate, Config, ControlPlane, Flavor, Overrides, Reload, Reloader};
use tether_core::cookie::Format;
use tether_xds::resource::{decode, ResourceKind};

const BASE: &str = r#"listener:
  port: 10000
virtualhosts:
  - name: shop
    domains: ["*"]
    routes:
      - conditions:
          - prefix: /cart
          - header: { name: x-canary, notpresent: true }
        services:
          - name: web
        loadBalancerPolicy:
          strategy: Cookie
      - conditions:
          - prefix: /api
        services:
          - name: api
        loadBalancerPolicy:
          strategy: RequestHash
          requestHashPolicies:
            - headerHashOptions: { headerName: X-User }
              terminal: true
            - hashSourceIP: true
      - services:
          - name: web
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: { name: s, path: /, ttl: 60s, attributes: [{ name: SameSite, value: Lax }] }
            overrideHostStatus: [UNKNOWN, HEALTHY, DRAINING]
            idleTimeout: 600s
services:
  - name: web
    protocol: h2c
    localityWeights: { us/a: 3 }
    endpoints:
      - address: 127.0.0.1:8001
        locality: us/a
      - address: 127.0.0.1:8002
        health: DRAINING
        weight: 2
        locality: us/b
        priority: 1
  - name: api
    endpoints:
      - address: "[::1]:9001"
"#;

/// 1-based line of the first line containing `needle`.
fn line_of(yaml: &str, needle: &str) -> usize {
    yaml.lines().position(|l| l.contains(needle)).unwrap() + 1
}

fn err(yaml: &str) -> String {
    Config::parse(yaml).unwrap_err().to_string()
}

#[test]
fn parse_errors_name_field_and_line() {
    let yaml = BASE.replace("address: 127.0.0.1:8001", "address: not-an-address");
    let e = err(&yaml);
    assert!(
        e.starts_with("services[0].endpoints[0].address: invalid socket address syntax"),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "at line {} column",
            line_of(&yaml, "not-an-address")
        )),
        "{e}"
    );
    let yaml = BASE.replace("health: DRAINING", "health: SLEEPY");
    let e = err(&yaml);
    assert!(
        e.starts_with("services[0].endpoints[1].health: \"SLEEPY\" is not one of UNKNOWN, HEALTHY"),
        "{e}"
    );
    assert!(
        e.contains(&format!("at line {} column", line_of(&yaml, "SLEEPY"))),
        "{e}"
    );
    let yaml = BASE.replace("ttl: 60s", "ttl: -5s");
    let e = err(&yaml);
    assert!(
        e.starts_with(
            "virtualhosts[0].routes[2].loadBalancerPolicy.session.cookie: ttl: \"-5s\" is negative"
        ),
        "{e}"
    );
    assert!(
        e.contains(&format!("at line {} column", line_of(&yaml, "-5s"))),
        "{e}"
    );
    let e = err(&BASE.replace("name: s, path", "name: \"a b\", path"));
    assert!(
        e.contains("cookie: name: \"a b\" is not a valid name"),
        "{e}"
    );
    let e = err(&BASE.replace("strategy: Cookie", "strategy: Sticky"));
    assert!(
        e.starts_with(
            "virtualhosts[0].routes[0].loadBalancerPolicy.strategy: unknown variant `Sticky`"
        ),
        "{e}"
    );
    let yaml = BASE.replace("weight: 2", "wieght: 2");
    let e = err(&yaml);
    assert!(e.contains("unknown field `wieght`"), "{e}");
    assert!(
        e.contains(&format!("at line {} column", line_of(&yaml, "wieght"))),
        "{e}"
    );
    let e = err("services:\n  - name: web\n    endpoints: [\n");
    assert!(e.contains(" at line 4 column 1"), "{e}");
}

/// `err(yaml)` is `message` followed by the line and column where the
/// first `needle` starts.
fn assert_err_at(yaml: &str, message: &str, needle: &str) {
    let e = err(yaml);
    let at = yaml.find(needle).unwrap();
    let line = yaml[..at].matches('\n').count() + 1;
    let column = at - yaml[..at].rfind('\n').map_or(0, |n| n + 1) + 1;
    assert_eq!(e, format!("{message} at line {line} column {column}"));
}

#[test]
fn validation_errors_name_the_field_and_line() {
    assert_err_at(
        &BASE.replace("          - name: api\n", "          - name: apx\n"),
        "virtualhosts[0].routes[1].services[0].name: \"apx\" is not a service defined in services",
        "apx",
    );
    // A field that is a mapping or a list points at its first entry.
    assert_err_at(
        &BASE.replace("        priority: 1\n", "        priority: 2\n"),
        "services[0].endpoints: [0, 2] priorities must be contiguous from 0",
        "- address: 127.0.0.1:8001",
    );
    assert_err_at(
        &BASE.replace("          strategy: Session\n", "          strategy: RoundRobin\n"),
        "virtualhosts[0].routes[2].loadBalancerPolicy.session: \"RoundRobin\" is only used with strategy Session",
        "cookie: { name: s",
    );
    let no_policies = BASE.replace(
        "          requestHashPolicies:\n            - headerHashOptions: { headerName: X-User }\n              terminal: true\n            - hashSourceIP: true\n",
        "",
    );
    // Not written at all: no line to name.
    assert_eq!(
        err(&no_policies),
        "virtualhosts[0].routes[1].loadBalancerPolicy.requestHashPolicies: \"[]\" must not be empty with strategy RequestHash"
    );
    assert_err_at(
        &BASE.replace(
            "  - name: api\n    endpoints:",
            "  - name: web\n    endpoints:",
        ),
        "services[1].name: \"web\" is defined twice",
        "web\n    endpoints:\n      - address: \"[::1]",
    );
}

// ---- Aggregate services. ----

/// `shop` fails over from the aggregate `web` (primary, then fallback) to
/// `spare`; the session route reaches every leaf through two levels.
const AGG: &str = r#"listener:
  port: 10000
virtualhosts:
  - name: shop
    routes:
      - conditions: [{ prefix: /s }]
        services:
          - name: shop
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: { name: s, path: / }
            overrideHostStatus: [UNKNOWN, HEALTHY, DRAINING]
            idleTimeout: 600s
      - services:
          - name: web
services:
  - name: shop
    aggregate: [web, spare]
  - name: web
    aggregate: [primary, fallback]
  - name: primary
    protocol: h2c
    endpoints:
      - address: 127.0.0.1:8001
      - address: 127.0.0.1:8002
        priority: 1
  - name: fallback
    endpoints:
      - address: 127.0.0.1:8003
        health: DRAINING
  - name: spare
    endpoints:
      - address: 127.0.0.1:8004
"#;

fn names<'a>(
    list: impl IntoIterator<Item = &'a tether_control::model::ServiceSpec>,
) -> Vec<&'a str> {
    list.into_iter().map(|s| s.name.as_str()).collect()
}

#[test]
fn aggregate_services_resolve_to_their_leaves() {
    let c = Config::parse(AGG).unwrap();
    let shop = c.service("shop").unwrap();
    assert!(shop.is_aggregate());
    assert_eq!(shop.children(), ["web", "spare"]);
    assert!(!c.service("primary").unwrap().is_aggregate());
    assert_eq!(
        names(c.closure("shop")),
        ["shop", "web", "primary", "fallback", "spare"]
    );
    assert_eq!(names(c.leaves("shop")), ["primary", "fallback", "spare"]);
    assert_eq!(names(c.leaves("primary")), ["primary"]);
    // A diamond counts each leaf once, at its first place.
    let diamond = AGG.replace(
        "aggregate: [web, spare]",
        "aggregate: [web, primary, spare]",
    );
    let c = Config::parse(&diamond).unwrap();
    assert_eq!(names(c.leaves("shop")), ["primary", "fallback", "spare"]);
}

fn aggregate_of(
    t: &tether_control::Translated,
    flavor: Flavor,
    name: &str,
) -> (cpb::Cluster, Vec<String>) {
    use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
    let any = &t.for_flavor(flavor)[&ResourceKind::Cluster][name];
    let c = cpb::Cluster::decode(any.value.as_slice()).unwrap();
    let Some(cpb::cluster::ClusterDiscoveryType::ClusterType(ct)) = &c.cluster_discovery_type
    else {
        panic!("{name} is not a custom cluster type: {c:?}")
    };
    assert_eq!(ct.name, "envoy.clusters.aggregate");
    let cfg = ClusterConfig::decode(ct.typed_config.as_ref().unwrap().value.as_slice()).unwrap();
    (c, cfg.clusters)
}

#[test]
fn aggregate_services_translate_for_envoy_and_proxyless() {
    let t = translate(&Config::parse(AGG).unwrap());
    // Every service's round robin cluster; the session route's cluster and,
    // below it, each service's session cluster.
    let clusters: Vec<_> = t.envoy[&ResourceKind::Cluster].keys().cloned().collect();
    assert_eq!(
        clusters,
        [
            "fallback",
            "fallback/session",
            "primary",
            "primary/session",
            "shop",
            "shop/session",
            "spare",
            "spare/session",
            "web",
            "web/session"
        ]
    );
    assert_eq!(
        t.proxyless[&ResourceKind::Cluster]
            .keys()
            .collect::<Vec<_>>(),
        clusters.iter().collect::<Vec<_>>()
    );
    // Proxyless: the aggregates as written, two levels; gRPC ignores the
    // aggregate's policy (A75), so it is left at the default.
    let (p, children) = aggregate_of(&t, Flavor::Proxyless, "shop/session");
    assert_eq!(children, ["web/session", "spare/session"]);
    assert_eq!(p.lb_policy, cpb::cluster::LbPolicy::RoundRobin as i32);
    assert!(p.eds_cluster_config.is_none() && p.common_lb_config.is_none());
    assert!(p.upstream_config.is_none());
    let (_, children) = aggregate_of(&t, Flavor::Proxyless, "web/session");
    assert_eq!(children, ["primary/session", "fallback/session"]);
    let (_, children) = aggregate_of(&t, Flavor::Proxyless, "web");
    assert_eq!(children, ["primary", "fallback"]);
    // Envoy: CLUSTER_PROVIDED, flattened to the leaves in priority order.
    let (e, children) = aggregate_of(&t, Flavor::Envoy, "shop/session");
    assert_eq!(
        children,
        ["primary/session", "fallback/session", "spare/session"]
    );
    assert_eq!(e.lb_policy, cpb::cluster::LbPolicy::ClusterProvided as i32);
    assert!(e.typed_extension_protocol_options.is_empty());
    let (_, children) = aggregate_of(&t, Flavor::Envoy, "web/session");
    assert_eq!(children, ["primary/session", "fallback/session"]);
    // The leaves keep the route's session settings and their own protocol.
    for flavor in [Flavor::Envoy, Flavor::Proxyless] {
        for leaf in ["primary/session", "fallback/session", "spare/session"] {
            let any = &t.for_flavor(flavor)[&ResourceKind::Cluster][leaf];
            let c = cpb::Cluster::decode(any.value.as_slice()).unwrap();
            let statuses = &c.common_lb_config.as_ref().unwrap().override_host_status;
            assert_eq!(statuses.as_ref().unwrap().statuses, [0, 1, 3], "{leaf}");
            assert_eq!(
                c.upstream_config.is_some(),
                flavor == Flavor::Proxyless,
                "{leaf}"
            );
        }
    }
    let primary = cpb::Cluster::decode(
        t.envoy[&ResourceKind::Cluster]["primary/session"]
            .value
            .as_slice(),
    )
    .unwrap();
    assert!(!primary.typed_extension_protocol_options.is_empty());
    // The routes name the aggregates' clusters.
    let rc = rpb::RouteConfiguration::decode(
        t.envoy[&ResourceKind::RouteConfiguration]["tether-routes"]
            .value
            .as_slice(),
    )
    .unwrap();
    let cluster_of = |i: usize| match &rc.virtual_hosts[0].routes[i].action {
        Some(rpb::route::Action::Route(a)) => format!("{:?}", a.cluster_specifier),
        other => panic!("{other:?}"),
    };
    assert!(
        cluster_of(0).contains("\"shop/session\""),
        "{}",
        cluster_of(0)
    );
    assert!(cluster_of(1).contains("\"web\""), "{}", cluster_of(1));
    // Endpoints only for services with endpoints.
    let eds: Vec<_> = t.envoy[&ResourceKind::Endpoints].keys().cloned().collect();
    assert_eq!(eds, ["fallback", "primary", "spare"]);
    // Every proxyless resource passes tether's (gRPC's) validation; the
    // aggregate is read back as one.
    for (kind, resources) in &t.proxyless {
        for (name, any) in resources {
            if let Err(e) = decode(*kind, any).result {
                panic!("{kind} {name}: {e}");
            }
        }
    }
    let Ok(tether_xds::Resource::Cluster(c)) = decode(
        ResourceKind::Cluster,
        &t.proxyless[&ResourceKind::Cluster]["shop/session"],
    )
    .result
    else {
        panic!()
    };
    assert_eq!(
        c.discovery,
        tether_xds::resource::cluster::Discovery::Aggregate {
            clusters: vec!["web/session".into(), "spare/session".into()]
        }
    );
}

#[test]
fn aggregate_errors_name_the_field_value_and_line() {
    let shop = "aggregate: [web, spare]";
    let with = |list: &str| AGG.replace(shop, &format!("aggregate: {list}"));
    assert_err_at(
        &with("[web, spores]"),
        "services[0].aggregate[1]: \"spores\" is not a service defined in services",
        "spores",
    );
    assert_err_at(
        &with("[web, shop]"),
        "services[0].aggregate[1]: \"shop\" is the aggregate service itself",
        "shop]",
    );
    assert_err_at(
        &with("[web, spare, web]"),
        "services[0].aggregate[2]: \"web\" is listed twice",
        "web]",
    );
    assert_err_at(
        &with("[]"),
        "services[0].aggregate: \"[]\" must name at least one service",
        "[]",
    );
    // A cycle between aggregates, named at the entry that closes it.
    let cycle = AGG.replace(
        "aggregate: [primary, fallback]",
        "aggregate: [primary, shop]",
    );
    assert_err_at(
        &cycle,
        "services[1].aggregate[1]: \"shop\" closes a cycle: shop -> web -> shop",
        "shop]",
    );
    // An aggregate has nothing of its own to balance.
    let own = AGG.replace(
        "    aggregate: [web, spare]\n",
        "    aggregate: [web, spare]\n    endpoints:\n      - address: 127.0.0.1:9000\n",
    );
    assert_err_at(
        &own,
        "services[0].endpoints: [\"127.0.0.1:9000\"] must be empty in an aggregate service: endpoints belong to the services it aggregates",
        "- address: 127.0.0.1:9000",
    );
    let own = AGG.replace(
        "    aggregate: [web, spare]\n",
        "    aggregate: [web, spare]\n    localityWeights: { us/a: 2 }\n",
    );
    assert_err_at(
        &own,
        "services[0].localityWeights.us/a: \"us/a\" is not used by an aggregate service: set it on the services it aggregates",
        "2 }",
    );
    let own = AGG.replace(
        "    aggregate: [web, spare]\n",
        "    aggregate: [web, spare]\n    protocol: h2c\n",
    );
    assert_err_at(
        &own,
        "services[0].protocol: \"h2c\" is not used by an aggregate service: set it on the services it aggregates",
        "h2c\n  - name: web",
    );
    // A service reached through an aggregate and directly must get one set
    // of session settings.
    let direct = AGG.replace(
        "      - services:\n          - name: web\n",
        "      - services:\n          - name: spare\n        loadBalancerPolicy:\n          strategy: Session\n          session: { cookie: { name: t, path: / } }\n",
    );
    assert_err_at(
        &direct,
        "virtualhosts[0].routes[1].loadBalancerPolicy.session: \"spare\" asks for other overrideHostStatus/idleTimeout on this service than virtualhosts[0].routes[0].loadBalancerPolicy.session",
        "{ cookie: { name: t",
    );
}

/// Services `top` → `c0` → … → `c<n-2>` (with endpoints): `n` clusters deep.
fn chain(n: usize) -> String {
    let mut yaml = String::from("services:\n  - name: top\n    aggregate: [c0]\n");
    for i in 0..n - 2 {
        yaml.push_str(&format!("  - name: c{i}\n    aggregate: [c{}]\n", i + 1));
    }
    yaml.push_str(&format!(
        "  - name: c{}\n    endpoints: [{{ address: 127.0.0.1:80 }}]\n",
        n - 2
    ));
    yaml
}

#[test]
fn aggregate_chains_stop_where_grpc_stops() {
    // 16 clusters: what gRPC (and `tether xds dump`) resolve.
    let c = Config::parse(&chain(16)).unwrap();
    assert_eq!(names(c.leaves("top")), ["c14"]);
    // 17: refused, the longest chain named from its top.
    assert_err_at(
        &chain(17),
        "services[0].aggregate[0]: \"c0\" makes a chain of 17 clusters (top -> c0 -> ... -> c14 -> c15); gRPC follows at most 16",
        "c0]",
    );
    // Long graphs are walked without recursion.
    assert!(err(&chain(20_000)).contains("makes a chain of 20000 clusters"));
}

#[test]
fn tether_control_refuses_to_start_on_a_cycle() {
    let dir = std::env::temp_dir().join(format!("tether-cycle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tether.yaml");
    let cycle = AGG.replace(
        "aggregate: [primary, fallback]",
        "aggregate: [primary, shop]",
    );
    std::fs::write(&path, &cycle).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tether-control"))
        .arg("--config")
        .arg(&path)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // It must exit by itself; killed after 10 s otherwise.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.expect("tether-control kept running on a file with a cycle");
    assert_eq!(status.code(), Some(1), "{stderr}");
    let line = line_of(&cycle, "[primary, shop]");
    assert!(
        stderr.contains(&format!(
            "tether.yaml: services[1].aggregate[1]: \"shop\" closes a cycle: shop -> web -> shop at line {line} column"
        )),
        "{stderr}"
    );
}

fn cluster(flavor: Flavor, name: &str) -> cpb::Cluster {
    let t = translate(&Config::parse(BASE).unwrap());
    let any = &t.for_flavor(flavor)[&ResourceKind::Cluster][name];
    cpb::Cluster::decode(any.value.as_slice()).unwrap()
}

/// An EDS resource as tether's parser (gRPC's rules) reads it back.
fn parsed_endpoints(
    any: &envoy_types::pb::google::protobuf::Any,
) -> std::sync::Arc<tether_xds::resource::endpoint::EndpointsResource> {
    match decode(ResourceKind::Endpoints, any).result {
        Ok(tether_xds::Resource::Endpoints(eds)) => eds,
        other => panic!("not endpoints: {other:?}"),
    }
}

#[test]
fn load_reporting_asks_for_lrs_and_the_backends_orca_metrics() {
    let yaml = BASE.replace(
        "    protocol: h2c\n",
        "    protocol: h2c\n    loadReporting: { interval: 1s, endpointMetrics: [cpu_utilization, \"named_metrics.*\", named_metrics.foo] }\n",
    );
    let t = translate(&Config::parse(&yaml).unwrap());
    assert_eq!(t.load_reporting["web"], std::time::Duration::from_secs(1));
    let metrics = ["cpu_utilization", "named_metrics.*", "named_metrics.foo"];
    for flavor in [Flavor::Proxyless, Flavor::Envoy] {
        // Every cluster of the service, whatever its strategy.
        for name in ["web", "web/ring-hash", "web/session"] {
            let any = &t.for_flavor(flavor)[&ResourceKind::Cluster][name];
            let c = cpb::Cluster::decode(any.value.as_slice()).unwrap();
            assert_eq!(c.lrs_report_endpoint_metrics, metrics, "{flavor:?} {name}");
            // Envoy reports through its bootstrap's load stats config.
            assert_eq!(
                c.lrs_server.is_some(),
                flavor == Flavor::Proxyless,
                "{name}"
            );
        }
    }
    // A service without loadReporting asks for neither.
    let api = cluster(Flavor::Proxyless, "api");
    assert!(api.lrs_server.is_none() && api.lrs_report_endpoint_metrics.is_empty());
}

#[test]
fn translation_for_envoy_and_proxyless() {
    let t = translate(&Config::parse(BASE).unwrap());
    // Envoy: one TCP listener; proxyless: an API listener per virtual host.
    let envoy_listeners: Vec<_> = t.envoy[&ResourceKind::Listener].keys().cloned().collect();
    assert_eq!(envoy_listeners, ["tether-ingress"]);
    let l = lpb::Listener::decode(
        t.proxyless[&ResourceKind::Listener]["shop"]
            .value
            .as_slice(),
    )
    .unwrap();
    assert!(l.api_listener.is_some());
    let clusters: Vec<_> = t.envoy[&ResourceKind::Cluster].keys().cloned().collect();
    assert_eq!(
        clusters,
        [
            "api",
            "api/ring-hash",
            "web",
            "web/ring-hash",
            "web/session"
        ]
    );
    // Session cluster: override_host_status for both, idle timeout only for proxyless.
    let e = cluster(Flavor::Envoy, "web/session");
    let p = cluster(Flavor::Proxyless, "web/session");
    assert_eq!(
        e.common_lb_config
            .as_ref()
            .unwrap()
            .override_host_status
            .as_ref()
            .unwrap()
            .statuses,
        [0, 1, 3]
    );
    assert!(e.upstream_config.is_none());
    assert!(p.upstream_config.is_some());
    assert!(e
        .typed_extension_protocol_options
        .contains_key("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"));
    assert!(p.typed_extension_protocol_options.is_empty());
    assert_eq!(
        cluster(Flavor::Envoy, "web/ring-hash").lb_policy,
        cpb::cluster::LbPolicy::RingHash as i32
    );
    // Routes: Contour's cookie, the request hash policies, the session override.
    let rc = rpb::RouteConfiguration::decode(
        t.envoy[&ResourceKind::RouteConfiguration]["tether-routes"]
            .value
            .as_slice(),
    )
    .unwrap();
    let routes = &rc.virtual_hosts[0].routes;
    let Some(rpb::route::Action::Route(a0)) = &routes[0].action else {
        panic!()
    };
    assert!(format!("{:?}", a0.hash_policy).contains("X-Contour-Session-Affinity"));
    assert!(routes[0].r#match.as_ref().unwrap().headers[0].invert_match);
    let Some(rpb::route::Action::Route(a1)) = &routes[1].action else {
        panic!()
    };
    assert_eq!(a1.hash_policy.len(), 2);
    assert!(a1.hash_policy[0].terminal);
    assert!(routes[2]
        .typed_per_filter_config
        .contains_key("envoy.filters.http.stateful_session"));
    // Every proxyless resource passes tether's (gRPC's) validation.
    for (kind, resources) in &t.proxyless {
        for (name, any) in resources {
            if let Err(e) = decode(*kind, any).result {
                panic!("{kind} {name}: {e}");
            }
        }
    }
    // The locality weights and the DRAINING endpoint arrive in EDS.
    let eds = parsed_endpoints(&t.proxyless[&ResourceKind::Endpoints]["web"]);
    assert_eq!(eds.priorities[0].localities[0].weight, 3);
    assert_eq!(eds.priorities[1].localities[0].endpoints[0].weight, 2);
    assert_eq!(
        eds.priorities[1].localities[0].endpoints[0].health.as_str(),
        "DRAINING"
    );
}

/// A service's `dropOverloads` reach its ClusterLoadAssignment as
/// `policy.drop_overloads`, per million, for Envoy and proxyless clients
/// alike; tether's parser (gRPC's rules) reads back the shares written.
#[test]
fn drop_overloads_reach_eds_per_million() {
    use envoy_types::pb::envoy::config::endpoint::v3 as epb;
    use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
    let yaml = BASE.replace(
        "    localityWeights: { us/a: 3 }\n",
        "    localityWeights: { us/a: 3 }\n    dropOverloads: [{ category: throttle, percent: 12.5 }, \
         { category: lb, percent: 0.0001 }]\n",
    );
    // BASE serves Envoy, which takes one category: the second is refused.
    assert!(
        err(&yaml).starts_with("services[0].dropOverloads[1]: \"lb\" is a second drop category")
    );
    let yaml = yaml.replace("listener:\n  port: 10000\n", "");
    let t = translate(&Config::parse(&yaml).unwrap());
    for flavor in [Flavor::Proxyless, Flavor::Envoy] {
        let any = &t.for_flavor(flavor)[&ResourceKind::Endpoints]["web"];
        let cla = epb::ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
        let drops: Vec<_> = cla
            .policy
            .as_ref()
            .unwrap()
            .drop_overloads
            .iter()
            .map(|d| {
                let p = d.drop_percentage.as_ref().unwrap();
                assert_eq!(p.denominator, DenominatorType::Million as i32, "{flavor:?}");
                (d.category.as_str(), p.numerator)
            })
            .collect();
        assert_eq!(drops, [("throttle", 125_000), ("lb", 1)], "{flavor:?}");
        // A service without drops has no policy.
        let api = &t.for_flavor(flavor)[&ResourceKind::Endpoints]["api"];
        let api = epb::ClusterLoadAssignment::decode(api.value.as_slice()).unwrap();
        assert!(api.policy.is_none(), "{flavor:?}");
    }
    let eds = parsed_endpoints(&t.proxyless[&ResourceKind::Endpoints]["web"]);
    let read: Vec<_> = eds
        .drop_overloads
        .iter()
        .map(|d| (d.category.as_str(), d.per_million))
        .collect();
    assert_eq!(read, [("throttle", 125_000), ("lb", 1)]);
    // 100% is a million: every call dropped.
    let all = BASE.replace(
        "    localityWeights: { us/a: 3 }\n",
        "    localityWeights: { us/a: 3 }\n    dropOverloads: [{ category: all, percent: 100 }]\n",
    );
    let t = translate(&Config::parse(&all).unwrap());
    let eds = parsed_endpoints(&t.envoy[&ResourceKind::Endpoints]["web"]);
    assert_eq!(eds.drop_overloads[0].per_million, 1_000_000);
}

/// A service's `keepalive` reaches Envoy's HTTP/2 options (proxyless
/// clients set their own: gRPC does not take keepalive from xDS).
#[test]
fn keepalive_reaches_envoy_h2_options() {
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        explicit_http_config::ProtocolConfig, UpstreamProtocolOptions,
    };
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
    let yaml = BASE.replace(
        "    protocol: h2c\n",
        "    protocol: h2c\n    keepalive: { interval: 2s, timeout: 0.5s }\n",
    );
    let t = translate(&Config::parse(&yaml).unwrap());
    for name in ["web", "web/session", "web/ring-hash"] {
        let any = &t.envoy[&ResourceKind::Cluster][name];
        let c = cpb::Cluster::decode(any.value.as_slice()).unwrap();
        let opts = &c.typed_extension_protocol_options
            ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
        let opts = HttpProtocolOptions::decode(opts.value.as_slice()).unwrap();
        let Some(UpstreamProtocolOptions::ExplicitHttpConfig(e)) = opts.upstream_protocol_options
        else {
            panic!("{name}: no explicit HTTP config")
        };
        let Some(ProtocolConfig::Http2ProtocolOptions(h2)) = e.protocol_config else {
            panic!("{name}: not HTTP/2")
        };
        let k = h2.connection_keepalive.expect("connection_keepalive");
        let interval = k.interval.unwrap();
        let timeout = k.timeout.unwrap();
        assert_eq!((interval.seconds, interval.nanos), (2, 0), "{name}");
        assert_eq!((timeout.seconds, timeout.nanos), (0, 500_000_000), "{name}");
        let p = cluster(Flavor::Proxyless, name);
        assert!(p.typed_extension_protocol_options.is_empty(), "{name}");
    }
    // Without it, none.
    let c = cluster(Flavor::Envoy, "web");
    let opts = HttpProtocolOptions::decode(
        c.typed_extension_protocol_options
            ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            .value
            .as_slice(),
    )
    .unwrap();
    assert!(!format!("{opts:?}").contains("KeepaliveSettings"));
    // Errors name the field.
    assert_err_at(
        &BASE.replace(
            "  - name: api\n    endpoints:",
            "  - name: api\n    keepalive: { interval: 1s, timeout: 1s }\n    endpoints:",
        ),
        "services[1].keepalive: \"api\" needs protocol: h2c (HTTP/2 PINGs keep the connection alive)",
        "{ interval: 1s, timeout: 1s }",
    );
    assert_err_at(
        &yaml.replace("timeout: 0.5s", "timeout: 0s"),
        "services[0].keepalive.timeout: \"0s\" must be at least 1ms (Envoy's bound)",
        "0s }",
    );
    assert!(err(&yaml.replace("timeout: 0.5s", "timeut: 0.5s")).contains("timeut"));
}

/// A service's `tls` reaches proxyless clusters as A29's
/// UpstreamTlsContext, which tether's own validation accepts; Envoy's
/// clusters are left alone.
#[test]
fn tls_reaches_proxyless_clusters_as_an_upstream_tls_context() {
    let yaml = BASE.replace(
        "  - name: api\n    endpoints:",
        "  - name: api\n    tls:\n      caInstance: roots\n      identityInstance: identity\n      \
         subjectAltNames:\n        - exact: spiffe://td/sa/api\n        - suffix: .api.test\n          \
         ignoreCase: true\n      envoyPlaintext: true\n    endpoints:",
    );
    let t = translate(&Config::parse(&yaml).unwrap());
    let p =
        cpb::Cluster::decode(t.proxyless[&ResourceKind::Cluster]["api"].value.as_slice()).unwrap();
    assert!(p.transport_socket.is_some());
    let mut options = tether_xds::resource::ValidationOptions::default();
    options.certificate_providers = ["roots".to_owned(), "identity".to_owned()].into();
    let Ok(tether_xds::Resource::Cluster(c)) = tether_xds::resource::decode_with(
        ResourceKind::Cluster,
        &t.proxyless[&ResourceKind::Cluster]["api"],
        options,
    )
    .result
    else {
        panic!("tether NACKs tether-control's cluster")
    };
    let security = c.security.clone().expect("the cluster's TLS");
    assert!(
        matches!(&security.roots, tether_xds::resource::security::Roots::Provider(p) if p.instance_name == "roots"),
        "{:?}",
        security.roots
    );
    assert_eq!(security.identity.unwrap().instance_name, "identity");
    assert_eq!(security.san_matchers.len(), 2);
    assert!(security.san_matchers[1].ignore_case);
    assert!(cluster(Flavor::Envoy, "api").transport_socket.is_none());
    // Errors name the field.
    assert_err_at(
        &yaml.replace("        - exact: spiffe://td/sa/api\n", "        - { exact: a, prefix: b }\n"),
        "services[1].tls.subjectAltNames[0]: \"exact, prefix\" needs exactly one of exact, prefix, suffix, \
         contains, regex",
        "{ exact: a",
    );
    assert!(err(&yaml.replace("caInstance", "caInstanse")).contains("caInstanse"));
    // `tls.envoy`: Envoy's clusters get the same TLS from files.
    let with_envoy = yaml.replace("      envoyPlaintext: true\n", "").replace(
        "    endpoints:\n      - address: \"[::1]:9001\"",
        "      envoy:\n        caFile: /certs/ca.pem\n        certificateFile: /certs/c.pem\n        \
         privateKeyFile: /certs/k.pem\n    endpoints:\n      - address: \"[::1]:9001\"",
    );
    assert_ne!(with_envoy, yaml, "the fixture changed");
    let t = translate(&Config::parse(&with_envoy).unwrap());
    let e = cpb::Cluster::decode(t.envoy[&ResourceKind::Cluster]["api"].value.as_slice()).unwrap();
    let socket = e.transport_socket.expect("Envoy's cluster has TLS");
    assert_eq!(socket.name, "envoy.transport_sockets.tls");
    let missing_key = err(&with_envoy.replace("        privateKeyFile: /certs/k.pem\n", ""));
    assert!(
        missing_key.starts_with(
            "services[1].tls.envoy.privateKeyFile: \"\" must be set with certificateFile"
        ),
        "{missing_key}"
    );
}

/// What the security review found tether-control let through: a TLS
/// service that Envoy reaches in plaintext without saying so, SAN matchers
/// that match every SAN, system roots that trust any public certificate.
#[test]
fn tls_mistakes_are_refused_by_field() {
    let tls = |body: &str| {
        BASE.replace(
            "  - name: api\n    endpoints:",
            &format!("  - name: api\n    tls:\n{body}    endpoints:"),
        )
    };
    let starts = |yaml: &str, want: &str| {
        let e = err(yaml);
        assert!(e.starts_with(want), "{e}\nwanted: {want}");
    };
    let exact = "      caInstance: roots\n      subjectAltNames: [ { exact: api.test } ]\n";
    // The file serves Envoy (it has a listener): TLS for proxyless clients
    // only must be said.
    starts(
        &tls(exact),
        "services[1].tls.envoy: \"api\" is missing: Envoy would speak plaintext to a service whose \
         proxyless clients use TLS",
    );
    assert!(Config::parse(&tls(&format!("{exact}      envoyPlaintext: true\n"))).is_ok());
    starts(
        &tls(&format!(
            "{exact}      envoyPlaintext: true\n      envoy: {{ caFile: /ca.pem }}\n"
        )),
        "services[1].tls.envoyPlaintext: true cannot be set with tls.envoy",
    );
    // A file for proxyless clients only has no Envoy to speak plaintext.
    let proxyless = tls(exact);
    let proxyless = &proxyless[proxyless.find("virtualhosts:").unwrap()..];
    assert!(Config::parse(proxyless).is_ok(), "{}", err(proxyless));
    // Empty matchers match every SAN; a regex must be one on its own.
    for field in ["exact", "prefix", "suffix", "contains", "regex"] {
        starts(
            &tls(&format!(
                "      caInstance: roots\n      envoyPlaintext: true\n      subjectAltNames:\n        \
                 - exact: api.test\n        - {field}: \"\"\n"
            )),
            &format!("services[1].tls.subjectAltNames[1].{field}: \"\" is empty (it would match every SAN)"),
        );
    }
    starts(
        &tls(
            "      caInstance: roots\n      envoyPlaintext: true\n      subjectAltNames:\n        \
              - regex: \"x)|(.*\"\n",
        ),
        "services[1].tls.subjectAltNames[0].regex: \"x)|(.*\" is not a valid regex",
    );
    // System roots without SAN matchers trust any public certificate.
    starts(
        &tls("      systemRootCerts: true\n      envoyPlaintext: true\n"),
        "services[1].tls.subjectAltNames: \"api\" must name the servers' SANs with systemRootCerts: \
         true",
    );
    assert!(Config::parse(&tls(
        "      systemRootCerts: true\n      envoyPlaintext: true\n      subjectAltNames: [ { exact: api.test } ]\n"
    ))
    .is_ok());
}

#[test]
fn reload_keeps_the_last_good_snapshot() {
    let dir = std::env::temp_dir().join(format!("tether-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tether.yaml");
    std::fs::write(&path, BASE).unwrap();
    let (plane, mut reloader): (ControlPlane, Reloader) = Reloader::start(&path).unwrap();
    assert_eq!(plane.snapshot().version, 1);
    assert_eq!(reloader.reload(), Reload::Unchanged);
    // A bad file: rejected with its field, version 1 still served.
    std::fs::write(
        &path,
        BASE.replace("address: 127.0.0.1:8001", "address: 127.0.0.1"),
    )
    .unwrap();
    let Reload::Rejected(e) = reloader.reload() else {
        panic!("accepted a bad file")
    };
    let msg = e.to_string();
    assert!(
        msg.contains("tether.yaml: services[0].endpoints[0].address"),
        "{msg}"
    );
    assert_eq!(plane.snapshot().version, 1);
    assert_eq!(
        reloader.reload(),
        Reload::Unchanged,
        "a bad file is reported once"
    );
    // A cycle between aggregate services: rejected with its field and line.
    let cycle = AGG.replace(
        "aggregate: [primary, fallback]",
        "aggregate: [primary, shop]",
    );
    std::fs::write(&path, &cycle).unwrap();
    let Reload::Rejected(e) = reloader.reload() else {
        panic!("accepted a cycle")
    };
    let msg = e.to_string();
    assert!(
        msg.contains("tether.yaml: services[1].aggregate[1]: \"shop\" closes a cycle")
            && msg.contains(&format!(
                " at line {} column",
                line_of(&cycle, "[primary, shop]")
            )),
        "{msg}"
    );
    assert_eq!(plane.snapshot().version, 1);
    // A good change: version 2. Same resources again (a comment): still 2.
    std::fs::write(&path, BASE.replace("127.0.0.1:8001", "127.0.0.1:8003")).unwrap();
    assert_eq!(reloader.reload(), Reload::Published(2));
    std::fs::write(
        &path,
        format!(
            "# a comment\n{}",
            BASE.replace("127.0.0.1:8001", "127.0.0.1:8003")
        ),
    )
    .unwrap();
    assert_eq!(reloader.reload(), Reload::Published(2));
    let _ = std::fs::remove_dir_all(&dir);
}

// The tether plugin for Envoy clients (`envoy.sessionFilter: plugin`).

const PLUGIN: &str = "/opt/tether/tether_plugin.wasm";

/// BASE with the plugin for Envoy, writing C-core's format.
fn with_plugin() -> String {
    let yaml = BASE.replace(
        "            idleTimeout: 600s\n",
        "            idleTimeout: 600s\n            format: grpc\n",
    );
    format!("{yaml}envoy:\n  sessionFilter: plugin\n  plugin:\n    filename: {PLUGIN}\n")
}

fn decode_any<M: Message + Default>(any: &envoy_types::pb::google::protobuf::Any) -> M {
    M::decode(any.value.as_slice()).unwrap()
}

#[test]
fn plugin_settings_parse() {
    let c = Config::parse(&with_plugin()).unwrap();
    assert_eq!(c.envoy.session_filter, SessionFilter::Plugin);
    let plugin = c.envoy.plugin.as_ref().unwrap();
    assert_eq!(plugin.filename.as_deref(), Some(PLUGIN));
    assert_eq!(plugin.override_header(), "x-tether-override-host");
    let session = c.virtualhosts[0].routes[2]
        .load_balancer_policy
        .session
        .as_ref()
        .unwrap();
    assert_eq!(session.format.unwrap().0, Format::Grpc);
    // Without the section: Envoy's own filter.
    assert_eq!(
        Config::parse(BASE).unwrap().envoy.session_filter,
        SessionFilter::Native
    );
    // The command line gives (and overrides) the file.
    let no_file = with_plugin().replace(&format!("    filename: {PLUGIN}\n"), "");
    let over = Overrides {
        plugin_filename: Some("/srv/plugin.wasm".into()),
    };
    let c = Config::parse_with(&no_file, &over).unwrap();
    assert_eq!(
        c.envoy.plugin.unwrap().filename.as_deref(),
        Some("/srv/plugin.wasm")
    );
    let c = Config::parse_with(&with_plugin(), &over).unwrap();
    assert_eq!(
        c.envoy.plugin.unwrap().filename.as_deref(),
        Some("/srv/plugin.wasm")
    );
}

#[test]
fn plugin_errors_name_the_field_value_and_line() {
    let yaml = with_plugin();
    // A format needs the plugin: Envoy's own filter writes only its own.
    let native = BASE.replace(
        "            idleTimeout: 600s\n",
        "            idleTimeout: 600s\n            format: grpc\n",
    );
    assert_err_at(
        &native,
        "virtualhosts[0].routes[2].loadBalancerPolicy.session.format: \"grpc\" needs envoy.sessionFilter: plugin (Envoy's own filter writes only its own format; proxyless clients choose theirs)",
        "grpc",
    );
    // Plugin settings without the plugin.
    assert_err_at(
        &yaml.replace("sessionFilter: plugin", "sessionFilter: native"),
        "envoy.plugin: \"native\" is only used with envoy.sessionFilter: plugin (envoy.sessionFilter is native)",
        "filename:",
    );
    // No file, a relative file, a bad header.
    let e = err(&yaml.replace(&format!("    filename: {PLUGIN}\n"), ""));
    assert_eq!(
        e,
        "envoy.plugin.filename: \"\" is required with envoy.sessionFilter: plugin (or tether-control --plugin FILE)"
    );
    assert_err_at(
        &yaml.replace(PLUGIN, "tether_plugin.wasm"),
        "envoy.plugin.filename: \"tether_plugin.wasm\" must be an absolute path (Envoy opens it from its own working directory)",
        "tether_plugin.wasm",
    );
    assert_err_at(
        &format!("{yaml}    overrideHeader: \"x bad\"\n"),
        "envoy.plugin.overrideHeader: \"x bad\" is not a valid header name",
        "\"x bad\"",
    );
    // Bad values and unknown fields, from the parser.
    let e = err(&yaml.replace("sessionFilter: plugin", "sessionFilter: wasm"));
    assert!(
        e.starts_with("envoy.sessionFilter: unknown variant `wasm`, expected `native` or `plugin`"),
        "{e}"
    );
    assert!(
        e.contains(&format!("at line {}", line_of(&yaml, "sessionFilter"))),
        "{e}"
    );
    let e = err(&yaml.replace("format: grpc", "format: json"));
    assert!(
        e.starts_with("virtualhosts[0].routes[2].loadBalancerPolicy.session.format: \"json\" is not a cookie format (envoy, grpc, legacy, sealed)"),
        "{e}"
    );
    let e = err(&yaml.replace("    filename:", "    file:"));
    assert!(e.starts_with("envoy.plugin: unknown field `file`"), "{e}");
}

#[test]
fn plugin_translation_for_envoy_leaves_proxyless_alone() {
    use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
    use envoy_types::pb::envoy::extensions::load_balancing_policies::override_host::v3::OverrideHost;
    use envoy_types::pb::envoy::extensions::wasm::v3::plugin_config::Vm;
    use envoy_types::pb::envoy::extensions::wasm::v3::PluginConfig;

    // A second Session route with other cookie settings: a second instance.
    let yaml = with_plugin().replace(
        "services:\n  - name: web\n    protocol",
        "      - conditions: [{ prefix: /checkout }]\n        services: [{ name: api }]\n        loadBalancerPolicy:\n          strategy: Session\n          session: { cookie: { name: pay, path: /checkout }, format: envoy }\nservices:\n  - name: web\n    protocol",
    );
    let t = translate(&Config::parse(&yaml).unwrap());
    // Proxyless clients get exactly what they get without the plugin.
    let native = yaml
        .replace("            format: grpc\n", "")
        .replace(", format: envoy", "")
        .replace(
            &format!("envoy:\n  sessionFilter: plugin\n  plugin:\n    filename: {PLUGIN}\n"),
            "",
        );
    assert_eq!(
        t.proxyless,
        translate(&Config::parse(&native).unwrap()).proxyless
    );

    // Envoy's filters: both instances, off by default, then the router.
    let l: lpb::Listener = decode_any(&t.envoy[&ResourceKind::Listener]["tether-ingress"]);
    let Some(lpb::filter::ConfigType::TypedConfig(any)) =
        l.filter_chains[0].filters[0].config_type.clone()
    else {
        panic!()
    };
    let manager: hcm::HttpConnectionManager = decode_any(&any);
    let names: Vec<(&str, bool)> = manager
        .http_filters
        .iter()
        .map(|f| (f.name.as_str(), f.disabled))
        .collect();
    assert_eq!(
        names,
        [
            ("tether", true),
            ("tether-2", true),
            ("envoy.filters.http.router", false)
        ]
    );
    let Some(hcm::http_filter::ConfigType::TypedConfig(any)) = &manager.http_filters[0].config_type
    else {
        panic!()
    };
    assert_eq!(
        any.type_url,
        "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
    );
    let wasm: Wasm = decode_any(any);
    let config: PluginConfig = wasm.config.unwrap();
    assert_eq!(
        (config.name.as_str(), config.root_id.as_str()),
        ("tether", "tether")
    );
    let json: envoy_types::pb::google::protobuf::StringValue =
        decode_any(config.configuration.as_ref().unwrap());
    assert_eq!(
        json.value,
        r#"{"cookie":{"name":"s","path":"/","ttl":"60s","attributes":[{"name":"SameSite","value":"Lax"}]},"strict":false,"format":"grpc","override_header":"x-tether-override-host","override_encoding":"list"}"#
    );
    let Some(Vm::VmConfig(vm)) = config.vm else {
        panic!()
    };
    assert_eq!(vm.runtime, "envoy.wasm.runtime.v8");
    assert!(format!("{:?}", vm.code).contains(PLUGIN));

    // Envoy's routes switch their instance on; no stateful_session config.
    let rc: rpb::RouteConfiguration =
        decode_any(&t.envoy[&ResourceKind::RouteConfiguration]["tether-routes"]);
    let routes = &rc.virtual_hosts[0].routes;
    let on = |i: usize| -> Vec<&str> {
        let mut k: Vec<&str> = routes[i]
            .typed_per_filter_config
            .keys()
            .map(String::as_str)
            .collect();
        k.sort();
        k
    };
    assert_eq!(on(2), ["tether"]);
    assert_eq!(on(3), ["tether-2"]);
    assert!(on(0).is_empty() && on(1).is_empty());
    let filter_config: rpb::FilterConfig = decode_any(&routes[2].typed_per_filter_config["tether"]);
    assert!(!filter_config.disabled && filter_config.config.is_some());
    let Some(rpb::route::Action::Route(a)) = &routes[2].action else {
        panic!()
    };
    let retry = a.retry_policy.as_ref().unwrap();
    assert_eq!(retry.retry_on, "connect-failure");
    // A retry never goes back to the host that failed.
    assert_eq!(
        retry.retry_host_predicate[0].name,
        "envoy.retry_host_predicates.previous_hosts"
    );
    // Proxyless routes keep the stateful session override.
    let prc: rpb::RouteConfiguration =
        decode_any(&t.proxyless[&ResourceKind::RouteConfiguration]["tether-routes"]);
    assert!(prc.virtual_hosts[0].routes[2]
        .typed_per_filter_config
        .contains_key("envoy.filters.http.stateful_session"));

    // Envoy's session clusters route with override_host on the plugin's header.
    let c: cpb::Cluster = decode_any(&t.envoy[&ResourceKind::Cluster]["web/session"]);
    let policy = &c.load_balancing_policy.as_ref().unwrap().policies[0];
    let ext = policy.typed_extension_config.as_ref().unwrap();
    assert_eq!(ext.name, "envoy.load_balancing_policies.override_host");
    let oh: OverrideHost = decode_any(ext.typed_config.as_ref().unwrap());
    assert_eq!(oh.override_host_sources[0].header, "x-tether-override-host");
    assert!(format!("{:?}", oh.fallback_policy).contains("round_robin"));
    // A host that fails a connection is ejected; answers (5xx too) never eject.
    let od = c.outlier_detection.as_ref().unwrap();
    assert!(od.split_external_local_origin_errors);
    assert_eq!(od.consecutive_local_origin_failure.unwrap().value, 1);
    assert_eq!(od.enforcing_consecutive_5xx.unwrap().value, 0);
    // Other Envoy clusters are untouched.
    let rr: cpb::Cluster = decode_any(&t.envoy[&ResourceKind::Cluster]["web"]);
    assert!(rr.load_balancing_policy.is_none() && rr.outlier_detection.is_none());
}

// `envoy.nodes`: single Envoys with another session filter or listener.

/// BASE served to Envoy with its own filter, except the node `canary`,
/// which runs the plugin (writing C-core's format) on its own port.
fn with_plugin_node() -> String {
    let yaml = BASE.replace(
        "            idleTimeout: 600s\n",
        "            idleTimeout: 600s\n            format: grpc\n",
    );
    format!(
        "{yaml}envoy:\n  plugin:\n    filename: {PLUGIN}\n  nodes:\n    - id: canary\n      sessionFilter: plugin\n      listener: {{ port: 10001 }}\n"
    )
}

/// The HTTP filter names of `resources`' Envoy listener and its port.
fn envoy_listener(resources: &tether_control::translate::Resources) -> (Vec<String>, u32) {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
    let l: lpb::Listener = decode_any(&resources[&ResourceKind::Listener]["tether-ingress"]);
    let Some(lpb::filter::ConfigType::TypedConfig(any)) =
        l.filter_chains[0].filters[0].config_type.clone()
    else {
        panic!()
    };
    let manager: hcm::HttpConnectionManager = decode_any(&any);
    let Some(address::Address::SocketAddress(sa)) = l.address.unwrap().address else {
        panic!()
    };
    let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
        panic!()
    };
    (
        manager.http_filters.into_iter().map(|f| f.name).collect(),
        port,
    )
}

#[test]
fn an_envoy_node_gets_its_own_session_filter_and_listener() {
    let c = Config::parse(&with_plugin_node()).unwrap();
    assert_eq!(c.envoy.session_filter, SessionFilter::Native);
    assert!(c.envoy.uses_plugin());
    let t = translate(&c);
    // Every other Envoy: its own filter on the file's listener.
    assert_eq!(
        envoy_listener(t.for_node(Flavor::Envoy, "edge-1")),
        (
            vec![
                "envoy.filters.http.stateful_session".to_owned(),
                "envoy.filters.http.router".to_owned()
            ],
            10000
        )
    );
    // The node `canary`: the plugin, its port, override_host clusters.
    let canary = t.for_node(Flavor::Envoy, "canary");
    assert_eq!(
        envoy_listener(canary),
        (
            vec!["tether".to_owned(), "envoy.filters.http.router".to_owned()],
            10001
        )
    );
    let session: cpb::Cluster = decode_any(&canary[&ResourceKind::Cluster]["web/session"]);
    assert!(session.load_balancing_policy.is_some());
    // What the plugin file alone gives every Envoy, with the node's port.
    let all_plugin = with_plugin_node()
        .replace(
            "envoy:\n  plugin:",
            "envoy:\n  sessionFilter: plugin\n  plugin:",
        )
        .replace("port: 10000", "port: 10001");
    assert_eq!(
        canary,
        &translate(&Config::parse(&all_plugin).unwrap()).envoy
    );
    // Proxyless clients are not Envoys, whatever their node ID.
    assert_eq!(t.for_node(Flavor::Proxyless, "canary"), &t.proxyless);
    assert_eq!(t.envoy_nodes.len(), 1);
}

#[test]
fn envoy_node_errors_name_the_field_value_and_line() {
    let yaml = with_plugin_node();
    assert_err_at(
        &format!("{yaml}    - id: \"canary\"\n"),
        "envoy.nodes[1].id: \"canary\" is listed twice",
        "\"canary\"",
    );
    assert_err_at(
        &yaml.replace("id: canary", "id: \"\""),
        "envoy.nodes[0].id: \"\" must be non-empty",
        "\"\"",
    );
    // The plugin's settings need some Envoy to run it.
    let native = yaml.replace("sessionFilter: plugin", "sessionFilter: native");
    assert_err_at(
        &native,
        "envoy.plugin: \"native\" is only used with envoy.sessionFilter: plugin (envoy.sessionFilter is native)",
        "filename:",
    );
    assert_err_at(
        &native.replace(&format!("  plugin:\n    filename: {PLUGIN}\n"), ""),
        "virtualhosts[0].routes[2].loadBalancerPolicy.session.format: \"grpc\" needs envoy.sessionFilter: plugin (Envoy's own filter writes only its own format; proxyless clients choose theirs)",
        "grpc",
    );
    let e = err(&yaml.replace("sessionFilter: plugin", "sessionFilter: wasm"));
    assert!(
        e.starts_with("envoy.nodes[0].sessionFilter: unknown variant `wasm`"),
        "{e}"
    );
    let e = err(&yaml.replace("      listener:", "      listen:"));
    assert!(
        e.starts_with("envoy.nodes[0]: unknown field `listen`"),
        "{e}"
    );
}

// ---- WeightedRoundRobin, PickFirst and Custom. ----

/// Every setting on `web`'s clusters; `api` takes the defaults.
const STRATEGIES: &str = r#"listener:
  port: 10000
virtualhosts:
  - name: shop
    routes:
      - conditions: [{ prefix: /wrr }]
        services: [{ name: web }]
        loadBalancerPolicy:
          strategy: WeightedRoundRobin
          weightedRoundRobin:
            enableOobLoadReport: true
            oobReportingPeriod: 5s
            blackoutPeriod: 0.5s
            weightExpirationPeriod: 60s
            weightUpdatePeriod: 2s
            errorUtilizationPenalty: 0.25
      - conditions: [{ prefix: /pf }]
        services: [{ name: web }]
        loadBalancerPolicy:
          strategy: PickFirst
          shuffleAddressList: true
      - conditions: [{ prefix: /custom }]
        services: [{ name: web }]
        loadBalancerPolicy:
          strategy: Custom
          custom:
            policy: example.fewest_failures
            config: { threshold: 0.5, names: [a, b], nested: { on: true } }
      - conditions: [{ prefix: /api-wrr }]
        services: [{ name: api }]
        loadBalancerPolicy:
          strategy: WeightedRoundRobin
      - conditions: [{ prefix: /api-pf }]
        services: [{ name: api }]
        loadBalancerPolicy:
          strategy: PickFirst
      - conditions: [{ prefix: /api-custom }]
        services: [{ name: api }]
        loadBalancerPolicy:
          strategy: Custom
          custom: { policy: bare }
services:
  - name: web
    endpoints:
      - address: 127.0.0.1:8001
      - address: 127.0.0.1:8002
  - name: api
    endpoints:
      - address: 127.0.0.1:9001
"#;

/// The settings `STRATEGIES` gives `web/weighted-round-robin`.
fn web_wrr_settings() -> tether_xds::lb_config::weighted_round_robin::Settings {
    use std::time::Duration;
    let mut s = tether_xds::lb_config::weighted_round_robin::Settings::default();
    s.enable_oob_load_report = true;
    s.oob_reporting_period = Duration::from_secs(5);
    s.blackout_period = Duration::from_millis(500);
    s.weight_expiration_period = Duration::from_secs(60);
    s.weight_update_period = Duration::from_secs(2);
    s.error_utilization_penalty = 0.25;
    s
}

#[test]
fn new_strategies_parse_with_their_settings() {
    use tether_control::model::Strategy;
    let c = Config::parse(STRATEGIES).unwrap();
    let policies: Vec<_> = c.virtualhosts[0]
        .routes
        .iter()
        .map(|r| &r.load_balancer_policy)
        .collect();
    assert_eq!(policies[0].strategy, Strategy::WeightedRoundRobin);
    assert_eq!(
        policies[0].weighted_round_robin.unwrap().settings(),
        web_wrr_settings()
    );
    assert_eq!(policies[1].strategy, Strategy::PickFirst);
    assert_eq!(policies[1].shuffle_address_list, Some(true));
    let custom = policies[2].custom.as_ref().unwrap();
    assert_eq!(custom.policy, "example.fewest_failures");
    assert_eq!(
        custom.config,
        serde_json::json!({"threshold": 0.5, "names": ["a", "b"], "nested": {"on": true}})
    );
    // What the clusters get: written settings, else gRPC's defaults.
    assert_eq!(c.weighted_round_robin_settings("web"), web_wrr_settings());
    assert_eq!(
        c.weighted_round_robin_settings("api"),
        tether_xds::lb_config::weighted_round_robin::Settings::default()
    );
    assert!(c.pick_first_shuffle("web"));
    assert!(!c.pick_first_shuffle("api"));
    assert_eq!(
        c.custom_policy("api").unwrap().config,
        serde_json::json!({})
    );
    // More routes on api's clusters with the defaults spelled out agree.
    let more = r#"      - services: [{ name: api }]
        loadBalancerPolicy:
          strategy: PickFirst
          shuffleAddressList: false
      - services: [{ name: api }]
        loadBalancerPolicy:
          strategy: WeightedRoundRobin
          weightedRoundRobin: { blackoutPeriod: 10s, errorUtilizationPenalty: 1 }
      - services: [{ name: api }]
        loadBalancerPolicy:
          strategy: Custom
          custom: { policy: bare, config: {} }
services:
"#;
    let spelled = STRATEGIES.replace(
        "services:\n  - name: web\n",
        &format!("{more}  - name: web\n"),
    );
    assert_ne!(spelled, STRATEGIES);
    Config::parse(&spelled).unwrap();
}

/// The Envoy or proxyless cluster `name` of `STRATEGIES`.
fn strategy_cluster(flavor: Flavor, name: &str) -> cpb::Cluster {
    let t = translate(&Config::parse(STRATEGIES).unwrap());
    decode_any(&t.for_flavor(flavor)[&ResourceKind::Cluster][name])
}

/// tether's (gRPC's) reading of the proxyless cluster `name`.
fn proxyless_lb_policy(name: &str) -> tether_xds::resource::cluster::LbPolicy {
    let t = translate(&Config::parse(STRATEGIES).unwrap());
    match decode(
        ResourceKind::Cluster,
        &t.proxyless[&ResourceKind::Cluster][name],
    )
    .result
    {
        Ok(tether_xds::Resource::Cluster(c)) => c.lb_policy.clone(),
        other => panic!("{name}: {other:?}"),
    }
}

/// The names and type URLs of a `load_balancing_policy` list.
fn policy_list(p: &cpb::LoadBalancingPolicy) -> Vec<(String, String)> {
    p.policies
        .iter()
        .map(|p| {
            let e = p.typed_extension_config.as_ref().unwrap();
            (
                e.name.clone(),
                e.typed_config.as_ref().unwrap().type_url.clone(),
            )
        })
        .collect()
}

#[test]
fn weighted_round_robin_translates_for_envoy_and_proxyless() {
    use envoy_types::pb::envoy::extensions::load_balancing_policies::client_side_weighted_round_robin::v3::ClientSideWeightedRoundRobin;
    use envoy_types::pb::envoy::extensions::load_balancing_policies::wrr_locality::v3::WrrLocality;
    use tether_xds::resource::cluster::LbPolicy;
    let t = translate(&Config::parse(STRATEGIES).unwrap());
    let clusters: Vec<_> = t.envoy[&ResourceKind::Cluster].keys().cloned().collect();
    assert_eq!(
        clusters,
        [
            "api",
            "api/custom",
            "api/pick-first",
            "api/weighted-round-robin",
            "web",
            "web/custom",
            "web/pick-first",
            "web/weighted-round-robin"
        ]
    );
    // The route sends to the strategy's cluster.
    let rc: rpb::RouteConfiguration =
        decode_any(&t.envoy[&ResourceKind::RouteConfiguration]["tether-routes"]);
    let Some(rpb::route::Action::Route(a)) = &rc.virtual_hosts[0].routes[0].action else {
        panic!()
    };
    assert_eq!(
        a.cluster_specifier,
        Some(rpb::route_action::ClusterSpecifier::Cluster(
            "web/weighted-round-robin".into()
        ))
    );
    // Envoy: the policy alone, every setting written out.
    let e = strategy_cluster(Flavor::Envoy, "web/weighted-round-robin");
    let list = e.load_balancing_policy.as_ref().unwrap();
    assert_eq!(
        policy_list(list),
        [(
            "envoy.load_balancing_policies.client_side_weighted_round_robin".to_owned(),
            "type.googleapis.com/envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin".to_owned()
        )]
    );
    let wrr: ClientSideWeightedRoundRobin = decode_any(
        list.policies[0]
            .typed_extension_config
            .as_ref()
            .unwrap()
            .typed_config
            .as_ref()
            .unwrap(),
    );
    assert!(wrr.enable_oob_load_report.unwrap().value);
    assert_eq!(wrr.blackout_period.unwrap().nanos, 500_000_000);
    assert_eq!(wrr.weight_expiration_period.unwrap().seconds, 60);
    assert_eq!(wrr.error_utilization_penalty.unwrap().value, 0.25);
    // Proxyless: WrrLocality over [weighted round robin, round robin].
    let p = strategy_cluster(Flavor::Proxyless, "web/weighted-round-robin");
    let top = p.load_balancing_policy.as_ref().unwrap();
    assert_eq!(
        policy_list(top)[0].0,
        "envoy.load_balancing_policies.wrr_locality"
    );
    let locality: WrrLocality = decode_any(
        top.policies[0]
            .typed_extension_config
            .as_ref()
            .unwrap()
            .typed_config
            .as_ref()
            .unwrap(),
    );
    let names: Vec<_> = policy_list(locality.endpoint_picking_policy.as_ref().unwrap())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "envoy.load_balancing_policies.client_side_weighted_round_robin",
            "envoy.load_balancing_policies.round_robin"
        ]
    );
    assert_eq!(
        proxyless_lb_policy("web/weighted-round-robin"),
        LbPolicy::WrrLocality(Box::new(LbPolicy::WeightedRoundRobin(web_wrr_settings())))
    );
    assert_eq!(
        proxyless_lb_policy("api/weighted-round-robin"),
        LbPolicy::WrrLocality(Box::new(LbPolicy::WeightedRoundRobin(
            tether_xds::lb_config::weighted_round_robin::Settings::default()
        )))
    );
}

#[test]
fn pick_first_translates_for_envoy_and_proxyless() {
    use tether_xds::resource::cluster::LbPolicy;
    // Envoy 1.40 has no pick_first: round robin.
    let e = strategy_cluster(Flavor::Envoy, "web/pick-first");
    assert_eq!(e.lb_policy, cpb::cluster::LbPolicy::RoundRobin as i32);
    assert!(e.load_balancing_policy.is_none());
    // Proxyless: pick_first alone, at the top.
    let p = strategy_cluster(Flavor::Proxyless, "web/pick-first");
    assert_eq!(
        policy_list(p.load_balancing_policy.as_ref().unwrap()),
        [(
            "envoy.load_balancing_policies.pick_first".to_owned(),
            "type.googleapis.com/envoy.extensions.load_balancing_policies.pick_first.v3.PickFirst"
                .to_owned()
        )]
    );
    assert_eq!(
        proxyless_lb_policy("web/pick-first"),
        LbPolicy::PickFirst { shuffle: true }
    );
    assert_eq!(
        proxyless_lb_policy("api/pick-first"),
        LbPolicy::PickFirst { shuffle: false }
    );
    assert_eq!(
        proxyless_lb_policy("web"),
        LbPolicy::RoundRobin,
        "other clusters keep round robin"
    );
}

#[test]
fn custom_translates_to_a_typed_struct_before_round_robin() {
    use envoy_types::pb::envoy::extensions::load_balancing_policies::wrr_locality::v3::WrrLocality;
    use tether_xds::resource::typed_struct::TypedStruct;
    // Envoy cannot run a client's policy: round robin.
    let e = strategy_cluster(Flavor::Envoy, "web/custom");
    assert_eq!(e.lb_policy, cpb::cluster::LbPolicy::RoundRobin as i32);
    assert!(e.load_balancing_policy.is_none());
    let custom = |name: &str| {
        let p = strategy_cluster(Flavor::Proxyless, name);
        let top = p.load_balancing_policy.unwrap();
        assert_eq!(
            policy_list(&top)[0].0,
            "envoy.load_balancing_policies.wrr_locality"
        );
        let locality: WrrLocality = decode_any(
            top.policies[0]
                .typed_extension_config
                .as_ref()
                .unwrap()
                .typed_config
                .as_ref()
                .unwrap(),
        );
        let picking = locality.endpoint_picking_policy.unwrap();
        let list = policy_list(&picking);
        assert_eq!(list.len(), 2, "{list:?}");
        assert_eq!(list[0].1, "type.googleapis.com/xds.type.v3.TypedStruct");
        assert_eq!(
            list[1],
            (
                "envoy.load_balancing_policies.round_robin".to_owned(),
                "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
                    .to_owned()
            )
        );
        let typed: TypedStruct = decode_any(
            picking.policies[0]
                .typed_extension_config
                .as_ref()
                .unwrap()
                .typed_config
                .as_ref()
                .unwrap(),
        );
        (list[0].0.clone(), typed)
    };
    let (name, typed) = custom("web/custom");
    assert_eq!(name, "example.fewest_failures");
    assert_eq!(
        typed.type_url,
        "type.googleapis.com/example.fewest_failures"
    );
    assert_eq!(
        typed.config(),
        serde_json::json!({"threshold": 0.5, "names": ["a", "b"], "nested": {"on": true}})
    );
    let (_, typed) = custom("api/custom");
    assert_eq!(typed.type_url, "type.googleapis.com/bare");
    assert_eq!(typed.config(), serde_json::json!({}));
}

#[test]
fn new_strategy_errors_name_the_field_value_and_line() {
    let pat = "virtualhosts[0].routes[0].loadBalancerPolicy";
    // weightedRoundRobin.
    assert_err_at(
        &STRATEGIES.replace("Penalty: 0.25", "Penalty: -1"),
        &format!("{pat}.weightedRoundRobin.errorUtilizationPenalty: -1.0 must be a finite number of at least 0"),
        "-1",
    );
    assert_err_at(
        &STRATEGIES.replace("Penalty: 0.25", "Penalty: .nan"),
        &format!("{pat}.weightedRoundRobin.errorUtilizationPenalty: NaN must be a finite number of at least 0"),
        ".nan",
    );
    assert_err_at(
        &STRATEGIES.replace("blackoutPeriod: 0.5s", "blackoutPeriod: 500ms"),
        &format!("{pat}.weightedRoundRobin.blackoutPeriod: \"500ms\" is not a duration (expected e.g. \"120s\" or \"1.5s\")"),
        "500ms",
    );
    assert_err_at(
        &STRATEGIES.replace("weightUpdatePeriod: 2s", "weightUpdatePeriod: -2s"),
        &format!("{pat}.weightedRoundRobin.weightUpdatePeriod: \"-2s\" is negative"),
        "-2s",
    );
    let e = err(&STRATEGIES.replace("blackoutPeriod:", "blackout:"));
    assert!(
        e.starts_with(&format!(
            "{pat}.weightedRoundRobin: unknown field `blackout`"
        )),
        "{e}"
    );
    assert_err_at(
        &STRATEGIES.replace(
            "          strategy: WeightedRoundRobin\n          weightedRoundRobin:",
            "          strategy: RoundRobin\n          weightedRoundRobin:",
        ),
        &format!("{pat}.weightedRoundRobin: \"RoundRobin\" is only used with strategy WeightedRoundRobin"),
        "enableOobLoadReport",
    );
    // A second route on web's cluster with other settings.
    let second = |policy: &str| {
        STRATEGIES.replace(
            "services:\n  - name: web\n",
            &format!(
                "      - services: [{{ name: web }}]\n        loadBalancerPolicy:\n{policy}services:\n  - name: web\n"
            ),
        )
    };
    assert_err_at(
        &second("          strategy: WeightedRoundRobin\n          weightedRoundRobin: { enableOobLoadReport: true, oobReportingPeriod: 5s, blackoutPeriod: 10s }\n"),
        "virtualhosts[0].routes[6].loadBalancerPolicy.weightedRoundRobin.blackoutPeriod: 10s differs from virtualhosts[0].routes[0].loadBalancerPolicy's weightedRoundRobin.blackoutPeriod 0.500s for service \"web\" (its routes share one cluster)",
        "10s }",
    );
    // Not written on this route: the message has no line.
    assert_eq!(
        err(&second("          strategy: WeightedRoundRobin\n")),
        "virtualhosts[0].routes[6].loadBalancerPolicy.weightedRoundRobin.enableOobLoadReport: false differs from virtualhosts[0].routes[0].loadBalancerPolicy's weightedRoundRobin.enableOobLoadReport true for service \"web\" (its routes share one cluster)",
    );

    // shuffleAddressList.
    assert_err_at(
        &STRATEGIES.replace(
            "          strategy: PickFirst\n          shuffleAddressList: true",
            "          strategy: Random\n          shuffleAddressList: true",
        ),
        "virtualhosts[0].routes[1].loadBalancerPolicy.shuffleAddressList: \"Random\" is only used with strategy PickFirst",
        "true\n      - conditions: [{ prefix: /custom",
    );
    // Through an aggregate too: its services' clusters are the ones shared.
    let via_aggregate = second("          strategy: PickFirst\n").replace(
        "      - services: [{ name: web }]\n        loadBalancerPolicy:\n          strategy: PickFirst\n",
        "      - services: [{ name: web-dr }]\n        loadBalancerPolicy:\n          strategy: PickFirst\n          shuffleAddressList: false\n",
    ) + "  - name: web-dr\n    aggregate: [web]\n";
    assert_err_at(
        &via_aggregate,
        "virtualhosts[0].routes[6].loadBalancerPolicy.shuffleAddressList: false differs from virtualhosts[0].routes[1].loadBalancerPolicy's shuffleAddressList true for service \"web\" (its routes share one cluster)",
        "false",
    );

    // custom.
    let cpat = "virtualhosts[0].routes[2].loadBalancerPolicy.custom";
    assert_eq!(
        err(&STRATEGIES.replace(
            "            policy: example.fewest_failures\n            config: { threshold: 0.5, names: [a, b], nested: { on: true } }\n",
            "",
        ).replace("          custom:\n", "")),
        format!("{cpat}: \"\" is required with strategy Custom"),
    );
    assert_err_at(
        &STRATEGIES.replace("policy: example.fewest_failures", "policy: \"my policy\""),
        &format!("{cpat}.policy: \"my policy\" must be a non-empty name of letters, digits, '_', '.' and '-' (as gRPC's policy names are)"),
        "\"my policy\"",
    );
    assert_err_at(
        &STRATEGIES.replace("policy: example.fewest_failures", "policy: \"\""),
        &format!("{cpat}.policy: \"\" must be a non-empty name of letters, digits, '_', '.' and '-' (as gRPC's policy names are)"),
        "\"\"",
    );
    assert_err_at(
        &STRATEGIES.replace(
            "config: { threshold: 0.5, names: [a, b], nested: { on: true } }",
            "config: [1, 2]",
        ),
        &format!("{cpat}.config: [1,2] must be a map"),
        "[1, 2]",
    );
    let e = err(&STRATEGIES.replace("policy: example.fewest_failures", "name: x"));
    assert!(
        e.starts_with(&format!("{cpat}: unknown field `name`")),
        "{e}"
    );
    assert_err_at(
        &STRATEGIES.replace(
            "          strategy: PickFirst\n          shuffleAddressList: true",
            "          strategy: PickFirst\n          custom: { policy: x }",
        ),
        "virtualhosts[0].routes[1].loadBalancerPolicy.custom: \"PickFirst\" is only used with strategy Custom",
        "{ policy: x }",
    );
    assert_err_at(
        &second("          strategy: Custom\n          custom: { policy: other }\n"),
        "virtualhosts[0].routes[6].loadBalancerPolicy.custom.policy: \"other\" differs from virtualhosts[0].routes[2].loadBalancerPolicy's custom.policy \"example.fewest_failures\" for service \"web\" (its routes share one cluster)",
        "other",
    );
    assert_err_at(
        &second("          strategy: Custom\n          custom: { policy: example.fewest_failures, config: { threshold: 1 } }\n"),
        "virtualhosts[0].routes[6].loadBalancerPolicy.custom.config: {\"threshold\":1} differs from virtualhosts[0].routes[2].loadBalancerPolicy's custom.config {\"threshold\":0.5,\"names\":[\"a\",\"b\"],\"nested\":{\"on\":true}} for service \"web\" (its routes share one cluster)",
        "{ threshold: 1 }",
    );
}

/// Each `Session` route's note says who reads the cookies written for it:
/// the plugin's format, or Envoy's own filter's.
#[test]
fn session_notes_say_who_reads_each_routes_cookies() {
    let yaml = |envoy: &str, format: &str| {
        format!(
            r#"listener: {{ port: 10000 }}
{envoy}virtualhosts:
  - name: shop
    routes:
      - services: [{{ name: web }}]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: {{ name: s, path: / }}
{format}services:
  - name: web
    endpoints: [{{ address: "127.0.0.1:8080" }}]
"#
        )
    };
    let plugin = "envoy:\n  sessionFilter: plugin\n  plugin: { filename: /p.wasm }\n";
    let notes = Config::parse(&yaml(plugin, "            format: grpc\n"))
        .unwrap()
        .session_notes();
    assert_eq!(
        notes,
        [
            r#"virtual host "shop" route 0: the plugin writes format grpc: read by gRPC C-core, tether; not by stock Envoy's cookie session state"#
        ]
    );
    let notes = Config::parse(&yaml("", "")).unwrap().session_notes();
    assert_eq!(
        notes,
        [
            r#"virtual host "shop" route 0: Envoy's own filter writes format envoy: read by stock Envoy's cookie session state, tether; not by gRPC C-core"#
        ]
    );
}

/// 32-byte secrets, base64.
const SEAL_NEW: &str = "bmV3LXNlYWxpbmctc2VjcmV0LTAxMjM0NTY3ODlhYmM=";
const SEAL_OLD: &str = "b2xkLXNlYWxpbmctc2VjcmV0LTAxMjM0NTY3ODlhYmM=";

/// `with_plugin()` with its Session route writing sealed cookies under the
/// keys in `keys_file`.
fn sealed_yaml(keys_file: &str) -> String {
    with_plugin().replace(
        "            format: grpc\n",
        &format!("            format: sealed\n            keysFile: {keys_file}\n"),
    )
}

/// Every Envoy resource's bytes, where the plugin's configuration travels.
fn resource_bytes(resources: &tether_control::translate::Resources) -> Vec<u8> {
    resources
        .values()
        .flat_map(|m| m.values())
        .flat_map(|any| any.value.clone())
        .collect()
}

fn holds(bytes: &[u8], text: &str) -> bool {
    bytes.windows(text.len()).any(|w| w == text.as_bytes())
}

#[test]
fn sealed_sessions_take_keys_from_a_file_and_rotate_on_reload() {
    let dir = std::env::temp_dir().join(format!("tether-sealed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("cookie-keys");
    std::fs::write(&keys, format!("# sealing keys, newest first\n{SEAL_OLD}\n")).unwrap();
    let path = dir.join("tether.yaml");
    std::fs::write(&path, sealed_yaml("cookie-keys")).unwrap();

    let (config, _) = tether_control::watch::load(&path).unwrap();
    let notes = config.session_notes().join("\n");
    assert!(
        notes.contains("the plugin writes format sealed: read by tether; not by stock Envoy's cookie session state, gRPC C-core"),
        "{notes}"
    );
    let warnings = config.session_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("proxyless clients of this route cannot read"));
    let shown = format!("{config:?}");
    assert!(!shown.contains(SEAL_OLD), "a key in Debug output");

    let (plane, mut reloader) = Reloader::start(&path).unwrap();
    let envoy = resource_bytes(&plane.snapshot().resources.envoy);
    assert!(holds(&envoy, SEAL_OLD) && holds(&envoy, "\"format\":\"sealed\""));
    assert!(!holds(
        &resource_bytes(&plane.snapshot().resources.proxyless),
        SEAL_OLD
    ));
    assert_eq!(reloader.reload(), Reload::Unchanged);

    // A new key prepended, the YAML untouched: a new version with both.
    std::fs::write(&keys, format!("{SEAL_NEW}\n{SEAL_OLD}\n")).unwrap();
    assert_eq!(reloader.reload(), Reload::Published(2));
    let envoy = resource_bytes(&plane.snapshot().resources.envoy);
    let both = format!("[\"{SEAL_NEW}\",\"{SEAL_OLD}\"]");
    assert!(holds(&envoy, &both));
    assert_eq!(reloader.reload(), Reload::Unchanged);

    // A key too short to seal: rejected naming the field and file, never
    // the key; version 2 still served.
    let short = "MDEyMzQ1Njc4OWFiY2RlZg==";
    std::fs::write(&keys, format!("{SEAL_NEW}\n{short}\n")).unwrap();
    let Reload::Rejected(e) = reloader.reload() else {
        panic!("a short key accepted")
    };
    let e = e.to_string();
    assert!(
        e.contains("virtualhosts[0].routes[2].loadBalancerPolicy.session.keysFile: \"cookie-keys\" keys[1]: \"<not shown>\" decodes to 16 bytes; a sealing key needs at least 32"),
        "{e}"
    );
    assert!(!e.contains(short) && !e.contains(SEAL_NEW), "{e}");
    assert_eq!(plane.snapshot().version, 2);
    // Not base64 on line 2: the line is named.
    std::fs::write(&keys, format!("{SEAL_NEW}\nnot*base64\n")).unwrap();
    let Reload::Rejected(e) = reloader.reload() else {
        panic!("a bad key accepted")
    };
    assert!(
        e.to_string()
            .contains("line 2: \"<10 characters>\" is not base64"),
        "{e}"
    );
    // Gone: rejected, naming the file.
    std::fs::remove_file(&keys).unwrap();
    let Reload::Rejected(e) = reloader.reload() else {
        panic!("a missing key file accepted")
    };
    assert!(
        e.to_string().contains("\"cookie-keys\" cannot be read"),
        "{e}"
    );
    std::fs::write(&keys, format!("{SEAL_NEW}\n")).unwrap();
    assert_eq!(reloader.reload(), Reload::Published(3));
}

#[test]
fn sealed_needs_a_keys_file_and_the_plugin() {
    let e =
        err(&with_plugin().replace("            format: grpc\n", "            format: sealed\n"));
    assert!(
        e.starts_with("virtualhosts[0].routes[2].loadBalancerPolicy.session.keysFile: \"\" is required with format sealed"),
        "{e}"
    );
    let e = err(&with_plugin().replace(
        "            format: grpc\n",
        "            format: grpc\n            keysFile: keys\n",
    ));
    assert!(
        e.contains("is for formats envoy (signed) and sealed, not grpc"),
        "{e}"
    );
    let native = BASE.replace(
        "            idleTimeout: 600s\n",
        "            idleTimeout: 600s\n            keysFile: keys\n",
    );
    assert!(err(&native).contains("keysFile: \"keys\" needs envoy.sessionFilter: plugin"));
    // Envoys on their own filter beside the plugin: warned about too.
    let c = Config::parse(&with_plugin_node().replace(
        "            format: grpc\n",
        "            format: sealed\n            keysFile: keys\n",
    ))
    .unwrap();
    let w = c.session_warnings();
    assert!(
        w.iter()
            .any(|w| w.contains("Envoy's own filter on the Envoys envoy.nodes does not list")),
        "{w:?}"
    );
}

/// The README's full example file is a file tether-control takes.
#[test]
fn the_readmes_example_file_is_valid() {
    let readme = include_str!("../README.md");
    let start = readme
        .find("```yaml\n")
        .expect("the README has a YAML example")
        + "```yaml\n".len();
    let end = start + readme[start..].find("```").expect("the example ends");
    let example = &readme[start..end];
    assert!(example.contains("virtualhosts:"), "{example}");
    if let Err(e) = Config::parse(example) {
        panic!("the README's example is refused: {e}");
    }
}
