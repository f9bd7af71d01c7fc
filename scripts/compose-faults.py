#!/usr/bin/env python3
"""Faults across the containers of envoy-configs/docker-compose.yml.

scripts/compose-test.sh runs this after the story (scripts/compose-story.py),
on the same running project. Each case starts sessions of all three clients
(tether::Channel with its cookie jar in the channel-client container, gRPC
C-core with a jar in the grpcio-client container, and a browser-like client
through Envoy with the tether plugin), breaks something while they call,
repairs it, and judges every session: calls made, calls failed, sessions
moved, the longest wait for an answer.

1. The control plane killed (SIGKILL) and started again with the same file:
   no call fails and no session moves; the clients keep what they had (gRFC
   A57: cached resources stay in use while the server is away) and take
   the restarted server's resources again.
2. The control plane cut off (`docker network disconnect`: no RST, its
   packets dropped) for longer than the does-not-exist timer (15 s), then
   reconnected at the same address: no call fails and no session moves.
3. A backend cut off (`docker network disconnect`) mid-session, with
   sessions of every client on it and elsewhere: HTTP/2 keepalive (1 s +
   1 s, every client) leaves it; its sessions move once, with a fresh
   cookie, other sessions stay; the one call each of its sessions had in
   flight may fail (UNAVAILABLE, as gRPC says: it was sent), nothing hangs.
4. A rolling restart: each replica in turn DRAINING in the file (its
   address listed above the backends' name; sessions
   stay, new ones go elsewhere), stopped (SIGTERM: GOAWAY, its calls finish),
   started and HEALTHY again: every session on a restarted backend moves
   once with a fresh cookie, no other moves, no call fails.
5. Backends that end every connection once it is 300 ms old (gRPC's
   max_connection_age: GOAWAY, the calls on it finish, then the close), two
   more containers behind their own virtual host, under steady load: no call
   fails and no session moves.
6. The backend service scaled down to two replicas and up to three again
   (`docker-compose up --scale`), with a session of every client on every
   replica: the removed replica's sessions move once, after it stops (its
   address leaves Docker's DNS, drains, goes), with a fresh cookie and no
   failed call; the others stay; new sessions of every client land on the
   new replica too.

7. Drain readiness: sessions of the three clients (each with a node ID of
   its own) pinned to one replica behind a virtual host whose service
   reports load every second and removes idle DRAINING endpoints after 2 s;
   the replica set DRAINING in the file: tether-control's /drain says busy
   and names every client; the sessions stop; it says idle within two
   report intervals; the replica leaves EDS (and Envoy) only 2 s after; no
   call fails and no session moves while in use.

Cases 3, 4, 6 and 7 first bring back the replica the story stopped: three
replicas running, each HEALTHY everywhere.

Every case is bounded (CASE_LIMIT) and repairs what it broke, also when it
fails.

Usage: compose-faults.py CONFIG_DIR NET HTTP_PORT ADMIN_PORT SERVICE=CONTAINER...
TETHER_FAULTS=3,4 runs only those cases.
Prints a table with a verdict per case; exits 1 when a case fails.
"""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time

_spec = importlib.util.spec_from_file_location(
    "compose_story", os.path.join(os.path.dirname(os.path.abspath(__file__)), "compose-story.py"))
story = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(story)

# A case's sessions, per client.
SESSIONS = {"channel": 3, "ccore": 2, "envoy": 2}
# How long a case may take in all.
CASE_LIMIT = 60.0
# gRPC's does-not-exist timer: a resource not seen this long after it was
# asked for is taken as absent (A57); the cut lasts longer.
DOES_NOT_EXIST_S = 15.0
# The longest wait for an answer that is not a stall (each gRPC call takes
# story.SLEEP_MS at the backend).
STALL_S = story.STALL_S


