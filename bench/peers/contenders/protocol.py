"""The line protocol between the harness and one contender process (stdlib only).

A contender is a subprocess with its own interpreter and environment (the
project's .venv for echomq, bench/.venv-peers for RQ, arq and saq, node for
BullMQ).  It speaks JSON lines on stdout, each prefixed with TAG so a
library's own prints cannot be mistaken for it, and reads one word per line
on stdin:

    contender                               harness
    ---------                               -------
    enqueues N jobs with its own API
    @@peers {"event": "ready", ...}    ->
                                            INFO (before)
                                       <-   go
    starts its worker, waits until N jobs
    have finished (its own in-process
    count, taken after the library's own
    finish call returned)
    @@peers {"event": "drained", ...}  ->
                                            INFO (after)
                                       <-   verify
    stops the worker, asks its own status
    API what became of every job
    @@peers {"event": "verified", ...} ->

"verified" carries {"done": n, "failed": n, "missing": n, "other": {status: n}}.
Any failure is reported as {"event": "error", "message": ...} before exit.

Several processes on one queue (bench/saturation.py; the echomq and BullMQ
contenders): `--enqueue M` enqueues M jobs instead of N (the first process
enqueues them all, the others none), and `--until-stop` drains until the
harness says `stop` (it watches the server's counts; no process can tell
alone when the shared queue is done) instead of until N finished here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

TAG = "@@peers "


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(TAG + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def expect(word: str) -> None:
    """Block until the harness says `word` (EOF means the harness is gone)."""
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(f"harness closed stdin while waiting for {word!r}")
    if line.strip() != word:
        raise SystemExit(f"expected {word!r} from the harness, got {line.strip()!r}")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--url", required=True, help="redis://host:port/0 of the contender's fresh server")
    p.add_argument("--n", type=int, required=True, help="jobs to enqueue and drain")
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--timeout", type=float, default=300.0, help="give up draining after this many seconds")
    p.add_argument("--queue", default="bench")
    p.add_argument("--enqueue", type=int, help="jobs to enqueue (default: N); N stays the queue's total")
    p.add_argument("--until-stop", action="store_true", help="drain until the harness says stop")
    return p


def verdict(statuses: list[str | None], done: str, failed: tuple[str, ...]) -> dict[str, Any]:
    """Count a list of per-job statuses (None: the status API does not know the job)."""
    out: dict[str, Any] = {"done": 0, "failed": 0, "missing": 0, "other": {}}
    for s in statuses:
        if s is None:
            out["missing"] += 1
        elif s == done:
            out["done"] += 1
        elif s in failed:
            out["failed"] += 1
        else:
            out["other"][s] = out["other"].get(s, 0) + 1
    return out


class Clock:
    """Elapsed seconds since `go`, as the contender itself saw them (the harness keeps its own)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0
