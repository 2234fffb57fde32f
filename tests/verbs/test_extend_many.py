"""Client.extend_many: many leases checkpointed in one round trip."""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq import ExtendOutcome
from echomq.keyspace import queue_keys

from ..conftest import ServerFactory
from ..helpers import digest, now_ms, put_active

Q = "mail"
OK, GONE, STALE = ExtendOutcome.OK, ExtendOutcome.GONE, ExtendOutcome.STALE


def test_mixed_outcomes_come_back_in_order(r: redis.Redis, client: echomq.Client) -> None:
    soon = now_ms(r) + 1_000
    keys = put_active(r, Q, "held", attempts=2, deadline=soon)
    put_active(r, Q, "reclaimed", attempts=3, deadline=soon)  # claimed again since
    put_active(r, Q, "swept", attempts=1, deadline=soon)
    r.zrem(keys.active, "swept")  # a sweep took it: the token still matches
    put_active(r, Q, "also-held", attempts=7, deadline=soon)

    before = now_ms(r)
    outcomes = client.extend_many(
        Q,
        [("held", "2"), ("gone", "1"), ("reclaimed", "2"), ("swept", "1"), ("also-held", "7")],
        lease_ms=60_000,
    )

    assert outcomes == [OK, GONE, STALE, STALE, OK]
    after = now_ms(r)
    for job in ("held", "also-held"):
        score = r.zscore(keys.active, job)
        assert score is not None and before + 60_000 <= score <= after + 60_000
    assert r.zscore(keys.active, "reclaimed") == soon  # a stale holder moves nothing
    assert r.zscore(keys.active, "swept") is None  # and puts nothing back
    assert not r.exists(keys.job("gone"))


def test_same_outcomes_as_extend_one_by_one(r: redis.Redis, client: echomq.Client) -> None:
    soon = now_ms(r) + 1_000
    for i in range(20):
        put_active(r, Q, f"j{i}", attempts=i % 3, deadline=soon)
    batch = [(f"j{i}", "1") for i in range(25)]  # tokens match one job in three; five rows gone

    expected = []
    for job_id, token in batch:
        try:
            client.extend(Q, job_id, token, 60_000)
            expected.append(OK)
        except echomq.JobGone:
            expected.append(GONE)
        except echomq.StaleToken:
            expected.append(STALE)

    assert client.extend_many(Q, batch, 60_000) == expected
    assert expected.count(OK) == 7 and expected.count(GONE) == 5


def test_binary_ids(r: redis.Redis, client: echomq.Client) -> None:
    raw = b"\xff\x00job\xfe"  # not UTF-8, with a NUL
    keys = put_active(r, Q, raw, attempts=4, deadline=now_ms(r) + 1_000)
    put_active(r, Q, "ünï", attempts=1, deadline=now_ms(r) + 1_000)
    as_text = raw.decode("utf-8", "surrogateescape")  # the str an id comes back as

    outcomes = client.extend_many(Q, [(raw, "4"), (as_text, "4"), ("ünï", "1"), (b"\xff", "4")], 90_000)

    assert outcomes == [OK, OK, OK, GONE]
    score = r.zscore(keys.active, raw)
    assert score is not None and score >= now_ms(r) + 80_000


def test_empty_batch_sends_nothing(r: redis.Redis, client: echomq.Client) -> None:
    r.config_resetstat()
    assert client.extend_many(Q, [], 1_000) == []
    assert client.extend_many(Q, iter(()), 1_000) == []
    assert "cmdstat_emq.extend" not in r.info("commandstats")


def test_one_round_trip(r: redis.Redis, client: echomq.Client) -> None:
    for i in range(50):
        put_active(r, Q, f"j{i}", attempts=1, deadline=now_ms(r) + 1_000)
    r.config_resetstat()
    clients_before = r.info("stats")["total_connections_received"]

    assert client.extend_many(Q, [(f"j{i}", "1") for i in range(50)], 1_000) == [OK] * 50

    assert r.info("commandstats")["cmdstat_emq.extend"]["calls"] == 50
    assert "cmdstat_multi" not in r.info("commandstats")  # pipelined, not a transaction
    assert r.info("stats")["total_connections_received"] == clients_before


@pytest.mark.parametrize(
    ("jobs", "lease", "error"),
    [
        ([("a", "1"), ("b", 1)], 1_000, TypeError),
        ([("a", "1"), ("b", True)], 1_000, TypeError),
        ([("a", "1"), (3, 1)], 1_000, TypeError),
        ([("a", "1")], 0, ValueError),
        ([("a", "1")], 1.5, TypeError),
    ],
)
def test_bad_arguments_send_nothing(
    r: redis.Redis, client: echomq.Client, jobs: list[tuple[object, object]], lease: object, error: type
) -> None:
    put_active(r, Q, "a", attempts=1, deadline=5)
    before = digest(r)
    with pytest.raises(error):
        client.extend_many(Q, jobs, lease)  # type: ignore[arg-type]
    assert digest(r) == before


def test_bad_queue_name_is_refused_before_sending(client: echomq.Client) -> None:
    with pytest.raises(ValueError, match="hash tag"):
        client.extend_many("a{b}", [("a", "1")], 1_000)
    with pytest.raises(TypeError, match="queue name"):
        client.extend_many(b"mail", [("a", "1")], 1_000)  # type: ignore[arg-type]


def test_other_server_errors_are_raised(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys(Q)
    put_active(r, Q, "a", attempts=1, deadline=5)
    r.set(keys.job("b"), "not a hash")
    with pytest.raises(echomq.CorruptQueue, match="WRONGTYPE"):
        client.extend_many(Q, [("a", "1"), ("b", "1")], 1_000)
    # Pipelined, not atomic: the extension before the bad row was applied.
    score = r.zscore(keys.active, "a")
    assert score is not None and score > 5


def test_module_not_loaded(server_factory: ServerFactory) -> None:
    bare = server_factory(load_module=False)
    with bare.client() as conn, pytest.raises(echomq.ModuleNotLoaded, match="--loadmodule"):
        echomq.Client(conn, backend="module").extend_many(Q, [("a", "1")], 1_000)
