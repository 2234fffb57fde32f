"""Checkpoints that carry state (issue 16): stored with the lease, handed back by the next claim."""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys

from ..conftest import ServerFactory
from ..helpers import digest, now_ms

pytestmark = pytest.mark.backends  # the module and the scripts backend alike

Q = queue_keys("q")


def test_state_is_stored_with_the_lease_and_handed_to_the_next_claim(
    client: echomq.Client, r: redis.Redis
) -> None:
    client.enqueue("q", b"export", job_id="j")
    first = client.claim("q", lease_ms=60_000)
    assert first is not None and first.resume_state is None  # a first attempt has none
    before = now_ms(r)
    assert client.checkpoint("q", "j", first.token, 60_000, state=b'{"step": 17}') is None
    assert r.hmget(Q.job("j"), "checkpoint", "checkpoint_attempt") == [b'{"step": 17}', b"1"]
    assert before <= int(r.hget(Q.job("j"), "checkpoint_at") or 0) <= now_ms(r)
    # The worker dies; the job lapses and is recovered; the next holder resumes.
    r.zadd(Q.active, {"j": 0})
    assert client.sweep("q", max_stalled=3).recovered == ["j"]
    second = client.claim("q", lease_ms=60_000)
    assert second is not None and second.resume_state == b'{"step": 17}' and second.attempt == 2


def test_a_stale_holders_state_is_refused_and_never_stored(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("q", b"x", job_id="j")
    old = client.claim("q", lease_ms=60_000)
    assert old is not None
    client.checkpoint("q", "j", old.token, 60_000, state=b"step 3")
    r.zadd(Q.active, {"j": 0})
    client.sweep("q", max_stalled=3)
    new = client.claim("q", lease_ms=60_000)
    assert new is not None
    client.checkpoint("q", "j", new.token, 60_000, state=b"step 5")
    before = digest(r)
    with pytest.raises(echomq.StaleToken):
        client.checkpoint("q", "j", old.token, 60_000, state=b"step 4 (stale)")
    assert digest(r) == before
    assert r.hget(Q.job("j"), "checkpoint") == b"step 5"


def test_state_past_the_ceiling_is_refused_with_nothing_written(
    client: echomq.Client, r: redis.Redis
) -> None:
    client.enqueue("q", b"x", job_id="j")
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"larger than emq\.max-state-bytes"):
        client.checkpoint("q", "j", job.token, 1, state=b"x" * 65_537)
    assert digest(r) == before
    client.checkpoint("q", "j", job.token, 60_000, state=b"x" * 65_536)  # the ceiling itself is allowed
    assert len(r.hget(Q.job("j"), "checkpoint") or b"") == 65_536


def test_past_maxmemory_state_is_refused_but_the_lease_still_extends(
    server_factory: ServerFactory, backend: str
) -> None:
    srv = server_factory(load_module=backend == "module")
    r = srv.client()
    client = echomq.Client(r)
    assert client.backend == backend
    client.enqueue("full", b"x", job_id="j")
    job = client.claim("full", lease_ms=60_000)
    assert job is not None
    keys = queue_keys("full")
    r.config_set("maxmemory", 1)  # everything is past it now
    try:
        before = digest(r)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.checkpoint("full", "j", job.token, 90_000, state=b"step 9")
        assert digest(r) == before
        deadline = int(r.zscore(keys.active, "j") or 0)
        client.checkpoint("full", "j", job.token, 90_000)  # without state: the lease moves
        assert int(r.zscore(keys.active, "j") or 0) > deadline
        assert r.hget(keys.job("j"), "checkpoint") is None
    finally:
        r.config_set("maxmemory", 0)
        r.close()


def test_state_propagates_as_a_value(server_factory: ServerFactory) -> None:
    master = server_factory(["--repl-diskless-sync-delay", "0"])
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    from ..conftest import wait_for_replica

    wait_for_replica(m, s)
    client = echomq.Client(m)
    client.enqueue("q", b"x", job_id="j")
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    client.checkpoint("q", "j", job.token, 60_000, state=bytes(range(256)))
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert s.hget(Q.job("j"), "checkpoint") == bytes(range(256))
    assert digest(s) == digest(m)
