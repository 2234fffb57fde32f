"""echomq for asyncio: the same client API over ``redis.asyncio``, and an async
lease keeper, reaper and worker.

    import echomq.asyncio as emq

    client = emq.Client.from_url("redis://localhost:6379/0")
    await client.enqueue("mail", b'{"to": "ada"}')

    async def handler(ctx: emq.JobContext) -> None:
        await send(ctx.payload)
        await ctx.checkpoint()               # extend the lease; raises Cancelled if cancelled
        ctx.raise_if_cancelled()             # O(1), as in sync code

    await emq.Worker(client, "mail", handler, concurrency=10).run()   # until SIGINT/SIGTERM or stop()

``CancelToken`` is the same class as in sync code: ``await token.wait()``
works from any event loop, and ``cancel()`` from any thread.  The drivers
follow the thread drivers' rules (``_runtime``): the same deadline watch
(a handler that blocks the loop still has its token cancelled at the
deadline), the same retries, the same shutdown.

One module per idea, as in the thread package: ``client`` (the commands),
``lease`` (the keeper), ``reaper``, ``worker``, ``context`` (what a
handler gets); ``_attempt`` (a worker's bounded tries), ``_together`` (ends
sent together), ``_pushes`` (pushed cancels), ``_waits``.
"""

from __future__ import annotations

from ..tasks.aio import AsyncApp as App
from ..tasks.dispatch import async_context as task_context
from .client import Client
from .context import AsyncHandler, JobContext
from .lease import LeaseKeeper
from .reaper import Reaper
from .worker import Worker

__all__ = ["App", "AsyncHandler", "Client", "JobContext", "LeaseKeeper", "Reaper", "Worker", "task_context"]
