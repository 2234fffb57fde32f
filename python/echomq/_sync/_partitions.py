"""A partitioned queue, for ``echomq.Client``: its declaration, read once per client, the
producers' routing, and what a worker of it adds (``_protocol/partitions.py`` and
``_runtime/partitions.py`` hold the rules; docs/concepts/partitions.md).

Hand-written beside its twin ``asyncio/_partitions.py``, not generated from it
(``tests/unasync.py``): the wakes' listener is a thread with its events here, a task there.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

import redis
from redis.exceptions import NoPermissionError, ResponseError

from .. import _protocol as proto
from .._protocol import EnqueueItem, JobId, RateLimit
from .._protocol import partitions as rules
from .._protocol.partitions import Partitioned
from .._protocol.unique import Enqueued
from .._result_wait import _next_message, _sharded
from .._runtime import ATTEMPT_TIMEOUT_S
from .._runtime.partitions import IdleWakes, adopt, wake_channel
from ..errors import ServerUnreachable


class Client(Protocol):
    """What these functions use of ``echomq.Client`` (a Protocol: the client imports this module)."""

    redis: Any
    _partitioned_queues: dict[str, Partitioned | None]

    def enqueue(self, *args: Any, **kwargs: Any) -> Enqueued: ...

    def enqueue_many(self, *args: Any, **kwargs: Any) -> list[str]: ...

    def _pipeline_run(self, calls: list[proto.Call[Any]]) -> list[Any]: ...

    def _register(self, queue: str) -> None: ...

    def _bounded(self) -> bool: ...

    def _connections(self) -> Any: ...


def declare(client: Client, queue: str, partitions: int) -> None:
    queue = rules.check_logical(queue)
    partitions = rules.check_partitions(partitions)
    key, count = rules.declaration(queue, partitions)
    before = rules.declared(client.redis.set(key, count, nx=True, get=True))
    rules.check_declared(queue, before, partitions)
    client._partitioned_queues[queue] = Partitioned(queue, partitions)


def lookup(client: Client, queue: str) -> Partitioned | None:
    """``queue``'s declaration as this client first read it (None: an ordinary queue).

    A partition's name (it has a ``#``) is never declared: no read.  A user whose
    ACL may not read the declaration's key sees an ordinary queue.
    """
    known = client._partitioned_queues
    if queue in known:
        return known[queue]
    found: Partitioned | None = None
    if isinstance(queue, str) and "#" not in queue:
        try:
            count = rules.declared(_read(client, queue))
        except NoPermissionError:
            count = None
        found = None if count is None else Partitioned(queue, count)
    known[queue] = found
    return found


def _read(client: Client, queue: str) -> Any:
    """The declaration's GET, sent again after a lost reply within the enqueue's own window (a GET
    is safe to repeat): a stall the enqueue would ride out does not fail it here."""
    window = proto.RequestWindow(time.monotonic(), proto.socket_timeout_of(client.redis))
    while True:
        try:
            return client.redis.execute_command(*rules.read_args(queue))
        except ServerUnreachable:  # nothing listens there (a wrong URL): at once, as the enqueue would
            raise
        except (redis.ConnectionError, redis.TimeoutError):
            pause = window.next_pause(time.monotonic())
            if pause is None:
                raise
            time.sleep(pause)


def partition_of(client: Client, queue: str, job_id: JobId) -> str:
    """The queue that holds ``job_id``: its partition on a partitioned queue, else ``queue``."""
    partitioned = lookup(client, queue)
    return queue if partitioned is None else partitioned.partition_of_id(job_id)


def enqueue(
    client: Client,
    partitioned: Partitioned,
    payload: bytes | str,
    job_id: JobId | None,
    partition_key: str | bytes | None,
    unique_key: str | bytes | None,
    group: str | None,
    **options: Any,
) -> Enqueued:
    after = options.get("after")
    if after:  # with what it waits for (docs/concepts/partitions.md)
        after = options["after"] = list(after)
        given = partition_key is not None or group is not None
        chosen = partitioned.route(partition_key, group, None, None) if given else None
        index = partitioned.route_after(after, chosen)
    else:
        index = partitioned.route(partition_key, group, unique_key, job_id)
    name = partitioned.names[index]
    enqueued = client.enqueue(
        name, payload, partitioned.job_id(index, job_id), unique_key=unique_key, group=group, **options
    )
    wake(client, name)
    return enqueued


def enqueue_many(
    client: Client,
    partitioned: Partitioned,
    items: Iterable[EnqueueItem],
    partition_key: str | bytes | None,
    delay_ms: int | None,
    priority: int | None,
    group: str | None,
) -> list[str]:
    """Each item to its partition, every partition's ENQUEUEMANY in one pipeline (a round trip per node)."""
    fixed = (
        None
        if partition_key is None and group is None
        else partitioned.route(partition_key, group, None, None)
    )
    per: dict[int, list[EnqueueItem]] = {}
    ids: list[bytes] = []
    for item in items:
        if isinstance(item, tuple) and len(item) != 2:
            raise ValueError(f"an enqueue_many item must be a payload or (job_id, payload), got {item!r}")
        given = item[0] if isinstance(item, tuple) else None
        body = item[1] if isinstance(item, tuple) else item
        index = fixed if fixed is not None else partitioned.route(None, None, None, given)
        wid = partitioned.job_id(index, given)
        ids.append(wid)
        per.setdefault(index, []).append((wid, body))
    calls = [
        call
        for index, jobs in sorted(per.items())
        for call in proto.enqueue_many(
            partitioned.names[index], jobs, delay_ms, priority=priority, group=group
        )
    ]
    if not calls:
        return []
    replies = client._pipeline_run(calls)
    first_error: BaseException | None = None
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, ResponseError) and proto.over_max_limit(reply):  # emq.max-limit below 10,000
            count = int(call.args[3])
            jobs = [(call.args[4 + 2 * i], call.args[5 + 2 * i]) for i in range(count)]
            client.enqueue_many(call.queue, jobs, delay_ms=delay_ms, priority=priority, group=group)
        elif isinstance(reply, BaseException) and first_error is None:
            first_error = reply
    if first_error is not None:
        if isinstance(first_error, ResponseError):
            bad = next(c for c, r in zip(calls, replies, strict=True) if r is first_error)
            proto.raise_mapped(first_error, bad)
        raise first_error
    for index in per:
        client._register(partitioned.names[index])
        wake(client, partitioned.names[index])
    return [proto.text(wid) for wid in ids]


