"""Typed client errors (issue 15): bad arguments are refused before anything is sent, naming the argument;
server errors of our own map to typed exceptions; a redis client of the other kind is refused at once.

Both clients run the same table (``echomq.Client`` and ``echomq.asyncio.Client``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import echomq
import echomq.asyncio as emq
from echomq._redis import default_async_retry
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..calibration import budget
from ..conftest import ServerFactory
from ..faults import AOF, restart
from ..helpers import digest, put_active

Q = "typed"
K = queue_keys(Q)
TOKEN = "1-00000000000000aa"

# (call, exception, words the message must contain); every one is refused before sending.
BAD_CALLS: list[tuple[str, Callable[[Any], Any], type[Exception], str]] = [
    ("fail-bytes-error", lambda c: c.fail(Q, "j", TOKEN, b"e"), TypeError, "error"),
    ("fail-attempts-0", lambda c: c.fail(Q, "j", TOKEN, "e", max_attempts=0), ValueError, "max_attempts"),
    ("cancel-int-reason", lambda c: c.cancel(Q, "j", reason=5), TypeError, "reason"),
    ("enqueue-dict", lambda c: c.enqueue(Q, {"a": 1}), TypeError, "payload"),
    ("enqueue-int", lambda c: c.enqueue(Q, 5), TypeError, "payload"),
    ("enqueue-empty-id", lambda c: c.enqueue(Q, b"x", job_id=""), ValueError, "job_id"),
    ("enqueue-int-id", lambda c: c.enqueue(Q, b"x", job_id=7), TypeError, "job_id"),
    ("claim-huge-lease", lambda c: c.claim(Q, 10**18), ValueError, "lease_ms"),
    ("claim-float-lease", lambda c: c.claim(Q, 1.5), TypeError, "lease_ms"),
    ("claim-many-0", lambda c: c.claim_many(Q, 1000, 0), ValueError, "count"),
    ("extend-int-token", lambda c: c.extend(Q, "j", 1, 1000), TypeError, "token"),
    ("extend-empty-token", lambda c: c.extend(Q, "j", "", 1000), ValueError, "token"),
    ("extend-zero-lease", lambda c: c.extend(Q, "j", TOKEN, 0), ValueError, "lease_ms"),
    ("checkpoint-bool-lease", lambda c: c.checkpoint(Q, "j", TOKEN, True), TypeError, "lease_ms"),
    ("complete-empty-id", lambda c: c.complete(Q, "", TOKEN), ValueError, "job_id"),
    ("release-none-token", lambda c: c.release(Q, "j", None), TypeError, "token"),
    ("sweep-0-stalled", lambda c: c.sweep(Q, max_stalled=0), ValueError, "max_stalled"),
    ("sweep-str-limit", lambda c: c.sweep(Q, limit="5"), TypeError, "limit"),
    ("queue-braces", lambda c: c.enqueue("a{b}", b""), ValueError, "must not contain"),
    ("queue-int", lambda c: c.enqueue(5, b""), TypeError, "queue"),
    ("queue-empty", lambda c: c.sweep(""), ValueError, "queue"),
    ("extend-many-pairs", lambda c: c.extend_many(Q, ["j"], 1000), TypeError, "pairs"),
]


@pytest.mark.parametrize(("name", "call", "exc", "words"), BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_sync_client_refuses_bad_arguments_before_sending(
    r: redis.Redis,
    client: echomq.Client,
    name: str,
    call: Callable[[Any], Any],
    exc: type[Exception],
    words: str,
) -> None:
    before = digest(r)
    calls = int(r.info("stats")["total_commands_processed"])
    with pytest.raises(exc, match=words):
        call(client)
    assert int(r.info("stats")["total_commands_processed"]) == calls + 1  # the INFO above: nothing sent
    assert digest(r) == before


@pytest.mark.parametrize(("name", "call", "exc", "words"), BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_async_client_refuses_bad_arguments_before_sending(
    r: redis.Redis,
    server: EmbeddedServer,
    name: str,
    call: Callable[[Any], Any],
    exc: type[Exception],
    words: str,
) -> None:
    async def main() -> None:
        client = emq.Client.from_url(server.url)
        try:
            with pytest.raises(exc, match=words):
                result = call(client)
                if asyncio.iscoroutine(result):
                    await result
        finally:
            await client.aclose()

    before = digest(r)
    asyncio.run(main())
    assert digest(r) == before


def test_server_errors_of_our_own_are_typed(r: redis.Redis, client: echomq.Client) -> None:
    # What only the server can tell: a lease whose deadline would pass 2^53
    # (the client allows up to 2^53 itself), a corrupt row, a key of the wrong type.
    client.enqueue(Q, b"", job_id="j")
    with pytest.raises(echomq.BadArgument, match="lease-ms is too large") as info:
        client.claim(Q, 2**53)
    assert isinstance(info.value, ValueError)  # a BadArgument is a ValueError too
    put_active(r, Q, "x", attempts=1, deadline=0, stalled="zz")
    with pytest.raises(echomq.CorruptQueue, match="stalled"):
        client.sweep(Q)
    r.delete(K.active)
    r.set(K.pending, "not a sorted set")
    with pytest.raises(echomq.CorruptQueue, match="WRONGTYPE"):
        client.claim(Q, 1000)


def test_job_exists_names_the_id_and_the_queue(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue(Q, b"", job_id="dup")
    with pytest.raises(echomq.JobExists) as info:
        client.enqueue(Q, b"", job_id="dup")
    assert "'dup'" in str(info.value) and repr(Q) in str(info.value) and info.value.job_id == "dup"


def test_a_client_of_the_other_kind_is_refused_at_construction() -> None:
    # echomq.Client(redis.asyncio.Redis()).enqueue(...) returned an id and wrote nothing.
    with pytest.raises(TypeError, match="asyncio"):
        echomq.Client(aioredis.Redis())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="synchronous"):
        emq.Client(redis.Redis())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="redis-py client"):
        echomq.Client("redis://localhost")  # type: ignore[arg-type]


def test_from_url_retries_a_lost_reply_deliberately(server: EmbeddedServer) -> None:
    # redis-py's from_url retries nothing by default; echomq's client does,
    # because every EMQ.* command is safe to send twice.
    client = echomq.Client.from_url(server.url)
    retry = client.redis.get_retry()
    assert retry is not None and retry.get_retries() == 10
    kwargs = client.redis.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 5.0 and kwargs["socket_connect_timeout"] == 5.0
    assert (
        echomq.Client.from_url(server.url, socket_timeout=1.0).redis.connection_pool.connection_kwargs[
            "socket_timeout"
        ]
        == 1.0
    )  # the caller's own settings win
    aclient = emq.Client.from_url(server.url)
    assert aclient.redis.get_retry().get_retries() == 10  # type: ignore[union-attr]


# A refused connection (issue 30): nothing listens there.  Before the client ever reached its
# server that is a wrong URL or a server not started, reported at once (ten retries took 6.7 s);
# once it has reached it, a refusal is a restart, and the retries ride it out.


def _closed_port() -> int:
    with socket.socket() as sock:  # bound, never listening: a connection to it is refused
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refused_connection_to_a_server_never_reached_is_reported_at_once() -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    client = echomq.Client.from_url(url)
    started = time.monotonic()
    with pytest.raises(echomq.ServerUnreachable, match="refused") as info:
        client.enqueue(Q, b"x")
    assert time.monotonic() - started < budget(3.0, under=6.7)  # 6.7 s at e64777a; milliseconds now
    assert isinstance(info.value, redis.ConnectionError)  # what callers caught before still catches it
    cause = info.value.__cause__
    assert isinstance(cause, redis.ConnectionError) and isinstance(cause.__context__, ConnectionRefusedError)
    with pytest.raises(echomq.ServerUnreachable, match="refused"):
        client.counts(Q)  # a verb redis-py retries itself: the same public type
    assert client.redis.get_retry().get_retries() == 10  # a lost reply is still retried

    async def refused() -> float:
        aclient = emq.Client.from_url(url, retry=default_async_retry())
        began = time.monotonic()
        with pytest.raises(echomq.ServerUnreachable, match="111"):
            await aclient.enqueue(Q, b"x")
        await aclient.aclose()
        return time.monotonic() - began

    assert asyncio.run(refused()) < budget(3.0, under=6.7)


def test_a_mistyped_host_is_reported_at_once_as_server_unreachable() -> None:
    # It retried for ~30 s, then raised the private echomq._attempt.NotSent (issue 42).
    client = echomq.Client.from_url("redis://no-such-host.invalid:6379/0")
    started = time.monotonic()
    with pytest.raises(echomq.ServerUnreachable, match="cannot reach the server") as info:
        client.enqueue(Q, b"x")
    assert time.monotonic() - started < budget(5.0, under=25.0)  # at once, but for the resolver (was ~30 s)
    assert type(info.value) is echomq.ServerUnreachable  # the public type itself, not a private subclass
    assert isinstance(info.value.__cause__, redis.ConnectionError)

    async def mistyped() -> BaseException:
        aclient = emq.Client.from_url("redis://no-such-host.invalid:6379/0")
        try:
            await aclient.enqueue(Q, b"x")
        except echomq.ServerUnreachable as exc:
            return exc
        finally:
            await aclient.aclose()
        raise AssertionError("the enqueue went through")

    assert type(asyncio.run(mistyped())) is echomq.ServerUnreachable


def test_a_client_that_reached_its_server_rides_out_a_restart(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = server_factory(AOF, dir=tmp_path)
    client = echomq.Client.from_url(server.url)
    client.enqueue(Q, b"before", job_id="before")
    down = threading.Event()
    restarter = threading.Thread(
        target=restart, args=(server,), kwargs={"down_for": 0.5, "on_down": down.set}
    )
    restarter.start()
    try:
        assert down.wait(10)
        client.enqueue(Q, b"during", job_id="during")  # refused for 0.5 s, then sent
    finally:
        restarter.join()
    assert client.counts(Q).pending == 2
