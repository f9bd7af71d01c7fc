// The inspector page in real headless Chromium: paste headers and values the
// way a person would, read what the page shows, and keep screenshots in
// target/artifacts/.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { serve } from "../../inspector/serve.mjs";
import { encode } from "../../pkg/node/tether_js.js";
import { Browser } from "./cdp.mjs";

const ARTIFACTS = fileURLToPath(new URL("../../../target/artifacts/", import.meta.url));
const KEY = Buffer.from("inspector-signing-key").toString("base64");
const OTHER_KEY = Buffer.from("some-other-signing-key").toString("base64");

// 2100-01-01T00:00:00Z: not expired. 2001-09-09T01:46:40Z: expired.
const ENVOY = encode({
  addresses: ["10.0.0.1:8080", "[2001:db8::7]:8080"],
  cluster: "checkout",
  expires: 4102444800,
});
const SIGNED = encode({ addresses: ["192.0.2.10:443"], cluster: "payments", expires: 1000000000, keys: [KEY] });
const GRPC = "MTI3LjAuMC4xOjQxMjcxO2NsdXN0ZXItc3Nh"; // as gRPC C-core 1.85 sets it
const LEGACY = "MTI3LjAuMC4xOjQ0Mw==";

const PASTE = [
  `Cookie: theme=dark; global-session-cookie="${ENVOY}"; grpc-session=${GRPC}`,
  `Set-Cookie: sticky="${SIGNED}"; Max-Age=120; Path=/api; SameSite=Lax; Secure; HttpOnly`,
  LEGACY,
  "not a cookie!",
].join("\n");

let browser;
let server;
let page;

before(async () => {
  const started = await serve({ port: 0 });
  server = started.server;
  browser = Browser.launch();
  page = await browser.newPage();
  await page.send("Runtime.enable");
  await page.send("Page.enable");
  await page.send("Emulation.setDeviceMetricsOverride", {
    width: 1000,
    height: 900,
    deviceScaleFactor: 1,
    mobile: false,
  });
  await page.send("Page.navigate", { url: started.url });
  const ready = await page.waitFor("document.body && document.body.dataset.ready");
  assert.equal(ready, "true", "the wasm module loaded");
});

