#!/usr/bin/env python3
"""The demo's story across the containers of envoy-configs/docker-compose.yml.

scripts/compose-test.sh brings the compose project up and runs this; it
only talks to what is running: Envoy's published listener and admin on the
host's 127.0.0.1, `docker exec` into the client containers, `docker stop`
of a backend container, and tether-control's file in the mounted folder.

1. One session, three clients: a browser-like request through Envoy gets a
   cookie naming a container address on the compose network; the same
   cookie continues through tether::Channel (`tether call` in the
   channel-client container) and gRPC C-core (grpcio in the grpcio-client
   container) on the same backend; a session the channel starts continues
   through Envoy and C-core.
2. RequestHash on x-user: each user lands on the same backend through Envoy,
   the channel and C-core.
3. A backend container stops mid-session: sessions of all three clients
   call continuously (each with a cookie jar); the replica most of the
   channel's sessions are on is stopped. No call fails, every session that
   was on it moves once to another backend with a fresh cookie, the others
   stay, and no call stalls. The replica left Docker's DNS: tether-control
   drains its address, then removes it, and Envoy and the channel stop
   listing it, with nobody editing a file.

The backends are one compose service scaled to three (`backend`), which
tether-control resolves through Docker's DNS; each replica answers with its
host name, shown here as backend-N after its compose number.

With TETHER_MTLS=1 the project is the mTLS variant
(envoy-configs/docker-compose.mtls.yml): tether-control reads
tether-mtls.yaml, the C-core client uses xDS credentials, and a step checks
that every hop is mTLS: the backends refuse a plaintext call, Envoy made TLS
handshakes to them and to tether-control, and the backends saw the demo's
client certificate from Envoy and from C-core.

Usage: compose-story.py CONFIG_DIR NET HTTP_PORT ADMIN_PORT SERVICE=CONTAINER...
Prints the story as a table with a verdict per step; exits 1 when a step
fails.
"""

import base64
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

COOKIE = "global-session-cookie"
CLUSTER = "shop/session"
METHOD = "/tether.demo.v1.Echo/Echo"
USERS = 8
# Step 3: sessions per client, calls per session, and the backends' answer
# delay for gRPC calls (a call in flight when the backend is stopped).
CHANNEL_SESSIONS = 6
CHANNEL_CALLS = 160
PEER_CALLS = 100
ENVOY_CALLS = 100
SLEEP_MS = 50
# A call slower than this during the stop counts as a stall.
STALL_S = 3.0
# dns.drainOnRemoval in envoy-configs/compose/tether*.yaml: how long an
# address that left the backends' name stays DRAINING.
DNS_DRAIN_S = 5
# The mTLS variant (docker-compose.mtls.yml).
MTLS = os.environ.get("TETHER_MTLS") == "1"
CONFIG_FILE = "tether-mtls.yaml" if MTLS else "tether.yaml"
# grpc_xds_client.py's credentials: xDS ones where clusters ask for mTLS.
CCORE_CREDS = ["--xds-creds"] if MTLS else []
# Sessions' HTTP/2 keepalive, time and timeout (gRFC A8), as Envoy's in
# envoy-configs/compose/tether.yaml: a backend that stops answering without
# closing is left within twice this.
KEEPALIVE_S = 1


class StoryError(Exception):
    """A part of the story that could not run (not a failed check)."""


def encode_request(message):
    """tether.demo.v1.EchoRequest { message } as protobuf bytes."""
    data = message.encode()
    if len(data) > 127:
        raise ValueError("message %r: longer than 127 bytes" % message)
    return b"\x0a" + bytes([len(data)]) + data


def decode_grpc_cookie(value):
    """(address, cluster) of a cookie value in C-core's format."""
    try:
        text = base64.b64decode(value, validate=True).decode()
    except (ValueError, UnicodeDecodeError) as e:
        raise StoryError("cookie value %r is not C-core's format: %s" % (value, e))
    addresses, _, cluster = text.partition(";")
    return addresses.split(",")[0], cluster


def session_value(set_cookies):
    """The session cookie's value among Set-Cookie headers, or None."""
    for header in set_cookies:
        pair = header.split(";", 1)[0].strip()
        name, _, value = pair.partition("=")
        if name == COOKIE:
            return value.strip('"')
    return None


