//! Every vector of `testdata/vectors.json`, the data file the core, plugin and
//! JavaScript tests share.

use serde_json::Value;
use std::time::Duration;
use tether_core::cookie::{self, Format, KeyRing, SessionCookie, Signature};
use tether_core::http::{cookie_header, path, set_cookie};
use tether_core::AddressList;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read vectors"))
        .expect("parse vectors")
}

fn list(v: &Value, key: &str) -> Vec<Value> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("vectors.{key}"))
        .clone()
}

fn cookie_of(v: &Value) -> SessionCookie {
    let addrs: Vec<_> = v["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().parse().unwrap())
        .collect();
    SessionCookie {
        addresses: AddressList::new(addrs).unwrap(),
        cluster: v["cluster"].as_str().map(String::from),
        expires: v["expires"].as_u64(),
    }
}

#[test]
fn decode_vectors() {
    let all = list(&vectors(), "decode");
    assert!(all.len() >= 20);
    for v in all {
        let name = v["name"].as_str().unwrap();
        let got = cookie::decode(v["value"].as_str().unwrap(), &KeyRing::empty());
        let expect = &v["expect"];
        if let Some(err) = expect["error"].as_str() {
            let e = got.expect_err(name);
            assert_eq!(e.code(), err, "{name}: {e}");
            continue;
        }
        let d = got.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(d.cookie, cookie_of(expect), "{name}");
        assert_eq!(
            d.format.as_str(),
            expect["format"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(d.signature, Signature::Unsigned, "{name}");
        assert_eq!(d.quoted, expect["quoted"].as_bool().unwrap(), "{name}");
        assert_eq!(d.padded, expect["padded"].as_bool().unwrap(), "{name}");
        if let Some(now) = v["now"].as_u64() {
            // Valid through its expiry second, expired after it (Envoy: now > expires).
            assert!(!d.cookie.is_expired(now), "{name}");
            assert!(d.cookie.is_expired(now + 1), "{name}");
        }
    }
}

#[test]
fn encode_vectors_are_byte_identical_and_round_trip() {
    for v in list(&vectors(), "encode") {
        let name = v["name"].as_str().unwrap();
        let format: Format = v["format"].as_str().unwrap().parse().unwrap();
        let c = cookie_of(&v["cookie"]);
        let value = cookie::encode(&c, format, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(value, v["value"].as_str().unwrap(), "{name}");
        let back = cookie::decode(&value, &KeyRing::empty()).unwrap();
        assert_eq!(back.cookie, c, "{name}");
        assert_eq!(back.format, format, "{name}");
    }
    for v in list(&vectors(), "encode_errors") {
        let format: Format = v["format"].as_str().unwrap().parse().unwrap();
        let err = cookie::encode(&cookie_of(&v["cookie"]), format, None).unwrap_err();
        assert_eq!(err.to_string(), v["error"].as_str().unwrap());
    }
}

#[test]
fn set_cookie_vectors() {
    for v in list(&vectors(), "set_cookie") {
        let name = v["name"].as_str().unwrap();
        let spec =
            tether_core::config::cookie_spec(&v["spec"]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let style = match v["style"].as_str().unwrap() {
            "envoy" => set_cookie::Style::Envoy,
            "grpc" => set_cookie::Style::Grpc,
            other => panic!("style {other}"),
        };
        let got = spec.render(v["value"].as_str().unwrap(), style).unwrap();
        assert_eq!(got, v["expect"].as_str().unwrap(), "{name}");
    }
    // The spec JSON of the first vector is Envoy's config shape.
    let first = &list(&vectors(), "set_cookie")[0]["spec"];
    let spec = tether_core::config::cookie_spec(first).unwrap();
    assert_eq!(spec.ttl(), Duration::from_secs(120));
}

#[test]
fn cookie_header_vectors() {
    for v in list(&vectors(), "cookie_header") {
        let name = v["name"].as_str().unwrap();
        let headers: Vec<&str> = v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap())
            .collect();
        let got = cookie_header::find(headers.iter().copied(), v["cookie"].as_str().unwrap());
        assert_eq!(got, v["expect"].as_str(), "{name}");
    }
}

#[test]
fn path_vectors() {
    let all = list(&vectors(), "path");
    assert!(all.len() >= 8);
    for v in all {
        let (c, r) = (
            v["cookie_path"].as_str().unwrap(),
            v["request_path"].as_str().unwrap(),
        );
        assert_eq!(
            path::path_matches(c, r),
            v["match"].as_bool().unwrap(),
            "{c:?} vs {r:?}"
        );
    }
}

#[test]
fn readers_vectors() {
    use tether_core::cookie::readers::{read, Reader, Reading};
    let all = list(&vectors()["readers"], "cases");
    assert!(all.len() >= 5);
    for v in all {
        let name = v["name"].as_str().unwrap();
        let value = v["value"].as_str().unwrap();
        let now = v["now"].as_u64().unwrap();
        let reads = v["reads"].as_object().unwrap();
        for reader in Reader::ALL {
            let Some(expect) = reads.get(reader.as_str()) else {
                continue;
            };
            let got = match read(reader, value, now) {
                Reading::Pins(list) => serde_json::json!(list),
                Reading::NoSession(miss) => serde_json::json!(miss.code()),
            };
            assert_eq!(&got, expect, "{name}: {reader}");
        }
    }
}

/// The key ring of the `sealed` section, or a ring of `keys` given there.
fn ring_of(list: &Value) -> KeyRing {
    KeyRing::from_base64(list.as_array().unwrap().iter().map(|k| k.as_str().unwrap())).unwrap()
}

fn nonce_of(hex: &str) -> [u8; cookie::sealed::NONCE_LEN] {
    let mut out = [0; cookie::sealed::NONCE_LEN];
    assert_eq!(hex.len(), 2 * out.len(), "nonce {hex}");
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

#[test]
fn sealed_vectors() {
    let v = &vectors()["sealed"];
    let ring = ring_of(&v["keys"]);
    let keys: Vec<_> = ring.iter().collect();
    for (key, id) in keys.iter().zip(v["key_ids"].as_array().unwrap()) {
        let hex: String = key
            .sealing_id()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, id.as_str().unwrap());
    }
    let seals = list(v, "seal");
    assert!(seals.len() >= 3);
    for s in seals {
        let name = s["name"].as_str().unwrap();
        let c = cookie_of(&s["cookie"]);
        let key = keys[s["key"].as_u64().unwrap() as usize];
        let value = cookie::sealed::seal(&c, key, &nonce_of(s["nonce"].as_str().unwrap()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(value, s["value"].as_str().unwrap(), "{name}");
        let d = cookie::decode(&value, &ring).unwrap();
        assert_eq!(d.cookie, c, "{name}");
        assert_eq!(d.format, Format::Sealed, "{name}");
    }
    let now = v["now"].as_u64().unwrap();
    let opens = list(v, "open");
    assert!(opens.len() >= 10);
    for o in opens {
        let name = o["name"].as_str().unwrap();
        let value = o["value"].as_str().unwrap();
        let expect = &o["expect"];
        // Without keys nothing opens.
        assert_eq!(
            cookie::decode(value, &KeyRing::empty()).unwrap_err().code(),
            "sealed",
            "{name}"
        );
        let got = cookie::decode(value, &ring);
        if let Some(err) = expect["error"].as_str() {
            assert_eq!(got.unwrap_err().code(), err, "{name}");
            continue;
        }
        let d = got.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(d.cookie, cookie_of(expect), "{name}");
        assert_eq!(d.format, Format::Sealed, "{name}");
        let key = expect["key"].as_u64().unwrap() as usize;
        assert_eq!(d.signature, Signature::Valid { key }, "{name}");
        assert_eq!(
            d.cookie.is_expired(now),
            expect["expired"].as_bool().unwrap(),
            "{name}"
        );
    }
}
