"""An asyncio worker's schedule driver: its queue's schedule ticks fired on time, not at its sweeps.

The twin of ``_sync/_ticks.py`` (see it for the rules), as one task: it
sleeps until the queue's earliest next tick, or until the cancel listener
hears a schedule change, and drives the due schedules then.  The worker
cancels it at its stop, a drive in flight with it (a transaction not yet
executed changes nothing; one that was, fired its ticks once).

Hand-written beside its twin ``_sync/_ticks.py``, not generated from it
(``tests/unasync.py``): a thread waits on an ``Event`` where asyncio has one task,
cancelled at the stop.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from .. import schedules as rules
from .._runtime import WorkerCore
from ._schedules import drive, next_tick
from ._waits import wait_event, within
from .client import Client

# A turn's bound (its commands have no socket timeout: see _attempt.WorkerConnections).
TURN_S = 10.0

__all__ = ["TickDriver"]


class TickDriver:
    """Fires a worker's queue's schedule ticks when they come (``run()``, one task)."""

    def __init__(self, worker: WorkerCore[Client, Any], told: bool) -> None:
        self.worker = worker
        self._recheck = rules.RECHECK_S if told else rules.RECHECK_UNTOLD_S
        self._wake = asyncio.Event()
        self._pool, self.client = own_client(worker.client)

    def changed(self) -> None:
        """A schedule of the queue changed (its channel said so): read the next tick again now."""
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled or the worker stops: drive the due ticks, sleep until the next one or a change."""
        try:
            while not self.worker._stop_requested:
                self._wake.clear()
                await wait_event(self._wake, await self.turn())
        finally:
            if self._pool is not None:
                await self._pool.disconnect()

    async def turn(self) -> float:
        """Drive the due ticks, if any; the seconds until the next one (at most the recheck)."""
        try:
            return await within(self._turn(), TURN_S)
        except Exception as exc:  # the server away, a bug of ours: told (once); the next turn comes
            self.worker._trouble(exc, "schedules")
            return rules.RETRY_S

    async def _turn(self) -> float:
        worker, client = self.worker, self.client
        next_ms, now_ms = await next_tick(client, worker.queue)
        if next_ms is None or next_ms > now_ms:
            return rules.wait_s(next_ms, now_ms, self._recheck)
        result = await drive(client, worker.queue)
        rules.tell_drive(worker.queue, result)
        next_ms, now_ms = await next_tick(client, worker.queue)
        if next_ms is not None and next_ms <= now_ms:  # still due: a row it could not fire (told)
            return rules.RETRY_S
        return rules.wait_s(next_ms, now_ms, self._recheck)


def own_client(client: Client) -> tuple[aioredis.ConnectionPool | None, Client]:
    """The driver's client: on connections of its own (a transaction holds one under WATCH), made as
    the worker's attempts' are (no socket timeout: each turn is bounded, ``TURN_S``); a client whose
    connections are not the worker's own to make (a cluster's) is used as it is."""
    if not client._bounded():
        return None, client
    connections = client._connections()
    pool = aioredis.ConnectionPool(
        connection_class=connections._class, max_connections=2, **connections._options
    )
    own = type(client)(aioredis.Redis(connection_pool=pool), script_limits=client._limits)
    own._rendering = client._rendering
    return pool, own