class Stage:
    """What the story runs against."""

    def __init__(self, config_dir, net, http_port, admin_port, containers):
        self.config_dir = config_dir
        self.net = net
        self.http_port = http_port
        self.admin_port = admin_port
        self.containers = containers
        # The backend service's replicas, found by their compose labels:
        # address -> label (every address a replica ever had), label ->
        # its current address, a replica's host name (the name it answers
        # with) -> label.
        self.project = os.environ.get("TETHER_COMPOSE_PROJECT", "")
        self.backends = {}
        self.addresses = {}
        self.hostnames = {}
        self.refresh_backends()

    def refresh_backends(self):
        """Reads the backend replicas (running or stopped) from Docker: each
        is called backend-N after its compose number; returns the labels of
        the running ones."""
        ids = subprocess.run(
            ["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project=" + self.project,
             "--filter", "label=com.docker.compose.service=backend"],
            capture_output=True, text=True, timeout=30, check=True).stdout.split()
        running = []
        for info in (json.loads(subprocess.run(["docker", "inspect"] + ids, capture_output=True, text=True,
                                               timeout=30, check=True).stdout) if ids else []):
            host = info["Config"]["Hostname"]
            label = self.hostnames.get(host)
            if label is None:
                label = "backend-%s" % info["Config"]["Labels"].get("com.docker.compose.container-number", "?")
                # A replica created again under the number of one removed.
                while label in self.hostnames.values():
                    label += "'"
                self.hostnames[host] = label
            self.containers[label] = info["Id"]
            self.addresses.pop(label, None)
            if info["State"]["Running"]:
                ips = [n["IPAddress"] for n in info["NetworkSettings"]["Networks"].values() if n["IPAddress"]]
                if ips:
                    self.addresses[label] = ips[0] + ":8080"
                    self.backends[ips[0] + ":8080"] = label
                    running.append(label)
        return sorted(running)

    def name_at(self, address):
        return self.backends.get(address, address)

    def label(self, name):
        """A backend's label for the name it answers with (its host name)."""
        return self.hostnames.get(name, name)

    def in_network(self, address):
        return address.startswith(self.net + ".") and not address.startswith("127.")

    def exec_args(self, service, *args, stdin=False):
        cmd = ["docker", "exec"]
        if stdin:
            cmd.append("-i")
        return cmd + [self.containers[service]] + list(args)

    def run(self, service, *args, stdin=None, timeout=60, check=True):
        """Runs a command in a container; its stdout lines (with check=False,
        also its exit status and stderr)."""
        try:
            out = subprocess.run(self.exec_args(service, *args, stdin=stdin is not None),
                                 input=stdin, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StoryError("%s: %s did not finish within %d s" % (service, args[0], timeout))
        if not check:
            return out.returncode, [l for l in out.stdout.splitlines() if l.strip()], out.stderr
        if out.returncode != 0:
            raise StoryError("%s: %s failed (exit %d): %s" % (
                service, " ".join(args[:2]), out.returncode,
                (out.stderr.strip() or out.stdout.strip())[-400:]))
        return [line for line in out.stdout.splitlines() if line.strip()]

    # --- the three clients ---------------------------------------------------

    def envoy(self, cookie=None, user=None, timeout=10, host=None, client_cert=None):
        """GET / through Envoy's published listener (to the virtual host
        `host`, default the catch-all shop): (status, backend, Set-Cookie
        value). With a list as `client_cert`, the answer's x-client-cert
        (the client certificate the backend saw) is appended to it."""
        headers = {"host": host} if host else {}
        if cookie:
            headers["cookie"] = "%s=%s" % (COOKIE, cookie)
        if user:
            headers["x-user"] = user
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            conn.request("GET", "/", headers=headers)
            resp = conn.getresponse()
            resp.read()
            if client_cert is not None:
                client_cert.append(resp.getheader("x-client-cert"))
            return (resp.status, self.label(resp.getheader("x-backend", "")),
                    session_value(resp.headers.get_all("set-cookie") or []))
        finally:
            conn.close()

    def channel(self, *extra, count=1, cookie=None):
        """`tether call` in the channel-client container: its JSON lines."""
        args = ["tether", "call", "xds:///shop", METHOD, "--count", str(count), "--timeout", "10"]
        if cookie:
            args += ["--cookie", "%s=%s" % (COOKIE, cookie)]
        lines = [json.loads(line) for line in self.run("channel-client", *(args + list(extra)))]
        return [l for l in lines if "call" in l]

    def ccore(self, calls, cookie=None, extra=(), stdin=None):
        """The grpcio client in the grpcio-client container: its JSON lines."""
        args = ["python3", "/opt/tether/peers/grpc_xds_client.py"] + CCORE_CREDS + list(extra)
        args += ["xds:///shop", str(calls)]
        if cookie:
            args.append("%s=%s" % (COOKIE, cookie))
        lines = [json.loads(line) for line in self.run("grpcio-client", *args, stdin=stdin)]
        for l in lines:
            if "backend" in l:
                l["backend"] = self.label(l["backend"])
        return lines

    def control_admin(self, path):
        """tether-control's admin page at `path` (its JSON)."""
        conn = http.client.HTTPConnection("127.0.0.1", int(os.environ["TETHER_CONTROL_ADMIN_PORT"]), timeout=5)
        try:
            conn.request("GET", path)
            return json.loads(conn.getresponse().read().decode())
        finally:
            conn.close()

    def admin(self, path):
        """The text of Envoy's admin page at `path`."""
        conn = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=5)
        try:
            conn.request("GET", path)
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def envoy_hosts(self):
        """The shop session cluster's hosts in Envoy's admin /clusters."""
        text = self.admin("/clusters")
        prefix = CLUSTER + "::"
        return {line.split("::")[1] for line in text.splitlines()
                if line.startswith(prefix) and "::health_flags::" in line}

    def envoy_stats(self, names):
        """Counters of the shop session cluster from Envoy's admin /stats."""
        text = self.admin("/stats?filter=^cluster%5C.shop/session%5C.")
        found = {}
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            short = key[len("cluster.%s." % CLUSTER):]
            if short in names:
                found[short] = int(value)
        return {n: found.get(n, 0) for n in names}

    def channel_endpoints(self):
        """The shop service's endpoints as tether's XdsClient in the channel container sees them."""
        doc = json.loads("\n".join(self.run(
            "channel-client", "tether", "xds", "dump", "--listener", "shop", "--timeout", "10")))
        found = set()
        for e in doc.get("endpoints", []):
            if e.get("name") != "shop" or not e.get("resource"):
                continue
            for p in e["resource"]["priorities"]:
                for loc in p["localities"]:
                    for ep in loc["endpoints"]:
                        found.update(ep["addresses"])
        return found


