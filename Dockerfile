# Redis 7.2 (the last BSD-licensed Redis line) with EchoMQ's emq.so loaded at start.
#
#   docker build -t echomq-redis .
#   docker run --rm -p 6379:6379 echomq-redis
#
# Both stages start from the same pinned Redis image, so emq.so is compiled
# against exactly the C library it runs with.  Only the second stage ships:
# the official image plus one file, with no compiler, headers or sources.

ARG REDIS_IMAGE=redis:7.2.11-bookworm

FROM ${REDIS_IMAGE} AS build
# Debian's gcc and make as bookworm ships them: pinning exact package
# versions would break this stage at the next Debian point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY module/ ./module/
RUN make -C module clean all

FROM ${REDIS_IMAGE}
LABEL org.opencontainers.image.title="echomq-redis" \
      org.opencontainers.image.description="Redis 7.2 with the EchoMQ module (EMQ.EXTEND, EMQ.SWEEP) loaded" \
      org.opencontainers.image.licenses="BSD-3-Clause"
COPY --from=build /src/module/emq.so /usr/local/lib/redis/modules/emq.so
# The official image's own unprivileged "redis" account, by number so that
# an orchestrator can verify it is not root without reading /etc/passwd.
USER 999:999
EXPOSE 6379
# Read-only: healthy once the server answers and lists the module as loaded
# (redis-cli exits 0 even on an error reply, so grep decides).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["sh", "-c", "redis-cli MODULE LIST | grep -qx emq"]
CMD ["redis-server", "--loadmodule", "/usr/local/lib/redis/modules/emq.so"]
