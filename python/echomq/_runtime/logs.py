"""The runtime's loggers, and the fields that tie a log line to its job."""

from __future__ import annotations

import logging

from .._protocol import Job

lease_log = logging.getLogger("echomq.lease")
reaper_log = logging.getLogger("echomq.reaper")
worker_log = logging.getLogger("echomq.worker")


def job_fields(job: Job) -> dict[str, object]:
    """``extra=`` for a log line about ``job``: echomq's log format shows queue, job and attempt."""
    return {"echomq_queue": job.queue, "echomq_job": job.id, "echomq_attempt": job.attempt}