class Step:
    """A step's table rows, failures and verdict."""

    def __init__(self, title, stage):
        self.title = title
        self.stage = stage
        self.rows = []
        self.failures = []
        self.verdict = ""

    def row(self, client, sent, answered, received="-"):
        self.rows.append((client, sent, answered, received))

    def check(self, ok, failure):
        if not ok:
            self.failures.append(failure)
        return ok

    def describe(self, value):
        if not value:
            return "-"
        address, cluster = decode_grpc_cookie(value)
        return "grpc: %s (%s), cluster %s" % (self.stage.name_at(address), address, cluster)

    @property
    def ok(self):
        return not self.failures


def tally(names):
    counts = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(n if c == 1 else "%s ×%d" % (n, c) for n, c in sorted(counts.items()))


def channel_backend(stage, line):
    return stage.name_at(line.get("peer") or "")


# --- step 1 ------------------------------------------------------------------

def one_session_three_clients(stage):
    step = Step("1. one session, three clients, across containers", stage)
    status, a, c1 = stage.envoy()
    step.row("Envoy (browser, host)", "-", a, step.describe(c1))
    if not step.check(status == 200 and c1, "Envoy answered %d without a session cookie" % status):
        return step
    address, cluster = decode_grpc_cookie(c1)
    # tether's own reader in the channel container, as a second opinion.
    decoded = json.loads(stage.run("channel-client", "tether", "cookie", "decode", c1)[0])
    step.check(decoded.get("addresses") == [address] and decoded.get("cluster") == CLUSTER,
               "tether cookie decode reads Envoy's cookie as %s" % decoded)
    step.check(stage.in_network(address) and cluster == CLUSTER,
               "Envoy's cookie names %s in %r, not a container address of %s.0/24 in %s"
               % (address, cluster, stage.net, CLUSTER))
    step.check(stage.name_at(address) == a, "Envoy's cookie names %s, but %s answered" % (address, a))

    lines = stage.channel(count=3, cookie=c1)
    got = [channel_backend(stage, l) for l in lines]
    step.row("tether::Channel (container)", "Envoy's cookie", tally(got),
             step.describe(session_value(sum((l["set_cookie"] for l in lines), []))))
    step.check(got == [a] * 3, "the channel did not keep Envoy's session on %s: %s" % (a, got))

    lines = stage.ccore(3, cookie=c1)
    got = [l["backend"] for l in lines]
    step.row("C-core (grpcio container)", "Envoy's cookie", tally(got),
             step.describe(session_value(sum((l["set_cookie"] for l in lines), []))))
    step.check(got == [a] * 3, "C-core did not keep Envoy's session on %s: %s" % (a, got))

    lines = stage.channel(count=1)
    b = channel_backend(stage, lines[0])
    c2 = session_value(lines[0]["set_cookie"])
    step.row("tether::Channel (container)", "-", b, step.describe(c2))
    if not step.check(c2 is not None, "the channel's first call got no session cookie"):
        return step
    address2, _ = decode_grpc_cookie(c2)
    step.check(stage.in_network(address2), "the channel's cookie names %s" % address2)
    status, x, set_ = stage.envoy(cookie=c2)
    step.row("Envoy (browser, host)", "channel's cookie", x, step.describe(set_))
    step.check(status == 200 and x == b and set_ is None,
               "Envoy did not keep the channel's session on %s (%d, %s)" % (b, status, x))
    lines = stage.ccore(3, cookie=c2)
    got = [l["backend"] for l in lines]
    step.row("C-core (grpcio container)", "channel's cookie", tally(got), "-")
    step.check(got == [b] * 3, "C-core did not keep the channel's session on %s: %s" % (b, got))
    step.verdict = ("Envoy's cookie names %s (%s), a container address; its session stayed on %s "
                    "through the channel and C-core; the channel's stayed on %s through Envoy and C-core"
                    % (address, a, a, b))
    return step