after(async () => {
  await browser?.close();
  if (server) {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

/** Replaces the text of a textarea the way a paste does (focus, select all, insert). */
async function paste(id, text) {
  await page.eval(`(() => { const e = document.getElementById(${JSON.stringify(id)}); e.focus(); e.select(); })()`);
  if (text === "") {
    await page.send("Input.dispatchKeyEvent", { type: "keyDown", key: "Backspace", code: "Backspace", windowsVirtualKeyCode: 8 });
    await page.send("Input.dispatchKeyEvent", { type: "keyUp", key: "Backspace", code: "Backspace", windowsVirtualKeyCode: 8 });
  } else {
    await page.send("Input.insertText", { text });
  }
  assert.equal(await page.eval(`document.getElementById(${JSON.stringify(id)}).value`), text);
}

/** What the page shows: the summary line and every cookie card's fields. */
function read() {
  return page.eval(`(() => {
    const s = document.getElementById("summary");
    return {
      summary: s.textContent,
      sessions: Number(s.dataset.sessions),
      cookies: Number(s.dataset.cookies),
      cards: [...document.querySelectorAll("#results .cookie")].map((c) => ({
        name: c.querySelector(".name").textContent,
        badge: c.querySelector(".badge").textContent,
        status: c.dataset.status,
        ...Object.fromEntries([...c.querySelectorAll("[data-field]")].map((td) => [td.dataset.field, td.textContent])),
      })),
    };
  })()`);
}

async function screenshot(name) {
  const { data } = await page.send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true });
  mkdirSync(ARTIFACTS, { recursive: true });
  const file = `${ARTIFACTS}${name}`;
  writeFileSync(file, Buffer.from(data, "base64"));
  return file;
}

test("pasted headers and values are split into cookies and decoded", { timeout: 60_000 }, async () => {
  await paste("input", PASTE);
  const shown = await read();
  assert.equal(shown.cookies, 6);
  assert.equal(shown.sessions, 4);
  assert.equal(shown.summary, "4 session cookies in 6 cookies on 4 lines.");
  const [theme, envoy, grpc, sticky, legacy, junk] = shown.cards;

  assert.equal(theme.name, "theme");
  assert.equal(theme.status, "error");
  assert.equal(theme.badge, "not a session cookie");
  assert.match(theme.error, /^value "dark": /);
  assert.equal(theme.format, undefined, "no decoded fields for a non-session cookie");

  assert.deepEqual(
    {
      name: envoy.name,
      source: envoy.source,
      format: envoy.format,
      addresses: envoy.addresses,
      cluster: envoy.cluster,
      expires: envoy.expires,
      mac: envoy.mac,
      encoding: envoy.encoding,
      status: envoy.status,
    },
    {
      name: "global-session-cookie",
      source: "Cookie header",
      format: "Envoy (protobuf cookie)",
      addresses: "10.0.0.1:8080, [2001:db8::7]:8080",
      cluster: "checkout",
      expires: "2100-01-01T00:00:00Z (not expired)",
      mac: "none (unsigned cookie)",
      encoding: "quoted, base64 padded",
      status: "ok",
    },
  );
  assert.equal(envoy.attributes, undefined, "a Cookie header has no attributes");

  assert.equal(grpc.format, "gRPC C-core (addr;cluster text)");
  assert.equal(grpc.addresses, "127.0.0.1:41271");
  assert.equal(grpc.cluster, "cluster-ssa");
  assert.equal(grpc.expires, "no expiry in the cookie");
  assert.equal(grpc.encoding, "unquoted, base64 padded");

  assert.equal(sticky.name, "sticky");
  assert.equal(sticky.source, "Set-Cookie header");
  assert.equal(sticky.format, "Envoy (protobuf cookie) + MAC: tether signed");
  assert.equal(sticky.addresses, "192.0.2.10:443");
  assert.equal(sticky.cluster, "payments");
  assert.equal(sticky.expires, "2001-09-09T01:46:40Z (expired)");
  assert.equal(sticky.status, "expired");
  assert.equal(sticky.mac, "present, not checked: paste the signing keys to verify it");
  assert.equal(sticky.attributes, "Max-Age=120; Path=/api; SameSite=Lax; Secure; HttpOnly");

  assert.equal(legacy.source, "bare value");
  assert.equal(legacy.format, "legacy (plain ip:port)");
  assert.equal(legacy.addresses, "127.0.0.1:443");
  assert.equal(legacy.encoding, "unquoted, base64 padded");

  assert.equal(junk.status, "error");
  assert.equal(junk.error, 'value "not a cookie!": the cookie value is not standard base64');
});

test("the MAC status follows the keys pasted", { timeout: 60_000 }, async () => {
  await paste("input", PASTE);
  await paste("keys", KEY);
  let sticky = (await read()).cards[3];
  assert.equal(sticky.mac, "valid: verified by key 1 of 1 (the signing key)");
  assert.equal(sticky.status, "expired");
  const file = await screenshot("inspector.png");
  assert.ok(file.endsWith("inspector.png"));

  // Rotation: the old key second still verifies.
  await paste("keys", `${OTHER_KEY}\n${KEY}`);
  sticky = (await read()).cards[3];
  assert.equal(sticky.mac, "valid: verified by key 2 of 2");

  await paste("keys", OTHER_KEY);
  const shown = await read();
  sticky = shown.cards[3];
  assert.equal(sticky.mac, "INVALID: matches none of the keys given (tether ignores this cookie)");
  assert.equal(sticky.status, "bad-mac");
  assert.equal(sticky.badge, "bad MAC");
  await screenshot("inspector-bad-mac.png");

  await paste("keys", "c2hvcnQ=");
  const ignored = await read();
  assert.match(ignored.summary, /Keys ignored: keys\[0\]: "<8 characters>" decodes to 5 bytes; a key needs at least 16$/);
  assert.equal(ignored.cards[3].mac, "present, not checked: paste the signing keys to verify it");
  await paste("keys", "");
});

test("detection, the explicit choice, and no markup from input", { timeout: 60_000 }, async () => {
  // No header name: attributes make it a Set-Cookie, plain pairs a Cookie header.
  await paste("input", `s="${ENVOY}"; Path=/; HttpOnly\na=${LEGACY}; b=<img src=x onerror="document.title='owned'">`);
  let shown = await read();
  assert.deepEqual(
    shown.cards.map((c) => [c.name, c.source]),
    [
      ["s", "Set-Cookie header"],
      ["a", "Cookie header"],
      ["b", "Cookie header"],
    ],
  );
  assert.equal(shown.cards[0].attributes, "Path=/; HttpOnly");
  assert.equal(shown.cards[1].addresses, "127.0.0.1:443");
  assert.equal(shown.cards[2].value, `<img src=x onerror="document.title='owned'">`);
  assert.equal(await page.eval(`document.querySelector("#results img")`), null, "input is shown as text");
  assert.notEqual(await page.eval("document.title"), "owned");

  // Chosen by hand: the same pairs read as one Set-Cookie.
  await page.eval(`(() => { const k = document.getElementById("kind"); k.value = "set-cookie"; k.dispatchEvent(new Event("input")); })()`);
  await paste("input", `a=${LEGACY}; Foo=bar`);
  shown = await read();
  assert.equal(shown.cards.length, 1);
  assert.equal(shown.cards[0].source, "Set-Cookie header");
  assert.equal(shown.cards[0].attributes, "Foo=bar");
  assert.equal(shown.cards[0].addresses, "127.0.0.1:443");
});

test("the page raised no errors", () => {
  assert.deepEqual(page.errors, []);
});
