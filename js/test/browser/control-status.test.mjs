// tether-control's status page (GET / on its admin listener) in real headless
// Chromium: the real binary serves a file; the page shows its clusters and
// endpoints, then, without a reload, a client that connects (`tether xds dump
// --watch`, which holds the cluster and reports no load) and an endpoint the
// file sets DRAINING with its verdict (`unknown`: the holder does not report).
// A screenshot is kept in target/artifacts/.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { Browser } from "./cdp.mjs";

const REPO = fileURLToPath(new URL("../../../", import.meta.url));
const ARTIFACTS = join(REPO, "target/artifacts/");
const CONTROL = process.env.TETHER_CONTROL_BIN ?? join(REPO, "target/debug/tether-control");
const TETHER = process.env.TETHER_BIN ?? join(REPO, "target/debug/tether");

function config(health) {
  return `virtualhosts:
  - name: echo.tether.test
    routes:
      - services: [{ name: echo }]
services:
  - name: echo
    loadReporting: { interval: 1s }
    endpoints:
      - address: 127.0.0.2:9000
        locality: us/a
      - address: 127.0.0.3:9000
        locality: us/b
        health: ${health}
  - name: "<b>tag<b>"
    endpoints:
      - address: 127.0.0.4:9000
`;
}

let dir;
let control;
let holder;
let browser;
let page;
let admin;
let ads;

/** Resolves with the values of the stdout lines of `child` that start with each of `prefixes` (one reader, so no
 * line is missed between two), within 20 s. */
function linesStarting(child, prefixes) {
  return new Promise((resolve, reject) => {
    const found = new Map();
    const timer = setTimeout(() => reject(new Error(`no ${prefixes.join(", ")} within 20 s`)), 20_000);
    createInterface({ input: child.stdout }).on("line", (line) => {
      for (const p of prefixes) if (line.startsWith(p)) found.set(p, line.slice(p.length).trim());
      if (found.size === prefixes.length) {
        clearTimeout(timer);
        resolve(prefixes.map((p) => found.get(p)));
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`exited (${code}) before printing ${prefixes.join(", ")}`));
    });
  });
}

function write(health) {
  const file = join(dir, "tether.yaml");
  writeFileSync(`${file}.tmp`, config(health));
  renameSync(`${file}.tmp`, file);
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "tether-status-page-"));
  write("HEALTHY");
  control = spawn(
    CONTROL,
    ["--config", join(dir, "tether.yaml"), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--poll-ms", "50"],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  [ads, admin] = await linesStarting(control, ["listening on ", "admin on "]);
  browser = Browser.launch();
  page = await browser.newPage();
  await page.send("Runtime.enable");
  await page.send("Page.enable");
  await page.send("Emulation.setDeviceMetricsOverride", { width: 1100, height: 800, deviceScaleFactor: 1, mobile: false });
  await page.send("Page.navigate", { url: `http://${admin}/` });
});

after(async () => {
  await browser?.close();
  holder?.kill("SIGKILL");
  control?.kill("SIGKILL");
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** The endpoint row of `address`: its cells' text. */
function row(address) {
  return `(() => {
    const tr = document.querySelector('tr[data-address="${address}"]');
    return tr ? [...tr.cells].map((c) => c.textContent) : null;
  })()`;
}

test("the status page shows endpoints, then a client and a drain as they happen", { timeout: 90_000 }, async () => {
  // The first render: every endpoint, HEALTHY, no client yet.
  await page.waitFor(`document.querySelector('tr[data-address="127.0.0.3:9000"]')`);
  await page.eval("window.loadedOnce = true");
  const healthy = await page.eval(row("127.0.0.3:9000"));
  assert.deepEqual(healthy.slice(0, 6), ["127.0.0.3:9000", "us/b/", "0", "1", "HEALTHY", "-"]);
  assert.match(await page.eval(`document.getElementById("meta").textContent`), /0 client\(s\) connected to this replica/);
  // A name from the file is text, never markup.
  assert.equal(await page.eval(`document.querySelectorAll("#clusters b").length`), 0);
  assert.equal(await page.eval(`[...document.querySelectorAll("#clusters h2")].map((h) => h.textContent).join("|")`), "<b>tag<b>|echo");

  // A client connects: it appears without a reload.
  const bootstrap = join(dir, "bootstrap.json");
  writeFileSync(
    bootstrap,
    JSON.stringify({
      xds_servers: [{ server_uri: ads, channel_creds: [{ type: "insecure" }], server_features: ["xds_v3"] }],
      node: { id: "page-holder", cluster: "tether-test" },
    }),
  );
  holder = spawn(TETHER, ["xds", "dump", "--watch", "--listener", "echo.tether.test"], {
    env: { ...process.env, GRPC_XDS_BOOTSTRAP: bootstrap },
    stdio: ["ignore", "ignore", "inherit"],
  });
  const client = await page.waitFor(`(() => {
    const tr = document.querySelector('#clients tr[data-node="page-holder"]');
    return tr && [...tr.cells].map((c) => c.textContent);
  })()`);
  assert.deepEqual(client, ["page-holder", "ADS", "echo", "-"]);

  // The file drains 127.0.0.3: DRAINING, its verdict unknown (the holder does
  // not report), still without a reload.
  write("DRAINING");
  const draining = await page.waitFor(`(() => {
    const r = ${row("127.0.0.3:9000")};
    return r && r[4] === "DRAINING" ? r : null;
  })()`);
  assert.equal(draining[5], "unknown");
  assert.equal(draining[8], "page-holder: not reporting");
  assert.match(draining[7], /^\d+ s$/);
  assert.equal(await page.eval(`document.querySelector('tr[data-address="127.0.0.3:9000"] .verdict').className`), "verdict verdict-unknown");
  assert.equal(await page.eval("window.loadedOnce"), true, "the page was not reloaded");
  assert.deepEqual(page.errors, []);

  const { data } = await page.send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true });
  mkdirSync(ARTIFACTS, { recursive: true });
  writeFileSync(join(ARTIFACTS, "control-status.png"), Buffer.from(data, "base64"));
});
