"""What an asyncio handler gets: ``JobContext``, as ``echomq.JobContext`` with awaited checkpoints.

Hand-written beside its twin ``_sync/context.py``, not generated from it
(``tests/unasync.py``): a sync handler's checkpoints are calls from its own thread, an
asyncio handler's are awaited in the loop; the sync context carries the docs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._protocol import Job
from .._protocol.deps import Parents, parents_key, parse_parents
from .._runtime import ContextCore, Progress, progress_bytes
from ..cancel import CancelToken
from .lease import LeaseKeeper

__all__ = ["AsyncHandler", "JobContext"]


class JobContext(ContextCore[LeaseKeeper]):
    """``echomq.JobContext`` for asyncio handlers: the same, with ``await ctx.checkpoint(...)``
    and ``await ctx.checkpoint_step(...)``; ``resume_state`` and ``resume_point`` are properties."""

    __slots__ = ()

    async def checkpoint(self, state: bytes | None = None) -> bool:
        """Extend the lease (storing ``state``); raise ``Cancelled`` if the job is cancelled.

        See ``echomq.JobContext.checkpoint``: True when the server confirmed it.
        """
        stored = await self._keeper._store(state)
        self.cancel.raise_if_cancelled()
        return stored

    async def parents(self) -> Parents:
        """The job's dependencies and how each ended, in one read (see ``echomq.JobContext.parents``)."""
        job = self.job
        reply = await self._keeper.client.redis.hgetall(parents_key(job.queue, job.id))
        return parse_parents(reply)

    async def checkpoint_step(self, step: int, data: dict[str, Any] | None = None) -> bool:
        """Store ``Progress(step, data)`` as the job's state (see ``echomq.JobContext.checkpoint_step``)."""
        return await self.checkpoint(Progress(step, {} if data is None else data).encode())

    async def progress(self, value: Any) -> None:
        """Store ``value`` (JSON) as the progress anyone may read (``echomq.JobContext.progress``)."""
        await self._keeper._progress(progress_bytes(value))


AsyncHandler = Callable[[JobContext], Awaitable[object]] | Callable[[Job, CancelToken], Awaitable[object]]
