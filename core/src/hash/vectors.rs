//! The `hash` section of `testdata/vectors.json`: ring, Maglev and policy
//! vectors, most observed on Envoy 1.40.

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::Value;
use std::net::SocketAddr;

use super::policy::{HashPolicies, HashRequest, Peer};
use super::{
    combine, key_hash, murmur2, xxh64, Host, Maglev, MaglevConfig, RequestHash, Ring, RingConfig,
    MURMUR2_SEED,
};

fn section() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/vectors.json");
    let all: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read vectors")).expect("json");
    all["hash"].clone()
}

fn list(v: &Value, key: &str) -> Vec<Value> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("hash.{key}"))
        .clone()
}

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().expect("hex string"), 16).expect("hex")
}

fn hosts(v: &Value) -> Vec<Host> {
    v["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            Host::new(
                h["address"].as_str().unwrap(),
                h["weight"].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

fn check_picks(name: &str, expect: &Value, pick: impl Fn(u64) -> String) {
    for p in expect["picks"].as_array().into_iter().flatten() {
        let key = p["key"].as_str().unwrap();
        assert_eq!(
            pick(key_hash(key)),
            p["host"].as_str().unwrap(),
            "{name}: key {key:?}"
        );
    }
}

#[test]
fn xxh64_and_combine() {
    let s = section();
    for v in list(&s, "xxh64") {
        assert_eq!(
            key_hash(v["input"].as_str().unwrap()),
            hex(&v["hash"]),
            "{v}"
        );
    }
    for v in list(&s, "murmur2") {
        let input = v["input"].as_str().unwrap();
        assert_eq!(
            murmur2(input.as_bytes(), MURMUR2_SEED),
            hex(&v["hash"]),
            "{v}"
        );
    }
    for v in list(&s, "combine") {
        let h = v["inputs"].as_array().unwrap().iter().fold(None, |acc, i| {
            Some(combine(acc, key_hash(i.as_str().unwrap())))
        });
        assert_eq!(h, Some(hex(&v["hash"])), "{v}");
    }
}

#[test]
fn ring_vectors() {
    let all = list(&section(), "ring");
    assert!(all.len() >= 5);
    for v in all {
        let name = v["name"].as_str().unwrap();
        let mut config = RingConfig::with_min(v["min_ring_size"].as_u64().unwrap());
        if let Some(m) = v["max_ring_size"].as_u64() {
            config.maximum_ring_size = m;
        }
        config.ring_size_cap = v["ring_size_cap"].as_u64();
        let expect = &v["expect"];
        let built = Ring::build(hosts(&v), &config);
        if let Some(e) = expect["error"].as_str() {
            assert_eq!(built.unwrap_err().to_string(), e, "{name}");
            continue;
        }
        let ring = built.unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(size) = expect["size"].as_u64() {
            assert_eq!(ring.len() as u64, size, "{name}");
        }
        if let Some(counts) = expect["entries_per_host"].as_array() {
            let want: Vec<usize> = counts
                .iter()
                .map(|c| c.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(ring.entries_per_host(), want, "{name}");
        }
        check_picks(name, expect, |h| ring.pick_host(h).key().to_string());
    }
}

#[test]
fn maglev_vectors() {
    let all = list(&section(), "maglev");
    assert!(all.len() >= 3);
    for v in all {
        let name = v["name"].as_str().unwrap();
        let config = MaglevConfig {
            table_size: v["table_size"].as_u64().unwrap(),
        };
        let expect = &v["expect"];
        let built = Maglev::build(hosts(&v), &config);
        if let Some(e) = expect["error"].as_str() {
            assert_eq!(built.unwrap_err().to_string(), e, "{name}");
            continue;
        }
        let table = built.unwrap_or_else(|e| panic!("{name}: {e}"));
        check_picks(name, expect, |h| table.pick_host(h).key().to_string());
    }
}

fn pairs(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_string(),
                p[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn addr(v: &Value) -> Option<SocketAddr> {
    v.as_str().map(|a| a.parse().unwrap())
}

#[test]
fn policy_vectors() {
    let s = section();
    // The observed ring for weights 1,2,3,1,5 (ports 441..445).
    let ring_12315 = Ring::build(hosts(&list(&s, "ring")[2]), &RingConfig::default()).unwrap();
    let all = list(&s, "policies");
    assert!(all.len() >= 10);
    for v in all {
        let name = v["name"].as_str().unwrap();
        let peer = match v["peer"].as_str().unwrap() {
            "envoy" => Peer::Envoy,
            "grpc" => Peer::Grpc,
            other => panic!("{name}: peer {other}"),
        };
        let policies = HashPolicies::from_json_value(&v["policies"], peer)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = &v["request"];
        let headers = pairs(&r["headers"]);
        let state = pairs(&r["filter_state"]);
        let state: Vec<(&str, &str)> = state
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut req = HashRequest::new(&headers);
        req.path = r["path"].as_str().unwrap_or("");
        req.remote = addr(&r["remote"]);
        req.local = addr(&r["local"]);
        req.filter_state = &state;
        let got = policies.evaluate(&req);
        let e = &v["expect"];
        let want = if let Some(of) = e["hash_of"].as_str() {
            RequestHash::Hash(key_hash(of))
        } else if let Some(chain) = e["hash_of_chain"].as_array() {
            RequestHash::Hash(
                chain
                    .iter()
                    .fold(0, |seed, x| xxh64(x.as_str().unwrap().as_bytes(), seed)),
            )
        } else if e["hash"].is_null() {
            RequestHash::NoHash
        } else {
            RequestHash::Hash(hex(&e["hash"]))
        };
        assert_eq!(got.hash, want, "{name}");
        let cookies: Vec<&str> = e["set_cookies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(got.set_cookies, cookies, "{name}");
        if let Some(host) = e["ring_12315_host"].as_str() {
            let h = got.hash.value().unwrap();
            assert_eq!(ring_12315.pick_host(h).key(), host, "{name}");
        }
    }
}

#[cfg(feature = "regex")]
#[test]
fn rewrite_vectors() {
    let all = list(&section(), "rewrite");
    assert!(all.len() >= 5);
    for v in all {
        let s = |k: &str| v[k].as_str().unwrap();
        let r = super::rewrite::Rewrite::new(s("pattern"), s("substitution")).unwrap();
        let out = r.apply(s("input").as_bytes());
        assert_eq!(String::from_utf8(out).unwrap(), s("output"), "{v}");
    }
}
