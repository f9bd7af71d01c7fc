// The package as a user meets it: the README's example runs, and the
// package.json exports resolve by name from an ES module.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const JS = fileURLToPath(new URL("..", import.meta.url));

test("the README example runs and prints what it promises", () => {
  const out = execFileSync(process.execPath, [join(JS, "examples", "quickstart.mjs")], {
    encoding: "utf8",
    timeout: 30_000,
  });
  assert.match(out, /^lookup: miss absent$/m);
  assert.match(
    out,
    /^set-cookie: global-session-cookie="[A-Za-z0-9+\/]+=*"; Max-Age=120; Path=\/; SameSite=Lax; HttpOnly$/m,
  );
  assert.match(out, /^lookup: pinned \[ '10\.0\.0\.7:8080' \] shop$/m);
  assert.match(out, /^override-host: 10\.0\.0\.7:8080$/m);
  assert.match(out, /^grpc cookie: Wzo6MV06NTAwNTE7ZWNobw== -> grpc-session=Wzo6MV06NTAwNTE7ZWNobw==; HttpOnly; Path=\/; Max-Age=60$/m);
  assert.match(out, /^signed: valid$/m);
  assert.match(out, /^error \(address\): addresses\[0\]: "10\.0\.0\.7" is not an ip:port address/m);
});

test("import from \"tether-js\" resolves through package.json exports", () => {
  const dir = mkdtempSync(join(tmpdir(), "tether-js-consumer-"));
  try {
    mkdirSync(join(dir, "node_modules"));
    symlinkSync(join(JS, "pkg"), join(dir, "node_modules", "tether-js"), "dir");
    writeFileSync(
      join(dir, "main.mjs"),
      'import { decode } from "tether-js";\n' +
        'import * as web from "tether-js/web";\n' +
        'console.log(JSON.stringify([decode("MTI3LjAuMC4xOjQ0Mw==").addresses, typeof web.default]));\n',
    );
    const out = execFileSync(process.execPath, ["main.mjs"], { cwd: dir, encoding: "utf8", timeout: 30_000 });
    assert.deepEqual(JSON.parse(out), [["127.0.0.1:443"], "function"]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
