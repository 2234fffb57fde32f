"""What a job leaves behind (issue 29, the module side): COMPLETE's RESULT, FAIL's TRACE and
DEAD, CHECKPOINT's PROGRESS, the announcement of its end on ``<base>done:<id>``; and the ceilings
on what a row holds (``emq.max-payload-bytes``, ``emq.max-result-bytes``, the fixed 64 KiB on a
traceback, ``emq.max-state-bytes`` on a progress): a value over one is refused with a clear
error and nothing written.  On both backends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import echomq
from echomq import _protocol as proto
from echomq._scripts import ScriptLimits
from echomq.keyspace import queue_keys
from echomq.testing import queue_problems

from ..conftest import ServerFactory, supports
from ..helpers import digest, forged_token

pytestmark = [pytest.mark.backends, pytest.mark.smoke, pytest.mark.memcheck]

SMALL = 100  # the ceilings the tests set: emq.max-payload-bytes, emq.max-result-bytes, max-state-bytes


@pytest.fixture
def small(
    r: redis.Redis, backend: str, server_factory: ServerFactory, module_so: Path
) -> Iterator[echomq.Client]:
    """A client whose server (module: CONFIG SET, or load arguments where the engine has no module
    configs) or scripts (ScriptLimits) keep SMALL bytes."""
    names = ("max-payload-bytes", "max-result-bytes", "max-state-bytes")
    if backend == "scripts":
        limits = ScriptLimits(max_payload_bytes=SMALL, max_result_bytes=SMALL, max_state_bytes=SMALL)
        yield echomq.Client(r, script_limits=limits)
    elif not supports("module_configs"):
        load = ["--loadmodule", str(module_so), *(str(a) for name in names for a in (name, SMALL))]
        yield echomq.Client(server_factory(load, load_module=False).client())
    else:
        saved = {name: r.config_get(f"emq.{name}")[f"emq.{name}"] for name in names}
        for name in names:
            r.config_set(f"emq.{name}", SMALL)
        yield echomq.Client(r)
        for name, value in saved.items():
            r.config_set(f"emq.{name}", value)


def held(client: echomq.Client, job_id: str = "a", payload: bytes = b"p") -> echomq.Job:
    client.enqueue("q", payload, job_id)
    job = client.claim("q", 60_000)
    assert job is not None and job.id == job_id
    return job


# -- RESULT, TRACE, DEAD, PROGRESS ---------------------------------------------------------


def test_complete_stores_the_result(r: redis.Redis, client: echomq.Client) -> None:
    job = held(client)
    client.complete("q", "a", job.token, result="42 ü")
    info = client.job("q", "a")
    assert info is not None and (info.state, info.result) == ("done", "42 ü".encode())
    client.complete("q", "a", job.token, result="other")  # a resend: answered, nothing changes
    assert client.job("q", "a").result == "42 ü".encode()  # type: ignore[union-attr]
    job = held(client, "b")
    client.complete("q", "b", job.token)
    assert client.job("q", "b").result is None  # type: ignore[union-attr]
    assert b"result" not in r.hgetall(queue_keys("q").job("b"))


def test_fail_stores_the_traceback_and_dead_ends_the_job_at_once(
    r: redis.Redis, client: echomq.Client
) -> None:
    keys = queue_keys("q")
    job = held(client)
    assert client.fail("q", "a", job.token, "E: one", max_attempts=9, traceback="Traceback: one") == "pending"
    info = client.job("q", "a")
    assert info is not None and info.traceback == "Traceback: one" and info.last_error == "E: one"
    job2 = client.claim("q", 60_000)
    assert job2 is not None
    # DEAD: dead now, with eight tries left (a NonRetryable error)
    assert (
        client.fail("q", "a", job2.token, "E: two", max_attempts=9, traceback="Traceback: two", dead=True)
        == "dead"
    )
    info = client.job("q", "a")
    assert info is not None and (info.state, info.traceback, info.tries) == ("dead", "Traceback: two", 2)
    assert [(d.id, d.traceback) for d in client.dead("q")] == [("a", "Traceback: two")]
    assert r.hget(keys.job("a"), "closed_by") == b"fail:dead"
    # a failure without a traceback does not leave the previous one beside its error
    client.retry("q", "a")
    job3 = client.claim("q", 60_000)
    assert job3 is not None
    client.fail("q", "a", job3.token, "E: three", max_attempts=9)
    info = client.job("q", "a")
    assert info is not None and info.traceback is None and info.last_error == "E: three"
    assert queue_problems(r, "q") == []


def test_a_cancel_request_wins_over_dead(r: redis.Redis, client: echomq.Client) -> None:
    job = held(client)
    assert client.cancel("q", "a") == "requested"
    assert client.fail("q", "a", job.token, "E: x", dead=True) == "cancelled"
    assert client.counters("q").failed == 0


def test_the_client_keeps_the_newest_8_kib_of_a_traceback(r: redis.Redis, client: echomq.Client) -> None:
    job = held(client)
    frames = "".join(f'  File "x.py", line {i}, in f{i}\n' for i in range(2000)) + "ValueError: last\n"
    client.fail("q", "a", job.token, "ValueError: last", traceback=frames)
    info = client.job("q", "a")
    assert info is not None and info.traceback is not None
    stored = info.traceback.encode()
    assert len(stored) <= proto.MAX_TRACEBACK_BYTES
    assert info.traceback.endswith("ValueError: last\n")  # the newest frames, the error itself
    assert "line 0," not in info.traceback  # the oldest went


def test_checkpoint_stores_a_progress_anyone_reads(r: redis.Redis, client: echomq.Client) -> None:
    job = held(client)
    assert client.checkpoint("q", "a", job.token, 60_000, progress="3/10") is None
    info = client.job("q", "a")
    assert info is not None and info.progress == b"3/10" and info.checkpoint_size is None
    client.checkpoint("q", "a", job.token, 60_000, progress=b"7/10", state=b"s")
    info = client.job("q", "a")
    assert info is not None and info.progress == b"7/10" and info.checkpoint_size == 1
    with pytest.raises(echomq.StaleToken):  # fenced like the state
        client.checkpoint("q", "a", forged_token(job.token), 60_000, progress="9/10")
    assert client.job("q", "a").progress == b"7/10"  # type: ignore[union-attr]


# -- the ceilings ----------------------------------------------------------------------------


def refused(client: echomq.Client, words: str, *args: object) -> None:
    before = digest(client.redis)
    with pytest.raises(redis.ResponseError) as info:
        client._send(tuple(args))
    assert str(info.value) == words
    assert digest(client.redis) == before


def test_a_payload_over_the_ceiling_is_refused(small: echomq.Client) -> None:
    keys = queue_keys("q")
    words = "the payload is larger than emq.max-payload-bytes"
    small.enqueue("q", b"x" * SMALL, "fits")
    refused(small, words, "EMQ.ENQUEUE", keys.pending, keys.base, "a", b"x" * (SMALL + 1))
    refused(small, words, "EMQ.ENQUEUEMANY", keys.pending, keys.base, 2, "a", b"", "b", b"x" * (SMALL + 1))
    with pytest.raises(redis.ResponseError, match=words):
        small.enqueue_many("q", [("a", b""), ("b", b"x" * (SMALL + 1))])
    assert small.job("q", "a") is None


def test_a_result_over_the_ceiling_is_refused(small: echomq.Client) -> None:
    keys = queue_keys("q")
    job = held(small)
    words = "the result is larger than emq.max-result-bytes"
    over = b"r" * (SMALL + 1)
    refused(small, words, "EMQ.COMPLETE", keys.active, keys.job("a"), "a", job.token, "RESULT", over)
    refused(small, words, "EMQ.COMPLETECLAIM", keys.active, keys.job("a"), keys.pending, "a", job.token,
            60_000, "RESULT", over)  # fmt: skip
    small.complete("q", "a", job.token, result=b"r" * SMALL)
    assert small.job("q", "a").result == b"r" * SMALL  # type: ignore[union-attr]


def test_a_trace_over_64_kib_is_refused(client: echomq.Client) -> None:
    keys = queue_keys("q")
    job = held(client)
    args = ("EMQ.FAIL", keys.active, keys.pending, keys.dead, keys.base, "a", job.token, 3, "E: x", "TRACE")
    refused(client, "the TRACE is larger than 65536 bytes", *args, b"t" * 65537)
    assert client._send((*args, b"t" * 65536)) == b"pending"


def test_a_progress_over_the_ceiling_is_refused(small: echomq.Client) -> None:
    keys = queue_keys("q")
    job = held(small)
    args = ("EMQ.CHECKPOINT", keys.active, keys.job("a"), "a", job.token, 60_000)
    refused(small, "the progress is larger than emq.max-state-bytes", *args, "PROGRESS", b"p" * (SMALL + 1))
    refused(small, "the checkpoint state is larger than emq.max-state-bytes", *args, "PROGRESS", b"p",
            "STATE", b"s" * (SMALL + 1))  # fmt: skip


# -- the end, announced ---------------------------------------------------------------------


def subscribed(r: redis.Redis, queue: str, job_id: str) -> Any:
    """A subscription to the job's done channel, as the server announces it."""
    sharded = proto.sharded_announcements(r.info("server"))
    assert sharded == supports("sharded_pubsub")
    sub = r.pubsub()
    command, channel = proto.done_subscription(queue, job_id, sharded)
    (sub.ssubscribe if command == "SSUBSCRIBE" else sub.subscribe)(channel)
    assert sub.get_message(timeout=5)["type"] in ("subscribe", "ssubscribe")  # type: ignore[index]
    return sub


