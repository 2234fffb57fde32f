"""Issue 47: a partitioned queue on a 3-master Redis Cluster: its declaration, its partitions'
spread over the masters, the producers' routing, and the verbs that find a job by its id."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import echomq
import echomq.asyncio as emq
from echomq._protocol.partitions import MAX_PARTITIONS, Partitioned, partition_names
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..clusters import flush, owner, start_cluster
from ..conftest import ServerFactory

pytestmark = pytest.mark.slow

Q = "ingest"
K = 9


@pytest.fixture(scope="module")
def nodes(server_factory: ServerFactory) -> Iterator[list[EmbeddedServer]]:
    started = start_cluster(server_factory, 3)
    try:
        yield started
    finally:
        for n in started:
            n.stop()


@pytest.fixture
def client(nodes: list[EmbeddedServer]) -> Iterator[echomq.Client]:
    flush(nodes)
    c = echomq.Client.from_url(nodes[0].url, cluster=True)
    try:
        yield c
    finally:
        c.close()


def test_nine_partitions_spread_three_per_master(nodes: list[EmbeddedServer], client: echomq.Client) -> None:
    client.declare_queue(Q, partitions=K)
    names = client.partitions(Q)
    assert names == list(partition_names(Q, K))
    per_master: dict[int, int] = {}
    for name in names:
        port = owner(nodes, queue_keys(name).pending).port
        per_master[port] = per_master.get(port, 0) + 1
    assert sorted(per_master.values()) == [3, 3, 3], per_master
    # the plain "#i" names would not spread (5, 2, 2 for "ingest"): the reason for the ranges
    plain: dict[int, int] = {}
    for i in range(K):
        port = owner(nodes, queue_keys(f"{Q}#{i}").pending).port
        plain[port] = plain.get(port, 0) + 1
    assert sorted(plain.values()) != [3, 3, 3]


def test_declaring_again_and_a_conflict(nodes: list[EmbeddedServer], client: echomq.Client) -> None:
    client.declare_queue(Q, partitions=K)
    client.declare_queue(Q, partitions=K)  # the same count: nothing changes
    other = echomq.Client.from_url(nodes[1].url, cluster=True)
    try:
        with pytest.raises(echomq.PartitionsChanged) as caught:
            other.declare_queue(Q, partitions=3)
        assert (caught.value.declared, caught.value.asked) == (K, 3)
        assert isinstance(caught.value, ValueError)
        assert other.partitions(Q) == client.partitions(Q)  # the other client reads the server's count
    finally:
        other.close()
    assert client.redis.get(queue_keys(Q).base + "partitions") == str(K).encode()
    for bad in (0, MAX_PARTITIONS + 1):
        with pytest.raises(ValueError, match="partitions"):
            client.declare_queue("other", partitions=bad)
    with pytest.raises(TypeError, match="partitions"):
        client.declare_queue("other", partitions="9")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="#"):
        client.declare_queue("a#b", partitions=2)
    assert client.redis.get(queue_keys("other").base + "partitions") is None


def test_enqueue_many_one_round_trip_per_node_and_every_job_in_its_partition(
    nodes: list[EmbeddedServer], client: echomq.Client
) -> None:
    client.declare_queue(Q, partitions=K)
    ids = client.enqueue_many(Q, [f"p{i}" for i in range(3000)])
    assert len(ids) == len(set(ids)) == 3000
    names = client.partitions(Q)
    per_partition = [client.counts(name).pending for name in names]
    assert sum(per_partition) == 3000
    assert per_partition == [3000 // K + (1 if i < 3000 % K else 0) for i in range(K)] or sorted(
        per_partition
    ) == sorted([334] * 3 + [333] * 6)  # round-robin from a random start
    per_master: dict[int, int] = {}
    for name, n in zip(names, per_partition, strict=True):
        port = owner(nodes, queue_keys(name).pending).port
        per_master[port] = per_master.get(port, 0) + n
    assert all(abs(n / 3000 - 1 / 3) <= 0.10 for n in per_master.values()), per_master
    # each id names its partition, whose row holds the payload
    for i in (0, 1, 2999):
        index = int(ids[i].split("~")[0])
        assert client.redis.hget(queue_keys(names[index]).job(ids[i]), "payload") == f"p{i}".encode()


def test_routing_by_key_group_unique_key_and_id(client: echomq.Client) -> None:
    client.declare_queue(Q, partitions=K)
    by_key = {client.enqueue(Q, b"", partition_key="customer-7").split("~")[0] for _ in range(5)}
    by_group = {client.enqueue(Q, b"", group="tenant-3").split("~")[0] for _ in range(5)}
    assert len(by_key) == 1 and len(by_group) == 1
    first = client.enqueue(Q, b"a", unique_key="u-1")
    again = client.enqueue(Q, b"b", unique_key="u-1")  # the same partition: the holder answers
    assert again == first and not again.created
    client.enqueue(Q, b"", job_id="order-42")
    with pytest.raises(echomq.JobExists):
        client.enqueue(Q, b"", job_id="order-42")  # the same id meets itself
    batch = client.enqueue_many(Q, [b"x", b"y", b"z"], group="tenant-3")
    assert {i.split("~")[0] for i in batch} == by_group


def test_a_job_that_waits_goes_to_the_partition_of_what_it_waits_for(client: echomq.Client) -> None:
    client.declare_queue(Q, partitions=K)
    parent = client.enqueue(Q, b"p", job_id="parent")
    index = int(parent.split("~")[0])
    child = client.enqueue(Q, b"c", after=[parent])  # routed to its parent, not by round-robin
    assert int(child.split("~")[0]) == index
    partition = client.partitions(Q)[index]
    assert client.redis.hget(queue_keys(partition).job(child), "state") == b"waiting"
    router = Partitioned(Q, K)
    key = next(f"k{n}" for n in range(1000) if router.route(f"k{n}", None, None, None) != index)
    elsewhere = client.enqueue(Q, b"o", partition_key=key)
    with pytest.raises(ValueError, match="one partition"):
        client.enqueue(Q, b"c", after=[parent, elsewhere])  # two partitions: refused
    with pytest.raises(ValueError, match="one partition"):
        client.enqueue(Q, b"c", after=[parent], partition_key=key)  # a key that routes elsewhere
    same = next(f"s{n}" for n in range(1000) if router.route(f"s{n}", None, None, None) == index)
    assert int(client.enqueue(Q, b"c", after=[parent], partition_key=same).split("~")[0]) == index


def test_cancel_result_and_job_of_an_id_on_the_logical_queue(
    nodes: list[EmbeddedServer], client: echomq.Client
) -> None:
    client.declare_queue(Q, partitions=K)
    job_id = client.enqueue(Q, b"hello")
    info = client.job(Q, job_id, payload=True)
    assert info is not None and info.payload == b"hello"
    assert client.cancel(Q, job_id) == "cancelled"
    with pytest.raises(echomq.JobCancelled):
        client.result(Q, job_id, timeout=5)
    with pytest.raises(ValueError, match="not an id of the partitioned queue"):
        client.cancel(Q, "no-partition-here")
    with pytest.raises(ValueError, match="not an id"):
        client.job(Q, f"{K}~x")  # a partition past the last
    done = client.enqueue(Q, b"")
    name = client.partitions(Q)[int(done.split("~")[0])]
    job = client.claim(name, 30_000)
    assert job is not None and job.id == done and job.queue == name
    client.complete(job.queue, job.id, job.token, result=b"7")
    finished = client.job(Q, done)
    assert finished is not None and finished.state == "done" and finished.result == b"7"

    async def aio() -> None:
        aclient = emq.Client.from_url(nodes[2].url, cluster=True)
        try:
            await aclient.declare_queue(Q, partitions=K)
            assert await aclient.partitions(Q) == client.partitions(Q)
            with pytest.raises(echomq.JobCancelled):
                await aclient.result(Q, job_id, timeout=5)
            other = await aclient.enqueue(Q, b"", partition_key="customer-7")
            assert (await aclient.job(Q, other)) is not None
            assert await aclient.cancel(Q, other) == "cancelled"
            ids = await aclient.enqueue_many(Q, [b"1", b"2", b"3"])
            assert len({i.split("~")[0] for i in ids}) == 3
            with pytest.raises(echomq.PartitionsChanged):
                await aclient.declare_queue(Q, partitions=2)
        finally:
            await aclient.aclose()

    asyncio.run(aio())


def test_a_queue_never_declared_is_unchanged(client: echomq.Client) -> None:
    job_id = client.enqueue("plain", b"", job_id="j1")
    assert job_id == "j1"
    assert client.partitions("plain") == ["plain"]
    assert client.enqueue_many("plain", [(b"j2", b"")]) == ["j2"]
    assert client.cancel("plain", "j1") == "cancelled"
    assert client.counts("plain").pending == 1
    assert client.redis.get(queue_keys("plain").base + "partitions") is None
    assert client.partitions("plain") == ["plain"] and client.job("plain", "j2") is not None


def test_a_rate_limit_is_split_into_shares_that_add_up_to_it(client: echomq.Client) -> None:
    client.declare_queue(Q, partitions=K)
    client.enqueue_many(Q, [b""] * 300)  # 33 or 34 in each partition
    limit = client.set_rate_limit(Q, 95, 60_000)  # one window for the whole test
    assert (limit.max, limit.per_ms, limit.used) == (95, 60_000, 0)
    shares = [client.rate_limit(name).max for name in client.partitions(Q)]
    assert shares == [11] * 5 + [10] * 4 and sum(shares) == 95  # type: ignore[arg-type]
    claimed = sum(len(client.claim_many(name, 30_000, 100)) for name in client.partitions(Q))
    assert claimed == 95  # every share used, none exceeded: the queue-wide bound is exact
    assert client.rate_limit(Q).used == 95
    with pytest.raises(ValueError, match="at least 9"):
        client.set_rate_limit(Q, 8, 1000)
    assert client.rate_limit(Q).max == 95  # the refused call changed nothing
    until = client.back_off(Q, 5_000).backoff_until
    # each partition's back-off is its own master's now + 5 s: the logical one is the latest of them,
    # the others a few ms earlier (the masters answer the pipelines one after another)
    offs = [client.rate_limit(name).backoff_until for name in client.partitions(Q)]
    assert until is not None and max(o or 0 for o in offs) == until
    assert all(o is not None and until - 2_000 < o <= until for o in offs), (until, offs)
    assert client.remove_rate_limit(Q).max is None
    assert all(client.rate_limit(name).max is None for name in client.partitions(Q))

    async def aio() -> None:
        aclient = emq.Client.from_url(client_url(client), cluster=True)
        try:
            assert (await aclient.set_rate_limit(Q, 18, 1000)).max == 18
            assert (await aclient.rate_limit(Q)).max == 18
            assert (await aclient.remove_rate_limit(Q)).max is None
        finally:
            await aclient.aclose()

    asyncio.run(aio())


def client_url(client: echomq.Client) -> str:
    node = client.redis.get_default_node()
    return f"redis://{node.host}:{node.port}"


def test_inspect_shows_one_logical_queue_with_its_partitions(
    nodes: list[EmbeddedServer], client: echomq.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.declare_queue(Q, partitions=K)
    client.enqueue_many(Q, [b""] * 90)
    assert main(["--cluster", "--url", nodes[0].url, "inspect", Q]) == 0
    out = capsys.readouterr().out
    assert f"queue {Q}  (partitioned: {K} partitions)" in out
    assert "pending 90   active 0   delayed 0   dead 0" in out
    for name in client.partitions(Q):
        port = owner(nodes, queue_keys(name).pending).port
        assert any(line.split()[:3] == [name, f"127.0.0.1:{port}", "10"] for line in out.splitlines()), out
