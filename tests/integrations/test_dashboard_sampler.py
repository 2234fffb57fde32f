"""The dashboard's sampler stops when the dashboard does, wherever the stop finds it.

Before Python 3.12, ``asyncio.wait_for`` returns normally when a cancel lands
as the awaited call completes, and redis.asyncio sends every command through
it: a sampler cancelled mid-request could lose the cancel, go on sampling, and
keep the dashboard from ever shutting down (about one stop in seven here).
The dashboard's ASGI lifespan is driven directly, as uvicorn drives it: start,
let the sampler get into its requests, shut down.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

import echomq
from echomq import asyncio as emq
from echomq.dashboard import Dashboard
from echomq.testing import EmbeddedServer

pytestmark = pytest.mark.once

QUEUES = [f"sampled-{i}" for i in range(6)]
CYCLES = 150
# Far above what a stop takes (a request or two); the lost cancel is a stop that never ends.
STOP_TIMEOUT = 15.0


class _Watched(Dashboard):
    """The dashboard as it is, telling whether a pass over the queues is under way."""

    in_pass = False

    async def sample(self) -> None:
        self.in_pass = True
        try:
            await super().sample()
        finally:
            self.in_pass = False


async def _lifespan_cycle(dashboard: _Watched, delay: float) -> bool:
    """Start the dashboard's app, shut it down ``delay`` s into a pass: whether the stop came mid-pass."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    app = dashboard.app()
    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
    running = asyncio.create_task(app(scope, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await asyncio.wait_for(outbox.get(), STOP_TIMEOUT)
    assert started["type"] == "lifespan.startup.complete", started
    deadline = time.monotonic() + STOP_TIMEOUT
    while not dashboard.in_pass and time.monotonic() < deadline:  # a pass begins at once, then each interval
        await asyncio.sleep(0)
    await asyncio.sleep(delay)  # somewhere inside it, mostly
    mid_pass = dashboard.in_pass
    await inbox.put({"type": "lifespan.shutdown"})
    try:
        stopped = await asyncio.wait_for(outbox.get(), STOP_TIMEOUT)
    except asyncio.TimeoutError:
        running.cancel()
        raise AssertionError(f"the dashboard did not stop within {STOP_TIMEOUT} s of its shutdown") from None
    assert stopped["type"] == "lifespan.shutdown.complete", stopped
    await asyncio.wait_for(running, STOP_TIMEOUT)
    return mid_pass


def test_the_sampler_stops_when_cancelled_mid_request(server: EmbeddedServer, client: echomq.Client) -> None:
    for name in QUEUES:
        client.enqueue(name, b"x", job_id="j")
    rng = random.Random(35)

    async def cycles() -> int:
        probe = Dashboard(emq.Client.from_url(server.url), queues=QUEUES)
        began = time.monotonic()
        await probe.sample()  # how long one pass over the queues takes here
        one_pass = time.monotonic() - began
        await probe.client.aclose()
        mid_pass = 0
        for _ in range(CYCLES):
            dashboard = _Watched(emq.Client.from_url(server.url), queues=QUEUES, interval=0.01)
            mid_pass += await _lifespan_cycle(dashboard, rng.uniform(0, one_pass))
        return mid_pass

    mid_pass = asyncio.run(cycles())
    # The control: the stops did land mid-request, not only between passes.
    assert mid_pass >= CYCLES // 6, f"only {mid_pass} of {CYCLES} stops landed inside a pass"
