"""Flow control (issue 32; docs/concepts/flow-control.md): a queue's rate limit and back-off,
EMQ.LIMIT, on both backends.

The guarantee tested is the documented one: windows are fixed and aligned to the server clock,
``[k * per, (k + 1) * per)``, and at most ``max`` claims are handed out in each, whatever the
callers; a refused claim writes nothing.  Claim times are read from the rows' ``claimed_at``
(the server's clock at the claim), never from the test's clock.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import echomq
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..helpers import digest, now_ms
from .test_core_cffi import Core, core  # noqa: F401  (the session fixture, used by name)

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]


def limit(r: redis.Redis, queue: str, *args: object) -> list[int]:
    """EMQ.LIMIT through the client's backend, as the raw reply."""
    k = queue_keys(queue)
    return [int(v) for v in echomq.Client(r)._send(("EMQ.LIMIT", k.pending, k.base, *args))]


def claimed_at(r: redis.Redis, queue: str, ids: list[str]) -> list[int]:
    k = queue_keys(queue)
    return [int(r.hget(f"{k.base}job:{i}", "claimed_at") or 0) for i in ids]


def test_a_claim_hands_out_at_most_max_per_window(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(50)])
    got = client.set_rate_limit("rl", 7, 60_000)
    assert (got.max, got.per_ms, got.used) == (7, 60_000, 0)
    first = client.claim_many("rl", 60_000, 20)
    assert len(first) == 7  # a fresh window: exactly max, never more, in one call
    assert client.claim_many("rl", 60_000, 20) == [] or now_ms(r) % 60_000 < 1000  # unless the window turned
    seen = client.rate_limit("rl")
    assert seen.used in (7, 0) and seen.window_ends_at is not None
    assert seen.window_ends_at % 60_000 == 0  # aligned to the server clock


def test_a_refused_claim_writes_nothing(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(5)])
    client.back_off("rl", 60_000)
    before = digest(r)
    assert client.claim_many("rl", 60_000, 5) == []
    assert digest(r) == before


def test_no_window_ever_holds_more_than_max_under_eight_claimers(
    r: redis.Redis, client: echomq.Client
) -> None:
    """8 threads claim as fast as they can for ~1.2 s under 20 per 100 ms: grouped by the
    server's window, no window holds more than 20 claims."""
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(2000)])
    client.set_rate_limit("rl", 20, 100)
    ids: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + 1.2

    def claimer() -> None:
        c = echomq.Client(redis.Redis(connection_pool=r.connection_pool))
        while time.monotonic() < stop:
            jobs = c.claim_many("rl", 60_000, 3)
            with lock:
                ids.extend(j.id for j in jobs)

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_window = Counter(at // 100 for at in claimed_at(r, "rl", ids))
    assert ids and len(ids) == len(set(ids))
    assert max(per_window.values()) <= 20
    assert sum(per_window.values()) == len(ids)


def test_limit_reads_sets_changes_and_removes(r: redis.Redis, client: echomq.Client) -> None:
    assert client.rate_limit("rl") == echomq.RateLimit()
    assert limit(r, "rl") == [0, 0, 0, 0, 0]
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(10)])
    client.set_rate_limit("rl", 3, 60_000)
    assert len(client.claim_many("rl", 60_000, 10)) == 3
    raised = client.set_rate_limit("rl", 5, 60_000)  # max alone: the count is kept
    assert raised.used in (3, 0)
    assert len(client.claim_many("rl", 60_000, 10)) in (2, 5)
    restarted = client.set_rate_limit("rl", 5, 30_000)  # a new window length: the count restarts
    assert restarted.used == 0 and restarted.per_ms == 30_000
    gone = client.remove_rate_limit("rl")
    assert gone == echomq.RateLimit()
    assert client.claim_many("rl", 60_000, 10)  # no limit: the rest
    assert not r.exists(queue_keys("rl").base + "limit")


