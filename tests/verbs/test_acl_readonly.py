"""A read-only user can never change a queue, on every engine.

Where the server lets a module put its commands in ACL categories (Redis
7.2+, Valkey), every EMQ command is in @write (and @emq), so the usual
`+@all -@write` user is read-only.  Redis 7.0 and 6.2 have no such API: the
EMQ commands are in no category and `-@write` lets them through, so the
reference (docs/reference/acl.md) gives a recipe that denies each by name.  Both the
recipe (copied from that page, word for word) and the allow-list form are tested here on
every engine, and the hole they close is shown where it exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import redis

from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ROOT, ServerFactory, needs, supports
from ..helpers import digest, now_ms, put_active, sweep_args
from .test_fuzz import Resp
from .test_metadata import SLOW, SPEC, as_text, command

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

ACL_PAGE = (ROOT / "docs" / "reference" / "acl.md").read_text()
VERBS = sorted(SPEC)


def documented_recipe(name: str) -> list[str]:
    """The arguments of the ACL page's `ACL SETUSER <name> ...` line."""
    match = re.search(rf"^\s*ACL SETUSER {name} (.+)$", ACL_PAGE, re.M)
    assert match, f"docs/reference/acl.md has no ACL SETUSER {name} line"
    return match.group(1).split()


USERS = {
    "ro": documented_recipe("ro"),  # +@all -@write, and each EMQ command by name
    "reader": documented_recipe("reader"),  # the allow-list: -@all +@read +@connection
    "nowrite": ["on", ">secret", "~*", "&*", "+@all", "-@write"],  # the repro
    "writer": ["on", ">secret", "~*", "&*", "-@all", "+@write"],
    "noemq": ["on", ">secret", "~*", "&*", "+@all", "-@emq"],
}


@pytest.fixture(scope="module")
def acl_server(server_factory: ServerFactory) -> EmbeddedServer:
    srv = server_factory()
    admin = srv.client()
    for name, rules in USERS.items():
        if "-@emq" in rules and not supports("own_category"):
            continue
        admin.execute_command("ACL", "SETUSER", name, "reset", *rules)
    admin.close()
    return srv


@pytest.fixture
def admin(acl_server: EmbeddedServer) -> Iterator[redis.Redis]:
    c = acl_server.client(decode_responses=True)
    c.flushall()
    c.execute_command("EMQ.ENQUEUE", "emq:{q}:pending", "emq:{q}:", "j", "x")
    c.execute_command("EMQ.ENQUEUE", "emq:{q}:pending", "emq:{q}:", "k", "x")
    c.execute_command("EMQ.CLAIM", "emq:{q}:pending", "emq:{q}:active", "emq:{q}:", "60000")
    yield c
    c.close()


def login(srv: EmbeddedServer, user: str) -> redis.Redis:
    return srv.client(username=user, password="secret", decode_responses=True)


def refused_everything(srv: EmbeddedServer, admin: redis.Redis, user: str) -> None:
    """`user` may read the queue but no EMQ command runs for it, in any way."""
    c = login(srv, user)
    try:
        before = digest(admin)
        assert c.llen("emq:{q}:pending") == 1  # it may read
        for verb in VERBS:
            with pytest.raises(redis.exceptions.NoPermissionError, match=verb):
                c.execute_command(verb.upper(), *SPEC[verb][2])
            script = "return redis.call(ARGV[1], unpack(KEYS))"
            call = SPEC[verb][2]
            with pytest.raises(redis.ResponseError, match=r"(?i)no permission|noperm|can't run this command"):
                c.eval(script, len(call), *call, verb)
        pipe = c.pipeline(transaction=True)
        pipe.execute_command("EMQ.ENQUEUE", "emq:{q}:pending", "emq:{q}:", "new", "x")
        with pytest.raises((redis.exceptions.NoPermissionError, redis.exceptions.ExecAbortError)):
            pipe.execute()
        assert digest(admin) == before
    finally:
        c.close()


def test_the_documented_recipe_names_every_emq_command(
    acl_server: EmbeddedServer, admin: redis.Redis
) -> None:
    denied = {rule[1:] for rule in USERS["ro"] if rule.startswith("-emq.")}
    raw = Resp(acl_server.port)  # plain COMMAND: every command the server has (6.2 has no COMMAND LIST)
    try:
        registered = {
            name for name in (as_text(entry[0]) for entry in raw.call("COMMAND")) if name.startswith("emq.")
        }
    finally:
        raw.close()
    assert registered == set(VERBS)
    assert denied == registered, "acl.md: the read-only recipe must deny every EMQ command by name"
    assert USERS["ro"][USERS["ro"].index("+@all") + 1] == "-@write"


