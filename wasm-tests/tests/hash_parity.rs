//! Parity of `tether_core::hash` with real Envoy 1.40.
//!
//! Envoy runs on 127.0.0.1 with a STATIC cluster of six backends that say who
//! they are (`x-backend`), with unequal `load_balancing_weight`s, listed in
//! descending port order (so the cluster's order differs from the order of
//! the host keys, which Maglev sorts by). The route's `hash_policy` is given
//! as JSON; the same JSON is embedded in Envoy's YAML and parsed by core, so
//! both sides run one configuration. For every request the backend Envoy
//! routed to must be the host core picks; any mismatch fails the test and
//! prints the key, Envoy's host and ours.
//!
//! Keys are random (the seed is printed; set `TETHER_PARITY_SEED` to replay).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tether_core::hash::policy::generated_value;
use tether_core::hash::{
    key_hash, HashFunction, HashPolicies, HashRequest, Host, Locality, Maglev, MaglevConfig, Peer,
    RequestHash, Ring, RingConfig,
};
use tether_core::http::set_cookie::{CookieSpec, Style};
use tether_testkit::backend::HttpBackend;
use tether_testkit::client::Connection;
use tether_testkit::envoy::{one_cluster_yaml, one_cluster_yaml_localities, Envoy};
use tether_testkit::free_port;

/// Weights of the six backends, deliberately unequal.
const WEIGHTS: [u32; 6] = [3, 1, 5, 2, 4, 7];

/// A small deterministic generator (xorshift64*), seeded per test.
struct Rng(u64);

