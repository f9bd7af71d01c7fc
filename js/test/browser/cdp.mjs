// A small client for the Chrome DevTools Protocol over --remote-debugging-pipe:
// JSON messages separated by NUL bytes, written to the browser's fd 3 and read
// from its fd 4. No WebSocket and no npm package needed.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const CALL_TIMEOUT_MS = 20_000;

export class Browser {
  /** Starts headless Chromium with a fresh profile. */
  static launch(executable = process.env.CHROMIUM ?? "chromium") {
    const profile = mkdtempSync(join(tmpdir(), "tether-chromium-"));
    const child = spawn(
      executable,
      [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--remote-debugging-pipe",
        `--user-data-dir=${profile}`,
        "about:blank",
      ],
      // Its own process group, so close() ends the renderers too.
      { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"], detached: true },
    );
    return new Browser(child, profile);
  }

  constructor(child, profile) {
    this.child = child;
    this.profile = profile;
    this.nextId = 1;
    this.pending = new Map();
    this.listeners = new Set();
    this.stderr = "";
    this.exited = new Promise((resolve) => child.once("exit", resolve));
    child.once("error", (err) => this.#failAll(err));
    child.once("exit", (code, signal) =>
      this.#failAll(new Error(`chromium exited (${code ?? signal}): ${this.stderr.slice(-2000)}`)),
    );
    child.stderr.on("data", (d) => {
      this.stderr = (this.stderr + d).slice(-8000);
    });
    let buffer = "";
    child.stdio[4].on("data", (chunk) => {
      buffer += chunk.toString("utf8");
      let end;
      while ((end = buffer.indexOf("\0")) >= 0) {
        const message = JSON.parse(buffer.slice(0, end));
        buffer = buffer.slice(end + 1);
        this.#dispatch(message);
      }
    });
  }

  #dispatch(message) {
    if (message.id !== undefined) {
      const call = this.pending.get(message.id);
      if (!call) return;
      this.pending.delete(message.id);
      clearTimeout(call.timer);
      if (message.error) call.reject(new Error(`${call.method}: ${message.error.message}`));
      else call.resolve(message.result);
      return;
    }
    for (const listener of this.listeners) listener(message);
  }

  #failAll(err) {
    for (const call of this.pending.values()) {
      clearTimeout(call.timer);
      call.reject(err);
    }
    this.pending.clear();
  }

  /** Sends one command (to a page when `sessionId` is given) and awaits its result. */
  send(method, params = {}, sessionId = undefined) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${method}: no answer in ${CALL_TIMEOUT_MS} ms`));
      }, CALL_TIMEOUT_MS);
      this.pending.set(id, { method, resolve, reject, timer });
      this.child.stdio[3].write(JSON.stringify({ id, method, params, sessionId }) + "\0");
    });
  }

  /** Calls `listener` with every event. */
  onEvent(listener) {
    this.listeners.add(listener);
  }

  /** Opens a tab and returns a page handle bound to its session. */
  async newPage() {
    const { targetId } = await this.send("Target.createTarget", { url: "about:blank" });
    const { sessionId } = await this.send("Target.attachToTarget", { targetId, flatten: true });
    return new Page(this, sessionId);
  }

  /** Kills the browser's whole process group and removes its profile. */
  async close() {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      try {
        process.kill(-this.child.pid, "SIGKILL");
      } catch {
        this.child.kill("SIGKILL");
      }
      await Promise.race([this.exited, new Promise((r) => setTimeout(r, 5000))]);
    }
    rmSync(this.profile, { recursive: true, force: true });
  }
}

export class Page {
  constructor(browser, sessionId) {
    this.browser = browser;
    this.sessionId = sessionId;
    this.errors = [];
    browser.onEvent((m) => {
      if (m.sessionId !== sessionId) return;
      if (m.method === "Runtime.exceptionThrown") {
        this.errors.push(m.params.exceptionDetails.exception?.description ?? m.params.exceptionDetails.text);
      } else if (m.method === "Runtime.consoleAPICalled" && m.params.type === "error") {
        this.errors.push(m.params.args.map((a) => a.value ?? a.description).join(" "));
      }
    });
  }

  send(method, params = {}) {
    return this.browser.send(method, params, this.sessionId);
  }

  /** Evaluates an expression in the page and returns its value. */
  async eval(expression) {
    const r = await this.send("Runtime.evaluate", { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.exception?.description}`);
    return r.result.value;
  }

  /** Polls `expression` until it is truthy (at most `timeoutMs`). */
  async waitFor(expression, timeoutMs = 15_000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const v = await this.eval(expression);
      if (v) return v;
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${expression}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
