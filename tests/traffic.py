"""Mixed EXTEND/SWEEP traffic for the tests that compare two servers' data.

Lapsed and live leases, stale and gone holders, dead-lettering, re-claims,
and the same commands sent plainly, inside MULTI/EXEC and from Lua
(`redis.call('EMQ.EXTEND', ...)`).  Bounded in count; every random choice
comes from the caller's seeded generator.
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
    """A worker claims the oldest pending job: attempts + 1, token = the new
    attempts (as ``put_active`` writes it, so the traffic can name tokens), a
    fresh lease (sometimes one that has already lapsed, so a later sweep takes it)."""
    keys = queue_keys(q)
    popped = r.zpopmin(keys.pending)
    if not popped:
        return
    job_id = popped[0][0]
    attempts = r.hincrby(keys.job(job_id), "attempts", 1)
    r.hset(keys.job(job_id), mapping={"state": "active", "token": attempts})
    r.zadd(keys.active, {job_id: now_ms(r) + rng.choice((-1, 1)) * rng.randint(1, 60_000)})


def run_traffic(
    r: redis.Redis, rng: random.Random, queues: list[str], jobs: int = 40, ops: int = 200
) -> Counter[str]:
    """Send the traffic to `r`; returns how often each outcome happened."""
    seed_queues(r, rng, queues, jobs)
    client = Client(r)
    seen: Counter[str] = Counter()
    for _ in range(ops):
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
        if kind < 0.45:
            try:
                client.extend(q, job_id, token=token, lease_ms=lease)
                seen["extended"] += 1
            except LeaseLost as exc:
                seen[type(exc).__name__] += 1
        elif kind < 0.6:
            try:
                reply = r.eval(EXTEND_FROM_LUA, 2, keys.active, keys.job(job_id), job_id, token, lease)
                seen["lua-extended" if reply == 1 else "lua-gone"] += 1
            except redis.ResponseError as exc:
                assert "EMQSTALE" in str(exc), exc
                seen["lua-stale"] += 1
        elif kind < 0.7:
            result = client.sweep(q, max_stalled=rng.randint(1, 3), limit=rng.randint(1, 20))
            seen["recovered"] += len(result.recovered)
            seen["dead"] += len(result.dead)
        elif kind < 0.8:
            recovered, dead, cancelled, expired = r.eval(
                SWEEP_FROM_LUA, 3, keys.active, keys.pending, keys.dead, keys.base, 2, 5
            )
            assert (cancelled, expired) == ([], 0)
            seen["lua-recovered"] += len(recovered)
            seen["lua-dead"] += len(dead)
        elif kind < 0.9:
            pipe = r.pipeline(transaction=True)
            pipe.execute_command("EMQ.EXTEND", keys.active, keys.job(job_id), job_id, token, lease)
            pipe.execute_command("EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, 2, 3)
            pipe.hset(keys.job(job_id), "progress", rng.randint(0, 100))
            extended, (recovered, dead, _, _), _ = pipe.execute(raise_on_error=False)
            seen["multi-extended" if extended == 1 else "multi-refused"] += 1
            seen["multi-swept"] += len(recovered) + len(dead)
        else:
            _claim(r, q, rng)
            seen["claimed"] += 1
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
