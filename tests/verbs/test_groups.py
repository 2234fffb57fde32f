"""Groups, stage 1 (issue 45; docs/concepts/flow-control.md, "Groups"), on both backends.

``ENQUEUE ... GROUP <g>`` (and ENQUEUEMANY's, for the whole call) keeps the name in the row's
``group``; every claim adds the jobs it hands out to ``<base>group:<g>``'s ``active``, and the
"left active" hook takes one off on every path out of ``<base>active``.  The invariant, exact
after every command: the count equals the group's jobs in ``active`` (``queue_problems``,
``group_problems``).  One test per path out of active; bad names refused with nothing written;
ungrouped jobs unchanged (no group key ever appears).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

import echomq
import echomq.asyncio as aemq
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, group_problems, queue_problems

from ..conftest import ServerFactory, server_now_ms, wait_for_replica
from ..helpers import digest

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]


def gkey(group: str, queue: str = "q") -> str:
    return queue_keys(queue).base + "group:" + group


def lane(group: str, queue: str = "q") -> str:
    return queue_keys(queue).base + "g:" + group


def ring(queue: str = "q") -> str:
    return queue_keys(queue).base + "groups"


def active_of(r: redis.Redis, group: str, queue: str = "q") -> int:
    return int(r.hget(gkey(group, queue), "active") or 0)


def send(client: echomq.Client, *args: object) -> object:
    keys = queue_keys("q")
    return client._send(("EMQ.ENQUEUE", keys.pending, keys.base, *args))


def ok(r: redis.Redis, queue: str = "q") -> None:
    assert queue_problems(r, queue) == []


# -- enqueue -------------------------------------------------------------------------------


def test_the_row_keeps_its_group_and_the_job_waits_in_its_groups_lane(
    r: redis.Redis, client: echomq.Client
) -> None:
    keys = queue_keys("q")
    assert client.enqueue("q", b"x", "a", group="tenant-1") == "a"
    client.enqueue("q", b"y", "b")
    assert r.hget(keys.job("a"), "group") == b"tenant-1"
    assert not r.hexists(keys.job("b"), "group")
    assert r.lrange(keys.pending, 0, -1) == [b"b"]
    assert r.zrange(lane("tenant-1"), 0, -1) == [b"a"]
    assert r.lrange(ring(), 0, -1) == [b"", b"tenant-1"]
    assert r.hgetall(gkey("tenant-1")) == {b"ring": b"1"}  # nothing active: only the ring flag
    ids = client.enqueue_many("q", [("c", b""), ("d", b"")], group="t2", priority=3)
    assert ids == ["c", "d"]
    assert [r.hget(keys.job(i), "group") for i in ids] == [b"t2", b"t2"]
    assert send(client, "e", b"", "group", "g.1:x@y_z-Q9") == 1
    assert r.hget(keys.job("e"), "group") == b"g.1:x@y_z-Q9"
    ok(r)


@pytest.mark.parametrize("name", ["", "a b", "é", "a{b}", "x" * 129, "a*", "a/b"])
def test_a_bad_group_name_is_refused_and_nothing_is_written(
    r: redis.Redis, client: echomq.Client, name: str
) -> None:
    keys = queue_keys("q")
    before = digest(r)
    refused = r"GROUP must be 1 to 128 bytes of letters, digits and -_\.:@"
    with pytest.raises(redis.ResponseError, match=refused):
        send(client, "a", b"", "GROUP", name.encode())
    with pytest.raises(redis.ResponseError, match="GROUP must be 1 to 128 bytes"):
        client._send(("EMQ.ENQUEUEMANY", keys.pending, keys.base, 1, "a", b"", "GROUP", name.encode()))
    assert digest(r) == before
    with pytest.raises(ValueError, match="group must be 1 to 128 bytes"):
        client.enqueue("q", b"", "a", group=name)
    with pytest.raises(ValueError, match="group must be"):
        client.enqueue_many("q", [b""], group=name)
    assert digest(r) == before


def test_the_longest_name_is_taken_and_group_twice_is_a_syntax_error(
    r: redis.Redis, client: echomq.Client
) -> None:
    assert client.enqueue("q", b"", "a", group="x" * 128) == "a"
    with pytest.raises(TypeError, match="group must be a str"):
        client.enqueue("q", b"", "b", group=b"g")  # type: ignore[arg-type]
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="syntax error"):
        send(client, "b", b"", "GROUP", "g", "GROUP", "h")
    with pytest.raises(redis.ResponseError, match="syntax error"):
        send(client, "b", b"", "GROUP")
    assert digest(r) == before


# -- the count, on every path --------------------------------------------------------------


def claim_all(client: echomq.Client, n: int, lease_ms: int = 30_000) -> list[echomq.Job]:
    jobs = client.claim_many("q", lease_ms, n)
    assert len(jobs) == n
    return jobs


def test_a_claim_counts_its_jobs_per_group_and_complete_takes_them_off(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue_many("q", [("a1", b""), ("a2", b""), ("a3", b"")], group="a")
    client.enqueue_many("q", [("b1", b"")], group="b")
    client.enqueue("q", b"", "plain")
    jobs = claim_all(client, 5)
    assert (active_of(r, "a"), active_of(r, "b")) == (3, 1)
    ok(r)
    for j in jobs:
        client.complete("q", j.id, j.token)
        ok(r)
    assert not r.exists(gkey("a")) and not r.exists(gkey("b"))
    # a retried complete changes nothing
    client.complete("q", jobs[0].id, jobs[0].token)
    assert not r.exists(gkey("a"))
    ok(r)


def test_fail_to_a_retry_to_dead_and_cancelled_take_one_off(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [("r", b""), ("d", b""), ("c", b"")], group="g")
    jobs = {j.id: j for j in claim_all(client, 3)}
    assert active_of(r, "g") == 3
    assert client.fail("q", "r", jobs["r"].token, "E: x", max_attempts=3) == "pending"
    assert active_of(r, "g") == 2
    ok(r)
    assert client.fail("q", "d", jobs["d"].token, "E: x", dead=True) == "dead"
    assert active_of(r, "g") == 1
    ok(r)
    assert client.cancel("q", "c") == "requested"
    assert active_of(r, "g") == 1  # the job is still held: only asked
    assert client.fail("q", "c", jobs["c"].token, "E: x") == "cancelled"
    assert r.hgetall(gkey("g")) == {b"ring": b"1"}  # nothing active; r waits in the group's lane
    ok(r)
    # the retried job waits at its lane's tail (FAIL's rule for every job), and counts again when claimed
    client.enqueue("q", b"", "later", group="g")
    assert r.zrange(lane("g"), 0, -1) == [b"r", b"later"]
    again = client.claim("q", 30_000)
    assert again is not None and again.id == "r" and again.attempt == 2
    assert active_of(r, "g") == 1
    ok(r)


def test_release_takes_one_off_and_puts_the_job_back_at_the_head(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue_many("q", [("a", b""), ("b", b""), ("c", b"")], group="g")
    first = client.claim("q", 30_000)
    assert first is not None and first.id == "a" and active_of(r, "g") == 1
    assert client.release("q", "a", first.token) == "pending"
    assert active_of(r, "g") == 0 and r.zrange(lane("g"), 0, 0) == [b"a"]
    ok(r)
    again = claim_all(client, 3)
    assert [j.id for j in again] == ["a", "b", "c"]  # FIFO within the group, kept across the release
    assert active_of(r, "g") == 3
    client.cancel("q", "b")
    assert client.release("q", "b", again[1].token) == "cancelled"
    assert active_of(r, "g") == 2
    ok(r)


def test_sweep_recovery_and_death_take_one_off_each(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [("a", b""), ("b", b""), ("c", b"")], group="g")
    client.enqueue("q", b"", "h", group="h")
    claim_all(client, 4, lease_ms=1)
    assert (active_of(r, "g"), active_of(r, "h")) == (3, 1)
    r.execute_command("DEBUG", "SLEEP", "0.01")
    swept = client.sweep("q", max_stalled=5, limit=100)
    assert swept.recovered == ["a", "b", "c", "h"]
    assert active_of(r, "g") == 0 and active_of(r, "h") == 0
    assert r.zrange(lane("g"), 0, -1) == [b"a", b"b", b"c"]
    ok(r)
    # recovered to the head of their group's lane, in their order: FIFO kept (the ring alternates)
    assert [j.id for j in claim_all(client, 4, lease_ms=1)] == ["a", "h", "b", "c"]
    r.execute_command("DEBUG", "SLEEP", "0.01")
    client.sweep("q", max_stalled=1, limit=2)  # the oldest two die (their second stall)
    assert active_of(r, "g") + active_of(r, "h") == 2
    ok(r)
    client.cancel("q", "h")  # a cancel request on a lapsed job: the sweep ends it cancelled
    client.sweep("q", max_stalled=1, limit=100)
    assert not r.exists(gkey("g")) and not r.exists(gkey("h"))
    ok(r)


def test_complete_claim_counts_the_one_it_ends_and_the_ones_it_takes(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue_many("q", [("a", b""), ("b", b""), ("c", b"")], group="g")
    first = client.claim("q", 30_000)
    assert first is not None and active_of(r, "g") == 1
    keys = queue_keys("q")
    reply = client._send(
        ("EMQ.COMPLETECLAIM", keys.active, keys.job("a"), keys.pending, "a", first.token, 30_000, "COUNT", 2)
    )
    assert reply[0] == 1 and [j[0] for j in reply[1]] == [b"b", b"c"]
    assert active_of(r, "g") == 2
    ok(r)


def test_obliterate_force_takes_the_active_jobs_off(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [(f"j{i}", b"") for i in range(5)], group="g")
    claim_all(client, 3)
    assert active_of(r, "g") == 3
    done = client.obliterate("q", force=True, limit=2)
    assert done is not None
    assert not r.exists(gkey("g"))
    assert [k for k in r.scan_iter(match="emq:{q}:*") if b":req:" not in k] == []  # request records expire


def test_the_checker_names_a_count_that_is_off(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a", group="g")
    claim_all(client, 1)
    assert group_problems(r, "q") == []
    r.hset(gkey("g"), "active", 2)
    assert group_problems(r, "q") == ["group b'g' counts 2 active but 1 of its jobs are in active"]
    r.hset(gkey("other"), "active", 1)  # a hash written by hand: off, and not in the index
    assert len(queue_problems(r, "q")) == 3
    r.zadd(queue_keys("q").base + "groupset", {"other": 0, "ghost": 0})
    assert group_problems(r, "q")[0] == "group b'ghost' is in the index 'emq:{q}:groupset' but has no hash"


def test_a_bad_count_is_refused_by_the_claim_and_the_hook_with_nothing_written(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue_many("q", [("a", b""), ("b", b"")], group="g")
    r.hset(gkey("g"), "active", "x")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="group hash's 'active' field is not an integer"):
        client.claim("q", 30_000)
    assert digest(r) == before
    r.delete(gkey("g"))
    job = client.claim("q", 30_000)
    assert job is not None
    r.hset(gkey("g"), "active", "-1")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="group hash's 'active' field is not an integer"):
        client.complete("q", job.id, job.token)
    assert digest(r) == before
    r.hset(gkey("g"), "active", 9007199254740992)
    with pytest.raises(redis.ResponseError, match="increment or decrement would overflow"):
        client.claim("q", 30_000)
    r.delete(gkey("g"))
    r.set(gkey("g"), "s")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        client.complete("q", job.id, job.token)


def test_ungrouped_jobs_never_make_a_group_key(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [(f"j{i}", b"") for i in range(4)])
    jobs = claim_all(client, 4, lease_ms=1)
    client.complete("q", jobs[0].id, jobs[0].token)
    client.fail("q", jobs[1].id, jobs[1].token, "E: x")
    client.release("q", jobs[2].id, jobs[2].token)
    r.execute_command("DEBUG", "SLEEP", "0.01")
    client.sweep("q")
    assert list(r.scan_iter(match="*group*")) == []
    ok(r)


def test_many_claimers_at_once_keep_the_count_exact(r: redis.Redis, client: echomq.Client) -> None:
    groups = [f"g{i}" for i in range(5)]
    for g in groups:
        client.enqueue_many("q", [(f"{g}-{i}", b"") for i in range(40)], group=g)
    errors: list[BaseException] = []
    released: set[str] = set()
    lock = threading.Lock()

    def work() -> None:
        try:
            while True:
                job = client.claim("q", 30_000)
                if job is None:
                    return
                with lock:
                    again = job.id.endswith("3") and job.id not in released
                    released.add(job.id)
                if again:  # a release gives the try back: released once each
                    client.release("q", job.id, job.token)
                else:
                    client.complete("q", job.id, job.token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [k for k in r.scan_iter(match=gkey("*"))] == []
    ok(r)


def test_a_delayed_grouped_job_counts_once_claimed(r: redis.Redis, client: echomq.Client) -> None:
    now = server_now_ms(r)
    client.enqueue("q", b"", "a", group="g", run_at_ms=now - 10)
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a" and active_of(r, "g") == 1
    ok(r)


# -- ACL: <base>group:<g> is a derived key, checked before it is read ----------------------

# Every key of queue q but its group hashes (the lanes and the ring included).
NO_GROUPS = [f"~emq:{{q}}:{k}" for k in ("pending", "active", "dead", "priority", "delayed", "meta", "limit",
                                        "queue", "job:*", "req:*", "unique:*", "metrics:*", "groups",
                                        "g:*")]  # fmt: skip


@pytest.fixture
def no_groups(server: EmbeddedServer, r: redis.Redis) -> echomq.Client:
    """A client whose user may use every key of queue q but ``<base>group:*`` (read-only there)."""
    r.execute_command("ACL", "SETUSER", "nogroups", "reset", "on", ">pw", "+@all", "&*", *NO_GROUPS,
                      "%R~emq:{q}:group:*")  # fmt: skip
    return echomq.Client(server.client(username="nogroups", password="pw"))


def test_a_claim_and_a_complete_need_write_access_to_the_group_count(
    r: redis.Redis, client: echomq.Client, no_groups: echomq.Client
) -> None:
    no_groups.enqueue("q", b"", "plain")
    with pytest.raises(redis.ResponseError, match="no permissions"):
        no_groups.enqueue("q", b"", "a", group="g")  # it writes the group's ring flag
    client.enqueue("q", b"", "a", group="g")
    plain = no_groups.claim("q", 30_000)
    assert plain is not None and plain.id == "plain"  # an ungrouped job needs no group key
    no_groups.complete("q", plain.id, plain.token)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="no permissions"):
        no_groups.claim("q", 30_000)
    assert digest(r) == before
    job = client.claim("q", 30_000)
    assert job is not None and active_of(r, "g") == 1
    before = digest(r)
    for refused in (
        lambda: no_groups.complete("q", job.id, job.token),
        lambda: no_groups.fail("q", job.id, job.token, "E: x"),
        lambda: no_groups.release("q", job.id, job.token),
    ):
        with pytest.raises(redis.ResponseError, match="no permissions"):
            refused()
        assert digest(r) == before
    client.complete("q", job.id, job.token)
    ok(r)


# -- replication and the AOF: absolute effects ---------------------------------------------


@pytest.mark.slow
def test_a_replica_and_the_aof_hold_the_masters_counts(
    server_factory: ServerFactory, backend: str, tmp_path: Path
) -> None:
    load = backend == "module"
    master = server_factory(["--repl-diskless-sync-delay", "0", "--appendonly", "yes",
                             "--appendfsync", "always"], dir=tmp_path, load_module=load)  # fmt: skip
    replica = server_factory(["--replicaof", master.host, str(master.port)], load_module=load)
    m, s = master.client(), replica.client()
    client = echomq.Client(m)
    assert client.backend == backend
    for g in ("g1", "g2", "g3"):
        client.enqueue_many("q", [(f"{g}-{i}", b"") for i in range(6)], group=g)
    jobs = client.claim_many("q", 30_000, 12)
    client.complete("q", jobs[0].id, jobs[0].token)
    client.fail("q", jobs[1].id, jobs[1].token, "E: x")
    client.release("q", jobs[2].id, jobs[2].token)
    for j in jobs[3:]:  # lapsed leases, without request records that expire during the test
        m.zadd(queue_keys("q").active, {j.id: 5}, xx=True)
    client.sweep("q", max_stalled=1, limit=3)
    client.claim_many("q", 30_000, 4)
    assert m.keys("emq:{q}:group:*")
    assert queue_problems(m, "q") == []
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert digest(s) == digest(m)
    expected = digest(m)
    m.close()
    s.close()
    replica.stop()
    master.stop()
    replay = server_factory(["--appendonly", "yes"], dir=tmp_path, load_module=load)
    again = replay.client()
    assert digest(again) == expected
    again.close()


# -- cluster: every key of a queue in its slot ---------------------------------------------


def test_the_group_count_is_in_the_queues_slot() -> None:
    assert key_slot(gkey("tenant-42").encode()) == key_slot(queue_keys("q").pending.encode())
    assert key_slot(gkey("a:b@c.d", "other").encode()) == key_slot(queue_keys("other").active.encode())


def woken_claim(server: EmbeddedServer, r: redis.Redis, wake: Callable[[], object]) -> list[Any]:
    """A CLAIM of "q" with BLOCK on a connection of its own, and ``wake()`` once the server counts
    it blocked: what the claim answered (a list of one reply; empty if it never answered)."""
    keys = queue_keys("q")
    waiter = server.client()
    got: list[Any] = []
    t = threading.Thread(
        target=lambda: got.append(
            waiter.execute_command("EMQ.CLAIM", keys.pending, keys.active, keys.base, 30_000, "BLOCK", 5_000)
        )
    )
    t.start()
    deadline = server_now_ms(r) + 5_000
    while r.info("clients")["blocked_clients"] < 1 and server_now_ms(r) < deadline:
        pass
    wake()
    t.join(10)
    waiter.close()
    return got


def test_a_blocked_claim_woken_by_a_grouped_job_counts_it(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer, backend: str
) -> None:
    if backend == "scripts":
        pytest.skip("the scripts backend polls: it has no blocked claim to wake")
    got = woken_claim(server, r, lambda: client.enqueue("q", b"", "a", group="g"))
    assert got and got[0] is not None
    assert active_of(r, "g") == 1
    ok(r)


def test_the_cli_enqueues_into_a_group_and_check_finds_a_count_that_is_off(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    def cli(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--url", server.url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = cli("enqueue", "q", "one", "--id", "a", "--group", "tenant-1")
    assert (code, out.strip()) == (0, "a")
    assert r.hget(queue_keys("q").job("a"), "group") == b"tenant-1"
    code, _, err = cli("enqueue", "q", "two", "--group", "no spaces")
    assert code == 1 and "group must be" in err
    code, out, _ = cli("check", "q")
    assert code == 0 and "no problems" in out
    r.hset(gkey("tenant-1"), "active", 1)
    code, out, _ = cli("check", "q")
    assert code == 1 and "counts 1 active but 0" in out


def test_the_asyncio_client_takes_group_too(r: redis.Redis, server: EmbeddedServer) -> None:
    async def main_() -> None:
        aclient = aemq.Client.from_url(server.url)
        try:
            assert await aclient.enqueue("q", b"", "a", group="g") == "a"
            assert await aclient.enqueue_many("q", [("b", b"")], group="g") == ["b"]
            with pytest.raises(ValueError, match="group must be"):
                await aclient.enqueue("q", b"", "c", group="")
            assert len(await aclient.claim_many("q", 30_000, 2)) == 2
        finally:
            await aclient.aclose()

    asyncio.run(main_())
    assert active_of(r, "g") == 2
    ok(r)


# -- stage 2: a lane per group and the ring ----------------------------------------------


def test_a_claim_rotates_round_the_groups_and_keeps_fifo_within_each(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue_many("q", [(f"big-{i:04}", b"") for i in range(1000)], group="big")
    for g in range(9):
        client.enqueue_many("q", [(f"s{g}-{i:02}", b"") for i in range(10)], group=f"small-{g}")
    assert r.lrange(ring(), 0, -1) == [b"", b"big", *[f"small-{g}".encode() for g in range(9)]]
    assert client.counts("q").pending == 1090
    ok(r)
    taken = [j.id for j in client.claim_many("q", 30_000, 50)]
    while len(taken) < 100:
        job = client.claim("q", 30_000)
        assert job is not None
        taken.append(job.id)
    small = [t for t in taken if t.startswith("s")]
    assert len(small) == 90  # every small group's jobs within the first 100 claims
    for g in range(9):
        assert [t for t in taken if t.startswith(f"s{g}-")] == [f"s{g}-{i:02}" for i in range(10)]
    assert [t for t in taken if t.startswith("big")] == [f"big-{i:04}" for i in range(10)]
    assert r.lrange(ring(), 0, -1) == [b"", b"big"]  # the small groups left with their last jobs
    assert not r.exists(lane("small-0")) and r.hget(gkey("small-0"), "ring") is None
    assert client.counts("q").pending == 990
    ok(r)


def test_ungrouped_jobs_take_one_turn_of_the_ring(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [(f"p{i}", b"") for i in range(3)])
    client.enqueue_many("q", [(f"a{i}", b"") for i in range(3)], group="a")
    client.enqueue_many("q", [(f"b{i}", b"") for i in range(2)], group="b")
    ids = [j.id for j in client.claim_many("q", 30_000, 8)]
    assert ids == ["p0", "a0", "b0", "p1", "a1", "b1", "p2", "a2"]
    assert not r.exists(ring()) and not r.hexists(queue_keys("q").meta, "ring")
    assert client.claim("q", 30_000) is None
    ok(r)


def test_a_queue_without_groups_makes_no_ring(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [(f"p{i}", b"") for i in range(3)], priority=-1)
    client.enqueue("q", b"", "x")
    assert [j.id for j in client.claim_many("q", 30_000, 4)] == ["p0", "p1", "p2", "x"]
    assert not r.exists(ring()) and not r.hexists(queue_keys("q").meta, "ring")
    assert [k for k in r.scan_iter(match="emq:{q}:g*")] == []


def test_release_and_sweep_put_back_at_the_head_of_the_groups_lane(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue_many("q", [(f"a{i}", b"") for i in range(4)], group="a")
    first, second = client.claim_many("q", 30_000, 2)
    assert (first.id, second.id) == ("a0", "a1")
    client.release("q", second.id, second.token)
    client.release("q", first.id, first.token)
    assert r.zrange(lane("a"), 0, -1) == [b"a0", b"a1", b"a2", b"a3"]  # the later call's first
    ok(r)
    jobs = client.claim_many("q", 1, 2)
    r.execute_command("DEBUG", "SLEEP", "0.01")
    assert client.sweep("q", max_stalled=5, limit=10).recovered == sorted(j.id for j in jobs)
    assert r.zrange(lane("a"), 0, 1) == [j.id.encode() for j in sorted(jobs, key=lambda j: j.id)]
    ok(r)
    assert [j.id for j in client.claim_many("q", 30_000, 10)] == ["a0", "a1", "a2", "a3"]
    ok(r)


def test_a_delayed_grouped_job_goes_to_its_lane_when_due(r: redis.Redis, client: echomq.Client) -> None:
    now = server_now_ms(r)
    client.enqueue("q", b"", "a0", group="a")
    client.enqueue("q", b"", "later", group="a", run_at_ms=now + 60_000)
    client.enqueue("q", b"", "due", group="b", run_at_ms=now - 5)
    assert r.zrange(lane("a"), 0, -1) == [b"a0"]
    assert not r.exists(lane("b"))
    ok(r)
    assert [j.id for j in client.claim_many("q", 30_000, 5)] == ["a0", "due"]
    assert r.zrange(queue_keys("q").delayed, 0, -1) == [b"later"]
    ok(r)


def test_cancel_takes_a_waiting_job_out_of_its_lane(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [("a", b""), ("b", b"")], group="g")
    assert client.cancel("q", "a") == "cancelled"
    assert r.zrange(lane("g"), 0, -1) == [b"b"]
    assert client.cancel("q", "b") == "cancelled"
    assert not r.exists(lane("g"))
    ok(r)  # the group stays in the ring until a claim finds its lane empty
    assert client.claim("q", 30_000) is None
    assert not r.exists(ring()) and not r.exists(gkey("g"))
    ok(r)


def test_retry_and_retry_dead_go_to_the_groups_lane(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [("a", b""), ("b", b"")], group="g")
    for job in client.claim_many("q", 30_000, 2):
        assert client.fail("q", job.id, job.token, "E: x", dead=True) == "dead"
    assert not r.exists(lane("g"))
    client.retry_dead("q")
    assert sorted(r.zrange(lane("g"), 0, -1)) == [b"a", b"b"]
    assert r.lrange(ring(), 0, -1) == [b"", b"g"]
    ok(r)
    assert sorted(j.id for j in client.claim_many("q", 30_000, 5)) == ["a", "b"]
    ok(r)


def test_obliterate_deletes_the_group_lanes_and_the_ring(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [(f"a{i}", b"") for i in range(5)], group="a")
    client.enqueue_many("q", [(f"b{i}", b"") for i in range(3)], group="b")
    client.enqueue("q", b"", "plain")
    client.obliterate("q", limit=3)
    assert [k for k in r.scan_iter(match="emq:{q}:*") if b":req:" not in k] == []  # request records expire


def test_a_blocked_claim_is_woken_by_a_job_in_a_group_lane(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer, backend: str
) -> None:
    if backend == "scripts":
        pytest.skip("the scripts backend polls: it has no blocked claim to wake")
    client.enqueue("q", b"", "first", group="g")
    assert client.claim("q", 30_000) is not None
    got = woken_claim(server, r, lambda: client.enqueue("q", b"", "second", group="h"))
    assert got and got[0] is not None and got[0][0][0] == b"second"
    ok(r)


def test_priorities_order_within_a_group_but_not_across_groups(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("q", [("a-late", b"")], group="a")
    client.enqueue_many("q", [("a-urgent", b"")], group="a", priority=-5)
    client.enqueue_many("q", [("b-low", b"")], group="b", priority=9)
    client.enqueue("q", b"", "plain-urgent", priority=-9)
    assert r.zrange(lane("a"), 0, -1) == [b"a-urgent", b"a-late"]
    ok(r)
    ids = [j.id for j in client.claim_many("q", 30_000, 4)]
    assert ids == ["plain-urgent", "a-urgent", "b-low", "a-late"]
    ok(r)
