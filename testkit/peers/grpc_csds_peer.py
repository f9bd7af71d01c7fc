"""A gRPC C-core (grpcio) process with xds:/// channels and a CSDS service.

Opens a channel to every TARGET and makes one Echo call on each (a call to a
target whose resources are refused fails; that is expected), then serves
grpcio's Client Status Discovery Service (gRFC A40, PyPI grpcio-csds) on
127.0.0.1 and prints one JSON line {"csds": "127.0.0.1:PORT", "calls": {...}}
with each target's call outcome. It keeps the channels open until standard
input closes; each line "call" read meanwhile makes one more call on every
channel and prints {"calls": {...}}. The bootstrap comes from
GRPC_XDS_BOOTSTRAP.

usage: grpc_csds_peer.py TARGET...
"""

import json
import sys
from concurrent import futures

import grpc
import grpc_csds


def call_all(targets, channels):
    calls = {}
    for target, channel in zip(targets, channels):
        echo = channel.unary_unary(
            "/tether.demo.v1.Echo/Echo",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            echo(b"\x0a\x02hi", timeout=5, wait_for_ready=False)
            calls[target] = "OK"
        except grpc.RpcError as e:
            calls[target] = e.code().name
    return calls


def main():
    targets = sys.argv[1:]
    channels = [grpc.insecure_channel(t) for t in targets]
    calls = call_all(targets, channels)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    grpc_csds.add_csds_servicer(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(json.dumps({"csds": "127.0.0.1:%d" % port, "calls": calls}), flush=True)
    for line in sys.stdin:
        if line.strip() == "call":
            print(json.dumps({"calls": call_all(targets, channels)}), flush=True)
    server.stop(0)
    for channel in channels:
        channel.close()


if __name__ == "__main__":
    main()
