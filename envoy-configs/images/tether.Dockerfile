# The tether image of docker-compose.yml for a machine with a container
# registry: built from source in the official Rust image, the result FROM
# scratch. It holds static (musl) tether, tether-control,
# tether-demo-backend and tether-demo-certs in /usr/local/bin, and the tether
# plugin in /opt/tether/plugin. Context: the repository root.
#
#   docker build -f envoy-configs/images/tether.Dockerfile -t tether-demo/tether:latest .
#
# scripts/compose-images.sh makes the same image without a registry (the
# binaries built on the host, copied into an empty image).
ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-slim AS build
WORKDIR /src
COPY . .
# The musl target of the machine building (x86_64 or aarch64): static binaries.
RUN musl="$(uname -m)-unknown-linux-musl" \
 && rustup target add "$musl" wasm32-wasip1 \
 && cargo build --locked --target "$musl" --profile static \
        -p tether-cli --bin tether -p tether-control --bin tether-control \
        -p tether-testkit --bin tether-demo-backend --bin tether-demo-certs \
        --features tether-testkit/grpc \
 && cargo build --locked -p tether-plugin --target wasm32-wasip1 --profile wasm \
 && mkdir -p /out/bin /out/plugin \
 && cp "target/$musl/static/tether" "target/$musl/static/tether-control" \
       "target/$musl/static/tether-demo-backend" "target/$musl/static/tether-demo-certs" \
       /out/bin/ \
 && cp target/wasm32-wasip1/wasm/tether_plugin.wasm /out/plugin/

FROM scratch
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/plugin/ /opt/tether/plugin/
ENV PATH=/usr/local/bin
