"""The operator's verbs and views of ``echomq.Client``: counts, pages, retry, purge, pause, retention,
rate limits, obliterate.

A mixin of the client's, apart from the job lifecycle (``client.py``): the
verbs an operator, the CLI and the dashboard call, each one command (or
one read of the server's clock and a MULTI) through the client's own
``_run``.  ``echomq.asyncio``'s twin is ``asyncio/_operator.py``.

Hand-written beside its twin ``asyncio/_operator.py``, not generated from it
(``tests/unasync.py``): the code is the same but for ``await``; the docstrings are not
(the asyncio client's point to the sync client's, as the API reference shows them), nor
are the types of ``redis``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

import redis
from redis.exceptions import ResponseError

from .. import _protocol as proto
from .._protocol import (
    ActiveJob,
    DeadJob,
    GroupDefault,
    GroupInfo,
    JobId,
    JobInfo,
    ObliterateResult,
    PendingJob,
    QueueCounters,
    QueueCounts,
    RateLimit,
    Retention,
    RetryDeadResult,
)
from ..errors import EchoMQError
from . import _partitions
from ._partitions import partition_of

if TYPE_CHECKING:
    from redis.cluster import RedisCluster


T = TypeVar("T")


class OperatorVerbs:
    """The operator's verbs of ``echomq.Client`` (see the module docstring)."""

    redis: redis.Redis | RedisCluster
    _registrations: proto.Registrations
    """The queues this client added to the registry's index lately (``_register``)."""

    def _run(self, call: proto.Call[T]) -> T:
        raise NotImplementedError

    def _partition_of(self, queue: str, job_id: JobId) -> str:
        """The queue that holds ``job_id`` (its partition, on a partitioned queue: ``_partitions.py``)."""
        return partition_of(self, queue, job_id)  # type: ignore[arg-type]

    def _node_of(self, key: str) -> dict[str, Any]:
        """For a keyless command (TIME, SCAN): in a cluster, the node that serves ``key``."""
        if hasattr(self.redis, "get_node_from_key"):
            return {"target_nodes": self.redis.get_node_from_key(key)}
        return {}

    def _server_time(self, key: str) -> int:
        """The clock (ms) of the server that serves ``key``."""
        return proto.server_ms(self.redis.execute_command("TIME", **self._node_of(key)))  # type: ignore[no-untyped-call]

    def _register(self, queue: str) -> None:
        """Add ``queue`` to the registry's index ``emq:queues``, at most once a minute per queue.

        Sent after the enqueue was answered, so nothing here fails it: the
        enqueue's marker ``emq:{Q}:queue`` already registered the queue, and a
        reader fills the index from the markers (docs/concepts/registry.md).  A
        refusal (``NOPERM`` on ``emq:queues``) is not asked again for a minute; a
        lost connection is asked again at the next enqueue.
        """
        now = time.monotonic()
        if not self._registrations.due(queue, now):
            return
        try:
            self.redis.execute_command(*proto.register(queue))  # type: ignore[no-untyped-call]
        except ResponseError:
            pass
        except redis.RedisError:
            return
        self._registrations.done(queue, now)

    def _unregister(self, queue: str) -> None:
        """Take an obliterated ``queue`` out of the registry's index (its marker went with its last step)."""
        self._registrations.forget(queue)
        self.redis.execute_command(*proto.unregister(queue))  # type: ignore[no-untyped-call]

    def _read(self, read: proto.Read[T]) -> T:
        now = self._server_time(read.key)
        pipe = self.redis.pipeline(transaction=True)
        for args in read.build(now):
            pipe.execute_command(*args)
        return read.parse(now, pipe.execute())

    def retention(
        self,
        queue: str,
        *,
        done_ms: int | None = None,
        cancelled_ms: int | None = None,
        dead_ms: int | None = None,
    ) -> Retention:
        """Read, or set, how long ``queue`` keeps its finished rows (ms; -1 forever, 0 not at all).

        Only the values given change; returns the policy in effect after the
        call.  Defaults: done an hour, cancelled a day, dead until retried or
        purged.  A row keeps the expiry it got when it finished; the dead
        retention applies to every dead job at the next sweep.
        """
        return self._run(proto.retention(queue, done_ms, cancelled_ms, dead_ms))

    def job(self, queue: str, job_id: JobId, *, payload: bool = False) -> JobInfo | None:
        """The job's status (``JobInfo``), read in one transaction; None when it has no row.

        With ``payload=True`` the payload bytes are included (``payload_size`` always is).
        """
        return self._read(proto.job_info(self._partition_of(queue, job_id), job_id, payload))

    def counts(self, queue: str) -> QueueCounts:
        """Pending (claimable now, and by priority level), delayed, active (and lapsed), dead, paused,
        and the failed metric.

        One snapshot: every number is of the same instant (one MULTI), the jobs
        waiting in group lanes included.  A read that finds a group or a
        priority level the read before did not know of is made again with it,
        so ``by_priority`` costs one more round trip per level other than 0
        that has jobs (at most ``MAX_LEVELS_SHOWN``); ``EchoMQError`` after
        ``SNAPSHOT_TRIES`` reads that each found another.
        """
        hint = proto.CountsHint()
        for _ in range(proto.SNAPSHOT_TRIES):
            found = self._read(proto.counts(queue, hint))
            if isinstance(found, QueueCounts):
                return found
            hint = found
        tries = proto.SNAPSHOT_TRIES
        raise EchoMQError(f"counts({queue!r}): groups or priority levels changed in each of {tries} reads")

    def dead(self, queue: str, *, offset: int = 0, count: int = 100) -> list[DeadJob]:
        """A page of the dead set, oldest death first: ``count`` jobs from position ``offset``.

        Each with its last error and when it died.  A job retried or purged
        while the page is read is left out.
        """
        page = self._read(proto.dead_page(queue, offset, count))
        return self._read(proto.dead_rows(queue, page)) if page else []

    def active(self, queue: str, *, offset: int = 0, count: int = 100) -> list[ActiveJob]:
        """A page of the active set, soonest lease deadline first: ``count`` jobs from ``offset``.

        Each with its lease left, attempts, stalls and cancel request.  A job
        that finished while the page is read is left out.
        """
        page = self._read(proto.active_page(queue, offset, count))
        return self._read(proto.active_rows(queue, page)) if page else []

    def pending(self, queue: str, *, offset: int = 0, count: int = 100) -> list[PendingJob]:
        """A page of the waiting jobs, in claim order (delayed jobs last): ``count`` jobs from ``offset``.

        Priority order first (smaller levels first, first in first out
        within a level), each with its ``priority``; the first one's
        ``waiting_ms`` is the age of the next job a claim takes.  Then the
        jobs waiting in groups' lanes, each with its ``group``: groups by
        name, each group's jobs in the order claims take them (a claim goes
        round-robin across the groups).  A job
        claimed or cancelled while the page is read is left out (a cancelled
        job's tombstone too: a page may hold fewer than ``count``).
        """
        layout = self._read(proto.pending_layout(queue))
        if layout.names:  # the groups' lanes, by the names found
            layout = self._read(proto.pending_layout(queue, layout.names))
        page = self._read(proto.pending_page(queue, offset, count, layout))
        return self._read(proto.pending_rows(queue, page)) if page else []

    def counters(self, queue: str) -> QueueCounters:
        """The queue's shared counters: what workers and reapers with ``echomq.metrics.Metrics`` counted.

        Totals since first written (``dead_lettered`` is the module's own
        count); a dashboard or an exporter turns them into rates.
        """
        return self._read(proto.counters(queue))

    def queues(self, *, limit: int = 100, scan_budget: int = 100_000, rescan: bool = False) -> list[str]:
        """The names of the queues that ever had a job (since their last obliterate), sorted.

        Read from the queue registry's index, the set ``emq:queues``, with no
        SCAN of the keyspace: a queue that drained in a second is listed all
        the same (docs/concepts/registry.md).  When the index was never filled
        (an upgrade from a version without it), or with ``rescan``, a bounded
        SCAN (on every primary of a cluster) of the queues' markers, lanes and
        sets runs first and fills it: it stops after about ``scan_budget`` keys
        examined or ``limit`` queues found.  At most ``limit`` names.
        """
        proto.positive_int("limit", limit)
        proto.positive_int("scan_budget", scan_budget)
        found: set[str] = set()
        filled = self.redis.execute_command("SISMEMBER", proto.REGISTRY_KEY, proto.REGISTRY_FILLED)  # type: ignore[no-untyped-call]
        if rescan or not filled:
            step = min(1000, scan_budget)
            nodes = self.redis.get_primaries() if hasattr(self.redis, "get_primaries") else [None]
            for node in nodes:
                for scan in range(len(proto.QUEUE_SCANS)):
                    target = {} if node is None else {"target_nodes": node}
                    found |= self._scan_queues(scan, step, scan_budget, limit - len(found), target)
            with contextlib.suppress(ResponseError):  # a reader that may not write it scans again next time
                self.redis.execute_command(*proto.fill_registry(sorted(found)))  # type: ignore[no-untyped-call]
        cursor = 0
        while len(found) < limit:
            reply = self.redis.execute_command(*proto.registry_page(cursor, 1000))  # type: ignore[no-untyped-call]
            cursor, names = proto.registry_reply(reply)
            found.update(names)
            if cursor == 0:
                break
        return sorted(found)[:limit]

    def _scan_queues(self, scan: int, step: int, budget: int, limit: int, target: dict[str, Any]) -> set[str]:
        """One pass of ``queues`` on one node: at most ``budget`` keys examined, ``limit`` queues found."""
        found: set[str] = set()
        cursor, examined = 0, 0
        while limit > 0:
            reply = self.redis.execute_command(*proto.scan_queues(cursor, step, scan), **target)  # type: ignore[no-untyped-call]
            cursor, keys = proto.scan_reply(reply)
            found.update(q for q in map(proto.queue_of_key, keys) if q is not None)
            examined += step
            if cursor == 0 or examined >= budget or len(found) >= limit:
                break
        return found

    def retry(self, queue: str, job_id: JobId) -> None:
        """Send a dead or cancelled job back to pending with a fresh budget of attempts.

        Its fencing token keeps counting (a holder from before the retry stays
        stale).  Raises ``JobGone`` for an unknown id and ``NotRetryable`` for
        a job that is pending, active or done.
        """
        self._run(proto.retry(queue, job_id))

    def _within_max_limit(self, make: Callable[[int], proto.Call[T]], limit: int) -> tuple[T, int]:
        """``make(limit)``'s answer, and the step size that ran: halved while the server's
        ``emq.max-limit`` refuses it (nothing written then: ``proto.halved_limit``)."""
        while True:
            try:
                return self._run(make(limit)), limit
            except ResponseError as exc:
                smaller = proto.halved_limit(exc, limit)
                if smaller is None:
                    raise
                limit = smaller

    def retry_dead(self, queue: str, *, limit: int = 100) -> RetryDeadResult:
        """Retry every job that is dead now, ``limit`` per command, oldest first.

        Jobs that die again while this runs are not retried twice (only those
        that died before it started are taken).  A ``limit`` above the
        server's ``emq.max-limit`` is halved until the server takes it.
        """
        until = self._server_time(proto.keys_of(queue).dead)
        retried = dropped = 0
        while True:
            step, limit = self._within_max_limit(lambda n: proto.retry_dead(queue, n, until), limit)
            retried, dropped = retried + step.retried, dropped + step.dropped
            if step.retried + step.dropped < limit:
                return RetryDeadResult(retried, dropped)

    def purge_dead(self, queue: str, *, limit: int = 100) -> int:
        """Delete every job that is dead now (rows and dead-set members), ``limit`` per command; how many.

        A ``limit`` above the server's ``emq.max-limit`` is halved until the server takes it.
        """
        until = self._server_time(proto.keys_of(queue).dead)
        total = 0
        while True:
            step, limit = self._within_max_limit(lambda n: proto.purge_dead(queue, n, until), limit)
            total += step
            if step < limit:
                return total

    def pause(self, queue: str) -> bool:
        """Stop handing out jobs of ``queue`` (claims get nothing); False if it was paused already.

        Running jobs go on (extend, checkpoint, complete, fail); enqueue works;
        sweeps recover lapsed jobs, which then wait.
        """
        return self._run(proto.pause(queue))

    def resume(self, queue: str) -> bool:
        """Hand out jobs of ``queue`` again; False if it was not paused."""
        return self._run(proto.resume(queue))

    @overload
    def set_group_limit(self, queue: str, group: str, *, max_active: int | None) -> GroupInfo: ...
    @overload
    def set_group_limit(self, queue: str, group: None, *, max_active: int | None) -> GroupDefault: ...
    def set_group_limit(
        self, queue: str, group: str | None, *, max_active: int | None
    ) -> GroupInfo | GroupDefault:
        """Cap ``group`` of ``queue``: never more than ``max_active`` of its jobs active at once.

        Across all workers, in every claim (the blocking one too); ``None``
        removes the cap.  It costs a claim nothing: a group at its cap is
        out of the ring of groups claims rotate through until a job of it
        ends.  A cap below the group's active count lets those run on and
        holds the rest until it drains.  Returns the group after the call.

        ``group=None`` sets the queue's default (``group_max`` in
        ``<base>meta``): the cap of every group without its own, re-applied
        to each group's place in the ring at once (at most 10,000 groups:
        more raise ``redis.ResponseError``, nothing changed); returns a
        ``GroupDefault``.  ``group(...)``'s ``max_active`` stays the group's
        own cap (None while the default governs it).
        """
        if group is None:
            return self._run(proto.set_group_default(queue, max_active))
        return self._run(proto.set_group_limit(queue, group, max_active))

    def group(self, queue: str, group: str) -> GroupInfo:
        """One group of ``queue``: its waiting and active jobs, its cap and whether it is paused."""
        return self._run(proto.group_limit(queue, group))

    def pause_group(self, queue: str, group: str) -> GroupInfo:
        """Hold back the waiting jobs of ``group`` (still counted and listed); its active ones run on."""
        return self._run(proto.pause_group(queue, group))

    def resume_group(self, queue: str, group: str) -> GroupInfo:
        """Let the waiting jobs of a paused ``group`` be claimed again; the group after the call."""
        return self._run(proto.resume_group(queue, group))

    def groups(self, queue: str) -> list[GroupInfo]:
        """Every group of ``queue`` with a job waiting or active, a cap or a pause, by name.

        Each with its waiting and active counts, its cap and whether it is
        paused.  One snapshot (one MULTI): the names (the index
        ``<base>groupset`` and the ring) and the hash and lane of every group
        the read before found; read again while the snapshot holds a group
        that read did not know of (so two reads when the queue has groups;
        ``EchoMQError`` after ``SNAPSHOT_TRIES``).
        """
        known: tuple[bytes, ...] = ()
        for _ in range(proto.SNAPSHOT_TRIES):
            found = self._read(proto.group_rows(queue, known))
            if isinstance(found, list):
                return found
            known = found
        raise EchoMQError(f"groups({queue!r}): its groups changed in each of {proto.SNAPSHOT_TRIES} reads")

    def set_rate_limit(self, queue: str, max: int | None, per_ms: int | None = None) -> RateLimit:
        """Let claims of ``queue`` hand out at most ``max`` jobs per ``per_ms`` (server clock).

        Windows are fixed and aligned to the server clock; every worker's
        claims share them (CLAIM, COMPLETECLAIM and the blocking claim, which
        waits on the server for the next window).  ``max`` None removes the
        limit (as ``remove_rate_limit``).  Changing ``per_ms`` restarts the
        count; changing only ``max`` keeps it.  Returns the limit after the call.
        On a partitioned queue ``max`` (at least one per partition) is split into
        shares that add up to it (docs/concepts/partitions.md, "Rate limits").
        """
        proto.set_rate_limit(queue, max, per_ms)  # the arguments, checked before anything is sent
        if (partitioned := _partitions.lookup(self, queue)) is not None:  # type: ignore[arg-type]
            return _partitions.set_rate_limit(self, partitioned, max, per_ms)  # type: ignore[arg-type]
        return self._run(proto.set_rate_limit(queue, max, per_ms))

    def remove_rate_limit(self, queue: str) -> RateLimit:
        """Remove the rate limit of ``queue`` (a back-off in force stays); waiting claims wake."""
        if (partitioned := _partitions.lookup(self, queue)) is not None:  # type: ignore[arg-type]
            return _partitions.set_rate_limit(self, partitioned, None, None)  # type: ignore[arg-type]
        return self._run(proto.set_rate_limit(queue, None))

    def rate_limit(self, queue: str) -> RateLimit:
        """The rate limit of ``queue``, the current window's use, and any back-off in force."""
        if (partitioned := _partitions.lookup(self, queue)) is not None:  # type: ignore[arg-type]
            return _partitions.rate_limit(self, partitioned)  # type: ignore[arg-type]
        return self._run(proto.limit(queue))

    def back_off(self, queue: str, ms: int) -> RateLimit:
        """Stop every claim of ``queue`` for ``ms`` on the server clock (0 lifts a back-off).

        A back-off in force is never shortened by a shorter one.  Handlers
        call it through ``ctx.rate_limited(ms)`` (or ``raise RateLimited(ms)``).
        """
        proto.back_off(queue, ms)  # the arguments, checked before anything is sent
        if (partitioned := _partitions.lookup(self, queue)) is not None:  # type: ignore[arg-type]
            return _partitions.back_off(self, partitioned, ms)  # type: ignore[arg-type]
        return self._run(proto.back_off(queue, ms))

    def obliterate(self, queue: str, *, force: bool = False, limit: int = 100) -> ObliterateResult:
        """Delete ``queue``: its jobs and rows, settings and metric, ``limit`` keys per command.

        Raises ``QueueBusy`` (having deleted nothing) while jobs are active,
        unless ``force``: then their holders find their jobs gone.  The queue
        is paused from the first step on.  Finished rows kept for their
        retention are found with SCAN and deleted only while still finished:
        a job enqueued while this runs is either deleted whole or kept whole,
        never half.  Every command takes at most ``limit`` keys (halved while
        the server's ``emq.max-limit`` refuses it): no step holds the server
        long, whatever the queue's size.
        """
        removed, forgotten, rounds = 0, 0, 0
        while True:  # a round: the sets, then the rows in none (SCAN)
            rounds += 1
            while True:
                (step, remaining), limit = self._within_max_limit(
                    lambda n: proto.obliterate(queue, n, force), limit
                )
                removed += step
                if remaining == 0:
                    break
            cursor = 0
            target = self._node_of(proto.keys_of(queue).pending)
            while True:
                reply = self.redis.execute_command(*proto.scan_rows(queue, cursor, limit), **target)  # type: ignore[no-untyped-call]
                cursor, found = proto.scan_reply(reply)
                for call in proto.forget_steps(queue, [proto.row_id(queue, k) for k in found], limit):
                    forgotten += self._run(call)
                if cursor == 0:
                    break
            # a forget of a waiting job resolves what waited on it: a waiter under `fail` ends
            # dead (or, under `ignore`, enters a lane), which the next round removes
            # (docs/concepts/workflows.md)
            keys = proto.keys_of(queue)
            if rounds >= 100 or not self.redis.exists(keys.dead, keys.pending, keys.base + "priority"):
                self.redis.delete(proto.counters_key(queue))  # the shared counters (echomq.metrics)
                # ends left to resolve whose waiters the forgets deleted (docs/concepts/workflows.md)
                self.redis.delete(proto.keys_of(queue).base + "resolve")
                self._unregister(queue)
                return ObliterateResult(removed, forgotten)
