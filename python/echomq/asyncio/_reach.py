"""``echomq._reach`` for asyncio: a worker waits at start for its server (same PING, same backoff)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis

from .._reach import START_WAIT_CAP_S, log, ping_target
from ..errors import ServerUnreachable

__all__ = ["wait_for_server"]


async def wait_for_server(redis_client: Any, seconds: float, where: str = "the server") -> None:
    """Return once ``redis_client`` answers a PING; ``ServerUnreachable`` when ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    pause, said = 0.1, False
    while True:
        try:
            await redis_client.execute_command("PING", **ping_target(redis_client))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerUnreachable(f"cannot reach {where} (waited {seconds:.3g} s): {exc}") from exc
            if not said:
                log.warning("waiting up to %.3g s for %s: %s", seconds, where, exc)
                said = True
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, START_WAIT_CAP_S)
            continue
        if said:
            log.info("%s answers: starting", where)
        return
