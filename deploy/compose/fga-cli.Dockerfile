# Docker Compose demo: OpenFGA's CLI (`fga`) with a shell and jq, for openfga-init.sh.
# The openfga/cli image holds the fga binary alone (distroless, no shell), which cannot check
# whether the store exists before creating it; the binary is static, so it is copied as it is.
FROM openfga/cli:v0.7.20 AS cli

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates jq \
 && rm -rf /var/lib/apt/lists/*
COPY --from=cli /fga /usr/local/bin/fga
USER nobody
ENTRYPOINT ["fga"]
