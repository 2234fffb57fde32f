# A Redis server with EchoMQ's emq.so loaded at start.
#
#   docker build -t echomq-redis .
#   docker run --rm -d -p 127.0.0.1:6379:6379 echomq-redis
#
# The base is the official Redis 7.2 image (the last BSD-licensed Redis line) by
# default.  Any Debian-based image with redis-server and redis-cli on PATH will
# do; Valkey's `make install` links both names to its own binaries:
#
#   docker build --build-arg REDIS_IMAGE=valkey/valkey:8.1-bookworm -t echomq-valkey .
#
# Both stages start from the same base, so emq.so is compiled against exactly
# the C library it runs with.  Only the second stage ships: the base plus the
# module and its account, with no compiler, headers or sources.

ARG REDIS_IMAGE=redis:7.2.11-bookworm

FROM ${REDIS_IMAGE} AS build
# Debian's gcc and make as the base's release ships them: pinning exact package
# versions would break this stage at the next Debian point release.
# hadolint ignore=DL3008
RUN if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then \
      echo "the base image needs redis-server and redis-cli on PATH" >&2; exit 1; \
    fi; \
    apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY module/ ./module/
RUN make -C module clean all

FROM ${REDIS_IMAGE}
LABEL org.opencontainers.image.title="echomq-redis" \
      org.opencontainers.image.description="A Redis server (Redis 7.2 by default) with EchoMQ's module loaded" \
      org.opencontainers.image.licenses="BSD-3-Clause"
# What the official images provide and Debian's redis-server package does not,
# made explicit so that the image is the same on either base.  The account:
# the official images run the server as uid and gid 999 ("redis", or "valkey"
# in Valkey's), while Debian's package makes "redis" with whichever system uid
# was free; it is moved to 999 (or made, where a base has neither).  /data: the
# server's working directory and volume, the account's own.  The module
# directory is the official images' convention; Debian's package has none.
RUN set -eu; \
    if ! getent passwd 999 >/dev/null; then \
      if getent passwd redis >/dev/null; then \
        groupmod -g 999 redis && usermod -u 999 -g 999 redis; \
      else \
        groupadd -r -g 999 redis && useradd -r -g 999 -u 999 -d /data -s /usr/sbin/nologin redis; \
      fi; \
    fi; \
    mkdir -p /data /usr/local/lib/redis/modules; \
    chown 999:999 /data
COPY --from=build /src/module/emq.so /usr/local/lib/redis/modules/emq.so
VOLUME /data
WORKDIR /data
# By number, so that an orchestrator can verify it is not root without
# reading /etc/passwd.
USER 999:999
EXPOSE 6379
# Read-only: healthy once the server answers and lists the module as loaded
# (redis-cli exits 0 even on an error reply, so grep decides).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["sh", "-c", "redis-cli MODULE LIST | grep -qx emq"]
# Protected mode off, as the official images build it: clients reach the
# server through the engine's published port, never from the container's own
# loopback, and protected mode would refuse them all while no password is set.
# What the port is exposed to is decided where it is published
# (-p 127.0.0.1:6379:6379), as with the official image.
CMD ["redis-server", "--protected-mode", "no", "--loadmodule", "/usr/local/lib/redis/modules/emq.so"]
