"""The gRPC C-core client container's main process (docker-compose.yml).

Makes sure grpcio can be imported (in the official python image it installs
grpcio==$GRPCIO_VERSION with pip once, at start), prints one line saying it is
ready, then waits for SIGTERM or SIGINT. Calls are made with docker exec:

    docker compose exec grpcio-client \
        python3 /opt/tether/peers/grpc_xds_client.py xds:///shop 3

The xDS bootstrap comes from GRPC_XDS_BOOTSTRAP (set by the compose file).
"""

import importlib.util
import os
import signal
import subprocess
import sys


def main():
    # Block the signals first: as PID 1 the process would otherwise ignore
    # SIGTERM and be killed 10 s later.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    if importlib.util.find_spec("grpc") is None:
        version = os.environ.get("GRPCIO_VERSION", "1.85.1")
        print("grpcio-client: installing grpcio==%s" % version, flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", "grpcio==%s" % version],
            check=True,
        )
    import grpc

    print("grpcio-client: ready (python %d.%d, grpcio %s)"
          % (sys.version_info[0], sys.version_info[1], grpc.__version__), flush=True)
    received = signal.sigwait(stop)
    print("grpcio-client: %s, exiting" % signal.Signals(received).name, flush=True)


if __name__ == "__main__":
    main()
