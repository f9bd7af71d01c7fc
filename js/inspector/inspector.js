// The inspector page: splits what was pasted into cookie values and shows
// what tether-core makes of each. Every cookie decision (finding the pairs of
// a Cookie header, reading a Set-Cookie, decoding, verifying the MAC, judging
// expiry) is a call into the wasm module; this file only lays out the answers.
import init, { cookiePairs, decode, parseSetCookie } from "../pkg/web/tether_js.js";

const FORMATS = {
  envoy: "Envoy (protobuf cookie)",
  grpc: "gRPC C-core (addr;cluster text)",
  legacy: "legacy (plain ip:port)",
};
const SOURCES = {
  cookie: "Cookie header",
  "set-cookie": "Set-Cookie header",
  value: "bare value",
};

const $ = (id) => document.getElementById(id);

/** Which kind of text a pasted line is, and the text without a header name. */
function classify(line, chosen) {
  const named = /^\s*(set-cookie|cookie)\s*:(.*)$/is.exec(line);
  if (named) return { kind: named[1].toLowerCase(), text: named[2].trim() };
  const text = line.trim();
  if (chosen !== "auto") return { kind: chosen, text };
  // A whole line that decodes is a value, whatever '=' padding it has.
  try {
    decode(text);
    return { kind: "value", text };
  } catch {
    // not a bare value: look further
  }
  const received = parseSetCookie(text);
  if (received && received.attributes.some((a) => a.known)) return { kind: "set-cookie", text };
  if (cookiePairs(text).length > 0) return { kind: "cookie", text };
  return { kind: "value", text };
}

/** The cookies a line holds: [{name, value, source, attributes, problem}]. */
function entries(line, chosen) {
  const { kind, text } = classify(line, chosen);
  const source = SOURCES[kind];
  if (kind === "cookie") {
    const pairs = cookiePairs(text);
    if (pairs.length === 0) return [{ name: null, value: text, source, problem: "no name=value pair" }];
    return pairs.map((p) => ({ ...p, source }));
  }
  if (kind === "set-cookie") {
    const r = parseSetCookie(text);
    if (!r) {
      return [{ name: null, value: text, source, problem: "a browser ignores it: no name=value before the first ';'" }];
    }
    return [{ name: r.name, value: r.value, source, attributes: r.attributes }];
  }
  return [{ name: null, value: text, source }];
}

function decodeWith(value, keys, state) {
  try {
    return decode(value, { keys });
  } catch (err) {
    if (err.code !== "config" || keys.length === 0) throw err;
    // The keys are at fault, not the cookie: say so once, decode without them.
    state.keyError = err.message;
    return decode(value);
  }
}

function date(expires) {
  const d = new Date(expires * 1000);
  return Number.isFinite(d.getTime()) ? d.toISOString().replace(".000Z", "Z") : `epoch second ${expires}`;
}

function mac(d, keyCount) {
  switch (d.signature) {
    case "unsigned":
      return "none (unsigned cookie)";
    case "valid":
      return `valid: verified by key ${d.key + 1} of ${keyCount}${d.key === 0 ? " (the signing key)" : ""}`;
    case "invalid":
      return "INVALID: matches none of the keys given (tether ignores this cookie)";
    default:
      return "present, not checked: paste the signing keys to verify it";
  }
}

function card(entry, keys, state) {
  const node = $("card").content.firstElementChild.cloneNode(true);
  const set = (field, text) => {
    node.querySelector(`[data-field="${field}"]`).textContent = text;
  };
  const hide = (field) => node.querySelector(`[data-field="${field}"]`).parentElement.remove();
  node.querySelector(".name").textContent = entry.name ?? "(value)";
  set("source", entry.source);
  set("value", entry.value);
  if (entry.attributes) {
    set(
      "attributes",
      entry.attributes.length === 0
        ? "none"
        : entry.attributes.map((a) => (a.value === "" ? a.name : `${a.name}=${a.value}`)).join("; "),
    );
  } else {
    hide("attributes");
  }
  let d = null;
  let problem = entry.problem;
  if (!problem) {
    try {
      d = decodeWith(entry.value, keys, state);
    } catch (err) {
      problem = err.message;
    }
  }
  const badge = node.querySelector(".badge");
  if (!d) {
    for (const f of ["format", "addresses", "cluster", "expires", "mac", "encoding"]) hide(f);
    set("error", problem);
    node.dataset.status = "error";
    badge.textContent = "not a session cookie";
    return node;
  }
  hide("error");
  set("format", FORMATS[d.format] + (d.signed ? " + MAC: tether signed" : ""));
  set("addresses", d.addresses.join(", "));
  set("cluster", d.cluster ?? "none");
  set(
    "expires",
    d.expires === null
      ? "no expiry in the cookie"
      : `${date(d.expires)} (${d.expired ? "expired" : "not expired"})`,
  );
  set("mac", mac(d, keys.length));
  set("encoding", `${d.quoted ? "quoted" : "unquoted"}, base64 ${d.padded ? "padded" : "unpadded"}`);
  node.dataset.status = d.signature === "invalid" ? "bad-mac" : d.expired ? "expired" : "ok";
  badge.textContent =
    node.dataset.status === "ok" ? "session cookie" : node.dataset.status === "expired" ? "expired" : "bad MAC";
  return node;
}

function render() {
  const lines = $("input").value.split(/\r?\n/).filter((l) => l.trim() !== "");
  const keys = $("keys").value.split(/\s+/).filter((k) => k !== "");
  const state = { keyError: null };
  const cards = lines.flatMap((line) => entries(line, $("kind").value)).map((e) => card(e, keys, state));
  $("results").replaceChildren(...cards);
  const sessions = cards.filter((c) => c.dataset.status !== "error").length;
  const summary = $("summary");
  summary.dataset.sessions = String(sessions);
  summary.dataset.cookies = String(cards.length);
  summary.textContent =
    lines.length === 0
      ? "Paste something above."
      : `${sessions} session cookie${sessions === 1 ? "" : "s"} in ${cards.length} cookie${cards.length === 1 ? "" : "s"} on ${lines.length} line${lines.length === 1 ? "" : "s"}.` +
        (state.keyError ? ` Keys ignored: ${state.keyError}` : "");
  $("now").textContent = new Date().toISOString().replace(/\.\d+Z$/, "Z");
}

try {
  await init();
  for (const id of ["input", "keys", "kind"]) $(id).addEventListener("input", render);
  $("form").addEventListener("submit", (e) => e.preventDefault());
  render();
  document.body.dataset.ready = "true";
} catch (err) {
  $("summary").textContent = `tether-core failed to load: ${err}`;
  document.body.dataset.ready = "failed";
}