# --- the mTLS variant's step ---------------------------------------------------

def fingerprint(pem):
    """What the backends answer in x-client-cert for the certificate `pem`
    (FNV-1a, 64 bits, of the first certificate's DER, in hex)."""
    body = pem.split("-----BEGIN CERTIFICATE-----", 1)[1].split("-----END CERTIFICATE-----", 1)[0]
    h = 0xcbf29ce484222325
    for b in base64.b64decode("".join(body.split())):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def mtls_on_every_hop(stage):
    step = Step("mTLS. every hop is mTLS (docker-compose.mtls.yml)", stage)
    # The scratch tether image has no shell: read the volume from the Python one.
    pem = "\n".join(stage.run("grpcio-client", "python3", "-c",
                              "import sys; sys.stdout.write(open('/certs/client.pem').read())"))
    want = fingerprint(pem)
    seen = []
    status, backend, _ = stage.envoy(client_cert=seen)
    step.row("Envoy (browser, host)", "-", backend, "the backend saw client cert %s" % seen[0])
    step.check(status == 200 and seen[0] == want,
               "through Envoy: %d from %s, client certificate %s, not the demo's %s"
               % (status, backend, seen[0], want))
    lines = stage.ccore(3)
    certs = sorted({str(l.get("client_cert")) for l in lines})
    step.row("C-core (grpcio container)", "-", tally([l["backend"] for l in lines]),
             "the backends saw client cert %s" % ", ".join(certs))
    step.check(certs == [want] and all(l.get("code", "OK") == "OK" for l in lines),
               "C-core with xDS credentials: %s, client certificates %s, not the demo's %s"
               % ([l.get("code") for l in lines], certs, want))
    lines = stage.channel(count=3)
    step.row("tether::Channel (container)", "-", tally([channel_backend(stage, l) for l in lines]),
             "mTLS (the backends accept nothing else)")
    step.check(all(l["code"] == "OK" for l in lines),
               "tether::Channel with xDS credentials: %s" % [l.get("message") for l in lines])
    # The same backend without TLS: refused.
    address = stage.addresses["backend-1"]
    rc, out, err = stage.run("channel-client", "tether", "call", "static:///" + address, METHOD,
                             "--timeout", "5", check=False)
    plain = json.loads(out[-1]) if out and out[-1].startswith("{") else {}
    step.row("tether call (plaintext)", "-", "backend-1 (%s): %s" % (address, plain.get("code", "exit %d" % rc)),
             (plain.get("message") or err.strip())[:60])
    # Exit 1: the call was made and failed (2 would be a usage error).
    step.check(rc == 1 and plain.get("code") == "UNAVAILABLE",
               "a plaintext call to %s: exit %d, %s" % (address, rc, plain or err.strip()[-200:]))
    stats = {}
    for line in stage.admin("/stats?filter=ssl%5C.handshake$").splitlines():
        key, _, value = line.partition(": ")
        stats[key] = int(value)
    backends = stats.get("cluster.%s.ssl.handshake" % CLUSTER, 0)
    control = stats.get("cluster.xds.ssl.handshake", 0)
    step.row("Envoy's counters", "-", "%d TLS handshake(s) with the backends, %d with tether-control"
             % (backends, control))
    step.check(backends > 0 and control > 0,
               "Envoy's TLS handshakes: %d with the backends, %d with tether-control" % (backends, control))
    step.verdict = ("the backends saw the demo's client certificate (%s) from Envoy and C-core and answered "
                    "the channel's mTLS calls; a plaintext call was refused; Envoy spoke TLS to the backends "
                    "and to tether-control" % want)
    return step


