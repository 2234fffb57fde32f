# Redis 7.2 (the last BSD-licensed line) with emq.so loaded at start.
#   docker build -t echomq-redis .
#   docker run -p 6379:6379 echomq-redis

FROM debian:bookworm-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY module/ ./module/
RUN make -C module clean all

FROM redis:7.2-bookworm
COPY --from=build /src/module/emq.so /usr/local/lib/redis/modules/emq.so
USER redis
EXPOSE 6379
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["redis-cli", "EMQ.SWEEP", "emq:{healthcheck}:active", "emq:{healthcheck}:pending", "emq:{healthcheck}:dead", "emq:{healthcheck}:", "1", "1"]
CMD ["redis-server", "--loadmodule", "/usr/local/lib/redis/modules/emq.so"]
