// Every vector of testdata/vectors.json, the file the Rust tests of core and
// the plugin's tests read too: the JavaScript build is held to the same truth.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import {
  decode,
  encode,
  findCookie,
  pathMatches,
  renderSetCookie,
} from "../pkg/node/tether_js.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../testdata/vectors.json", import.meta.url), "utf8"),
);

// Sections this file checks; the others are reported, so a new section is
// noticed rather than silently skipped.
const COVERED = ["decode", "encode", "encode_errors", "set_cookie", "cookie_header", "path", "sealed"];

function section(name, atLeast) {
  const list = vectors[name];
  assert.ok(Array.isArray(list), `vectors.${name} is a list`);
  assert.ok(list.length >= atLeast, `vectors.${name} has ${list.length} entries`);
  return list;
}

test("every vector section is covered or reported", (t) => {
  const other = Object.keys(vectors).filter((k) => !k.startsWith("_") && !COVERED.includes(k));
  for (const name of other) t.diagnostic(`vectors.${name} is not read by the JavaScript tests`);
  for (const name of COVERED) if (name !== "sealed") section(name, 1);
});

test("decode vectors", () => {
  for (const v of section("decode", 20)) {
    const e = v.expect;
    if (e.error) {
      assert.throws(
        () => decode(v.value),
        (err) => {
          assert.ok(err instanceof Error, v.name);
          assert.equal(err.code, e.error, `${v.name}: ${err.message}`);
          // The message names the value it rejects.
          assert.ok(err.message.startsWith(`value ${JSON.stringify(v.value)}: `), err.message);
          return true;
        },
        v.name,
      );
      continue;
    }
    const d = decode(v.value);
    assert.deepEqual(
      {
        format: d.format,
        addresses: d.addresses,
        cluster: d.cluster,
        expires: d.expires,
        signature: d.signature,
        quoted: d.quoted,
        padded: d.padded,
      },
      {
        format: e.format,
        addresses: e.addresses,
        cluster: e.cluster,
        expires: e.expires,
        signature: e.signature,
        quoted: e.quoted,
        padded: e.padded,
      },
      v.name,
    );
    assert.equal(d.signed, false, v.name);
    assert.equal(d.verified, null, v.name);
    if (v.now !== undefined) {
      // Valid through its expiry second, expired after it (as in Envoy).
      assert.equal(decode(v.value, { now: v.now }).expired, false, v.name);
      assert.equal(decode(v.value, { now: v.now + 1 }).expired, true, v.name);
    }
  }
});

test("encode vectors are byte-identical and round-trip", () => {
  for (const v of section("encode", 5)) {
    const value = encode({ ...v.cookie, format: v.format });
    assert.equal(value, v.value, v.name);
    const back = decode(value, { now: 0 });
    assert.deepEqual(
      { addresses: back.addresses, cluster: back.cluster, expires: back.expires, format: back.format },
      { ...v.cookie, format: v.format },
      v.name,
    );
  }
});

test("encode error vectors", () => {
  for (const v of section("encode_errors", 1)) {
    assert.throws(
      () => encode({ ...v.cookie, format: v.format }),
      (err) => err instanceof Error && err.code === "encode" && err.message === v.error,
      v.name,
    );
  }
});

test("set_cookie vectors, from a cookie spec and from a session config", () => {
  for (const v of section("set_cookie", 1)) {
    assert.equal(renderSetCookie(v.spec, v.value, v.style), v.expect, v.name);
    // A session config picks the style from its format.
    const config = { cookie: v.spec, format: v.style === "grpc" ? "grpc" : "envoy" };
    assert.equal(renderSetCookie(config, v.value), v.expect, v.name);
    assert.equal(renderSetCookie(JSON.stringify(config), v.value), v.expect, v.name);
  }
});

test("cookie_header vectors", () => {
  for (const v of section("cookie_header", 5)) {
    assert.equal(findCookie(v.headers, v.cookie), v.expect, v.name);
  }
});

test("sealed vectors: sealed byte-identical under their nonce, opened by the ring or refused", () => {
  const sealed = vectors.sealed;
  const hex = (b) => Buffer.from(b, "base64").toString("hex");
  assert.ok(sealed.seal.length >= 3 && sealed.open.length >= 10);
  for (const v of sealed.seal) {
    const value = encode({ ...v.cookie, format: "sealed", keys: [sealed.keys[v.key]], nonce: v.nonce });
    assert.equal(value, v.value, v.name);
    // The key id in the clear is the vectors' own.
    assert.equal(hex(value).slice(2, 10), sealed.key_ids[v.key], v.name);
  }
  for (const v of sealed.open) {
    const e = v.expect;
    if (e.error) {
      assert.throws(
        () => decode(v.value, { keys: sealed.keys, now: sealed.now }),
        (err) => err instanceof Error && err.code === e.error,
        v.name,
      );
      continue;
    }
    const d = decode(v.value, { keys: sealed.keys, now: sealed.now });
    assert.deepEqual(
      { addresses: d.addresses, cluster: d.cluster, expires: d.expires, key: d.key, expired: d.expired },
      { addresses: e.addresses, cluster: e.cluster, expires: e.expires, key: e.key, expired: e.expired },
      v.name,
    );
    assert.deepEqual([d.format, d.signature], ["sealed", "valid"], v.name);
    // Without the key nothing is read.
    assert.throws(() => decode(v.value, { now: sealed.now }), (err) => err.code === "sealed", v.name);
  }
});

test("path vectors", () => {
  for (const v of section("path", 8)) {
    assert.equal(
      pathMatches(v.cookie_path, v.request_path),
      v.match,
      `${JSON.stringify(v.cookie_path)} vs ${JSON.stringify(v.request_path)}`,
    );
  }
});
