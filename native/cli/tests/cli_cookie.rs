//! `tether cookie decode|encode` as a user runs them: JSON out, errors naming
//! the option and the value, non-zero exit codes on failure.

use serde_json::Value;
use std::process::Command;

/// Runs `tether` with the words of `line` as its arguments, as a shell
/// would split them (no argument here contains a space).
fn tether(line: &str) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(line.split_whitespace())
        .output()
        .expect("run tether");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes

#[test]
fn decodes_an_envoy_cookie_as_envoy_sets_it() {
    let (code, j, _) =
        tether("cookie decode \"Cg8xMjcuMC4wLjE6MTkwMDIQibCL2AY=\" --now 1795348489");
    assert_eq!(code, 0);
    assert_eq!(j["format"], "envoy");
    assert_eq!(j["addresses"][0], "127.0.0.1:19002");
    assert_eq!(j["expires"], 1795348489);
    assert_eq!(j["expired"], false);
    assert_eq!(j["quoted"], true);
    let (_, later, _) = tether("cookie decode Cg8xMjcuMC4wLjE6MTkwMDIQibCL2AY= --now 1795348490");
    assert_eq!(later["expired"], true);
}

#[test]
fn encodes_byte_identical_grpc_and_renders_c_cores_set_cookie() {
    let (code, j, _) = tether(
        "cookie encode --address 127.0.0.1:41271 --cluster cluster-ssa --format grpc \
         --ttl 60 --name grpc-session --path /",
    );
    assert_eq!(code, 0);
    assert_eq!(j["value"], "MTI3LjAuMC4xOjQxMjcxO2NsdXN0ZXItc3Nh");
    assert_eq!(
        j["set_cookie"],
        "grpc-session=MTI3LjAuMC4xOjQxMjcxO2NsdXN0ZXItc3Nh; HttpOnly; Path=/; Max-Age=60"
    );
}

#[test]
fn envoy_encode_with_ttl_and_list_round_trips() {
    let (code, j, _) = tether(
        "cookie encode --address 10.0.0.1:80 --address [2001:db8::1]:80 --cluster c \
         --ttl 120s --now 1000 --name global-session-cookie --path /",
    );
    assert_eq!(code, 0);
    assert_eq!(j["expires"], 1120);
    let v = j["value"].as_str().unwrap();
    assert_eq!(
        j["set_cookie"],
        format!("global-session-cookie=\"{v}\"; Max-Age=120; Path=/; HttpOnly").as_str()
    );
    let (_, d, _) = tether(&format!("cookie decode {v} --now 1000"));
    assert_eq!(
        d["addresses"],
        serde_json::json!(["10.0.0.1:80", "[2001:db8::1]:80"])
    );
    assert_eq!(d["cluster"], "c");
    assert_eq!(d["expires"], 1120);
}

