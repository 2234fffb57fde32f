"""Correct while Redis Cluster reshards (issue 12, section 1).

Job rows, the queue's settings and its failed metric are derived from
<base>, not declared: Redis cannot redirect a command for them.  While a
queue's slot migrates, a verb that would touch a derived key the node does
not hold answers TRYAGAIN and writes nothing (emq_keys.c,
emq_open_derived): it never creates a second copy of a row that already
moved, and never answers "no such job" for a job that lives on the other
node.  The targeted tests move the keys one at a time, as `redis-cli
--cluster reshard` does; the last test reshards for real under load.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio.cluster
from redis.cluster import RedisCluster, key_slot

import echomq
import echomq.asyncio as aemq
from echomq.keyspace import QueueKeys, queue_keys
from echomq.testing import EmbeddedServer

from ..clusters import cluster_cli, flush, node_id, owner, queue_in_slot, start_cluster
from ..conftest import ServerFactory
from ..helpers import queued

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nodes(server_factory: ServerFactory) -> Iterator[list[EmbeddedServer]]:
    started = start_cluster(server_factory, 3)
    yield started
    for n in started:
        n.stop()


class SlotMove:
    """One slot migrating from its owner to another node, key by key (as reshard does)."""

    def __init__(self, nodes: list[EmbeddedServer], keys: QueueKeys) -> None:
        self.slot = key_slot(keys.base.encode())
        self.src_node = owner(nodes, keys.base)
        self.dst_node = next(n for n in nodes if n is not self.src_node)
        self.nodes = nodes
        self.src, self.dst = self.src_node.client(), self.dst_node.client()
        self.dst.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", node_id(self.src_node))
        self.src.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", node_id(self.dst_node))

    def migrate(self, *keys: str) -> None:
        for key in keys:
            done = self.src.execute_command("MIGRATE", self.dst_node.host, self.dst_node.port, key, 0, 5000)
            assert done == b"OK"

    def asking(self, *args: object) -> object:
        """A command sent to the importing node after ASKING, as a client that got -ASK does."""
        pipe = self.dst.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.execute_command(*args)
        return pipe.execute(raise_on_error=False)[1]

    def finish(self) -> None:
        """Move what is left and give the slot to the destination everywhere."""
        while keys := self.src.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 100):
            self.migrate(*(k.decode() for k in keys))
        dst_id = node_id(self.dst_node)
        for node in self.nodes:
            c = node.client()
            c.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", dst_id)
            c.close()
        self.src.close()
        self.dst.close()


def tryagain(conn: redis.Redis, *args: object) -> bool:
    try:
        conn.execute_command(*args)
    except redis.exceptions.TryAgainError:
        return True
    return False


def digest(conn: redis.Redis) -> bytes:
    return conn.execute_command("DEBUG", "DIGEST")  # type: ignore[no-any-return]


def test_claim_on_the_source_writes_no_stub_for_a_row_that_moved(nodes: list[EmbeddedServer]) -> None:
    flush(nodes)  # the digests below see this test's keys only
    keys = queue_keys(queue_in_slot(101, "stub"))
    src = owner(nodes, keys.base).client()
    for job_id in ("j1", "j2"):
        src.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, job_id, "payload")
    src.zadd(keys.active, {"other": 2**40})  # an active set, so both declared keys are here
    move = SlotMove(nodes, keys)
    move.migrate(keys.job("j1"))
    before = digest(move.src), move.src.execute_command("CLUSTER", "COUNTKEYSINSLOT", move.slot)
    # Before the fix: CLAIM claimed j1 and wrote a stub row {attempts 1, state active} here.
    assert tryagain(move.src, "EMQ.CLAIM", keys.pending, keys.active, keys.base, 60_000)
    assert (digest(move.src), move.src.execute_command("CLUSTER", "COUNTKEYSINSLOT", move.slot)) == before
    move.finish()  # the later MIGRATE of every key succeeds: no BUSYKEY
    dst = move.dst_node.client()
    assert dst.hget(keys.job("j1"), "payload") == b"payload"
    dst.close()


def test_enqueue_and_cancel_on_the_source_see_a_row_that_moved(nodes: list[EmbeddedServer]) -> None:
    flush(nodes)  # the digests below see this test's keys only
    keys = queue_keys(queue_in_slot(202, "moved"))
    src = owner(nodes, keys.base).client()
    src.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "j1", "payload")
    src.hset(keys.meta, "done_ttl_ms", 60_000)
    move = SlotMove(nodes, keys)
    move.migrate(keys.job("j1"))
    before = digest(move.src)
    # Before the fix: ENQUEUE answered :1 (a duplicate), CANCEL answered -1 (no such job).
    assert tryagain(move.src, "EMQ.ENQUEUE", keys.pending, keys.base, "j1", "again")
    assert tryagain(move.src, "EMQ.CANCEL", keys.pending, keys.base, "j1", "why")
    assert digest(move.src) == before
    move.finish()


def test_cancel_on_the_target_after_asking_does_not_guess(nodes: list[EmbeddedServer]) -> None:
    flush(nodes)  # the digests below see this test's keys only
    keys = queue_keys(queue_in_slot(303, "ask"))
    src = owner(nodes, keys.base).client()
    src.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "j1", "payload")
    move = SlotMove(nodes, keys)
    move.migrate(keys.pending)  # the set moved, the row did not yet
    before = digest(move.dst)
    # Before the fix: "requested", for a job that was pending (its row on the source).
    reply = move.asking("EMQ.CANCEL", keys.pending, keys.base, "j1", "why")
    assert isinstance(reply, redis.exceptions.TryAgainError), reply
    assert digest(move.dst) == before
    move.finish()
    dst = move.dst_node.client()
    assert dst.execute_command("EMQ.CANCEL", keys.pending, keys.base, "j1", "why") == b"cancelled"
    dst.close()


def test_a_stable_slot_answers_as_before(nodes: list[EmbeddedServer]) -> None:
    # The check only runs for an absent derived key, and only says TRYAGAIN
    # while the slot moves: a stable slot's absent rows are absent.
    keys = queue_keys(queue_in_slot(404, "stable"))
    conn = owner(nodes, keys.base).client()
    assert conn.execute_command("EMQ.CANCEL", keys.pending, keys.base, "nope", "why") == -1
    assert conn.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "new", "p") == 1
    assert conn.execute_command("EMQ.CLAIM", keys.pending, keys.active, keys.base, 1000)[0][0] == b"new"
    conn.close()


# -- resharding under load ----------------------------------------------------------


def reshard(
    cli: str, node: EmbeddedServer, src: str, dst: str, pipeline: int
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            cli, "--cluster", "reshard", f"{node.host}:{node.port}",
            "--cluster-from", src, "--cluster-to", dst, "--cluster-slots", "1",
            "--cluster-yes", "--cluster-pipeline", str(pipeline),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def check_clean(cli: str, node: EmbeddedServer) -> None:
    done = subprocess.run(
        [cli, "--cluster", "check", f"{node.host}:{node.port}"], capture_output=True, text=True, timeout=60
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "[OK] All 16384 slots covered" in out, out
    assert "[WARNING]" not in out and "[ERR]" not in out, out  # an open slot is a warning


def test_resharding_a_queues_slot_under_load(nodes: list[EmbeddedServer]) -> None:
    cli = cluster_cli()
    # A queue in the first slot of its node: `--cluster-slots 1` moves exactly it.
    first = nodes[0].client()
    slots = first.execute_command("CLUSTER", "SLOTS")
    first.close()
    start, _end, master, *_ = min(slots, key=lambda s: s[0])
    name = queue_in_slot(start, "rs")
    keys = queue_keys(name)
    a = next(n for n in nodes if n.port == int(master[1]))
    b = next(n for n in nodes if n is not a)
    rc = RedisCluster(host=a.host, port=a.port)
    client = echomq.Client(rc)
    total = 600
    for i in range(total):
        client.enqueue(name, f"{i}".encode(), job_id=f"j{i:03}")

    ran: Counter[str] = Counter()
    stop = threading.Event()
    cancel_replies: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        ran[job.id] += 1
        time.sleep(0.02)
        cancel.raise_if_cancelled()

    def canceller() -> None:
        rng = random.Random(3)
        while not stop.is_set():
            job_id = f"j{rng.randrange(total):03}"
            try:
                outcome = client.cancel(name, job_id, reason="operator")
            except echomq.JobGone:
                outcome = "gone"
            except redis.exceptions.RedisError:
                continue  # a cluster error the client could not retry away: try another
            cancel_replies.setdefault(job_id, []).append(outcome)
            time.sleep(0.02)

    def async_worker() -> None:
        async def run() -> None:
            arc = redis.asyncio.cluster.RedisCluster(host=a.host, port=a.port)
            aclient = aemq.Client(arc)

            async def ahandler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
                ran[job.id] += 1
                await asyncio.sleep(0.02)
                cancel.raise_if_cancelled()

            worker = aemq.Worker(aclient, name, ahandler, lease_ms=2_000, concurrency=4, poll_interval=0.02)
            task = asyncio.create_task(worker.run())
            while not stop.is_set():
                await asyncio.sleep(0.05)
            worker.stop()
            await task
            await arc.aclose()

        try:
            asyncio.run(run())
        except BaseException as exc:  # reported below
            errors.append(exc)

    sync_worker = echomq.Worker(client, name, handler, lease_ms=2_000, concurrency=4, poll_interval=0.02)
    reaper = echomq.Reaper(client, name, interval=0.2, max_stalled=50)
    threads = [threading.Thread(target=canceller), threading.Thread(target=async_worker)]
    sync_worker.start()
    reaper.start()
    for t in threads:
        t.start()
    for n in nodes:
        c = n.client()
        c.config_resetstat()
        c.close()
    try:
        time.sleep(0.3)
        slow = reshard(cli, a, node_id(a), node_id(b), pipeline=1)  # one key per MIGRATE
        assert slow.returncode == 0, slow.stdout + slow.stderr
        fast = reshard(cli, a, node_id(b), node_id(a), pipeline=1000)  # and back, in one go
        assert fast.returncode == 0, fast.stdout + fast.stderr
        check_clean(cli, a)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            counts = [queued(rc, keys), rc.zcard(keys.active)]
            if counts == [0, 0]:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        sync_worker.stop()
        reaper.stop()
        for t in threads:
            t.join()
    assert not errors, errors
    # The migrations really overlapped the work: verbs met a moving row and said TRYAGAIN.
    tryagains = 0
    for n in (a, b):
        c = n.client()
        tryagains += int(c.info("errorstats").get("errorstat_TRYAGAIN", {}).get("count", 0))
        c.close()
    assert tryagains > 0, "the reshard did not overlap the load: the test proves nothing"

    # Every job ended exactly once, in one final state, its row whole.
    states: Counter[str] = Counter()
    for i in range(total):
        row = rc.hgetall(keys.job(f"j{i:03}"))
        assert row.get(b"payload") == f"{i}".encode(), f"j{i:03}: a stub or lost row {row}"
        states[row[b"state"].decode()] += 1
    assert set(states) <= {"done", "cancelled"} and sum(states.values()) == total, states
    assert rc.zcard(keys.dead) == 0
    # No CANCEL answered "gone" for a job that existed, and none "requested" for a job that was waiting.
    assert not [j for j, replies in cancel_replies.items() if "gone" in replies]
    for job_id, replies in cancel_replies.items():
        state = rc.hget(keys.job(job_id), "state")
        if "cancelled" in replies:
            assert state == b"cancelled", (job_id, replies, state)
    # The slot is where the fast reshard put it, and the other node holds nothing of the queue.
    assert owner(nodes, keys.base) is a
    other = b.client()
    assert other.execute_command("CLUSTER", "COUNTKEYSINSLOT", key_slot(keys.base.encode())) == 0
    other.close()
    rc.close()