def test_set_rate_limit_none_removes_and_checks_arguments(r: redis.Redis, client: echomq.Client) -> None:
    client.set_rate_limit("rl", 2, 1000)
    assert client.set_rate_limit("rl", None) == echomq.RateLimit()
    for bad in [(0, 1000), (1_000_000_001, 1000), (1, 0), (1, 86_400_001)]:
        with pytest.raises(ValueError):
            client.set_rate_limit("rl", *bad)
    with pytest.raises(TypeError):
        client.set_rate_limit("rl", 5)
    with pytest.raises(TypeError):
        client.set_rate_limit("rl", True, 1000)
    with pytest.raises(ValueError):
        client.set_rate_limit("rl", None, 1000)


ERRORS = [
    (("RATE", "0", "PER", "10"), "ERR RATE must be an integer from 1 to 1000000000"),
    (("RATE", "1000000001", "PER", "10"), "ERR RATE must be an integer from 1 to 1000000000"),
    (("RATE", "x", "PER", "10"), "ERR RATE must be an integer from 1 to 1000000000"),
    (("RATE", "5", "PER", "0"), "ERR PER must be an integer from 1 to 86400000 (ms)"),
    (("RATE", "5", "PER", "86400001"), "ERR PER must be an integer from 1 to 86400000 (ms)"),
    (("BACKOFF", "-1"), "ERR BACKOFF must be an integer from 0 to 86400000 (ms)"),
    (("BACKOFF", "1.5"), "ERR BACKOFF must be an integer from 0 to 86400000 (ms)"),
    (("RATE", "5"), "ERR syntax error"),
    (("PER", "5"), "ERR syntax error"),
    (("OFF", "RATE", "1", "PER", "1"), "ERR syntax error"),
    (("OFF", "OFF"), "ERR syntax error"),
    (("BACKOFF",), "ERR syntax error"),
    (("NOPE", "1"), "ERR syntax error"),
]


@pytest.mark.parametrize(("args", "text"), ERRORS)
def test_limit_errors_change_nothing(
    r: redis.Redis, client: echomq.Client, args: tuple[str, ...], text: str
) -> None:
    client.set_rate_limit("rl", 2, 1000)
    before = digest(r)
    k = queue_keys("rl")
    with pytest.raises(redis.ResponseError) as err:
        client._send(("EMQ.LIMIT", k.pending, k.base, *args))
    assert str(err.value) == text.removeprefix("ERR ")  # redis-py strips the ERR
    assert digest(r) == before


def test_corrupt_limit_fields_refuse_claims(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("rl", b"x", job_id="a")
    k = queue_keys("rl")
    for field, value in [("max", "0"), ("per_ms", "x"), ("used", "-1"), ("backoff_until", "1e3")]:
        r.delete(k.base + "limit")
        r.hset(k.base + "limit", mapping={"max": "1", "per_ms": "10"})
        r.hset(k.base + "limit", field, value)
        before = digest(r)
        with pytest.raises(echomq.CorruptQueue, match="limit hash holds a field"):
            client.claim("rl", 1000)
        assert digest(r) == before
    r.delete(k.base + "limit")
    r.hset(k.base + "limit", "max", "3")  # a rate's fields come together
    with pytest.raises(echomq.CorruptQueue):
        client.claim("rl", 1000)
    r.set(k.base + "limit", "x")
    with pytest.raises(echomq.CorruptQueue):
        client.claim("rl", 1000)


def test_back_off_stops_claims_until_it_ends(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(3)])
    start = now_ms(r)
    got = client.back_off("rl", 400)
    assert got.backoff_until is not None and got.backoff_until >= start + 400
    assert client.back_off("rl", 10).backoff_until == got.backoff_until  # never shortened
    assert client.claim("rl", 60_000) is None
    job = client.claim("rl", 60_000, block_ms=10_000)  # waits for the back-off's end
    assert job is not None
    assert claimed_at(r, "rl", [job.id])[0] >= got.backoff_until
    client.back_off("rl", 60_000)
    assert client.back_off("rl", 0).backoff_until is None  # 0 lifts it
    assert client.claim("rl", 60_000) is not None


