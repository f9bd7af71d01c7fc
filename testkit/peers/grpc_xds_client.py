"""A gRPC C-core (grpcio) client for an xds:/// target.

Calls tether.demo.v1.Echo/Echo with a generic unary call (raw bytes, so no
generated stubs are needed) and prints one JSON line per call: the backend
that answered, its address, and the Set-Cookie of the response's initial
metadata, and "ms", how long the call took in milliseconds. The bootstrap
comes from GRPC_XDS_BOOTSTRAP.

usage: grpc_xds_client.py [--batches] [--service-config JSON] [--channel-arg KEY=N]... [--warm N] [--warm-seconds S] [--keys-header NAME] [--message TEXT] [--jar]
                          [--keep-going] [--failures-ok] [--pace MS] [--keepalive MS TIMEOUT_MS]
                          [--xds-creds] [--fail-fast] [--metadata KEY:VALUE]... [--timeout S]
                          [--message-size N]
                          [--concurrency N] TARGET CALLS [COOKIE]

--warm N first makes unprinted calls without a cookie until N distinct
backends have answered (at most 200 calls or 20 s, else exit 2). Round
robin only uses connected subchannels, so a fresh channel's first calls can
all reach the one backend that connected first; warming makes a test of the
spread independent of connect timing.

--warm-seconds S then keeps making unprinted calls for S seconds (at most
10000): a policy that learns from calls, such as weighted_round_robin from
per-call load reports, has learned before the printed calls.

--keys-header NAME reads keys from standard input, one a line, and makes one
call per key (CALLS is then ignored) with the metadata NAME: key; each JSON
line carries its "key", so a hash policy's picks can be compared key by key.

--message TEXT sends TEXT as every request's message (default "call N");
the demo backends answer "sleep:MS" after MS milliseconds.

--jar keeps cookies as a browser does: COOKIE (NAME=VALUE; ...) starts the
jar, and every Set-Cookie of a response replaces the jar's cookie of that
name, so a session that moves continues with its new cookie.

--keep-going prints a failed call as a line {"call", "code", "message"} and
goes on (exit 1 at the end) instead of stopping at the first failure; every
line then has a "code" ("OK" for an answered call).

--failures-ok is --keep-going with exit 0 at the end: the lines tell which
calls failed (a run meant to count failures, e.g. while outlier detection
ejects a failing backend).

--pace MS waits MS milliseconds after each call before the next one (in
every thread with --concurrency), so a run spreads over time.

--keepalive MS TIMEOUT_MS turns on HTTP/2 keepalive (gRFC A8): a PING every
MS milliseconds while calls are open, a connection whose PING is not answered
within TIMEOUT_MS closed (grpc.keepalive_time_ms, grpc.keepalive_timeout_ms).

--xds-creds makes the channel with xDS credentials (gRFC A29: the TLS each
cluster asks for, certificates from the bootstrap's certificate_providers;
plaintext for clusters without), instead of insecure ones. Each line then
also has "client_cert": the reply's x-client-cert metadata (the client
certificate the test backends saw), or null.

--fail-fast makes the printed calls fail at once while no endpoint is
usable, instead of waiting for one (gRPC's wait_for_ready off).

--metadata KEY:VALUE adds the metadata KEY: VALUE to every printed call
(repeatable).

--timeout S gives every printed call a deadline of S seconds (default 20).

--message-size N sends a message of N bytes ("x" repeated) instead (too
large for a command line, e.g. above a retry buffer).

--service-config JSON gives the channel a default service config (the
grpc.service_config channel argument), e.g. a loadBalancingConfig for a
dns: target.

--channel-arg KEY=N sets the integer channel argument KEY (repeatable), e.g.
grpc.dns_min_time_between_resolutions_ms=100.

The target may be any gRPC target (dns:, ipv4:, unix:, ...): the bootstrap
is only read for xds: targets.

--batches makes calls in batches read from standard input as they come, one
a line: "CALLS [COOKIE]" (CALLS and COOKIE on the command line are then
ignored); after each batch it prints {"batch_done": CALLS}. The one channel
stays open until standard input ends, so its load reports (LRS) go on
between batches. Not with --keys-header, --jar or --concurrency.

--concurrency N makes the CALLS calls from N threads at once over the one
channel, each thread starting its next call when the last one answered
(lines come in the order calls end). Not with --keys-header or --jar.
"""

