"""A result wait that loses what it listens on (issue 39, item 4): it still sees its job's end.

A wait hears a job's end on ``<base>done:<id>`` (``echomq._results``); an
announcement published while its subscription was away is gone.  Here the
waiter reaches the server through a proxy (tests/faults.py) that drops its
connections and refuses new ones while the job ends, or loses the
announcement on the way; ``TaskHandle.result`` and the asyncio
``AsyncTaskHandle.result`` must return the job's value all the same, with a
timeout and without one.  Each test checks its fault happened: the
subscription was gone and the proxy refusing when the row turned ``done``,
or the announcement was dropped.  On both backends; the wait's rules
without I/O at the end.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq import _protocol as proto
from echomq import _results as results  # the wait's rules (echomq.tasks.results re-exports them)
from echomq.tasks.results import ResultWait
from echomq.testing import EmbeddedServer

from ..faults import Proxy, wait_until

pytestmark = pytest.mark.backends

Backend = Literal["module", "scripts"]
Q = "rwait"
WAIT_S = 30.0  # generous: the waits here end as soon as the server is reachable again
WAYS = ["sync", "asyncio"]
TIMEOUTS = [WAIT_S, None]


@pytest.fixture
def proxy(server: EmbeddedServer) -> Iterator[Proxy]:
    p = Proxy(server.port)
    yield p
    p.refuse = False
    p.close()


def listeners(r: redis.Redis, queue: str, job_id: str) -> int:
    """How many subscriptions the server holds on the job's ``<base>done:<id>``."""
    sharded = proto.sharded_announcements(r.info("server"))
    count = "SHARDNUMSUB" if sharded else "NUMSUB"
    reply = r.execute_command("PUBSUB", count, proto.done_channel(queue, job_id))
    return int(reply[1])


def waiter_name(job_id: str) -> str:
    """The name of the connections of the waiter for ``job_id``, its pub/sub one's too (no other's)."""
    return f"test-waiter-{job_id}"


def read_once(r: redis.Redis, job_id: str) -> bool:
    """The waiter's last command was its HMGET of the row: it then waits for the announcement."""
    name = waiter_name(job_id)
    return any(c.get("name") == name and c.get("cmd") == "hmget" for c in r.client_list())


def began(r: redis.Redis, job_id: str) -> bool:
    """The waiter subscribed, and read the row (pending): it waits for the announcement now."""
    return wait_until(lambda: listeners(r, Q, job_id) == 1 and read_once(r, job_id), 20)


def waiting(way: str, port: int, backend: Backend, job_id: str, timeout: float | None) -> dict[str, Any]:
    """A waiter, in a thread, through ``port``: ``out["value"]`` or ``out["error"]`` once it ends."""
    out: dict[str, Any] = {}

    def sync_wait() -> Any:
        waiter = echomq.Client(redis.Redis(port=port, client_name=waiter_name(job_id)), backend=backend)
        try:
            return echomq.App(waiter, queue=Q).handle(Q, job_id).result(timeout=timeout)
        finally:
            waiter.close()

    async def async_wait() -> Any:
        waiter = emq.Client(redis.asyncio.Redis(port=port, client_name=waiter_name(job_id)), backend=backend)
        try:
            return await emq.App(waiter, queue=Q).handle(Q, job_id).result(timeout=timeout)
        finally:
            await waiter.aclose()

    def run() -> None:
        try:
            out["value"] = sync_wait() if way == "sync" else asyncio.run(async_wait())
        except BaseException as exc:  # the test reads it
            out["error"] = exc

    out["thread"] = threading.Thread(target=run, name="test-waiter", daemon=True)
    out["thread"].start()
    return out


def an_app(client: echomq.Client) -> tuple[echomq.App, Callable[..., Any]]:
    app = echomq.App(client, queue=Q)

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    return app, add


def ended(waiter: dict[str, Any]) -> Any:
    waiter["thread"].join(WAIT_S + 15)
    assert not waiter["thread"].is_alive(), "the wait is still waiting on a job that ended"
    if "error" in waiter:
        raise waiter["error"]
    return waiter["value"]


@pytest.mark.parametrize("timeout", TIMEOUTS)
@pytest.mark.parametrize("way", WAYS)
def test_a_wait_whose_connections_drop_while_its_job_ends_reads_the_row_again(
    r: redis.Redis,
    client: echomq.Client,
    backend: Backend,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    way: str,
    timeout: float | None,
) -> None:
    # result_wait_conn.py kill_refuse: the job ended while the waiter was cut off (~0.6 s); its
    # subscription came back, the announcement was gone, and the wait ran out its whole timeout
    # (or waited for ever).  Only the read after the new subscription can see the end here: the
    # safety net's periodic read is put out of reach.
    monkeypatch.setattr(results, "READ_EVERY_S", 3600.0, raising=False)
    app, add = an_app(client)
    handle = add.enqueue(2, 3)
    waiter = waiting(way, proxy.port, backend, handle.id, timeout)
    assert began(r, handle.id), "the wait never began"

    proxy.refuse = True
    proxy.drop()
    assert wait_until(lambda: listeners(r, Q, handle.id) == 0, 10)  # nobody hears the announcement
    assert wait_until(lambda: proxy.refused > 0, 10)  # the waiter tried to come back: refused
    with app.worker(poll_interval=0.02, grace=0.5):
        assert wait_until(lambda: r.hget(proto.keys_of(Q).job(handle.id), "state") == b"done", 20)
        refused = proxy.refused
        assert wait_until(lambda: proxy.refused > refused, 10)  # the job ended; still out of reach
        assert listeners(r, Q, handle.id) == 0 and waiter["thread"].is_alive()
        proxy.refuse = False
        assert ended(waiter) == 5


