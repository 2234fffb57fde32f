"""Fencing across a failover that lost the last claims (issue 20).

Replication is asynchronous: a master can hand out a claim, die before the
claim reaches its replica, and the promoted replica never saw it.  With a
token that is a plain counter the new master then hands the same job out
with the same token, and two holders hold one job, both accepted.  The
token is fresh for every claim (emq_core.h, emq_format_token): the holder
whose claim the new master never saw is stale on every fenced verb.

The reproduction, step for step (the issue's): a master and a replica with
the module; ENQUEUE, WAIT 1; the replication link dropped and kept down (a
password the replica does not know, then CLIENT KILL TYPE replica); CLAIM on
the master (worker A); the master killed; REPLICAOF NO ONE on the replica;
CLAIM on the new master (worker B); A's token on every fenced verb.
"""

from __future__ import annotations

import re
import time

import pytest
import redis

from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory, wait_for_replica

Q = queue_keys("q")
FAST_SYNC = ["--repl-diskless-sync-delay", "0"]
TOKEN = re.compile(rb"[0-9]+-[0-9a-f]{16}")


def claim(r: redis.Redis) -> tuple[bytes, bytes]:
    reply = r.execute_command("EMQ.CLAIM", Q.pending, Q.active, Q.base, 60_000)
    assert reply is not None, "nothing to claim"
    job_id, token = reply[0][0], reply[0][1]
    assert TOKEN.fullmatch(token), token
    return job_id, token


def partitioned_failover(server_factory: ServerFactory) -> tuple[redis.Redis, bytes]:
    """Run the reproduction up to B's claim; returns the new master and A's token."""
    master = server_factory(FAST_SYNC)
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    m.execute_command("EMQ.ENQUEUE", Q.pending, Q.base, "job1", "payload")
    assert m.execute_command("WAIT", 1, 2000) == 1
    # The partition: the replica cannot come back (it has no masterauth).
    m.config_set("requirepass", "x")
    m.execute_command("CLIENT", "KILL", "TYPE", "replica")
    deadline = time.monotonic() + 10
    while s.info("replication")["master_link_status"] == "up":
        assert time.monotonic() < deadline, "the replication link did not go down"
        time.sleep(0.05)
    a = redis.Redis(host=master.host, port=master.port, password="x")
    assert claim(a)[0] == b"job1"  # worker A
    a_token = a.hget(Q.job("job1"), "token")
    assert a_token is not None
    assert s.hget(Q.job("job1"), "state") == b"pending", "the replica saw A's claim after all"
    # The master dies; the replica is promoted.
    assert isinstance(master, EmbeddedServer) and master.process is not None
    master.process.kill()
    master.process.wait()
    s.execute_command("REPLICAOF", "NO", "ONE")
    job_id, b_token = claim(s)  # worker B
    assert job_id == b"job1"
    assert b_token != a_token, "the same token was handed out twice"
    assert b_token.split(b"-")[0] == a_token.split(b"-")[0] == b"1"  # both were claim 1 of the job
    return s, a_token


@pytest.mark.slow
def test_a_claim_the_new_master_never_saw_is_stale_on_every_fenced_verb(
    server_factory: ServerFactory,
) -> None:
    s, a_token = partitioned_failover(server_factory)
    b_token = s.hget(Q.job("job1"), "token")
    before = s.execute_command("DEBUG", "DIGEST")
    fenced = {
        "extend": ["EMQ.EXTEND", Q.active, Q.job("job1"), "job1", a_token, 60_000],
        "checkpoint": ["EMQ.CHECKPOINT", Q.active, Q.job("job1"), "job1", a_token, 60_000],
        "complete": ["EMQ.COMPLETE", Q.active, Q.job("job1"), "job1", a_token],
        "fail": ["EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, "job1", a_token, 3, "A failed"],
        "release": ["EMQ.RELEASE", Q.active, Q.pending, Q.base, "job1", a_token],
    }
    for verb, args in fenced.items():
        stale = "extend" if verb == "checkpoint" else verb
        with pytest.raises(redis.ResponseError, match=f"^EMQSTALE {stale}"):
            s.execute_command(*args)
    assert s.execute_command("DEBUG", "DIGEST") == before, "a stale holder wrote"
    # B holds the job, and only B.
    assert s.execute_command("EMQ.COMPLETE", Q.active, Q.job("job1"), "job1", b_token) == 1


@pytest.mark.slow
def test_replicas_receive_the_token_the_master_chose(server_factory: ServerFactory) -> None:
    # The token's random part is drawn once, on the master, and propagated as
    # a value: a replica (and an AOF replay) holds the same token.
    master = server_factory(FAST_SYNC)
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    for i in range(20):
        m.execute_command("EMQ.ENQUEUE", Q.pending, Q.base, f"j{i}", "p")
    tokens = dict(claim(m) for _ in range(20))
    assert len(set(tokens.values())) == 20
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert {job_id: s.hget(Q.job(job_id), "token") for job_id in tokens} == tokens
    assert s.execute_command("DEBUG", "DIGEST") == m.execute_command("DEBUG", "DIGEST")
