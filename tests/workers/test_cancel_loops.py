"""CancelToken.cancel() wakes every live waiter, on any loop, and never raises for a dead one (issue 23)."""

from __future__ import annotations

import asyncio
import threading
import time

from echomq import Cancellation, CancelToken


def test_a_waiter_on_a_closed_loop_neither_raises_nor_blocks_the_others() -> None:
    # token_closed_loop.py: a loop that waited on the token and was closed
    # made cancel() raise RuntimeError, and the waiters after it never woke.
    token = CancelToken()
    dead = asyncio.new_event_loop()
    stranded = dead.create_task(token.wait())
    dead.run_until_complete(asyncio.sleep(0.01))  # the waiter is registered...
    dead.close()  # ...and its loop is gone
    woke: list[Cancellation] = []
    ready = threading.Event()

    def live() -> None:
        async def wait() -> None:
            ready.set()
            woke.append(await asyncio.wait_for(token.wait(), 5))

        asyncio.run(wait())

    thread = threading.Thread(target=live)
    thread.start()
    assert ready.wait(5)
    time.sleep(0.05)  # the live waiter has registered too
    assert token.cancel("shutdown") is True  # no exception
    thread.join(5)
    assert woke == [Cancellation("shutdown")]
    assert token.cancelled and token.check() == Cancellation("shutdown")
    del stranded


def test_cancel_wakes_waiters_on_several_loops_and_the_callers_own() -> None:
    token = CancelToken()
    woke: list[str] = []
    ready = threading.Barrier(4)

    def other(name: str) -> None:
        async def wait() -> None:
            ready.wait(5)
            await asyncio.wait_for(token.wait(), 5)
            woke.append(name)

        asyncio.run(wait())

    threads = [threading.Thread(target=other, args=(f"loop-{i}",)) for i in range(3)]
    for t in threads:
        t.start()

    async def here() -> None:
        waiter = asyncio.create_task(token.wait())
        await asyncio.to_thread(ready.wait, 5)
        await asyncio.sleep(0.05)
        assert token.cancel("go") is True
        assert (await asyncio.wait_for(waiter, 5)).reason == "go"
        woke.append("caller")

    asyncio.run(here())
    for t in threads:
        t.join(5)
    assert sorted(woke) == ["caller", "loop-0", "loop-1", "loop-2"]
