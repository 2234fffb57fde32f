"""Mixed traffic for the tests that compare two servers' data.

Lapsed and live leases, stale and gone holders, dead-lettering, re-claims,
and the same commands sent plainly, inside MULTI/EXEC and from Lua
(`redis.call('EMQ.EXTEND', ...)`); and the v3 keyspace's keys: jobs enqueued
at priorities and with delays (``priority``, ``delayed``, ``meta``'s
``seq``), cancelled while waiting (tombstones, ``stale``), ended with results,
tracebacks and progress in pieces, claimed across the lanes.  Bounded in
count; every random choice comes from the caller's seeded generator.
"""

from __future__ import annotations

import random
from collections import Counter

import redis

from echomq import Client, LeaseLost
from echomq.keyspace import queue_keys

from .helpers import now_ms, put_active

EXTEND_FROM_LUA = "return redis.call('EMQ.EXTEND', KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])"
SWEEP_FROM_LUA = (
    "local r = redis.call('EMQ.SWEEP', KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3]) "
    "redis.call('HINCRBY', ARGV[1] .. 'metrics:sweeps', 'count', 1) "
    "return r"
)


def seed_queues(r: redis.Redis, rng: random.Random, queues: list[str], jobs: int) -> None:
    now = now_ms(r)
    for q in queues:
        for i in range(jobs):
            live = rng.random() < 0.5
            deadline = now + rng.randint(30_000, 90_000) if live else now - rng.randint(1, 50_000)
            put_active(
                r, q, f"job-{i}", attempts=rng.randint(1, 3), deadline=deadline, stalled=rng.randint(0, 2)
            )
        # A lapsed id whose row vanished: the sweep re-creates the row.
        r.zadd(queue_keys(q).active, {"orphan": now - 10})


def _claim(r: redis.Redis, q: str, rng: random.Random) -> None:
    """A worker claims the next job by hand: attempts + 1, token = the new
    attempts (as ``put_active`` writes it, so the traffic can name tokens), a
    fresh lease (sometimes one that has already lapsed, so a later sweep takes it).
    Half the time EMQ.CLAIM itself takes one instead, across the lanes, and
    its random token is replaced by the counter the traffic names."""
    keys = queue_keys(q)
    if rng.random() < 0.5:
        reply = r.execute_command("EMQ.CLAIM", keys.pending, keys.active, keys.base, rng.randint(1, 60_000))
        if reply:
            job_id = reply[0][0]
            r.hset(keys.job(job_id), "token", r.hget(keys.job(job_id), "attempts") or b"1")
        return
    job_id = r.lpop(keys.pending)
    if job_id is None or r.hget(keys.job(job_id), "state") != b"pending":
        return  # a tombstone: the hand-made claim drops it (and leaves `stale` behind, as a crash would)
    attempts = r.hincrby(keys.job(job_id), "attempts", 1)
    r.hset(keys.job(job_id), mapping={"state": "active", "token": attempts})
    r.zadd(keys.active, {job_id: now_ms(r) + rng.choice((-1, 1)) * rng.randint(1, 60_000)})


def _limit(r: redis.Redis, q: str, rng: random.Random, seen: Counter[str]) -> None:
    """The queue's rate limit changes (issue 32): a rate (its window and count written by the
    claims it allows), removed, a back-off set or lifted -- absolute values for the replica."""
    keys = queue_keys(q)
    options = rng.choice([["RATE", rng.randint(1, 5), "PER", rng.choice([50, 1000, 86_400_000])], ["OFF"],
                          ["BACKOFF", rng.choice([0, 0, 20])], []])  # fmt: skip
    r.execute_command("EMQ.LIMIT", keys.pending, keys.base, *options)
    seen["limit"] += 1


