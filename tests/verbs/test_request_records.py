"""Request records: a retry is answered from the call's own record (issue 28, points 3-5).

- ENQUEUE and ENQUEUEMANY with REQ leave `<base>req:<request-id>` (the count,
  for 60 s): a retry of a lost reply is answered from it, writing nothing, even
  when the job has run and its row is gone (a done retention of 0, FORGET).
  The row keeps no request id.  The Python clients send an enqueue again only
  within 30 s of its first send, on their own schedule.
- COMPLETECLAIM with the REQ of the claim that took the job it completes
  answers that claim's other jobs, never the completed one.
- A claim's record is checked whole before anything is made of it: one that
  is not a claim's (malformed, too many pairs, an enqueue's, 4 MB of empty
  items) is refused, writing nothing.

Both backends.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import echomq
from echomq import _protocol as proto
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import supports
from ..helpers import digest, entries, queued

pytestmark = [pytest.mark.backends, pytest.mark.smoke, pytest.mark.memcheck]


@pytest.fixture(autouse=True)
def _scripts_need_redis_7(backend: str) -> None:
    if backend == "scripts" and not supports("script_flags"):
        pytest.skip("the scripts backend needs Redis 7.0+ (script flags)")


Q = "rr"
K = queue_keys(Q)
RECORD_ERROR = "the record of this REQ request id is malformed or another call's"  # redis-py drops "ERR "


def send(client: echomq.Client, *args: object) -> object:
    return client._send(tuple(args))


def record_of(call: proto.Call[object]) -> str:
    return K.base + "req:" + proto.request_id_of(call).decode()


def ids(jobs: object) -> list[bytes]:
    assert isinstance(jobs, list)
    return [job[0] for job in jobs]


# -- ENQUEUE, ENQUEUEMANY ------------------------------------------------------------------


def test_a_retried_enqueue_after_the_job_ran_and_was_deleted_writes_nothing(
    client: echomq.Client, r: redis.Redis
) -> None:
    """The issue's reproduction: done retention 0, the job runs, its row is deleted; then
    the retry of the enqueue whose reply was lost arrives.  It must not enqueue the job again."""
    client.retention(Q, done_ms=0)
    call = proto.enqueue(Q, b"p", "z")
    assert send(client, *call.args) == 1
    job = client.claim(Q, 60_000)
    assert job is not None and job.id == "z"
    client.complete(Q, job.id, job.token)
    assert not r.exists(K.job("z"))
    before = digest(r)
    assert send(client, *call.args) == 1  # the retry
    assert digest(r) == before and queued(r, K) == 0


def test_a_retried_enqueuemany_after_a_row_was_forgotten_answers_its_count(
    client: echomq.Client, r: redis.Redis
) -> None:
    """One of the batch ran and was forgotten: the retry answers :2, not EMQEXISTS, and
    makes nothing again."""
    (call,) = proto.enqueue_many(Q, [("a", b"1"), ("b", b"2")])
    assert send(client, *call.args) == 2
    job = client.claim(Q, 60_000)
    assert job is not None and job.id == "a"
    client.complete(Q, job.id, job.token)
    assert send(client, "EMQ.FORGET", K.pending, K.base, "a") == 1
    before = digest(r)
    assert send(client, *call.args) == 2
    assert digest(r) == before and not r.exists(K.job("a")) and entries(r, K) == [b"b"]


def test_the_record_is_the_calls_count_for_a_minute_and_the_row_keeps_no_request(
    client: echomq.Client, r: redis.Redis
) -> None:
    one = proto.enqueue(Q, b"p", "j")
    (many,) = proto.enqueue_many(Q, [("m", b"1"), ("n", b"2"), ("o", b"3")])
    assert send(client, *one.args) == 1 and send(client, *many.args) == 3
    assert r.get(record_of(one)) == b"1" and r.get(record_of(many)) == b"3"
    for key in (record_of(one), record_of(many)):
        assert 50_000 < r.pttl(key) <= 60_000
    for job in ("j", "m", "n", "o"):
        assert not r.hexists(K.job(job), "request")
    # Without REQ, no record.
    assert send(client, "EMQ.ENQUEUE", K.pending, K.base, "plain", "p") == 1
    records = sorted([record_of(one).encode(), record_of(many).encode()])
    assert sorted(r.scan_iter(K.base + "req:*")) == records


def test_a_request_id_names_one_call(client: echomq.Client, r: redis.Redis) -> None:
    """Whatever the record holds (another call's, another type), an enqueue with its request id
    is answered as that call's retry: it only asks whether the record exists (a %W~ user may
    enqueue), and writes nothing."""
    r.hset(K.base + "req:taken", "f", "v")
    r.set(K.base + "req:claimed", "1:a1:1")
    before = digest(r)
    assert send(client, "EMQ.ENQUEUE", K.pending, K.base, "x", "p", "REQ", "taken") == 1
    assert send(client, "EMQ.ENQUEUEMANY", K.pending, K.base, 1, "y", "p", "REQ", "claimed") == 1
    assert digest(r) == before


def test_the_client_resends_an_enqueue_itself_within_its_window(server: EmbeddedServer, backend: str) -> None:
    """A stall longer than the socket timeout: the client sends the enqueue again (same REQ) on
    its own schedule, even on a redis client that retries nothing, and the job exists once."""
    admin = server.client()
    admin.flushall()
    plain = server.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    client = echomq.Client(plain, backend=backend)  # type: ignore[arg-type]
    client.enqueue("warm", b"x")  # the scripts are loaded, the connection made
    stall = threading.Thread(target=lambda: server.client().execute_command("DEBUG", "SLEEP", "1"))
    stall.start()
    time.sleep(0.1)
    assert client.enqueue(Q, b"p", job_id="x") == "x"  # times out, is sent again, answered
    stall.join()
    assert entries(admin, K) == [b"x"]
    assert len(list(admin.scan_iter(K.base + "req:*"))) == 1
    client.close()
    admin.close()


def test_the_request_window_sends_again_only_within_30_seconds() -> None:
    window = proto.RequestWindow(100.0, socket_timeout=None)
    assert window.try_s == 5.0 and proto.RequestWindow(0.0, 0.3).try_s == 0.3
    pauses, now = [], 100.0
    while (pause := window.next_pause(now)) is not None:
        pauses.append(pause)
        now += pause + window.try_s  # every try timed out
    assert pauses[:5] == [0.05, 0.1, 0.2, 0.4, 0.8] and set(pauses[5:]) == {1.0}
    assert now - 100.0 < proto.REQ_RETRY_WINDOW_S + window.try_s  # the last send started in the window
    assert proto.REQ_RETRY_WINDOW_S + window.try_s < proto.REQ_RECORD_TTL_S  # and ran while its record lives


# -- COMPLETECLAIM ----------------------------------------------------------------------------


def completeclaim(job_id: str, token: object, req: str) -> tuple[object, ...]:
    return ("EMQ.COMPLETECLAIM", K.active, K.job(job_id), K.pending, job_id, token, 60_000, "REQ", req)


def test_completeclaim_never_hands_back_the_job_it_completes(client: echomq.Client, r: redis.Redis) -> None:
    """The REQ of the claim that took a, passed to the COMPLETECLAIM that completes a: the
    record's other jobs come back, a does not (it is done)."""
    client.enqueue_many(Q, [("a", b"p"), ("b", b"q")])
    took = send(client, "EMQ.CLAIM", K.pending, K.active, K.base, 60_000, "COUNT", 2, "REQ", "r1")
    assert ids(took) == [b"a", b"b"]
    token = took[0][1]  # type: ignore[index]
    reply = send(client, *completeclaim("a", token, "r1"))
    assert isinstance(reply, list) and reply[0] == 1 and ids(reply[1]) == [b"b"]
    assert r.hget(K.job("a"), "state") == b"done" and r.zrange(K.active, 0, -1) == [b"b"]
    # The claim took w alone: nothing is left to answer.
    client.enqueue(Q, b"p", job_id="w")
    took = send(client, "EMQ.CLAIM", K.pending, K.active, K.base, 60_000, "REQ", "r2")
    token = took[0][1]  # type: ignore[index]
    reply = send(client, *completeclaim("w", token, "r2"))
    assert reply == [1, None] and r.hget(K.job("w"), "state") == b"done"


