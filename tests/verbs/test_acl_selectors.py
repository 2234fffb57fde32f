"""Derived keys are checked per selector, with the access the write needs (issue 28, point 6).

The server checks a command against a user's selectors one by one: one must
allow both the command and every key with the access the command needs.
Keys derived from <base> are not in the command line, so the module asks the
same question of the core command a write stands for (HGET, HSET, DEL; GET
and SET for a request record): a verb never writes a derived key its caller
could not write with a core command.  The check it replaced asked whether
ANY selector had the key, whatever commands that selector allows: a user
whose second selector is `(~<base>job:* +@read)` -- refused HINCRBY on a row
-- could CLAIM, which increments the row's attempts and sets its token.

Both backends (the scripts ask `redis.acl_check_cmd`, per selector too);
every refusal leaves DEBUG DIGEST unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import echomq
from echomq import _protocol as proto
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import needs
from ..helpers import digest, entries

pytestmark = [
    pytest.mark.backends,
    needs("acl_keys", "ACL selectors and the module's ACL API: Redis 7.0+"),
    pytest.mark.smoke,
    pytest.mark.memcheck,
]

Q = "sel"
K = queue_keys(Q)
DECLARED = [
    f"~{K.pending}",
    f"~{K.active}",
    f"~{K.dead}",
    f"~{K.priority}",
    f"~{K.delayed}",
    f"~{K.meta}",
    f"~{K.base}limit",
    f"~{K.base}req:*",
    f"~{K.base}queue",  # the registry's marker, made by the queue's first enqueue
]
USERS = {
    # The issue's: the rows in a second selector that may only read.
    "rowreader": ["+@all", *DECLARED, f"(~{K.base}job:* +@read)"],
    # The rows in a second selector that may read and write them with core commands.
    "rowworker": ["+@all", *DECLARED, f"(~{K.base}job:* +@read +@write)"],
    # Every key in one selector that may only read, and run the EMQ commands (added per backend).
    "onlyread": ["-@all", "+@read", f"~{K.base}*"],
    # Reading and writing the rows split across two selectors, neither allowing HINCRBY.
    "split": ["+@all", *DECLARED, f"(%R~{K.base}job:* +hget +hmget +hexists)", f"(%W~{K.base}job:* +hset)"],
}


@pytest.fixture
def admin(server: EmbeddedServer, backend: str) -> Iterator[redis.Redis]:
    r = server.client()
    r.flushall()
    verbs = ["+emq.claim", "+emq.enqueue"] if backend == "module" else ["+fcall", "+evalsha", "+eval"]
    for name, rules in USERS.items():
        extra = verbs if name == "onlyread" else []
        r.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", "&*", *rules, *extra)
    yield r
    for name in USERS:
        r.execute_command("ACL", "DELUSER", name)
    r.close()


def as_user(server: EmbeddedServer, admin: redis.Redis, name: str, backend: str) -> echomq.Client:
    """A client of `name`; the scripts' library is loaded first by the admin (FUNCTION LOAD is @admin)."""
    echomq.Client(admin, backend=backend).enqueue("warm", b"x")  # type: ignore[arg-type]
    return echomq.Client(server.client(username=name, password="pw"), backend=backend)  # type: ignore[arg-type]


def refused(client: echomq.Client, admin: redis.Redis, *line: object) -> None:
    before = digest(admin)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client._send(tuple(line))
    assert digest(admin) == before


def claim_line() -> tuple[object, ...]:
    return ("EMQ.CLAIM", K.pending, K.active, K.base, 60_000)


def test_a_selector_that_may_only_read_the_rows_lets_no_verb_write_them(
    server: EmbeddedServer, admin: redis.Redis, backend: str
) -> None:
    """The issue's reproduction: CLAIM incremented attempts 0 -> 1 and set a token on a row
    its caller could read but not HINCRBY."""
    echomq.Client(admin, backend=backend).enqueue(Q, b"p", job_id="z")  # type: ignore[arg-type]
    user = as_user(server, admin, "rowreader", backend)
    r = user.redis
    assert r.hget(K.job("z"), "state") == b"pending"  # it may read the row
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.hincrby(K.job("z"), "attempts", 1)  # and may not change it
    refused(user, admin, *claim_line())
    refused(user, admin, "EMQ.ENQUEUE", K.pending, K.base, "new", "p")
    refused(user, admin, "EMQ.CANCEL", K.pending, K.base, "z", "why")
    assert admin.hget(K.job("z"), "attempts") is None and not admin.hexists(K.job("z"), "token")
    user.redis.close()