import json
import sys
import threading
import time

import grpc
import grpc.experimental


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_request(message):
    data = message.encode()
    return b"\x0a" + varint(len(data)) + data


def read_varint(data, i):
    """Reads a protobuf varint at data[i]; returns (value, next index)."""
    value = 0
    shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def decode_reply(data):
    """Reads the string fields of EchoReply: 1 message, 2 backend, 3 address."""
    fields = {}
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 2:
            length, i = read_varint(data, i)
            fields[number] = data[i:i + length].decode()
            i += length
        elif wire == 0:
            _, i = read_varint(data, i)
        else:
            raise ValueError("unexpected wire type %d" % wire)
    return fields


def warm(echo, distinct):
    seen = set()
    deadline = time.monotonic() + 20
    for i in range(200):
        if len(seen) >= distinct or time.monotonic() > deadline:
            break
        reply = echo(encode_request("warm %d" % i), timeout=20, wait_for_ready=True)
        seen.add(decode_reply(reply).get(2, ""))
        time.sleep(0.02)
    if len(seen) < distinct:
        sys.stderr.write("warm-up saw %d backend(s) %r, wanted %d\n"
                         % (len(seen), sorted(seen), distinct))
        sys.exit(2)


def warm_for(echo, seconds):
    deadline = time.monotonic() + seconds
    for i in range(10000):
        if time.monotonic() > deadline:
            break
        echo(encode_request("warm %d" % i), timeout=20, wait_for_ready=True)


def cookie_pairs(text):
    """NAME=VALUE pairs of a Cookie header, in order."""
    pairs = []
    for part in text.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name:
            pairs.append((name, value))
    return pairs


def call_concurrently(echo, calls, threads, message, metadata, keep_going, pace=0.0, timeout=20):
    """CALLS calls from THREADS threads, each waiting PACE seconds after a
    call; returns whether one failed."""
    lock = threading.Lock()
    state = {"next": 0, "failed": False}

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= calls or (state["failed"] and not keep_going):
                    return
                state["next"] = i + 1
            start = time.monotonic()
            try:
                reply, call = echo.with_call(
                    encode_request(message if message is not None else "call %d" % i),
                    metadata=metadata or None,
                    timeout=timeout,
                    wait_for_ready=True,
                )
            except grpc.RpcError as e:
                with lock:
                    state["failed"] = True
                    print(json.dumps({"call": i, "key": None, "code": e.code().name,
                                      "message": e.details(), "ms": elapsed_ms(start)}),
                          flush=True)
                if pace:
                    time.sleep(pace)
                continue
            fields = decode_reply(reply)
            line = {
                "call": i,
                "key": None,
                "backend": fields.get(2, ""),
                "address": fields.get(3, ""),
                "set_cookie": [v for k, v in call.initial_metadata() if k == "set-cookie"],
                "ms": elapsed_ms(start),
            }
            if keep_going:
                line["code"] = "OK"
            with lock:
                print(json.dumps(line), flush=True)
            if pace:
                time.sleep(pace)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return state["failed"]


def stdin_batches():
    """(keys, cookie) of each line "CALLS [COOKIE]" of standard input, read
    as it comes, until it ends."""
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        parts = line.split(None, 1)
        if parts:
            yield [None] * int(parts[0]), (parts[1].strip() if len(parts) > 1 else None)


def elapsed_ms(start):
    return int((time.monotonic() - start) * 1000)


