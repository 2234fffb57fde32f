"""Native commands vs the seed's Lua (with the documented EXTEND fix).

Two queues on one server receive the same random operation sequence: one
through EVALSHA of the seed's scripts, the other through EMQ.*.  Every reply
must agree, and so must every key afterwards (lease scores within a few ms:
the two calls read the clock at slightly different moments).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis

from echomq.keyspace import QueueKeys, queue_keys

from .helpers import now_ms
from .seed_scripts import EXTEND_LUA, SWEEP_LUA

LUA, NATIVE = queue_keys("lua"), queue_keys("native")
IDS = ["a", "b", "c", "d", "e", "f", "g", "h", "ünï", "with space", "x:y"]
SCORE_TOLERANCE_MS = 50


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("ok", call())
    except redis.ResponseError as exc:
        return ("error", str(exc).split(" ")[0])


def snapshot(r: redis.Redis, keys: QueueKeys) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name in ("active", "pending", "dead"):
        state[name] = r.zrange(getattr(keys, name), 0, -1, withscores=True)
    state["metrics"] = r.hgetall(keys.metrics_failed)
    for job in IDS:
        state["job:" + job] = r.hgetall(keys.job(job))
    return state


def assert_same(lua: dict[str, Any], native: dict[str, Any]) -> None:
    assert lua.keys() == native.keys()
    for name in lua:
        if name == "active":
            assert [m for m, _ in lua[name]] == [m for m, _ in native[name]], name
            for (_, a), (_, b) in zip(lua[name], native[name], strict=True):
                assert abs(a - b) <= SCORE_TOLERANCE_MS, (name, a, b)
        else:
            assert lua[name] == native[name], name


class Scenario:
    def __init__(self, r: redis.Redis, rng: random.Random) -> None:
        self.r, self.rng = r, rng
        self.extend_sha = r.script_load(EXTEND_LUA)
        self.sweep_sha = r.script_load(SWEEP_LUA)

    def both(self, op: Any) -> None:
        """Apply op to each queue; the replies must match."""
        assert outcome(lambda: op(LUA, "lua")) == outcome(lambda: op(NATIVE, "native"))

    def step(self) -> None:
        rng, r = self.rng, self.r
        job = rng.choice(IDS)
        kind = rng.choices(
            ["claim", "lapse", "extend", "extend_stale", "sweep", "drop_row", "drop_member", "poke"],
            weights=[5, 3, 6, 2, 3, 1, 1, 1],
        )[0]
        now = now_ms(r)
        if kind == "claim":  # a claim bumps attempts and leases the job far ahead
            deadline = now + rng.randint(60_000, 120_000)
            for keys in (LUA, NATIVE):
                r.hincrby(keys.job(job), "attempts", 1)
                r.hset(keys.job(job), "state", "active")
                r.zrem(keys.pending, job)
                r.zadd(keys.active, {job: deadline})
        elif kind == "lapse":  # the holder died a while ago: its deadline is in the past
            deadline = now - rng.randint(1_000, 100_000)
            for keys in (LUA, NATIVE):
                if r.zscore(keys.active, job) is not None:
                    r.zadd(keys.active, {job: deadline})
        elif kind in ("extend", "extend_stale"):
            attempts = r.hget(LUA.job(job), "attempts")
            token = attempts.decode() if attempts and kind == "extend" else str(rng.randint(0, 5))
            lease = str(rng.choice([10_000, 60_000, 3_600_000]))

            def extend(keys: QueueKeys, engine: str) -> Any:
                if engine == "lua":
                    return r.evalsha(self.extend_sha, 2, keys.active, keys.job(job), job, token, lease)
                return r.execute_command("EMQ.EXTEND", keys.active, keys.job(job), job, token, lease)

            self.both(extend)
        elif kind == "sweep":
            max_stalled, limit = rng.randint(1, 4), rng.randint(1, 6)

            def sweep(keys: QueueKeys, engine: str) -> Any:
                if engine == "lua":
                    return r.evalsha(
                        self.sweep_sha, 3, keys.active, keys.pending, keys.dead, keys.base, max_stalled, limit
                    )
                return r.execute_command(
                    "EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, max_stalled, limit
                )

            self.both(sweep)
        elif kind == "drop_row":
            for keys in (LUA, NATIVE):
                r.delete(keys.job(job))
        elif kind == "drop_member":
            for keys in (LUA, NATIVE):
                r.zrem(keys.active, job)
        else:  # the row exists without attempts
            for keys in (LUA, NATIVE):
                r.hdel(keys.job(job), "attempts")


@pytest.mark.parametrize("seed", range(12))
def test_native_agrees_with_the_seed_lua(r: redis.Redis, seed: int) -> None:
    scenario = Scenario(r, random.Random(seed))
    for _ in range(150):
        scenario.step()
        assert_same(snapshot(r, LUA), snapshot(r, NATIVE))