def _lanes(r: redis.Redis, q: str, rng: random.Random, i: int, seen: Counter[str]) -> None:
    """The v3 keyspace's writes: an enqueue at a priority or with a delay, a cancel of a waiting
    job, an end with a result or a traceback, a progress (values in 64-byte pieces)."""
    keys = queue_keys(q)
    kind = rng.random()
    payload = rng.choice([b"p", b"x" * 64, b"y" * 65, bytes(range(256)) * 4, b"z" * 1025])
    if kind < 0.4:
        options: list[object] = []
        if rng.random() < 0.5:
            options += ["PRIORITY", rng.choice([-1000, -3, 0, 2, 1000])]
        if rng.random() < 0.3:
            options += ["DELAY", rng.choice([0, 1, 600_000])]
        urng = random.Random(i)  # UNIQUE's choices apart: the traffic's other choices stay as they were
        if urng.random() < 0.4:  # a unique key: held, replaced, released by the ends below
            options += ["UNIQUE", urng.choice(["u1", "u2", "u3"])]
            options += urng.choice([[], [], ["FOR", 600_000], ["REPLACE"]])
        reply = r.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, f"new-{i}", payload, *options)
        seen["enqueued" if reply == 1 or reply[0] == 1 else "unique-held"] += 1
        if not (reply == 1 or reply[0] == 1):
            rng.random()  # the draw below, made all the same
            return
        if rng.random() < 0.4:  # cancelled while it waits: a tombstone, or out of its lane
            seen[
                f"cancel-{r.execute_command('EMQ.CANCEL', keys.pending, keys.base, f'new-{i}', 'no')!r}"
            ] += 1
        return
    job_id = f"new-{rng.randrange(max(i, 1))}" if rng.random() < 0.5 else f"job-{rng.randrange(40)}"
    token = r.hget(keys.job(job_id), "token") or b"1"
    if kind < 0.55:
        seen[f"cancel-{r.execute_command('EMQ.CANCEL', keys.pending, keys.base, job_id, 'why')!r}"] += 1
        return
    try:
        if kind < 0.7:
            r.execute_command("EMQ.COMPLETE", keys.active, keys.job(job_id), job_id, token, "RESULT", payload)
        elif kind < 0.85:
            fail = ["EMQ.FAIL", keys.active, keys.pending, keys.dead, keys.base, job_id, token, 3, "E: x"]
            r.execute_command(*fail, "TRACE", payload, *(["DEAD"] if rng.random() < 0.3 else []))
        else:
            r.execute_command(
                "EMQ.CHECKPOINT", keys.active, keys.job(job_id), job_id, token, 30_000, "PROGRESS", payload
            )
        seen["ended-or-checkpointed"] += 1
    except redis.ResponseError as exc:
        assert "EMQSTALE" in str(exc), exc
        seen["lanes-stale"] += 1


def run_traffic(
    r: redis.Redis, rng: random.Random, queues: list[str], jobs: int = 40, ops: int = 200
) -> Counter[str]:
    """Send the traffic to `r`; returns how often each outcome happened."""
    seed_queues(r, rng, queues, jobs)
    client = Client(r)
    seen: Counter[str] = Counter()
    for step in range(ops):
        q = rng.choice(queues)
        keys = queue_keys(q)
        job_id = f"job-{rng.randrange(jobs)}" if rng.random() < 0.95 else "never-claimed"
        raw = r.hget(keys.job(job_id), "attempts")
        attempts = int(raw) if raw is not None else 1
        if rng.random() < 0.15:
            attempts -= 1  # a holder from an earlier attempt
        token = str(attempts)  # the rows here carry token = attempts
        lease = rng.randint(1_000, 90_000)
        kind = rng.random()
        if kind < 0.35:
            try:
                client.extend(q, job_id, token=token, lease_ms=lease)
                seen["extended"] += 1
            except LeaseLost as exc:
                seen[type(exc).__name__] += 1
        elif kind < 0.45:
            try:
                reply = r.eval(EXTEND_FROM_LUA, 2, keys.active, keys.job(job_id), job_id, token, lease)
                seen["lua-extended" if reply == 1 else "lua-gone"] += 1
            except redis.ResponseError as exc:
                assert "EMQSTALE" in str(exc), exc
                seen["lua-stale"] += 1
        elif kind < 0.53:
            result = client.sweep(q, max_stalled=rng.randint(1, 3), limit=rng.randint(1, 20))
            seen["recovered"] += len(result.recovered)
            seen["dead"] += len(result.dead)
        elif kind < 0.6:
            recovered, dead, cancelled, expired = r.eval(
                SWEEP_FROM_LUA, 3, keys.active, keys.pending, keys.dead, keys.base, 2, 5
            )
            assert (cancelled, expired) == ([], 0)
            seen["lua-recovered"] += len(recovered)
            seen["lua-dead"] += len(dead)
        elif kind < 0.68:
            pipe = r.pipeline(transaction=True)
            pipe.execute_command("EMQ.EXTEND", keys.active, keys.job(job_id), job_id, token, lease)
            pipe.execute_command("EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, 2, 3)
            pipe.hset(keys.job(job_id), "progress", rng.randint(0, 100))
            extended, (recovered, dead, _, _), _ = pipe.execute(raise_on_error=False)
            seen["multi-extended" if extended == 1 else "multi-refused"] += 1
            seen["multi-swept"] += len(recovered) + len(dead)
        elif kind < 0.78:
            if rng.random() < 0.25:
                _limit(r, q, rng, seen)
            _claim(r, q, rng)
            seen["claimed"] += 1
        else:
            _lanes(r, q, rng, step, seen)
    for q in queues:
        result = client.sweep(q, max_stalled=2, limit=10_000)
        seen["recovered"] += len(result.recovered)
        seen["dead"] += len(result.dead)
    return seen


def assert_covers_everything(seen: Counter[str]) -> None:
    """The traffic exercised every path, so equal digests mean something."""
    for outcome in (
        "extended",
        "StaleToken",
        "JobGone",
        "recovered",
        "dead",
        "lua-extended",
        "multi-extended",
    ):
        assert seen[outcome] > 0, (outcome, seen)
    assert seen["lua-recovered"] + seen["lua-dead"] > 0, seen
    assert seen["multi-swept"] > 0, seen
    assert seen["enqueued"] > 0 and seen["ended-or-checkpointed"] > 0, seen
    assert seen["cancel-b'cancelled'"] > 0, seen  # a tombstone in <pending>, or a lane left
