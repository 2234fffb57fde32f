"""What a handler gets: ``JobContext``, the job and everything it may do about its own run.

    def handler(ctx: echomq.JobContext) -> None:
        for chunk in chunks(ctx.payload):
            process(chunk)
            ctx.checkpoint()        # extend the lease now; raises Cancelled if the job was cancelled

The asyncio twin is ``echomq.asyncio.JobContext`` (``await ctx.checkpoint()``).
"""

from __future__ import annotations

from ._runtime import ContextCore
from .lease import LeaseKeeper

__all__ = ["JobContext"]


class JobContext(ContextCore[LeaseKeeper]):
    """The job a handler runs (``job``, and ``id``, ``queue``, ``payload``, ``token``, ``attempt``),
    its ``cancel`` token, and the safe points.

    - ``checkpoint()``: extend the lease now (EMQ.CHECKPOINT, which also
      brings a cancel requested from anywhere), then raise
      ``echomq.Cancelled`` if the job is cancelled.  The worker's lease
      keeper checkpoints on its own as well; call this where the handler
      has made progress worth keeping the lease for.
    - ``raise_if_cancelled()``, ``check()``, ``cancelled``: the token's, without a
      round trip.  Cancelled means: a remote cancel (``Client.cancel``), the
      lease was lost, or the worker is shutting down.
    """

    __slots__ = ()

    def checkpoint(self) -> None:
        """Extend the lease now and deliver a remote cancel; raise ``Cancelled`` if the job is cancelled.

        Connection trouble is not raised here: the lease keeper retries, and
        if no checkpoint is confirmed before the lease ends the token is
        cancelled (``raise_if_cancelled`` then raises).
        """
        self._keeper.checkpoint()
        self.cancel.raise_if_cancelled()