# --- step 2 ------------------------------------------------------------------

def request_hash(stage):
    step = Step("2. RequestHash on x-user", stage)
    users = ["user-%d" % i for i in range(1, USERS + 1)]
    ccore = [l["backend"] for l in stage.ccore(0, extra=["--keys-header", "x-user"],
                                               stdin="\n".join(users) + "\n")]
    same = 0
    used = set()
    for i, user in enumerate(users):
        status, e, _ = stage.envoy(user=user)
        c = channel_backend(stage, stage.channel("--metadata", "x-user:" + user)[0])
        g = ccore[i] if i < len(ccore) else "?"
        step.row("x-user: " + user, "-", "Envoy %s, channel %s, C-core %s" % (e, c, g))
        if status == 200 and e == c == g:
            same += 1
        used.add(e)
    step.check(same == USERS, "%d of %d users landed on different backends" % (USERS - same, USERS))
    step.verdict = ("%d/%d users on the same backend through Envoy, the channel and C-core "
                    "(%d backends used)" % (same, USERS, len(used)))
    return step


# --- step 3 ------------------------------------------------------------------

class Session(threading.Thread):
    """One client session calling continuously; records (time, ok, backend, new cookie, detail)."""

    def __init__(self, stage, kind, label, cookie=None, sent="-", calls=None, vhost="shop", bootstrap=None,
                 linger=None):
        super().__init__(daemon=True)
        self.vhost = vhost
        # A bootstrap of its own in the config folder (its own node ID), and
        # for the channel how long it keeps reporting load after its calls.
        self.bootstrap = bootstrap
        self.linger = linger
        self.stage = stage
        self.kind = kind
        self.label = label
        self.cookie = cookie
        self.sent = sent
        self.expected = calls or {"channel": CHANNEL_CALLS, "ccore": PEER_CALLS, "envoy": ENVOY_CALLS}[kind]
        self.answers = []
        self.error = None
        self.started = threading.Event()
        self.proc = None

    def record(self, ok, backend, new_cookie, detail=""):
        self.answers.append((time.monotonic(), ok, backend, new_cookie, detail))
        self.started.set()

    def run(self):
        try:
            if self.kind == "envoy":
                self.run_envoy()
            else:
                self.run_exec()
        except Exception as e:  # reported with the session, not raised in a thread
            self.error = "%s: %s" % (type(e).__name__, e)
        finally:
            self.started.set()

    def run_envoy(self):
        cookie = self.cookie
        for _ in range(self.expected):
            began = time.monotonic()
            try:
                status, backend, set_ = self.stage.envoy(
                    cookie=cookie, host=None if self.vhost == "shop" else self.vhost)
            except OSError as e:
                self.record(False, "", None, str(e))
                continue
            self.record(status == 200, backend, set_, "%d in %.0f ms" % (status, (time.monotonic() - began) * 1000))
            if set_:
                cookie = set_
            time.sleep(SLEEP_MS / 1000)

    def run_exec(self):
        if self.kind == "channel":
            args = ["tether", "call", "xds:///" + self.vhost, METHOD, "--jar", "--count", str(self.expected),
                    "--timeout", "20", "--data", encode_request("sleep:%d" % SLEEP_MS).decode(),
                    "--keepalive-time", str(KEEPALIVE_S), "--keepalive-timeout", str(KEEPALIVE_S)]
            if self.cookie:
                # Starts in the jar: a fresh cookie replaces it.
                args += ["--cookie", "%s=%s" % (COOKIE, self.cookie)]
            if self.bootstrap:
                args += ["--bootstrap", "/etc/tether/" + self.bootstrap]
            if self.linger:
                args += ["--linger", str(self.linger)]
            if os.environ.get("TETHER_STORY_LOG"):
                args.append("-vv")
            service = "channel-client"
        else:
            args = ["python3", "/opt/tether/peers/grpc_xds_client.py"] + CCORE_CREDS + ["--jar", "--keep-going",
                    "--keepalive", str(KEEPALIVE_S * 1000), str(KEEPALIVE_S * 1000),
                    "--message", "sleep:%d" % SLEEP_MS, "xds:///" + self.vhost, str(self.expected)]
            if self.cookie:
                args.append("%s=%s" % (COOKIE, self.cookie))
            service = "grpcio-client"
        cmd = self.stage.exec_args(service, *args)
        if self.kind == "ccore" and self.bootstrap:
            cmd[2:2] = ["-e", "GRPC_XDS_BOOTSTRAP=/etc/tether/" + self.bootstrap]
        if self.kind == "ccore" and os.environ.get("TETHER_STORY_LOG"):
            cmd[2:2] = ["-e", "GRPC_VERBOSITY=debug",
                        "-e", "GRPC_TRACE=subchannel,xds_override_host_lb,pick_first,round_robin"]
        # stderr to a file: a pipe read only at the end would fill and
        # block a client that logs much.
        errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
        for line in self.proc.stdout:
            if not line.strip():
                continue
            if os.environ.get("TETHER_STORY_LOG") and not line.startswith("{"):
                print("%s: %s" % (self.label, line.rstrip()), file=sys.stderr)
                continue
            l = json.loads(line)
            if self.kind == "channel":
                if "call" not in l:
                    continue
                self.record(l["code"] == "OK", channel_backend(self.stage, l),
                            session_value(l.get("set_cookie", [])), l.get("message", ""))
            else:
                self.record(l.get("code") == "OK", self.stage.label(l.get("backend", "")),
                            session_value(l.get("set_cookie", [])), l.get("message", ""))
        self.proc.wait()
        errors.seek(0)
        err = errors.read().strip()
        errors.close()
        if os.environ.get("TETHER_STORY_LOG"):
            print("---- %s (%s) ----\n%s" % (self.label, self.kind, err), file=sys.stderr)
        if self.proc.returncode not in (0, 1) or (not self.answers and err):
            self.error = "exit %s: %s" % (self.proc.returncode, err[-300:])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()


