"""EMQ.COMPLETECLAIM: COMPLETE, then CLAIM, in one call (issue 18), on both backends.

The contract: [COMPLETE's reply, CLAIM's reply]; every check of both halves
comes before any write (an error leaves DEBUG DIGEST unchanged, the complete
included); a repeat of the same call (same REQ) answers the same and writes
nothing; the claim half is CLAIM's (tokens, REQ record, paused queue, COUNT).
"""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq import _protocol as proto
from echomq.keyspace import queue_keys

from ..conftest import ServerFactory, wait_for_replica
from ..helpers import digest, now_ms, queued

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]

Q = "cc"
K = queue_keys(Q)


def send(client: echomq.Client, *args: object) -> object:
    """The command line as the client's backend sends it (EMQ.* or the script)."""
    return client._send(tuple(args))


def line(job_id: str, token: str, lease: object = 10_000, *opts: object) -> tuple[object, ...]:
    return ("EMQ.COMPLETECLAIM", K.active, K.job(job_id), K.pending, job_id, token, lease, *opts)


def test_completes_and_claims_the_next_jobs(client: echomq.Client, r: redis.Redis) -> None:
    ids = client.enqueue_many(Q, [b"a", b"b", b"c"])
    job = client.claim(Q, 10_000)
    assert job is not None and job.id == ids[0]
    before = now_ms(r)
    reply = send(client, *line(job.id, job.token, 5000, "COUNT", 2, "REQ", "r1"))
    after = now_ms(r)
    assert isinstance(reply, list) and reply[0] == 1
    claimed = reply[1]
    assert [j[0].decode() for j in claimed] == ids[1:] and [j[2] for j in claimed] == [b"b", b"c"]
    done = r.hgetall(K.job(job.id))
    assert done[b"state"] == b"done" and done[b"closed_by"] == b"complete"
    assert before <= int(done[b"finished_at"]) <= after
    for jid, token, _payload, attempt, state in claimed:
        row = r.hgetall(K.job(jid.decode()))
        assert row[b"state"] == b"active" and row[b"token"] == token and attempt == 1 and state is None
        assert before + 5000 <= r.zscore(K.active, jid) <= after + 5000
    assert queued(r, K) == 0 and r.zcard(K.active) == 2
    assert r.exists(K.base + "req:r1")
    # A repeat (its reply was lost): the same answer, nothing written.
    state = digest(r)
    assert send(client, *line(job.id, job.token, 5000, "COUNT", 2, "REQ", "r1")) == reply
    assert digest(r) == state


def test_nothing_to_claim_or_a_gone_row_still_answers_both_halves(
    client: echomq.Client, r: redis.Redis
) -> None:
    client.enqueue(Q, b"x", job_id="j")
    job = client.claim(Q, 10_000)
    assert job is not None
    assert send(client, *line("j", job.token)) == [1, None]  # completed; the queue is empty
    assert r.hget(K.job("j"), "state") == b"done"
    client.enqueue(Q, b"y", job_id="k")
    assert send(client, *line("ghost", "1-0000000000000000"))[0] == -1  # gone: the claim still runs
    assert r.hget(K.job("k"), "state") == b"active"
    client.enqueue(Q, b"z", job_id="p")
    client.pause(Q)
    other = client.claim_many(Q, 10_000, 1)
    assert other == []
    assert send(client, *line("ghost", "1-0000000000000000")) == [-1, None]  # paused: nothing claimed


