"""The client: typed wrappers for the EMQ.* commands over redis-py.

Hand-written beside its twin ``asyncio/client.py``, not generated from it
(``tests/unasync.py``): the methods users call carry their docs in the sync client and
point there from the asyncio one (the API reference shows both), and a worker's tries are
bounded by socket timeouts in one and by ``asyncio.timeout`` in the other.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
from redis.exceptions import ResponseError

from .. import _protocol as proto
from .. import schedules as schedule_rules
from .._protocol import (
    ActiveJob,
    CancelOutcome,
    DeadJob,
    EnqueueItem,
    ExtendOutcome,
    FailOutcome,
    GroupDefault,
    GroupInfo,
    Job,
    JobId,
    JobInfo,
    ObliterateResult,
    PendingJob,
    QueueCounters,
    QueueCounts,
    RateLimit,
    ReleaseOutcome,
    Retention,
    RetryDeadResult,
    SweepResult,
)
from .._protocol.calls import missing_code
from .._protocol.deps import OnParentFailure
from .._protocol.partitions import Partitioned
from .._protocol.unique import Enqueued
from .._redis import _missing, check_redis_client, connection_defaults, never_reached, unreachable, unwrapped
from .._result_wait import wait_result
from .._scripts import (
    PROBE,
    BackendChoice,
    BackendName,
    Rendering,
    ScriptLimits,
    backend_from_probe,
    check_backend,
    load_refused,
)
from .._serializers import JSON
from ..cancel import Cancellation
from ..schedules import DriveResult, ScheduleInfo
from . import _partitions, _schedules
from ._attempt import Cutter, NodeConnections, NotSent, WorkerConnections
from ._claims import ClaimVerbs
from ._operator import OperatorVerbs

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

__all__ = [
    "ActiveJob",
    "Client",
    "DeadJob",
    "ExtendOutcome",
    "GroupDefault",
    "GroupInfo",
    "Job",
    "JobId",
    "JobInfo",
    "ObliterateResult",
    "PendingJob",
    "QueueCounters",
    "QueueCounts",
    "RateLimit",
    "Retention",
    "RetryDeadResult",
    "ScriptLimits",
    "SweepResult",
]

T = TypeVar("T")

# Error replies that say the node does not serve the slot now: nothing ran there.
_REDIRECTS = ("MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN")

class Client(ClaimVerbs, OperatorVerbs):
    """EchoMQ's lifecycle commands on one Redis (or Redis Cluster) connection.

    ``backend`` says how the commands run: ``"module"`` (the EMQ.* commands of
    the emq module), ``"scripts"`` (the same verbs as Lua scripts, for a server
    without the module: any Redis 7 or Valkey 8) or ``"auto"`` (the default:
    the module when the server has it, else the scripts; asked once, at the
    first command).  ``client.backend`` says which one is in use.
    ``script_limits`` are the server-side settings the scripts cannot read
    (``ScriptLimits``: the module's defaults unless given).

    >>> client = Client.from_url("redis://localhost:6379/0")   # doctest: +SKIP
    >>> client.extend("emails", "job-42", token="3-9f2c...", lease_ms=30_000)  # doctest: +SKIP
    """

    def __init__(
        self,
        redis_client: redis.Redis | RedisCluster,
        backend: BackendChoice = "auto",
        *,
        script_limits: ScriptLimits | None = None,
    ) -> None:
        check_redis_client(redis_client, want_async=False)
        self.redis = redis_client
        self._limits = script_limits if script_limits is not None else ScriptLimits()
        choice = check_backend(backend)
        self._rendering: Rendering | None = None if choice == "auto" else Rendering(choice, self._limits)
        # For a worker's attempts (see _attempt_many): its own connections.
        self._pool: WorkerConnections | None = None
        self._nodes = NodeConnections()  # Redis Cluster: a node's own, for a waiting claim
        self._reached = False  # a request of ours got an answer once (never_reached)
        self._registrations = proto.Registrations()
        self._waitaof: bool | None = None  # whether the server has WAITAOF (asked once, when needed)
        # Each queue's partition declaration as first read (None: an ordinary queue): _partitions.lookup.
        self._partitioned_queues: dict[str, Partitioned | None] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        backend: BackendChoice = "auto",
        script_limits: ScriptLimits | None = None,
        **kwargs: Any,
    ) -> Client:
        """Connect with ``redis.Redis.from_url(url, **kwargs)``.

        With ``cluster=True``, ``url`` names any node of a Redis Cluster and the
        client is redis-py's ``RedisCluster``: each command goes to the node
        that owns its queue's slot.  ``backend`` and ``script_limits`` as for
        ``Client``.

        Unless ``kwargs`` say otherwise: a 5 s socket and connect timeout,
        TCP keepalive, and a command whose reply was lost (connection error
        or timeout) is sent again up to 10 times (50 ms, doubling to 1 s,
        with jitter).  Every EMQ.* command is safe to send twice (see
        docs/reference/python.md, "Retries").  Raw commands you send through ``client.redis``
        are retried the same way: use a client of your own for commands
        that are not safe to repeat.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        options = connection_defaults(kwargs)
        if cluster:
            from redis.cluster import RedisCluster

            return cls(RedisCluster.from_url(url, **options), backend, script_limits=script_limits)
        return cls(redis.Redis.from_url(url, **options), backend, script_limits=script_limits)

    @property
    def backend(self) -> BackendName:
        """``"module"`` or ``"scripts"``: how this client's commands run (asks the server once)."""
        return self._render().name

    def detect_backend(self) -> BackendName:
        """The backend in use, asking the server once if it is "auto" (``client.backend`` does too)."""
        return self._render().name

    def _render(self) -> Rendering:
        rendering = self._rendering
        if rendering is None:
            try:
                reply = self.redis.execute_command(*PROBE, **self._any_node())  # type: ignore[no-untyped-call]
            except ResponseError:  # COMMAND refused (an ACL): the scripts run anywhere
                reply = None
            rendering = self._rendering = Rendering(backend_from_probe(reply), self._limits)
        return rendering

    def _any_node(self) -> dict[str, Any]:
        """For the backend probe: in a cluster, any node."""
        get = getattr(self.redis, "get_random_node", None)
        return {} if get is None else {"target_nodes": get()}

    def _send(self, args: tuple[Any, ...]) -> Any:
        """Send a module command line as the backend has it; load the Lua where a node lacks it."""
        rendering = self._render()
        command = rendering.command(args)
        try:
            return self.redis.execute_command(*command)  # type: ignore[no-untyped-call]
        except ResponseError as exc:
            if not missing_code(exc):
                raise
        # Nothing ran: the node lacks the library (or the script).  Load it there, send again.
        load = rendering.load()
        if load is not None:
            try:
                self.redis.execute_command(*load, **self._node_of_call(command))  # type: ignore[no-untyped-call]
            except ResponseError as exc:
                if load_refused(exc):  # the caller may not load a library: one script per verb
                    self._rendering = rendering.as_eval()
                    return self._send(args)
        return self.redis.execute_command(*rendering.again(command))  # type: ignore[no-untyped-call]

    def _node_of_call(self, command: tuple[Any, ...]) -> dict[str, Any]:
        """In a cluster, the node that serves the call's first key (FUNCTION LOAD goes there)."""
        get = getattr(self.redis, "get_node_from_key", None)
        if get is None or not command[2]:
            return {}
        return {"target_nodes": get(command[3])}

    def _run(self, call: proto.Call[T]) -> T:
        try:
            reply = self._send(call.args)
        except ResponseError as exc:
            proto.raise_mapped(exc, call)
        return call.read(reply)

    def _run_request(self, call: proto.Call[T]) -> T:
        """Send a call carrying a REQ, and again after a lost reply only within its window.

        The server answers a resend from the call's record while it lives
        (``proto.RequestWindow``): so the tries are the client's own (one
        try each, ``_attempt``), never redis-py's retries.  On Redis Cluster
        and on a single-connection client ``_attempt`` is ``_run``: there,
        redis-py's retries must end within the window (docs/reference/python.md).
        """
        window = proto.RequestWindow(time.monotonic(), proto.socket_timeout_of(self.redis))
        while True:
            try:
                reply = self._attempt(call, window.try_s)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if never_reached(self.redis, exc, self._reached):
                    error: BaseException = exc
                    break
                pause = window.next_pause(time.monotonic())
                if pause is None:
                    if isinstance(exc, NotSent):  # the server stayed away: the public type, not ours
                        error = exc
                        break
                    raise
                time.sleep(pause)
            else:
                self._reached = True
                return reply
        raise unreachable(error) from unwrapped(error)  # outside the handler: chained to its own cause

    def _pipeline_run(self, calls: list[proto.Call[Any]]) -> list[Any]:
        """Send ``calls`` in one round trip (no transaction); the replies, errors as values."""
        rendering = self._render()
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*rendering.command(call.args))
        replies: list[Any] = pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, ResponseError) and missing_code(reply):  # nothing ran: again, loading
                try:
                    replies[i] = self._send(calls[i].args)
                except ResponseError as exc:
                    replies[i] = exc
        return replies

    def _attempt(self, call: proto.Call[T], timeout: float, cutter: Cutter | None = None) -> T:
        """Send ``call`` once and wait at most ``timeout`` seconds for its reply (the worker's retries).

        The worker retries on its own schedule, bounded by a lease, with the
        same REQ or token each time, so each call here is one try
        (``_attempt_many``).  On Redis Cluster (routing by slot) and on a
        single-connection client this is ``_run``: redis-py's own timeouts
        and retries apply; but a cluster's waiting claim (one with a
        ``cutter``) goes to its node's bounded connections
        (``_attempt.NodeConnections``), so a stop cuts it there too.
        """
        if not self._bounded():
            nodes = None
            if cutter is not None and isinstance(self.redis, redis.RedisCluster) and len(call.args) > 1:
                nodes = self._nodes.for_key(self.redis, call.args[1])
            if nodes is not None:
                return self._attempt_on_node(nodes, call, timeout, cutter)
            reply = self._run(call)
            self._nodes.detour = False  # redis-py's routing reached the slot's node: ours again
            return reply
        reply = self._try([call], timeout, cutter)[0]
        if isinstance(reply, ResponseError):
            proto.raise_mapped(reply, call)
        return call.read(reply)

    def _attempt_on_node(
        self, connections: WorkerConnections, call: proto.Call[T], timeout: float, cutter: Cutter | None
    ) -> T:
        try:
            reply = self._try([call], timeout, cutter, connections)[0]
        except (redis.TimeoutError, redis.ConnectionError):
            self._nodes.detour = True  # the next try: redis-py's routing, which refreshes it
            raise
        if isinstance(reply, ResponseError) and str(reply).startswith(_REDIRECTS):
            self._nodes.detour = True  # nothing ran there: redis-py follows it (and learns the slot)
            return self._attempt(call, timeout, cutter)
        if isinstance(reply, ResponseError):
            proto.raise_mapped(reply, call)
        return call.read(reply)

    def _attempt_many(
        self, calls: list[proto.Call[Any]], timeout: float, cutter: Cutter | None = None
    ) -> list[Any]:
        """Send ``calls`` in one round trip (no transaction), once, within ``timeout``; the replies.

        Every step is bounded (``_attempt.WorkerConnections``): a free
        connection of the worker's own, connecting and its handshake, the
        send, each reply.  A reply that does not come in time raises
        ``redis.TimeoutError`` and gives its connection up with the idle
        ones (they may be half-open); ``NotSent`` says nothing left.  Error
        replies are values, read by the caller (``Call.read``,
        ``proto.raise_mapped``).  A node without the scripts gets them on the
        same connection, within the same time.  ``cutter`` lets another
        thread end the wait.  On Redis Cluster and on a single-connection
        client this is ``_pipeline_run``.
        """
        if not self._bounded():
            return self._pipeline_run(calls)
        return self._try(calls, timeout, cutter)

    def _try(
        self,
        calls: list[proto.Call[Any]],
        timeout: float,
        cutter: Cutter | None,
        connections: WorkerConnections | None = None,
    ) -> list[Any]:
        if connections is None:
            connections = self._connections()
        deadline = time.monotonic() + max(timeout, 0.001)
        try:
            # take/give rather than connection(): a busy worker makes this call per job.
            connection, generation = connections.take(deadline)
            clean = False
            try:
                rendering = self._rendering or self._probe_on(connections, connection, deadline)
                commands = [rendering.command(call.args) for call in calls]
                replies = connections.round_trip(connection, commands, deadline, cutter)
                if any(_missing(reply) for reply in replies):
                    self._load_on(connections, connection, rendering, calls, replies, deadline)
                clean = True
            finally:
                connections.give(connection, generation, clean)
        except NotSent:
            raise
        except (redis.TimeoutError, redis.ConnectionError):
            connections.drop_idle()
            raise
        return replies

    def _bounded(self) -> bool:
        """Whether this client's worker commands go through bounded attempts (a plain pooled Redis)."""
        r = self.redis
        return isinstance(r, redis.Redis) and r.connection is None

    def _waits_cut(self) -> bool:
        """Whether a worker's stop can cut its waiting claim: bounded attempts, or Redis Cluster
        (``_attempt.NodeConnections``)."""
        return self._bounded() or isinstance(self.redis, redis.RedisCluster)

    def _wait_limit_ms(self) -> int | None:
        """The longest BLOCK a waiting claim may have on this client, None for no limit but the
        worker's: on Redis Cluster, what redis-py's socket timeout allows (a claim after a
        redirect goes through its routing)."""
        if not isinstance(self.redis, redis.RedisCluster):
            return None
        return proto.BlockingClaim(0, proto.socket_timeout_of(self.redis), 0.0).limit_ms

    def _connections(self) -> WorkerConnections:
        connections = self._pool
        if connections is None:
            connections = self._pool = WorkerConnections(cast("redis.Redis", self.redis).connection_pool)
        return connections

    def _reserve(self, n: int) -> None:
        """A worker's share of the bounded attempts' connections (its slots and its own loops)."""
        if self._bounded():
            self._connections().reserve(n)

    def _unreserve(self, n: int) -> None:
        if self._pool is not None:
            self._pool.unreserve(n)

    def _subscriber(self, confirmations: bool = False) -> Any:
        """A PubSub for a worker's pushed cancels or a result wait: bounded like the worker's attempts
        where they are bounded (a wait then does its own reconnecting, within its deadline)."""
        if self._bounded():
            return self._connections().subscriber(confirmations)
        return self.redis.pubsub(ignore_subscribe_messages=not confirmations)  # type: ignore[no-untyped-call,unused-ignore]

    def _distrust(self) -> None:
        """Something suggests the connections are half-open (a dead subscription): open fresh ones."""
        if self._pool is not None:
            self._pool.drop_idle()

    def _probe_on(self, connections: WorkerConnections, connection: Any, deadline: float) -> Rendering:
        """``_render`` for a bounded attempt: the backend probe on the attempt's own connection."""
        (reply,) = connections.round_trip(connection, [PROBE], deadline)
        rendering = self._rendering = Rendering(
            backend_from_probe(None if isinstance(reply, ResponseError) else reply), self._limits
        )
        return rendering

    def _load_on(
        self,
        connections: WorkerConnections,
        connection: Any,
        rendering: Rendering,
        calls: list[proto.Call[Any]],
        replies: list[Any],
        deadline: float,
    ) -> None:
        """The node lacked the scripts (nothing ran): load them on this connection, send those calls again."""
        load = rendering.load()
        if load is not None:
            (loaded,) = connections.round_trip(connection, [load], deadline)
            if isinstance(loaded, ResponseError) and load_refused(loaded):  # no FUNCTION LOAD here: EVAL
                rendering = self._rendering = rendering.as_eval()
        again = [i for i, reply in enumerate(replies) if _missing(reply)]
        commands = [rendering.again(rendering.command(calls[i].args)) for i in again]
        for i, reply in zip(again, connections.round_trip(connection, commands, deadline), strict=True):
            replies[i] = reply

    def extend(self, queue: str, job_id: JobId, token: str, lease_ms: int) -> None:
        """Checkpoint the lease: the job's deadline becomes server-now + ``lease_ms``.

        ``token`` is the fencing token the caller got when it claimed the job
        (``Job.token``).  Raises ``JobGone`` if the row no longer exists and ``StaleToken``
        if another attempt holds the job or it is no longer active; both are
        ``LeaseLost``: the handler should stop.
        """
        self._run(proto.extend(queue, job_id, token, lease_ms))

    def extend_many(
        self, queue: str, jobs: Iterable[tuple[JobId, str]], lease_ms: int
    ) -> list[ExtendOutcome]:
        """Checkpoint the leases of many jobs in one round trip.

        ``jobs`` is ``(job_id, token)`` pairs; the answer is one
        ``ExtendOutcome`` (OK, GONE, STALE) per pair, in the same order.  Each
        job is one EMQ.EXTEND with its own contract (pipelined, not a
        transaction): a lost lease is an outcome, not an exception.  Arguments
        are checked before anything is sent.  Any other server error
        (WRONGTYPE, an unknown command) is raised after the round trip; the
        extensions before it in the batch have been applied.
        """
        calls = proto.extend_batch(queue, jobs, lease_ms)
        if not calls:
            return []
        replies = self._pipeline_run(calls)
        return [proto.extend_outcome(call, reply) for call, reply in zip(calls, replies, strict=True)]

    def checkpoint(
        self,
        queue: str,
        job_id: JobId,
        token: str,
        lease_ms: int,
        *,
        state: bytes | None = None,
        progress: bytes | str | None = None,
    ) -> Cancellation | None:
        """``extend`` that also delivers remote cancels: the Cancellation requested, or None.

        Same lease effect and the same ``JobGone``/``StaleToken`` as ``extend``.
        With ``state``, the bytes are stored on the job in the same atomic
        step (fenced like the lease): the next claim of the job, after a
        crash, hands them back as ``Job.resume_state``.  With ``progress``
        (bytes, or a str as UTF-8), they are stored the same way for anyone
        to read (``JobInfo.progress``).  Each at most the server's
        ``emq.max-state-bytes``.
        """
        return self._run(proto.checkpoint(queue, job_id, token, lease_ms, state, progress))

    def sweep(self, queue: str, max_stalled: int = 1, limit: int = 100) -> SweepResult:
        """Recover the jobs whose lease lapsed, dead-lettering those at ``max_stalled`` stalls.

        At most ``limit`` jobs are taken per call, oldest deadline first.
        """
        return self._run(proto.sweep(queue, max_stalled, limit))

    def enqueue(
        self,
        queue: str,
        payload: bytes | str = b"",
        job_id: JobId | None = None,
        *,
        delay_ms: int | None = None,
        run_at_ms: int | None = None,
        priority: int | None = None,
        unique_key: str | bytes | None = None,
        unique_for_ms: int | None = None,
        replace: bool = False,
        group: str | None = None,
        after: Iterable[JobId] | None = None,
        on_parent_failure: OnParentFailure | None = None,
        missing_ok: bool = False,
        partition_key: str | bytes | None = None,
    ) -> Enqueued:
        """Add a job to ``queue``; returns its id (a new time-ordered one unless given).

        The row and the lane entry are written by one EMQ.ENQUEUE, atomically.
        The job is claimable at once, or ``delay_ms`` after now, or from
        ``run_at_ms`` (unix time in ms; a past time is claimable at once) -- both
        times on the server's clock.  ``priority`` (from -1000 to 1000, default 0):
        smaller runs first, first in first out within a level; a delayed job
        takes its place in its level when it comes due, and jobs whose due
        times have passed take theirs oldest due time first (a ``run_at_ms``
        ten hours ago before one two hours ago, whichever was enqueued first).  The payload is at
        most the server's ``emq.max-payload-bytes`` (1 MiB by default).
        Raises ``JobExists`` if a job with that id already exists.  A fresh
        REQ per call: after a lost reply the call is sent again, within 30 s
        of its first send, and the server answers the resend from the call's
        record (docs/reference/python.md, "Retries").

        ``unique_key`` (1 to 512 bytes): at most one job of the queue holds
        the key -- while it is pending or active, or with ``unique_for_ms``
        for that many ms from its enqueue whatever it does (a throttle).
        While it is held, the call adds nothing and returns the holder's
        id; ``replace=True`` gives a pending holder this call's payload
        (docs/concepts/unique.md).  The returned ``Enqueued`` is a ``str``
        (the id) with ``.created`` (this call added the job) and
        ``.replaced``.

        ``group`` (1 to 128 bytes of letters, digits and ``-_.:@``): the job
        belongs to that group, whose active jobs the server counts exactly
        (docs/concepts/flow-control.md, "Groups").

        ``after`` (1 to 1,000 ids of the same queue): the job waits, in no
        lane, until each of them has ended; then it goes where it would have
        gone (its delay, priority and group kept).  ``on_parent_failure``
        says what a dependency that ends dead, cancelled or deleted does:
        ``"fail"`` (the default: this job ends dead, ``last_error``
        ``dependency <id> <how>``), ``"ignore"`` or ``"continue"`` (it runs;
        ``ctx.parents()`` says which failed).  A dependency that does not
        exist raises ``BadArgument`` unless ``missing_ok=True`` (counted as
        met).  Dependencies already ended resolve at once
        (docs/concepts/workflows.md).

        On a queue declared with ``declare_queue(queue, partitions=K)``, the job
        goes to one partition: by ``partition_key`` when given, else by
        ``group``, else by ``unique_key``, else by ``job_id``, else round-robin;
        the id returned is ``"<partition>~<id>"`` (``"3~order-42"`` for
        ``job_id="order-42"``), the one ``cancel``, ``result`` and ``job`` take
        (docs/concepts/partitions.md).  ``partition_key`` is ignored on a queue
        not partitioned.  With ``after``, the job goes to the partition of the
        jobs it waits for, which must be one (``ValueError`` otherwise).
        """
        call = proto.enqueue(
            queue, payload, job_id, delay_ms, run_at_ms, priority, unique_key, unique_for_ms, replace, group,
            after, on_parent_failure, missing_ok,
        )  # fmt: skip
        if (partitioned := _partitions.lookup(self, queue)) is not None:
            return _partitions.enqueue(
                self, partitioned, payload, job_id, partition_key, unique_key, group,
                delay_ms=delay_ms, run_at_ms=run_at_ms, priority=priority,
                unique_for_ms=unique_for_ms, replace=replace,
                after=after, on_parent_failure=on_parent_failure, missing_ok=missing_ok,
            )  # fmt: skip
        enqueued: Enqueued = self._run_request(call)
        self._register(queue)  # the registry's index (docs/concepts/registry.md)
        return enqueued

    def enqueue_many(
        self,
        queue: str,
        items: Iterable[EnqueueItem],
        *,
        delay_ms: int | None = None,
        priority: int | None = None,
        group: str | None = None,
        partition_key: str | bytes | None = None,
    ) -> list[str]:
        """Add many jobs in few round trips; returns their ids, in order.

        Each item is a payload (the job gets a new id) or a ``(job_id,
        payload)`` pair.  One EMQ.ENQUEUEMANY per 10,000 jobs (fewer when the
        server's ``emq.max-limit`` is lower: a refused call is halved), each
        all or nothing: ``JobExists`` when an id of that chunk exists (the
        chunks before it were added).  Ids must be distinct (``ValueError``
        before anything is sent).  ``delay_ms``, ``priority`` and ``group``
        apply to every job alike; the jobs enter their lane in the order given.

        On a partitioned queue (``declare_queue``) the whole batch goes to one
        partition with ``partition_key`` or ``group``; else each job to its own,
        by its id when given, else round-robin; each partition's
        EMQ.ENQUEUEMANY go in one pipeline: one round trip per node.  The ids
        are ``"<partition>~<id>"``, in order.  An error of one partition's
        call (``JobExists``) is raised after the round trip; the other
        partitions' jobs were added.
        """
        if (partitioned := _partitions.lookup(self, queue)) is not None:
            return _partitions.enqueue_many(
                self, partitioned, items, partition_key, delay_ms, priority, group
            )
        ids: list[str] = []
        calls = proto.enqueue_many(queue, items, delay_ms, priority=priority, group=group)
        while calls:
            call = calls.pop(0)
            try:
                added: list[str] = self._run_request(call)
            except ResponseError as exc:  # emq.max-limit below 10,000: halve, nothing was written
                if not proto.over_max_limit(exc) or int(call.args[3]) < 2:
                    raise
                calls[:0] = proto.enqueue_many_halves(call)
                continue
            ids += added
        if ids:
            self._register(queue)  # the registry's index (docs/concepts/registry.md)
        return ids

    # -- schedules (echomq/schedules.py holds the rules) -----------------------------

    def schedule(
        self,
        queue: str,
        name: str,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        payload: bytes | str = b"",
        tz: str = "UTC",
        start_at: int | datetime | None = None,
        end_at: int | datetime | None = None,
        missed: str = "skip",
    ) -> ScheduleInfo:
        """Add (or replace) the schedule ``name`` of ``queue``: a job on every tick.

        Exactly one of ``cron`` (five fields, or six with seconds first; in
        the time zone ``tz``, an IANA name) and ``every_ms`` (ticks at
        multiples of the period since ``start_at``, or since the epoch).  Each
        tick enqueues one job with ``payload`` and the id ``<name>@<tick ms>``,
        once whatever the number of drivers (every worker's sweep and every
        ``Reaper`` drive their queue's schedules).  No tick before
        ``start_at`` or after ``end_at`` (epoch ms or an aware datetime), none
        before now.  ``missed`` says what a drive does with ticks missed
        while no driver ran (docs/concepts/schedules.md): ``"skip"`` none of
        them, ``"one"`` only the latest, ``"all"`` every one (at most 1,000).
        Replacing a schedule with the same timing keeps its cursor: a tick
        already consumed never runs again (with a new timing, ticks start
        after now).  Raises ``BadSchedule`` (a ``ValueError``) for a bad
        definition, before anything is written.  Returns the stored schedule.
        """
        definition = schedule_rules.define(
            name, cron=cron, every_ms=every_ms, payload=payload, tz=tz,
            start_at=start_at, end_at=end_at, missed=missed,
        )  # fmt: skip
        proto.keys_of(queue)
        info = _schedules.add(self, queue, definition)
        # the jobs it fires are enqueued by whoever drives it: the queue is registered now
        self._register(queue)  # (docs/concepts/registry.md)
        return info

    def unschedule(self, queue: str, name: str) -> bool:
        """Remove the schedule ``name`` of ``queue``; False if there was none.  Jobs it enqueued stay."""
        proto.keys_of(queue)
        return _schedules.remove(self, queue, name)

    def schedules(self, queue: str) -> list[ScheduleInfo]:
        """The schedules of ``queue`` (by name): definition, cursor, next ticks, jobs fired."""
        proto.keys_of(queue)
        return _schedules.listing(self, queue)

    def drive_schedules(self, queue: str) -> DriveResult:
        """Fire the due ticks of ``queue``'s schedules now; what workers and reapers do on their sweeps.

        Safe to call from any number of processes at once: each tick's job is
        enqueued once.  Returns the ids enqueued and the count of missed
        ticks dropped.
        """
        proto.keys_of(queue)
        return _schedules.drive(self, queue)

    def complete(self, queue: str, job_id: JobId, token: str, *, result: bytes | str | None = None) -> None:
        """Mark the job done; only its current holder may (``JobGone``/``StaleToken`` otherwise).

        With ``result`` (bytes, or a str as UTF-8; at most the server's
        ``emq.max-result-bytes``), it is stored with the job in the same
        atomic step and kept for the done retention (``JobInfo.result``).
        The job's end is announced on ``<base>done:<id>``
        (``echomq._protocol.done_channel``).
        """
        self._run(proto.complete(queue, job_id, token, result))

    def result(
        self, queue: str, job_id: JobId, *, timeout: float | None = None, serializer: Any = None
    ) -> Any:
        """Wait for the job's end and return its result's value (a task's: ``echomq.tasks``).

        It subscribes to the job's ``<base>done:<id>``, reads the row, then
        waits for the announcement; it reads the row again after every new
        subscription (a dropped connection is subscribed again, within
        ``timeout``) and every ``echomq.tasks.results.READ_EVERY_S`` (5 s).
        Raises ``JobFailed`` (dead: type, message, traceback),
        ``JobCancelled``, ``JobGone`` (no row) or
        ``ResultTimeout`` (a ``TimeoutError``) after ``timeout`` seconds.
        ``serializer``: how the result was stored (default
        ``echomq.tasks.JSON``; a result stored otherwise is refused, so a
        pickle is read only when ``echomq.tasks.PICKLE`` is given).
        """
        queue = _partitions.partition_of(self, queue, job_id)
        return wait_result(self, queue, proto.text(proto.wire(job_id)), timeout, serializer or JSON)

    def fail(
        self,
        queue: str,
        job_id: JobId,
        token: str,
        error: str,
        max_attempts: int = 3,
        *,
        delay_ms: int | None = None,
        traceback: str | None = None,
        dead: bool = False,
    ) -> FailOutcome:
        """Report the handler's failure; returns where the job went.

        Below ``max_attempts`` attempts it goes back to its lane (behind waiting
        work), claimable again ``delay_ms`` after now when given (the retry's
        backoff, e.g. ``RetryPolicy.delay_ms(job.attempt)``); else it is
        dead-lettered -- at once with ``dead=True``, whatever its tries (the
        handler knows a retry cannot help); a job with a cancel request ends
        ``"cancelled"`` (not retried, not counted as failed).  ``error`` is
        kept in the row's ``last_error`` (one line: ``"Type: message"``),
        ``traceback`` in ``traceback`` (its newest 8 KiB).  Same fencing as
        ``complete``.
        """
        return self._run(proto.fail(queue, job_id, token, error, max_attempts, delay_ms, traceback, dead))

    def release(self, queue: str, job_id: JobId, token: str) -> ReleaseOutcome:
        """Give a held job back without using an attempt: ``"pending"``, or ``"cancelled"``.

        For a graceful shutdown or a handler that cannot run the job now: the
        job waits at the head of the queue again, its retry budget is as it
        was before this claim, and no stall is counted.  A job whose cancel
        was requested ends ``"cancelled"`` instead.  Fenced like ``complete``
        (``JobGone``/``StaleToken``); safe to retry.
        """
        return self._run(proto.release(queue, job_id, token))

    def cancel(self, queue: str, job_id: JobId, reason: str | None = None) -> CancelOutcome:
        """Ask for a job to be cancelled, from anywhere; no token needed.

        Returns ``"cancelled"`` if the job was pending (it will never be
        claimed), ``"requested"`` if it is held (its handler hears of it at the
        holder's next checkpoint), ``"finished"`` if it is already done, dead
        or cancelled.  Idempotent; the first reason is kept.  Raises
        ``JobGone`` for an unknown id.  On a partitioned queue the id names its
        partition: one round trip.
        """
        proto.cancel(queue, job_id, reason)  # the arguments, checked before anything is sent
        return self._run(proto.cancel(_partitions.partition_of(self, queue, job_id), job_id, reason))

    def declare_queue(self, queue: str, *, partitions: int) -> None:
        """Declare ``queue`` a partitioned queue of ``partitions`` queues (1 to 1,024), on the server.

        The count is stored once, in the key ``emq:{<queue>}:partitions``, so
        that every client and worker reads the same; declaring again with the
        same count changes nothing, with another raises ``PartitionsChanged``
        (the count changes only by the migration of docs/concepts/partitions.md).
        Partition i is the ordinary queue ``partitions(queue)[i]``
        (``"<queue>#<i>.<n>"``, spread over the cluster's slots).  Declare a
        queue before producing into it: a client that already read it as
        not partitioned keeps it so until it is made anew.  ``queue`` may not
        contain ``#``.
        """
        _partitions.declare(self, queue, partitions)

    def partitions(self, queue: str) -> list[str]:
        """The queues ``queue``'s jobs live in: its partitions' names in order, or ``[queue]``
        for a queue not partitioned (the declaration read once per client)."""
        partitioned = _partitions.lookup(self, proto.keys_of(queue).queue)
        return [queue] if partitioned is None else list(partitioned.names)

    def close(self) -> None:
        """Close the redis client's connections (and a worker's own)."""
        if self._pool is not None:
            self._pool.close()
        self._nodes.close()
        self.redis.close()
