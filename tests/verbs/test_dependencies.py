"""Dependencies, stage 1 (issue 46; docs/concepts/workflows.md), on both backends.

``ENQUEUE ... [ON_PARENT_FAILURE fail|ignore|continue] [MISSING done] AFTER <id> ...``: a job
whose dependencies have not all ended is ``waiting`` (in no lane); every path on which a
dependency ends or vanishes resolves it, in bounded steps (at most 100 waiters per command,
the rest by later commands and SWEEP) that cannot be lost.  After every step of every test,
``queue_problems`` (which includes ``dependency_problems``) is empty.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, dependency_problems, queue_problems

from ..conftest import ServerFactory
from ..helpers import digest

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]

K = queue_keys("q")
STEP = 100


def send(client: echomq.Client, *args: object) -> object:
    return client._send(("EMQ.ENQUEUE", K.pending, K.base, *args))


def ok(r: redis.Redis) -> None:
    assert queue_problems(r, "q") == []


def state(r: redis.Redis, job: str) -> str | None:
    s = r.hget(K.job(job), "state")
    return s.decode() if s else None


def deps(r: redis.Redis, job: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(K.base + "deps:" + job).items()}


def waiters(r: redis.Redis, job: str) -> list[str]:
    return [m.decode() for m in r.zrange(K.base + "waiters:" + job, 0, -1)]


def run(client: echomq.Client, fail: frozenset[str] = frozenset()) -> list[str]:
    """Claim and finish every claimable job (the ids in ``fail`` die); the ids in order."""
    seen = []
    while (job := client.claim("q", 30_000)) is not None:
        seen.append(job.id)
        if job.id in fail:
            client.fail("q", job.id, job.token, "E: boom", max_attempts=1)
        else:
            client.complete("q", job.id, job.token)
    return seen


# -- enqueue: replies and refusals ------------------------------------------------------------


def test_a_job_waits_for_its_dependency_in_no_lane_then_runs(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a")
    assert send(client, "b", b"", "AFTER", "a") == 1
    assert state(r, "b") == "waiting"
    assert r.hget(K.job("b"), "waits") == b"1" and r.hget(K.job("b"), "after") == b"1"
    assert r.hget(K.job("a"), "waiters") == b"1"
    assert deps(r, "b") == {"a": "waiting"}
    assert waiters(r, "a") == ["b"]
    assert r.lrange(K.pending, 0, -1) == [b"a"]
    ok(r)
    assert run(client) == ["a", "b"]
    assert state(r, "b") == "done"
    assert not r.exists(K.base + "deps:b", K.base + "waiters:a", K.base + "resolve")
    ok(r)


def test_the_first_after_marks_the_queue_and_a_queue_without_one_is_not_marked(
    r: redis.Redis, client: echomq.Client
) -> None:
    # <base>meta's `deps`: the ends of a queue without it look for no dependency field (issue 41)
    client.enqueue("q", b"", "a")
    job = client.claim("q", 30_000)
    assert job is not None
    client.complete("q", "a", job.token)
    assert not r.hexists(K.base + "meta", "deps") and state(r, "a") == "done"
    client.enqueue("q", b"", "a2")
    assert send(client, "b", b"", "MISSING", "done", "AFTER", "gone") == 1  # met at once: marked all the same
    assert r.hget(K.base + "meta", "deps") == b"1"
    send(client, "c", b"", "AFTER", "a2")
    assert r.hget(K.base + "meta", "deps") == b"1"
    assert run(client) == ["a2", "b", "c"]
    assert not r.exists(K.base + "deps:b") and not r.exists(K.base + "deps:c")
    ok(r)


def test_a_dependency_completed_in_a_queue_marked_by_a_refused_after_still_resolves(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    with pytest.raises(redis.exceptions.ResponseError):
        send(client, "x", b"", "AFTER", "nope")  # refused: writes nothing, marks nothing
    assert not r.hexists(K.base + "meta", "deps")
    send(client, "b", b"", "AFTER", "a")
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a"
    client.complete("q", "a", job.token)
    assert state(r, "b") == "pending" and not r.exists(K.base + "waiters:a")
    ok(r)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["AFTER"], "ERR syntax error"),
        (["AFTER", ""], "ERR a dependency id must not be empty"),
        (["AFTER", "a", ""], "ERR a dependency id must not be empty"),
        (["AFTER", "b"], "ERR a job cannot depend on itself"),
        (["AFTER", "a", "b", "a"], "ERR a job cannot depend on itself"),
        (
            ["ON_PARENT_FAILURE", "maybe", "AFTER", "a"],
            "ERR ON_PARENT_FAILURE must be fail, ignore or continue",
        ),
        (["ON_PARENT_FAILURE"], "ERR syntax error"),
        (["ON_PARENT_FAILURE", "fail", "ON_PARENT_FAILURE", "fail", "AFTER", "a"], "ERR syntax error"),
        (
            ["MISSING", "ok", "AFTER", "a"],
            "ERR MISSING takes only 'done' (without it a missing dependency is refused)",
        ),
        (["MISSING", "done", "MISSING", "done", "AFTER", "a"], "ERR syntax error"),
        (["ON_PARENT_FAILURE", "ignore"], "ERR ON_PARENT_FAILURE and MISSING need AFTER <id> ..."),
        (["MISSING", "done"], "ERR ON_PARENT_FAILURE and MISSING need AFTER <id> ..."),
        (["AFTER", "nope"], "ERR dependency nope does not exist"),
        (["AFTER", "a", "nope", "nah"], "ERR dependency nope does not exist"),
        (["AFTER", *(f"x{i}" for i in range(1001))], "ERR AFTER takes at most 1000 dependencies"),
        (["AFTER", "a", "DELAY", "5"], "ERR dependency DELAY does not exist"),  # AFTER is the last option
    ],
)
def test_bad_after_arguments_are_refused_and_write_nothing(
    r: redis.Redis, client: echomq.Client, args: list[str], error: str
) -> None:
    client.enqueue("q", b"", "a")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="^" + re.escape(error.removeprefix("ERR ")) + "$"):
        send(client, "b", b"", *args)
    assert digest(r) == before


def test_enqueuemany_refuses_after_and_its_options(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a")
    before = digest(r)
    for opt in (["AFTER", "a"], ["ON_PARENT_FAILURE", "fail"], ["MISSING", "done"]):
        with pytest.raises(redis.ResponseError, match=r"EMQ\.ENQUEUEMANY does not take it"):
            client._send(("EMQ.ENQUEUEMANY", K.pending, K.base, 1, "b", b"", *opt))
    assert digest(r) == before


def test_options_are_case_insensitive_duplicates_count_once_and_1000_are_taken(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    assert (
        send(client, "b", b"", "on_parent_failure", "Continue", "missing", "DONE", "after", "a", "a", "z")
        == 1
    )
    assert r.hget(K.job("b"), "waits") == b"1" and r.hget(K.job("b"), "after") == b"2"
    assert r.hget(K.job("b"), "on_failure") == b"continue"
    assert deps(r, "b") == {"a": "waiting", "z": "missing"}
    ids = [f"p{i}" for i in range(1000)]
    client.enqueue_many("q", [(i, b"") for i in ids])
    assert send(client, "big", b"", "AFTER", *ids) == 1
    assert r.hget(K.job("big"), "waits") == b"1000"
    ok(r)


def test_ended_dependencies_resolve_at_once_by_their_outcome(r: redis.Redis, client: echomq.Client) -> None:
    for job in ("d", "x", "c"):
        client.enqueue("q", b"", job)
    run(client, fail=frozenset({"x"}))
    client.enqueue("q", b"", "c2")
    client.cancel("q", "c2")
    assert [state(r, j) for j in ("d", "x", "c2")] == ["done", "dead", "cancelled"]
    assert send(client, "met", b"", "AFTER", "d") == 1
    assert state(r, "met") == "pending" and r.lrange(K.pending, -1, -1) == [b"met"]
    assert deps(r, "met") == {"d": "done"}
    assert send(client, "dies", b"", "AFTER", "d", "x") == 1
    assert state(r, "dies") == "dead"
    assert r.hget(K.job("dies"), "last_error") == b"dependency x dead"
    assert r.zscore(K.dead, "dies") is not None
    assert not r.exists(K.base + "deps:dies")
    assert send(client, "dies2", b"", "AFTER", "c2") == 1
    assert r.hget(K.job("dies2"), "last_error") == b"dependency c2 cancelled"
    assert send(client, "runs", b"", "ON_PARENT_FAILURE", "ignore", "AFTER", "x", "c2") == 1
    assert state(r, "runs") == "pending" and deps(r, "runs") == {"x": "dead", "c2": "cancelled"}
    ok(r)


def test_a_unique_key_is_held_while_its_job_waits(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a")
    assert send(client, "b", b"", "UNIQUE", "k", "AFTER", "a") == [1, b"b"]
    assert send(client, "c", b"", "UNIQUE", "k") == [0, b"b"]
    run(client)
    assert state(r, "b") == "done" and not r.exists(K.base + "unique:k")
    ok(r)


# -- resolution: policies and composition -------------------------------------------------------


def test_fail_cascades_down_the_chain_and_each_end_is_announced(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    send(client, "b", b"", "AFTER", "a")
    send(client, "c", b"", "AFTER", "b")
    send(client, "d", b"", "AFTER", "a", "c")
    ok(r)
    assert run(client, fail=frozenset({"a"})) == ["a"]
    assert [state(r, j) for j in "bcd"] == ["dead", "dead", "dead"]
    assert r.hget(K.job("b"), "last_error") == b"dependency a dead"
    assert r.hget(K.job("c"), "last_error") == b"dependency b dead"
    assert r.hget(K.job("d"), "last_error") == b"dependency a dead"
    assert not r.exists(K.base + "resolve")
    assert not r.keys(K.base + "deps:*") and not r.keys(K.base + "waiters:*")
    ok(r)


@pytest.mark.parametrize("policy", ["ignore", "continue"])
def test_ignore_and_continue_run_the_waiter_and_the_deps_hash_says_which_failed(
    r: redis.Redis, client: echomq.Client, policy: str
) -> None:
    client.enqueue("q", b"", "a")
    client.enqueue("q", b"", "b")
    send(client, "w", b"", "ON_PARENT_FAILURE", policy, "AFTER", "a", "b")
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a"
    client.fail("q", "a", job.token, "E: x", max_attempts=1)
    assert state(r, "w") == "waiting" and r.hget(K.job("w"), "waits") == b"1"
    assert run(client) == ["b", "w"]
    assert deps(r, "w") == {} and state(r, "w") == "done"  # the hash goes with the job's end
    ok(r)


def test_the_deps_hash_is_there_while_the_waiter_runs(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a")
    client.enqueue("q", b"", "b")
    send(client, "w", b"", "ON_PARENT_FAILURE", "continue", "AFTER", "a", "b")
    run_one = client.claim("q", 30_000)
    assert run_one is not None
    client.cancel("q", "b")
    client.complete("q", "a", run_one.token)
    w = client.claim("q", 30_000)
    assert w is not None and w.id == "w"
    assert deps(r, "w") == {"a": "done", "b": "cancelled"}
    ok(r)


def test_a_delayed_grouped_prioritised_waiter_enters_its_place_when_resolved(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    send(client, "late", b"", "DELAY", "600000", "AFTER", "a")
    send(client, "grp", b"", "GROUP", "g", "PRIORITY", "5", "AFTER", "a")
    send(client, "hi", b"", "PRIORITY", "-3", "AFTER", "a")
    assert r.hexists(K.job("late"), "due") and not r.exists(K.delayed)
    assert run(client) == ["a", "hi", "grp"]
    assert state(r, "late") == "pending" and r.zscore(K.delayed, "late") is not None
    assert not r.hexists(K.job("late"), "due") and not r.hexists(K.job("late"), "waits")
    ok(r)


# -- every way a dependency ends or vanishes ------------------------------------------------------


def test_cancel_of_a_waiting_dependency_fails_its_waiters_and_of_a_waiter_leaves_the_sets(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    send(client, "b", b"", "AFTER", "a")
    send(client, "c", b"", "AFTER", "b")
    send(client, "e", b"", "AFTER", "a")
    assert client.cancel("q", "e") == "cancelled"
    assert state(r, "e") == "cancelled" and waiters(r, "a") == ["b"] and deps(r, "e") == {}
    ok(r)
    assert client.cancel("q", "b") == "cancelled"  # a waiting dependency of c
    assert state(r, "c") == "dead" and r.hget(K.job("c"), "last_error") == b"dependency b cancelled"
    assert waiters(r, "a") == []
    assert run(client) == ["a"]
    ok(r)


def test_sweep_death_release_cancel_and_fail_cancel_resolve_waiters(
    r: redis.Redis, client: echomq.Client
) -> None:
    for job in ("s", "rel", "fc"):
        client.enqueue("q", b"", job)
        send(client, "w" + job, b"", "ON_PARENT_FAILURE", "ignore", "AFTER", job)
    jobs = {j.id: j for j in client.claim_many("q", 1, 3)}
    client.cancel("q", "rel")
    client.cancel("q", "fc")
    client.release("q", "rel", jobs["rel"].token)
    client.fail("q", "fc", jobs["fc"].token, "E: x")
    r.zadd(K.active, {"s": 1})  # its lease lapsed long ago, and it had stalled before
    r.hset(K.job("s"), "stalled", 1)
    client.sweep("q", max_stalled=1)
    assert [state(r, j) for j in ("s", "rel", "fc")] == ["dead", "cancelled", "cancelled"]
    assert deps(r, "ws") == {"s": "dead"} and deps(r, "wrel") == {"rel": "cancelled"}
    assert deps(r, "wfc") == {"fc": "cancelled"}
    assert sorted(run(client)) == ["wfc", "wrel", "ws"]
    ok(r)


def test_forget_purge_and_retention_after_the_end_keep_its_outcome(
    r: redis.Redis, client: echomq.Client
) -> None:
    client._send(("EMQ.RETENTION", K.pending, K.base, "DONE", "0"))
    client.enqueue("q", b"", "a")
    send(client, "b", b"", "AFTER", "a")
    assert run(client) == ["a", "b"]
    assert not r.exists(K.job("a"))  # a retention of 0: the row went with the end
    client.enqueue("q", b"", "x")
    send(client, "y", b"", "ON_PARENT_FAILURE", "continue", "AFTER", "x")
    assert run(client, fail=frozenset({"x"})) == ["x", "y"]
    client.purge_dead("q")
    assert not r.exists(K.job("x"))
    assert state(r, "y") is None and not r.exists(K.base + "deps:y")  # it ran: done, and gone
    ok(r)


def test_retry_of_a_resolved_dependency_does_not_unresolve_its_waiters(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    send(client, "b", b"", "ON_PARENT_FAILURE", "ignore", "AFTER", "a")
    send(client, "c", b"", "AFTER", "a")
    run(client, fail=frozenset({"a", "b"}))
    assert state(r, "c") == "dead"
    client.retry("q", "a")
    assert state(r, "a") == "pending" and state(r, "c") == "dead" and state(r, "b") == "dead"
    send(client, "d", b"", "AFTER", "a")  # a new waiter waits for the retried job's new end
    assert run(client) == ["a", "d"]
    ok(r)


def test_obliterate_force_resolves_what_waited_on_deleted_jobs(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a")
    send(client, "b", b"", "ON_PARENT_FAILURE", "ignore", "AFTER", "a")
    client.claim("q", 30_000)
    client._send(("EMQ.OBLITERATE", K.active, K.pending, K.dead, K.base, 1, "FORCE"))
    assert state(r, "b") == "pending" and deps(r, "b") == {"a": "deleted"}


def test_forget_of_a_waiting_job_leaves_its_sets_and_resolves_its_waiters(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    send(client, "b", b"", "AFTER", "a")
    send(client, "c", b"", "AFTER", "b")
    send(client, "d", b"", "ON_PARENT_FAILURE", "ignore", "AFTER", "b")
    assert client._send(("EMQ.FORGET", K.pending, K.base, "b", "b", "a")) == 1  # a is pending: kept
    assert not r.exists(K.job("b"), K.base + "deps:b") and waiters(r, "a") == []
    assert state(r, "c") == "dead" and r.hget(K.job("c"), "last_error") == b"dependency b deleted"
    assert state(r, "d") == "pending" and deps(r, "d") == {"b": "deleted"}
    ok(r)


def test_obliterate_of_a_queue_with_waiting_jobs_leaves_nothing(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    for i in range(150):
        send(client, f"w{i:03d}", b"", "AFTER", "a")
        send(client, f"v{i:03d}", b"", "AFTER", f"w{i:03d}")
    client.obliterate("q", force=True)
    assert [k for k in r.keys("emq:{q}:*") if b":req:" not in k] == []  # a REQ record expires


# -- bounded resolution ---------------------------------------------------------------------------


def test_an_end_with_10000_waiters_resolves_in_bounded_steps_and_none_is_lost(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    pipe = r.pipeline(transaction=False)
    for i in range(10_000):
        pipe.execute_command(*client_args("EMQ.ENQUEUE", f"w{i:05d}", "AFTER", "a", backend=client.backend))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    assert r.zcard(K.base + "waiters:a") == 10_000
    job = client.claim("q", 30_000)
    assert job is not None
    client.complete("q", "a", job.token)
    assert r.zcard(K.base + "waiters:a") == 10_000 - STEP  # the end resolved at most 100
    assert r.lrange(K.base + "resolve", 0, -1) == [b"done:a"]
    assert dependency_problems(r, "q") == []
    client.enqueue("q", b"", "other")  # every enqueue takes a step
    assert r.zcard(K.base + "waiters:a") == 10_000 - 2 * STEP
    client.sweep("q", limit=1000)
    assert r.zcard(K.base + "waiters:a") == 10_000 - 2 * STEP - 1000
    first = client.claim("q", 30_000)  # every claim takes a step first, then claims
    assert first is not None and first.id == "w00000"
    assert r.zcard(K.base + "waiters:a") == 10_000 - 3 * STEP - 1000
    assert dependency_problems(r, "q") == []
    sweeps = 0
    while r.exists(K.base + "resolve"):
        client.sweep("q", limit=1000)
        sweeps += 1
    assert sweeps == 9 and r.llen(K.pending) == 10_000
    listed = r.lrange(K.pending, 0, -1)
    assert listed[99] == b"other"  # the first 100 resolved before it was enqueued, in enqueue order
    assert listed[:99] + listed[100:] == [f"w{i:05d}".encode() for i in range(1, 10_000)]
    ok(r)


def client_args(verb: str, job: str, *rest: str, backend: str) -> tuple[object, ...]:
    from echomq import _scripts

    argv = (verb, K.pending, K.base, job, b"", *rest)
    if backend == "module":
        return argv
    return _scripts.eval_form(_scripts.render(argv, _scripts.ScriptLimits(), None, "eval"))


def test_what_is_left_to_resolve_survives_a_restart_from_the_aof(
    server_factory: ServerFactory, backend: str, tmp_path: Path
) -> None:
    srv = server_factory(["--appendonly", "yes", "--appendfsync", "always"], dir=tmp_path,
                         load_module=backend == "module")  # fmt: skip
    r = srv.client()
    client = echomq.Client(r)
    client.enqueue("q", b"", "a")
    for i in range(300):
        send(client, f"w{i:03d}", b"", "AFTER", "a")
    job = client.claim("q", 30_000)
    assert job is not None
    client.complete("q", "a", job.token)
    assert r.zcard(K.base + "waiters:a") == 200
    before = digest(r)
    assert r.hget(K.base + "meta", "deps") == b"1"
    r.close()
    srv.stop()
    again = server_factory(["--appendonly", "yes"], dir=tmp_path, load_module=backend == "module")
    r = again.client()
    assert digest(r) == before and r.hget(K.base + "meta", "deps") == b"1"
    client = echomq.Client(r)
    client.sweep("q", limit=1000)
    assert not r.exists(K.base + "resolve") and r.llen(K.pending) == 300
    ok(r)
    r.close()


# -- what `check` reports ---------------------------------------------------------------------------


def test_check_reports_a_job_waiting_on_what_can_no_longer_end(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a")
    send(client, "b", b"", "AFTER", "a")
    ok(r)
    r.delete(K.job("a"))  # by hand: no verb ran, nothing was pushed
    problems = dependency_problems(r, "q")
    assert problems == ["b'b' waits on b'a', which has no row and is not in resolve: it waits forever"]
    r.hset(K.job("b"), "waits", "2")
    r.zadd(K.base + "waiters:zz", {"b": 1})
    problems = dependency_problems(r, "q")
    assert "row b'emq:{q}:job:b' waits for b'2' but its deps hash has 1 unmet" in problems
    assert "b'b' is in the waiter set of b'zz' but does not wait on it" in problems


# -- randomized: random DAGs, failures, cancels, retries, forgets ------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_dags_end_every_job_and_keep_each_policy(
    r: redis.Redis, client: echomq.Client, seed: int
) -> None:
    rng = random.Random(seed)
    jobs: list[str] = []
    policy: dict[str, str] = {}
    parents: dict[str, list[str]] = {}
    fails: set[str] = set()
    for n in range(200):
        job = f"j{n:03d}"
        live = [j for j in jobs if state(r, j) is not None]
        after = rng.sample(live, k=min(len(live), rng.choice([0, 1, 1, 2, 3, 5])))
        p = rng.choice(["fail", "ignore", "continue"])
        args: list[object] = ["ON_PARENT_FAILURE", p, "AFTER", *after] if after else []
        send(client, job, b"", *args)
        jobs.append(job)
        policy[job], parents[job] = p, after
        if rng.random() < 0.15:
            fails.add(job)
        if rng.random() < 0.05:
            client.cancel("q", rng.choice(jobs))
        if rng.random() < 0.3:
            got = client.claim("q", 30_000)
            if got is not None:
                if got.id in fails:
                    client.fail("q", got.id, got.token, "E: x", max_attempts=1)
                else:
                    client.complete("q", got.id, got.token)
        if rng.random() < 0.03:
            dead = [j for j in jobs if state(r, j) == "dead"]
            if dead:
                client.retry("q", rng.choice(dead))
        assert queue_problems(r, "q") == [], n
    for _ in range(2000):
        run(client, frozenset(fails))
        client.sweep("q", limit=1000)
        assert queue_problems(r, "q") == []
        if not r.exists(K.base + "resolve") and client.claim("q", 1) is None:
            break
    states = {j: state(r, j) for j in jobs}
    assert all(s in ("done", "dead", "cancelled") for s in states.values()), states
    for job in jobs:
        err = r.hget(K.job(job), "last_error") or b""
        if err.startswith(b"dependency "):
            assert policy[job] == "fail" and err.split()[1].decode() in parents[job]
        if states[job] == "done" and policy[job] == "fail" and not r.hget(K.job(job), "retries"):
            # it ran: every dependency ended done (or was retried to done after it was resolved)
            assert all(states[p] == "done" or r.hget(K.job(p), "retries") for p in parents[job]), (
                job,
                {p: (states[p], r.hget(K.job(p), "retries")) for p in parents[job]},
                r.hgetall(K.job(job)),
            )


# -- Python: enqueue(after=...), ctx.parents() ----------------------------------------------------


def test_python_enqueue_after_and_ctx_parents(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a")
    client.enqueue("q", b"", "b")
    w = client.enqueue("q", b"", "w", after=["a", "b", "gone"], on_parent_failure="continue", missing_ok=True)
    assert w == "w" and state(r, "w") == "waiting"
    seen: dict[str, echomq.Parents] = {}

    def handler(ctx: echomq.JobContext) -> None:
        seen[ctx.id] = ctx.parents()
        if ctx.id == "a":
            raise RuntimeError("boom")

    worker = echomq.Worker(client, "q", handler, max_attempts=1)
    while worker.work_one():
        pass
    assert seen["a"] == {} and seen["w"] == {"a": "dead", "b": "done", "gone": "missing"}
    assert seen["w"].failed == ["a"]
    ok(r)


def test_python_refuses_bad_after_before_sending(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a")
    before = digest(r)
    with pytest.raises(TypeError):
        client.enqueue("q", b"", "b", after="a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot depend on itself"):
        client.enqueue("q", b"", "b", after=["b"])
    with pytest.raises(ValueError, match="on_parent_failure must be one of"):
        client.enqueue("q", b"", "b", after=["a"], on_parent_failure="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="need after"):
        client.enqueue("q", b"", "b", missing_ok=True)
    with pytest.raises(ValueError, match="at most 1000"):
        client.enqueue("q", b"", "b", after=[str(i) for i in range(1001)])
    with pytest.raises(echomq.BadArgument, match="dependency nope does not exist"):
        client.enqueue("q", b"", "b", after=["nope"])
    assert digest(r) == before


def test_asyncio_enqueue_after_and_ctx_parents(server: EmbeddedServer, r: redis.Redis, backend: str) -> None:
    import asyncio

    import echomq.asyncio as aemq

    async def main() -> dict[str, str]:
        client = aemq.Client.from_url(server.url)
        await client.enqueue("q", b"", "a")
        await client.enqueue("q", b"", "w", after=["a"])
        got: dict[str, str] = {}

        async def handler(ctx: aemq.JobContext) -> None:
            got.update(await ctx.parents())

        worker = aemq.Worker(client, "q", handler)
        while await worker.work_one():
            pass
        await client.aclose()
        return got

    assert asyncio.run(main()) == {"a": "done"}
    ok(r)


@st.composite
def dags(draw: st.DrawFn) -> list[tuple[str, list[int], bool, bool]]:
    """Up to 12 jobs: (policy, the earlier jobs it waits for, whether it fails, is cancelled)."""
    n = draw(st.integers(1, 12))
    return [
        (
            draw(st.sampled_from(["fail", "ignore", "continue"])),
            draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else [],
            draw(st.booleans()),
            draw(st.integers(0, 9)) == 0,
        )
        for i in range(n)
    ]


@given(dag=dags())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_hypothesis_dags_end_every_job_as_its_policy_says(
    r: redis.Redis, client: echomq.Client, dag: list[tuple[str, list[int], bool, bool]]
) -> None:
    r.flushall()
    fails = frozenset(f"j{i}" for i, (_, _, f, _) in enumerate(dag) if f)
    for i, (policy, after, _, cancel) in enumerate(dag):
        deps = [f"j{a}" for a in after]
        args: list[object] = ["ON_PARENT_FAILURE", policy, "AFTER", *deps] if after else []
        send(client, f"j{i}", b"", *args)
        if cancel:
            client.cancel("q", f"j{i}")
        assert queue_problems(r, "q") == []
    run(client, fails)
    assert queue_problems(r, "q") == [] and not r.exists(K.base + "resolve")
    states = {f"j{i}": state(r, f"j{i}") for i in range(len(dag))}
    for i, (policy, after, failed, cancel) in enumerate(dag):
        me, parents = f"j{i}", [states[f"j{a}"] for a in after]
        assert states[me] in ("done", "dead", "cancelled"), (me, states)
        if cancel or states[me] == "cancelled":
            continue
        bad = any(p != "done" for p in parents)
        if policy == "fail" and bad:
            reason = r.hget(K.job(me), "last_error") or b""
            assert states[me] == "dead" and reason.startswith(b"dependency ")
        else:
            assert states[me] == ("dead" if failed else "done"), (me, policy, parents)


def test_a_caller_who_may_not_touch_the_waiter_set_is_refused_and_nothing_is_written(
    server: EmbeddedServer, r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    r.execute_command(
        "ACL", "SETUSER", "nodeps", "on", "nopass", "+@all", "~emq:{q}:pending", "~emq:{q}:job:*",
        "~emq:{q}:meta", "~emq:{q}:queue", "~emq:{q}:req:*", "~emq:{q}:deps:*",
    )  # fmt: skip
    limited = server.client(username="nodeps", password="x")
    try:
        before = digest(r)
        with pytest.raises(redis.exceptions.NoPermissionError):
            echomq.Client(limited)._send(("EMQ.ENQUEUE", K.pending, K.base, "b", b"", "AFTER", "a"))
        assert digest(r) == before
        send(client, "b", b"", "AFTER", "a")  # a caller who may
        job = client.claim("q", 30_000)
        assert job is not None
        # the end is refused as a whole for a caller who may not push it to resolve
        with pytest.raises(redis.exceptions.NoPermissionError):
            echomq.Client(limited)._send(("EMQ.COMPLETE", K.active, K.job("a"), "a", job.token))
        assert state(r, "a") == "active"
    finally:
        limited.close()
        r.execute_command("ACL", "DELUSER", "nodeps")


def test_completeclaim_ends_a_dependency_and_the_next_claim_takes_its_waiter(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("q", b"", "a")
    send(client, "b", b"", "AFTER", "a")
    job = client.claim("q", 30_000)
    assert job is not None
    reply = client._send(("EMQ.COMPLETECLAIM", K.active, K.job("a"), K.pending, "a", job.token, 30_000))
    assert isinstance(reply, list) and reply[0] == 1  # its claim ran before the end resolved b
    assert state(r, "b") == "pending" and r.lrange(K.pending, 0, -1) == [b"b"]
    nxt = client.claim("q", 30_000)
    assert nxt is not None and nxt.id == "b"
    ok(r)


@pytest.mark.parametrize(
    "options",
    [
        ("GROUP", "g"),
        ("REQ", "r1", "GROUP", "g"),
        ("GROUP", "g", "UNIQUE", "u"),
        ("PRIORITY", "3", "GROUP", "g"),
    ],
)
def test_the_first_job_of_a_fresh_queue_in_a_group_with_after_writes_meta_once(
    r: redis.Redis, client: echomq.Client, options: tuple[str, ...]
) -> None:
    # The queue's meta is absent, and two steps of one ENQUEUE create it: the group's
    # ring (`ring`) and the dependencies' flag (`deps`).  Writing the second through a
    # handle opened before the first created the key took the server down (the module's
    # write helpers now open such a key again).
    assert not r.exists(K.base + "meta")
    assert send(client, "e", b"", *options, "MISSING", "done", "AFTER", "d") in (1, [1, b"e"])
    assert r.ping()
    meta = r.hgetall(K.base + "meta")
    assert meta.get(b"deps") == b"1" and meta.get(b"ring") == b"1", meta
    assert state(r, "e") == "pending"
    ok(r)
