//! The control plane's YAML model, its errors (field and line), the
//! translation to Envoy and proxyless resources, and reloading that keeps
//! the last good snapshot.

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::listener::v3 as lpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use prost::Message;
use tether::control::{translate, Config, ControlPlane, Flavor, Reload, Reloader};
use tether::xds::resource::{decode, ResourceKind};

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

#[test]
fn validation_errors_name_the_field() {
    assert_eq!(
        err(&BASE.replace("          - name: api\n", "          - name: apx\n")),
        "virtualhosts[0].routes[1].services[0].name: \"apx\" is not a service defined in services"
    );
    assert_eq!(
        err(&BASE.replace("        priority: 1\n", "        priority: 2\n")),
        "services[0].endpoints: [0, 2] priorities must be contiguous from 0"
    );
    assert_eq!(
        err(&BASE.replace("          strategy: Session\n", "          strategy: RoundRobin\n")),
        "virtualhosts[0].routes[2].loadBalancerPolicy.session: \"RoundRobin\" is only used with strategy Session"
    );
    let no_policies = BASE.replace(
        "          requestHashPolicies:\n            - headerHashOptions: { headerName: X-User }\n              terminal: true\n            - hashSourceIP: true\n",
        "",
    );
    assert_eq!(
        err(&no_policies),
        "virtualhosts[0].routes[1].loadBalancerPolicy.requestHashPolicies: \"[]\" must not be empty with strategy RequestHash"
    );
    assert_eq!(
        err(&BASE.replace(
            "  - name: api\n    endpoints:",
            "  - name: web\n    endpoints:"
        )),
        "services[1].name: \"web\" is defined twice"
    );
}

fn cluster(flavor: Flavor, name: &str) -> cpb::Cluster {
    let t = translate(&Config::parse(BASE).unwrap());
    let any = &t.for_flavor(flavor)[&ResourceKind::Cluster][name];
    cpb::Cluster::decode(any.value.as_slice()).unwrap()
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
    let Ok(tether::xds::Resource::Endpoints(eds)) = decode(
        ResourceKind::Endpoints,
        &t.proxyless[&ResourceKind::Endpoints]["web"],
    )
    .result
    else {
        panic!()
    };
    assert_eq!(eds.priorities[0].localities[0].weight, 3);
    assert_eq!(eds.priorities[1].localities[0].endpoints[0].weight, 2);
    assert_eq!(
        eds.priorities[1].localities[0].endpoints[0].health.as_str(),
        "DRAINING"
    );
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
