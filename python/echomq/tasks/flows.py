"""What ``app.enqueue_flow(...)`` returns: a handle on a whole workflow (``canvas.py``'s shapes).

``WorkflowHandle`` (threads) and ``AsyncWorkflowHandle`` (asyncio) hold the
workflow's queue and its jobs' ids, in order: ``state()`` reads each job,
``result(timeout)`` waits for the one whose result is the workflow's (a
group's: every member's, as a list), ``cancel()`` cancels every job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from .._result_wait import await_result, wait_result
from ..errors import JobGone, ResultTimeout
from .serializers import JSON, Serializer

if TYPE_CHECKING:
    from .._protocol import CancelOutcome, JobInfo
    from .._sync.client import Client
    from ..asyncio.client import Client as AsyncClient

__all__ = ["AsyncWorkflowHandle", "WorkflowHandle", "overall_state"]

R = TypeVar("R")

FAILED_BY_PARENT = "dependency "
"""How ``last_error`` starts for a job that a parent's failure ended (its policy ``fail``)."""


def overall_state(states: Sequence[str | None]) -> str:
    """A workflow's state from its jobs' (None: a row gone past its retention).

    ``"failed"`` once any job is dead, ``"cancelled"`` once any is
    cancelled (and none dead), ``"done"`` when every job is, ``"running"``
    while one is active, else ``"pending"`` (waiting for a parent, pending
    or delayed); ``"gone"`` when no job has a row.
    """
    known = [s for s in states if s is not None]
    if not known:
        return "gone"
    if "dead" in known:
        return "failed"
    if "cancelled" in known:
        return "cancelled"
    if all(s == "done" for s in known):
        return "done"
    return "running" if "active" in known else "pending"


def _root_cause(infos: Sequence[JobInfo | None]) -> int | None:
    """The first job, in order, that ended dead or cancelled on its own (not by a parent's end)."""
    for i, info in enumerate(infos):
        if info is None or info.state not in ("dead", "cancelled"):
            continue
        if info.state == "dead" and (info.last_error or "").startswith(FAILED_BY_PARENT):
            continue
        return i
    return None


def _left(deadline: float | None, queue: str, job_id: str, timeout: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise ResultTimeout(queue, job_id, timeout if timeout is not None else 0.0)
    return left


class _Workflow:
    __slots__ = ("_serializer", "final", "id", "job_ids", "queue")

    def __init__(
        self, queue: str, workflow_id: str, job_ids: list[str], final: int | None, serializer: Serializer
    ) -> None:
        self.queue, self.id, self.job_ids, self.final = queue, workflow_id, job_ids, final
        self._serializer = serializer

    def __repr__(self) -> str:
        return f"{type(self).__name__}(queue={self.queue!r}, id={self.id!r}, jobs={len(self.job_ids)})"


class WorkflowHandle(_Workflow, Generic[R]):
    """A chain, group or chord enqueued: ``id``, ``queue``, ``job_ids`` (in order); ``R``: its result's type.

    ``state()``, ``result(timeout)``, ``cancel()``.
    """

    __slots__ = ("_client",)

    def __init__(
        self,
        client: Client,
        queue: str,
        workflow_id: str,
        job_ids: list[str],
        final: int | None,
        serializer: Serializer = JSON,
    ) -> None:
        super().__init__(queue, workflow_id, job_ids, final, serializer)
        self._client = client

    def jobs(self) -> list[JobInfo | None]:
        """Each job's status now (``client.job``), in the workflow's order (None: its row is gone)."""
        return [self._client.job(self.queue, job_id) for job_id in self.job_ids]

    def state(self) -> str:
        """``"pending"``, ``"running"``, ``"done"``, ``"failed"``, ``"cancelled"`` (``overall_state``)."""
        return overall_state([None if info is None else info.state for info in self.jobs()])

    def result(self, timeout: float | None = None) -> R:
        """Wait for the workflow's end and return its result: the last step's, the callback's, a group's list.

        A workflow that failed raises the failure of the job where it
        started (``echomq.JobFailed`` with that job's type, message and
        traceback; ``echomq.JobCancelled`` for a cancel), not the
        ``dependency ... dead`` of the steps it ended;
        ``echomq.ResultTimeout`` once ``timeout`` seconds pass.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        waited = self.job_ids if self.final is None else [self.job_ids[self.final]]
        values: list[Any] = []
        try:
            for job_id in waited:
                left = _left(deadline, self.queue, job_id, timeout)
                values.append(wait_result(self._client, self.queue, job_id, left, self._serializer))
        except ResultTimeout:
            raise
        except Exception:
            root = _root_cause(self.jobs())
            if root is not None:  # its own failure (it has ended: the read raises it at once)
                wait_result(self._client, self.queue, self.job_ids[root], 5.0, self._serializer)
            raise
        return cast("R", values if self.final is None else values[0])

    def cancel(self, reason: str | None = None) -> dict[str, CancelOutcome]:
        """Cancel every job of the workflow, the last first (what waits ends cancelled, not dead).

        A dict of id -> ``client.cancel``'s outcome (``"finished"`` for one
        that had ended; a row gone is left out).
        """
        outcomes: dict[str, CancelOutcome] = {}
        for job_id in reversed(self.job_ids):
            try:
                outcomes[job_id] = self._client.cancel(self.queue, job_id, reason)
            except JobGone:
                continue
        return outcomes


class AsyncWorkflowHandle(_Workflow, Generic[R]):
    """``WorkflowHandle`` for asyncio: ``await handle.result(timeout=...)``, ``await handle.cancel()``."""

    __slots__ = ("_client",)

    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        workflow_id: str,
        job_ids: list[str],
        final: int | None,
        serializer: Serializer = JSON,
    ) -> None:
        super().__init__(queue, workflow_id, job_ids, final, serializer)
        self._client = client

    async def jobs(self) -> list[JobInfo | None]:
        """Each job's status now, in the workflow's order (see ``WorkflowHandle.jobs``)."""
        return [await self._client.job(self.queue, job_id) for job_id in self.job_ids]

    async def state(self) -> str:
        """The workflow's state (see ``WorkflowHandle.state``)."""
        return overall_state([None if info is None else info.state for info in await self.jobs()])

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the workflow's end and return its result (see ``WorkflowHandle.result``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waited = self.job_ids if self.final is None else [self.job_ids[self.final]]
        values: list[Any] = []
        try:
            for job_id in waited:
                left = _left(deadline, self.queue, job_id, timeout)
                values.append(await await_result(self._client, self.queue, job_id, left, self._serializer))
        except ResultTimeout:
            raise
        except Exception:
            root = _root_cause(await self.jobs())
            if root is not None:
                await await_result(self._client, self.queue, self.job_ids[root], 5.0, self._serializer)
            raise
        return cast("R", values if self.final is None else values[0])

    async def cancel(self, reason: str | None = None) -> dict[str, CancelOutcome]:
        """Cancel every job of the workflow, the last first (see ``WorkflowHandle.cancel``)."""
        outcomes: dict[str, CancelOutcome] = {}
        for job_id in reversed(self.job_ids):
            try:
                outcomes[job_id] = await self._client.cancel(self.queue, job_id, reason)
            except JobGone:
                continue
        return outcomes