def docker(*args, timeout=60):
    out = subprocess.run(["docker"] + list(args), capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise story.StoryError("docker %s failed: %s" % (" ".join(args[:2]), out.stderr.strip()[-300:]))
    return out.stdout.strip()


def start_sessions(stage, seconds):
    """Sessions of every client calling for about `seconds`, each started
    with at least three answers."""
    # A gRPC call takes SLEEP_MS at the backend and a few ms more; Envoy's
    # client also sleeps SLEEP_MS between calls.
    per_call = story.SLEEP_MS / 1000 + 0.01
    counts = {"channel": int(seconds / per_call), "ccore": int(seconds / per_call),
              "envoy": int(seconds / (2 * per_call))}
    labels = {"channel": "tether::Channel", "ccore": "C-core", "envoy": "Envoy"}
    sessions = []
    for kind, n in SESSIONS.items():
        for i in range(n):
            s = story.Session(stage, kind, "%s #%d" % (labels[kind], i + 1), calls=counts[kind])
            s.start()
            sessions.append(s)
    await_started(sessions)
    return sessions


def await_started(sessions):
    """Waits until every session has three answers (30 s at most); stops
    them all and raises when one has not."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(len(s.answers) < 3 and s.is_alive() for s in sessions):
        time.sleep(0.05)
    slow = [s.label for s in sessions if len(s.answers) < 3]
    if slow:
        for s in sessions:
            s.stop()
        raise story.StoryError("sessions did not start: %s (%s)" % (
            slow, [s.error for s in sessions if s.error]))


def conclude(step, sessions):
    """Judges sessions that must neither fail nor move."""
    judge_moves(step, step.stage, sessions, [], False, STALL_S)
    return step


def wait_all(sessions, until):
    for s in sessions:
        s.join(timeout=max(0.1, until - time.monotonic()))
    for s in sessions:
        s.stop()


def control_serves(stage, timeout):
    """Whether a fresh XdsClient in the channel container gets the shop
    listener's resources from the control plane within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            doc = json.loads("\n".join(stage.run(
                "channel-client", "tether", "xds", "dump", "--listener", "shop", "--timeout", "5",
                timeout=15)))
            if any(e.get("resource") for e in doc.get("endpoints", [])):
                return True
        except (story.StoryError, ValueError):
            pass
        time.sleep(0.5)
    return False


def control_plane_restarted(stage):
    step = story.Step("1. the control plane killed and started again", stage)
    began = time.monotonic()
    container = stage.containers["tether-control"]
    sessions = []
    try:
        sessions = start_sessions(stage, 10)
        docker("kill", container)
        killed = time.monotonic()
        time.sleep(2)
        docker("start", container)
        back = control_serves(stage, 20)
        step.row("docker kill; start", "-", "tether-control away for %.1f s" % (time.monotonic() - killed),
                 "serves again" if back else "NOT SERVING")
        step.check(back, "tether-control did not serve again within 20 s of its start")
        wait_all(sessions, began + CASE_LIMIT)
    finally:
        for s in sessions:
            s.stop()
        # Whatever happened, the control plane runs when the case ends.
        subprocess.run(["docker", "start", container], capture_output=True, timeout=60)
    return conclude(step, sessions)


def disconnect(container):
    """Cuts `container` off its network (no RST: its packets are dropped);
    returns the command that connects it again at the same address and under
    the same names (the service names the others dial are network aliases)."""
    networks = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", container))
    (network, settings), = networks.items()
    reconnect = ["network", "connect", "--ip", settings["IPAddress"]]
    for alias in settings.get("Aliases") or []:
        reconnect += ["--alias", alias]
    reconnect += [network, container]
    docker("network", "disconnect", network, container)
    return reconnect


def control_plane_cut_off(stage):
    step = story.Step("2. the control plane cut off for longer than the does-not-exist timer", stage)
    began = time.monotonic()
    container = stage.containers["tether-control"]
    cut = DOES_NOT_EXIST_S + 2
    sessions = []
    reconnect = None
    try:
        sessions = start_sessions(stage, cut + 8)
        reconnect = disconnect(container)
        time.sleep(cut)
        docker(*reconnect)
        reconnect = None
        back = control_serves(stage, 15)
        step.row("docker network disconnect", "-", "tether-control (%s) cut off for %.0f s"
                 % (stage.net + ".10", cut), "serves again" if back else "NOT SERVING")
        step.check(back, "tether-control did not serve again within 15 s of reconnecting")
        wait_all(sessions, began + CASE_LIMIT)
    finally:
        for s in sessions:
            s.stop()
        if reconnect:
            subprocess.run(["docker"] + reconnect, capture_output=True, timeout=60)
    return conclude(step, sessions)