def test_a_waiting_claim_wakes_when_the_window_opens(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(3)])
    client.set_rate_limit("rl", 1, 500)
    first = client.claim("rl", 60_000)
    if first is None:  # a window opened between the two calls: take its one job first
        first = client.claim("rl", 60_000)
    assert first is not None
    second = client.claim("rl", 60_000, block_ms=10_000)
    assert second is not None
    a, b = claimed_at(r, "rl", [first.id, second.id])
    assert b // 500 > a // 500  # the next window, never the same one


def test_removing_the_limit_wakes_a_waiting_claim(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(3)])
    client.back_off("rl", 86_400_000)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(client.claim("rl", 60_000, block_ms=20_000)))
    t.start()
    time.sleep(0.2)
    client.back_off("rl", 0)
    t.join(15)
    assert got and got[0] is not None


def test_the_cli_sets_shows_and_removes_a_limit(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    def cli(*argv: str) -> tuple[int, str, str]:
        code = main(["--url", server.url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = cli("limit", "rl", "--rate", "50", "--per", "1000")
    assert code == 0 and out.startswith("rate limit 50 per 1000 ms: 0 claimed in this window")
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(3)])
    client.claim_many("rl", 60_000, 3)
    code, out, _ = cli("inspect", "rl")
    assert code == 0 and re.search(r"rate limit 50 per 1000 ms: [03] claimed in this window", out), out
    code, out, _ = cli("limit", "rl", "--backoff", "60000")
    assert "backed off: no claims for" in out
    code, out, _ = cli("limit", "rl", "--off", "--backoff", "0")
    assert code == 0 and out == "no rate limit, no back-off\n"
    code, _, err = cli("limit", "rl", "--rate", "5")
    assert code == 1 and "--rate and --per go together" in err


def test_completeclaim_takes_only_what_the_window_has_left(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue_many("rl", [(f"j{i}", b"") for i in range(10)])
    client.set_rate_limit("rl", 3, 86_400_000)
    first = client.claim_many("rl", 60_000, 2)
    assert len(first) == 2
    k = queue_keys("rl")
    job = first[0]
    gone, jobs = client._send(
        ("EMQ.COMPLETECLAIM", k.active, k.job(job.id), k.pending, job.id, job.token, 60_000, "COUNT", 5)
    )
    assert gone == 1 and len(jobs) == 1  # the complete went through; the claim took the one left
    gone, jobs = client._send(
        ("EMQ.COMPLETECLAIM", k.active, k.job(first[1].id), k.pending, first[1].id, first[1].token, 60_000)
    )
    assert gone == 1 and jobs is None  # the window is spent: the complete still lands
    assert client.rate_limit("rl").used == 3


@given(
    mx=st.integers(0, 50),
    per=st.integers(1, 5000),
    window_back=st.integers(0, 3),
    used=st.integers(0, 60),
    until_delta=st.integers(-5000, 5000),
    now=st.integers(0, 2**45),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_rate_decision_against_a_reference(
    core: Core,  # noqa: F811
    mx: int,
    per: int,
    window_back: int,
    used: int,
    until_delta: int,
    now: int,
) -> None:
    """emq_rate_allowance (module/emq_core.c), called in-process, against the documented rule."""
    start = now - now % per
    window = max(start - window_back * per, 0)
    until = max(now + until_delta, 0)
    out_used, reopen = core.ffi.new("long long *"), core.ffi.new("long long *")
    got = core.lib.emq_rate_allowance(mx, per if mx else 0, window, used, until, now, out_used, reopen)
    if until > now:
        assert (got, reopen[0]) == (0, until)
    elif mx == 0:
        assert got == -1
    else:
        in_window = used if window == start else 0
        assert out_used[0] == in_window
        if in_window >= mx:
            assert (got, reopen[0]) == (0, start + per)  # the next window opens
        else:
            assert got == mx - in_window and reopen[0] == -1