# -- forged records ---------------------------------------------------------------------------

FORGED = {
    "empty items, 4 MB": b"0:" * 2_000_000,
    "1001 pairs": b"1:a1:1" * 1001,
    "an enqueue's": b"1",
    "odd": b"1:a",
    "cut short": b"5:ab",
    "a token too long": b"1:a48:" + b"t" * 48,
    "an empty token": b"1:a0:",
    "not a length": b"x:a1:1",
}


@pytest.mark.parametrize("what", list(FORGED))
def test_a_record_that_is_not_a_claims_is_refused_and_writes_nothing(
    client: echomq.Client, r: redis.Redis, what: str
) -> None:
    client.enqueue_many(Q, [("a", b"p"), ("h", b"q")])
    held = client.claim(Q, 60_000)
    assert held is not None and held.id == "a"
    r.set(K.base + "req:forged", FORGED[what])
    before = digest(r)
    for line in (
        ("EMQ.CLAIM", K.pending, K.active, K.base, 60_000, "REQ", "forged"),
        ("EMQ.COMPLETECLAIM", K.active, K.job("a"), K.pending, "a", held.token, 60_000, "REQ", "forged"),
    ):
        with pytest.raises(redis.ResponseError) as info:
            send(client, *line)
        assert str(info.value) == RECORD_ERROR, line[0]
        assert digest(r) == before  # neither half of COMPLETECLAIM wrote
