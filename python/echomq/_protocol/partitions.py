"""A partitioned queue's rules, without I/O: its declaration, its partitions' names, and which
partition a job, an id or a claim goes to (docs/concepts/partitions.md).

A queue declared with ``partitions=K`` is K ordinary queues, each in a slot of its own, so each
keeps every guarantee a queue has; what the clients add is only the routing done here:

- **The declaration** is one string key in the logical queue's own slot,
  ``emq:{Q}:partitions`` = K, written once (``SET ... NX GET``): every client and
  worker reads the same K, and another K is refused (``PartitionsChanged``).
- **The names.** Partition i is the queue ``Q#i.n``, n the smallest number from 0 up
  that puts its hash slot in the i-th of K equal ranges of the 16,384 slots.  The
  plain ``Q#i`` does not spread: CRC16 of names differing in their last digit
  falls in a few slot ranges (``ingest#0`` .. ``ingest#8`` put 5 of 9 on the first
  of 3 masters); ranges of slots do, since a cluster's masters serve ranges
  (``redis-cli --cluster create`` gives 3 masters a third of the slots each: K = 9
  puts 3 partitions on each).
- **The ids.** Every job of a partitioned queue has an id ``<i>~<rest>``: the
  partition is read from the id, so ``cancel``, ``result`` and ``job`` of that id
  on the logical queue take one round trip.
- **Routing a job**: by ``partition_key``, else its group (a group lives in one
  partition: its caps stay exact), else its unique key (at most one holder in the
  queue), else the id the caller gave (the same id always meets itself:
  ``JobExists``), each by CRC32 mod K; else round-robin per client, from a random
  start (an exact spread for one producer, no coordination between many).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from redis.crc import key_slot

from ..errors import PartitionsChanged
from ..keyspace import queue_keys
from .calls import JobId, new_id, positive_int, text, wire
from .flow import RateLimit

MAX_PARTITIONS = 1024
"""The most partitions a queue may be declared with (each is a queue and a slot of its own)."""

SLOTS = 16384
ID_MARK = "~"
"""Between a job id's partition number and the rest: ``3~18c9...``."""


def declaration_key(queue: str) -> str:
    """The key that holds ``queue``'s partition count (absent: not declared), in its own slot."""
    return queue_keys(queue).base + "partitions"


def check_partitions(value: object) -> int:
    return positive_int("partitions", value, MAX_PARTITIONS)


def check_logical(queue: object) -> str:
    """A logical queue name: a queue name without ``#`` (that names its partitions)."""
    keys = queue_keys(queue)  # type: ignore[arg-type]  # its TypeError/ValueError name the queue
    if "#" in keys.queue:
        raise ValueError(
            f"queue name {keys.queue!r} must not contain '#' to be partitioned (it names partitions)"
        )
    return keys.queue


def declaration(queue: str, partitions: int) -> tuple[str, int]:
    """The declaration's write (``SET <key> <count> NX GET``): the count unless one is there; the
    reply is the count there before."""
    return declaration_key(queue), partitions


def read_args(queue: str) -> tuple[Any, ...]:
    return ("GET", declaration_key(queue))


def declared(reply: object) -> int | None:
    """The count a GET (or the declaration's SET ... GET) read: None when the queue is not declared."""
    if reply is None:
        return None
    return int(text(reply))  # type: ignore[arg-type]


def check_declared(queue: str, before: int | None, asked: int) -> None:
    """Declaring again: the same count is a no-op, another one ``PartitionsChanged``."""
    if before is not None and before != asked:
        raise PartitionsChanged(
            f"queue {queue!r} is declared with {before} partitions, not {asked}: the count changes only "
            "by a migration (docs/concepts/partitions.md)",
            queue,
            before,
            asked,
        )


@lru_cache(maxsize=256)
def partition_names(queue: str, partitions: int) -> tuple[str, ...]:
    """The names of ``queue``'s partitions, the i-th in the i-th range of slots (module docstring)."""
    names = []
    for i in range(partitions):
        low, high = i * SLOTS // partitions, (i + 1) * SLOTS // partitions
        n = 0
        while not low <= key_slot(f"{queue}#{i}.{n}".encode()) < high:
            n += 1
        names.append(f"{queue}#{i}.{n}")
    return tuple(names)


