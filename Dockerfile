# syntax=docker/dockerfile:1
#
# fga-relay's container image.
#
#   docker build -t fga-relay .
#   docker run --rm -e DATABASE_URL=... -e FGA_API_URL=... -e FGA_STORE_ID=... -p 9464:9464 fga-relay
#
# The entrypoint is the binary and the default command is `run`; any other command replaces it:
#   docker run --rm -e DATABASE_URL=... fga-relay migrate
#   docker run --rm -e DATABASE_URL=... fga-relay status --json
#
# BuildKit is required (the default builder of Docker Engine 23 and later, and of Compose v2):
# the build keeps cargo's registry and target directory in cache mounts, so a rebuild after a
# source change recompiles fga-relay alone, not its dependencies.

# The toolchain is the one the project is tested with (Cargo.toml's rust-version, 1.88, is only
# the oldest that builds it); the build and runtime stages are on the same Debian release, so the
# binary finds the glibc it was linked against.
ARG RUST_VERSION=1.95.0
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# The git revision `--version` and fga_relay_build_info show: the context has no .git, so pass it
# (`docker build --build-arg FGA_RELAY_GIT_REVISION=$(git rev-parse --short=12 HEAD) .`);
# without it they say "unknown". build.rs reads it from the environment RUN gives cargo.
ARG FGA_RELAY_GIT_REVISION
# .dockerignore keeps target/, .git and the deployment files out of the context.
COPY . .
RUN --mount=type=cache,id=fga-relay-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=fga-relay-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=fga-relay-target,target=/src/target,sharing=locked \
    cargo build --release --locked --bin fga-relay \
 && install -D -m 0755 -s target/release/fga-relay /out/fga-relay
# (`install -s` strips the line tables Cargo.toml keeps for profiling: 64 MB become about 12.)

FROM debian:${DEBIAN_RELEASE}-slim
# ca-certificates: OpenFGA over https and PostgreSQL with sslmode=verify-full trust the system
# roots. The relay needs nothing else (glibc and libgcc_s are in the base image).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 fga-relay \
 && useradd --system --uid 10001 --gid fga-relay --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin fga-relay
COPY --from=build /out/fga-relay /usr/local/bin/fga-relay

LABEL org.opencontainers.image.title="fga-relay" \
      org.opencontainers.image.description="Delivers a PostgreSQL transactional outbox (fga_outbox) to OpenFGA's Write API, at least once, in order." \
      org.opencontainers.image.licenses="MIT OR Apache-2.0"

# A numeric user, so that runtimes enforcing "run as non-root" can check it.
USER 10001:10001
# Inside a container /healthz and /metrics must listen beyond loopback to be reachable at all.
ENV FGA_RELAY_HTTP_ADDR=0.0.0.0:9464
EXPOSE 9464
# `run` stops on SIGTERM (Docker's default stop signal) after the batch in flight.
STOPSIGNAL SIGTERM
ENTRYPOINT ["fga-relay"]
CMD ["run"]
