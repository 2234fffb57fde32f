"""The module's contract holes found in review (issue 22), each a reproduction.

1. A holder could act on another job: ``<job>`` was never checked against
   ``<id>`` (COMPLETE, EXTEND, CHECKPOINT).
2. CLAIM answered null after writing while ``<pending>`` was not empty (it
   dropped jobs carrying a cancel request, one more than its bound).
3. Every call, even an error or a no-op, broke other clients' WATCH and sent
   client-tracking invalidations.
4. The ACL of derived keys was checked after the rows were read, so a refused
   user learned what the rows held.
5. A negative integer ``attempts`` was "not an integer" to FAIL but not to CLAIM.

Each test fails on the code before the fix.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..helpers import digest, now_ms, put_active, queued

Q = queue_keys("q")
NOT_ITS_ROW = "ERR <job> must be <base>job:<id>, where <active> is <base>active"


# -- 1. a holder acts only on its own job ------------------------------------------


@pytest.mark.parametrize("verb", ["EMQ.COMPLETE", "EMQ.EXTEND", "EMQ.CHECKPOINT"])
def test_a_token_of_ones_own_cannot_reach_another_job(r: redis.Redis, verb: str) -> None:
    # The reproduction: 'mine' is held with token 1, 'victim' by someone else.
    deadline = now_ms(r) + 60_000
    put_active(r, "q", "mine", attempts=1, deadline=deadline)
    put_active(r, "q", "victim", attempts=7, deadline=deadline)
    before = digest(r)
    args = [verb, Q.active, Q.job("mine"), "victim", "1"]
    if verb != "EMQ.COMPLETE":
        args.append(60_000)
    with pytest.raises(redis.ResponseError) as refused:
        r.execute_command(*args)
    assert str(refused.value) == NOT_ITS_ROW.removeprefix("ERR ")
    assert digest(r) == before
    # ... and the same call naming its own row works.
    args[2], args[3] = Q.job("mine"), "mine"
    assert r.execute_command(*args) in (1, [1, None])


@pytest.mark.parametrize(
    ("active", "job", "job_id"),
    [
        ("emq:{q}:active", "emq:{q}:job:", "x"),  # the row of another id
        ("emq:{q}:active", "emq:{q}:job:x", "x2"),
        ("emq:{q}:active", "emq:{p}:job:x", "x"),  # another queue's row
        ("emq:{q}:pending", "emq:{q}:job:x", "x"),  # not an active set
        ("active", "job:x", "x2"),
    ],
)
def test_every_mismatched_job_key_is_refused_before_anything_is_read(
    r: redis.Redis, active: str, job: str, job_id: str
) -> None:
    r.set(job, "not a hash")  # a wrong type would answer WRONGTYPE if it were read first
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="must be <base>job:<id>"):
        r.execute_command("EMQ.EXTEND", active, job, job_id, "1", 1000)
    assert digest(r) == before


# -- 2. a null CLAIM wrote nothing, and CLAIM drops nothing ------------------------


def test_claim_takes_a_job_with_a_cancel_request_instead_of_dropping_it(r: redis.Redis) -> None:
    # The reproduction: 20 pending ids carrying cancel_requested ahead of 'good'.
    for i in range(20):
        r.hset(Q.job(f"c{i:02}"), mapping={"state": "pending", "attempts": 0, "cancel_requested": "x"})
        r.rpush(Q.pending, f"c{i:02}")
    r.hset(Q.job("good"), mapping={"state": "pending", "attempts": 0})
    r.rpush(Q.pending, "good")
    claimed = r.execute_command("EMQ.CLAIM", Q.pending, Q.active, Q.base, 60_000)
    assert claimed is not None and [job[0] for job in claimed] == [b"c00"]
    assert queued(r, Q) == 20  # exactly one left, none dropped
    # The holder hears of the request at its first checkpoint.
    token = claimed[0][1]
    assert r.execute_command("EMQ.CHECKPOINT", Q.active, Q.job("c00"), "c00", token, 1000) == [1, b"x"]


@pytest.mark.parametrize("why", ["empty", "delayed", "paused"])
def test_a_null_claim_wrote_nothing(r: redis.Redis, why: str) -> None:
    if why == "delayed":
        r.hset(Q.job("later"), mapping={"state": "pending", "attempts": 0})
        r.zadd(Q.delayed, {"later": now_ms(r) + 600_000})
    if why == "paused":
        r.hset(Q.meta, "paused", 1)
        r.execute_command("EMQ.ENQUEUE", Q.pending, Q.base, "j", "p")
    before = digest(r)
    assert r.execute_command("EMQ.CLAIM", Q.pending, Q.active, Q.base, 60_000, "COUNT", 5) is None
    assert digest(r) == before


def test_a_swept_job_with_a_cancel_request_ends_cancelled_and_never_reaches_pending(r: redis.Redis) -> None:
    put_active(r, "q", "j", attempts=1, deadline=1, cancel_requested="stop")
    reply = r.execute_command("EMQ.SWEEP", Q.active, Q.pending, Q.dead, Q.base, 3, 10)
    assert reply == [[], [], [b"j"], 0]
    assert not r.exists(Q.pending)
    assert r.hget(Q.job("j"), "state") == b"cancelled"
    assert 0 < r.pttl(Q.job("j")) <= 86_400_000  # the cancelled retention


# -- 3. only a real change breaks WATCH and invalidates tracking -------------------


def _watch_survives(server: EmbeddedServer, key: str, action: Callable[[], object]) -> bool:
    """WATCH key, run action from another connection, then EXEC: True if the EXEC ran."""
    watcher = server.client()
    try:
        pipe = watcher.pipeline(transaction=True)
        pipe.watch(key)
        action()
        pipe.multi()
        pipe.ping()
        try:
            pipe.execute()
            return True
        except redis.WatchError:
            return False
    finally:
        watcher.close()


class Tracker:
    """A RESP2 tracking client (broadcast mode, prefix "emq:") whose
    invalidations arrive on a subscribed connection of its own, read raw:
    the test only needs to know which keys were named, if any."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.sub = socket.create_connection((server.host, server.port))
        self.sub.sendall(b"CLIENT ID\r\n")
        sub_id = int(self._read_until(b"\r\n")[1:])
        self.sub.sendall(b"SUBSCRIBE __redis__:invalidate\r\n")
        self._read_until(b"invalidate\r\n:1\r\n")
        self.tracked = server.client(single_connection_client=True)
        self.tracked.execute_command(
            "CLIENT", "TRACKING", "ON", "REDIRECT", sub_id, "BCAST", "PREFIX", "emq:"
        )

    def _read_until(self, end: bytes) -> bytes:
        data = b""
        while not data.endswith(end):
            data += self.sub.recv(1)
        return data[: -len(b"\r\n")] if end == b"\r\n" else data

    def invalidated(self, wait: float = 0.2) -> bytes:
        """The raw invalidation messages that arrive within `wait` seconds (b"" if none)."""
        data = b""
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if select.select([self.sub], [], [], left)[0]:
                chunk = self.sub.recv(65536)
                if not chunk:
                    break
                data += chunk
        return data

    def close(self) -> None:
        self.sub.close()
        self.tracked.close()