def test_an_error_in_either_half_writes_nothing(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue_many(Q, [b"a", b"b"])
    job = client.claim(Q, 10_000)
    assert job is not None
    stale = job.token.split("-")[0] + "-ffffffffffffffff"
    cases = [
        (line(job.id, stale), "EMQSTALE"),  # the complete half refuses
        (line(job.id, job.token, "x"), "lease"),  # the lease
        (line(job.id, job.token, 1000, "BLOCK", 1), "syntax"),  # no BLOCK here
        (line(job.id, job.token, 1000, "COUNT", 0), "COUNT"),
        (line(job.id, job.token, 1000, "REQ", ""), "REQ"),
        (
            ("EMQ.COMPLETECLAIM", K.active, K.job(job.id), "emq:{other}:pending", job.id, job.token, 1000),
            "<pending>",
        ),
        (("EMQ.COMPLETECLAIM", K.active, K.job("zz"), K.pending, job.id, job.token, 1000), "<job>"),
    ]
    for args, word in cases:
        state = digest(r)
        with pytest.raises(redis.ResponseError, match=word):
            send(client, *args)
        assert digest(r) == state, args
    # The claim half refuses (a claimable row that is not a hash): the complete is not written either.
    head = r.lrange(K.pending, 0, 0)[0].decode()
    r.delete(K.job(head))
    r.set(K.job(head), "not a row")
    state = digest(r)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        send(client, *line(job.id, job.token))
    assert digest(r) == state and r.hget(K.job(job.id), "state") == b"active"
    with pytest.raises(redis.ResponseError, match="wrong number"):
        send(client, "EMQ.COMPLETECLAIM", K.active, K.job(job.id), K.pending, job.id, job.token)


def test_the_client_call_reads_both_halves(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue_many(Q, [b"a", b"b"])
    job = client.claim(Q, 10_000)
    assert job is not None
    call = proto.complete_claim(Q, job.id, job.token, 10_000)
    both = client._run(call)
    assert not both.gone and [j.payload for j in both.jobs] == [b"b"]
    # The claim half's REQ, sent alone, answers the jobs the call took (a lost reply's recovery).
    again = client._run(proto.claim(Q, 10_000, request_id=proto.request_id_of(call)))
    assert [(j.id, j.token) for j in again] == [(j.id, j.token) for j in both.jobs]


def test_a_replica_gets_the_same_data_and_the_events_are_completes_then_claims(
    server_factory: ServerFactory,
) -> None:
    master = server_factory(["--repl-diskless-sync-delay", "0", "--notify-keyspace-events", "KEA"])
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    client = echomq.Client(m)
    ids = client.enqueue_many(Q, [b"p"] * 30)
    client.retention(Q, done_ms=600_000)
    job = client.claim(Q, 60_000)
    assert job is not None
    sub = m.pubsub()
    sub.psubscribe("__keyevent@0__:*")
    assert sub.get_message(timeout=5) is not None
    call = proto.complete_claim(Q, job.id, job.token, 60_000, count=2)
    both = client._run(call)
    events = []
    while (msg := sub.get_message(timeout=0.5)) is not None:
        events.append((msg["channel"].decode().split(":", 1)[1], msg["data"].decode()))
    sub.close()
    nxt = [j.id for j in both.jobs]
    assert nxt == ids[1:3]
    # COMPLETE's (its job was the only active one: the set goes, as ZREM's would)
    expected = [("zrem", K.active), ("del", K.active), ("hset", K.job(job.id)), ("expire", K.job(job.id))]
    expected.append(("lpop", K.pending))  # then CLAIM's: its lane first, then job by job
    for jid in nxt:
        expected += [("hincrby", K.job(jid)), ("hset", K.job(jid)), ("zadd", K.active)]
    req = K.base + "req:" + proto.request_id_of(call).decode()
    assert events == [*expected, ("set", req), ("expire", req)]
    # Traffic: each job completed and the next claimed in one call, some with REQ repeats.
    current = both.jobs
    while current:
        j = current[0]
        call = proto.complete_claim(Q, j.id, j.token, 5000 + len(current))
        current = client._run(call).jobs + current[1:]
        client._run(call)  # the repeat: the same answer, nothing written
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert [m.hget(K.job(i), "state") for i in ids] == [b"done"] * 30
    assert digest(s) == digest(m)
    assert [s.pexpiretime(K.job(i)) for i in ids] == [m.pexpiretime(K.job(i)) for i in ids]  # absolute