@pytest.mark.parametrize("user", ["ro", "reader"])
def test_the_documented_read_only_users_cannot_change_a_queue(
    acl_server: EmbeddedServer, admin: redis.Redis, user: str
) -> None:
    refused_everything(acl_server, admin, user)


@needs("acl_categories", "-@write lets the EMQ commands through: the documented recipe denies them by name")
def test_minus_write_alone_denies_every_emq_command(acl_server: EmbeddedServer, admin: redis.Redis) -> None:
    refused_everything(acl_server, admin, "nowrite")


def test_without_categories_minus_write_alone_is_not_read_only(
    acl_server: EmbeddedServer, admin: redis.Redis
) -> None:
    """The hole the documented recipe closes, shown where it exists.

    A verb that writes only its declared keys runs (EXTEND re-scores <active>).
    One that writes a key derived from <base> is refused where the module can
    check derived keys: it asks whether the caller could write that key with a
    core command (HSET), and -@write says no."""
    if supports("acl_categories"):
        pytest.skip("this engine puts the EMQ commands in @write")
    c = login(acl_server, "nowrite")
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            c.zadd("emq:{q}:pending", {"z": 1})
        token = admin.hget("emq:{q}:job:j", "token")
        extend = ("EMQ.EXTEND", "emq:{q}:active", "emq:{q}:job:j", "j", token, "120000")
        assert c.execute_command(*extend) == 1
        enqueue = ("EMQ.ENQUEUE", "emq:{q}:pending", "emq:{q}:", "z", "x")
        if supports("acl_keys"):
            with pytest.raises(redis.exceptions.NoPermissionError, match="derived from <base>"):
                c.execute_command(*enqueue)
        else:
            assert c.execute_command(*enqueue) == 1
    finally:
        c.close()


@needs("acl_categories", "the EMQ commands are in no ACL category")
def test_emq_commands_are_listed_in_their_categories(acl_server: EmbeddedServer, admin: redis.Redis) -> None:
    write = set(command(admin, "LIST", "FILTERBY", "ACLCAT", "write"))
    assert write >= set(VERBS)
    assert set(command(admin, "LIST", "FILTERBY", "ACLCAT", "read")).isdisjoint(VERBS)
    assert set(command(admin, "LIST", "FILTERBY", "ACLCAT", "slow")) & set(VERBS) == SLOW
    assert set(command(admin, "LIST", "FILTERBY", "ACLCAT", "fast")) & set(VERBS) == set(VERBS) - SLOW
    # A user granted only @write (and keys) may run them.
    c = login(acl_server, "writer")
    try:
        assert c.execute_command("EMQ.ENQUEUE", "emq:{q}:pending", "emq:{q}:", "w", "x") == 1
        with pytest.raises(redis.exceptions.NoPermissionError):
            c.get("x")
    finally:
        c.close()


@needs("own_category", "no @emq ACL category")
def test_the_emq_category_holds_exactly_the_emq_commands(
    acl_server: EmbeddedServer, admin: redis.Redis
) -> None:
    assert "emq" in admin.execute_command("ACL", "CAT")
    assert set(admin.execute_command("ACL", "CAT", "emq")) == set(VERBS)
    assert set(command(admin, "LIST", "FILTERBY", "ACLCAT", "emq")) == set(VERBS)
    refused_everything(acl_server, admin, "noemq")


def test_without_categories_command_list_shows_no_emq_command_as_write(admin: redis.Redis) -> None:
    if supports("acl_categories"):
        pytest.skip("this engine puts the EMQ commands in @write")
    try:
        write = set(command(admin, "LIST", "FILTERBY", "ACLCAT", "write"))
    except redis.ResponseError:
        pytest.skip("Redis 6.2 has no COMMAND LIST")
    assert write.isdisjoint(VERBS)


def test_without_the_acl_key_api_derived_rows_are_not_checked(server_factory: ServerFactory) -> None:
    """Redis 6.2: a user with a queue's sets but not its rows still writes the rows (reference/engines.md)."""
    if supports("acl_keys"):
        pytest.skip("this engine lets the module check the derived keys (tests/verbs/test_acl.py)")
    srv = server_factory()
    admin = srv.client()
    sets = ["~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead"]
    admin.execute_command("ACL", "SETUSER", "sets", "reset", "on", ">secret", "+@all", *sets)
    put_active(admin, "b", "j", attempts=1, deadline=now_ms(admin) - 1000)
    user = login(srv, "sets")
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.hget("emq:{b}:job:j", "state")
        assert user.execute_command(*sweep_args(queue_keys("b"), 9, 10)) == [["j"], [], [], 0]
        assert admin.hget("emq:{b}:job:j", "stalled") == b"1"
    finally:
        user.close()
        admin.close()
