"""An idle worker is quiet (issue 30): one waiting claim for the whole worker, not one per slot.

At e64777a an idle ``Worker(client, q, h, concurrency=8)`` sent 31 claims/s
and the asyncio one 4.4/s.  Now, at defaults, a worker of any concurrency
waits on the server with one claim of 5 s (the module), or polls with a
backoff to 3 s (the scripts backend, which cannot wait on the server),
and ``stop()`` cuts the waiting claim.  The rates themselves are measured
by ``bench/idle_workers.py``; here, counts over a window, with room.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.testing import EmbeddedServer

from ..calibration import budget

pytestmark = pytest.mark.backends

Q = "idle"
SENT = ("emq.", "fcall", "evalsha", "eval")  # a claim or a sweep, by either backend


def claims_and_sweeps(r: redis.Redis) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name.removeprefix("cmdstat_").startswith(SENT))


def idle_for(
    server: EmbeddedServer, mode: str, slots: int, warmup: float, window: float
) -> tuple[int, float]:
    """(claims and sweeps sent over ``window`` s by an idle worker at its defaults, its stop's seconds)."""
    r = server.client()
    if mode == "sync":
        worker = echomq.Worker(echomq.Client(server.client()), Q, lambda ctx: None, concurrency=slots)
        worker.start()
        time.sleep(warmup)
        before = claims_and_sweeps(r)
        time.sleep(window)
        sent = claims_and_sweeps(r) - before
        started = time.monotonic()
        worker.stop()
        return sent, time.monotonic() - started

    async def handler(ctx: emq.JobContext) -> None:
        return None

    async def main() -> tuple[int, float]:
        client = emq.Client(redis.asyncio.Redis(port=server.port))
        worker = emq.Worker(client, Q, handler, concurrency=slots)
        task = asyncio.create_task(worker.run(handle_signals=False))
        await asyncio.sleep(warmup)
        before = claims_and_sweeps(r)
        await asyncio.sleep(window)
        sent = claims_and_sweeps(r) - before
        started = time.monotonic()
        worker.stop()
        await task
        took = time.monotonic() - started
        await client.aclose()
        return sent, took

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
@pytest.mark.parametrize("slots", [1, 64])
def test_an_idle_worker_sends_a_claim_every_few_seconds_whatever_its_slots(
    server: EmbeddedServer, r: redis.Redis, backend: str, mode: str, slots: int
) -> None:
    # The module: one waiting claim of 5 s; the scripts: polls backing off to 3 s
    # (after 0.2 + 0.4 + 0.8 + 1.6 s of warm-up, every 3 s, jittered).
    warmup, window = (0.5, 4.0) if backend == "module" else (3.0, 4.0)
    sent, stop_took = idle_for(server, mode, slots, warmup, window)
    assert sent <= 3, f"{sent} claims and sweeps in {window} s"  # e64777a: 20 to 150
    assert stop_took < budget(2.5)  # the waiting claim is cut, not waited out
