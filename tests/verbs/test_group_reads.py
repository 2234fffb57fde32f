"""``client.counts`` and ``client.groups`` read one snapshot each; ``client.pending`` (and so
``echomq inspect``) lists the jobs waiting in groups' lanes (issue 45, bullmq #3210).

Each is one MULTI that reads the names of the queue's groups (the index and the ring) with
the lanes (and hashes) of the groups the read before found, made again while the snapshot
holds a group (or a priority level) that read did not know of.  A second client moves jobs
between states as fast as it can while the first reads: totals that hold only for one
instant must hold in every read.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator

import pytest
import redis

import echomq
import echomq.asyncio as aemq
from echomq.cli import main
from echomq.testing import EmbeddedServer, queue_problems

pytestmark = [pytest.mark.backends]

READS = 300


@contextlib.contextmanager
def _moving(server: EmbeddedServer, step: Callable[[echomq.Client], None]) -> Iterator[None]:
    """Run ``step`` in a loop on its own connection until the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []
    conn = server.client()
    mover = echomq.Client(conn)

    def run() -> None:
        try:
            while not stop.is_set():
                step(mover)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        conn.close()
    assert errors == []


def _claim_and_release(c: echomq.Client) -> None:
    for job in c.claim_many("q", 30_000, 10):
        c.release("q", job.id, job.token)


def test_counts_is_one_instant_while_jobs_move_between_lanes_and_active(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer
) -> None:
    client.enqueue_many("q", [(f"a{i}", b"") for i in range(2)], group="a")
    client.enqueue_many("q", [(f"b{i}", b"") for i in range(2)], group="b")
    client.enqueue("q", b"", "plain")
    client.enqueue("q", b"", "p5", priority=5)
    client.enqueue("q", b"", "p-3", priority=-3)
    seen_active = 0
    with _moving(server, _claim_and_release):
        for _ in range(READS):
            c = client.counts("q")
            assert c.pending + c.active == 7, c  # a job is waiting (its lane, a list, a level) or active
            assert set(c.by_priority) <= {-3, 0, 5}
            seen_active = max(seen_active, c.active)
    assert seen_active > 0  # the reads did meet jobs in flight
    final = client.counts("q")
    assert (final.pending, final.active, final.by_priority) == (7, 0, {-3: 1, 0: 1, 5: 1})
    assert queue_problems(r, "q") == []


def test_groups_never_shows_a_group_that_was_gone_when_its_names_were_read(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer
) -> None:
    made = iter(range(10**9))

    def churn(c: echomq.Client) -> None:  # a new group comes, its one job runs, the group goes
        g = f"g{next(made)}"
        c.enqueue("q", b"", f"j-{g}", group=g)
        for job in c.claim_many("q", 30_000, 10):
            c.complete("q", job.id, job.token)

    listed = 0
    with _moving(server, churn):
        for _ in range(READS):
            rows = client.groups("q")
            assert all(g.waiting + g.active >= 1 for g in rows), rows  # a group's hash goes with its work
            assert len(rows) <= 1, rows  # at most one group has work at any instant
            listed += len(rows)
            c = client.counts("q")
            assert c.pending + c.active <= 1, c
    assert listed > 0
    assert client.groups("q") == [] and queue_problems(r, "q") == []


def test_a_level_or_a_group_met_late_is_read_again_not_left_out(
    r: redis.Redis, client: echomq.Client
) -> None:
    levels = list(range(-20, 21, 4))
    for p in levels:
        client.enqueue("q", b"", f"p{p}", priority=p)
    for g in ("x", "y", "z"):
        client.enqueue("q", b"", f"j{g}", group=g)
    c = client.counts("q")
    assert c.pending == len(levels) + 3
    assert c.by_priority == {p: 1 for p in levels}
    assert [g.name for g in client.groups("q")] == ["x", "y", "z"]
    assert queue_problems(r, "q") == []


