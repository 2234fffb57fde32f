"""``client.counts`` and ``client.groups`` read one snapshot each (issue 45).

Each is one MULTI that reads the names of the queue's groups (the index and the ring) with
the lanes (and hashes) of the groups the read before found, made again while the snapshot
holds a group (or a priority level) that read did not know of.  A second client moves jobs
between states as fast as it can while the first reads: totals that hold only for one
instant must hold in every read.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import pytest
import redis

import echomq
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

