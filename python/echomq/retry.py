"""How a failed job is retried: a value, no I/O.

    policy = echomq.RetryPolicy.exponential(base_ms=1_000, max_ms=60_000, max_attempts=5, jitter=0.5)
    if policy.retries(job.attempt):
        client.fail(queue, job.id, job.token, error, max_attempts=policy.max_attempts,
                    delay_ms=policy.delay_ms(job.attempt))

``attempt`` is the attempt that just failed, counted as ``Job.attempt`` is
(1 for a job's first run; the server counts it in the row's ``tries``).
The server decides where the job goes (EMQ.FAIL ... <max-attempts> [DELAY
<ms>]): back to pending, claimable again after the delay, or dead at
``max_attempts``; the policy only supplies the two numbers.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["RetryPolicy"]

Backoff = Literal["fixed", "exponential"]


class _Default(int):
    """A ``max_attempts`` nobody gave: the policy's default, which a ``max_attempts=`` beside it overrides."""

    __slots__ = ()

    def __repr__(self) -> str:
        return int.__repr__(self)


def given_attempts(policy: RetryPolicy) -> bool:
    """Whether ``policy.max_attempts`` was given by its maker (not a constructor's default)."""
    return not isinstance(policy.max_attempts, _Default)


def merge_attempts(max_attempts: int | None, retry: RetryPolicy) -> RetryPolicy:
    """``retry`` with an explicit ``max_attempts`` beside it: that number, unless the policy gave another.

    A policy's own default (``RetryPolicy()``'s 3, ``exponential()``'s 5)
    is not a choice, so ``max_attempts=4, retry=RetryPolicy(backoff=...)``
    means 4 tries with the policy's delays; two different numbers both
    given are refused (``ValueError``: which one was meant cannot be told).
    """
    if max_attempts is None or (max_attempts == retry.max_attempts and given_attempts(retry)):
        return retry
    if given_attempts(retry):
        raise ValueError(
            f"max_attempts={max_attempts} and retry's max_attempts={retry.max_attempts}: give one"
        )
    return dataclasses.replace(retry, max_attempts=max_attempts)


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """A retry budget and the wait before each retry.

    - ``max_attempts``: runs of a job in all (1 = never retried); at that many
      failures the job is dead-lettered.  Left at its default, a worker's or
      a task's own ``max_attempts=`` beside the policy sets it instead.
    - ``backoff``: ``"fixed"`` waits ``base_ms`` before every retry;
      ``"exponential"`` waits ``base_ms * factor ** (attempt - 1)``, at most
      ``max_ms`` (which only the exponential backoff reads).
    - ``jitter``: a fraction in [0, 1]; the wait is drawn uniformly from
      ``[wait * (1 - jitter), wait]``, so workers that failed together do not
      retry together.

    Build one with ``RetryPolicy.fixed(...)`` or ``RetryPolicy.exponential(...)``.
    """

    max_attempts: int = _Default(3)
    backoff: Backoff = "exponential"
    base_ms: int = 1_000
    max_ms: int = 3_600_000
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        _int("max_attempts", self.max_attempts, 1)
        _int("base_ms", self.base_ms, 0)
        _int("max_ms", self.max_ms, 0)
        if self.backoff not in ("fixed", "exponential"):
            raise ValueError(f"backoff must be 'fixed' or 'exponential', got {self.backoff!r}")
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float):
            raise TypeError(f"factor must be a number, not {type(self.factor).__name__}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"factor must be a finite number >= 1, got {self.factor}")
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, int | float):
            raise TypeError(f"jitter must be a number, not {type(self.jitter).__name__}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be between 0 and 1, got {self.jitter}")

    @classmethod
    def fixed(cls, delay_ms: int, *, max_attempts: int = _Default(3), jitter: float = 0.0) -> RetryPolicy:
        """Wait ``delay_ms`` before every retry."""
        return cls(max_attempts=max_attempts, backoff="fixed", base_ms=delay_ms, jitter=jitter)

    @classmethod
    def exponential(
        cls,
        base_ms: int = 1_000,
        *,
        factor: float = 2.0,
        max_ms: int = 3_600_000,
        max_attempts: int = _Default(5),
        jitter: float = 0.5,
    ) -> RetryPolicy:
        """Wait ``base_ms``, then ``factor`` times longer before each further retry, at most ``max_ms``."""
        return cls(
            max_attempts=max_attempts,
            backoff="exponential",
            base_ms=base_ms,
            max_ms=max_ms,
            factor=factor,
            jitter=jitter,
        )

    def retries(self, attempt: int) -> bool:
        """True when a failure of run ``attempt`` is retried (it is below ``max_attempts``)."""
        return _int("attempt", attempt, 1) < self.max_attempts

    def delay_ms(self, attempt: int, rand: Callable[[], float] = random.random) -> int:
        """The wait before retrying a job whose run ``attempt`` (1 = its first) failed.

        ``rand`` draws the jitter (a float in [0, 1)); pass a seeded
        generator's ``random`` for a reproducible wait.
        """
        _int("attempt", attempt, 1)
        if self.backoff == "fixed":
            wait = float(self.base_ms)
        else:
            try:
                wait = self.base_ms * self.factor ** (attempt - 1)
            except OverflowError:
                wait = math.inf
            wait = min(wait, float(self.max_ms))
        if self.jitter:
            wait -= wait * self.jitter * rand()
        return int(wait)
