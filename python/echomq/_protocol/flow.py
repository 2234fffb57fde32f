"""Flow control (issue 32): a queue's rate limit and its back-off, EMQ.LIMIT.

The server keeps both in ``<base>limit`` and every claim checks them
atomically (``module/emq_flow.c``): at most ``max`` jobs are handed out per
window of ``per_ms``, windows aligned to the server clock
(``[k * per_ms, (k + 1) * per_ms)``), and none before a back-off's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .calls import Call, keys_of

RATE_MAX = 1_000_000_000
"""The largest ``max`` a rate limit takes."""
PER_MAX_MS = 86_400_000
"""The longest window (and back-off) in ms: a day."""


@dataclass(frozen=True)
class RateLimit:
    """A queue's rate limit and back-off as the server saw them (EMQ.LIMIT's reply).

    ``max`` and ``per_ms`` are None when the queue has no rate limit; ``used``
    counts the jobs claimed in the current window, which ends at
    ``window_ends_at`` (server ms; None without a limit); ``backoff_until``
    is when claims start again after a back-off (server ms; None when none
    is in force).
    """

    max: int | None = None
    per_ms: int | None = None
    used: int = 0
    window_ends_at: int | None = None
    backoff_until: int | None = None


def _rate_limit(call: Call[RateLimit], reply: Any) -> RateLimit:
    mx, per, used, ends, until = (int(v) for v in reply)
    return RateLimit(mx or None, per or None, used, ends or None, until or None)


def _bounded(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low} to {high}, got {value}")
    return value


def limit(queue: str) -> Call[RateLimit]:
    """Read the queue's rate limit and back-off."""
    keys = keys_of(queue)
    return Call(("EMQ.LIMIT", keys.pending, keys.base), _rate_limit, queue)


def set_rate_limit(queue: str, max: int | None, per_ms: int | None = None) -> Call[RateLimit]:
    """Set the rate (``max`` jobs per ``per_ms``), or remove it (``max`` None)."""
    keys = keys_of(queue)
    if max is None:
        if per_ms is not None:
            raise ValueError("per_ms goes with max: set_rate_limit(queue, None) removes the limit")
        return Call(("EMQ.LIMIT", keys.pending, keys.base, "OFF"), _rate_limit, queue)
    if per_ms is None:
        raise TypeError("set_rate_limit needs per_ms (the window, in ms) with max")
    args = ("RATE", _bounded("max", max, 1, RATE_MAX), "PER", _bounded("per_ms", per_ms, 1, PER_MAX_MS))
    return Call(("EMQ.LIMIT", keys.pending, keys.base, *args), _rate_limit, queue)


def back_off(queue: str, ms: int) -> Call[RateLimit]:
    """Stop every claim of the queue for ``ms`` (server clock; never shortens one in force; 0 lifts it)."""
    keys = keys_of(queue)
    return Call(
        ("EMQ.LIMIT", keys.pending, keys.base, "BACKOFF", _bounded("ms", ms, 0, PER_MAX_MS)),
        _rate_limit,
        queue,
    )
