"""ACL: a user reaches only the queues its key patterns allow.

The server checks the keys in the argument list (EXTEND's <active> and <job>,
SWEEP's three sets).  SWEEP also reads and writes keys derived from <base> --
the queue's settings (meta, read on every call), the job rows and the failed
metric -- that are not arguments, so the module checks them against the
caller's ACL itself, before it reads them.  Every refusal must leave the data
exactly as it was (same DEBUG DIGEST).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from echomq import Client
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..helpers import digest, extend_args, now_ms, put_active, sweep_args

A, B = queue_keys("a"), queue_keys("b")
DERIVED = "derived from <base>"

# SWEEP reads the queue's settings (<base>meta, for the dead retention) and
# its delayed jobs (<base>delayed, the due ones move to their lanes) on every
# call, so every user below that may sweep queue b may read its meta and
# touch its lanes.
B_META = "%R~emq:{b}:meta"
B_LANES = ["~emq:{b}:priority", "~emq:{b}:delayed"]

USERS = {
    # Only queue a, every key of it.
    "alice": ["~emq:{a}:*"],
    # Queue b's sets, lanes and settings, none of its rows nor its metric.
    "bob": ["~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead", *B_LANES, B_META],
    # Queue b's sets, lanes, settings and rows, not its metric.
    "carol": ["~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead", *B_LANES, "~emq:{b}:job:*", B_META],
    # Queue b's sets, lanes, settings and metric, its rows read-only.
    "dave": [
        "~emq:{b}:active",
        "~emq:{b}:pending",
        "~emq:{b}:dead",
        *B_LANES,
        "~emq:{b}:metrics:*",
        "%R~emq:{b}:job:*",
        B_META,
    ],
    # Queue b's three sets and lanes only: not even its settings.
    "erin": ["~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead", *B_LANES],
}


@pytest.fixture(scope="module")
def acl_server(server_factory: ServerFactory) -> EmbeddedServer:
    srv = server_factory()
    admin = srv.client()
    for name, keys in USERS.items():
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", "+@all", *keys)
    admin.close()
    return srv


@pytest.fixture
def admin(acl_server: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = acl_server.client()
    conn.flushall()
    yield conn
    conn.close()


def login(srv: EmbeddedServer, user: str) -> redis.Redis:
    return srv.client(username=user, password="pw")


def lapsed_jobs(admin: redis.Redis, queue: str, stalled: int = 0) -> None:
    now = now_ms(admin)
    for i in range(3):
        put_active(admin, queue, f"j{i}", attempts=1, deadline=now - 1000 - i, stalled=stalled)
    put_active(admin, queue, "live", attempts=5, deadline=now + 600_000)


def test_full_access_user_is_unaffected(acl_server: EmbeddedServer, admin: redis.Redis) -> None:
    lapsed_jobs(admin, "a")
    lapsed_jobs(admin, "b", stalled=5)
    client = Client(admin)
    client.extend("b", "live", token="5", lease_ms=60_000)
    assert len(client.sweep("a", max_stalled=2).recovered) == 3
    assert len(client.sweep("b").dead) == 3
    assert admin.hget(B.metrics_failed, "count") == b"3"


def test_user_of_queue_a_works_on_a_and_is_refused_on_b(
    acl_server: EmbeddedServer, admin: redis.Redis
) -> None:
    lapsed_jobs(admin, "a")
    lapsed_jobs(admin, "b")
    alice = login(acl_server, "alice")
    client = Client(alice)
    client.extend("a", "live", token="5", lease_ms=60_000)
    assert sorted(client.sweep("a", max_stalled=2).recovered) == ["j0", "j1", "j2"]

    before = digest(admin)
    refused = [
        extend_args(B, "live", 5, 60_000),
        sweep_args(B, 1, 10),
        # One declared key of each queue: still touches b.
        ["EMQ.EXTEND", A.active, B.job("live"), "live", 5, 60_000],
    ]
    for args in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            alice.execute_command(*args)
    assert digest(admin) == before
    alice.close()


def test_sweep_refuses_rows_the_user_may_not_touch(acl_server: EmbeddedServer, admin: redis.Redis) -> None:
    bob = login(acl_server, "bob")
    # Nothing lapsed: no row is derived, nothing to refuse.
    put_active(admin, "b", "live", attempts=1, deadline=now_ms(admin) + 600_000)
    assert bob.execute_command(*sweep_args(B, 1, 10)) == [[], [], [], 0]

    lapsed_jobs(admin, "b")
    before = digest(admin)
    with pytest.raises(redis.exceptions.NoPermissionError, match=DERIVED):
        bob.execute_command(*sweep_args(B, 1, 10))
    assert digest(admin) == before
    assert admin.zcard(B.active) == 4
    bob.close()


def test_sweep_refuses_the_metric_only_when_a_job_dies(
    acl_server: EmbeddedServer, admin: redis.Redis
) -> None:
    carol = login(acl_server, "carol")
    lapsed_jobs(admin, "b", stalled=0)
    assert sorted(Client(carol).sweep("b", max_stalled=2).recovered) == ["j0", "j1", "j2"]

    lapsed_jobs(admin, "b", stalled=1)  # the next stall kills them all
    before = digest(admin)
    with pytest.raises(redis.exceptions.NoPermissionError, match=DERIVED):
        Client(carol).sweep("b", max_stalled=2)
    assert digest(admin) == before
    assert not admin.exists(B.dead, B.metrics_failed)
    carol.close()


def test_sweep_reads_the_queue_settings_on_every_call(acl_server: EmbeddedServer, admin: redis.Redis) -> None:
    """SWEEP reads <base>meta (the dead retention) before anything else: a user
    who may not read it is refused even when nothing lapsed, and nothing is written."""
    erin = login(acl_server, "erin")
    put_active(admin, "b", "live", attempts=1, deadline=now_ms(admin) + 600_000)
    for _ in range(2):
        before = digest(admin)
        with pytest.raises(redis.exceptions.NoPermissionError, match=DERIVED):
            erin.execute_command(*sweep_args(B, 1, 10))
        assert digest(admin) == before
        lapsed_jobs(admin, "b")
    assert admin.zcard(B.active) == 4
    erin.close()


def test_sweep_needs_write_access_to_rows(acl_server: EmbeddedServer, admin: redis.Redis) -> None:
    dave = login(acl_server, "dave")
    lapsed_jobs(admin, "b")
    assert dave.hget(B.job("j0"), "attempts") == b"1"  # it may read them
    before = digest(admin)
    with pytest.raises(redis.exceptions.NoPermissionError, match=DERIVED):
        dave.execute_command(*sweep_args(B, 1, 10))
    assert digest(admin) == before
    dave.close()


def test_derived_key_check_holds_in_multi_and_lua(acl_server: EmbeddedServer, admin: redis.Redis) -> None:
    bob = login(acl_server, "bob")
    lapsed_jobs(admin, "b")
    before = digest(admin)

    pipe = bob.pipeline(transaction=True)
    pipe.execute_command(*sweep_args(B, 1, 10))
    pipe.zcard(B.active)
    first, count = pipe.execute(raise_on_error=False)
    assert isinstance(first, redis.exceptions.NoPermissionError)
    assert count == 4

    script = "return redis.call('EMQ.SWEEP', KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])"
    with pytest.raises(redis.exceptions.NoPermissionError, match=DERIVED):
        bob.eval(script, 3, B.active, B.pending, B.dead, B.base, 1, 10)
    assert digest(admin) == before
    bob.close()
