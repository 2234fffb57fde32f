"""The compact row's pieces (docs/reference/keyspace.md): a payload or result longer than 64 bytes
and at most 1,024 is stored as ``payload``, ``payload:1``, ... (64 bytes each), so the row stays a
listpack; a longer one whole.  Every verb that hands a payload out, and every view, joins them.
"""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import queue_problems

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]

PAYLOADS = {
    "empty": b"",
    "64": b"a" * 64,
    "65": b"b" * 64 + b"\x00",
    "1024": bytes(range(256)) * 4,
    "1025": b"\xff" * 1025,
    "binary": b"\x00\r\n$-1\r\n" * 13,  # protocol-looking bytes, 104 of them: two pieces
    "utf8": "ü€𝄞".encode() * 9,  # multi-byte characters cut between pieces
}


def pieces(value: bytes) -> list[bytes]:
    """What the row holds for ``value``: the pieces, or the value whole above 1 KiB."""
    if len(value) <= 64 or len(value) > 1024:
        return [value]
    return [value[i : i + 64] for i in range(0, len(value), 64)]


def stored(r: redis.Redis, row: str, name: str) -> list[bytes]:
    fields = {bytes(k): bytes(v) for k, v in r.hgetall(row).items()}
    out = [fields[name.encode()]] if name.encode() in fields else []
    n = 1
    while f"{name}:{n}".encode() in fields:
        out.append(fields[f"{name}:{n}".encode()])
        n += 1
    extra = [k for k in fields if k.startswith(f"{name}:".encode())]
    assert len(extra) == len(out) - 1, fields.keys()  # no piece left over from another value
    return out


def compact(r: redis.Redis, row: str, value: bytes) -> None:
    encoding = r.object("encoding", row)
    if len(value) <= 1024:
        assert encoding in (b"listpack", b"ziplist"), (len(value), encoding)  # ziplist: Redis 6.2
    else:
        assert encoding == b"hashtable", (len(value), encoding)


@pytest.mark.parametrize("name", PAYLOADS)
def test_a_payload_goes_through_every_verb_whole(r: redis.Redis, client: echomq.Client, name: str) -> None:
    value = PAYLOADS[name]
    keys = queue_keys("q")
    client.enqueue("q", value, "a")
    assert stored(r, keys.job("a"), "payload") == pieces(value)
    compact(r, keys.job("a"), value)
    info = client.job("q", "a", payload=True)
    assert info is not None and info.payload == value and info.payload_size == len(value)
    plain = client.job("q", "a")
    assert plain is not None and plain.payload is None and plain.payload_size == len(value)
    # claimed, failed (retried), claimed, given back, claimed, lapsed and recovered, claimed
    job = client.claim("q", 60_000)
    assert job is not None and job.payload == value
    assert client.fail("q", "a", job.token, "E: again", max_attempts=9) == "pending"
    job = client.claim("q", 60_000)
    assert job is not None and job.payload == value
    client.release("q", "a", job.token)
    job = client.claim("q", 60_000)
    assert job is not None and job.payload == value
    r.zadd(keys.active, {"a": 1}, xx=True)
    assert client.sweep("q", max_stalled=5).recovered == ["a"]
    job = client.claim("q", 60_000)
    assert job is not None and job.payload == value
    # dead, retried, claimed by the second half of a COMPLETECLAIM
    assert client.fail("q", "a", job.token, "E: dead", dead=True) == "dead"
    assert [d.id for d in client.dead("q")] == ["a"]
    client.retry("q", "a")
    client.enqueue("q", b"first", "f")
    first = client.claim("q", 60_000)
    assert first is not None and first.id == "a"
    reply = client._send(
        ("EMQ.COMPLETECLAIM", keys.active, keys.job("a"), keys.pending, "a", first.token, 60_000)
    )
    assert isinstance(reply, list) and reply[1][0][0] == b"f"
    client.enqueue("q", b"", "c")
    reply = client._send(
        ("EMQ.COMPLETECLAIM", keys.active, keys.job("f"), keys.pending, "f", reply[1][0][1].decode(), 60_000)
    )
    assert isinstance(reply, list) and reply[1][0][0] == b"c"
    assert stored(r, keys.job("a"), "payload") == pieces(value)  # a done row keeps its payload
    compact(r, keys.job("a"), value)
    assert queue_problems(r, "q") == []


@pytest.mark.parametrize("name", PAYLOADS)
def test_enqueue_many_and_the_completeclaim_reply_join_the_pieces(
    r: redis.Redis, client: echomq.Client, name: str
) -> None:
    value = PAYLOADS[name]
    keys = queue_keys("q")
    client.enqueue_many("q", [("a", value), ("b", value[::-1])])
    assert stored(r, keys.job("b"), "payload") == pieces(value[::-1])
    a = client.claim("q", 60_000)
    assert a is not None and a.payload == value
    reply = client._send(
        ("EMQ.COMPLETECLAIM", keys.active, keys.job("a"), keys.pending, "a", a.token, 60_000)
    )
    assert isinstance(reply, list) and reply[1][0][2] == value[::-1]


@pytest.mark.parametrize("name", PAYLOADS)
def test_a_result_is_stored_in_pieces_and_read_whole(
    r: redis.Redis, client: echomq.Client, name: str
) -> None:
    value = PAYLOADS[name]
    keys = queue_keys("q")
    client.enqueue("q", b"p", "a")
    job = client.claim("q", 60_000)
    assert job is not None
    # a 1 KiB value stored before (a hand-edited row): the writer drops the pieces it does not reuse
    r.hset(keys.job("a"), mapping={"result": b"o" * 64, **{f"result:{i}": b"o" * 64 for i in range(1, 16)}})
    client.complete("q", "a", job.token, result=value)
    assert stored(r, keys.job("a"), "result") == pieces(value)
    info = client.job("q", "a")
    assert info is not None and info.result == value and info.state == "done"


def test_a_result_through_completeclaim(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    value = bytes(range(200))
    client.enqueue("q", b"p", "a")
    job = client.claim("q", 60_000)
    assert job is not None
    client._send(
        (
            "EMQ.COMPLETECLAIM",
            keys.active,
            keys.job("a"),
            keys.pending,
            "a",
            job.token,
            60_000,
            "RESULT",
            value,
        )
    )
    assert stored(r, keys.job("a"), "result") == pieces(value)
    info = client.job("q", "a")
    assert info is not None and info.result == value
