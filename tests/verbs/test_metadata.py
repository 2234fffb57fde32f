"""What the server knows about each EMQ command: the module's command table
(module/emq.c) told through SetCommandInfo (Redis 7.0+, Valkey).

Checked with the server's own tools, the way any client sees it: COMMAND
INFO (arity, flags, key specs, legacy key range), COMMAND DOCS (summary,
since, complexity, arguments), COMMAND GETKEYSANDFLAGS, and ACL DRYRUN plus
real calls for users with read-only (%R~) or write-only (%W~) key
permissions.  SPEC below is the contract, written out by hand: the C table
must agree with it.  On Redis 6.2 (no SetCommandInfo) the degraded shape is
checked instead: arity -1 and the declared keys' legacy range.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from echomq.testing import EmbeddedServer

from ..conftest import MODULE_DIR, ServerFactory, engine_cli, module_command_args, needs, supports
from ..helpers import digest

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

Q = "emq:{q}:"
RW_UPDATE, RO_ACCESS = ["RW", "update"], ["RO", "access"]
RW_INSERT, RW_DELETE = ["RW", "insert"], ["RW", "delete"]
RW_ACCESS_DELETE, RW_ACCESS_UPDATE = ["RW", "access", "delete"], ["RW", "access", "update"]
BASE = ("base", ["RO", "not_key"])


@dataclass(frozen=True)
class Optional:
    """An optional argument given as TOKEN value (e.g. [COUNT count])."""

    token: str
    type: str


@dataclass(frozen=True)
class OptionalMany:
    """An optional token followed by one value or more (AFTER <dep-id> [<dep-id> ...])."""

    token: str
    type: str


@dataclass(frozen=True)
class Repeated:
    """One or more groups of arguments of `types` (e.g. <id> [<id> ...], or <id> <payload> [...])."""

    types: tuple[str, ...]


@dataclass(frozen=True)
class OneOf:
    """At most one of TOKEN value choices (e.g. [DELAY ms | AT unix-time-ms]): (token, name, type)."""

    choices: tuple[tuple[str, str, str], ...]


def required(verb: str) -> list[tuple[str, Any]]:
    return [
        (name, kind) for name, kind in SPEC[verb][1] if not isinstance(kind, Optional | OptionalMany | OneOf)
    ]


def required_words(verb: str) -> int:
    """The fewest arguments a call takes (a repeated group counts once, with all its words)."""
    return sum(len(kind.types) if isinstance(kind, Repeated) else 1 for _, kind in required(verb))


def variadic(verb: str) -> bool:
    return any(isinstance(kind, Optional | OptionalMany | Repeated | OneOf) for _, kind in SPEC[verb][1])


WHEN = ("when", OneOf((("DELAY", "ms", "integer"), ("AT", "unix-time-ms", "unix-time"))))

# verb: (flags, [(argument, type or key flags or Optional)], a valid call's arguments)
SPEC: dict[str, tuple[set[str], list[tuple[str, Any]], list[str]]] = {
    "emq.extend": (
        {"write", "fast"},
        [("active", RW_UPDATE), ("job", RO_ACCESS), ("id", "string"), ("token", "string"),
         ("lease-ms", "integer")],
        [Q + "active", Q + "job:j", "j", "1", "1000"],
    ),
    "emq.checkpoint": (
        {"write", "fast"},
        [("active", RW_UPDATE), ("job", RW_ACCESS_UPDATE), ("id", "string"), ("token", "string"),
         ("lease-ms", "integer"), ("state", Optional("STATE", "string")),
         ("progress", Optional("PROGRESS", "string"))],
        [Q + "active", Q + "job:j", "j", "1", "1000"],
    ),
    "emq.sweep": (
        {"write", "denyoom"},
        [("active", RW_ACCESS_DELETE), ("pending", RW_INSERT), ("dead", RW_ACCESS_UPDATE), BASE,
         ("max-stalled", "integer"), ("limit", "integer")],
        [Q + "active", Q + "pending", Q + "dead", Q, "3", "10"],
    ),
    "emq.enqueue": (
        {"write", "denyoom", "fast"},
        [("pending", RW_INSERT), BASE, ("id", "string"), ("payload", "string"), WHEN,
         ("priority", Optional("PRIORITY", "integer")), ("group", Optional("GROUP", "string")),
         ("request-id", Optional("REQ", "string")), ("key", Optional("UNIQUE", "string")),
         ("unique-hold", OneOf((("FOR", "ms", "integer"), ("UNTIL", "done", "string")))),
         ("REPLACE", Optional("REPLACE", "pure-token")), ("policy", Optional("ON_PARENT_FAILURE", "string")),
         ("done", Optional("MISSING", "string")), ("dep-id", OptionalMany("AFTER", "string"))],
        [Q + "pending", Q, "j", "x"],
    ),
    "emq.enqueuemany": (
        {"write", "denyoom"},
        [("pending", RW_INSERT), BASE, ("count", "integer"), ("job", Repeated(("string", "string"))), WHEN,
         ("priority", Optional("PRIORITY", "integer")), ("group", Optional("GROUP", "string")),
         ("request-id", Optional("REQ", "string"))],
        [Q + "pending", Q, "1", "j", "x"],
    ),
    "emq.claim": (
        {"write", "denyoom", "fast"},
        [("pending", RW_ACCESS_DELETE), ("active", RW_INSERT), BASE, ("lease-ms", "integer"),
         ("count", Optional("COUNT", "integer")), ("request-id", Optional("REQ", "string")),
         ("ms", Optional("BLOCK", "integer"))],
        [Q + "pending", Q + "active", Q, "1000"],
    ),
    "emq.complete": (
        {"write", "fast"},
        [("active", RW_DELETE), ("job", RW_ACCESS_UPDATE), ("id", "string"), ("token", "string"),
         ("result", Optional("RESULT", "string"))],
        [Q + "active", Q + "job:j", "j", "1"],
    ),
    "emq.completeclaim": (
        {"write", "denyoom", "fast"},
        [("active", RW_UPDATE), ("job", RW_ACCESS_UPDATE), ("pending", RW_ACCESS_DELETE), ("id", "string"),
         ("token", "string"), ("lease-ms", "integer"), ("count", Optional("COUNT", "integer")),
         ("request-id", Optional("REQ", "string")), ("result", Optional("RESULT", "string"))],
        [Q + "active", Q + "job:j", Q + "pending", "j", "1", "1000"],
    ),
    "emq.fail": (
        {"write", "denyoom", "fast"},
        [("active", RW_DELETE), ("pending", RW_INSERT), ("dead", RW_INSERT), BASE, ("id", "string"),
         ("token", "string"), ("max-attempts", "integer"), ("error", "string"),
         ("ms", Optional("DELAY", "integer")), ("traceback", Optional("TRACE", "string")),
         ("DEAD", Optional("DEAD", "pure-token"))],
        [Q + "active", Q + "pending", Q + "dead", Q, "j", "1", "3", "boom"],
    ),
    "emq.release": (
        {"write", "fast"},
        [("active", RW_DELETE), ("pending", RW_INSERT), BASE, ("id", "string"), ("token", "string"),
         ("ms", Optional("BACKOFF", "integer"))],
        [Q + "active", Q + "pending", Q, "j", "1"],
    ),
    "emq.cancel": (
        {"write", "denyoom", "fast"},
        [("pending", ["RO"]), BASE, ("id", "string"), ("reason", "string")],
        [Q + "pending", Q, "j", "why"],
    ),
    "emq.retry": (
        {"write", "denyoom", "fast"},
        [("dead", RW_DELETE), ("pending", RW_INSERT), BASE, ("id", "string")],
        [Q + "dead", Q + "pending", Q, "j"],
    ),
    "emq.retrydead": (
        {"write", "denyoom"},
        [("dead", RW_ACCESS_DELETE), ("pending", RW_INSERT), BASE, ("limit", "integer"),
         ("unix-time-ms", Optional("UNTIL", "unix-time"))],
        [Q + "dead", Q + "pending", Q, "10"],
    ),
    "emq.purge": (
        {"write"},
        [("dead", RW_ACCESS_DELETE), BASE, ("limit", "integer"),
         ("unix-time-ms", Optional("UNTIL", "unix-time"))],
        [Q + "dead", Q, "10"],
    ),
    "emq.retention": (
        {"write", "denyoom", "fast"},
        [("pending", ["RO"]), BASE, ("ms", Optional("DONE", "integer")),
         ("ms", Optional("CANCELLED", "integer")), ("ms", Optional("DEAD", "integer"))],
        [Q + "pending", Q],
    ),
    "emq.pause": ({"write", "fast"}, [("pending", ["RO"]), BASE], [Q + "pending", Q]),
    "emq.resume": ({"write", "fast"}, [("pending", ["RO"]), BASE], [Q + "pending", Q]),
    "emq.limit": (
        {"write", "fast"},
        [("pending", ["RO"]), BASE, ("max", Optional("RATE", "integer")), ("ms", Optional("PER", "integer")),
         ("OFF", Optional("OFF", "pure-token")), ("ms", Optional("BACKOFF", "integer"))],
        [Q + "pending", Q],
    ),
    "emq.grouplimit": (
        {"write"},
        [("pending", ["RO"]), BASE, ("group", "string"), ("max", Optional("MAX", "integer")),
         ("NOMAX", Optional("NOMAX", "pure-token")), ("PAUSE", Optional("PAUSE", "pure-token")),
         ("RESUME", Optional("RESUME", "pure-token"))],
        [Q + "pending", Q, "g"],
    ),
    "emq.obliterate": (
        {"write"},
        [("active", RW_ACCESS_DELETE), ("pending", RW_ACCESS_DELETE), ("dead", RW_ACCESS_DELETE), BASE,
         ("limit", "integer"), ("FORCE", Optional("FORCE", "pure-token"))],
        [Q + "active", Q + "pending", Q + "dead", Q, "10"],
    ),
    "emq.forget": (
        {"write"},
        [("pending", ["RO"]), BASE, ("ids", Repeated(("string",)))],
        [Q + "pending", Q, "j"],
    ),
}  # fmt: skip
SLOW = {
    "emq.sweep", "emq.retrydead", "emq.purge", "emq.obliterate", "emq.forget", "emq.enqueuemany",
    "emq.grouplimit",
}  # fmt: skip
# Categories a row adds to the derived ones: CLAIM may wait (BLOCK).
EXTRA_CATEGORIES = {"emq.claim": {"@blocking"}}


def keys_of(verb: str) -> list[tuple[str, list[str]]]:
    """The declared keys and their flags, in order (<base> is not a key)."""
    return [(name, kind) for name, kind in SPEC[verb][1] if isinstance(kind, list) and name != "base"]


def as_text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [as_text(v) for v in value]
    if isinstance(value, dict):
        return {as_text(k): as_text(v) for k, v in value.items()}
    return value


def command(r: redis.Redis, *args: object) -> Any:
    # "COMMAND X" as one word keeps redis-py's reply parser for COMMAND away.
    return as_text(r.execute_command(f"COMMAND {args[0]}", *args[1:]))


def pairs(flat: list[Any] | dict[str, Any]) -> dict[str, Any]:
    """A map reply: RESP3 gives a dict, RESP2 a flat list of pairs."""
    if isinstance(flat, dict):
        return flat
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def command_info(r: redis.Redis, verb: str) -> dict[str, Any]:
    (entry,) = command(r, "INFO", verb)
    return {
        "name": entry[0],
        "arity": entry[1],
        "flags": set(entry[2]),
        "range": tuple(entry[3:6]),
        "categories": set(entry[6]) if len(entry) > 6 else set(),
        "key_specs": [pairs(spec) for spec in entry[8]] if len(entry) > 8 else [],
    }


def index_of(spec: dict[str, Any]) -> int:
    return int(pairs(pairs(spec["begin_search"])["spec"])["index"])


@pytest.fixture
def conn(r: redis.Redis) -> redis.Redis:
    return r


# -- COMMAND INFO ----------------------------------------------------------------------


@pytest.mark.parametrize("verb", sorted(SPEC))
def test_command_info_on_engines_without_metadata(conn: redis.Redis, verb: str) -> None:
    if supports("command_info"):
        pytest.skip("this engine has SetCommandInfo: test_command_info checks the real metadata")
    info = command_info(conn, verb)
    flags = SPEC[verb][0]
    keys = keys_of(verb)
    assert info["arity"] == -1
    assert info["flags"] >= flags
    assert info["range"] == (1, len(keys), 1)


@needs("command_info", "COMMAND INFO shows arity -1 and the keys' legacy range only")
@pytest.mark.parametrize("verb", sorted(SPEC))
def test_command_info(conn: redis.Redis, verb: str) -> None:
    info = command_info(conn, verb)
    flags, args, _ = SPEC[verb]
    fixed = required_words(verb) + 1
    assert info["arity"] == (-fixed if variadic(verb) else fixed)
    assert info["flags"] - {"module"} == flags
    # The legacy range spans the keys and <base> (a NOT_KEY spec routes like a key).
    positions = [i + 1 for i, (_, kind) in enumerate(args) if isinstance(kind, list)]
    assert info["range"] == (positions[0], positions[-1], 1)
    specs = info["key_specs"]
    expected = [(i + 1, kind) for i, (_, kind) in enumerate(args) if isinstance(kind, list)]
    assert [(index_of(s), s["flags"]) for s in specs] == expected
    for spec in specs:
        assert pairs(spec["begin_search"])["type"] == "index"
        find = pairs(spec["find_keys"])
        assert (find["type"], pairs(find["spec"])) == ("range", {"lastkey": 0, "keystep": 1, "limit": 0})
        if "not_key" in spec["flags"]:
            assert "derives" in spec["notes"] and "<base>job:<id>" in spec["notes"]


@needs("acl_categories", "the commands are in no ACL category (test_acl_readonly.py: the recipe)")
@pytest.mark.parametrize("verb", sorted(SPEC))
def test_acl_categories(conn: redis.Redis, verb: str) -> None:
    expected = {"@write", "@slow" if verb in SLOW else "@fast", *EXTRA_CATEGORIES.get(verb, set())}
    if supports("own_category"):
        expected.add("@emq")
    assert command_info(conn, verb)["categories"] == expected


# -- COMMAND DOCS ----------------------------------------------------------------------


@needs("command_info", "COMMAND DOCS has nothing for module commands")
@pytest.mark.parametrize("verb", sorted(SPEC))
def test_command_docs(conn: redis.Redis, verb: str) -> None:
    doc = pairs(pairs(command(conn, "DOCS", verb))[verb])
    assert doc["since"] == "0.1.0" and doc["module"] == "emq" and doc["group"] == "module"
    assert doc["summary"][0].isupper() and len(doc["summary"]) < 120
    assert doc["complexity"].startswith("O(")
    args = [pairs(a) for a in doc["arguments"]]
    expected = SPEC[verb][1]
    assert [a["name"] for a in args] == [name for name, _ in expected]
    specs_before = 0  # a key argument names its key spec; <base> has one too, as NOT_KEY
    for arg, (name, kind) in zip(args, expected, strict=True):
        if isinstance(kind, Optional):
            assert (arg["type"], arg["token"], arg["flags"]) == (kind.type, kind.token, ["optional"])
            continue
        if isinstance(kind, OptionalMany):
            assert (arg["type"], arg["token"], arg["flags"]) == (
                kind.type,
                kind.token,
                ["optional", "multiple"],
            )
            continue
        if isinstance(kind, Repeated):
            assert (arg["type"], arg["flags"]) == ("block", ["multiple"])
            assert [pairs(a)["type"] for a in arg["arguments"]] == list(kind.types)
            continue
        if isinstance(kind, OneOf):
            assert (arg["type"], arg["flags"]) == ("oneof", ["optional"])
            choices = [pairs(a) for a in arg["arguments"]]
            assert [(c["token"], c["name"], c["type"]) for c in choices] == list(kind.choices)
            continue
        assert "flags" not in arg
        if name == "base":
            assert arg["type"] == "string"
        elif isinstance(kind, list):
            assert (arg["type"], arg["key_spec_index"]) == ("key", specs_before)
        else:
            assert arg["type"] == kind
        specs_before += isinstance(kind, list)


# -- COMMAND GETKEYSANDFLAGS and GETKEYS ---------------------------------------------------


@needs("acl_keys", "no COMMAND GETKEYSANDFLAGS before 7.0")
@pytest.mark.parametrize("verb", sorted(SPEC))
def test_getkeysandflags(conn: redis.Redis, verb: str) -> None:
    call = SPEC[verb][2]
    got = command(conn, "GETKEYSANDFLAGS", verb, *call)
    expected = [(call[i], kind) for i, (name, kind) in enumerate(SPEC[verb][1]) if isinstance(kind, list)]
    assert [(k, f) for k, f in got] == [(k, f) for k, f in expected if k != Q]


@pytest.mark.parametrize("verb", sorted(SPEC))
def test_getkeys_names_the_declared_keys_only(conn: redis.Redis, verb: str) -> None:
    call = SPEC[verb][2]
    keys = [
        call[i] for i, (name, kind) in enumerate(SPEC[verb][1]) if isinstance(kind, list) and name != "base"
    ]
    assert command(conn, "GETKEYS", verb, *call) == keys


# -- arity -------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", sorted(SPEC))
def test_wrong_arity_is_refused_with_the_usual_words(conn: redis.Redis, verb: str) -> None:
    call = SPEC[verb][2]
    before = digest(conn)
    with pytest.raises(redis.ResponseError, match=f"^wrong number of arguments for '{verb}' command$"):
        conn.execute_command(verb, *call[:-1])
    # One argument too many: a wrong arity, or where options may follow, not one of them.
    if any(isinstance(kind, Repeated) for _, kind in SPEC[verb][1]):
        assert digest(conn) == before  # one more of the repeated argument is a valid call
        return
    refusal = "^syntax error$" if variadic(verb) else f"^wrong number of arguments for '{verb}' command$"
    with pytest.raises(redis.ResponseError, match=refusal):
        conn.execute_command(verb, *call, "extra")
    assert digest(conn) == before


@needs("command_info", "the module checks the arity when the command runs, so MULTI queues it")
def test_wrong_arity_aborts_a_transaction_as_a_core_command_would(conn: redis.Redis) -> None:
    pipe = conn.pipeline(transaction=True)
    pipe.set("x", 1)
    pipe.execute_command("EMQ.EXTEND", Q + "active")
    # Refused when queued, like a core command's wrong arity: EXEC runs nothing.
    with pytest.raises(
        (redis.exceptions.ExecAbortError, redis.ResponseError), match=r"wrong number|discarded"
    ):
        pipe.execute()
    assert conn.get("x") is None


# -- key permissions ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_server(server_factory: ServerFactory) -> EmbeddedServer:
    srv = server_factory()
    if supports("acl_keys"):
        admin = srv.client()
        admin.execute_command("ACL", "SETUSER", "writer", "on", ">pw", "+@all", "%W~*")
        admin.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "+@all", "%R~*")
        admin.close()
    return srv


@pytest.fixture
def admin(acl_server: EmbeddedServer) -> Iterator[redis.Redis]:
    c = acl_server.client(decode_responses=True)
    c.flushall()
    yield c
    c.close()


def dryrun(admin: redis.Redis, user: str, verb: str) -> str:
    return str(admin.execute_command("ACL DRYRUN", user, verb, *SPEC[verb][2]))


def routing_only(verb: str) -> bool:
    """A verb whose declared keys are only read for routing: all it changes is derived."""
    return all(kind == ["RO"] for _, kind in keys_of(verb))


def may_write_blind(verb: str) -> bool:
    """A verb whose every declared key is written without being read."""
    return all("access" not in kind for _, kind in keys_of(verb))


@needs("acl_keys", "no %R~/%W~ key permissions and no ACL DRYRUN before 7.0")
@pytest.mark.parametrize("verb", sorted(SPEC))
def test_acl_dryrun_follows_the_key_flags(acl_server: EmbeddedServer, admin: redis.Redis, verb: str) -> None:
    if routing_only(verb):
        # The declared key only routes the call (RO, untouched): the server lets
        # a read-only key user through, and the module refuses the derived keys
        # it would write (<base>meta, the rows), before reading them.
        assert dryrun(admin, "reader", verb) == "OK"
        reader = acl_server.client(username="reader", password="pw")
        try:
            before = digest(admin)
            # without options these only read
            writes = {"emq.retention": ["DONE", "1000"], "emq.limit": ["BACKOFF", "1000"],
                      "emq.grouplimit": ["PAUSE"]}.get(verb, [])
            with pytest.raises(redis.exceptions.NoPermissionError, match="derived from <base>"):
                reader.execute_command(verb, *SPEC[verb][2], *writes)
            assert digest(admin) == before
        finally:
            reader.close()
        return
    # Every other verb writes a declared key: a read-only key user may run none.
    assert "no permissions to access" in dryrun(admin, "reader", verb)
    # A write-only key user may run the verbs that write their keys blind.
    writer = dryrun(admin, "writer", verb)
    assert (writer == "OK") == may_write_blind(verb), writer


@needs("acl_keys", "no %W~ key permissions before 7.0")
def test_a_write_only_key_user_may_enqueue_like_it_may_zadd(
    acl_server: EmbeddedServer, admin: redis.Redis
) -> None:
    writer = acl_server.client(username="writer", password="pw", decode_responses=True)
    try:
        assert writer.zadd("k", {"m": 1}) == 1
        assert writer.execute_command("EMQ.ENQUEUE", Q + "pending", Q, "j1", "x") == 1
        assert admin.hget(Q + "job:j1", "state") == "pending"
        assert admin.lrange(Q + "pending", 0, -1) == ["j1"]
        # CLAIM reads <pending> (which job is first, and hands out its id): the server refuses.
        before = digest(admin)
        with pytest.raises(redis.exceptions.NoPermissionError) as refused:
            writer.execute_command("EMQ.CLAIM", Q + "pending", Q + "active", Q, "1000")
        assert "derived" not in str(refused.value)
        # CANCEL does not even read its declared key (RO, no access: a waiting job's entry stays,
        # a tombstone), but it reads the job row: the module refuses.
        with pytest.raises(redis.exceptions.NoPermissionError, match="derived from <base>"):
            writer.execute_command("EMQ.CANCEL", Q + "pending", Q, "j1", "why")
        assert digest(admin) == before
    finally:
        writer.close()


# -- every kind of argument a row can declare (module/meta_probe.c) -----------------------


@pytest.fixture(scope="module")
def probe(server_factory: ServerFactory) -> EmbeddedServer:
    subprocess.run(["make", "-s", "-C", str(MODULE_DIR), "meta-probe.so"], check=True)
    return server_factory(
        [*module_command_args(), "--loadmodule", str(MODULE_DIR / "meta-probe.so")], load_module=False
    )


@needs("command_info", "nothing to declare to")
def test_every_kind_of_argument_is_declared_as_core_commands_declare_theirs(probe: EmbeddedServer) -> None:
    c = probe.client()
    info = command_info(c, "emqprobe.demo")
    assert info["arity"] == -7  # name, 2 keys, base, lease-ms, then at least one id payload pair
    assert info["range"] == (1, 3, 1)
    doc = pairs(pairs(command(c, "DOCS", "emqprobe.demo"))["emqprobe.demo"])
    args = [pairs(a) for a in doc["arguments"]]
    assert [a["name"] for a in args] == [
        "pending",
        "active",
        "base",
        "lease-ms",
        "count",
        "ms",
        "when",
        "NOW",
        "job",
    ]
    count, block, when, now, job = args[4:]
    assert (count["token"], count["type"], count["flags"]) == ("COUNT", "integer", ["optional"])
    assert (block["token"], block["type"], block["flags"]) == ("BLOCK", "integer", ["optional"])
    assert (when["type"], when["flags"]) == ("oneof", ["optional"])
    choices = [pairs(a) for a in when["arguments"]]
    assert [(a["token"], a["name"], a["type"]) for a in choices] == [
        ("DELAY", "ms", "integer"),
        ("AT", "unix-time-ms", "unix-time"),
    ]
    assert (now["type"], now["token"], now["flags"]) == ("pure-token", "NOW", ["optional"])
    assert (job["type"], job["flags"]) == ("block", ["multiple"])
    assert [pairs(a)["name"] for a in job["arguments"]] == ["id", "payload"]
    if supports("acl_categories"):
        assert "@keyspace" in info["categories"] and "@write" in info["categories"]
    # The server enforces the derived arity.
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        c.execute_command("EMQPROBE.DEMO", "emq:{q}:pending", "emq:{q}:active", "emq:{q}:", "1", "id")
    assert (
        c.execute_command(
            "EMQPROBE.DEMO", "emq:{q}:pending", "emq:{q}:active", "emq:{q}:", "1", "COUNT", "2", "i", "p"
        )
        == 9
    )
    c.close()


# -- redis-cli's hints ---------------------------------------------------------------------


@needs("command_info", "redis-cli has no hints for module commands without COMMAND DOCS")
def test_the_cli_hints_an_emq_command_as_it_hints_a_core_one(server: EmbeddedServer) -> None:
    cli = engine_cli()
    if cli is None:
        pytest.skip("no redis-cli/valkey-cli beside the server binary")
    screen = typed_into_cli(cli, server.port, "EMQ.SWEEP ")
    assert "active pending dead base max-stalled limit" in screen, screen


def typed_into_cli(cli: str, port: int, text: str) -> str:
    """What the CLI draws on a terminal while `text` is typed (and nothing sent)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on a terminal 200 columns wide
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
        os.execv(cli, [cli, "-p", str(port)])
    out = b""
    try:
        deadline = time.monotonic() + 10
        sent = False
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                out += chunk
                # The line editor asks where the cursor is (before and after
                # moving it far right, to learn the width); a terminal answers.
                for part in chunk.split(b"\x1b[6n")[:-1]:
                    os.write(fd, b"\x1b[1;200R" if part.endswith(b"\x1b[999C") else b"\x1b[1;1R")
            if not sent and b">" in out:
                os.write(fd, text.encode())
                sent = True
            elif sent and not ready:
                break
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)
    return out.decode(errors="replace")
