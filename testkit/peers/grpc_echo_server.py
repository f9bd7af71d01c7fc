"""A gRPC C-core server (PyPI grpcio) of tether.demo.v1.Echo/Echo, for tests
that need a real gRPC server's HTTP/2 behaviour (its ping policy, its
GOAWAYs) rather than tonic's.

usage: grpc_echo_server.py NAME DELAY_MS [OPTION=VALUE]...

Serves on 127.0.0.1 (a free port), prints "listening on 127.0.0.1:PORT" once
ready, and answers every call after DELAY_MS with an EchoReply naming NAME,
until its standard input closes. OPTION=VALUE pairs are C-core channel
arguments with integer values (e.g. grpc.http2.max_ping_strikes=0).
"""

import sys
import threading
import time
from concurrent import futures

import grpc

# The client peer beside this script encodes varints the same way.
from grpc_xds_client import varint


def field(number, text):
    data = text.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data


def main():
    name, delay_ms = sys.argv[1], int(sys.argv[2])
    options = []
    for pair in sys.argv[3:]:
        key, value = pair.split("=", 1)
        options.append((key, int(value)))
    served = [0]
    lock = threading.Lock()
    address = ["127.0.0.1:0"]

    def echo(request, context):
        time.sleep(delay_ms / 1000.0)
        with lock:
            served[0] += 1
            count = served[0]
        return (field(1, "echo") + field(2, name) + field(3, address[0])
                + varint(4 << 3) + varint(count))

    handler = grpc.method_handlers_generic_handler("tether.demo.v1.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(
            echo, request_deserializer=None, response_serializer=None),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=options)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    address[0] = "127.0.0.1:%d" % port
    server.start()
    print("listening on %s" % address[0], flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