/// A key file holding `lines`, in a directory of its own; its path.
fn key_file(name: &str, lines: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!("tether-cli-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn signed_cookies_verify_only_with_the_key() {
    let mine = key_file("mine", &[KEY]);
    let (_, j, _) = tether(&format!(
        "cookie encode --address 127.0.0.1:1 --key-file {mine}"
    ));
    assert_eq!(j["signed"], true);
    let v = j["value"].as_str().unwrap();
    let (_, ok, _) = tether(&format!("cookie decode {v} --key-file {mine}"));
    assert_eq!(ok["signature"], "valid");
    assert_eq!(ok["key"], 0);
    let other = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
    let theirs = key_file("theirs", &[other]);
    let (_, bad, _) = tether(&format!("cookie decode {v} --key-file {theirs}"));
    assert_eq!(bad["signature"], "invalid");
    // A rotated ring: the new key first (it writes), the old one still read.
    let ring = key_file("ring", &["# rotated", other, "", KEY]);
    let (_, rotated, _) = tether(&format!("cookie decode {v} --key-file {ring}"));
    assert_eq!(rotated["key"], 1);
    let (_, resigned, _) = tether(&format!(
        "cookie encode --address 127.0.0.1:1 --key-file {ring}"
    ));
    let w = resigned["value"].as_str().unwrap();
    let (_, new, _) = tether(&format!("cookie decode {w} --key-file {theirs}"));
    assert_eq!(new["signature"], "valid");
    let (_, unchecked, _) = tether(&format!("cookie decode {v}"));
    assert_eq!(unchecked["signature"], "unchecked");
    // No secret on the command line: --key is gone.
    let (code, _, err) = tether(&format!("cookie decode {v} --key {KEY}"));
    assert_eq!(code, 2, "{err}");
}

#[test]
fn errors_name_the_option_and_the_value() {
    let (code, _, err) = tether("cookie encode --address localhost:80");
    assert_eq!(code, 1);
    assert!(
        err.contains("--address[0]") && err.contains("\"localhost:80\""),
        "{err}"
    );
    let (code, _, err) = tether("cookie encode --address 127.0.0.1:1 --ttl=-5s");
    assert_eq!(code, 1);
    assert!(err.contains("--ttl: \"-5s\" is negative"), "{err}");
    let (code, _, err) = tether("cookie encode --address 127.0.0.1:1 --format legacy --cluster c");
    assert_eq!(code, 1);
    assert!(err.contains("format legacy cannot carry cluster"), "{err}");
    let short = key_file("short", &[KEY, "c2hvcnQ="]);
    let (code, _, err) = tether(&format!(
        "cookie encode --address 127.0.0.1:1 --key-file {short}"
    ));
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!(
            "--key-file {short} line 2: \"<8 characters>\" decodes to 5 bytes"
        )) && err.contains("a key needs at least 16")
            && !err.contains("c2hvcnQ"),
        "{err}"
    );
    let empty = key_file("empty", &["# nothing"]);
    let (code, _, err) = tether(&format!("cookie decode x --key-file {empty}"));
    assert_eq!(code, 1);
    assert!(err.contains("holds no key"), "{err}");
    let (code, _, err) = tether("cookie decode garbage!");
    assert_eq!(code, 1);
    assert!(
        err.contains("\"garbage!\"") && err.contains("not standard base64"),
        "{err}"
    );
    let (code, _, err) = tether("cookie encode --address 127.0.0.1:1 --format xml");
    assert_eq!(code, 2, "clap rejects unknown formats: {err}");
    assert!(err.contains("xml"), "{err}");
}

/// 10.0.0.1:8080's plain text is a protobuf to stock Envoy's cookie reader:
/// `encode` writes the guarded spelling and says so; `decode` of the plain
/// text shows each reader's verdict and warns naming the one that misses
/// it; `--header` writes the plain text header readers take.
#[test]
fn says_which_readers_miss_a_value_and_writes_the_one_they_all_read() {
    let (code, j, err) = tether("cookie encode --address 10.0.0.1:8080 --format legacy");
    assert_eq!(code, 0);
    assert_eq!(j["value"], "MTAuMC4wLjE6ODA4MDs8Cg0xMC4wLjAuMTo4MDgw");
    assert!(err.contains("written guarded"), "{err}");
    assert!(!err.contains("WARN"), "{err}");
    let (code, j, err) = tether("cookie decode MTAuMC4wLjE6ODA4MA==");
    assert_eq!(code, 0);
    assert_eq!(
        j["readers"]["envoy-cookie"]["miss"],
        "protobuf-without-address"
    );
    assert_eq!(j["readers"]["grpc"]["pins"][0], "10.0.0.1:8080");
    assert!(
        err.contains("stock Envoy's cookie session state will not pin 10.0.0.1:8080"),
        "{err}"
    );
    let (_, j, err) = tether("cookie decode MTAuMC4wLjE6ODA4MDs8Cg0xMC4wLjAuMTo4MDgw");
    assert_eq!(j["format"], "legacy");
    assert_eq!(j["readers"]["envoy-cookie"]["pins"][0], "10.0.0.1:8080");
    assert!(!err.contains("WARN"), "{err}");
    let (_, j, err) = tether("cookie encode --address 10.0.0.1:8080 --format legacy --header");
    assert_eq!(j["value"], "MTAuMC4wLjE6ODA4MA==");
    assert!(!err.contains("WARN"), "{err}");
}

/// An expiry is judged by Envoy 1.36 to 1.38 against seconds since boot:
/// said when one is written, and when a value carries one counted that way.
#[test]
fn warns_where_envoy_before_1_39_judges_an_expiry_differently() {
    let (_, _, err) = tether("cookie encode --address 10.0.0.1:80 --ttl 120s --now 1800000000");
    assert!(err.contains("Envoy 1.36 to 1.38"), "{err}");
    // An Envoy 1.38 cookie: expires 1122 (seconds since its host booted).
    let (_, j, err) = tether("cookie decode Cg8xMjcuMC4wLjE6MTkwODIQ4gg= --now 1800000000");
    assert_eq!(j["expires"], 1122);
    assert_eq!(j["expired"], false);
    assert_eq!(j["readers"]["envoy-cookie"]["miss"], "expired");
    assert!(err.contains("seconds since an Envoy host booted"), "{err}");
}