def _index(value: bytes, partitions: int) -> int:
    return zlib.crc32(value) % partitions


@dataclass
class Partitioned:
    """A declared queue as one client routes to it: its K partitions and the round-robin's turn."""

    queue: str
    partitions: int
    names: tuple[str, ...] = ()
    _turn: int = field(default=-1, repr=False)

    def __post_init__(self) -> None:
        self.names = partition_names(self.queue, self.partitions)
        self._turn = random.randrange(self.partitions)

    def next_index(self) -> int:
        self._turn = (self._turn + 1) % self.partitions
        return self._turn

    def route(
        self,
        partition_key: str | bytes | None,
        group: str | None,
        unique_key: str | bytes | None,
        job_id: JobId | None,
    ) -> int:
        """The partition of one job (the order of the module docstring)."""
        for name, value in (
            ("partition_key", partition_key),
            ("group", group),
            ("unique_key", unique_key),
            ("job_id", job_id),
        ):
            if value is not None:
                return _index(wire(value, name), self.partitions)
        return self.next_index()

    def job_id(self, index: int, given: JobId | None) -> bytes:
        """The id a job of partition ``index`` is stored under: ``<index>~`` and the given id or a new one."""
        rest = new_id() if given is None else wire(given)
        return f"{index}{ID_MARK}".encode() + rest

    def index_of_id(self, job_id: JobId) -> int:
        """The partition an id of this queue names; ValueError for an id no partition of it gives."""
        data = wire(job_id)
        head, mark, _ = data.partition(ID_MARK.encode())
        if mark and head.isdigit() and (head == b"0" or not head.startswith(b"0")):
            index = int(head)
            if index < self.partitions:
                return index
        raise ValueError(
            f"job_id {text(data)!r} is not an id of the partitioned queue {self.queue!r} "
            f"(its ids are '<partition>{ID_MARK}...', partition below {self.partitions})"
        )

    def partition_of_id(self, job_id: JobId) -> str:
        return self.names[self.index_of_id(job_id)]

    def route_after(self, after: Iterable[JobId], chosen: int | None) -> int:
        """The partition of a job that waits for ``after``: theirs, which must be one.

        A dependency resolves within its queue (docs/concepts/workflows.md), so a
        job and what it waits for share a partition: ValueError for ids of two
        partitions, or of another than ``partition_key``/``group`` chose.
        """
        indexes = {self.index_of_id(job_id) for job_id in after}
        if chosen is not None:
            indexes.add(chosen)
        if len(indexes) != 1:
            raise ValueError(
                f"after= on the partitioned queue {self.queue!r}: a job and the jobs it waits for "
                f"must be in one partition (these name partitions {sorted(indexes)})"
            )
        return indexes.pop()


def rate_shares(max: int | None, partitions: int) -> list[int | None]:
    """A queue-wide rate limit as each partition's share: ``max`` split as evenly as it goes
    (the first ``max % K`` partitions one more), so the shares add up to ``max`` exactly.

    The bound: the queue never hands out more than ``max`` per window; a partition claims at
    most its share, so while only some partitions have work the queue may hand out less (at
    worst ``max / K`` when one partition has all the work).  None: no limit anywhere.
    """
    if max is None:
        return [None] * partitions
    if max < partitions:
        raise ValueError(
            f"max must be at least {partitions} on a queue of {partitions} partitions "
            f"(a share of at least 1 each), got {max}"
        )
    share, extra = divmod(max, partitions)
    return [share + (1 if i < extra else 0) for i in range(partitions)]


def combined_limit(limits: list[RateLimit]) -> RateLimit:
    """The partitions' limits as one: the shares and their use added, the latest window end and back-off."""
    maxes = [limit.max for limit in limits]
    ends = [limit.window_ends_at for limit in limits if limit.window_ends_at is not None]
    until = [limit.backoff_until for limit in limits if limit.backoff_until is not None]
    return RateLimit(
        None if None in maxes else sum(m for m in maxes if m is not None),
        limits[0].per_ms if limits else None,
        sum(limit.used for limit in limits),
        max(ends) if ends else None,
        max(until) if until else None,
    )