def test_a_selector_that_may_write_the_rows_lets_the_verbs_run(
    server: EmbeddedServer, admin: redis.Redis, backend: str
) -> None:
    """The derived rows are asked of every selector: the second one allows reading and
    writing them, so CLAIM (and the module's ENQUEUE) run.  A row named in the command line --
    COMPLETE's <job>, and on the scripts backend ENQUEUE's row, one of the FCALL's KEYS -- is
    a declared key: the server wants it in the selector that allows the command, and refuses."""
    client = echomq.Client(admin, backend=backend)  # type: ignore[arg-type]
    client.enqueue(Q, b"p", job_id="z")
    user = as_user(server, admin, "rowworker", backend)
    job = user.claim(Q, 60_000)
    assert job is not None and job.id == "z"
    if backend == "module":
        assert user.enqueue(Q, b"p", job_id="n") == "n"
        assert entries(admin, K) == [b"n"]
    else:
        refused(user, admin, *proto.enqueue(Q, b"p", "n").args)
    assert admin.hget(K.job("z"), "state") == b"active"
    refused(user, admin, "EMQ.COMPLETE", K.active, K.job("z"), "z", job.token)
    user.redis.close()


def test_a_read_only_selector_with_every_key_may_not_write_any(
    server: EmbeddedServer, admin: redis.Redis, backend: str
) -> None:
    """One selector with all the queue's keys, allowed the EMQ commands but no core write:
    the module refuses each derived write (the scripts backend: the server refuses FCALL
    itself, not in @read)."""
    echomq.Client(admin, backend=backend).enqueue(Q, b"p", job_id="z")  # type: ignore[arg-type]
    user = as_user(server, admin, "onlyread", backend)
    refused(user, admin, *claim_line())
    refused(user, admin, "EMQ.ENQUEUE", K.pending, K.base, "new", "p")
    user.redis.close()


def test_read_and_write_split_across_selectors_is_the_documented_gap(
    server: EmbeddedServer, admin: redis.Redis, backend: str
) -> None:
    """docs/reference/acl.md: the module asks a row's write as HSET (and reading and writing
    separately), so a user that may HGET the rows in one selector and HSET them in another
    may CLAIM with it, though it may not HINCRBY a row with a core command.  The scripts
    backend, whose every call the server checks, asks each write a verb may apply first, and
    refuses such a user before writing anything (never half way)."""
    echomq.Client(admin, backend=backend).enqueue(Q, b"p", job_id="z")  # type: ignore[arg-type]
    user = as_user(server, admin, "split", backend)
    with pytest.raises(redis.exceptions.NoPermissionError):
        user.redis.hincrby(K.job("z"), "attempts", 1)
    if backend == "scripts":
        refused(user, admin, *claim_line())
    else:
        jobs = user._run(proto.claim(Q, 60_000))
        assert [j.id for j in jobs] == ["z"] and admin.hget(K.job("z"), "attempts") == b"1"
    user.redis.close()


@needs("own_category", "no @emq ACL category")
def test_a_worker_of_emq_commands_needs_the_core_commands_on_its_keys(
    server: EmbeddedServer, admin: redis.Redis, backend: str
) -> None:
    """docs/reference/acl.md: `+@emq` runs the verbs, with the core commands that read and write
    what they derive (`+@hash +@sortedset +get +set +del`: the rows, the lanes, the records); `+@emq`
    alone is refused the derived writes."""
    if backend == "scripts":
        pytest.skip("the scripts run as FCALL, which is not in @emq")
    keys = [f"~{K.base}*", "&*"]
    admin.execute_command("ACL", "SETUSER", "emqonly", "reset", "on", ">pw", "-@all", "+@emq", *keys)
    core = ["+@hash", "+@sortedset", "+get", "+set", "+del"]
    admin.execute_command("ACL", "SETUSER", "emqworker", "reset", "on", ">pw", "-@all", "+@emq", *core, *keys)
    try:
        echomq.Client(admin).enqueue(Q, b"p", job_id="z")
        only = echomq.Client(server.client(username="emqonly", password="pw"), backend="module")
        refused(only, admin, *claim_line())
        worker = echomq.Client(server.client(username="emqworker", password="pw"), backend="module")
        job = worker.claim(Q, 60_000)
        assert job is not None and job.id == "z"
        worker.complete(Q, job.id, job.token)
        assert worker.enqueue(Q, b"p", job_id="n") == "n"
        only.redis.close()
        worker.redis.close()
    finally:
        admin.execute_command("ACL", "DELUSER", "emqonly", "emqworker")