def test_pending_lists_the_jobs_waiting_in_group_lanes_with_their_group_in_claim_order(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "u0")
    client.enqueue("q", b"", "u-2", priority=-2)
    client.enqueue_many("q", [("b0", b""), ("b1", b"")], group="b")
    client.enqueue_many("q", [("a0", b""), ("a1", b""), ("a2", b"")], group="a")
    client.enqueue("q", b"", "a-hi", group="a", priority=-1)  # priorities order within a group
    client.enqueue("q", b"", "a-late", group="a", delay_ms=3_600_000)
    client.set_group_limit("q", "b", max_active=1)
    client.pause_group("q", "b")  # held back: still waiting, still listed
    listed = client.pending("q")
    assert [(j.id, j.group) for j in listed] == [
        ("u-2", None),
        ("u0", None),
        ("a-hi", "a"),
        ("a0", "a"),
        ("a1", "a"),
        ("a2", "a"),
        ("b0", "b"),
        ("b1", "b"),
        ("a-late", "a"),  # delayed, last
    ]
    assert [j.priority for j in listed[2:4]] == [-1, 0] and listed[-1].delayed
    assert len(listed) == client.counts("q").pending + client.counts("q").delayed
    pages = [client.pending("q", offset=o, count=3) for o in range(0, 9, 3)]
    assert [j.id for page in pages for j in page] == [j.id for j in listed]  # pages cut across lanes
    client.resume_group("q", "b")
    taken = []
    while (job := client.claim("q", 30_000)) is not None:  # the claims take each group in that order
        taken.append(job.id)
    assert [i for i in taken if i.startswith("a")] == ["a-hi", "a0", "a1", "a2"]
    assert [i for i in taken if i.startswith("b")] == ["b0"]  # capped at 1
    client.release("q", "a0", _token(r, "a0"))  # back to its group's head
    assert [(j.id, j.group) for j in client.pending("q")] == [("a0", "a"), ("b1", "b"), ("a-late", "a")]
    assert queue_problems(r, "q") == []


def _token(r: redis.Redis, job_id: str) -> str:
    token = r.hget(f"emq:{{q}}:job:{job_id}", "token")
    assert token is not None
    return token.decode() if isinstance(token, bytes) else str(token)


def test_inspect_shows_the_group_of_each_job_next_to_run(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    c = echomq.Client(server.client())
    c.enqueue("q", b"", "plain")
    c.enqueue("q", b"", "t0", group="tenant-1")
    capsys.readouterr()
    assert main(["--url", server.url, "inspect", "q"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("next to run") :].splitlines()
    assert section[1].split() == ["job", "task", "priority", "group"], out
    rows = [line.split() for line in section[2:] if line.split()[:1] in (["plain"], ["t0"])]
    assert [(row[0], row[-1]) for row in rows] == [("plain", "0"), ("t0", "tenant-1")], out


def test_the_asyncio_client_reads_the_same(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer, backend: str
) -> None:
    client.enqueue_many("q", [("a0", b""), ("a1", b"")], group="a")
    client.enqueue("q", b"", "b0", group="b", priority=2)
    client.enqueue("q", b"", "p3", priority=3)

    async def run() -> tuple[echomq.QueueCounts, list[echomq.GroupInfo], list[echomq.PendingJob]]:
        aclient = aemq.Client.from_url(server.url, backend=backend)
        try:
            return await aclient.counts("q"), await aclient.groups("q"), await aclient.pending("q")
        finally:
            await aclient.aclose()

    counts, groups, pending = asyncio.run(run())
    same = dataclasses.replace(client.counts("q"), server_time=counts.server_time)  # the clock moved on
    assert (counts, groups) == (same, client.groups("q"))
    assert counts.pending == 4 and counts.by_priority == {3: 1}  # a group's levels are its lane's
    assert [(j.id, j.group, j.priority) for j in pending] == [
        ("p3", None, 3),
        ("a0", "a", 0),
        ("a1", "a", 0),
        ("b0", "b", 2),
    ]
    assert [(j.id, j.group) for j in client.pending("q")] == [(j.id, j.group) for j in pending]
    assert queue_problems(r, "q") == []