def original_config(stage):
    """tether-control's file as compose-test.sh first wrote it (the story
    drains and removes a backend)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "envoy-configs", "compose", "tether.yaml")) as f:
        return f.read().replace("10.203.117.", stage.net + ".")


def write_config(stage, text):
    path = os.path.join(stage.config_dir, "tether.yaml")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def drain_replica(text, address):
    """The file with one replica's address listed above the backends' name
    with `health: DRAINING`: the first entry to give an address wins."""
    line = "      - address: backend:8080"
    return text.replace(line, "      - address: %s\n        health: DRAINING\n%s" % (address, line))


def compose(*args, timeout=120):
    """docker-compose on the running project (scripts/compose-test.sh's)."""
    cmd = shlex.split(os.environ["TETHER_COMPOSE"]) + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise story.StoryError("%s failed: %s" % (" ".join(args), out.stderr.strip()[-300:]))
    return out.stdout


def views(stage):
    """The shop service's endpoints with their health, as the channel's
    XdsClient and as Envoy's session cluster see them: two dicts of
    address -> DRAINING or HEALTHY."""
    doc = json.loads("\n".join(stage.run(
        "channel-client", "tether", "xds", "dump", "--listener", "shop", "--timeout", "10")))
    channel = {}
    for e in doc.get("endpoints", []):
        if e.get("name") == "shop" and e.get("resource"):
            for p in e["resource"]["priorities"]:
                for loc in p["localities"]:
                    for ep in loc["endpoints"]:
                        for a in ep["addresses"]:
                            channel[a] = ep.get("health", "HEALTHY")
    envoy = {}
    for line in stage.admin("/clusters").splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[0] == story.CLUSTER and parts[2] == "health_flags":
            envoy[parts[1]] = "DRAINING" if "draining" in parts[3].lower() else "HEALTHY"
    return channel, envoy


def await_views(stage, want, timeout=20):
    """Waits until the channel and Envoy both see exactly `want` (address ->
    health); whether they did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(v == want for v in views(stage)):
                return True
        except (story.StoryError, OSError, ValueError):
            pass
        time.sleep(0.2)
    return False


def restore_backends(stage):
    """Three backend replicas running, the file as it was, and exactly their
    addresses HEALTHY everywhere (an address a replica had before drains
    for DNS_DRAIN_S, then goes). Returns the replicas' labels."""
    compose("up", "-d", "--no-build", "--no-recreate", "--scale", "backend=3", "backend")
    write_config(stage, original_config(stage))
    running = stage.refresh_backends()
    if len(running) != 3:
        raise story.StoryError("not three backend replicas running: %s" % running)
    want = {stage.addresses[b]: "HEALTHY" for b in running}
    if not await_views(stage, want, timeout=20 + story.DNS_DRAIN_S):
        raise story.StoryError("the three replicas were not back everywhere within %d s: %s"
                               % (20 + story.DNS_DRAIN_S, views(stage)))
    return running


def seeded_sessions(stage, seconds):
    """Channel sessions, then C-core and Envoy sessions continuing two of
    the channel's: one on the backend most channel sessions are on (the
    target) and one elsewhere. Returns (sessions, target backend)."""
    per_call = story.SLEEP_MS / 1000 + 0.01
    channel = [story.Session(stage, "channel", "tether::Channel #%d" % (i + 1), calls=int(seconds / per_call))
               for i in range(SESSIONS["channel"])]
    for s in channel:
        s.start()
    deadline = time.monotonic() + 30
    for s in channel:
        s.started.wait(max(0.1, deadline - time.monotonic()))
    firsts = [s for s in channel if s.answers and s.answers[0][1] and s.answers[0][3]]
    if len(firsts) < len(channel):
        for s in channel:
            s.stop()
        raise story.StoryError("channel sessions did not start: %s" % [s.error for s in channel])
    counts = {}
    for s in firsts:
        counts[s.answers[0][2]] = counts.get(s.answers[0][2], 0) + 1
    target = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    seeds = [s for s in firsts if s.answers[0][2] == target][:1] + \
        [s for s in firsts if s.answers[0][2] != target][:1]
    sessions = list(channel)
    for i, seed in enumerate(seeds):
        sent = "cookie of channel %s" % seed.label.rsplit(" ", 1)[1]
        for kind, label, calls in (("ccore", "C-core", int(seconds / per_call)),
                                   ("envoy", "Envoy", int(seconds / (2 * per_call)))):
            s = story.Session(stage, kind, "%s #%d" % (label, i + 1), cookie=seed.answers[0][3],
                              sent=sent, calls=calls)
            s.start()
            sessions.append(s)
    await_started(sessions)
    return sessions, target


def judge_moves(step, stage, sessions, events, failures_allowed, stall):
    """Judges sessions against `events`: (backend, from, to) windows in which
    that backend went away. A session moves only off a backend that is away,
    once per window, with a fresh cookie for its new backend, and has left
    by the window's end; calls fail only where `failures_allowed` (if true,
    on a session whose backend went away, up to two calls ending within
    KEEPALIVE_BOUND_S of it: those in flight on the dead connection); no
    wait for an answer is longer than `stall` s. Returns (calls, failed,
    moves)."""
    calls = failed = moves = 0
    worst = 0.0
    for s in sessions:
        problems = []
        if s.error:
            problems.append(s.error)
        if len(s.answers) != s.expected:
            problems.append("%d of %d calls made" % (len(s.answers), s.expected))
        ok = [a for a in s.answers if a[1]]
        path = [ok[0][2]] if ok else []
        for t, _, backend, cookie, _ in ok[1:]:
            if backend == path[-1]:
                continue
            windows = [e for e in events if e[0] == path[-1] and e[1] <= t <= e[2] + stall]
            if not windows:
                problems.append("moved %s -> %s while %s was up" % (path[-1], backend, path[-1]))
            elif not cookie or stage.name_at(story.decode_grpc_cookie(cookie)[0]) != backend:
                problems.append("moved to %s without a fresh cookie for it (%s)" % (backend, cookie))
            if any(e[0] == backend and e[1] <= t <= e[2] for e in events):
                problems.append("moved to %s while it was away" % backend)
            path.append(backend)
        moves += len(path) - 1
        for name, began, ended in events:
            on = [a for a in ok if a[0] < began]
            if on and on[-1][2] == name:
                after = [a for a in ok if a[0] > ended]
                if after and after[0][2] == name:
                    problems.append("still on %s after it went away" % name)
        bad = [a for a in s.answers if not a[1]]
        excused = []
        if failures_allowed:
            # Calls in flight on the dead connection: those ending before
            # keepalive could have found it dead, a margin more (C-core can
            # start a second call on a socket that already failed).
            for name, began, ended in events:
                before = [a for a in ok if a[0] < began]
                if before and before[-1][2] == name:
                    excused += [a for a in bad if began <= a[0] <= began + KEEPALIVE_BOUND_S][:2]
        unexcused = [a for a in bad if a not in excused]
        if unexcused:
            problems.append("%d failed call(s): %s" % (len(unexcused), unexcused[0][4]))
        times = [a[0] for a in s.answers]
        gaps = [t2 - t1 for t1, t2 in zip(times, times[1:])]
        gap = max(gaps) if gaps else 0.0
        worst = max(worst, gap)
        if gap > stall:
            problems.append("a call took %.1f s" % gap)
        calls += len(s.answers)
        failed += len(bad)
        step.row(s.label, s.sent, "%s, %d/%d OK, longest wait %.0f ms" % (
            " -> ".join(path) or "-", len(ok), len(s.answers), gap * 1000),
            "; ".join(problems) if problems else
            ("%d failed in flight" % len(bad) if bad else ("moved" if len(path) > 1 else "stayed")))
        for p in problems:
            step.failures.append("%s: %s" % (s.label, p))
    step.verdict = ("%d calls, %d failed, %d session moves in %d sessions; the longest wait for an answer %.0f ms"
                    % (calls, failed, moves, len(sessions), worst * 1000))
    return calls, failed, moves


# A backend cut off is found dead within keepalive time + timeout (1 s +
# 1 s for every client: envoy-configs/compose/tether.yaml for Envoy,
# Session's flags for the channel and C-core), plus a margin.
KEEPALIVE_BOUND_S = 2 * story.KEEPALIVE_S + 1.5
# A session's next call then waits for a connection attempt to the
# vanished address to fail: with keepalive on, TCP_USER_TIMEOUT (the
# keepalive timeout) ends it at the first SYN retransmission (1 s) for the
# channel and C-core; Envoy's connect_timeout is 1 s.
CUT_STALL_S = 5.0


def backend_cut_off(stage):
    step = story.Step("3. a backend cut off mid-session (no RST: its packets dropped)", stage)
    began = time.monotonic()
    sessions = []
    reconnect = None
    restore_backends(stage)
    try:
        sessions, target = seeded_sessions(stage, 16)
        on = [s for s in sessions if s.answers[0][2] == target]
        step.check({s.kind for s in on} == {"channel", "ccore", "envoy"},
                   "not every client had a session on %s: %s" % (target, [s.label for s in on]))
        container = stage.containers[target]
        cut_at = time.monotonic()
        reconnect = disconnect(container)
        # Cut off until every session on it has moved (or a bound).
        deadline = cut_at + 2 * CUT_STALL_S
        while time.monotonic() < deadline and any(
                s.is_alive() and not any(a[1] and a[2] != target and a[0] > cut_at for a in s.answers)
                for s in on):
            time.sleep(0.1)
        left = time.monotonic()
        step.row("docker network disconnect", "-", "%s (%s) cut off; its sessions left within %.1f s"
                 % (target, stage.addresses[target], left - cut_at))
        docker(*reconnect)
        reconnect = None
        back_at = time.monotonic()
        wait_all(sessions, began + CASE_LIMIT)
    finally:
        for s in sessions:
            s.stop()
        if reconnect:
            subprocess.run(["docker"] + reconnect, capture_output=True, timeout=60)
    judge_moves(step, stage, sessions, [(target, cut_at, back_at)], True, CUT_STALL_S)
    return step


def rolling_restart(stage):
    step = story.Step("4. a rolling restart: each replica DRAINING, stopped (GOAWAY), started, HEALTHY", stage)
    began = time.monotonic()
    sessions = []
    events = []
    replicas = restore_backends(stage)
    text = original_config(stage)
    try:
        sessions = start_sessions(stage, 30)
        for name in replicas:
            address = stage.addresses[name]
            healthy = {stage.addresses[b]: "HEALTHY" for b in replicas}
            t0 = time.monotonic()
            write_config(stage, drain_replica(text, address))
            step.check(await_views(stage, dict(healthy, **{address: "DRAINING"})),
                       "%s was not DRAINING everywhere within 20 s" % name)
            t1 = time.monotonic()
            docker("stop", "-t", "15", stage.containers[name])
            t2 = time.monotonic()
            docker("start", stage.containers[name])
            write_config(stage, text)
            # Docker may give the started replica another address; the one
            # it had drains out of the name's answer meanwhile.
            stage.refresh_backends()
            healthy = {stage.addresses[b]: "HEALTHY" for b in replicas}
            step.check(await_views(stage, healthy, timeout=20 + story.DNS_DRAIN_S),
                       "%s was not HEALTHY again within %d s" % (name, 20 + story.DNS_DRAIN_S))
            t3 = time.monotonic()
            events.append((name, t0, t3))
            moved = "" if stage.addresses[name] == address else ", now at %s" % stage.addresses[name]
            step.row(name, "-", "DRAINING seen in %.1f s, stopped in %.1f s, HEALTHY again %.1f s later%s"
                     % (t1 - t0, t2 - t1, t3 - t2, moved))
        wait_all(sessions, began + CASE_LIMIT)
    finally:
        for s in sessions:
            s.stop()
        write_config(stage, text)
        for name in replicas:
            subprocess.run(["docker", "start", stage.containers[name]], capture_output=True, timeout=60)
    judge_moves(step, stage, sessions, events, False, STALL_S)
    return step


ROTATING_VHOST = """  - name: rotating                   # compose-faults.py, case 5
    domains: ["rotating"]
    routes:
      - services: [{ name: rotating }]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: { name: global-session-cookie, path: /, ttl: 600s }
            format: grpc
"""
ROTATING_SERVICE = """  - name: rotating
    protocol: h2c
    endpoints:
%s"""
MAX_AGE_S = 0.3


def rotating_backends(stage):
    step = story.Step("5. backends ending every connection after %d ms, under load" % (MAX_AGE_S * 1000),
                      stage)
    began = time.monotonic()
    template = stage.containers["backend-1"]
    image = docker("inspect", "-f", "{{.Config.Image}}", template)
    networks = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", template))
    network = next(iter(networks))
    addresses = ["%s.%d" % (stage.net, 14 + i) for i in range(2)]
    names = ["rotating-%d" % (i + 1) for i in range(2)]
    # Rows name the channel's peers as the other clients do.
    stage.backends.update({a + ":8080": n for a, n in zip(addresses, names)})
    path = os.path.join(stage.config_dir, "tether.yaml")
    with open(path) as f:
        original = f.read()
    started = []
    sessions = []
    try:
        for name, address in zip(names, addresses):
            started.append(docker(
                "run", "-d", "--rm", "--network", network, "--ip", address,
                "-e", "RUST_LOG=info,tether_testkit::grpc=debug", image,
                "tether-demo-backend", "--name", name, "--listen", address + ":8080",
                "--max-connection-age", str(MAX_AGE_S)))
        endpoints = "".join("      - address: %s:8080\n" % a for a in addresses)
        text = original.replace("virtualhosts:\n", "virtualhosts:\n" + ROTATING_VHOST, 1)
        text = text.rstrip("\n") + "\n" + ROTATING_SERVICE % endpoints
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        # Served everywhere: Envoy routes the virtual host, a fresh XdsClient
        # gets its listener.
        deadline = time.monotonic() + 20
        ready = False
        while time.monotonic() < deadline and not ready:
            try:
                status, backend, _ = stage.envoy(host="rotating")
                ready = status == 200 and backend in names and stage.run(
                    "channel-client", "tether", "call", "xds:///rotating", story.METHOD,
                    "--timeout", "5", timeout=15)
            except (story.StoryError, OSError):
                pass
            if not ready:
                time.sleep(0.2)
        if not ready:
            raise story.StoryError("the rotating virtual host was not served within 20 s")
        sessions = []
        labels = {"channel": "tether::Channel", "ccore": "C-core", "envoy": "Envoy"}
        per_call = story.SLEEP_MS / 1000 + 0.01
        for kind, n in SESSIONS.items():
            calls = int(8 / per_call) if kind != "envoy" else int(8 / (2 * per_call))
            for i in range(n):
                s = story.Session(stage, kind, "%s #%d" % (labels[kind], i + 1), calls=calls,
                                  vhost="rotating")
                s.start()
                sessions.append(s)
        wait_all(sessions, began + CASE_LIMIT)
        goaways = 0
        for container in started:
            logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True,
                                  timeout=30).stderr
            goaways += logs.count("reached its max age: GOAWAY")
        step.row("2 backends", "-", "max_connection_age %d ms: %d GOAWAYs sent meanwhile"
                 % (MAX_AGE_S * 1000, goaways))
        step.check(goaways >= 10, "only %d GOAWAYs were sent" % goaways)
    finally:
        for s in sessions:
            s.stop()
        write_config(stage, original)
        for container in started:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)
    return conclude(step, sessions)


