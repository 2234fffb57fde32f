"""One logging setup for the CLI and the workers: level and format, and the job on every line about one.

``configure_logging(level=None, format=None)`` sets up the root logger (once;
a second call replaces echomq's handler): ``level`` is a name (``debug``,
``info``, ``warning``, ``error``) or ``$ECHOMQ_LOG_LEVEL`` (default
``info``), ``format`` is ``text`` or ``json`` or ``$ECHOMQ_LOG_FORMAT``
(default ``text``).

Every record about a job carries its queue, id and attempt: the worker's
own lines pass them (``_runtime.job_fields``), and a line a handler logs
while the worker runs it (in its thread or task) gets them from
``CURRENT_JOB``, which the worker sets around the handler.  ``text``
shows them as ``[queue=mail job=42 attempt=2]``; ``json`` as fields.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextvars import ContextVar
from typing import Any, TextIO

from ._protocol import Job

__all__ = ["CURRENT_JOB", "LEVELS", "JobFilter", "configure_logging", "level_from"]

CURRENT_JOB: ContextVar[Job | None] = ContextVar("echomq_current_job", default=None)
LEVELS = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(echomq_where)s: %(message)s"


class JobFilter(logging.Filter):
    """Adds ``echomq_queue``, ``echomq_job``, ``echomq_attempt`` and ``echomq_where`` to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "echomq_job", None) is None:
            job = CURRENT_JOB.get()
            record.echomq_queue = job.queue if job else None
            record.echomq_job = job.id if job else None
            record.echomq_attempt = job.attempt if job else None
        job_id = record.echomq_job  # type: ignore[attr-defined]
        record.echomq_where = (
            ""
            if job_id is None
            else f" [queue={record.echomq_queue} job={job_id} attempt={record.echomq_attempt}]"  # type: ignore[attr-defined]
        )
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the job's fields when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "echomq_job", None) is not None:
            out.update(
                queue=record.echomq_queue,  # type: ignore[attr-defined]
                job=record.echomq_job,  # type: ignore[attr-defined]
                attempt=record.echomq_attempt,  # type: ignore[attr-defined]
            )
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def level_from(name: str | None) -> int:
    """A level name (or ``$ECHOMQ_LOG_LEVEL``, default info) as logging's number; ValueError if unknown."""
    value = (name or os.environ.get("ECHOMQ_LOG_LEVEL") or "info").strip().lower()
    if value not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {value!r}")
    return int(getattr(logging, value.upper()))


_HANDLER_NAME = "echomq"


def configure_logging(
    level: str | None = None, format: str | None = None, stream: TextIO | None = None
) -> None:
    """Set up the root logger for echomq's command line or a worker process (see the module docstring)."""
    number = level_from(level)
    style = (format or os.environ.get("ECHOMQ_LOG_FORMAT") or "text").strip().lower()
    if style not in ("text", "json"):
        raise ValueError(f"log format must be text or json, not {style!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(JobFilter())
    handler.setFormatter(JsonFormatter() if style == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(number)
