"""Waiting in asyncio without a task per wait: an event with a timeout, an awaitable with a deadline."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["wait_event", "within"]

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds (None: no bound); True if it is set."""
    if event.is_set():
        return True
    try:
        if sys.version_info >= (3, 11):  # no task per wait, unlike wait_for before 3.12
            async with asyncio.timeout(timeout):
                await event.wait()
        else:
            await asyncio.wait_for(event.wait(), timeout=timeout)
    except asyncio.TimeoutError:
        return False
    return True


async def within(awaitable: Awaitable[T], timeout: float) -> T:
    """``await awaitable``, at most ``timeout`` seconds (else asyncio.TimeoutError)."""
    if sys.version_info >= (3, 11):  # no task per call, unlike wait_for before 3.12
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout=timeout)