def mint_cookies(stage, replicas):
    """A session cookie for each replica: fresh requests through Envoy until
    each has answered one (Envoy spreads new sessions over them)."""
    cookies = {}
    for _ in range(30 * len(replicas)):
        status, backend, cookie = stage.envoy()
        if status == 200 and cookie and backend in replicas:
            cookies.setdefault(backend, cookie)
        if len(cookies) == len(replicas):
            return cookies
    raise story.StoryError("no session cookie through Envoy for %s"
                           % sorted(set(replicas) - set(cookies)))


def fresh_picks(stage, calls):
    """Where new sessions land: `calls` calls without a cookie from each
    client; {client: [backend, ...]}."""
    envoy = [stage.envoy()[1] for _ in range(calls)]
    channel = [story.channel_backend(stage, l) for l in stage.channel(count=calls)]
    ccore = [l["backend"] for l in stage.ccore(calls)]
    return {"Envoy": envoy, "tether::Channel": channel, "C-core": ccore}


def scaled_down_and_up(stage):
    step = story.Step("6. the backends scaled down to two, then up to three (docker-compose up --scale)", stage)
    began = time.monotonic()
    sessions = []
    events = []
    gone = None
    replicas = restore_backends(stage)
    try:
        cookies = mint_cookies(stage, replicas)
        per_call = story.SLEEP_MS / 1000 + 0.01
        seconds = 20
        for name in replicas:
            for kind, label, calls in (("channel", "tether::Channel", int(seconds / per_call)),
                                       ("ccore", "C-core", int(seconds / per_call)),
                                       ("envoy", "Envoy", int(seconds / (2 * per_call)))):
                s = story.Session(stage, kind, "%s on %s" % (label, name), cookie=cookies[name],
                                  sent="cookie for %s" % name, calls=calls)
                s.start()
                sessions.append(s)
        await_started(sessions)
        t0 = time.monotonic()
        compose("up", "-d", "--no-build", "--no-recreate", "--scale", "backend=2", "backend")
        t1 = time.monotonic()
        left = [b for b in replicas if b not in stage.refresh_backends()]
        if len(left) != 1:
            raise story.StoryError("scaling to two left %s running of %s" % (stage.refresh_backends(), replicas))
        gone = left[0]
        address = stage.addresses.get(gone) or next(a for a, n in stage.backends.items() if n == gone)
        remaining = {stage.addresses[b]: "HEALTHY" for b in replicas if b != gone}
        step.check(await_views(stage, remaining, timeout=story.DNS_DRAIN_S + 15),
                   "%s was still served %d s after it stopped: %s" % (gone, story.DNS_DRAIN_S + 15, views(stage)))
        t2 = time.monotonic()
        events.append((gone, t0, t2))
        step.row("up --scale backend=2", "-", "%s (%s) stopped and removed in %.1f s; gone from Envoy and the "
                 "channel %.1f s later (DNS, then drainOnRemoval)" % (gone, address, t1 - t0, t2 - t1))
        compose("up", "-d", "--no-build", "--no-recreate", "--scale", "backend=3", "backend")
        running = stage.refresh_backends()
        new = [b for b in running if b not in replicas]
        if len(new) != 1 or len(running) != 3:
            raise story.StoryError("scaling to three gave %s (before: %s)" % (running, replicas))
        step.check(await_views(stage, {stage.addresses[b]: "HEALTHY" for b in running}),
                   "the new replica %s was not served within 20 s: %s" % (new[0], views(stage)))
        t3 = time.monotonic()
        step.row("up --scale backend=3", "-", "%s (%s) started and served in %.1f s"
                 % (new[0], stage.addresses[new[0]], t3 - t2))
        wait_all(sessions, began + CASE_LIMIT)
        for client, got in fresh_picks(stage, 12).items():
            step.row("%s, new sessions" % client, "-", story.tally(got), "-")
            step.check(new[0] in got and gone not in got,
                       "%s's new sessions: %s (the new replica is %s, %s is gone)"
                       % (client, story.tally(got), new[0], gone))
    finally:
        for s in sessions:
            s.stop()
    judge_moves(step, stage, sessions, events, False, STALL_S)
    on_gone = [s for s in sessions if gone and s.sent == "cookie for %s" % gone]
    step.check(on_gone and all(len({a[2] for a in s.answers if a[1]}) == 2 for s in on_gone),
               "not every session of the removed replica moved: %s" % [s.label for s in on_gone])
    return step


