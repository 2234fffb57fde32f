"""Unique jobs (issue 31): ENQUEUE's ``UNIQUE <key> [FOR <ms> | UNTIL done] [REPLACE]``.

``unique_args`` checks ``unique_key=``, ``unique_for_ms=`` and ``replace=``
before anything is sent; ``Enqueued`` is what every enqueue answers: the id,
and whether the call made that job (docs/concepts/unique.md).
"""

from __future__ import annotations

from typing import Any

UNIQUE_KEY_MAX = 512
"""The longest UNIQUE key, in bytes (the server's ceiling)."""

UNIQUE_FOR_MAX_MS = 2_592_000_000
"""The longest FOR window: 30 days, in ms (the server's ceiling)."""


class Enqueued(str):
    """The id of the job an enqueue answered (a ``str``), and what the call did.

    ``created`` is True when this call added the job; False when a job
    holding the call's ``unique_key`` exists, whose id this is (nothing was
    added).  ``replaced`` is True when that holder was still pending and
    ``replace=True`` gave it this call's payload.  Without ``unique_key``
    an enqueue either creates its job or raises, so ``created`` is True.
    """

    created: bool
    replaced: bool

    def __new__(cls, job_id: str, created: bool = True, replaced: bool = False) -> Enqueued:
        self = super().__new__(cls, job_id)
        self.created = created
        self.replaced = replaced
        return self

    @property
    def id(self) -> str:
        """The job's id as a plain ``str``."""
        return str(self)

    def __repr__(self) -> str:
        # The id's own repr: an id formatted with !r (a log line, an error, a test's selector)
        # is the id, whatever call returned it; .created and .replaced say the rest.
        return repr(str(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Enqueued, (str(self), self.created, self.replaced))


def unique_args(unique_key: str | bytes | None, unique_for_ms: int | None, replace: bool) -> tuple[Any, ...]:
    """ENQUEUE's UNIQUE options, each checked as the server checks it (ValueError, TypeError)."""
    if unique_key is None:
        if unique_for_ms is not None or replace:
            raise ValueError("unique_for_ms and replace need unique_key")
        return ()
    if isinstance(unique_key, str):
        key = unique_key.encode("utf-8", "surrogateescape")
    elif isinstance(unique_key, bytes):
        key = unique_key
    else:
        raise TypeError(f"unique_key must be str or bytes, not {type(unique_key).__name__}")
    if not 1 <= len(key) <= UNIQUE_KEY_MAX:
        raise ValueError(f"unique_key must be 1 to {UNIQUE_KEY_MAX} bytes long, got {len(key)}")
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be a bool, not {type(replace).__name__}")
    args: tuple[Any, ...] = ("UNIQUE", key)
    if unique_for_ms is not None:
        if isinstance(unique_for_ms, bool) or not isinstance(unique_for_ms, int):
            raise TypeError(f"unique_for_ms must be an int, not {type(unique_for_ms).__name__}")
        if not 1 <= unique_for_ms <= UNIQUE_FOR_MAX_MS:
            raise ValueError(
                f"unique_for_ms must be from 1 to {UNIQUE_FOR_MAX_MS} (30 days): {unique_for_ms}"
            )
        args += ("FOR", unique_for_ms)
    if replace:
        args += ("REPLACE",)
    return args


def enqueued(job_id: str, reply: Any) -> Enqueued:
    """ENQUEUE's reply: ``:1`` (no UNIQUE), or ``[code, id]`` (1 created, 0 held, 2 replaced)."""
    if isinstance(reply, list | tuple):
        code, holder = int(reply[0]), reply[1]
        name = holder.decode("utf-8", "surrogateescape") if isinstance(holder, bytes) else str(holder)
        return Enqueued(name, created=code == 1, replaced=code == 2)
    return Enqueued(job_id)