impl Rng {
    fn new(test: &str) -> Rng {
        let seed = std::env::var("TETHER_PARITY_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            })
            | 1;
        println!("{test}: TETHER_PARITY_SEED={seed}");
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A header-safe key of 1 to 24 characters.
    fn key(&mut self) -> String {
        const ALPHABET: &[u8] =
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.";
        let len = 1 + self.below(24) as usize;
        (0..len)
            .map(|_| ALPHABET[self.below(ALPHABET.len() as u64) as usize] as char)
            .collect()
    }
}

struct Fixture {
    envoy: Envoy,
    /// Kept alive for the test's duration (dropping one stops it).
    _backends: Vec<HttpBackend>,
    listen: SocketAddr,
    /// The hosts in the cluster's order, as core hashes them.
    hosts: Vec<Host>,
    /// Backend name by `ip:port`.
    names: HashMap<String, String>,
    policies: HashPolicies,
}

impl Fixture {
    async fn start(lb_policy: &str, hash_policy_json: &str) -> Fixture {
        Fixture::start_with(lb_policy, hash_policy_json, false).await
    }

    /// With `hash_keys`, each endpoint carries `envoy.lb` metadata
    /// `hash_key: <backend name>`, which Envoy hashes instead of `ip:port`.
    async fn start_with(lb_policy: &str, hash_policy_json: &str, hash_keys: bool) -> Fixture {
        let mut backends = Vec::new();
        for i in 0..WEIGHTS.len() {
            backends.push(HttpBackend::start(&format!("backend-{i}")).await);
        }
        // Descending port order: the cluster's order is not the keys' order.
        let mut order: Vec<usize> = (0..backends.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(backends[i].addr().port()));
        let mut endpoints = String::new();
        let mut hosts = Vec::new();
        let mut names = HashMap::new();
        for &i in &order {
            let b = &backends[i];
            endpoints.push_str(&format!(
                "\n        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }}\n          load_balancing_weight: {}",
                b.addr().port(),
                WEIGHTS[i]
            ));
            if hash_keys {
                endpoints.push_str(&format!(
                    "\n          metadata: {{ filter_metadata: {{ envoy.lb: {{ hash_key: \"{}\" }} }} }}",
                    b.name()
                ));
                hosts.push(Host::new(b.name(), WEIGHTS[i]));
                names.insert(b.name().to_string(), b.name().to_string());
            } else {
                hosts.push(Host::from_addr(b.addr(), WEIGHTS[i]));
                names.insert(b.addr().to_string(), b.name().to_string());
            }
        }
        let policies = HashPolicies::from_json(hash_policy_json, Peer::Envoy)
            .unwrap_or_else(|e| panic!("hash policy {hash_policy_json}: {e}"));
        let port = free_port();
        let config = one_cluster_yaml(port, hash_policy_json, lb_yaml(lb_policy), &endpoints);
        let envoy = Envoy::start(&config)
            .await
            .unwrap_or_else(|e| panic!("envoy: {e}\n{config}"));
        Fixture {
            envoy,
            _backends: backends,
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            hosts,
            names,
            policies,
        }
    }

    fn name_of(&self, host: &Host) -> String {
        self.names[host.key()].clone()
    }
}

/// One request's outcome on both sides.
struct Compared {
    key: String,
    envoy: String,
    ours: String,
}

fn assert_no_mismatch(what: &str, results: &[Compared], started: Instant) {
    let bad: Vec<&Compared> = results.iter().filter(|c| c.envoy != c.ours).collect();
    for c in bad.iter().take(20) {
        println!(
            "{what}: MISMATCH key={:?} envoy={} ours={}",
            c.key, c.envoy, c.ours
        );
    }
    let distinct: std::collections::BTreeSet<&str> =
        results.iter().map(|c| c.envoy.as_str()).collect();
    println!(
        "{what}: {} requests, {} mismatches, {} backends seen, {:?}",
        results.len(),
        bad.len(),
        distinct.len(),
        started.elapsed()
    );
    assert!(
        bad.is_empty(),
        "{what}: {} of {} requests went elsewhere than core picks",
        bad.len(),
        results.len()
    );
}

/// Sends `headers` on `conn` and returns the backend that answered.
async fn backend_for(conn: &mut Connection, headers: &[(&str, &str)]) -> String {
    let r = conn.get("/", headers).await.expect("request through envoy");
    assert_eq!(r.status, 200, "{headers:?}: {}", r.body);
    r.header("x-backend").expect("x-backend").to_string()
}

/// Core's pick for a header list, or `None` when core has no hash.
fn ours<F: Fn(u64) -> usize>(fx: &Fixture, pick: F, headers: &[(&str, &str)]) -> Option<String> {
    match fx.policies.evaluate(&HashRequest::new(headers)).hash {
        RequestHash::Hash(h) => Some(fx.name_of(&fx.hosts[pick(h)])),
        RequestHash::NoHash => None,
    }
}

/// The cluster's `lb_policy` (and its config) for a policy named in these
/// tests: `RING_HASH_MURMUR` is a ring whose entries Envoy hashes with
/// MurmurHash2.
fn lb_yaml(lb_policy: &str) -> &str {
    match lb_policy {
        "RING_HASH_MURMUR" => {
            "RING_HASH\n    ring_hash_lb_config: { hash_function: MURMUR_HASH_2 }"
        }
        other => other,
    }
}

async fn header_keys_match(lb_policy: &str, test: &str) {
    header_keys_match_with(lb_policy, test, false, 1200).await;
}

async fn header_keys_match_with(lb_policy: &str, test: &str, hash_keys: bool, requests: usize) {
    let started = Instant::now();
    let fx = Fixture::start_with(
        lb_policy,
        r#"[{"header": {"header_name": "x-user"}}]"#,
        hash_keys,
    )
    .await;
    let pick: Box<dyn Fn(u64) -> usize> = match lb_policy {
        "RING_HASH" | "RING_HASH_MURMUR" => {
            let config = RingConfig {
                hash_function: if lb_policy == "RING_HASH" {
                    HashFunction::XxHash
                } else {
                    HashFunction::MurmurHash2
                },
                ..RingConfig::default()
            };
            let ring = Ring::build(fx.hosts.clone(), &config).unwrap();
            Box::new(move |h| ring.pick(h))
        }
        _ => {
            let table = Maglev::build(fx.hosts.clone(), &MaglevConfig::default()).unwrap();
            Box::new(move |h| table.pick(h))
        }
    };
    let mut rng = Rng::new(test);
    let mut conn = Connection::open(fx.listen).await.unwrap();
    let mut results = Vec::new();
    for _ in 0..requests {
        let key = rng.key();
        let headers = [("x-user", key.as_str())];
        let envoy = backend_for(&mut conn, &headers).await;
        let ours = ours(&fx, &pick, &headers).expect("a header always hashes");
        results.push(Compared { key, envoy, ours });
    }
    assert_no_mismatch(test, &results, started);
    // Unequal weights spread the keys over every backend.
    let seen: std::collections::BTreeSet<&str> = results.iter().map(|c| c.envoy.as_str()).collect();
    assert_eq!(seen.len(), WEIGHTS.len(), "{seen:?}");
    drop(fx.envoy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_hash_header_policy_picks_the_same_host_as_envoy() {
    header_keys_match("RING_HASH", "ring_hash_header").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_hash_with_murmur_hash_2_picks_the_same_host_as_envoy() {
    header_keys_match("RING_HASH_MURMUR", "ring_hash_murmur").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maglev_header_policy_picks_the_same_host_as_envoy() {
    header_keys_match("MAGLEV", "maglev_header").await;
}

/// `hash_key` endpoint metadata replaces `ip:port` as the string a host is
/// hashed by, in the ring and in the Maglev table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_key_metadata_is_hashed_instead_of_the_address() {
    header_keys_match_with("RING_HASH", "ring_hash_key", true, 600).await;
    header_keys_match_with("MAGLEV", "maglev_hash_key", true, 600).await;
}

/// Two header policies, the first terminal; keys present and absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_policies_match_envoy_with_keys_present_and_absent() {
    let started = Instant::now();
    let fx = Fixture::start(
        "RING_HASH",
        r#"[{"header": {"header_name": "x-tenant"}, "terminal": true},
            {"header": {"header_name": "x-user"}}]"#,
    )
    .await;
    let ring = Ring::build(fx.hosts.clone(), &RingConfig::default()).unwrap();
    let mut rng = Rng::new("terminal");
    let mut conn = Connection::open(fx.listen).await.unwrap();
    let mut results = Vec::new();
    let mut cases = [0usize; 3];
    for _ in 0..1200 {
        let (tenant, user) = (rng.key(), rng.key());
        let case = rng.below(3) as usize;
        cases[case] += 1;
        let headers: Vec<(&str, &str)> = match case {
            // Both present: the terminal one alone decides.
            0 => vec![("x-user", &user), ("x-tenant", &tenant)],
            // Terminal key absent: the next policy decides.
            1 => vec![("x-user", &user)],
            // Only the terminal key.
            _ => vec![("x-tenant", &tenant)],
        };
        let envoy = backend_for(&mut conn, &headers).await;
        let ours = ours(&fx, |h| ring.pick(h), &headers).expect("hash");
        results.push(Compared {
            key: format!("{headers:?}"),
            envoy,
            ours,
        });
    }
    println!("terminal: cases both/user-only/tenant-only = {cases:?}");
    assert!(cases.iter().all(|&c| c > 300), "{cases:?}");
    // Core's own view of the same rule: with both keys the user is ignored.
    let both = fx
        .policies
        .evaluate(&HashRequest::new(&[("x-tenant", "t"), ("x-user", "u")]))
        .hash;
    assert_eq!(both, RequestHash::Hash(key_hash("t")));
    // Neither key: no hash, Envoy picks at random (nothing to compare).
    assert_eq!(
        fx.policies
            .evaluate(&HashRequest::new(&[("x-other", "v")]))
            .hash,
        RequestHash::NoHash
    );
    let any = backend_for(&mut conn, &[("x-other", "v")]).await;
    assert!(fx.names.values().any(|n| *n == any), "{any}");
    assert_no_mismatch("terminal", &results, started);
}

/// Repeated header values: Envoy 1.40 hashes all of them, sorted and
/// chained, so the order they arrive in does not matter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_header_values_hash_as_envoy_does() {
    let started = Instant::now();
    let fx = Fixture::start("RING_HASH", r#"[{"header": {"header_name": "x-user"}}]"#).await;
    let ring = Ring::build(fx.hosts.clone(), &RingConfig::default()).unwrap();
    let mut rng = Rng::new("repeated");
    let mut conn = Connection::open(fx.listen).await.unwrap();
    let mut results = Vec::new();
    let mut first_value_differs = 0;
    for _ in 0..400 {
        let n = 2 + rng.below(2) as usize;
        let values: Vec<String> = (0..n).map(|_| rng.key()).collect();
        let headers: Vec<(&str, &str)> = values.iter().map(|v| ("x-user", v.as_str())).collect();
        let envoy = backend_for(&mut conn, &headers).await;
        let ours = ours(&fx, |h| ring.pick(h), &headers).expect("hash");
        if fx.name_of(&fx.hosts[ring.pick(key_hash(&values[0]))]) != envoy {
            first_value_differs += 1;
        }
        results.push(Compared {
            key: format!("{values:?}"),
            envoy,
            ours,
        });
    }
    // Were Envoy hashing only the first value, these would mostly agree.
    println!(
        "repeated: first-value-only model disagrees with Envoy on {first_value_differs} of 400"
    );
    assert!(first_value_differs > 100);
    assert_no_mismatch("repeated", &results, started);
}

/// A cookie policy with `ttl: 0s`: Envoy generates the cookie from the
/// connection's addresses; core computes the same value and Set-Cookie, the
/// request lands where core's ring says, and the cookie replayed on another
/// connection lands there again (with nothing generated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_cookie_replayed_lands_where_core_says() {
    let started = Instant::now();
    let name = "hash-affinity";
    let fx = Fixture::start(
        "RING_HASH",
        &format!(r#"[{{"cookie": {{"name": "{name}", "ttl": "0s", "path": "/"}}}}]"#),
    )
    .await;
    let ring = Ring::build(fx.hosts.clone(), &RingConfig::default()).unwrap();
    let spec = CookieSpec::new(name, "/", std::time::Duration::ZERO, vec![]).unwrap();
    let mut replay = Connection::open(fx.listen).await.unwrap();
    let mut results = Vec::new();
    for _ in 0..250 {
        let mut fresh = Connection::open(fx.listen).await.unwrap();
        let r = fresh.get("/", &[]).await.expect("request");
        assert_eq!(r.status, 200);
        let envoy = r.header("x-backend").expect("x-backend").to_string();
        let set_cookie = r
            .header("set-cookie")
            .expect("a generated cookie")
            .to_string();
        // The value core generates for this connection, rendered by core.
        let value = generated_value(fresh.local_addr(), fx.listen);
        assert_eq!(set_cookie, spec.render(&value, Style::Envoy).unwrap());
        assert_eq!(set_cookie, format!("{name}=\"{value}\"; Path=/; HttpOnly"));
        // Core's evaluation of the same cookie-less request says the same.
        let mut req = HashRequest::new(&[] as &[(&str, &str)]);
        req.remote = Some(fresh.local_addr());
        req.local = Some(fx.listen);
        let eval = fx.policies.evaluate(&req);
        assert_eq!(eval.set_cookies, std::slice::from_ref(&set_cookie));
        let h = eval.hash.value().expect("hash");
        let ours = fx.name_of(&fx.hosts[ring.pick(h)]);
        results.push(Compared {
            key: format!("first request, cookie {value}"),
            envoy,
            ours: ours.clone(),
        });
        // Replayed (quoted, as set) on another connection.
        let cookie = format!("{name}=\"{value}\"");
        let r = replay
            .get("/", &[("cookie", &cookie)])
            .await
            .expect("replay");
        assert!(r.header("set-cookie").is_none(), "{:?}", r.headers);
        results.push(Compared {
            key: format!("replayed cookie {value}"),
            envoy: r.header("x-backend").expect("x-backend").to_string(),
            ours,
        });
    }
    assert_no_mismatch("generated_cookie", &results, started);
}

/// Rings and Maglev tables of a cluster with `locality_weighted_lb_config`:
/// three localities (weights 2, none and 5) over the six backends, the
/// unweighted one receiving nothing. Envoy's choice for every key must be
/// core's `build_localities` pick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locality_weighted_rings_and_tables_match_envoy() {
    let mut backends = Vec::new();
    for i in 0..WEIGHTS.len() {
        backends.push(HttpBackend::start(&format!("backend-{i}")).await);
    }
    // Localities by backend index, with their weights (None: no weight set,
    // which Envoy's locality weighting counts as 0).
    let groups: [(&[usize], Option<u32>); 3] =
        [(&[0, 1], Some(2)), (&[2], None), (&[3, 4, 5], Some(5))];
    let mut localities_yaml = String::new();
    let mut localities = Vec::new();
    let mut names = HashMap::new();
    for (zone, (members, weight)) in groups.iter().enumerate() {
        localities_yaml.push_str(&format!(
            "\n      - locality: {{ zone: z{zone} }}\n        lb_endpoints:"
        ));
        let mut hosts = Vec::new();
        for &i in members.iter() {
            let b = &backends[i];
            localities_yaml.push_str(&format!(
                "\n        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }}\n          load_balancing_weight: {}",
                b.addr().port(),
                WEIGHTS[i]
            ));
            hosts.push(Host::from_addr(b.addr(), WEIGHTS[i]));
            names.insert(b.addr().to_string(), b.name().to_string());
        }
        if let Some(w) = weight {
            localities_yaml.push_str(&format!("\n        load_balancing_weight: {w}"));
        }
        localities.push(Locality::new(weight.unwrap_or(0), hosts));
    }
    let policy = r#"[{"header": {"header_name": "x-user"}}]"#;
    let policies = HashPolicies::from_json(policy, Peer::Envoy).unwrap();
    let ring = Ring::build_localities(&localities, &RingConfig::default()).unwrap();
    let table = Maglev::build_localities(&localities, &MaglevConfig::default()).unwrap();
    for (lb, test) in [
        ("RING_HASH", "ring_localities"),
        ("MAGLEV", "maglev_localities"),
    ] {
        let started = Instant::now();
        let port = free_port();
        let lb_yaml =
            format!("{lb}\n    common_lb_config: {{ locality_weighted_lb_config: {{}} }}");
        let config = one_cluster_yaml_localities(port, policy, &lb_yaml, &localities_yaml);
        let envoy = Envoy::start(&config)
            .await
            .unwrap_or_else(|e| panic!("envoy: {e}\n{config}"));
        let mut conn = Connection::open(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap();
        let mut rng = Rng::new(test);
        let mut results = Vec::new();
        for _ in 0..1000 {
            let key = rng.key();
            let headers = [("x-user", key.as_str())];
            let envoy_pick = backend_for(&mut conn, &headers).await;
            let h = policies
                .evaluate(&HashRequest::new(&headers))
                .hash
                .value()
                .expect("a header always hashes");
            let host = if lb == "RING_HASH" {
                ring.pick_host(h)
            } else {
                table.pick_host(h)
            };
            results.push(Compared {
                key,
                envoy: envoy_pick,
                ours: names[host.key()].clone(),
            });
        }
        assert_no_mismatch(test, &results, started);
        let seen: std::collections::BTreeSet<&str> =
            results.iter().map(|c| c.envoy.as_str()).collect();
        assert!(
            !seen.contains("backend-2"),
            "{test}: a locality without weight got traffic"
        );
        assert_eq!(seen.len(), 5, "{test}: {seen:?}");
        drop(envoy);
    }
}
