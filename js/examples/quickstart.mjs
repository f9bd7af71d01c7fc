// Using tether cookies from JavaScript: run `js/build.sh`, then
//   node js/examples/quickstart.mjs
// In your own project: `npm install <path to tether>/js/pkg`, then import from "tether-js".
import { Session, decode, encode, parseSetCookie, pathMatches, renderSetCookie } from "../pkg/node/tether_js.js";

// The same session configuration the Envoy plugin and the native client read.
const config = {
  cookie: { name: "global-session-cookie", path: "/", ttl: "120s", attributes: [{ name: "SameSite", value: "Lax" }] },
  format: "envoy",
};
const session = new Session(config);
const now = 1_800_000_000; // epoch seconds; leave it out to use the clock

// 1. A request arrives without a cookie: load balance, then pin the client
//    to the host that answered.
const request = { path: "/cart", cookies: ["theme=dark"] };
console.log("lookup:", session.lookup(request, now).outcome, session.lookup(request, now).reason);
const emit = session.respond(request, { address: "10.0.0.7:8080", cluster: "shop" }, now);
console.log(`${emit.header}: ${emit.value}`);

// 2. The browser sends the cookie back: the request is pinned.
const { name, value } = parseSetCookie(emit.value);
const back = { path: "/cart", cookies: [`theme=dark; ${name}=${value}`] };
const pinned = session.lookup(back, now);
console.log("lookup:", pinned.outcome, pinned.session.addresses, pinned.session.cluster);
console.log("override-host:", pinned.overrideHost);

// 3. Read any cookie value: Envoy's, gRPC C-core's, legacy, tether signed.
console.log("decode:", decode("MTI3LjAuMC4xOjQxMjcxO2NsdXN0ZXItc3Nh"));

// 4. Write one: gRPC C-core's format, and its Set-Cookie in C-core's byte order.
const grpc = encode({ addresses: ["[::1]:50051"], cluster: "echo", format: "grpc" });
console.log("grpc cookie:", grpc, "->", renderSetCookie({ name: "grpc-session", path: "/", ttl: "60s" }, grpc, "grpc"));

// 5. Signed cookies: the first key signs, every key verifies.
const key = Buffer.from("a secret of at least 16 bytes").toString("base64");
const signed = encode({ addresses: ["10.0.0.7:8080"], ttl: 120, keys: [key], now });
console.log("signed:", decode(signed, { keys: [key], now }).signature);

// 6. Bad input throws an Error that names the field and the value.
try {
  encode({ addresses: ["10.0.0.7"] });
} catch (err) {
  console.log(`error (${err.code}): ${err.message}`);
}
console.log("path /api applies to /api/v1:", pathMatches("/api", "/api/v1"));