def announced(sub: Any, timeout: float = 5.0) -> list[bytes]:
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = sub.get_message(timeout=0.2)
        if msg is not None and msg["type"] in ("message", "smessage"):
            out.append(msg["data"])
        elif msg is None and out:
            break
    return out


def test_a_waiter_subscribes_reads_the_row_and_hears_the_end(r: redis.Redis, client: echomq.Client) -> None:
    """The waiter's order (echomq._protocol.done): subscribe, read the row, wait for the message."""
    job = held(client)
    sub = subscribed(r, "q", "a")
    try:
        assert client.job("q", "a").state == "active"  # type: ignore[union-attr]  # not ended yet: wait
        client.complete("q", "a", job.token, result="ok")
        assert announced(sub) == [b"a"]
        assert client.job("q", "a").result == b"ok"  # type: ignore[union-attr]
    finally:
        sub.close()


ENDS = [
    "complete",
    "fail dead",
    "fail cancelled",
    "release cancelled",
    "cancel waiting",
    "sweep dead",
    "obliterate",
]


@pytest.mark.parametrize("end", ENDS)
def test_every_end_is_announced_once(r: redis.Redis, client: echomq.Client, end: str) -> None:
    keys = queue_keys("q")
    job = held(client)
    client.enqueue("q", b"", "w")
    sub = subscribed(r, "q", "a" if end != "cancel waiting" else "w")
    try:
        # what does not end the job announces nothing
        client.checkpoint("q", "a", job.token, 60_000, progress="1")
        if end == "complete":
            client.complete("q", "a", job.token)
        elif end == "fail dead":
            client.fail("q", "a", job.token, "E: x", max_attempts=1)
        elif end in ("fail cancelled", "release cancelled"):
            client.cancel("q", "a")
            if end == "fail cancelled":
                assert client.fail("q", "a", job.token, "E: x") == "cancelled"
            else:
                assert client.release("q", "a", job.token) == "cancelled"
        elif end == "cancel waiting":
            assert client.cancel("q", "w") == "cancelled"
        elif end == "sweep dead":
            r.zadd(keys.active, {"a": 1}, xx=True)
            assert client.sweep("q", max_stalled=1).dead == ["a"]
        else:
            assert client.obliterate("q", force=True).removed == 2
        assert announced(sub) == [b"a" if end != "cancel waiting" else b"w"]
        # ended already: a resend, a purge or a forget announces it no more
        if end == "complete":
            client.complete("q", "a", job.token)
            client._send(("EMQ.FORGET", keys.pending, keys.base, "a"))
        elif end in ("fail dead", "sweep dead"):
            client.purge_dead("q")
        assert announced(sub, 0.5) == []
    finally:
        sub.close()


def test_going_back_to_pending_announces_nothing(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    job = held(client)
    sub = subscribed(r, "q", "a")
    try:
        assert client.fail("q", "a", job.token, "E: again", max_attempts=5) == "pending"
        job = client.claim("q", 60_000)
        assert job is not None
        client.release("q", "a", job.token)
        job = client.claim("q", 60_000)
        assert job is not None
        r.zadd(keys.active, {"a": 1}, xx=True)
        assert client.sweep("q", max_stalled=5).recovered == ["a"]
        assert announced(sub, 0.5) == []
    finally:
        sub.close()