def judge(stage, s, target, stopped_at):
    """A session's record against the story: (whether it started on the
    stopped backend, what went wrong, where it moved, the longest gap between
    its answers around the stop, those gaps)."""
    failures = [a for a in s.answers if not a[1]]
    backends = [a[2] for a in s.answers if a[1]]
    on_target = bool(backends) and backends[0] == target
    problems = []
    if s.error:
        problems.append(s.error)
    if len(s.answers) != s.expected:
        problems.append("%d of %d calls made" % (len(s.answers), s.expected))
    if failures:
        problems.append("%d failed call(s): %s" % (len(failures), failures[0][4]))
    after = [a for a in s.answers if a[1] and a[0] > stopped_at]
    if not after:
        problems.append("no answer after the stop")
    moved_to = None
    if on_target:
        switch = next((i for i, b in enumerate(backends) if b != target), None)
        if switch is None:
            problems.append("never left %s" % target)
        else:
            moved_to = backends[switch]
            rest = backends[switch:]
            if any(b != moved_to for b in rest):
                problems.append("moved more than once: %s" % tally(rest))
            fresh = [a for a in s.answers if a[1]][switch][3]
            if not fresh or stage.name_at(decode_grpc_cookie(fresh)[0]) != moved_to:
                problems.append("moved to %s without a fresh cookie for it (%s)" % (moved_to, fresh))
    elif backends and any(b != backends[0] for b in backends):
        problems.append("not on %s, yet moved: %s" % (target, tally(backends)))
    # The longest wait for an answer around the stop: gaps between answers
    # (each gRPC call takes SLEEP_MS at the backend).
    times = [a[0] for a in s.answers]
    gaps = [t2 - t1 for t1, t2 in zip(times, times[1:]) if t2 > stopped_at - 1]
    worst = max(gaps) if gaps else 0.0
    if worst > STALL_S:
        problems.append("a call took %.1f s" % worst)
    return on_target, problems, moved_to, worst, gaps


