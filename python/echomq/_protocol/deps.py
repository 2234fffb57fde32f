"""Dependencies (issue 46): ENQUEUE's ``[ON_PARENT_FAILURE p] [MISSING done] AFTER <id> ...``.

``after_args`` checks ``after=``, ``on_parent_failure=`` and ``missing_ok=`` before anything
is sent; ``Parents`` is what ``ctx.parents()`` reads: each dependency of the running job and
how it ended (docs/concepts/workflows.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ..keyspace import queue_keys
from .calls import JobId, wire

OnParentFailure = Literal["fail", "ignore", "continue"]
"""What a dependency that ends dead, cancelled or deleted does to its waiter."""

MAX_AFTER = 1000
"""The most dependencies one job has (the server's ceiling)."""

POLICIES = ("fail", "ignore", "continue")
FAILED = frozenset({"dead", "cancelled", "deleted"})


def after_args(
    after: Iterable[JobId] | None, on_parent_failure: OnParentFailure | None, missing_ok: bool, job_id: bytes
) -> tuple[Any, ...]:
    """ENQUEUE's dependency options, last (AFTER takes the rest), checked as the server checks them."""
    if after is None:
        if on_parent_failure is not None or missing_ok:
            raise ValueError("on_parent_failure and missing_ok need after")
        return ()
    if isinstance(after, str | bytes):
        raise TypeError("after must be a list of job ids, not one id")
    ids = [wire(a, "after") for a in after]
    if not ids:
        raise ValueError("after must name at least one job")
    if len(ids) > MAX_AFTER:
        raise ValueError(f"after names at most {MAX_AFTER} jobs, got {len(ids)}")
    if job_id in ids:
        raise ValueError(f"job {job_id.decode('utf-8', 'surrogateescape')!r} cannot depend on itself")
    if not isinstance(missing_ok, bool):
        raise TypeError(f"missing_ok must be a bool, not {type(missing_ok).__name__}")
    args: tuple[Any, ...] = ()
    if on_parent_failure is not None:
        if on_parent_failure not in POLICIES:
            raise ValueError(
                f"on_parent_failure must be one of {', '.join(POLICIES)}, got {on_parent_failure!r}"
            )
        args += ("ON_PARENT_FAILURE", on_parent_failure)
    if missing_ok:
        args += ("MISSING", "done")
    return (*args, "AFTER", *ids)


class Parents(dict[str, str]):
    """A running job's dependencies: each id -> how it ended (``"done"``, ``"dead"``,
    ``"cancelled"``, ``"deleted"`` or ``"missing"``); empty for a job enqueued without ``after``.

    ``failed`` lists the ones that did not end done (a job runs with any only under
    ``on_parent_failure="ignore"`` or ``"continue"``)."""

    @property
    def failed(self) -> list[str]:
        return sorted(k for k, v in self.items() if v in FAILED)


def parents_key(queue: str, job_id: str) -> str:
    """What ``ctx.parents()`` reads, with one HGETALL: the job's ``<base>deps:<id>``."""
    return queue_keys(queue).base + "deps:" + job_id


def parse_parents(reply: Mapping[Any, Any] | list[Any]) -> Parents:
    def s(v: Any) -> str:
        return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v)

    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    return Parents({s(k): s(v) for k, v in reply.items()})