@pytest.mark.parametrize("timeout", TIMEOUTS)
@pytest.mark.parametrize("way", WAYS)
def test_a_wait_whose_announcement_is_lost_reads_the_row_again_in_time(
    r: redis.Redis,
    client: echomq.Client,
    backend: Backend,
    proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
    way: str,
    timeout: float | None,
) -> None:
    # A message lost with no connection lost (nothing tells the waiter): the periodic read finds
    # the end.  It waited for ever before.  The interval is shortened to keep the test quick.
    monkeypatch.setattr(results, "READ_EVERY_S", 0.5, raising=False)
    channel = proto.done_channel(Q, "x")[: -len(b"x")]

    def an_announcement(data: bytes) -> bool:
        return b"message\r\n" in data and channel in data

    proxy.lose_reply = an_announcement
    app, add = an_app(client)
    handle = add.enqueue(2, 3)
    waiter = waiting(way, proxy.port, backend, handle.id, timeout)
    assert began(r, handle.id), "the wait never began"
    with app.worker(poll_interval=0.02, grace=0.5):
        assert ended(waiter) == 5
    assert proxy.lost == 1  # the fault happened: the announcement never reached the waiter


@pytest.mark.parametrize("way", WAYS)
def test_a_wait_on_a_server_never_reached_raises_at_once(way: str) -> None:
    # Nothing listens there (a wrong URL) and nothing ever answered: waiting out the refusal would
    # only hide the mistake, for ever with no timeout.  It raises the connection error, as any call
    # does (echomq._redis.never_reached).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    waiter = waiting(way, port, "module", "x", None)  # no server: no backend to find
    waiter["thread"].join(WAIT_S)
    assert not waiter["thread"].is_alive(), "the wait retries an address nothing listens at"
    assert isinstance(waiter.get("error"), redis.ConnectionError), waiter
    assert type(waiter.get("error")) is echomq.ServerUnreachable, waiter  # the one public type (issue 42)


# -- the rules (echomq.tasks.results), without I/O ------------------------------------------


def confirmation() -> dict[str, Any]:
    return {"type": "ssubscribe", "channel": b"c", "data": 1}


def test_a_wait_reads_on_every_confirmation_every_announcement_and_every_interval() -> None:
    wait = ResultWait("q", "j", None, 0.0)
    assert not wait.heard(None, 1.0)
    assert wait.heard(confirmation(), 1.0)  # the first subscription, and every one after
    assert wait.heard({"type": "message", "channel": b"c", "data": b"j"}, 1.0)
    every = results.READ_EVERY_S
    wait.read(1.0)
    assert wait.listen(1.0) == every  # no timeout: it still looks up to read again
    assert not wait.heard(None, 1.0 + every - 0.01)
    assert wait.heard(None, 1.0 + every)
    assert wait.listen(1.0 + every + 3) == 0.0


def reached(wait: ResultWait) -> ResultWait:
    assert not wait.heard(None, 0.0) and not wait.reached
    assert wait.heard(confirmation(), 0.0) and wait.reached  # a refusal after this is a restart
    return wait


def test_a_lost_connection_pauses_within_the_deadline_then_times_out_from_its_error() -> None:
    wait = reached(ResultWait("q", "j", 2.0, 0.0))
    error = redis.ConnectionError("refused")
    now, pauses = 0.0, []
    with pytest.raises(echomq.ResultTimeout) as timed_out:
        while True:
            pause = wait.lost(error, now)
            assert 0.0 <= pause <= 2.0 - now  # never past the deadline
            pauses.append(pause)
            now += pause
    assert timed_out.value.__cause__ is error  # why it ran out: the server was out of reach
    assert len(pauses) > 3 and max(pauses) <= 1.0 and math.isclose(now, 2.0)


def test_a_read_answered_ends_the_backoff_and_forgets_the_error() -> None:
    wait = reached(ResultWait("q", "j", 10.0, 0.0))
    for _ in range(6):
        wait.lost(redis.ConnectionError("refused"), 0.0)
    assert wait.settle([b"active", None, None, None, None]) is None
    again = wait.lost(redis.ConnectionError("refused"), 0.0)
    assert again <= 0.05  # the first pause again
    with pytest.raises(echomq.ResultTimeout) as timed_out:
        wait.settle([b"active", None, None, None, None])
        wait.listen(10.0)
    assert timed_out.value.__cause__ is None


def test_a_wait_with_no_timeout_tries_on() -> None:
    wait = reached(ResultWait("q", "j", None, 0.0))
    for i in range(100):
        assert 0.0 <= wait.lost(redis.ConnectionError("refused"), float(i)) <= 1.0