def stop_mid_session(stage):
    step = Step("3. a backend container stops mid-session", stage)
    sessions = []
    try:
        channel = [Session(stage, "channel", "tether::Channel #%d" % (i + 1)) for i in range(CHANNEL_SESSIONS)]
        for s in channel:
            s.start()
            sessions.append(s)
        deadline = time.monotonic() + 30
        for s in channel:
            s.started.wait(max(0.1, deadline - time.monotonic()))
        firsts = [s for s in channel if s.answers and s.answers[0][1]]
        if len(firsts) < CHANNEL_SESSIONS:
            raise StoryError("channel sessions did not start: %s" % [s.error for s in channel if not s.answers])
        counts = {}
        for s in firsts:
            counts[s.answers[0][2]] = counts.get(s.answers[0][2], 0) + 1
        target = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        on = [s for s in firsts if s.answers[0][2] == target]
        off = [s for s in firsts if s.answers[0][2] != target]
        # Envoy and C-core continue the channel's sessions: two of those on
        # the backend about to stop, one elsewhere.
        seeds = [on[0], on[-1]] + off[:1]
        if any(not seed.answers[0][3] for seed in seeds):
            raise StoryError("a channel session's first call got no session cookie")
        others = []
        for i, seed in enumerate(seeds):
            sent = "cookie of channel %s" % seed.label.rsplit(" ", 1)[1]
            for kind, label in (("envoy", "Envoy"), ("ccore", "C-core")):
                others.append(Session(stage, kind, "%s #%d" % (label, i + 1),
                                      cookie=seed.answers[0][3], sent=sent))
        for s in others:
            s.start()
            sessions.append(s)
        # Everyone calling, each with at least three answers.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(len(s.answers) < 3 and s.is_alive() for s in others):
            time.sleep(0.05)
        container = stage.containers[target]
        stopped_at = time.monotonic()
        subprocess.run(["docker", "stop", "-t", "15", container], check=True, capture_output=True, timeout=60)
        stop_took = time.monotonic() - stopped_at
        step.row("docker stop", "-", "%s (%s) stopped in %.1f s" % (target, stage.addresses[target], stop_took))
        for s in sessions:
            s.join(timeout=max(1.0, 90 - (time.monotonic() - stopped_at)))
        drain = [l for l in subprocess.run(["docker", "logs", container], capture_output=True,
                                           text=True, timeout=30).stderr.splitlines()
                 if "drained" in l or "still open" in l]
        if drain:
            step.row(target, "-", drain[-1].split("] ", 1)[-1])
    finally:
        for s in sessions:
            s.stop()

    moved = stayed = on_total = off_total = 0
    worst = {}
    all_gaps = {}
    for s in sessions:
        on_target, problems, moved_to, w, gaps = judge(stage, s, target, stopped_at)
        kind = {"channel": "tether::Channel", "envoy": "Envoy", "ccore": "C-core"}[s.kind]
        worst[kind] = max(worst.get(kind, 0.0), w)
        all_gaps.setdefault(kind, []).extend(gaps)
        ok_calls = sum(1 for a in s.answers if a[1])
        if on_target:
            on_total += 1
            moved += not problems
            what = "%s → %s" % (target, moved_to or "?")
        else:
            off_total += 1
            stayed += not problems
            what = s.answers[0][2] if s.answers else "-"
        step.row(s.label, s.sent, "%s, %d/%d OK" % (what, ok_calls, len(s.answers)),
                 "; ".join(problems) if problems else ("fresh cookie" if on_target else "-"))
        for p in problems:
            step.failures.append("%s: %s" % (s.label, p))
    kinds_on = {s.kind for s in sessions if s.answers and s.answers[0][2] == target}
    step.check(kinds_on == {"channel", "envoy", "ccore"},
               "not every client had a session on %s: %s" % (target, sorted(kinds_on)))
    failed = sum(1 for s in sessions for a in s.answers if not a[1])
    calls = sum(len(s.answers) for s in sessions)
    latency = "; ".join("%s %.0f ms (median %.0f ms)" % (k, worst[k] * 1000, statistics.median(all_gaps[k]) * 1000)
                        for k in sorted(worst) if all_gaps.get(k))

    # The container is gone now, its address DRAINING for a while: a browser
    # coming back with an old cookie for it, and new browsers.
    old_cookie = on[0].answers[0][3]
    probes = []
    for _ in range(3):
        began = time.monotonic()
        status, backend, set_ = stage.envoy(cookie=old_cookie)
        probes.append((time.monotonic() - began, status, backend, set_))
    step.row("Envoy (browser) ×3", "cookie for %s" % target, "%s; %s" % (
        tally([p[2] for p in probes]), ", ".join("%d in %.2f s" % (p[1], p[0]) for p in probes)),
        "fresh cookie" if all(p[3] for p in probes) else "-")
    for took, status, backend, set_ in probes:
        step.check(status == 200 and backend != target and set_
                   and stage.name_at(decode_grpc_cookie(set_)[0]) == backend and took < STALL_S,
                   "Envoy with a cookie for the stopped %s: %d from %s in %.1f s, cookie %s"
                   % (target, status, backend, took, set_))
    fresh = []
    for _ in range(6):
        began = time.monotonic()
        status, backend, _ = stage.envoy()
        fresh.append((time.monotonic() - began, status, backend))
    step.row("Envoy (browser) ×6", "-", "%s; slowest %.0f ms" % (
        tally([f[2] for f in fresh]), max(f[0] for f in fresh) * 1000), "new sessions")
    step.check(all(f[1] == 200 and f[2] != target for f in fresh),
               "new sessions through Envoy: %s" % fresh)
    stats = stage.envoy_stats(("upstream_cx_connect_fail", "upstream_cx_connect_timeout",
                               "upstream_rq_retry", "upstream_rq_retry_success",
                               "outlier_detection.ejections_enforced_total"))
    step.row("Envoy's counters", "-", "%d failed connects (%d timed out), %d retries (%d OK), %d ejection(s)"
             % tuple(stats.values()))

    # No operator follow-up: the stopped replica left Docker's DNS, so
    # tether-control serves its address DRAINING for drainOnRemoval, then
    # removes it (its log says both).
    gone = stage.addresses[target]
    ip = gone.rsplit(":", 1)[0]
    deadline = time.monotonic() + DNS_DRAIN_S + 15
    envoy_left = channel_left = False
    while time.monotonic() < deadline and not (envoy_left and channel_left):
        envoy_left = envoy_left or gone not in stage.envoy_hosts()
        channel_left = channel_left or gone not in stage.channel_endpoints()
        time.sleep(0.2)
    control_log = subprocess.run(["docker", "logs", stage.containers["tether-control"]], capture_output=True,
                                 text=True, timeout=30).stderr
    drained = "%s left the answer: DRAINING" % ip in control_log
    removed = "%s removed" % ip in control_log
    step.row("tether-control", "-", "%s left the answer of `backend`: %s, %s" % (
        target, "DRAINING" if drained else "NOT DRAINED", "removed" if removed else "NOT REMOVED"),
        "Envoy: %s; channel: %s" % ("gone" if envoy_left else "STILL LISTED",
                                    "gone" if channel_left else "STILL LISTED"))
    step.check(drained and removed, "tether-control's log does not say %s drained and was removed" % ip)
    step.check(envoy_left and channel_left, "%s still listed %.0f s after it left DNS" % (target, DNS_DRAIN_S + 15))
    step.verdict = ("%d/%d sessions on %s moved once with a fresh cookie, %d/%d others stayed, "
                    "%d failed of %d calls; the longest gap between a session's answers around the stop: %s"
                    % (moved, on_total, target, stayed, off_total, failed, calls, latency))
    return step


