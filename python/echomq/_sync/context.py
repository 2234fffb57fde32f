"""What a handler gets: ``JobContext``, the job and everything it may do about its own run.

    def handler(ctx: echomq.JobContext) -> None:
        done = ctx.resume_point         # Progress(step=0, data={}) on a first attempt
        rows = done.data.get("rows", 0)
        for step in range(done.step, 40):
            rows += export_page(step)
            ctx.checkpoint_step(step + 1, {"rows": rows})   # extend the lease, store where we are

A job recovered after its holder died (or retried after a failure) is
handed the state of its last checkpoint: the next attempt goes on from
there instead of from step 1.  The asyncio twin is
``echomq.asyncio.JobContext`` (``await ctx.checkpoint_step(...)``).

Hand-written beside its twin ``asyncio/context.py``, not generated from it
(``tests/unasync.py``): a sync handler's checkpoints are calls from its own thread, an
asyncio handler's are awaited in the loop; the sync context carries the docs.
"""

from __future__ import annotations

from typing import Any

from .._protocol.deps import Parents, parents_key, parse_parents
from .._runtime import ContextCore, Progress, progress_bytes
from .lease import LeaseKeeper

__all__ = ["JobContext", "Progress"]


class JobContext(ContextCore[LeaseKeeper]):
    """The job a handler runs (``job``, and ``id``, ``queue``, ``payload``, ``token``, ``attempt``),
    its ``cancel`` token, the safe points, and where an earlier attempt left off.

    - ``checkpoint(state=None)``: extend the lease now (EMQ.CHECKPOINT,
      which also brings a cancel requested from anywhere), storing ``state``
      (bytes) on the job if given, then raise ``echomq.Cancelled`` if the
      job is cancelled.  The worker's lease keeper checkpoints on its own as
      well (without state); call this where the handler has made progress
      worth keeping.
    - ``resume_state``: the bytes of the last state stored by an earlier
      attempt of this job, handed back by this claim; None on a first
      attempt or when none was stored.
    - ``checkpoint_step(step, data)`` and ``resume_point``: the same for the
      common case of a step counter and a small JSON dict (``Progress``).
    - ``raise_if_cancelled()``, ``check()``, ``cancelled``: the token's, without a
      round trip.  Cancelled means: a remote cancel (``Client.cancel``), the
      lease was lost, or the worker is shutting down.
    """

    __slots__ = ()

    def checkpoint(self, state: bytes | None = None) -> bool:
        """Extend the lease now, storing ``state`` if given; raise ``Cancelled`` if the job is cancelled.

        With ``state`` (bytes, at most the server's ``emq.max-state-bytes``,
        64 KiB by default), the bytes are stored on the job in the same
        atomic step as the lease, fenced by this claim's token: once this
        attempt has lost the job (swept after its lease lapsed, or held by
        another attempt) its state is refused and never stored, and the
        handler's token is cancelled (so this raises ``Cancelled``).  The
        next claim of the job hands the last stored state back
        (``resume_state``).

        Returns True when the server confirmed the checkpoint (and stored
        the state).  False when it did not: connection trouble (the lease
        keeper retries the lease; the state is not sent again, the next
        checkpoint's supersedes it), or a server past maxmemory, which
        refuses to store state (the lease is extended without it at once).
        A state larger than the ceiling raises ``echomq.BadArgument``
        (a ValueError) and writes nothing.
        """
        stored = self._keeper._store(state)
        self.cancel.raise_if_cancelled()
        return stored

    def parents(self) -> Parents:
        """The job's dependencies (``client.enqueue(..., after=[...])``) and how each ended, in one read.

        A ``Parents``: a dict of id -> ``"done"``, ``"dead"``, ``"cancelled"``, ``"deleted"`` or
        ``"missing"``, with ``.failed`` (those that did not end done: a job runs with any only
        under ``on_parent_failure="ignore"`` or ``"continue"``).  Empty for a job enqueued
        without ``after`` (docs/concepts/workflows.md)."""
        job = self.job
        return parse_parents(self._keeper.client.redis.hgetall(parents_key(job.queue, job.id)))

    def checkpoint_step(self, step: int, data: dict[str, Any] | None = None) -> bool:
        """``checkpoint()`` storing ``Progress(step, data)`` as JSON; ``resume_point`` reads it back.

        ``step`` is an int >= 0, by convention the number of steps done;
        ``data`` a small JSON-serialisable dict (TypeError/ValueError before
        anything is sent if they are not).
        """
        return self.checkpoint(Progress(step, {} if data is None else data).encode())

    def progress(self, value: Any) -> None:
        """Store ``value`` (JSON) as the job's progress, which anyone may read while it runs.

        ``client.job(...).progress``, ``echomq job`` and the dashboard show
        it; the resume state (``checkpoint``) keeps its own meaning.  One
        EMQ.CHECKPOINT ... PROGRESS, fenced by this claim's token (a job
        this attempt has lost raises ``echomq.LeaseLost``); it extends the
        lease too.  ``TypeError`` (nothing sent) for what JSON cannot carry.
        """
        self._keeper._progress(progress_bytes(value))
