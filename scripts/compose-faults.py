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
3. Backends that end every connection once it is 300 ms old (gRPC's
   max_connection_age: GOAWAY, the calls on it finish, then the close), two
   more containers behind their own virtual host, under steady load: no call
   fails and no session moves.

Every case is bounded (CASE_LIMIT) and repairs what it broke, also when it
fails.

Usage: compose-faults.py CONFIG_DIR NET HTTP_PORT ADMIN_PORT SERVICE=CONTAINER...
Prints a table with a verdict per case; exits 1 when a case fails.
"""

import importlib.util
import json
import os
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
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(len(s.answers) < 3 and s.is_alive() for s in sessions):
        time.sleep(0.05)
    slow = [s.label for s in sessions if len(s.answers) < 3]
    if slow:
        raise story.StoryError("sessions did not start: %s (%s)" % (
            slow, [s.error for s in sessions if s.error]))
    return sessions


def judge(step, sessions, fault_at):
    """Rows and failures for sessions that must neither fail nor move."""
    calls = failed = moved = 0
    worst = 0.0
    for s in sessions:
        ok = [a for a in s.answers if a[1]]
        bad = [a for a in s.answers if not a[1]]
        backends = [a[2] for a in ok]
        problems = []
        if s.error:
            problems.append(s.error)
        if len(s.answers) != s.expected:
            problems.append("%d of %d calls made" % (len(s.answers), s.expected))
        if bad:
            problems.append("%d failed call(s): %s" % (len(bad), bad[0][4]))
        if len(set(backends)) > 1:
            problems.append("moved: %s" % story.tally(backends))
            moved += 1
        times = [a[0] for a in s.answers]
        gaps = [t2 - t1 for t1, t2 in zip(times, times[1:]) if t2 > fault_at - 1]
        gap = max(gaps) if gaps else 0.0
        worst = max(worst, gap)
        if gap > STALL_S:
            problems.append("a call took %.1f s" % gap)
        calls += len(s.answers)
        failed += len(bad)
        step.row(s.label, "-", "%s, %d/%d OK, longest wait %.0f ms" % (
            backends[0] if backends else "-", len(ok), len(s.answers), gap * 1000),
            "; ".join(problems) if problems else "stayed")
        for p in problems:
            step.failures.append("%s: %s" % (s.label, p))
    return calls, failed, moved, worst


def conclude(step, sessions, fault_at):
    """Judges the sessions and sums them up in the step's verdict."""
    calls, failed, moved, worst = judge(step, sessions, fault_at)
    step.verdict = ("%d calls, %d failed, %d of %d sessions moved; the longest wait for an answer %.0f ms"
                    % (calls, failed, moved, len(sessions), worst * 1000))
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
        fault_at = time.monotonic()
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
    return conclude(step, sessions, fault_at)


def control_plane_cut_off(stage):
    step = story.Step("2. the control plane cut off for longer than the does-not-exist timer", stage)
    began = time.monotonic()
    container = stage.containers["tether-control"]
    networks = json.loads(docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", container))
    (network, settings), = networks.items()
    address = settings["IPAddress"]
    # Back at the same address and under the same names (the service name
    # the clients' bootstrap dials is a network alias).
    reconnect = ["network", "connect", "--ip", address]
    for alias in settings.get("Aliases") or []:
        reconnect += ["--alias", alias]
    reconnect += [network, container]
    cut = DOES_NOT_EXIST_S + 2
    sessions = []
    connected = True
    try:
        sessions = start_sessions(stage, cut + 8)
        fault_at = time.monotonic()
        docker("network", "disconnect", network, container)
        connected = False
        time.sleep(cut)
        docker(*reconnect)
        connected = True
        back = control_serves(stage, 15)
        step.row("docker network disconnect", "-", "tether-control (%s) cut off for %.0f s" % (address, cut),
                 "serves again" if back else "NOT SERVING")
        step.check(back, "tether-control did not serve again within 15 s of reconnecting")
        wait_all(sessions, began + CASE_LIMIT)
    finally:
        for s in sessions:
            s.stop()
        if not connected:
            subprocess.run(["docker"] + reconnect, capture_output=True, timeout=60)
    return conclude(step, sessions, fault_at)


ROTATING_VHOST = """  - name: rotating                   # compose-faults.py, case 3
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
    step = story.Step("3. backends ending every connection after %d ms, under load" % (MAX_AGE_S * 1000),
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
        fault_at = time.monotonic()
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
        with open(path + ".tmp", "w") as f:
            f.write(original)
        os.replace(path + ".tmp", path)
        for container in started:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)
    return conclude(step, sessions, fault_at)


CASES = (control_plane_restarted, control_plane_cut_off, rotating_backends)


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    config_dir, net, http_port, admin_port = sys.argv[1:5]
    containers = dict(a.split("=", 1) for a in sys.argv[5:])
    stage = story.Stage(config_dir, net, int(http_port), int(admin_port), containers)
    steps = []
    for case in CASES:
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
