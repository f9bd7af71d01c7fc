// Cookies minted by the native `tether` CLI round-trip through JavaScript and
// back: the same core, compiled twice, must agree byte for byte.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import {
  decode,
  encode,
  renderSetCookie,
  sessionFromCookieHeader,
} from "../pkg/node/tether_js.js";

// js/test.sh builds it; TETHER_BIN points elsewhere if needed.
const BIN =
  process.env.TETHER_BIN ?? fileURLToPath(new URL("../../target/debug/tether", import.meta.url));
const KEY = Buffer.from("js-and-cli-share-this-secret").toString("base64");
const NOW = 1_800_000_000;

// The CLI takes signing keys from a file only (never on the command line).
const KEY_DIR = mkdtempSync(join(tmpdir(), "tether-js-keys-"));
function keyFile(key) {
  const path = join(KEY_DIR, Buffer.from(key).toString("hex").slice(0, 16));
  writeFileSync(path, `${key}\n`);
  return path;
}

function tether(...args) {
  const out = execFileSync(BIN, args, { encoding: "utf8", timeout: 30_000 });
  return JSON.parse(out);
}

const CASES = [
  { format: "envoy", addresses: ["127.0.0.1:19001"] },
  { format: "envoy", addresses: ["10.0.0.1:80", "[2001:db8::1]:80"], cluster: "cluster_a", ttl: 120 },
  { format: "envoy", addresses: ["[::1]:8443"], cluster: "c", ttl: 3600, key: KEY },
  { format: "grpc", addresses: ["127.0.0.1:41271"], cluster: "cluster-ssa", ttl: 60 },
  { format: "grpc", addresses: ["10.0.0.1:80", "10.0.0.2:80"] },
  { format: "legacy", addresses: ["127.0.0.1:443"], ttl: 30 },
];

function cliArgs(c) {
  const args = ["cookie", "encode", "--format", c.format, "--now", String(NOW)];
  for (const a of c.addresses) args.push("--address", a);
  if (c.cluster) args.push("--cluster", c.cluster);
  if (c.ttl) args.push("--ttl", String(c.ttl));
  if (c.key) args.push("--key-file", keyFile(c.key));
  args.push("--name", "s", "--path", "/");
  return args;
}

test("the tether CLI is built", () => {
  assert.ok(existsSync(BIN), `${BIN} exists (cargo build -p tether-cli)`);
});

test("CLI-minted cookies decode in JavaScript and re-encode byte-identically", () => {
  for (const c of CASES) {
    const minted = tether(...cliArgs(c));
    const keys = c.key ? [c.key] : [];
    const d = decode(minted.value, { keys, now: NOW });
    assert.equal(d.format, c.format);
    assert.deepEqual(d.addresses, c.addresses);
    assert.equal(d.cluster, c.cluster ?? null);
    assert.equal(d.expires, minted.expires);
    assert.equal(d.signature, c.key ? "valid" : "unsigned");
    assert.equal(d.expired, false);

    const again = encode({
      addresses: c.addresses,
      cluster: c.cluster,
      ttl: c.ttl,
      format: c.format,
      keys,
      now: NOW,
    });
    assert.equal(again, minted.value, `${JSON.stringify(c)}`);

    const spec = { name: "s", path: "/", ttl: `${c.ttl ?? 0}s` };
    // Envoy's style for its own format; C-core's bare one for grpc and legacy.
    const style = c.format === "envoy" ? "envoy" : "grpc";
    assert.equal(renderSetCookie(spec, minted.value, style), minted.set_cookie);

    const lookup = sessionFromCookieHeader(`a=b; s=${minted.value}`, { cookie: spec, format: c.format, keys: c.key ? keys : undefined }, { now: NOW });
    assert.equal(lookup.outcome, "pinned");
    assert.deepEqual(lookup.session.addresses, c.addresses);
  }
});

test("JavaScript-minted cookies decode in the CLI", () => {
  for (const c of CASES) {
    const keys = c.key ? [c.key] : [];
    const value = encode({ addresses: c.addresses, cluster: c.cluster, ttl: c.ttl, format: c.format, keys, now: NOW });
    const args = ["cookie", "decode", value, "--now", String(NOW)];
    if (c.key) args.push("--key-file", keyFile(c.key));
    const cli = tether(...args);
    const js = decode(value, { keys, now: NOW });
    for (const field of ["format", "addresses", "cluster", "expires", "expired", "signature", "key", "quoted", "padded"]) {
      assert.deepEqual(js[field], cli[field], `${field} of ${JSON.stringify(c)}`);
    }
    // Envoy quotes the value in its Set-Cookie; both read it quoted too.
    assert.deepEqual(tether("cookie", "decode", `"${value}"`, "--now", String(NOW)).addresses, c.addresses);
  }
});

test("a wrong key fails in both", () => {
  const other = Buffer.from("another-secret-of-16+bytes").toString("base64");
  const value = encode({ addresses: ["10.0.0.1:80"], keys: [KEY] });
  assert.equal(tether("cookie", "decode", value, "--key-file", keyFile(other)).signature, "invalid");
  assert.equal(decode(value, { keys: [other] }).signature, "invalid");
});