def main():
    args = sys.argv[1:]
    distinct = 0
    warm_seconds = 0.0
    concurrency = 1
    keys_header = None
    message = None
    jar = None
    keep_going = False
    failures_ok = False
    batch_mode = False
    pace = 0.0
    options = []
    xds_creds = False
    wait = True
    extra = []
    timeout = 20.0
    while args and args[0].startswith("--"):
        if args[0] == "--warm":
            distinct = int(args[1])
        elif args[0] == "--warm-seconds":
            warm_seconds = float(args[1])
        elif args[0] == "--keys-header":
            keys_header = args[1]
        elif args[0] == "--message":
            message = args[1]
        elif args[0] == "--metadata":
            key, sep, value = args[1].partition(":")
            if not sep:
                sys.exit("--metadata wants KEY:VALUE, not %r" % args[1])
            extra.append((key, value))
        elif args[0] == "--timeout":
            timeout = float(args[1])
        elif args[0] == "--message-size":
            message = "x" * int(args[1])
        elif args[0] == "--service-config":
            options.append(("grpc.service_config", args[1]))
        elif args[0] == "--channel-arg":
            key, sep, value = args[1].partition("=")
            if not sep:
                sys.exit("--channel-arg wants KEY=N, not %r" % args[1])
            options.append((key, int(value)))
        elif args[0] == "--concurrency":
            concurrency = int(args[1])
        elif args[0] == "--pace":
            pace = int(args[1]) / 1000.0
        elif args[0] == "--keepalive":
            options += [("grpc.keepalive_time_ms", int(args[1])),
                        ("grpc.keepalive_timeout_ms", int(args[2]))]
            args = args[3:]
            continue
        elif args[0] == "--xds-creds":
            xds_creds = True
            args = args[1:]
            continue
        elif args[0] == "--fail-fast":
            wait = False
            args = args[1:]
            continue
        elif args[0] == "--jar":
            jar = {}
            args = args[1:]
            continue
        elif args[0] == "--keep-going":
            keep_going = True
            args = args[1:]
            continue
        elif args[0] == "--batches":
            batch_mode = True
            args = args[1:]
            continue
        elif args[0] == "--failures-ok":
            keep_going = True
            failures_ok = True
            args = args[1:]
            continue
        else:
            sys.exit("unknown option %s" % args[0])
        args = args[2:]
    target, calls = args[0], int(args[1])
    cookie = args[2] if len(args) > 2 else None
    if jar is not None and cookie:
        jar.update(cookie_pairs(cookie))
    failed = False
    keys = [None] * calls
    if keys_header:
        keys = [line.rstrip("\n") for line in sys.stdin]
    batches = [(keys, cookie)]
    if batch_mode:
        batches = stdin_batches()
    if xds_creds:
        channel = grpc.secure_channel(
            target, grpc.xds_channel_credentials(grpc.experimental.insecure_channel_credentials()), options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    with channel:
        echo = channel.unary_unary(
            "/tether.demo.v1.Echo/Echo",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        if distinct:
            warm(echo, distinct)
        if warm_seconds:
            warm_for(echo, warm_seconds)
        if concurrency > 1:
            if keys_header or jar is not None:
                sys.exit("--concurrency does not go with --keys-header or --jar")
            metadata = ([("cookie", cookie)] if cookie else []) + extra
            if call_concurrently(echo, calls, concurrency, message, metadata, keep_going,
                                 pace, timeout) and not failures_ok:
                sys.exit(1)
            return
        for keys, cookie in batches:
            for i, key in enumerate(keys):
                if jar is not None:
                    cookie = "; ".join("%s=%s" % kv for kv in jar.items()) or None
                metadata = [("cookie", cookie)] if cookie else []
                if key is not None:
                    metadata.append((keys_header, key))
                metadata += extra
                start = time.monotonic()
                try:
                    reply, call = echo.with_call(
                        encode_request(message if message is not None else "call %d" % i),
                        metadata=metadata or None,
                        timeout=timeout,
                        wait_for_ready=wait,
                    )
                except grpc.RpcError as e:
                    if not keep_going:
                        raise
                    failed = True
                    print(json.dumps({"call": i, "key": key, "code": e.code().name,
                                      "message": e.details(), "ms": elapsed_ms(start)}),
                          flush=True)
                    if pace:
                        time.sleep(pace)
                    continue
                set_cookie = [v for k, v in call.initial_metadata() if k == "set-cookie"]
                if jar is not None:
                    for v in set_cookie:
                        jar.update(cookie_pairs(v.split(";", 1)[0]))
                fields = decode_reply(reply)
                line = {
                    "call": i,
                    "key": key,
                    "backend": fields.get(2, ""),
                    "address": fields.get(3, ""),
                    "set_cookie": set_cookie,
                    "ms": elapsed_ms(start),
                }
                if xds_creds:
                    line["client_cert"] = next(
                        (v for k, v in call.initial_metadata() if k == "x-client-cert"), None)
                if keep_going:
                    line["code"] = "OK"
                print(json.dumps(line), flush=True)
                if pace:
                    time.sleep(pace)
            if batch_mode:
                print(json.dumps({"batch_done": len(keys)}), flush=True)
    if failed and not failures_ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