@pytest.fixture
def tracker(server: EmbeddedServer, r: redis.Redis) -> Iterator[Tracker]:
    t = Tracker(server)
    yield t
    t.close()


def _no_ops(r: redis.Redis) -> dict[str, list[object]]:
    """One call per verb that answers without changing anything."""
    deadline = now_ms(r) + 600_000
    put_active(r, "q", "held", attempts=2, deadline=deadline)
    r.hset(Q.job("done"), mapping={"state": "done", "token": "9"})
    return {
        "extend stale": ["EMQ.EXTEND", Q.active, Q.job("held"), "held", "1", 1000],
        "extend gone": ["EMQ.EXTEND", Q.active, Q.job("nope"), "nope", "1", 1000],
        "extend bad lease": ["EMQ.EXTEND", Q.active, Q.job("held"), "held", "2", "x"],
        "checkpoint stale": ["EMQ.CHECKPOINT", Q.active, Q.job("held"), "held", "1", 1000],
        "complete stale": ["EMQ.COMPLETE", Q.active, Q.job("held"), "held", "1"],
        "complete gone": ["EMQ.COMPLETE", Q.active, Q.job("nope"), "nope", "1"],
        "fail stale": ["EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, "held", "1", 3, "e"],
        "sweep nothing lapsed": ["EMQ.SWEEP", Q.active, Q.pending, Q.dead, Q.base, 1, 10],
        "enqueue exists": ["EMQ.ENQUEUE", Q.pending, Q.base, "held", "p"],
        "claim empty": ["EMQ.CLAIM", Q.pending, Q.active, Q.base, 1000],
        "cancel gone": ["EMQ.CANCEL", Q.pending, Q.base, "nope", "r"],
        "cancel finished": ["EMQ.CANCEL", Q.pending, Q.base, "done", "r"],
    }


NO_OPS = [
    "extend stale",
    "extend gone",
    "extend bad lease",
    "checkpoint stale",
    "complete stale",
    "complete gone",
    "fail stale",
    "sweep nothing lapsed",
    "enqueue exists",
    "claim empty",
    "cancel gone",
    "cancel finished",
]


def _run(r: redis.Redis, args: list[object]) -> None:
    with contextlib.suppress(redis.ResponseError):
        r.execute_command(*args)


@pytest.mark.parametrize("case", NO_OPS)
def test_a_no_op_or_an_error_breaks_no_watch(server: EmbeddedServer, r: redis.Redis, case: str) -> None:
    args = _no_ops(r)[case]
    before = digest(r)
    for key in (Q.active, Q.pending, Q.dead, Q.job("held"), Q.job("done")):
        assert _watch_survives(server, key, lambda: _run(r, args)), f"{case} aborted a WATCH on {key}"
    assert digest(r) == before


@pytest.mark.parametrize("case", NO_OPS)
def test_a_no_op_or_an_error_invalidates_no_tracked_key(r: redis.Redis, tracker: Tracker, case: str) -> None:
    args = _no_ops(r)[case]
    tracker.invalidated(0.1)  # drain what setting up the rows sent
    _run(r, args)
    assert tracker.invalidated() == b""


def test_a_real_change_still_breaks_watch_and_invalidates(
    server: EmbeddedServer, r: redis.Redis, tracker: Tracker
) -> None:
    # The control: the tests above can fail.
    put_active(r, "q", "held", attempts=2, deadline=now_ms(r) + 600_000)
    tracker.invalidated(0.1)
    extend = ["EMQ.EXTEND", Q.active, Q.job("held"), "held", "2", 999_999]
    assert not _watch_survives(server, Q.active, lambda: r.execute_command(*extend))
    r.execute_command("EMQ.COMPLETE", Q.active, Q.job("held"), "held", "2")
    sent = tracker.invalidated()
    assert Q.active.encode() in sent and Q.job("held").encode() in sent


# -- 4. derived keys' ACL before they are read -------------------------------------

SETS_ONLY = ["~emq:{q}:active", "~emq:{q}:pending", "~emq:{q}:dead", "~emq:{q}:priority", "~emq:{q}:delayed"]


@pytest.fixture
def sets_only(server_factory: ServerFactory) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    srv = server_factory()
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "sets", "reset", "on", ">pw", "+@all", *SETS_ONLY)
    user = srv.client(username="sets", password="pw")
    yield admin, user
    user.close()
    admin.close()


