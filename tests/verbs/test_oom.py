"""Memory pressure: past maxmemory (noeviction) SWEEP is refused, EXTEND is not.

SWEEP moves jobs and can create rows, sets and the metric, so it is
registered deny-oom: the server refuses it with OOM before it runs, and
nothing changes.  EXTEND only re-scores a member that already exists, so a
live handler keeps its lease while the server is full (DESIGN.md).
`maxmemory 1` puts the server past its limit at once, whatever it holds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from echomq import Client
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..helpers import digest, extend_args, now_ms, put_active, sweep_args

Q = queue_keys("full")


@pytest.fixture(scope="module")
def oom_server(server_factory: ServerFactory) -> EmbeddedServer:
    return server_factory(["--maxmemory-policy", "noeviction"])


@pytest.fixture
def full(oom_server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A connection to a server holding a queue, past its maxmemory."""
    conn = oom_server.client()
    conn.config_set("maxmemory", 0)
    conn.flushall()
    now = now_ms(conn)
    put_active(conn, "full", "live", attempts=2, deadline=now + 1000)
    for i in range(3):
        put_active(conn, "full", f"lapsed-{i}", attempts=1, deadline=now - 1000, stalled=i)
    conn.config_set("maxmemory", 1)
    try:
        yield conn
    finally:
        conn.config_set("maxmemory", 0)
        conn.close()


def test_sweep_is_refused_with_oom_and_writes_nothing(full: redis.Redis) -> None:
    before = digest(full)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        full.execute_command(*sweep_args(Q, 2, 100))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        Client(full).sweep("full")
    assert digest(full) == before
    assert full.zcard(Q.active) == 4
    assert not full.exists(Q.pending, Q.dead, Q.metrics_failed)


def test_sweep_inside_multi_is_refused_and_the_transaction_aborts(full: redis.Redis) -> None:
    before = digest(full)
    pipe = full.pipeline(transaction=True)
    pipe.execute_command(*sweep_args(Q, 2, 100))
    with pytest.raises(redis.exceptions.ResponseError):  # EXECABORT, caused by OOM
        pipe.execute()
    assert digest(full) == before


def test_sweep_from_lua_is_refused_and_writes_nothing(full: redis.Redis) -> None:
    before = digest(full)
    script = "return redis.call('EMQ.SWEEP', KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])"
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):
        full.eval(script, 3, Q.active, Q.pending, Q.dead, Q.base, 2, 100)
    assert digest(full) == before


def test_extend_keeps_working_past_maxmemory(full: redis.Redis) -> None:
    assert full.info("memory")["used_memory"] > int(full.config_get("maxmemory")["maxmemory"])
    before = full.zscore(Q.active, "live")
    assert before is not None
    Client(full).extend("full", "live", token="2", lease_ms=3_600_000)
    after = full.zscore(Q.active, "live")
    assert after is not None and after >= now_ms(full) + 3_500_000 > before
    # Refusals are still the module's own, not OOM.
    with pytest.raises(redis.exceptions.ResponseError, match="EMQSTALE"):
        full.execute_command(*extend_args(Q, "live", 1, 1000))
    # A plain write that could grow memory is refused meanwhile: the server is really full.
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        full.set("other", "x")
