"""RQ contender: one SimpleWorker (no fork: the job runs in the worker process), burst mode.

Runs in bench/.venv-peers.  See protocol.py for the conversation with the harness.
"""

from __future__ import annotations

import time

from noop_tasks import noop
from protocol import Clock, emit, expect, parser, verdict
from redis import Redis
from rq import Queue, SimpleWorker
from rq.job import Job


class CountingWorker(SimpleWorker):
    """SimpleWorker that counts the jobs it finished (after RQ recorded the outcome)."""

    finished = 0

    def handle_job_success(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().handle_job_success(*args, **kwargs)
        self.finished += 1

    def handle_job_failure(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().handle_job_failure(*args, **kwargs)
        self.finished += 1


def main() -> None:
    a = parser(__doc__.splitlines()[0]).parse_args()
    try:
        conn = Redis.from_url(a.url)
        q = Queue(a.queue, connection=conn)
        t = time.perf_counter()
        ids = [f"j{i}" for i in range(a.n)]
        for k in range(0, a.n, 500):  # RQ's own bulk enqueue: one pipeline per 500 jobs
            q.enqueue_many([Queue.prepare_data(noop, job_id=job_id) for job_id in ids[k : k + 500]])
        emit("ready", enqueued=len(q), enqueue_s=time.perf_counter() - t)
        expect("go")
        clock = Clock()
        worker = CountingWorker(
            [Queue(a.queue, connection=Redis.from_url(a.url))], connection=Redis.from_url(a.url)
        )
        # Burst: work until the queue is empty, then return (no blocking dequeue at the end).
        worker.work(burst=True, max_jobs=a.n, logging_level="WARNING")
        emit("drained", elapsed_s=clock.elapsed(), processed=worker.finished, timed_out=worker.finished < a.n)
        expect("verify")
        statuses = [
            None if j is None else j.get_status(refresh=False).value for j in Job.fetch_many(ids, conn)
        ]
        out = verdict(statuses, "finished", ("failed", "stopped", "canceled"))
        out["registries"] = {
            "finished": q.finished_job_registry.count,
            "failed": q.failed_job_registry.count,
            "started": q.started_job_registry.count,
            "queued": len(q),
        }
        emit("verified", **out)
    except Exception as exc:
        emit("error", message=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main()
