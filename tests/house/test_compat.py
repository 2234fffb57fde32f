"""The caller's redis-py, whatever its version and protocol: every verb, both workers and the CLI.

A caller hands echomq a redis-py client it made: RESP2 or RESP3 (the default from
redis-py 8), and from redis-py 8.1 perhaps with ``legacy_responses=False``; the replies
then come back as other Python types (maps as dicts, scores as floats, sets as sets).
Each test here runs once per reply mode, on the module and on the scripts backend.  The
compat run (tests/compat/run.py) runs this file, with a few others, on every redis-py
and Python that pyproject.toml admits; `--resp N` keeps the modes of RESP N only.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import echomq
import echomq.asyncio as emq
from echomq.testing import EmbeddedServer

from ..faults import pythonpath, wait_until

pytestmark = [pytest.mark.backends, pytest.mark.once]

ROOT = Path(__file__).resolve().parents[2]
Q = "compat"

UNIFIED = "legacy_responses" in inspect.signature(redis.Redis.__init__).parameters
MODES: dict[str, dict[str, Any]] = {
    "RESP2": {"protocol": 2},
    "RESP3": {"protocol": 3},
    # redis-py 8.1+: the same Python types whatever the protocol (not the 8.x default)
    "RESP3-unified": {"protocol": 3, "legacy_responses": False},
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "mode" in metafunc.fixturenames:
        resp = metafunc.config.getoption("--resp")
        names = [n for n, kw in MODES.items() if resp is None or kw["protocol"] == resp]
        metafunc.parametrize("mode", names)


@pytest.fixture
def kwargs(mode: str) -> dict[str, Any]:
    if "legacy_responses" in MODES[mode] and not UNIFIED:
        pytest.skip(f"redis-py {redis.__version__} has no legacy_responses (it came in 8.1)")
    return dict(MODES[mode])


@pytest.fixture
def caller(server: EmbeddedServer, kwargs: dict[str, Any], backend: str) -> echomq.Client:
    """The client a user makes from their own redis-py client, in the mode under test."""
    conn = server.client(**kwargs)
    conn.flushall()
    info = conn.execute_command("CLIENT", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    assert f"resp={kwargs['protocol']}" in text.split(), text  # the connection speaks what we asked
    made = echomq.Client(conn)
    assert made.backend == backend
    return made


def test_every_verb_answers_in_its_own_types(caller: echomq.Client) -> None:
    c = caller
    ids = c.enqueue_many("other", [b"x", b"y"])
    assert len(ids) == 2 and all(isinstance(i, str) for i in ids)
    assert sorted(p.id for p in c.pending("other")) == sorted(ids)
    # ids in the order of their enqueue: a tie in the same millisecond is broken by the id
    for job_id, payload in (("a", b"one"), ("b", "two"), ("c", b"three"), ("d", b"four")):
        assert c.enqueue(Q, payload, job_id=job_id) == job_id
    assert c.enqueue(Q, b"later", job_id="late", delay_ms=600_000) == "late"
    counts = c.counts(Q)
    assert (counts.pending, counts.delayed, counts.active, counts.dead) == (4, 1, 0, 0)
    assert [p.id for p in c.pending(Q)][:4] == ["a", "b", "c", "d"]

    job = c.claim(Q, lease_ms=30_000)
    assert job is not None and job.id == "a" and job.payload == b"one" and job.attempt == 1
    assert isinstance(job.token, str) and job.token.startswith("1-")
    c.extend(Q, job.id, job.token, lease_ms=30_000)
    assert c.extend_many(Q, [(job.id, job.token), ("nobody", "1-0000000000000000")], 30_000) == [
        echomq.ExtendOutcome.OK,
        echomq.ExtendOutcome.GONE,
    ]
    assert c.checkpoint(Q, job.id, job.token, 30_000, state=b"half") is None
    [active] = c.active(Q)
    assert active.id == "a" and 0 < active.lease_left_ms <= 30_000
    info = c.job(Q, "a", payload=True)
    assert info is not None and info.state == "active" and info.payload == b"one"
    assert info.attempts == 1 and info.lease_left_ms is not None and info.lease_left_ms > 0
    c.complete(Q, job.id, job.token)
    with pytest.raises(echomq.StaleToken):
        c.extend(Q, job.id, job.token, lease_ms=1000)

    many = c.claim_many(Q, lease_ms=30_000, count=2)
    assert [j.payload for j in many] == [b"two", b"three"]
    assert c.release(Q, many[0].id, many[0].token) == "pending"
    assert c.fail(Q, many[1].id, many[1].token, max_attempts=2, error="boom") == "pending"
    held = {j.id: j for j in c.claim_many(Q, lease_ms=30_000, count=10)}
    assert sorted(held) == ["b", "c", "d"]
    again, retried = held["b"], held["c"]
    assert again.attempt == 1 and again.token.startswith("2-")  # a release uses no try
    assert retried.attempt == 2 and retried.token.startswith("2-")
    c.complete(Q, "d", held["d"].token)
    assert c.fail(Q, retried.id, retried.token, max_attempts=2, error="boom") == "dead"
    [dead] = c.dead(Q)
    assert (dead.id, dead.last_error, dead.attempts) == (retried.id, "boom", 2) and dead.died_at > 0
    assert c.counters(Q).dead_lettered == 1
    assert c.retry_dead(Q).retried == 1
    assert c.cancel(Q, again.id, "not needed") == "requested"
    assert c.cancel(Q, "late", "not needed") == "cancelled"
    assert c.pause(Q) is True and c.claim(Q, lease_ms=1000) is None
    assert c.resume(Q) is True
    assert Q in c.queues()
    c.redis.zadd(f"emq:{{{Q}}}:active", {again.id: 0})  # its lease lapsed: a sweep ends it, as asked
    assert c.sweep(Q, max_stalled=3, limit=10) == echomq.SweepResult(cancelled=["b"])
    # c, retried and pending; a and d done; b and late cancelled
    assert c.obliterate(Q, force=True) == echomq.ObliterateResult(removed=1, forgotten=4)
    assert c.counts(Q).pending == 0


def test_the_thread_worker_runs_retries_and_hears_a_cancel(caller: echomq.Client) -> None:
    seen: list[tuple[str, int]] = []
    running = threading.Event()

    def handler(ctx: echomq.JobContext) -> None:
        seen.append((ctx.job.id, ctx.job.attempt))
        if ctx.job.id == "flaky" and ctx.job.attempt == 1:
            raise RuntimeError("first try fails")
        if ctx.job.id == "long":
            running.set()
            while not ctx.cancel.sleep(0.05):
                ctx.checkpoint(b"step")
            ctx.raise_if_cancelled()
        ctx.checkpoint(b"done")

    for job_id in ("ok", "flaky", "long"):
        caller.enqueue(Q, job_id.encode(), job_id=job_id)
    worker = echomq.Worker(caller, Q, handler, lease_ms=5_000, concurrency=3, grace=2.0)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        assert running.wait(15)
        assert caller.cancel(Q, "long", "from outside") == "requested"
        assert wait_until(
            lambda: all(_state(caller, j) in ("done", "cancelled") for j in ("ok", "flaky", "long")), 20
        )
    finally:
        worker.stop()
        thread.join(20)
    assert not thread.is_alive()
    assert (_state(caller, "ok"), _state(caller, "flaky"), _state(caller, "long")) == (
        "done",
        "done",
        "cancelled",
    )
    assert ("flaky", 2) in seen
    assert worker.stats.completed == 2


def test_the_asyncio_worker_runs_retries_and_hears_a_cancel(
    server: EmbeddedServer, kwargs: dict[str, Any], caller: echomq.Client, backend: str
) -> None:
    async def main() -> list[tuple[str, int]]:
        conn = aioredis.Redis(host=server.host, port=server.port, **kwargs)
        client = emq.Client(conn)
        assert await client.detect_backend() == backend
        seen: list[tuple[str, int]] = []
        running = asyncio.Event()

        async def handler(ctx: emq.JobContext) -> None:
            seen.append((ctx.job.id, ctx.job.attempt))
            if ctx.job.id == "flaky" and ctx.job.attempt == 1:
                raise RuntimeError("first try fails")
            if ctx.job.id == "long":
                running.set()
                while True:
                    await ctx.checkpoint(b"step")
                    await asyncio.sleep(0.05)
            await ctx.checkpoint(b"done")

        for job_id in ("ok", "flaky", "long"):
            await client.enqueue(Q, job_id.encode(), job_id=job_id)
        async with emq.Worker(client, Q, handler, lease_ms=5_000, concurrency=3, grace=2.0) as worker:
            await asyncio.wait_for(running.wait(), 15)
            assert await client.cancel(Q, "long", "from outside") == "requested"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                states = [(await client.job(Q, j)) for j in ("ok", "flaky", "long")]
                if all(s is not None and s.state in ("done", "cancelled") for s in states):
                    break
                await asyncio.sleep(0.05)
        assert worker.stats.completed == 2
        await client.aclose()
        return seen

    seen = asyncio.run(main())
    assert (_state(caller, "ok"), _state(caller, "flaky"), _state(caller, "long")) == (
        "done",
        "done",
        "cancelled",
    )
    assert ("flaky", 2) in seen


HANDLER = """
def handle(ctx):
    ctx.checkpoint(b"cli")
"""


def test_the_cli_enqueues_inspects_and_works(
    server: EmbeddedServer, kwargs: dict[str, Any], caller: echomq.Client, backend: str, tmp_path: Path
) -> None:
    if "legacy_responses" in kwargs:
        pytest.skip("a URL cannot ask for legacy_responses=False")
    url = f"redis://{server.host}:{server.port}/0?protocol={kwargs['protocol']}"
    (tmp_path / "clitasks.py").write_text(HANDLER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env.update(ECHOMQ_URL=url, PYTHONPATH=pythonpath(tmp_path))

    def cli(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "echomq", *argv],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert cli("enqueue", Q, '{"to": "ada"}', "--id", "j1").strip() == "j1"
    shown = cli("inspect", Q)
    assert "pending 1   active 0   dead 0" in shown and f"backend {backend}" in shown
    worker = subprocess.Popen(
        [sys.executable, "-m", "echomq", "worker", "clitasks:handle", "-q", Q, "--grace", "1"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: _state(caller, "j1") == "done", 20), _state(caller, "j1")
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert cli("job", Q, "j1").splitlines()[1].split() == ["state", "done"]


def _state(client: echomq.Client, job_id: str) -> str | None:
    info = client.job(Q, job_id)
    return None if info is None else info.state
