"""A worker process for the chaos test: ``python chaos_worker.py URL QUEUE LEASE_MS BACKEND``.

Poison jobs (payload b"poison") kill their whole process with SIGKILL, as a
segfaulting native library would.  Other jobs take a few milliseconds and
stop early at a check if their token is cancelled.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

import echomq


def main() -> None:
    url, queue, lease_ms, backend = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    client = echomq.Client.from_url(url, socket_timeout=5)
    assert client.backend == backend  # picked by the client itself

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        if job.payload == b"poison":
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in range(random.randint(1, 6)):
            cancel.raise_if_cancelled()
            time.sleep(0.005)

    worker = echomq.Worker(client, queue, handler, lease_ms=lease_ms, concurrency=2, poll_interval=0.02)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    worker.run()


if __name__ == "__main__":
    main()