def wake(client: Client, name: str) -> None:
    """Announce a job in partition ``name`` to its idle workers (``_runtime.partitions``): a
    failure (an ACL without SPUBLISH, say) is no error of the enqueue, which is done."""
    with contextlib.suppress(redis.RedisError):
        client.redis.execute_command(
            "SPUBLISH" if _sharded(client.redis) else "PUBLISH", wake_channel(name), b""
        )


class Wakes:
    """A partitioned worker's listener of its partitions' wakes: subscribed while it idles."""

    def __init__(self, client: Client, names: tuple[str, ...], state: IdleWakes) -> None:
        self.client, self.state = client, state
        self.index = {wake_channel(name).encode(): i for i, name in enumerate(names)}
        self.woken = threading.Event()  # a wake came (or the state changed): the claim looks again
        self._changed = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def changed(self) -> None:
        self._changed.set()

    def stop(self) -> None:
        self._done.set()
        self._changed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def _run(self) -> None:
        state, pubsub, sharded = self.state, None, False
        while not self._done.is_set():
            try:
                if state.wanted and pubsub is None:
                    sharded = _sharded(self.client.redis)
                    pubsub = self.client.redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
                    (pubsub.ssubscribe if sharded else pubsub.subscribe)(*self.index)
                    state.subscribed = True
                elif not state.wanted and pubsub is not None:
                    state.subscribed = False
                    pubsub.close()
                    pubsub = None
                if pubsub is None:
                    self._changed.wait(0.5)
                    self._changed.clear()
                    continue
                message = _next_message(pubsub, sharded, 0.2)
                if message is not None and message.get("type") in ("message", "smessage"):
                    index = self.index.get(message["channel"])
                    if index is not None:
                        state.woken(index)
                        self.woken.set()
            except Exception:  # the subscription dropped: made again while still wanted (the
                state.subscribed = False  # rotation of claims covers the wakes lost meanwhile)
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()
                pubsub = None
                self._done.wait(1.0)
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()


