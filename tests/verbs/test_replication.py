"""Replication carries effects with absolute values, never the command."""

from __future__ import annotations

import contextlib
import random

import pytest
import redis

from echomq import Client, LeaseLost
from echomq.keyspace import queue_keys

from ..conftest import ServerFactory, wait_for_replica
from ..helpers import digest, extend_args, now_ms, put_active, sweep_args
from ..traffic import EXTEND_FROM_LUA, assert_covers_everything, run_traffic

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

# A replica's first sync waits 5 s by default for more replicas to join.
FAST_SYNC = ["--repl-diskless-sync-delay", "0"]


@pytest.mark.slow
def test_replica_digest_matches_master_after_extend_and_sweep(server_factory: ServerFactory) -> None:
    master = server_factory(FAST_SYNC)
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    client = Client(m)
    rng = random.Random(7)
    now = now_ms(m)

    queues = ["alpha", "beta", "gamma"]
    for q in queues:
        for i in range(60):
            live = rng.random() < 0.5
            deadline = now + 60_000 if live else now - rng.randint(1, 50_000)
            attempts, stalled = rng.randint(1, 3), rng.randint(0, 2)
            put_active(m, q, f"job-{i}", attempts=attempts, deadline=deadline, stalled=stalled)
    for _ in range(300):
        q, i = rng.choice(queues), rng.randint(0, 59)
        keys = queue_keys(q)
        token = (m.hget(keys.job(f"job-{i}"), "token") or b"0").decode()  # put_active: token = attempts
        with contextlib.suppress(LeaseLost):  # swept or never claimed: stale or gone
            client.extend(q, f"job-{i}", token=token, lease_ms=rng.randint(1_000, 90_000))
        if rng.random() < 0.1:
            client.sweep(q, max_stalled=rng.randint(1, 3), limit=rng.randint(1, 20))
    for q in queues:
        client.sweep(q, max_stalled=2, limit=1000)
    # Inside MULTI/EXEC too.
    pipe = m.pipeline(transaction=True)
    keys = queue_keys("alpha")
    pipe.execute_command("EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, 1, 5)
    pipe.execute()

    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert m.dbsize() > 0
    assert digest(s) == digest(m)
    # The leases are the master's absolute deadlines, to the millisecond.
    for q in queues:
        assert s.zrange(queue_keys(q).active, 0, -1, withscores=True) == m.zrange(
            queue_keys(q).active, 0, -1, withscores=True
        )
    # A replica refuses EMQ.* as any write.
    with pytest.raises(redis.exceptions.ReadOnlyError):
        Client(s).sweep("alpha")


@pytest.mark.slow
def test_replica_digest_matches_after_multi_exec_and_lua_traffic(server_factory: ServerFactory) -> None:
    master = server_factory(FAST_SYNC)
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    seen = run_traffic(m, random.Random(21), ["red", "green", "blue"], ops=300)
    assert_covers_everything(seen)

    assert m.execute_command("WAIT", 1, 5000) == 1
    wait_for_replica(m, s)
    assert m.dbsize() > 0
    assert digest(s) == digest(m)
    m.close()
    s.close()


def test_replica_refuses_emq_commands_as_writes(server_factory: ServerFactory) -> None:
    master = server_factory(FAST_SYNC)
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    keys = put_active(m, "ro", "j", attempts=1, deadline=now_ms(m) - 1000)
    wait_for_replica(m, s)
    before = digest(s)
    assert before == digest(m)

    with pytest.raises(redis.exceptions.ReadOnlyError):
        s.execute_command(*extend_args(keys, "j", 1, 60_000))
    with pytest.raises(redis.exceptions.ReadOnlyError):
        s.execute_command(*sweep_args(keys, 1, 10))
    pipe = s.pipeline(transaction=True)
    pipe.execute_command(*sweep_args(keys, 1, 10))
    with pytest.raises(redis.exceptions.ResponseError):  # EXECABORT: READONLY at queue time
        pipe.execute()
    with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)read.?only"):
        s.eval(EXTEND_FROM_LUA, 2, keys.active, keys.job("j"), "j", 1, 60_000)
    assert digest(s) == before
    assert s.zscore(keys.active, "j") == m.zscore(keys.active, "j")
    m.close()
    s.close()