/// The `sealed` keys of `testdata/vectors.json`, as base64 lines.
fn sealed_keys() -> (Vec<String>, Value) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/vectors.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let sealed = v["sealed"].clone();
    let keys = sealed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    (keys, sealed)
}

#[test]
fn seals_and_opens_with_a_key_file() {
    let (keys, vectors) = sealed_keys();
    let (new, old) = (keys[0].as_str(), keys[1].as_str());
    let ring = key_file("sealing-ring", &["# newest first", new, old]);
    let line = format!(
        "cookie encode --address 10.0.0.1:8080 --address [2001:db8::1]:8080 --cluster api \
         --ttl 120 --now 1800000000 --format sealed --key-file {ring}"
    );
    let (code, j, err) = tether(&line);
    assert_eq!(code, 0, "{err}");
    assert_eq!(j["format"], "sealed");
    assert_eq!(j["key_id"], vectors["key_ids"][0]);
    let value = j["value"].as_str().unwrap().to_owned();
    // A random nonce each time: another value for the same session.
    let (_, again, _) = tether(&line);
    assert_ne!(again["value"], j["value"]);

    let (code, d, err) = tether(&format!(
        "cookie decode {value} --key-file {ring} --now 1800000000"
    ));
    assert_eq!(code, 0, "{err}");
    assert_eq!(d["format"], "sealed");
    assert_eq!(d["addresses"][0], "10.0.0.1:8080");
    assert_eq!(d["addresses"][1], "[2001:db8::1]:8080");
    assert_eq!(d["cluster"], "api");
    assert_eq!(d["expires"], 1800000120);
    assert_eq!(d["signature"], "valid");
    assert_eq!(d["key"], 0);
    assert_eq!(d["readers"]["tether"]["pins"][0], "10.0.0.1:8080");
    assert!(d["readers"]["grpc"]["pins"] != d["readers"]["tether"]["pins"]);
    assert!(err.is_empty(), "{err}");

    // Rotation: a file with the old key alone opens nothing the new sealed,
    // and the vectors' value sealed by the old key opens with the ring.
    let old_only = key_file("sealing-old", &[old]);
    let (code, _, err) = tether(&format!("cookie decode {value} --key-file {old_only}"));
    assert_ne!(code, 0);
    assert!(err.contains("opens with no configured key"), "{err}");
    let by_old = vectors["open"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["expect"]["key"] == 1)
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_owned();
    let (code, d, err) = tether(&format!("cookie decode {by_old} --key-file {ring}"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(d["key"], 1);
    assert_eq!(d["key_id"], vectors["key_ids"][1]);

    // Without keys: an error naming the key id to look for.
    let (code, _, err) = tether(&format!("cookie decode {value}"));
    assert_ne!(code, 0);
    let id = vectors["key_ids"][0].as_str().unwrap();
    assert!(
        err.contains(&format!("names key id {id} (give its key with --key-file)")),
        "{err}"
    );
}

#[test]
fn sealing_needs_a_key_file_of_long_enough_keys_and_no_key_on_the_command_line() {
    let (code, _, err) = tether("cookie encode --address 10.0.0.1:80 --format sealed");
    assert_ne!(code, 0);
    assert!(err.contains("--format sealed needs --key-file"), "{err}");
    let sixteen = "MDEyMzQ1Njc4OWFiY2RlZg==";
    let short = key_file("sealing-short", &[sixteen]);
    let (code, _, err) = tether(&format!(
        "cookie encode --address 10.0.0.1:80 --format sealed --key-file {short}"
    ));
    assert_ne!(code, 0);
    assert!(
        err.contains(
            "keys[0]: \"<not shown>\" decodes to 16 bytes; a sealing key needs at least 32"
        ),
        "{err}"
    );
    assert!(!err.contains(sixteen), "{err}");
    for sub in ["encode --address 10.0.0.1:80 --format sealed", "decode x"] {
        let (code, _, err) = tether(&format!("cookie {sub} --key {KEY}"));
        assert_ne!(code, 0, "--key exists");
        assert!(err.contains("unexpected argument '--key'"), "{err}");
        assert!(!err.contains(KEY), "the secret echoed: {err}");
    }
}