def hook_worker(worker: Any) -> None:
    """At a worker's start: it reads its queue's declaration with its first claim, on its own
    bounded connection (a stop cuts it: a frozen server holds no stop), and a worker of a
    partitioned queue then claims and sweeps across its partitions (``_runtime.partitions``).
    A worker of any other queue is left as it was: the hook goes with the first read."""
    claim = worker._claim

    def first_claim(step: Any, **options: Any) -> Any:
        try:
            partitioned = _worker_lookup(worker.client, worker.queue, worker._claim_cutter)
        except Exception:  # not read (the server is away, the stop cut it): the claim, its own way
            return claim(step, **options)
        del worker._claim  # the class's own again: no hook on any later claim
        if partitioned is not None:
            _adopt(worker, partitioned)
        return worker._claim(step, **options)

    worker._claim = first_claim


def _worker_lookup(client: Client, queue: str, cutter: Any) -> Partitioned | None:
    """``lookup`` in one bounded try on the worker's own connections (where it has them)."""
    known = client._partitioned_queues
    if queue in known or "#" in queue or not client._bounded():
        return lookup(client, queue)
    connections = client._connections()
    deadline = time.monotonic() + ATTEMPT_TIMEOUT_S
    connection, generation = connections.take(deadline)
    clean = False
    try:
        (reply,) = connections.round_trip(connection, [rules.read_args(queue)], deadline, cutter)
        clean = True
    finally:
        connections.give(connection, generation, clean)
    if isinstance(reply, NoPermissionError):
        reply = None
    elif isinstance(reply, BaseException):
        raise reply
    count = rules.declared(reply)
    found = known[queue] = None if count is None else Partitioned(queue, count)
    return found


def _adopt(worker: Any, partitioned: Partitioned) -> None:
    if worker._listener is not None:  # pushed cancels: every partition's channel
        worker._listener.listen_to(partitioned.names)
    state = IdleWakes(partitioned.partitions)
    adopt(worker, partitioned.names, random.randrange(partitioned.partitions), state)
    wakes = worker._partition_wakes = Wakes(worker.client, partitioned.names, state)
    claim = worker._claim

    def claim_and_move_on(step: Any, **options: Any) -> Any:
        try:
            jobs, claimed_at = claim(step, **options)
        finally:
            step.renew()  # an empty answer (or jobs) ends this partition's turn: the next claim moves on
        if options.get("block_ms") is None:  # a claim with ends: the worker is busy
            return jobs, claimed_at
        was = state.wanted
        wait = state.claimed(len(jobs))
        if state.wanted != was:
            wakes.changed()
        if state.wanted and not state.subscribed:  # the subscription first, then around once more
            deadline = time.monotonic() + 2.0
            while not state.subscribed and time.monotonic() < deadline and not worker._stop_requested:
                time.sleep(0.01)
        until = time.monotonic() + wait
        while not state.pending and not worker._stop_requested and (left := until - time.monotonic()) > 0:
            wakes.woken.wait(min(left, 0.1))
            wakes.woken.clear()
        return jobs, claimed_at

    worker._claim = claim_and_move_on
    wakes.start(f"echomq-worker-{worker.queue}-wakes")


def stop_worker(worker: Any) -> None:
    """The worker stops: its wakes' listener too (a worker of an ordinary queue has none)."""
    wakes = getattr(worker, "_partition_wakes", None)
    if wakes is not None:
        wakes.stop()


def set_rate_limit(
    client: Client, partitioned: Partitioned, max: int | None, per_ms: int | None
) -> RateLimit:
    """The queue-wide limit split into the partitions' shares (``rules.rate_shares``), one pipeline."""
    shares = rules.rate_shares(max, partitioned.partitions)
    calls = [
        proto.set_rate_limit(name, share, per_ms)
        for name, share in zip(partitioned.names, shares, strict=True)
    ]
    return _limits(client, calls)


def rate_limit(client: Client, partitioned: Partitioned) -> RateLimit:
    return _limits(client, [proto.limit(name) for name in partitioned.names])


def back_off(client: Client, partitioned: Partitioned, ms: int) -> RateLimit:
    return _limits(client, [proto.back_off(name, ms) for name in partitioned.names])


def _limits(client: Client, calls: list[proto.Call[RateLimit]]) -> RateLimit:
    replies = client._pipeline_run(list(calls))
    limits = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, ResponseError):
            proto.raise_mapped(reply, call)
        if isinstance(reply, BaseException):
            raise reply
        limits.append(call.read(reply))
    return rules.combined_limit(limits)
