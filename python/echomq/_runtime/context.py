"""What a handler's ``JobContext`` shows in both drivers, and the ``Progress`` it resumes from."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

from .._protocol import Job
from ..cancel import Cancellation, CancelToken
from ..errors import RateLimited
from .args import check_int

KeeperT = TypeVar("KeeperT")


def progress_bytes(value: Any) -> bytes:
    """``ctx.progress(value)``'s bytes: compact JSON (TypeError naming the value if JSON cannot carry it)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"progress must be JSON-serialisable: {exc}") from None


@dataclass(frozen=True)
class Progress:
    """Where a job got to: a step counter and a small JSON dict (``JobContext.resume_point``).

    ``step`` is what the handler's last ``checkpoint_step(step, data)``
    stored (0 when nothing was: a first attempt); by convention the number
    of steps done, so a resumed handler goes on with step ``step``.
    ``data`` is the dict stored with it (JSON: str keys; values str, int,
    float, bool, None, lists and dicts of those).
    """

    step: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The checkpoint state: compact JSON ``{"step": <int>, "data": {...}}``, UTF-8."""
        check_int("step", self.step, 0)
        if not isinstance(self.data, dict):
            raise TypeError(f"data must be a dict, not {type(self.data).__name__}")
        body = {"step": self.step, "data": self.data}
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()

    @classmethod
    def decode(cls, state: bytes) -> Progress:
        """The Progress in ``state`` (what ``encode()`` made); ValueError for anything else."""
        try:
            body = json.loads(state)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        step = body.get("step") if isinstance(body, dict) else None
        data = body.get("data", {}) if isinstance(body, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or step < 0 or not isinstance(data, dict):
            raise ValueError(
                f"the job's resume_state is not a checkpoint_step() state: {bytes(state[:80])!r}"
            )
        return cls(step, data)


class ContextCore(Generic[KeeperT]):
    """What a handler's ``JobContext`` shows in both drivers: the job, its token, the safe points,
    and the state the job's last checkpoint stored (``resume_state``, ``resume_point``).

    The drivers add ``checkpoint(state=...)`` and ``checkpoint_step(step,
    data)`` (plain calls in threads, coroutines in asyncio).
    """

    __slots__ = ("_keeper", "cancel", "job")

    def __init__(self, job: Job, cancel: CancelToken, keeper: KeeperT) -> None:
        self.job = job
        self.cancel = cancel
        self._keeper = keeper

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def payload(self) -> bytes:
        return self.job.payload

    @property
    def token(self) -> str:
        """The fencing token of this claim."""
        return self.job.token

    @property
    def attempt(self) -> int:
        """This claim's number within the job's retry budget (1 on a first run)."""
        return self.job.attempt

    @property
    def resume_state(self) -> bytes | None:
        """The state the job's last checkpoint stored, handed back by this claim; None if none was.

        None on a first attempt.  On a later one (the job was recovered after
        its holder died, or failed and retried), the bytes of the last
        ``checkpoint(state=...)`` the server accepted from any earlier
        attempt.  It stays what this claim brought: this attempt's own
        checkpoints do not change it.
        """
        return self.job.resume_state

    @property
    def resume_point(self) -> Progress:
        """Where this attempt resumes: the step and data of the last ``checkpoint_step()``.

        ``Progress(step=0, data={})`` when no state was stored (a first
        attempt).  ValueError when the stored state is not one
        ``checkpoint_step()`` wrote (bytes stored with
        ``checkpoint(state=...)``: read ``resume_state`` instead).
        """
        state = self.job.resume_state
        return Progress() if state is None else Progress.decode(state)

    @property
    def cancelled(self) -> bool:
        """True once the job is cancelled: remote cancel, lease lost, or shutdown."""
        return self.cancel.cancelled

    def check(self) -> Cancellation | None:
        """None while running on is fine, else the Cancellation (O(1), never blocks)."""
        return self.cancel.check()

    def raise_if_cancelled(self) -> None:
        """A safe point: raise ``echomq.Cancelled(reason)`` if the job is cancelled."""
        self.cancel.raise_if_cancelled()

    def rate_limited(self, ms: int) -> NoReturn:
        """Give the job back and stop every worker's claims of the queue for ``ms`` (a 429).

        Raises ``RateLimited(ms)``: the worker releases the job without using
        a try and, in the same command, backs the queue off on the server
        clock (``EMQ.RELEASE ... BACKOFF``).  Raising it yourself does the same.
        """
        raise RateLimited(ms)

    def __repr__(self) -> str:
        return f"<JobContext {self.job.queue}/{self.job.id} attempt {self.job.attempt} {self.cancel!r}>"