# redis-py raises NoPermissionError and keeps the text after "NOPERM ".
NOPERM = "this user has no permissions to access the job rows or metrics derived from <base>"


@pytest.mark.parametrize("row", ["none", "pending", "active-token-1", "active-token-2", "not-a-hash"])
@pytest.mark.parametrize("verb", ["enqueue", "fail", "cancel"])
def test_a_refused_user_learns_nothing_about_the_row(
    sets_only: tuple[redis.Redis, redis.Redis], verb: str, row: str
) -> None:
    admin, user = sets_only
    if row == "pending":
        admin.hset(Q.job("j"), mapping={"state": "pending", "attempts": 0})
        admin.rpush(Q.pending, "j")
    elif row.startswith("active"):
        put_active(admin, "q", "j", attempts=1, deadline=now_ms(admin) + 60_000)
    elif row == "not-a-hash":
        admin.set(Q.job("j"), "x")
    token = row.rsplit("-", 1)[-1] if row.startswith("active") else "1"
    args = {
        "enqueue": ["EMQ.ENQUEUE", Q.pending, Q.base, "j", "p"],
        "fail": ["EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, "j", token, 3, "e"],
        "cancel": ["EMQ.CANCEL", Q.pending, Q.base, "j", "why"],
    }[verb]
    before = digest(admin)
    with pytest.raises(redis.exceptions.NoPermissionError) as refused:
        user.execute_command(*args)
    # One answer whatever the row holds: the refusal, never EMQEXISTS, EMQSTALE, :-1 or WRONGTYPE.
    assert str(refused.value) == NOPERM
    assert digest(admin) == before


def test_claim_refuses_a_row_it_may_not_touch_before_reading_it(
    sets_only: tuple[redis.Redis, redis.Redis],
) -> None:
    admin, user = sets_only
    admin.set(Q.job("j"), "not a hash")
    admin.rpush(Q.pending, "j")
    before = digest(admin)
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.execute_command("EMQ.CLAIM", Q.pending, Q.active, Q.base, 1000)
    assert digest(admin) == before


# -- 5. a negative integer is an integer -------------------------------------------


def test_fail_reads_a_negative_budget_as_an_integer(r: redis.Redis) -> None:
    put_active(r, "q", "j", attempts=1, deadline=now_ms(r) + 60_000, tries=-1)
    assert r.execute_command("EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, "j", "1", 1, "e") == b"pending"
    r.hset(Q.job("k"), mapping={"state": "pending", "attempts": -1, "tries": -5})
    r.lpush(Q.pending, "k")  # at the head, before j
    claimed = r.execute_command("EMQ.CLAIM", Q.pending, Q.active, Q.base, 1000)
    assert [job[0] for job in claimed] == [b"k"]
    assert r.hmget(Q.job("k"), "attempts", "tries") == [b"0", b"-4"]
