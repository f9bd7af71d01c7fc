"""gRPC C-core's OpenTelemetry plugin (PyPI grpcio-observability) as a test
peer: makes calls on an xds:/// target, then prints, as one JSON document,
every metric the plugin recorded, read from the OpenTelemetry SDK's
in-memory reader.

usage: grpc_otel_client.py TARGET STEP...

Each STEP is CASE:FAIL_UNTIL:COUNT: COUNT calls of tether.demo.v1.Echo/Echo
(a registered method, as generated stubs make it, so its name is recorded)
with the metadata x-case: CASE and x-fail-until: FAIL_UNTIL, which the test
backends read as "fail an attempt with UNAVAILABLE while its
grpc-previous-rpc-attempts is below FAIL_UNTIL". A call's failure is
expected and not reported; every step waits for its calls to end.

The output: {"calls": [[CASE, CODE], ...], "metrics": [{"name", "unit",
"kind", "points": [{"attributes": {...}, "value" | "count" + "sum"}]}]}.
The bootstrap comes from GRPC_XDS_BOOTSTRAP.
"""

import json
import sys

import grpc
import grpc_observability
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

METHOD = "/tether.demo.v1.Echo/Echo"
# EchoRequest { message: "otel" }: field 1, length 4.
REQUEST = b"\n\x04otel"


def points(metric):
    out = []
    for p in metric.data.data_points:
        point = {"attributes": dict(p.attributes)}
        if hasattr(p, "bucket_counts"):
            point["count"] = p.count
            point["sum"] = p.sum
        else:
            point["value"] = p.value
        out.append(point)
    return out


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    target, steps = sys.argv[1], sys.argv[2:]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    plugin = grpc_observability.OpenTelemetryPlugin(meter_provider=provider)
    plugin.register_global()
    calls = []
    with grpc.insecure_channel(target) as channel:
        echo = channel.unary_unary(METHOD, _registered_method=True)
        for step in steps:
            case, fail_until, count = step.split(":")
            for _ in range(int(count)):
                metadata = (("x-case", case), ("x-fail-until", fail_until))
                try:
                    echo(REQUEST, metadata=metadata, timeout=20, wait_for_ready=True)
                    calls.append([case, "OK"])
                except grpc.RpcError as e:
                    calls.append([case, e.code().name])
    plugin.deregister_global()
    metrics = []
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                metrics.append(
                    {
                        "name": m.name,
                        "unit": m.unit,
                        "kind": type(m.data).__name__,
                        "scope": sm.scope.name,
                        "points": points(m),
                    }
                )
    print(json.dumps({"calls": calls, "metrics": metrics}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