DRAIN_VHOST = """  - name: draining                   # compose-faults.py, case 7
    domains: ["draining"]
    routes:
      - services: [{ name: drain-demo }]
        loadBalancerPolicy:
          strategy: Session
          session:
            cookie: { name: global-session-cookie, path: /, ttl: 600s }
            format: grpc
            overrideHostStatus: [UNKNOWN, HEALTHY, DRAINING]
"""
DRAIN_SERVICE = """  - name: drain-demo
    protocol: h2c
    keepalive: { interval: 1s, timeout: 1s }
    loadReporting: { interval: 1s }
    drain: { removeWhenIdle: 2s }
    endpoints:
%s      - address: backend:8080
"""
# loadReporting.interval and drain.removeWhenIdle above.
REPORT_S = 1.0
IDLE_REMOVAL_S = 2.0
# Each proxyless client's own bootstrap (its node ID), beside Envoy's node.
NODES = {"channel": "compose-channel", "ccore": "compose-ccore"}
ENVOY_NODE = "envoy-compose"


def drain_entry(stage, address):
    """`address`'s entry in tether-control's `GET /drain` for drain-demo."""
    for e in stage.control_admin("/drain").get("endpoints", []):
        if e.get("cluster") == "drain-demo" and e.get("address") == address:
            return e
    return {}


