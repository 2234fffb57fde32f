"""Waiting for a server at start: ``echomq worker --wait-for-server S`` and ``app.worker(wait_for_server=S)``.

A worker started while its server is down (a deploy that starts the workers
and the server together, a server restarting) waits for it instead of
exiting 1; once running, a worker rides out an outage by itself.  The rules
are ``_runtime.reach.StartWait``'s.

The source of its sync twin, ``_sync/_reach.py``, which ``tests/unasync.py`` writes from it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis

from .._runtime.reach import StartWait, ping_target

__all__ = ["wait_for_server"]


async def wait_for_server(redis_client: Any, seconds: float, where: str = "the server") -> None:
    """Return once ``redis_client`` answers a PING; ``ServerUnreachable`` when ``seconds`` pass first.

    ``seconds`` 0 asks once.  A refusal and a timeout are waited out; any
    other error (a wrong password, say) is raised at once: waiting cannot fix it.
    """
    wait = StartWait(seconds, where)
    while True:
        try:
            await redis_client.execute_command("PING", **ping_target(redis_client))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            await asyncio.sleep(wait.failed(exc))
            continue
        wait.answered()
        return
