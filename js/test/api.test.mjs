// The JavaScript API beyond the shared vectors: signing, ttl, the session
// decisions, Set-Cookie parsing and the errors bad input throws.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, statSync } from "node:fs";
import {
  Session,
  cookiePairs,
  decode,
  encode,
  findCookie,
  parseSetCookie,
  pathMatches,
  renderSetCookie,
  sessionFromCookieHeader,
} from "../pkg/node/tether_js.js";

const KEY = Buffer.from("0123456789abcdef").toString("base64");
const OLD_KEY = Buffer.from("fedcba9876543210").toString("base64");
const NOW = 1_800_000_000;

function throwsWith(fn, message, code) {
  assert.throws(fn, (err) => {
    assert.ok(err instanceof Error);
    assert.equal(err.message, message);
    if (code) assert.equal(err.code, code);
    return true;
  });
}

test("signed cookies verify, rotate and fail with the wrong key", () => {
  const value = encode({ addresses: ["10.0.0.1:80"], cluster: "c", keys: [KEY], ttl: 60, now: NOW });
  const plain = decode(value, { now: NOW });
  assert.equal(plain.signed, true);
  assert.equal(plain.signature, "unchecked");
  assert.equal(plain.verified, null);

  const ok = decode(value, { keys: [KEY], now: NOW });
  assert.deepEqual([ok.signature, ok.verified, ok.key], ["valid", true, 0]);
  assert.equal(ok.expires, NOW + 60);

  // Rotation: a new signing key first, the old one still verifies.
  const rotated = decode(value, { keys: [OLD_KEY, KEY], now: NOW });
  assert.deepEqual([rotated.signature, rotated.verified, rotated.key], ["valid", true, 1]);

  const bad = decode(value, { keys: [OLD_KEY], now: NOW });
  assert.deepEqual([bad.signature, bad.verified, bad.key], ["invalid", false, null]);

  // Only the protobuf format has room for a MAC.
  throwsWith(
    () => encode({ addresses: ["10.0.0.1:80"], format: "grpc", keys: [KEY] }),
    "format grpc cannot carry mac",
    "encode",
  );
});

test("ttl sets an expiry where the format carries one", () => {
  const envoy = decode(encode({ addresses: ["[::1]:8080"], ttl: "120s", now: NOW }), { now: NOW });
  assert.equal(envoy.expires, NOW + 120);
  assert.equal(envoy.expired, false);
  assert.equal(decode(encode({ addresses: ["[::1]:8080"], ttl: 1.5, now: NOW })).expires, NOW + 1);
  // gRPC's text has no expiry: Max-Age alone bounds it, as in C-core.
  const grpc = decode(encode({ addresses: ["[::1]:8080"], ttl: 120, format: "grpc", now: NOW }));
  assert.equal(grpc.expires, null);
  assert.equal(grpc.format, "grpc");
  // Without `now` the clock is used.
  const clock = Math.floor(Date.now() / 1000);
  const expires = decode(encode({ addresses: ["10.0.0.1:1"], ttl: 100 })).expires;
  assert.ok(expires >= clock + 100 && expires <= clock + 102, `${expires} vs ${clock}`);
  assert.equal(decode(encode({ addresses: ["10.0.0.1:1"], expires: 1000000000 })).expired, true);
  // Below 1,000,000,000 an expiry counts seconds since an Envoy host booted
  // (Envoy 1.36 to 1.38): not judged.
  assert.equal(decode(encode({ addresses: ["10.0.0.1:1"], expires: 1000 })).expired, false);
});

