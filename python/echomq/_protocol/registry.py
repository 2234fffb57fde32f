"""The queue registry's index, without I/O (docs/concepts/registry.md).

Two keys keep it.  The marker ``emq:{Q}:queue`` in the queue's own slot is the record of
truth: ENQUEUE and ENQUEUEMANY make it in their atomic step when it is absent, the
OBLITERATE step that empties the queue deletes it (module/emq_registry.h and its Lua twin).
The set ``emq:queues`` is the index readers use without a keyspace SCAN: the clients add a
queue's name after an enqueue (``SADD``, idempotent) and take it out after an obliterate.
A verb cannot write it: in a Redis Cluster it is one key in one slot, which a verb of another
slot may not touch, and a verb writes no key its key specs do not declare.

The index holds the empty name (never a queue's: ``queue_keys`` refuses it) once a reader has
filled it from the markers and lanes of every primary.  A reader that does not find it
(an upgrade from a version without the registry, a producer that could not write the set)
scans once and fills it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "REGISTER_EVERY_S",
    "REGISTRY_FILLED",
    "REGISTRY_KEY",
    "Registrations",
    "fill_registry",
    "register",
    "registry_page",
    "registry_reply",
    "unregister",
]

REGISTRY_KEY = "emq:queues"
REGISTRY_FILLED = ""
"""The member that says the index was filled from a scan of the keyspace (no queue has this name)."""
REGISTER_EVERY_S = 60.0
"""A client registers a queue again after this long: a queue obliterated by another process and
made again is back in the index within a minute of its next enqueue, at one SADD a minute."""
_MAX_REMEMBERED = 10_000


class Registrations:
    """The queues this client registered lately, by ``time.monotonic()``: one SADD per queue a minute."""

    def __init__(self, every_s: float = REGISTER_EVERY_S) -> None:
        self._every = every_s
        self._at: dict[str, float] = {}

    def due(self, queue: str, now: float) -> bool:
        """Whether an enqueue to ``queue`` at ``now`` should send ``register(queue)``."""
        at = self._at.get(queue)
        return at is None or now - at >= self._every

    def done(self, queue: str, now: float) -> None:
        """The SADD of ``queue`` was answered."""
        if len(self._at) >= _MAX_REMEMBERED:  # many short-lived queues: forget, register again
            self._at.clear()
        self._at[queue] = now

    def forget(self, queue: str) -> None:
        """``queue`` was obliterated: its next enqueue registers it again."""
        self._at.pop(queue, None)


def register(queue: str) -> tuple[Any, ...]:
    return ("SADD", REGISTRY_KEY, queue)


def unregister(queue: str) -> tuple[Any, ...]:
    return ("SREM", REGISTRY_KEY, queue)


def registry_page(cursor: int, count: int) -> tuple[Any, ...]:
    return ("SSCAN", REGISTRY_KEY, cursor, "COUNT", count)


def fill_registry(queues: list[str]) -> tuple[Any, ...]:
    """The SADD that fills the index with the queues a scan found, and says it was filled."""
    return ("SADD", REGISTRY_KEY, REGISTRY_FILLED, *queues)


def registry_reply(reply: Any) -> tuple[int, list[str]]:
    """An SSCAN reply of the index: the next cursor and the queue names (not the filled mark)."""
    cursor, members = reply
    names = (m.decode() if isinstance(m, bytes) else str(m) for m in members)
    return int(cursor), [name for name in names if name != REGISTRY_FILLED]
