"""A claim that waits for replicas (issue 20): ``replicas=N`` on claim, claim_many and the workers.

Real servers: a master with the module (or, for the scripts backend, without
it) and a replica.  With the replica up, the claim returns once the replica
holds the claim: its row is active with the holder's token, read at once,
without waiting for replication.  With the replica stopped, the wait runs
out: ``NotReplicated``, and the job is pending again at the head of the
queue with its retry budget as it was (RELEASE: ``tries`` given back;
``attempts``, the token's counter, never goes down).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio as aioredis

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory, needs, supports, wait_for_replica

pytestmark = pytest.mark.slow
Q = "rw"
K = queue_keys(Q)
FAST_SYNC = ["--repl-diskless-sync-delay", "0"]


class Pair:
    def __init__(self, master: EmbeddedServer, replica: EmbeddedServer, backend: str) -> None:
        self.master, self.replica, self.backend = master, replica, backend
        self.m, self.s = master.client(), replica.client()
        wait_for_replica(self.m, self.s)

    def client(self) -> echomq.Client:
        return echomq.Client(self.master.client(socket_timeout=5), self.backend)

    def aclient(self) -> emq.Client:
        return emq.Client(aioredis.Redis(port=self.master.port, socket_timeout=5), self.backend)

    def row(self, r: redis.Redis, job_id: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in r.hgetall(K.job(job_id)).items()}


@pytest.fixture(params=["module", "scripts"])
def pair(request: pytest.FixtureRequest, server_factory: ServerFactory) -> Iterator[Pair]:
    backend = str(request.param)
    options: dict[str, object] = {} if backend == "module" else {"load_module": False}
    master = server_factory(FAST_SYNC, **options)
    replica = server_factory(["--replicaof", master.host, str(master.port)], **options)
    yield Pair(master, replica, backend)


def test_a_claim_waits_until_the_replica_holds_it(pair: Pair) -> None:
    client = pair.client()
    client.enqueue(Q, b"p", job_id="j1")
    job = client.claim(Q, 60_000, replicas=1, replicas_timeout_ms=4000)
    assert job is not None and job.id == "j1"
    seen = pair.row(pair.s, "j1")  # at once: the wait covered the claim
    assert seen["state"] == "active" and seen["token"] == job.token, seen
    assert pair.s.zscore(K.active, "j1") is not None
    client.complete(Q, job.id, job.token)


def test_a_claim_the_replicas_do_not_confirm_is_given_back_unused(pair: Pair) -> None:
    client = pair.client()
    client.enqueue(Q, b"p", job_id="j1")
    pair.replica.stop()
    with pytest.raises(echomq.NotReplicated) as info:
        client.claim(Q, 60_000, replicas=1, replicas_timeout_ms=200)
    err = info.value
    assert (err.job_ids, err.released, err.acked, err.wanted) == (["j1"], ["j1"], 0, 1)
    row = pair.row(pair.m, "j1")
    assert row["state"] == "pending" and row["closed_by"] == "release:pending", row
    assert row["tries"] == "0" and row["attempts"] == "1", row  # the budget as before; the counter kept
    assert pair.m.zcard(K.active) == 0 and pair.m.lrange(K.pending, 0, 0) == [b"j1"]
    again = client.claim(Q, 60_000)  # without the wait: the same job, its first try, a fresh token
    assert again is not None and again.id == "j1" and again.attempt == 1
    assert again.token.startswith("2-")


def test_claim_many_waits_once_for_all_and_gives_all_back(pair: Pair) -> None:
    client = pair.client()
    for i in range(3):
        client.enqueue(Q, b"p", job_id=f"j{i}")
    jobs = client.claim_many(Q, 60_000, 2, replicas=1, replicas_timeout_ms=4000)
    assert [j.id for j in jobs] == ["j0", "j1"]
    assert all(pair.row(pair.s, j.id)["token"] == j.token for j in jobs)
    with pytest.raises(echomq.NotReplicated) as info:  # two wanted, one replica
        client.claim_many(Q, 60_000, 5, replicas=2, replicas_timeout_ms=200)
    assert info.value.acked == 1 and info.value.released == ["j2"]
    assert pair.row(pair.m, "j2")["state"] == "pending"


def test_the_asyncio_client_waits_and_gives_back_alike(pair: Pair) -> None:
    async def main() -> None:
        client = pair.aclient()
        await client.enqueue(Q, b"p", job_id="a1")
        job = await client.claim(Q, 60_000, replicas=1, replicas_timeout_ms=4000)
        assert job is not None and pair.row(pair.s, "a1")["token"] == job.token
        await client.enqueue(Q, b"p", job_id="a2")
        pair.replica.stop()
        with pytest.raises(echomq.NotReplicated) as info:
            await client.claim(Q, 60_000, replicas=1, replicas_timeout_ms=200)
        assert info.value.released == ["a2"]
        row = pair.row(pair.m, "a2")
        assert (row["state"], row["tries"], row["attempts"]) == ("pending", "0", "1")
        await client.redis.aclose()

    asyncio.run(main())


def test_workers_run_a_job_only_once_the_replica_has_its_claim(pair: Pair) -> None:
    client = pair.client()
    client.enqueue(Q, b"p", job_id="w1")
    seen: list[dict[str, str]] = []

    def handler(ctx: echomq.JobContext) -> None:
        seen.append(pair.row(pair.s, ctx.id))  # the replica, read as the handler starts
        worker.stop()

    worker = echomq.Worker(client, Q, handler, lease_ms=30_000, replicas=1, replicas_timeout_ms=4000)
    worker.run(handle_signals=False)
    assert seen and seen[0]["state"] == "active", seen
    assert pair.row(pair.m, "w1")["state"] == "done"
    assert worker.stats.not_replicated == 0

    # The replica gone: the worker gives the job back, unrun, and claims it again later.
    client.enqueue(Q, b"p", job_id="w2")
    pair.replica.stop()
    ran: list[str] = []
    stuck = echomq.Worker(
        client, Q, lambda ctx: ran.append(ctx.id), replicas=1, replicas_timeout_ms=100, poll_interval=0.05
    )
    stuck.start()
    try:
        assert _until(lambda: stuck.stats.not_replicated >= 2)
    finally:
        stuck.stop()
    assert ran == []
    row = pair.row(pair.m, "w2")
    assert row["state"] == "pending" and row["tries"] == "0", row


def test_the_asyncio_worker_gives_back_what_the_replicas_do_not_confirm(pair: Pair) -> None:
    async def main() -> None:
        client = pair.aclient()
        await client.enqueue(Q, b"p", job_id="aw")
        pair.replica.stop()
        ran: list[str] = []

        async def handler(ctx: emq.JobContext) -> None:
            ran.append(ctx.id)

        worker = emq.Worker(client, Q, handler, replicas=1, replicas_timeout_ms=100, poll_interval=0.05)
        worker.start()
        for _ in range(200):
            if worker.stats.not_replicated >= 2:
                break
            await asyncio.sleep(0.02)
        worker.stop()
        await worker.__aexit__(None, None, None)
        assert worker.stats.not_replicated >= 2 and ran == []
        with pytest.raises(echomq.NotReplicated):
            await emq.Worker(client, Q, handler, replicas=1, replicas_timeout_ms=100).work_one()
        await client.redis.aclose()

    asyncio.run(main())
    row = pair.row(pair.m, "aw")
    assert (row["state"], row["tries"]) == ("pending", "0")


def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@needs("waitaof", "replicas_aof=True is refused before anything is claimed")
def test_waitaof_counts_replicas_that_wrote_their_aof(server_factory: ServerFactory) -> None:
    master = server_factory(FAST_SYNC)
    replica = server_factory(["--replicaof", master.host, str(master.port), "--appendonly", "yes"])
    pair = Pair(master, replica, "module")
    client = pair.client()
    client.enqueue(Q, b"p", job_id="f1")
    job = client.claim(Q, 60_000, replicas=1, replicas_timeout_ms=4000, replicas_aof=True)
    assert job is not None and pair.row(pair.s, "f1")["token"] == job.token


@pytest.mark.skipif(supports("waitaof"), reason="this server has WAITAOF")
def test_replicas_aof_on_a_server_without_waitaof_is_refused_before_claiming(
    server_factory: ServerFactory,
) -> None:
    master = server_factory(FAST_SYNC)
    client = echomq.Client(master.client(socket_timeout=5))
    client.enqueue(Q, b"p", job_id="n1")
    with pytest.raises(echomq.BadArgument, match="WAITAOF"):
        client.claim(Q, 60_000, replicas=1, replicas_aof=True)
    assert master.client().hget(K.job("n1"), "state") == b"pending"  # nothing was claimed


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"replicas": -1}, ValueError, "replicas must be between 0 and"),
        ({"replicas": "1"}, TypeError, "replicas must be an int"),
        ({"replicas": True}, TypeError, "replicas must be an int"),
        ({"replicas": 1, "replicas_timeout_ms": 0}, ValueError, "replicas_timeout_ms must be >= 1"),
        ({"replicas": 1, "replicas_timeout_ms": 1.5}, TypeError, "replicas_timeout_ms must be an int"),
        ({"replicas": 1, "replicas_aof": 1}, TypeError, "replicas_aof must be a bool"),
        ({"replicas_aof": True}, ValueError, "replicas_aof=True needs replicas >= 1"),
        ({"replicas": 1, "replicas_timeout_ms": 5000}, ValueError, "shorter than the connection's socket"),
    ],
)
def test_the_options_are_checked_before_anything_is_sent(
    server: EmbeddedServer, kwargs: dict[str, object], error: type[Exception], text: str
) -> None:
    r = server.client(socket_timeout=5)
    client = echomq.Client(r)
    r.delete(K.pending)
    client.enqueue(Q, b"p", job_id="v1")
    with pytest.raises(error, match=text):
        client.claim(Q, 60_000, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(error, match=text):
        echomq.Worker(client, Q, lambda ctx: None, **kwargs)  # type: ignore[arg-type]
    assert r.hget(K.job("v1"), "state") == b"pending"
    r.delete(K.job("v1"), K.pending)