test("bad input throws an Error naming the field and the value", () => {
  throwsWith(() => decode(5), "value: 5 is not a string", "config");
  throwsWith(() => decode(), "value: field not present", "config");
  throwsWith(() => decode("Cg8=", { kyes: [] }), "options.kyes: is not a known field", "config");
  throwsWith(
    () => decode("Cg8=", { keys: ["c2hvcnQ="] }),
    'keys[0]: "<8 characters>" decodes to 5 bytes; a key needs at least 16',
  );
  throwsWith(() => decode("Cg8=", { keys: "abc" }), 'keys: "abc" is not a list of strings');
  throwsWith(() => decode("Cg8=", { now: -1 }), "now: -1 is not epoch seconds");
  throwsWith(() => decode("Cg8=", { now: 1n }), "options: <not JSON> is not plain JSON data");
  throwsWith(
    () => encode({ addresses: ["10.0.0.1:80", "nope"] }),
    'addresses[1]: "nope" is not an ip:port address (IPv6 in brackets)',
    "address",
  );
  throwsWith(() => encode({ addresses: [] }), "addresses: field not present");
  throwsWith(() => encode({ adresses: ["10.0.0.1:80"] }), "adresses: is not a known field");
  throwsWith(
    () => encode({ addresses: ["10.0.0.1:80"], format: "xml" }),
    'format: "xml" is not one of envoy, grpc, legacy, sealed',
  );
  throwsWith(() => encode({ addresses: ["10.0.0.1:80"], ttl: "-5s" }), 'ttl: "-5s" is negative');
  throwsWith(() => encode({ addresses: ["10.0.0.1:80"], ttl: -5 }), 'ttl: "-5s" is negative');
  throwsWith(
    () => encode({ addresses: ["10.0.0.1:80"], ttl: 5, expires: 5 }),
    "expires: cannot be combined with ttl",
  );
  throwsWith(
    () => encode({ addresses: ["10.0.0.1:80"], cluster: "" }),
    'cluster "" is empty or contains control characters',
    "encode",
  );
  throwsWith(() => new Session({ cookie: { name: "s", ttl: "-5s" } }), 'cookie.ttl: "-5s" is negative');
  assert.throws(() => new Session("{"), /^Error: configuration: is not valid JSON/);
  throwsWith(
    () => renderSetCookie({ name: "s" }, 'x"; Secure'),
    'value: "x\\"; Secure" contains characters a cookie value may not',
  );
  throwsWith(() => renderSetCookie({ name: "s" }, "v", "xml"), 'style: "xml" is not one of envoy, grpc');
  throwsWith(() => renderSetCookie({ header: { name: "x-s" } }, "v"), "cookie: field not present");
  throwsWith(() => pathMatches("/a", null), "requestPath: field not present");
});

const CONFIG = {
  cookie: { name: "global-session-cookie", path: "/api", ttl: "120s" },
};

test("sessionFromCookieHeader: pinned, bypassed and every kind of miss", () => {
  const value = encode({ addresses: ["10.0.0.1:80", "[2001:db8::1]:80"], cluster: "a", ttl: 120, now: NOW });
  const header = `theme=dark; global-session-cookie="${value}"; other=1`;

  const pinned = sessionFromCookieHeader(header, CONFIG, { path: "/api/x", now: NOW });
  assert.equal(pinned.outcome, "pinned");
  assert.equal(pinned.reason, null);
  assert.deepEqual(pinned.session.addresses, ["10.0.0.1:80", "[2001:db8::1]:80"]);
  assert.equal(pinned.session.cluster, "a");
  assert.equal(pinned.overrideHost, "10.0.0.1:80,[2001:db8::1]:80");

  // Several Cookie headers: the first with the name wins.
  const several = sessionFromCookieHeader(["a=b", header, "global-session-cookie=junk"], CONFIG, {
    path: "/api",
    now: NOW,
  });
  assert.equal(several.outcome, "pinned");

  const bypass = sessionFromCookieHeader(header, CONFIG, { path: "/other", now: NOW });
  assert.deepEqual([bypass.outcome, bypass.session], ["bypass", null]);
  // The default path "/" is outside "/api".
  assert.equal(sessionFromCookieHeader(header, CONFIG, { now: NOW }).outcome, "bypass");

  const absent = sessionFromCookieHeader("theme=dark", CONFIG, { path: "/api", now: NOW });
  assert.deepEqual([absent.outcome, absent.reason], ["miss", "absent"]);

  const invalid = sessionFromCookieHeader("global-session-cookie=!!", CONFIG, { path: "/api", now: NOW });
  assert.deepEqual([invalid.outcome, invalid.reason], ["miss", "invalid"]);
  assert.equal(invalid.error, "the cookie value is not standard base64");

  const expired = sessionFromCookieHeader(header, CONFIG, { path: "/api", now: NOW + 121 });
  assert.deepEqual([expired.outcome, expired.reason, expired.expiredAt], ["miss", "expired", NOW + 120]);

  const signedConfig = { ...CONFIG, keys: [KEY] };
  const unsigned = sessionFromCookieHeader(header, signedConfig, { path: "/api", now: NOW });
  assert.deepEqual([unsigned.outcome, unsigned.reason], ["miss", "unsigned"]);
  const migrating = sessionFromCookieHeader(header, { ...signedConfig, accept_unsigned: true }, {
    path: "/api",
    now: NOW,
  });
  assert.equal(migrating.outcome, "pinned");

  const forged = encode({ addresses: ["10.0.0.9:80"], keys: [OLD_KEY] });
  const badMac = sessionFromCookieHeader(`global-session-cookie=${forged}`, signedConfig, { path: "/api" });
  assert.deepEqual([badMac.outcome, badMac.reason], ["miss", "bad-mac"]);
  const good = encode({ addresses: ["10.0.0.9:80"], keys: [KEY] });
  const verified = sessionFromCookieHeader(`global-session-cookie=${good}`, signedConfig, { path: "/api" });
  assert.equal(verified.outcome, "pinned");
  assert.deepEqual([verified.session.signature, verified.session.verified], ["valid", true]);
});

