"""Every count and list a verb takes has a ceiling the verbs are run at (issue 28, points 1-2).

- ENQUEUEMANY's <count> is checked against emq.max-limit, then against the
  arguments, without overflow: a count of 2^62 + 1 once wrapped `4 + 2 *
  count` and the allocation size and crashed the server (SIGSEGV on Redis 7.0;
  Valkey 8 and Redis 6.2 spun).  emq.max-limit itself has a ceiling, 100,000
  (tests/house/test_config.py, tests/workers/test_load.py refuse more).
- Every verb that takes a count or a list obeys emq.max-limit: SWEEP,
  RETRYDEAD, PURGE and OBLITERATE refuse a larger <limit>, FORGET more ids,
  ENQUEUEMANY a larger <count>; CLAIM's COUNT takes at most that many; SWEEP's
  recoveries and expired dead together stay within <limit>.
- A whole queue goes in steps the client loops over (Client.obliterate,
  retry_dead, purge_dead halve a limit the server refuses).
- Each verb runs at the ceiling itself: 100,000 jobs in one call, on both
  backends (module/Makefile's memory check runs this file too).

Both backends: the module with emq.max-limit given at load (every engine has
load arguments), the scripts with ScriptLimits(max_limit=...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import echomq
from echomq import _protocol as proto
from echomq._scripts import MAX_LIMIT_CEILING, ScriptLimits
from echomq._scripts import MAX_STATE_BYTES_CEILING as STATE_CEILING
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, server_wrapper

from ..conftest import ServerFactory, supports
from ..helpers import digest, queued

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

Q = "lim"
K = queue_keys(Q)
SMALL = 3
TOO_LARGE = "limit exceeds the server's emq.max-limit"
COUNT_TOO_LARGE = "count exceeds the server's emq.max-limit"
IDS_TOO_MANY = "the number of ids exceeds the server's emq.max-limit"


Clients = Callable[[int], echomq.Client]


@pytest.fixture(scope="module", params=["module", "scripts"])
def setup(
    request: pytest.FixtureRequest, server_factory: ServerFactory, module_so: Path
) -> Iterator[Clients]:
    """A factory of clients whose server (module) or scripts see emq.max-limit = n."""
    kind = request.param
    if kind == "scripts" and not supports("script_flags"):
        pytest.skip("the scripts backend needs Redis 7.0+ (script flags)")
    if kind == "scripts" and server_wrapper():
        pytest.skip("the memory check is the module's: the scripts backend runs no C of ours")
    servers: dict[int, EmbeddedServer] = {}

    def server(n: int) -> EmbeddedServer:
        if n not in servers:
            if kind == "scripts":  # one server without the module; the ceiling is the client's
                servers[n] = servers[0] if 0 in servers else server_factory(load_module=False)
                servers[0] = servers[n]
            else:  # the ceilings as load arguments: every engine has them
                load = ["--loadmodule", str(module_so), "max-limit", str(n)]
                load += ["max-state-bytes", str(STATE_CEILING)]
                servers[n] = server_factory(load, load_module=False)
        return servers[n]

    def client(n: int) -> echomq.Client:
        limits = ScriptLimits(max_limit=n, max_state_bytes=STATE_CEILING) if kind == "scripts" else None
        # No read timeout and no resend: a call of 100,000 jobs under the memory checker takes
        # seconds, and a resent SWEEP would answer what the first left (nothing).
        conn = server(n).client(socket_timeout=None, retry=Retry(NoBackoff(), 0))
        c = echomq.Client(conn, backend=kind, script_limits=limits)  # type: ignore[arg-type]
        c.redis.flushall()
        return c

    yield client


def send(client: echomq.Client, *args: object) -> object:
    return client._send(tuple(args))


def refused(client: echomq.Client, words: str, *args: object) -> None:
    """``args`` answer the error ``words`` (word for word; Redis 6.2 names the command in an
    arity error as the client typed it) and write nothing."""
    before = digest(client.redis)
    with pytest.raises(redis.ResponseError) as info:
        send(client, *args)
    said = str(info.value)
    assert (said.lower() if words.startswith("wrong number") else said) == words
    assert digest(client.redis) == before


def dead_jobs(client: echomq.Client, n: int, died: int = 1000) -> list[str]:
    """``n`` dead jobs (rows and <dead> members), written by hand in one pipeline."""
    r, ids = client.redis, [f"d{i}" for i in range(n)]
    pipe = r.pipeline(transaction=False)
    for i, jid in enumerate(ids):
        pipe.hset(K.job(jid), mapping={"state": "dead", "attempts": 1, "tries": 1, "payload": "p"})
        pipe.zadd(K.dead, {jid: died + i})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    return ids


def lapsed_jobs(client: echomq.Client, n: int) -> None:
    """``n`` claimed jobs whose lease lapsed long ago."""
    r = client.redis
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.hset(K.job(f"l{i}"), mapping={"state": "active", "attempts": 1, "tries": 1, "token": "1"})
        pipe.zadd(K.active, {f"l{i}": 5 + i})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


# -- counts near 2^62 and 2^63: checked against the ceiling, then argc -------------------


@pytest.mark.parametrize(
    "count",
    ["4611686018427387905", "4611686018427387904", "4611686018427387903", "9223372036854775807",
     "2147483648", "2147483647", "1073741824", str(MAX_LIMIT_CEILING + 1)],
)  # fmt: skip
def test_enqueuemany_counts_past_the_ceiling_are_refused(setup: Clients, count: str) -> None:
    """At the highest ceiling a server may set, a count beyond it is refused; the server lives."""
    client = setup(MAX_LIMIT_CEILING)
    refused(client, COUNT_TOO_LARGE, "EMQ.ENQUEUEMANY", K.pending, K.base, count, "id", "payload")
    assert client.redis.ping()


@pytest.mark.parametrize("count", [MAX_LIMIT_CEILING, MAX_LIMIT_CEILING - 1, 50_000, 3])
def test_enqueuemany_counts_beyond_the_arguments_are_a_wrong_arity(setup: Clients, count: int) -> None:
    """A count within the ceiling that the arguments do not hold (argc < 4 + 2 * count)."""
    client = setup(MAX_LIMIT_CEILING)
    words = "wrong number of arguments for 'emq.enqueuemany' command"
    refused(client, words, "EMQ.ENQUEUEMANY", K.pending, K.base, count, "id", "payload")
    refused(client, words, "EMQ.ENQUEUEMANY", K.pending, K.base, count, "id", "payload", "REQ", "r")
    assert client.redis.ping()


# -- every count and list obeys the ceiling ---------------------------------------------


def test_every_verb_that_takes_a_count_or_a_list_obeys_max_limit(setup: Clients) -> None:
    client = setup(SMALL)
    dead_jobs(client, SMALL + 2)
    lapsed_jobs(client, SMALL + 2)
    over = SMALL + 1
    sets = (K.active, K.pending, K.dead, K.base)
    refused(client, TOO_LARGE, "EMQ.SWEEP", *sets, 9, over)
    refused(client, TOO_LARGE, "EMQ.RETRYDEAD", K.dead, K.pending, K.base, over)
    refused(client, TOO_LARGE, "EMQ.RETRYDEAD", K.dead, K.pending, K.base, over, "UNTIL", 10**13)
    refused(client, TOO_LARGE, "EMQ.PURGE", K.dead, K.base, over)
    refused(client, TOO_LARGE, "EMQ.OBLITERATE", *sets, over, "FORCE")
    refused(client, IDS_TOO_MANY, "EMQ.FORGET", K.pending, K.base, *(f"d{i}" for i in range(over)))
    pairs = [x for i in range(over) for x in (f"n{i}", "p")]
    refused(client, COUNT_TOO_LARGE, "EMQ.ENQUEUEMANY", K.pending, K.base, over, *pairs)
    # At the ceiling each runs, and takes no more than it.
    assert send(client, "EMQ.PURGE", K.dead, K.base, SMALL) == SMALL
    assert send(client, "EMQ.RETRYDEAD", K.dead, K.pending, K.base, SMALL) == [2, 0]
    assert send(client, "EMQ.FORGET", K.pending, K.base, *(f"d{i}" for i in range(SMALL))) == 0
    assert send(client, "EMQ.ENQUEUEMANY", K.pending, K.base, SMALL, *pairs[: 2 * SMALL]) == SMALL
    recovered = send(client, "EMQ.SWEEP", *sets, 9, SMALL)
    assert isinstance(recovered, list) and len(recovered[0]) == SMALL
    assert send(client, "EMQ.OBLITERATE", *sets, SMALL, "FORCE")[0] == SMALL  # type: ignore[index]


def test_claim_takes_at_most_max_limit_jobs(setup: Clients) -> None:
    """COUNT above the ceiling claims that many (the claim's own 1000, or emq.max-limit below it)."""
    client = setup(SMALL)
    client.enqueue_many(Q, [b"x"] * (SMALL + 2))
    assert len(client.claim_many(Q, lease_ms=60_000, count=1000)) == SMALL
    job = client.claim(Q, 60_000)
    assert job is not None
    reply = send(client, "EMQ.COMPLETECLAIM", K.active, K.job(job.id), K.pending, job.id, job.token, 60_000,
                 "COUNT", 1000)  # fmt: skip
    assert isinstance(reply, list) and reply[0] == 1 and len(reply[1]) == 1  # the one left


def test_sweep_recoveries_and_expired_dead_stay_within_limit(setup: Clients) -> None:
    """The dead retention deletes only what <limit> leaves room for after the lapsed jobs."""
    client = setup(10)
    r = client.redis
    client.retention(Q, dead_ms=0)  # every dead job is past its retention
    dead_jobs(client, 4)
    lapsed_jobs(client, 3)
    sets = (K.active, K.pending, K.dead, K.base)
    recovered, died, cancelled, expired = send(client, "EMQ.SWEEP", *sets, 9, 5)  # type: ignore[misc]
    assert (len(recovered), died, cancelled, expired) == (3, [], [], 2)
    assert r.zcard(K.dead) == 2 and queued(r, K) == 3
    # Only lapsed jobs, at <limit>: no room left for the dead.
    lapsed_jobs(client, 5)
    recovered, died, cancelled, expired = send(client, "EMQ.SWEEP", *sets, 9, 5)  # type: ignore[misc]
    assert (len(recovered), expired) == (5, 0) and r.zcard(K.dead) == 2
    assert send(client, "EMQ.SWEEP", *sets, 9, 5)[3] == 2  # type: ignore[index]


# -- whole queues in bounded steps, the client looping --------------------------------------


def test_the_client_loops_in_steps_the_server_takes(setup: Clients) -> None:
    """A limit above the server's ceiling is halved until it fits; every step stays within it."""
    client = setup(SMALL)
    r = client.redis
    dead_jobs(client, 7)
    assert client.retry_dead(Q, limit=100) == echomq.RetryDeadResult(7, 0)
    r.delete(K.pending)
    dead_jobs(client, 7)
    assert client.purge_dead(Q, limit=100) == 7 and r.zcard(K.dead) == 0
    client.enqueue_many(Q, [b"x"] * 8)
    ids = client.enqueue_many(Q, [b"y"] * 5)
    for jid in ids:  # finished rows in no set: FORGET's, at most max-limit per call
        r.hset(K.job(jid), "state", "done")
        r.lrem(K.pending, 0, jid)
    result = client.obliterate(Q, limit=100)
    assert result == echomq.ObliterateResult(removed=8, forgotten=5)
    assert [k for k in r.scan_iter() if b":req:" not in k] == []  # enqueue records expire by themselves


def test_forget_steps_are_cut_at_the_limit() -> None:
    calls = proto.forget_steps(Q, [f"i{n}" for n in range(7)], 3)
    assert [len(c.args) - 3 for c in calls] == [3, 3, 1]
    assert proto.halved_limit(redis.ResponseError(TOO_LARGE), 100) == 50
    assert proto.halved_limit(redis.ResponseError(TOO_LARGE), 1) is None
    assert proto.halved_limit(redis.ResponseError("syntax error"), 100) is None


# -- each verb at the ceiling ---------------------------------------------------------------


@pytest.mark.timeout(1800)  # minutes under the memory checker (module/Makefile's check)
def test_each_verb_runs_at_the_ceiling(setup: Clients) -> None:
    """100,000 jobs in one call of each verb that takes a count or a list, and one more refused.

    Under the memory checker the same calls run at a ceiling of 5,000: every path is the
    same (the checker looks for what a call leaks or misreads, not for how many jobs it
    took), and 100,000-job calls under valgrind took over half an hour of `make test`.
    """
    n = MAX_LIMIT_CEILING if not server_wrapper() else 5_000
    client = setup(n)
    r = client.redis
    sets = (K.active, K.pending, K.dead, K.base)
    ids = [f"j{i}" for i in range(n)]
    pairs = [x for jid in ids for x in (jid, "p")]

    def one_more_refused(words: str, *args: object) -> None:
        keys = r.dbsize()  # not DEBUG DIGEST: a second per call at this size
        with pytest.raises(redis.ResponseError, match=f"^{words}$"):
            send(client, *args)
        assert r.dbsize() == keys

    def lapse_and_kill_all() -> None:  # claimed by hand (to <active> at score 0), then one sweep
        for k in range(0, n, 10_000):
            r.zadd(K.active, dict.fromkeys(ids[k : k + 10_000], 0))
        r.delete(K.pending)
        recovered, died, _, _ = send(client, "EMQ.SWEEP", *sets, 1, n)  # type: ignore[misc]
        assert recovered == [] and len(died) == n and r.zcard(K.dead) == n

    assert send(client, "EMQ.ENQUEUEMANY", K.pending, K.base, n, *pairs, "REQ", "first") == n
    one_more_refused(COUNT_TOO_LARGE, "EMQ.ENQUEUEMANY", K.pending, K.base, n + 1, *pairs, "x", "p")
    lapse_and_kill_all()
    one_more_refused(TOO_LARGE, "EMQ.RETRYDEAD", K.dead, K.pending, K.base, n + 1)
    assert send(client, "EMQ.RETRYDEAD", K.dead, K.pending, K.base, n) == [n, 0]
    assert send(client, "EMQ.FORGET", K.pending, K.base, *ids) == 0  # pending rows: kept
    one_more_refused(IDS_TOO_MANY, "EMQ.FORGET", K.pending, K.base, *ids, "x")
    lapse_and_kill_all()
    one_more_refused(TOO_LARGE, "EMQ.PURGE", K.dead, K.base, n + 1)
    assert send(client, "EMQ.PURGE", K.dead, K.base, n) == n
    assert send(client, "EMQ.ENQUEUEMANY", K.pending, K.base, n, *pairs, "REQ", "second") == n
    one_more_refused(TOO_LARGE, "EMQ.OBLITERATE", *sets, n + 1)
    assert send(client, "EMQ.OBLITERATE", *sets, n) == [n, 0]
    # Nothing left but the enqueue records, if they have not expired yet (a minute: under the
    # memory checker this test takes longer).
    assert set(r.scan_iter()) <= {K.base.encode() + b"req:first", K.base.encode() + b"req:second"}


def test_a_checkpoint_state_at_the_ceiling_is_stored_and_handed_back(setup: Clients) -> None:
    """emq.max-state-bytes at its ceiling, 16 MiB: stored by CHECKPOINT, handed back by the claim
    that recovers the job; one byte more is refused, writing nothing."""
    client = setup(SMALL)
    r = client.redis
    client.enqueue(Q, b"p", job_id="s")
    job = client.claim(Q, 60_000)
    assert job is not None
    state = bytes(range(256)) * (STATE_CEILING // 256)
    too_large = "the checkpoint state is larger than emq.max-state-bytes"
    line = ("EMQ.CHECKPOINT", K.active, K.job("s"), "s", job.token, 60_000, "STATE")
    refused(client, too_large, *line, state + b"x")
    assert client.checkpoint(Q, "s", job.token, 60_000, state=state) is None
    r.zadd(K.active, {"s": 5})  # the holder is gone: its lease lapses
    assert len(send(client, "EMQ.SWEEP", K.active, K.pending, K.dead, K.base, 9, 1)[0]) == 1  # type: ignore[index]
    again = client.claim(Q, 60_000)
    assert again is not None and again.resume_state == state