def until(what, test, timeout):
    """Polls `test` until it returns something true (bounded); that value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = test()
            if last:
                return last
        except (OSError, ValueError, story.StoryError):
            pass
        time.sleep(0.1)
    raise story.StoryError("%s: not within %.0f s (last: %s)" % (what, timeout, last))


def drain_readiness(stage):
    step = story.Step("7. drain readiness: a replica DRAINING, busy while its sessions call, idle once they stop, "
                      "then removed", stage)
    began = time.monotonic()
    path = os.path.join(stage.config_dir, "tether.yaml")
    with open(path) as f:
        original = f.read()
    sessions = []
    written = []
    try:
        replicas = restore_backends(stage)
        with open(os.path.join(stage.config_dir, "bootstrap.json")) as f:
            bootstrap = json.load(f)
        for kind, node in NODES.items():
            bootstrap["node"]["id"] = node
            name = os.path.join(stage.config_dir, "bootstrap-%s.json" % kind)
            with open(name, "w") as f:
                json.dump(bootstrap, f)
            written.append(name)

        def text(drained):
            entry = "      - address: %s\n        health: DRAINING\n" % drained if drained else ""
            t = original.replace("virtualhosts:\n", "virtualhosts:\n" + DRAIN_VHOST, 1)
            return t.rstrip("\n") + "\n" + DRAIN_SERVICE % entry

        write_config(stage, text(None))
        # A session through Envoy's virtual host `draining` names the replica
        # every client's session then stays on.
        status, target, cookie = until("the draining virtual host served through Envoy",
                                       lambda: (lambda r: r if r[0] == 200 and r[1] in replicas and r[2] else None)(
                                           stage.envoy(host="draining")), 20)
        address = stage.addresses[target]
        per_call = story.SLEEP_MS / 1000 + 0.01
        seconds = 6
        for kind, label, calls, extra in (
                ("channel", "tether::Channel", int(seconds / per_call),
                 {"bootstrap": "bootstrap-channel.json", "linger": 8}),
                ("ccore", "C-core", int(seconds / per_call), {"bootstrap": "bootstrap-ccore.json"}),
                ("envoy", "Envoy", int(seconds / (2 * per_call)), {})):
            s = story.Session(stage, kind, label, cookie=cookie, sent="cookie for %s" % target, calls=calls,
                              vhost="draining", **extra)
            s.start()
            sessions.append(s)
        await_started(sessions)
        t_drain = time.monotonic()
        write_config(stage, text(address))
        want = {ENVOY_NODE} | set(NODES.values())
        busy = until("every client named busy",
                     lambda: (lambda e: e if e.get("verdict") == "busy" and want <= {
                         c["node"] for c in e.get("clients", []) if c.get("state") == "busy"} else None)(
                         drain_entry(stage, address)), 15)
        step.row("tether-control /drain", "-", "%s (%s) DRAINING: busy in %.1f s, used by %s" % (
            target, address, time.monotonic() - t_drain,
            ", ".join("%s (%s requests)" % (c["node"], c.get("requests")) for c in busy["clients"])))
        # Every call made (the channel's process then lingers, reporting).
        until("the sessions' calls", lambda: all(len(s.answers) >= s.expected or not s.is_alive()
                                                 for s in sessions), CASE_LIMIT)
        t_stop = max(a[0] for s in sessions for a in s.answers)
        idle = until("idle once the sessions stopped",
                     lambda: (lambda e: e if e.get("verdict") == "idle" else None)(drain_entry(stage, address)), 15)
        t_idle = time.monotonic()
        step.row("tether-control /drain", "-", "idle %.1f s after the last call (reports every %.0f s), clients: %s" % (
            t_idle - t_stop, REPORT_S, ", ".join("%s %s" % (c["node"], c["state"]) for c in idle["clients"]) or "-"))
        step.check(t_idle - t_stop <= 2 * REPORT_S + 0.7,
                   "idle %.1f s after the last call: more than two report intervals" % (t_idle - t_stop))
        removed = until("removed when idle", lambda: (lambda e: e if e.get("removed") else None)(
            drain_entry(stage, address)), 15)
        t_removed = time.monotonic()
        gone = until("gone from Envoy", lambda: not any(
            line.startswith("drain-demo/session::%s::" % address) for line in stage.admin("/clusters").splitlines()),
            10)
        step.row("tether-control", "-", "%s removed %.1f s after idle (%s); Envoy: %s" % (
            address, t_removed - t_idle, removed.get("removed_because"), "gone" if gone else "LISTED"))
        step.check(t_removed - t_idle >= IDLE_REMOVAL_S - 0.3 and removed.get("removed_because") == "idle for 2s",
                   "removed %.1f s after idle, or for another reason: %s" % (t_removed - t_idle, removed))
        wait_all(sessions, began + CASE_LIMIT)
    finally:
        for s in sessions:
            s.stop()
        write_config(stage, original)
        for name in written:
            try:
                os.remove(name)
            except OSError:
                pass
    # Every session stayed on the replica while it was in use.
    for s in sessions:
        backends = {a[2] for a in s.answers if a[1]}
        step.check(backends == {target}, "%s moved while in use: %s" % (s.label, backends))
    return conclude(step, sessions)


CASES = (control_plane_restarted, control_plane_cut_off, backend_cut_off, rolling_restart,
         rotating_backends, scaled_down_and_up, drain_readiness)


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    config_dir, net, http_port, admin_port = sys.argv[1:5]
    containers = dict(a.split("=", 1) for a in sys.argv[5:])
    stage = story.Stage(config_dir, net, int(http_port), int(admin_port), containers)
    steps = []
    only = os.environ.get("TETHER_FAULTS")
    cases = [CASES[int(n) - 1] for n in only.split(",")] if only else CASES
    for case in cases:
        began = time.monotonic()
        try:
            step = case(stage)
        except (story.StoryError, OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
            step = story.Step(case.__name__.replace("_", " "), stage)
            step.failures.append("%s: %s" % (type(e).__name__, e))
        took = time.monotonic() - began
        step.title += " (%.1f s)" % took
        if took > CASE_LIMIT + 15:
            step.failures.append("took %.0f s, over its bound of %.0f s" % (took, CASE_LIMIT))
        steps.append(step)
    print(story.render(steps))
    passed = sum(s.ok for s in steps)
    print("%d of %d fault cases passed" % (passed, len(steps)))
    sys.exit(0 if passed == len(steps) else 1)


if __name__ == "__main__":
    main()
