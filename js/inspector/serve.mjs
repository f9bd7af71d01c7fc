#!/usr/bin/env node
// Serves the inspector page and the browser build of tether-js, on 127.0.0.1
// only. Run `js/serve.sh` (it builds first if needed), or directly:
//
//   node js/inspector/serve.mjs [port]     default 8347; 0 picks a free port
//
// Only the page's files and js/pkg/web are served, nothing else of the tree.
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const SERVED = [resolve(ROOT, "inspector"), resolve(ROOT, "pkg", "web")];
const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".wasm": "application/wasm",
  ".ts": "text/plain; charset=utf-8",
  ".json": "application/json",
};
const HEADERS = {
  "cache-control": "no-store",
  "x-content-type-options": "nosniff",
  // The page needs nothing from elsewhere; compiling wasm needs 'wasm-unsafe-eval'.
  "content-security-policy":
    "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; connect-src 'self'; img-src 'self'",
};

async function handle(req, res) {
  if (req.method !== "GET" && req.method !== "HEAD") {
    res.writeHead(405, { allow: "GET, HEAD" }).end();
    return;
  }
  let path;
  try {
    path = decodeURIComponent(new URL(req.url, "http://localhost").pathname);
  } catch {
    res.writeHead(400).end();
    return;
  }
  if (path === "/" || path === "/inspector") {
    res.writeHead(302, { location: "/inspector/" }).end();
    return;
  }
  if (path.endsWith("/")) path += "index.html";
  const file = resolve(ROOT, "." + path);
  if (!SERVED.some((dir) => file.startsWith(dir + sep))) {
    res.writeHead(404, HEADERS).end("not found\n");
    return;
  }
  try {
    const body = await readFile(file);
    const type = TYPES[extname(file)] ?? "application/octet-stream";
    res.writeHead(200, { ...HEADERS, "content-type": type, "content-length": body.length });
    res.end(req.method === "HEAD" ? undefined : body);
  } catch {
    res.writeHead(404, HEADERS).end("not found\n");
  }
}

/** Starts the server on 127.0.0.1; resolves to `{ server, url }`. */
export function serve({ port = 8347 } = {}) {
  const server = createServer((req, res) => {
    handle(req, res).catch(() => res.destroy());
  });
  return new Promise((ok, fail) => {
    server.once("error", fail);
    server.listen(port, "127.0.0.1", () => {
      const { port: bound } = server.address();
      ok({ server, url: `http://127.0.0.1:${bound}/inspector/` });
    });
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const port = Number(process.argv[2] ?? 8347);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`serve.mjs: port ${JSON.stringify(process.argv[2])} is not 0..65535`);
    process.exit(2);
  }
  const { server, url } = await serve({ port });
  console.log(`tether session-cookie inspector: ${url}  (Ctrl-C stops it)`);
  for (const signal of ["SIGINT", "SIGTERM"]) {
    process.on(signal, () => {
      server.closeAllConnections();
      server.close(() => process.exit(0));
    });
  }
}
