"""Waiting for a server at start: ``echomq worker --wait-for-server S`` and ``app.worker(wait_for_server=S)``.

A worker started while its server is down (a deploy that starts the workers
and the server together, a server restarting) waits for it instead of
exiting 1; once running, a worker rides out an outage by itself.  The
asyncio twin is ``echomq.asyncio._reach``; both ask the same question, a
PING, with the same backoff (``_runtime.Backoff``'s waits).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from .errors import ServerUnreachable

__all__ = ["START_WAIT_CAP_S", "wait_for_server"]

log = logging.getLogger("echomq.worker")

START_WAIT_CAP_S = 2.0
"""The longest pause between two PINGs while waiting at start."""


def ping_target(redis_client: Any) -> dict[str, Any]:
    """PING's options: a cluster client is told to ask any node (the command has no key)."""
    if hasattr(redis_client, "get_random_node"):
        return {"target_nodes": redis_client.get_random_node()}
    return {}


def wait_for_server(redis_client: Any, seconds: float, where: str = "the server") -> None:
    """Return once ``redis_client`` answers a PING; ``ServerUnreachable`` when ``seconds`` pass first.

    ``seconds`` 0 asks once.  A refusal and a timeout are waited out; any
    other error (a wrong password, say) is raised at once: waiting cannot fix it.
    """
    deadline = time.monotonic() + seconds
    pause, said = 0.1, False
    while True:
        try:
            redis_client.execute_command("PING", **ping_target(redis_client))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerUnreachable(f"cannot reach {where} (waited {seconds:.3g} s): {exc}") from exc
            if not said:
                log.warning("waiting up to %.3g s for %s: %s", seconds, where, exc)
                said = True
            time.sleep(min(pause, left))
            pause = min(pause * 2, START_WAIT_CAP_S)
            continue
        if said:
            log.info("%s answers: starting", where)
        return
