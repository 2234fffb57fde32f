"""Groups, stage 2b (issue 45): a group's cap and its pause, EMQ.GROUPLIMIT, on both backends.

``max`` in ``<base>group:<g>`` caps how many of the group's jobs are active at once; ``paused``
holds its waiting jobs back.  Neither costs a claim anything: a group is in the ring exactly when
its lane holds a job, it is not paused and it has fewer than ``max`` active -- the claim that takes
its last slot leaves it out, the "left active" hook puts it back when a slot frees, the verb puts
it in or takes it out as its new setting says.  ``queue_problems`` checks that invariant (and the
exact count) after every command here; the differential test compares every reply and write of
the verb with the scripts backend's.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from echomq._protocol.lifecycle import complete_claim
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, queue_problems

from ..conftest import ServerFactory, wait_for_replica
from ..helpers import digest
from .test_groups import active_of, gkey, lane, ring, woken_claim

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]


def ok(r: redis.Redis) -> None:
    assert queue_problems(r, "q") == []


def limit(client: echomq.Client, *args: object) -> Any:
    keys = queue_keys("q")
    return client._send(("EMQ.GROUPLIMIT", keys.pending, keys.base, *args))


def fill(client: echomq.Client, group: str, n: int) -> list[str]:
    return client.enqueue_many("q", [(f"{group}{i}", b"") for i in range(n)], group=group)


def ids(jobs: list[echomq.Job]) -> list[str]:
    return [j.id for j in jobs]


def complete_and_claim(client: echomq.Client, job: echomq.Job) -> echomq.Job | None:
    """EMQ.COMPLETECLAIM of ``job``, COUNT 1: the job it claimed, or None."""
    got = client._run(complete_claim("q", job.id, job.token, 30_000))
    assert not got.gone
    return got.jobs[0] if got.jobs else None


# -- the cap -------------------------------------------------------------------------------


def test_a_claim_takes_no_more_than_the_cap_and_leaves_the_group_out_of_the_ring(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 5)
    fill(client, "b", 3)
    assert limit(client, "a", "MAX", 2) == [2, 0, 5, 0]
    jobs = client.claim_many("q", 30_000, 10)
    assert ids(jobs) == ["a0", "b0", "a1", "b1", "b2"]  # round-robin until a's cap, then b alone
    assert active_of(r, "a") == 2 and r.lrange(ring(), 0, -1) == []  # a held, b drained
    assert not r.hexists(gkey("a"), "ring")
    ok(r)
    assert client.claim("q", 30_000) is None  # every group capped or empty: nothing, nothing written
    client.complete("q", jobs[0].id, jobs[0].token)  # a slot frees: a is back in the ring
    assert r.lrange(ring(), 0, -1) == [b"", b"a"] and r.hget(gkey("a"), "ring") == b"1"
    ok(r)
    assert ids(client.claim_many("q", 30_000, 10)) == ["a2"]  # the one slot, FIFO
    ok(r)


def test_count_takes_at_most_what_each_groups_cap_leaves(r: redis.Redis, client: echomq.Client) -> None:
    for g in ("a", "b", "c"):
        fill(client, g, 6)
    limit(client, "a", "MAX", 1)
    limit(client, "b", "MAX", 3)
    got = ids(client.claim_many("q", 30_000, 100))
    assert [i for i in got if i[0] == "a"] == ["a0"]
    assert [i for i in got if i[0] == "b"] == ["b0", "b1", "b2"]
    assert [i for i in got if i[0] == "c"] == [f"c{i}" for i in range(6)]
    assert (active_of(r, "a"), active_of(r, "b"), active_of(r, "c")) == (1, 3, 6)
    ok(r)


def test_a_cap_lowered_below_active_keeps_the_group_out_until_it_drains(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 6)
    jobs = client.claim_many("q", 30_000, 3)
    assert r.lrange(ring(), 0, -1) == [b"", b"a"]
    assert limit(client, "a", "MAX", 2) == [2, 3, 3, 0]  # 3 active, cap 2: out of the ring
    assert not r.exists(ring()) and not r.hexists(queue_keys("q").meta, "ring")
    ok(r)
    client.complete("q", jobs[0].id, jobs[0].token)  # 2 active: still at the cap
    assert not r.exists(ring())
    ok(r)
    client.complete("q", jobs[1].id, jobs[1].token)  # 1 active: back
    assert r.lrange(ring(), 0, -1) == [b"", b"a"]
    ok(r)
    assert limit(client, "a", "MAX", 1) == [1, 1, 3, 0]  # at the cap again: out
    assert not r.exists(ring())
    assert limit(client, "a", "NOMAX") == [None, 1, 3, 0]  # removed: back in
    assert r.lrange(ring(), 0, -1) == [b"", b"a"] and not r.hexists(gkey("a"), "max")
    ok(r)
    assert limit(client, "a", "MAX", 9) == [9, 1, 3, 0]  # raised: stays in, once
    assert r.lrange(ring(), 0, -1) == [b"", b"a"]
    ok(r)


def test_leaving_the_ring_keeps_the_other_groups_in_it_in_their_order(
    r: redis.Redis, client: echomq.Client
) -> None:
    for g in ("a", "b", "c"):
        fill(client, g, 2)
    client.enqueue("q", b"", "plain")
    client.claim_many("q", 30_000, 1)  # the ring turns: the empty name to its tail
    before = r.lrange(ring(), 0, -1)
    limit(client, "b", "PAUSE")
    assert r.lrange(ring(), 0, -1) == [m for m in before if m != b"b"]
    ok(r)


def test_jobs_entering_a_capped_group_wait_in_its_lane_but_not_in_the_ring(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a0", group="a")
    limit(client, "a", "MAX", 1)
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a0"
    client.enqueue("q", b"", "a1", group="a")  # enqueue at the cap
    assert r.zrange(lane("a"), 0, -1) == [b"a1"] and not r.exists(ring())
    ok(r)
    client.release("q", job.id, job.token)  # a release frees the slot: both wait, the group is in
    assert r.zrange(lane("a"), 0, -1) == [b"a0", b"a1"] and r.lrange(ring(), 0, -1) == [b"", b"a"]
    ok(r)
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a0"
    assert client.fail("q", job.id, job.token, "boom", max_attempts=3) == "pending"  # its retry, at the cap
    assert r.lrange(ring(), 0, -1) == [b"", b"a"]  # the fail freed the slot it retries into
    ok(r)


def test_complete_claim_frees_the_slot_for_its_own_claim(r: redis.Redis, client: echomq.Client) -> None:
    fill(client, "a", 3)
    limit(client, "a", "MAX", 1)
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a0"
    for want in ("a1", "a2"):
        nxt = complete_and_claim(client, job)
        assert nxt is not None and nxt.id == want and active_of(r, "a") == 1
        job = nxt
        ok(r)
    assert complete_and_claim(client, job) is None and active_of(r, "a") == 0
    ok(r)


def test_a_blocked_claim_waits_while_every_group_is_capped_and_wakes_when_a_slot_frees(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer, backend: str
) -> None:
    if backend == "scripts":
        pytest.skip("the scripts backend polls: it has no blocked claim to wake")
    fill(client, "a", 2)
    limit(client, "a", "MAX", 1)
    job = client.claim("q", 30_000)
    assert job is not None
    got = woken_claim(server, r, lambda: client.complete("q", job.id, job.token))
    assert got and got[0] is not None and got[0][0][0] == b"a1"
    assert active_of(r, "a") == 1
    ok(r)


# -- pause and resume one group ------------------------------------------------------------


def test_a_paused_group_leaves_the_ring_its_jobs_wait_and_its_active_ones_run_on(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 3)
    fill(client, "b", 1)
    running = client.claim("q", 30_000)
    assert running is not None and running.id == "a0"
    before = r.lrange(ring(), 0, -1)
    assert limit(client, "a", "PAUSE") == [None, 1, 2, 1]
    assert r.lrange(ring(), 0, -1) == [m for m in before if m != b"a"] and r.hget(gkey("a"), "paused") == b"1"
    ok(r)
    assert ids(client.claim_many("q", 30_000, 10)) == ["b0"]  # a's jobs wait
    assert client.counts("q").pending == 2  # still counted
    client.complete("q", running.id, running.token)  # its active job runs on and ends
    assert not r.exists(ring())  # a slot freed, but paused: still out
    ok(r)
    assert limit(client, "a", "resume") == [None, 0, 2, 0]
    assert r.lrange(ring(), 0, -1) == [b"", b"a"] and not r.hexists(gkey("a"), "paused")
    ok(r)
    assert ids(client.claim_many("q", 30_000, 10)) == ["a1", "a2"]
    ok(r)


def test_resume_below_the_cap_only_re_adds_a_group_that_may_be_claimed(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 3)
    client.claim_many("q", 30_000, 1)
    assert limit(client, "a", "MAX", 1, "PAUSE") == [1, 1, 2, 1]
    assert limit(client, "a", "RESUME") == [1, 1, 2, 0]  # at its cap: stays out
    assert not r.exists(ring())
    ok(r)
    limit(client, "e", "PAUSE")  # a group with no jobs: a setting, no ring
    limit(client, "e", "RESUME")
    assert not r.exists(gkey("e")) and not r.exists(ring())
    ok(r)


# -- the verb's replies and errors ---------------------------------------------------------


def test_the_verb_reads_without_options_and_each_option_is_case_insensitive(
    r: redis.Redis, client: echomq.Client
) -> None:
    before = digest(r)
    assert limit(client, "none") == [None, 0, 0, 0]  # a read: nothing written
    assert digest(r) == before
    fill(client, "a", 2)
    assert limit(client, "a", "pause", "max", "4") == [4, 0, 2, 1]  # options in any order
    assert limit(client, "a", "MAX", "1000000000") == [1_000_000_000, 0, 2, 1]
    assert limit(client, "a", "nomax", "RESUME") == [None, 0, 2, 0]
    ok(r)


BAD: list[tuple[list[object], str]] = [
    ([], "wrong number of arguments for 'emq.grouplimit' command"),
    (["a", "MAX"], "syntax error"),
    (["a", "2"], "syntax error"),
    (["a", "GROUP", "b"], "syntax error"),
    (["a", "MAX", "1", "NOMAX"], "syntax error"),
    (["a", "NOMAX", "MAX", "1"], "syntax error"),
    (["a", "NOMAX", "NOMAX"], "syntax error"),
    (["a", "MAX", "1", "MAX", "2"], "syntax error"),
    (["a", "PAUSE", "RESUME"], "syntax error"),
    (["a", "PAUSE", "PAUSE"], "syntax error"),
    (["a", "DEFAULT"], "syntax error"),
    (["a b"], r"GROUP must be 1 to 128 bytes"),
    (["x" * 129], r"GROUP must be 1 to 128 bytes"),
    ([""], r"GROUP must be 1 to 128 bytes"),
    (["a", "MAX", "0"], r"MAX must be an integer from 1 to 1000000000"),
    (["a", "MAX", "1000000001"], r"MAX must be an integer from 1 to 1000000000"),
    (["a", "MAX", "-1"], r"MAX must be an integer from 1 to 1000000000"),
    (["a", "MAX", "1.5"], r"MAX must be an integer from 1 to 1000000000"),
    (["a", "MAX", "01"], r"MAX must be an integer from 1 to 1000000000"),
]


@pytest.mark.parametrize(("args", "error"), BAD)
def test_bad_options_are_refused_and_nothing_is_written(
    r: redis.Redis, client: echomq.Client, args: list[object], error: str
) -> None:
    fill(client, "a", 1)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=error):
        limit(client, *args)
    assert digest(r) == before


def test_a_broken_group_hash_is_refused_by_the_verb_and_the_lanes(
    r: redis.Redis, client: echomq.Client
) -> None:
    keys = queue_keys("q")
    fill(client, "a", 1)
    r.hset(gkey("a"), "max", "zero")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="'max' field is not an integer from 1 to 1000000000"):
        limit(client, "a")
    with pytest.raises(redis.ResponseError, match="'max' field is not an integer"):
        client.enqueue("q", b"", "a9", group="a")
    with pytest.raises(redis.ResponseError, match="'max' field is not an integer"):
        client.claim("q", 30_000)
    assert digest(r) == before
    r.hset(gkey("a"), mapping={"max": "1", "active": "x"})
    with pytest.raises(redis.ResponseError, match="'active' field is not an integer"):
        limit(client, "a", "NOMAX")
    r.delete(gkey("a"))
    r.set(gkey("a"), "s")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        limit(client, "a")
    r.delete(gkey("a"))
    r.set(lane("a"), "s")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        limit(client, "a")
    with pytest.raises(redis.ResponseError, match="<pending> must be <base>pending"):
        client._send(("EMQ.GROUPLIMIT", "emq:{x}:pending", keys.base, "a"))


# -- the invariant under a random mix, and under 8 threads ----------------------------------


def test_a_random_mix_of_claims_ends_caps_and_pauses_keeps_the_ring_exact(
    r: redis.Redis, client: echomq.Client
) -> None:
    rng = random.Random(45)
    groups = ["a", "b", "c", "d"]
    held: dict[str, echomq.Job] = {}
    n = 0
    for step in range(400):
        before = {g: active_of(r, g) for g in groups}
        roll = rng.random()
        if roll < 0.25:
            g = rng.choice([*groups, None])
            client.enqueue("q", b"", f"j{n}", group=g, priority=rng.choice([0, 0, 2]))
            n += 1
        elif roll < 0.45:
            for j in client.claim_many("q", 30_000, rng.choice([1, 2, 5])):
                held[j.id] = j
        elif roll < 0.7 and held:
            j = held.pop(rng.choice(sorted(held)))
            end = rng.choice(["complete", "fail", "release", "completeclaim"])
            if end == "complete":
                client.complete("q", j.id, j.token)
            elif end == "fail":
                client.fail("q", j.id, j.token, "e", max_attempts=rng.choice([1, 3]))
            elif end == "release":
                client.release("q", j.id, j.token)
            else:
                nxt = complete_and_claim(client, j)
                if nxt is not None:
                    held[nxt.id] = nxt
        elif roll < 0.75 and n:
            client.cancel("q", f"j{rng.randrange(n)}")
        elif roll < 0.8:  # the queue's default cap (issue 45): every group without its own
            limit(client, "*", *rng.choice([["MAX", rng.choice([1, 2])], ["NOMAX"], ["NOMAX"]]))
        else:
            opts: list[object] = [rng.choice(groups)]
            opts += rng.choice([[], ["MAX", rng.choice([1, 2, 3])], ["NOMAX"]])
            opts += rng.choice([[], ["PAUSE"], ["RESUME"], ["RESUME"]])
            limit(client, *opts)
        problems = queue_problems(r, "q")
        assert problems == [], f"step {step}: {problems}"
        for g in groups:  # a count grows only up to its cap (one lowered below it only drains)
            cap, now = r.hget(gkey(g), "max") or r.hget("emq:{q}:meta", "group_max"), active_of(r, g)
            assert cap is None or now <= max(int(cap), before[g]), f"step {step}: {g} {now} > {cap}"
            assert now <= before[g] or cap is None or now <= int(cap)


def test_eight_workers_never_run_more_than_a_groups_cap_and_keep_fifo_within_each(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer
) -> None:
    groups = [f"g{i}" for i in range(20)]
    caps = {g: 2 for g in groups} | {"solo": 1}
    order: dict[str, list[str]] = {}
    for g, cap in caps.items():
        order[g] = client.enqueue_many("q", [(f"{g}-{i:03d}", b"") for i in range(25)], group=g)
        assert limit(client, g, "MAX", cap)[0] == cap
    of = {job: g for g, jobs in order.items() for job in jobs}
    index = {job: i for jobs in order.values() for i, job in enumerate(jobs)}
    keys = queue_keys("q")
    # one read of every group's count and of the groups of the jobs in active, atomic
    sample = r.register_script(
        """
        local out = {}
        for i, g in ipairs(ARGV) do
            out[i] = tonumber(redis.call('HGET', KEYS[2] .. 'group:' .. g, 'active') or 0)
        end
        local running = {}
        for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
            local g = redis.call('HGET', KEYS[2] .. 'job:' .. id, 'group')
            running[g] = (running[g] or 0) + 1
        end
        for i, g in ipairs(ARGV) do out[#ARGV + i] = running[g] or 0 end
        return out
        """
    )
    names = sorted(caps)
    done: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    peaks = dict.fromkeys(names, 0)
    lock = threading.Lock()

    def work() -> None:
        try:
            while True:
                job = client.claim("q", 30_000)
                if job is None:
                    if r.llen(keys.pending) == 0 and not r.exists(ring()) and r.zcard(keys.active) == 0:
                        return
                    continue
                k = index[job.id]
                if k > 0:  # FIFO: the one before it in its group left the lane before it did
                    assert r.hget(keys.job(order[of[job.id]][k - 1]), "state") != b"pending", job.id
                client.complete("q", job.id, job.token)
                with lock:
                    done.append(job.id)
        except BaseException as exc:
            errors.append(exc)

    def sampler() -> None:
        try:
            sampled = server.client()
            while not stop.is_set():
                got = sample(keys=[keys.active, keys.base], args=names, client=sampled)
                for i, g in enumerate(names):
                    counted, running = got[i], got[len(names) + i]
                    assert counted == running <= caps[g], (g, counted, running)
                    peaks[g] = max(peaks[g], running)
            sampled.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    watch = threading.Thread(target=sampler)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watch.join()
    assert errors == []
    assert sorted(done) == sorted(of)  # every job done, once
    assert all(peaks[g] <= caps[g] for g in names) and peaks["solo"] == 1
    ok(r)


def test_obliterate_finds_the_lanes_of_groups_held_out_of_the_ring(
    r: redis.Redis, client: echomq.Client
) -> None:
    keys = queue_keys("q")
    fill(client, "a", 2)
    fill(client, "b", 2)
    limit(client, "a", "PAUSE")
    client.claim_many("q", 30_000, 1)
    limit(client, "b", "MAX", 1)  # both out of the ring now
    assert not r.exists(ring()) and r.zrange(keys.base + "groupset", 0, -1) == [b"a", b"b"]
    for limit_ in (1, 2):  # steps that are not the last leave the ring exact
        client._send(("EMQ.OBLITERATE", keys.active, keys.pending, keys.dead, keys.base, limit_, "FORCE"))
        ok(r)
    client._send(("EMQ.OBLITERATE", keys.active, keys.pending, keys.dead, keys.base, 100, "FORCE"))
    assert not r.exists(lane("a")) and not r.exists(lane("b"))
    assert not [k for k in r.scan_iter(match="emq:{q}:job:*")]
    # what a group leaves behind is its settings, and the index names them
    assert r.hgetall(gkey("a")) == {b"paused": b"1"} and r.hgetall(gkey("b")) == {b"max": b"1"}
    ok(r)


# -- FIFO across a retry (bullmq #2774) ----------------------------------------------------


def test_a_failed_try_retried_at_once_goes_back_to_its_groups_head(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 3)
    client.enqueue_many("q", [("p0", b""), ("p1", b"")])
    limit(client, "a", "MAX", 1)  # a sequence: a0, a1, a2, whatever fails
    order: list[str] = []
    fails = {"a0": 2, "a1": 1}
    while (job := client.claim("q", 30_000)) is not None:
        order.append(job.id)
        if fails.get(job.id, 0) > 0:
            fails[job.id] -= 1
            assert client.fail("q", job.id, job.token, "boom", max_attempts=5) == "pending"
        else:
            client.complete("q", job.id, job.token)
        ok(r)
    assert [i for i in order if i.startswith("a")] == ["a0", "a0", "a0", "a1", "a1", "a2"]
    # an ungrouped job's retry is a new turn: the tail, behind the jobs waiting
    client.enqueue_many("q", [("u0", b""), ("u1", b"")])
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "u0"
    client.fail("q", job.id, job.token, "boom", max_attempts=5)
    assert r.lrange(queue_keys("q").pending, 0, -1) == [b"u1", b"u0"]


def test_a_retry_with_a_delay_waits_and_then_goes_to_its_groups_tail(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 2)
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a0"
    assert client.fail("q", job.id, job.token, "boom", max_attempts=5, delay_ms=60_000) == "pending"
    assert r.zrange(lane("a"), 0, -1) == [b"a1"] and r.zscore(queue_keys("q").delayed, "a0") is not None
    ok(r)


def test_a_replica_and_the_aof_hold_the_masters_caps_pauses_ring_and_index(
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
        client.enqueue_many("q", [(f"{g}-{i}", b"") for i in range(4)], group=g)
    limit(client, "g1", "MAX", 1)
    limit(client, "g2", "PAUSE")
    jobs = client.claim_many("q", 30_000, 6)
    client.complete("q", jobs[0].id, jobs[0].token)  # a slot freed: a settle
    client.fail("q", jobs[1].id, jobs[1].token, "E: x")  # a retry to the head
    limit(client, "g3", "MAX", 1)  # lowered below its count: out of the ring
    limit(client, "g2", "RESUME")
    client.claim_many("q", 30_000, 3)
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
