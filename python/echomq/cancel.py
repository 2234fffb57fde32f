"""The cooperative cancel token.

A cancel is a message, not a kill: ``cancel()`` may be called from any thread
and interrupts nothing.  The handler looks at the token at points where it is
safe to stop.  Unlike the seed's Elixir mailbox, a cancel here is sticky:
every later check sees it, and the first reason is kept.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from .errors import Cancelled

__all__ = ["CancelToken", "Cancellation"]


@dataclass(frozen=True)
class Cancellation:
    """What ``CancelToken.check()`` returns once the token is cancelled."""

    reason: str | None = None

    def __bool__(self) -> bool:
        # Truthy even when the reason is None: `if token.check():` must work.
        return True


class CancelToken:
    """One cancellation, shared between whoever cancels and the handler.

    >>> token = CancelToken()
    >>> token.check() is None
    True
    >>> token.cancel("shutdown")
    True
    >>> token.check().reason
    'shutdown'
    """

    __slots__ = ("_cancellation", "_event", "_lock", "_waiters")

    def __init__(self) -> None:
        self._cancellation: Cancellation | None = None
        self._lock = threading.Lock()
        # Made by the first sleep(): a worker makes a token per job, and most are never slept on.
        self._event: threading.Event | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Cancellation]]] = []

    def cancel(self, reason: str | None = None) -> bool:
        """Cancel the token; safe from any thread, never raises.

        Wakes every ``wait()`` in progress, on whatever event loop it runs
        (waiters on a loop that has been closed are skipped).  Returns True
        if this call cancelled it, False if it already was (the first reason
        is kept).
        """
        with self._lock:
            if self._cancellation is not None:
                return False
            cancellation = self._cancellation = Cancellation(reason)
            waiters, self._waiters = self._waiters, []
            event = self._event
        if event is not None:
            event.set()
        for loop, future in waiters:  # awaiting tasks may live on other threads' loops
            # A waiter whose loop was closed (its task will never run again)
            # must neither make cancel() raise nor keep the waiters after it
            # asleep: skip it.
            if loop.is_closed():
                continue
            try:
                loop.call_soon_threadsafe(_resolve, future, cancellation)
            except RuntimeError:  # closed between the check and the call
                continue
        return True

    def check(self) -> Cancellation | None:
        """``None`` while running on is fine, else the Cancellation.  O(1), never blocks."""
        # A single attribute read: no lock on the path handlers call in loops.
        return self._cancellation

    @property
    def cancelled(self) -> bool:
        """True once the token is cancelled."""
        return self._cancellation is not None

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled(reason)`` if the token is cancelled, else return."""
        cancellation = self._cancellation
        if cancellation is not None:
            raise Cancelled(cancellation.reason)

    def sleep(self, seconds: float) -> Cancellation | None:
        """Sleep up to ``seconds``, waking early on cancel; returns what ``check()`` would."""
        event = self._event
        if event is None:
            with self._lock:
                if self._event is None:
                    self._event = threading.Event()
                    if self._cancellation is not None:
                        self._event.set()
                event = self._event
        event.wait(seconds)
        return self._cancellation

    async def wait(self) -> Cancellation:
        """Wait (asynchronously) until the token is cancelled; returns the Cancellation."""
        cancellation = self._cancellation
        if cancellation is not None:
            return cancellation
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Cancellation] = loop.create_future()
        with self._lock:
            if self._cancellation is not None:
                return self._cancellation
            self._waiters.append((loop, future))
        try:
            return await future
        finally:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))

    def __repr__(self) -> str:
        c = self._cancellation
        return "<CancelToken running>" if c is None else f"<CancelToken cancelled reason={c.reason!r}>"


def _resolve(future: asyncio.Future[Cancellation], cancellation: Cancellation) -> None:
    if not future.done():
        future.set_result(cancellation)