def render(steps):
    head = ("client", "cookie sent", "answered by", "Set-Cookie received")
    rows = [r for s in steps for r in s.rows]
    width = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, width)).rstrip()
    out = [line(head), "-+-".join("-" * w for w in width)]
    for s in steps:
        out.append(s.title)
        out.extend(line(r) for r in s.rows)
        out.append("=> %s %s" % ("PASS" if s.ok else "FAIL", s.verdict if s.ok else "; ".join(s.failures)))
        out.append("")
    return "\n".join(out)


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    config_dir, net, http_port, admin_port = sys.argv[1:5]
    containers = dict(a.split("=", 1) for a in sys.argv[5:])
    stage = Stage(config_dir, net, int(http_port), int(admin_port), containers)
    steps = []
    plays = [one_session_three_clients, request_hash, stop_mid_session]
    if MTLS:
        plays.insert(1, mtls_on_every_hop)
    for play in plays:
        began = time.monotonic()
        try:
            step = play(stage)
        except (StoryError, OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
            step = Step(play.__name__.replace("_", " "), stage)
            step.failures.append("%s: %s" % (type(e).__name__, e))
        step.title += " (%.1f s)" % (time.monotonic() - began)
        steps.append(step)
        if play is one_session_three_clients and not step.ok:
            break
    print(render(steps))
    passed = sum(s.ok for s in steps)
    print("%d of %d steps passed" % (passed, len(plays)))
    sys.exit(0 if passed == len(plays) else 1)


if __name__ == "__main__":
    main()
