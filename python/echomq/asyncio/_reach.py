"""``echomq._reach`` for asyncio: a worker waits at start for its server (``_runtime.reach.StartWait``)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis

from .._runtime.reach import StartWait, ping_target

__all__ = ["wait_for_server"]


async def wait_for_server(redis_client: Any, seconds: float, where: str = "the server") -> None:
    """Return once ``redis_client`` answers a PING; ``ServerUnreachable`` when ``seconds`` pass first."""
    wait = StartWait(seconds, where)
    while True:
        try:
            await redis_client.execute_command("PING", **ping_target(redis_client))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            await asyncio.sleep(wait.failed(exc))
            continue
        wait.answered()
        return