test("header mode reads the session header's value", () => {
  const config = { header: { name: "X-Session" } };
  const value = encode({ addresses: ["127.0.0.1:443"], format: "legacy" });
  const r = sessionFromCookieHeader(value, config);
  assert.equal(r.outcome, "pinned");
  assert.equal(r.session.format, "legacy");
  const s = new Session(config);
  assert.equal(s.headerName, "x-session");
  assert.equal(s.cookieName, undefined);
  assert.deepEqual(s.respond({ header: null }, { address: "127.0.0.1:443" }), {
    header: "x-session",
    value,
  });
});

test("Session.respond sets a cookie only when the session moves", () => {
  const s = new Session({ ...CONFIG, strict: true });
  assert.equal(s.cookieName, "global-session-cookie");
  assert.equal(s.strict, true);
  const request = { path: "/api/x", cookies: "theme=dark" };

  const first = s.respond(request, { address: "10.0.0.1:80", cluster: "a" }, NOW);
  assert.equal(first.header, "set-cookie");
  const value = encode({ addresses: ["10.0.0.1:80"], cluster: "a", ttl: 120, now: NOW });
  assert.equal(first.value, `global-session-cookie="${value}"; Max-Age=120; Path=/api; HttpOnly`);
  assert.deepEqual(s.mint({ address: "10.0.0.1:80", cluster: "a" }, NOW), first);

  // The browser sends it back: same host, nothing to set.
  const back = { path: "/api/x", cookies: [`global-session-cookie="${value}"`] };
  assert.equal(s.lookup(back, NOW).outcome, "pinned");
  assert.equal(s.respond(back, { address: "10.0.0.1:80", cluster: "a" }, NOW), null);
  // Another host answered: the cookie follows it.
  const moved = s.respond(back, { address: "10.0.0.2:80", cluster: "a" }, NOW);
  assert.match(moved.value, /^global-session-cookie="/);
  const parsed = parseSetCookie(moved.value);
  assert.deepEqual(decode(parsed.value).addresses, ["10.0.0.2:80"]);
  // No cookie for a host that failed to connect, nor outside the path.
  assert.equal(s.respond(request, { address: "10.0.0.2:80", connectFailed: true }, NOW), null);
  assert.equal(s.mint({ address: "10.0.0.2:80", connectFailed: true }, NOW), null);
  assert.equal(s.respond({ path: "/", cookies: [] }, { address: "10.0.0.2:80" }, NOW), null);
  throwsWith(() => s.respond(request, { address: "nope" }, NOW), 'address: "nope" is not an ip:port address (IPv6 in brackets)');
  throwsWith(() => s.lookup(request, NaN), "now: NaN is not epoch seconds");
});

test("sealed values take random nonces; a Session seals, opens and re-seals on rotation", () => {
  const k1 = Buffer.alloc(32, 1).toString("base64");
  const k2 = Buffer.alloc(32, 2).toString("base64");
  const cookie = { addresses: ["10.0.0.1:80"], cluster: "a", ttl: 120, now: NOW, format: "sealed" };
  const a = encode({ ...cookie, keys: [k1] });
  const b = encode({ ...cookie, keys: [k1] });
  assert.notEqual(a, b);
  for (const v of [a, b]) assert.deepEqual(decode(v, { keys: [k1], now: NOW }).addresses, ["10.0.0.1:80"]);
  // A fixed nonce gives a fixed value.
  const fixed = { ...cookie, keys: [k1], nonce: "000102030405060708090a0b" };
  assert.equal(encode(fixed), encode(fixed));
  throwsWith(() => encode({ ...fixed, nonce: "00" }), 'nonce: 00 is not 24 hex digits');
  throwsWith(() => encode({ ...fixed, nonce: "zz0102030405060708090a0b" }), 'nonce: zz0102030405060708090a0b is not 24 hex digits');

  const config = (keys) => ({ cookie: { name: "s", path: "/", ttl: "120s" }, format: "sealed", keys });
  const before = new Session(config([k1]));
  const first = before.mint({ address: "10.0.0.1:80", cluster: "a" }, NOW);
  const again = before.mint({ address: "10.0.0.1:80", cluster: "a" }, NOW);
  assert.notEqual(first.value, again.value);
  const value = parseSetCookie(first.value).value;
  assert.equal(decode(value, { keys: [k1], now: NOW }).format, "sealed");

  // Rotation: the old key still pins, and the cookie is re-sealed under the new one.
  const during = new Session(config([k2, k1]));
  const back = { path: "/", cookies: [`s=${value}`] };
  assert.equal(during.lookup(back, NOW).overrideHost, "10.0.0.1:80");
  const resealed = during.respond(back, { address: "10.0.0.1:80", cluster: "a" }, NOW);
  const next = parseSetCookie(resealed.value).value;
  const after = new Session(config([k2]));
  assert.equal(after.lookup({ path: "/", cookies: [`s=${next}`] }, NOW).overrideHost, "10.0.0.1:80");
  assert.equal(after.lookup(back, NOW).reason, "invalid");
});

test("gRPC-format sessions render C-core's Set-Cookie", () => {
  const s = new Session({ cookie: { name: "grpc-session", path: "/", ttl: "60s" }, format: "grpc" });
  const emit = s.mint({ address: "127.0.0.1:41271", cluster: "cluster-ssa" }, NOW);
  assert.equal(emit.value, "grpc-session=MTI3LjAuMC4xOjQxMjcxO2NsdXN0ZXItc3Nh; HttpOnly; Path=/; Max-Age=60");
});

test("Cookie and Set-Cookie headers are read the way the lookup reads them", () => {
  assert.deepEqual(cookiePairs(' a=1;b = 2 ;; junk ; c="x" ,d='), [
    { name: "a", value: "1" },
    { name: "b", value: "2" },
    { name: "c", value: '"x"' },
    { name: "d", value: "" },
  ]);
  assert.equal(findCookie("a=1; s=2", "s"), "2");
  assert.equal(findCookie([], "s"), null);
  const sc = parseSetCookie('s="Cg8="; Max-Age=120; Path=/; SameSite=Lax; Secure; HttpOnly; Foo=bar');
  assert.equal(sc.name, "s");
  assert.equal(sc.value, '"Cg8="');
  assert.deepEqual(sc.attributes, [
    { name: "Max-Age", value: "120", known: true },
    { name: "Path", value: "/", known: true },
    { name: "SameSite", value: "Lax", known: true },
    { name: "Secure", value: "", known: true },
    { name: "HttpOnly", value: "", known: true },
    { name: "Foo", value: "bar", known: false },
  ]);
  assert.equal(parseSetCookie("HttpOnly; Path=/"), null);
});

test("the package ships TypeScript declarations and a small .wasm", () => {
  const dts = readFileSync(new URL("../pkg/node/tether_js.d.ts", import.meta.url), "utf8");
  for (const decl of [
    "export function decode(value: string, options?: DecodeOptions): Decoded;",
    "export function encode(input: EncodeInput): string;",
    "export function pathMatches(cookiePath: string, requestPath: string): boolean;",
    "export interface SessionLookup",
    "export class Session",
  ]) {
    assert.ok(dts.includes(decl), `tether_js.d.ts declares ${decl}`);
  }
  const size = statSync(new URL("../pkg/web/tether_js_bg.wasm", import.meta.url)).size;
  // 150 KB before the sealed format; its AES-256-GCM-SIV (software AES, no
  // AES-NI in Wasm) adds about 18 KB.
  assert.ok(size <= 175 * 1024, `the .wasm is ${size} bytes (goal: at most 175 KB)`);
});
