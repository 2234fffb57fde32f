"""A worker process for the chaos test: ``python chaos_worker.py URL QUEUE LEASE_MS BACKEND HISTORY``.

Poison jobs (payload b"poison") kill their whole process with SIGKILL, as a
segfaulting native library would.  Other jobs run ``STEPS`` short steps from
where their last checkpoint left off (``ctx.resume_point``), storing each
step with ``ctx.checkpoint_step(step, {"token": <this claim's token>})``, and
stop early at a check if their token is cancelled.

Every run appends to HISTORY (JSON lines, line-buffered so a SIGKILL loses at
most the line being written): ``start`` (job, token, the step and writer token
it resumed from), ``confirmed`` (job, token, step) for each checkpoint the
server confirmed, and ``unconfirmed`` for one it did not (or whose lease was
lost meanwhile).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import echomq

STEPS = 6


def main() -> None:
    url, queue, lease_ms, backend, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    client = echomq.Client.from_url(url, socket_timeout=5)
    assert client.backend == backend  # picked by the client itself
    history = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    lock = threading.Lock()

    def write(**event: Any) -> None:
        with lock:
            history.write(json.dumps(event) + "\n")

    def handler(ctx: echomq.JobContext) -> None:
        if ctx.payload == b"poison":
            os.kill(os.getpid(), signal.SIGKILL)
        done = ctx.resume_point
        write(event="start", job=ctx.id, token=ctx.token, step=done.step, writer=done.data.get("token"))
        for step in range(done.step + 1, STEPS + 1):
            ctx.raise_if_cancelled()
            time.sleep(random.uniform(0.01, 0.03))  # long enough that kills and freezes land mid-job
            try:
                stored = ctx.checkpoint_step(step, {"token": ctx.token})
            except echomq.Cancelled as exc:  # the lease is lost: this state may have been refused
                write(event="unconfirmed", job=ctx.id, token=ctx.token, step=step, reason=exc.reason)
                raise
            if stored:
                write(event="confirmed", job=ctx.id, token=ctx.token, step=step)
            else:
                write(event="unconfirmed", job=ctx.id, token=ctx.token, step=step, reason=None)

    worker = echomq.Worker(client, queue, handler, lease_ms=lease_ms, concurrency=2, poll_interval=0.02)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    worker.run()


if __name__ == "__main__":
    main()
