"""Bad input never hurts the server: EMQ.EXTEND and EMQ.SWEEP under fuzzing.

Every case builds a keyspace (right and wrong key types, corrupt counters,
odd ids), sends one command line, and then checks, on the wire:

- the server still answers PING (it did not crash);
- the reply is a value of the command's shape, or an error whose message is
  one the reference (docs/reference/) documents (a clear message, never a generic failure);
- when the reply is an error (or EXTEND's "gone" :-1, or a SWEEP that took
  nothing), DEBUG DIGEST is what it was before: nothing was partly written;
- a successful SWEEP ([recovered, dead, cancelled, expired]) moved only lapsed
  members of <active>, and removed exactly `expired` members of <dead>, rows
  and all.

A small RESP client is used instead of redis-py so that replies, errors
included, are compared byte for byte as the server sent them.

Bounded in count (``ECHOMQ_FUZZ_EXAMPLES``, default 2500 generated cases, plus
the fixed grid below) and in time (``ECHOMQ_FUZZ_SECONDS``, default 60: cases
past the budget are skipped, and at least a floor of them must have run).
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echomq.testing import EmbeddedServer

from ..conftest import debug_args
from ..examples import reference_text
from ..helpers import cluster_args

pytestmark = pytest.mark.memcheck  # make -C module check runs it under valgrind

EXAMPLES = int(os.environ.get("ECHOMQ_FUZZ_EXAMPLES", "2500"))
BUDGET_S = float(os.environ.get("ECHOMQ_FUZZ_SECONDS", "60"))
MIB = 1 << 20

STATS: Counter[str] = Counter()
OUTCOMES: Counter[bytes] = Counter()  # how often each reply kind was seen

# -- the wire ---------------------------------------------------------------


class ServerError(Exception):
    """An error reply, with its exact bytes."""

    def __init__(self, message: bytes) -> None:
        super().__init__(message)
        self.message = message


class Resp:
    """A minimal RESP2 client: one connection, one command at a time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.file = self.sock.makefile("rb")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def call(self, *args: bytes | str | int) -> Any:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            parts += [b"$%d\r\n" % len(data), data, b"\r\n"]
        self.sock.sendall(b"".join(parts))
        return self._read()

    def pipeline(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[Any]:
        """Send all, then read all: an error reply is returned, not raised."""
        out = b""
        for args in commands:
            out += b"*%d\r\n" % len(args)
            for arg in args:
                data = arg if isinstance(arg, bytes) else str(arg).encode()
                out += b"$%d\r\n%s\r\n" % (len(data), data)
        self.sock.sendall(out)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(self._read())
            except ServerError as exc:
                replies.append(exc)
        return replies

    def _read(self) -> Any:
        line = self.file.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed")
        kind, body = line[:1], line[1:-2]
        if kind == b"+":
            return body
        if kind == b"-":
            raise ServerError(body)
        if kind == b":":
            return int(body)
        if kind == b"$":
            n = int(body)
            if n < 0:
                return None
            data = self.file.read(n + 2)
            return data[:-2]
        if kind == b"*":
            n = int(body)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise ConnectionError(f"unexpected reply line {line!r}")


class FuzzServer:
    """A server for the fuzz cases; a crashed one is reported and replaced."""

    def __init__(
        self, module: Path, wrapper: Sequence[str] | None = None, configure: Sequence[Sequence[bytes]] = ()
    ) -> None:
        self.module = module
        self.wrapper = wrapper
        self.configure = configure  # commands run on every server started (CONFIG SET ...)
        self.server: EmbeddedServer | None = None
        self.conn: Resp | None = None

    def connect(self) -> Resp:
        if self.conn is None:
            if self.server is None:
                self.server = EmbeddedServer(debug_args(), module=self.module, wrapper=self.wrapper).start()
            self.conn = Resp(self.server.port)
            for command in self.configure:
                self.conn.call(*command)
        return self.conn

    def crashed(self) -> str:
        """Called when PING failed: note why, and start over on the next case."""
        log = self.server.log_tail(40) if self.server else ""
        self.stop()
        return log

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="module")
def fuzz(module_so: Path) -> Iterator[FuzzServer]:
    holder = FuzzServer(module_so)
    holder.connect()
    yield holder
    holder.stop()


# -- what a reply may be ----------------------------------------------------

REFERENCE = reference_text()  # docs/reference/: every error text, word for word

# Every error either command may answer, with the words the reference's tables (docs/reference/)
# document it by.
ERRORS = [
    (rb"ERR wrong number of arguments for 'emq\.(extend|sweep)' command", "-ERR wrong number of arguments"),
    (rb"ERR <active> and <job> must be different keys", None),
    (rb"ERR lease-ms is not an integer", None),
    (rb"ERR lease-ms must be at least 1", None),
    (rb"ERR lease-ms is too large: the deadline would not be an exact score", "-ERR lease-ms is too large"),
    (rb"WRONGTYPE Operation against a key holding the wrong kind of value", "-WRONGTYPE ..."),
    (rb"EMQSTALE extend token mismatch", None),
    (rb"EMQSTALE job is no longer active", None),
    (rb"ERR <job> must be <base>job:<id>, where <active> is <base>active", None),
    (rb"ERR the queue's meta hash holds a setting that is not an integer", None),
    (
        rb"ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead",
        "-ERR <active>, <pending> and <dead> must be <base>active",
    ),
    (rb"ERR max-stalled must be an integer >= 1", None),
    (rb"ERR limit must be an integer >= 1", None),
    (rb"ERR limit exceeds the server's emq\.max-limit", "-ERR limit exceeds the server's emq.max-limit"),
    (rb"ERR a swept job row has a 'stalled' field that is not an integer", None),
    (rb"ERR the metrics:failed 'count' field is not an integer", None),
    (rb"ERR increment or decrement would overflow", None),
    # a recovered (or due) job whose row's level is corrupt: it cannot be put back in its lane
    (rb"ERR the job row's 'priority' field is not an integer from -1000 to 1000", None),
    (
        rb"NOPERM this user has no permissions to access the job rows or metrics derived from <base>",
        "-NOPERM",
    ),
]
ERROR_RE = re.compile(b"|".join(b"(?:%s)" % pattern for pattern, _ in ERRORS))


def test_every_expected_error_is_documented() -> None:
    for pattern, words in ERRORS:
        words = words or "-" + pattern.decode()
        assert words in REFERENCE, f"docs/reference/ does not document {words!r}"


# -- the generators ---------------------------------------------------------

MALFORMED = [
    b"",
    b" 1",
    b"1 ",
    b"+1",
    b"1.5",
    b"1e3",
    b"0x10",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"nan",
    b"inf",
    b"-inf",
    b"-0",
    b"01",
    b"\x001",
    b"1\x00",
    b"\xff",
    b"-1",
    b"0",
]
GOOD_NUMBERS = [b"1", b"2", b"3", b"100", b"60000", b"9007199254740992", b"9223372036854775807"]
IDS = [b"a", b"b", b"c", b"", b"\x00", b"\xff\xfe", b"}{", b"job:a", b"with space", b"a\r\nb"]
BASES = [b"emq:{q}:", b"emq:{q}:", b"emq:{q}:", b"emq:q:", b"", b"{", b"{}", b"\x00{\x00}"]
BIG = [b"x" * MIB, b"1" * MIB, b"\x00" * MIB, b"{" + b"}" * (MIB - 1)]
TYPES = ["zset", "hash", "string", "list", "set"]
FIELD_VALUES = [*MALFORMED, *GOOD_NUMBERS, b"9223372036854775806", b"x" * 64]

FUTURE = 10**12 * 9  # ms: far beyond any run of this test, still an exact score
TOKENS = [b"1", b"2", b"3", b"1-0123456789abcdef", b"2-fedcba9876543210"]
# Settings of <base>meta: retentions (-1 forever, 0 at once, ...) and corrupt ones.
META_VALUES = [b"-1", b"0", b"1", b"1000", b"9007199254740992", b"9007199254740993", b"-2", *MALFORMED[:8]]
SCORES = [b"-inf", b"0", b"1", b"1000", str(FUTURE).encode(), b"+inf", b"9007199254740993"]


def put(kind: str, key: bytes, member: bytes = b"m") -> list[list[bytes]]:
    """Commands that make `key` hold a value of `kind`."""
    return {
        "zset": [[b"ZADD", key, b"0", member]],
        "hash": [[b"HSET", key, b"f", member]],
        "string": [[b"SET", key, member]],
        "list": [[b"RPUSH", key, member]],
        "set": [[b"SADD", key, member]],
    }[kind]


@st.composite
def keyspace(draw: st.DrawFn, base: bytes) -> list[list[bytes]]:
    """A queue under `base`: lapsed and live members, rows of every shape."""
    cmds: list[list[bytes]] = []
    active_kind = draw(st.sampled_from(["zset"] * 6 + ["missing", *TYPES[1:]]))
    ids = draw(st.lists(st.sampled_from(IDS), max_size=5, unique=True))
    if active_kind == "zset":
        for job in ids:
            cmds.append([b"ZADD", base + b"active", draw(st.sampled_from(SCORES)), job])
    elif active_kind != "missing":
        cmds += put(active_kind, base + b"active")
    # <pending> a list; <base>priority and <base>delayed (the v3 lanes) sorted sets: any of them of
    # another type, or holding ids whose rows are anything (a SWEEP moves the due delayed ones)
    for name in (b"pending", b"dead", b"priority", b"delayed"):
        kind = draw(st.sampled_from(["missing"] * 4 + TYPES))
        if kind != "missing":
            cmds += put(kind, base + name, draw(st.sampled_from(IDS)) or b"m")
        if kind == "zset" and name in (b"dead", b"delayed"):  # dead jobs past a retention, due jobs
            for job in draw(st.lists(st.sampled_from(IDS), max_size=3, unique=True)):
                cmds.append([b"ZADD", base + name, draw(st.sampled_from(SCORES[:4])), job])
        if kind == "list" and name == b"pending":  # entries, live or tombstones
            for job in draw(st.lists(st.sampled_from(IDS), max_size=3)):
                cmds.append([b"RPUSH", base + b"pending", job])
    for job in ids:
        row = base + b"job:" + job
        kind = draw(st.sampled_from(["hash"] * 6 + ["missing", "string", "list", "set", "zset"]))
        if kind != "hash":
            if kind != "missing":
                cmds += put(kind, row)
            continue
        fields = [b"state", b"active"]
        for field in (b"attempts", b"stalled"):
            if draw(st.booleans()):
                fields += [field, draw(st.sampled_from(FIELD_VALUES))]
        if draw(st.booleans()):  # the holder's token: a claim's, or one a test names simply
            fields += [b"token", draw(st.sampled_from([*TOKENS, *FIELD_VALUES[:4]]))]
        if draw(st.integers(0, 4)) == 0:
            fields += [b"cancel_requested", draw(st.sampled_from([b"", b"stop"]))]
        if draw(st.integers(0, 4)) == 0:  # a level, right or corrupt (a recovered job goes to its lane)
            fields += [b"priority", draw(st.sampled_from([b"-5", b"0", b"1000", b"1001", *FIELD_VALUES[:4]]))]
        cmds.append([b"HSET", row, *fields])
    meta = draw(st.sampled_from(["missing"] * 4 + ["hash", "hash", "string", "list", "set", "zset"]))
    if meta == "hash":
        setting = draw(
            st.sampled_from(
                [b"dead_ttl_ms", b"done_ttl_ms", b"cancelled_ttl_ms", b"paused", b"stale", b"seq"]
            )
        )
        cmds.append([b"HSET", base + b"meta", setting, draw(st.sampled_from(META_VALUES))])
    elif meta != "missing":
        cmds += put(meta, base + b"meta")
    metric = draw(st.sampled_from(["missing", "missing", "hash", "bad", "string", "list", "set"]))
    metric_key = base + b"metrics:failed"
    if metric == "hash":
        cmds.append([b"HSET", metric_key, b"count", draw(st.sampled_from(FIELD_VALUES))])
    elif metric == "bad":
        cmds.append([b"HSET", metric_key, b"other", b"1"])
    elif metric != "missing":
        cmds += put(metric, metric_key)
    return cmds


def well_formed(draw: st.DrawFn, base: bytes) -> list[bytes]:
    if draw(st.booleans()):
        job = draw(st.sampled_from(IDS))
        # Now and then <job> is another id's row (or another base's): a mismatched pair.
        row_id = job if draw(st.integers(0, 5)) else draw(st.sampled_from(IDS))
        row_base = base if draw(st.integers(0, 7)) else draw(st.sampled_from(BASES))
        return [
            b"EMQ.EXTEND",
            base + b"active",
            row_base + b"job:" + row_id,
            job,
            draw(st.sampled_from([*TOKENS, *FIELD_VALUES[:4]])),
            draw(st.sampled_from([*GOOD_NUMBERS, *MALFORMED])),
        ]
    return [
        b"EMQ.SWEEP",
        base + b"active",
        base + b"pending",
        base + b"dead",
        base,
        draw(st.sampled_from([*GOOD_NUMBERS, *MALFORMED])),
        draw(st.sampled_from([*GOOD_NUMBERS, *MALFORMED])),
    ]


@st.composite
def case(draw: st.DrawFn) -> tuple[list[list[bytes]], list[bytes]]:
    base = draw(st.sampled_from(BASES))
    setup = draw(keyspace(base))
    pool = [
        base,
        base + b"active",
        base + b"pending",
        base + b"dead",
        base + b"metrics:failed",
        *(base + b"job:" + i for i in IDS[:4]),
        *IDS[:4],
        *MALFORMED[:10],
        *GOOD_NUMBERS[:3],
    ]
    arg = st.sampled_from(pool) | st.binary(max_size=16)
    mode = draw(st.sampled_from(["well-formed", "mutated", "mutated", "random"]))
    if mode == "random":
        name = draw(st.sampled_from([b"EMQ.EXTEND", b"EMQ.SWEEP", b"emq.extend", b"Emq.Sweep"]))
        command = [name, *draw(st.lists(arg, max_size=12))]
    else:
        command = well_formed(draw, base)
        if mode == "mutated":
            for _ in range(draw(st.integers(1, 3))):
                how = draw(st.sampled_from(["replace", "repeat", "drop", "add"]))
                i = draw(st.integers(1, max(1, len(command) - 1)))
                if how == "replace" and i < len(command):
                    command[i] = draw(arg)
                elif how == "repeat" and len(command) > 2:
                    command[i if i < len(command) else 1] = command[draw(st.integers(1, len(command) - 1))]
                elif how == "drop" and len(command) > 1:
                    del command[min(i, len(command) - 1)]
                elif how == "add" and len(command) < 13:
                    command.insert(i, draw(arg))
    return setup, command


# -- one case ---------------------------------------------------------------


def members(conn: Resp, key: bytes) -> dict[bytes, bytes]:
    try:
        flat = conn.call(b"ZRANGE", key, b"0", b"-1", b"WITHSCORES")
    except ServerError:
        return {}
    return dict(zip(flat[::2], flat[1::2], strict=True))


def run_case(
    fuzz: FuzzServer, setup: Sequence[Sequence[bytes]], command: list[bytes], stats: Counter[str] = STATS
) -> None:
    conn = fuzz.connect()
    prepared = conn.pipeline([[b"FLUSHALL"], *setup])
    assert not any(isinstance(r, ServerError) for r in prepared), prepared
    before = conn.call(b"DEBUG", b"DIGEST")
    name = command[0].lower()
    sweep = name == b"emq.sweep" and len(command) == 7
    active_before = members(conn, command[1]) if sweep else {}
    dead_before = members(conn, command[3]) if sweep else {}
    # a sweep first moves the due delayed jobs to their lanes (<base>delayed scored by due time)
    due_before = members(conn, command[4] + b"delayed") if sweep and len(command) > 4 else {}
    try:
        reply: Any = conn.call(*command)
        error: bytes | None = None
    except ServerError as exc:
        reply, error = None, exc.message
    except (ConnectionError, OSError) as exc:
        reply, error = exc, None
    try:
        alive = conn.call(b"PING") == b"PONG"
    except (ConnectionError, OSError):
        alive = False
    if not alive:
        stats["crashes"] += 1
        log = fuzz.crashed()
        pytest.fail(f"the server died on {short(command)} after {short(setup)}:\n{log}")
    STATS["cases"] += 1
    argc = len(command) - 1
    if error is not None:
        STATS["errors"] += 1
        assert ERROR_RE.fullmatch(error), f"unclear error {error!r} for {short(command)}"
        OUTCOMES[next(p for p, _ in ERRORS if re.fullmatch(p, error))] += 1
        wrong_arity = argc != (5 if name == b"emq.extend" else 6)
        assert error.startswith(b"ERR wrong number of arguments") == wrong_arity, error
        after = conn.call(b"DEBUG", b"DIGEST")
        if after != before:
            STATS["partial_writes"] += 1
        assert after == before, f"{error!r} but the data changed: {short(command)} after {short(setup)}"
        return
    STATS["values"] += 1
    if name == b"emq.extend":
        assert reply in (1, -1), reply
        OUTCOMES[b"extend :%d" % reply] += 1
        if reply == -1:
            assert conn.call(b"DEBUG", b"DIGEST") == before, "gone (:-1) but the data changed"
        return
    assert isinstance(reply, list) and len(reply) == 4, reply
    recovered, dead, cancelled, expired = reply
    assert isinstance(expired, int) and 0 <= expired <= int(command[6]), reply
    moved = recovered + dead + cancelled
    assert all(isinstance(x, bytes) for x in moved), reply
    OUTCOMES[b"sweep recovered"] += bool(recovered)
    OUTCOMES[b"sweep dead"] += bool(dead)
    OUTCOMES[b"sweep cancelled"] += bool(cancelled)
    OUTCOMES[b"sweep expired"] += bool(expired)
    OUTCOMES[b"sweep nothing"] += not moved and not expired
    promoted = set(due_before) - set(members(conn, command[4] + b"delayed"))
    OUTCOMES[b"sweep promoted"] += bool(promoted)
    if not moved and not expired and not promoted:
        assert conn.call(b"DEBUG", b"DIGEST") == before, "a sweep that took nothing changed the data"
    assert len(set(moved)) == len(moved) and set(moved) <= set(active_before), (reply, active_before)
    active_after = members(conn, command[1])
    assert not set(moved) & set(active_after), "a swept id is still active"
    for job in moved:
        assert float(active_before[job]) <= time.time() * 1000 + 1000, "swept a live lease"
    # Expired dead rows left <dead> with their rows; the jobs that died now joined it.
    dead_after = members(conn, command[3])
    gone = set(dead_before) - set(dead_after)
    assert len(gone) == expired and set(dead) <= set(dead_after), (reply, dead_before, dead_after)
    for job in gone:
        assert conn.call(b"EXISTS", command[4] + b"job:" + job) == 0, "an expired dead row is still there"


def short(value: object, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# -- the cases ----------------------------------------------------------------

_START: list[float] = []


def within_budget() -> bool:
    if not _START:
        _START.append(time.monotonic())
    return time.monotonic() - _START[0] < BUDGET_S


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(c=case())
def test_random_command_lines(fuzz: FuzzServer, c: tuple[list[list[bytes]], list[bytes]]) -> None:
    if not within_budget():
        STATS["skipped_over_budget"] += 1
        return
    setup, command = c
    run_case(fuzz, setup, command)


def standard_state(base: bytes = b"emq:{q}:") -> list[list[bytes]]:
    return [
        [b"HSET", base + b"job:a", b"attempts", b"1", b"token", b"1", b"state", b"active"],
        [b"ZADD", base + b"active", b"0", b"a", str(FUTURE).encode(), b"b"],
        [b"HSET", base + b"job:b", b"attempts", b"2", b"token", b"2", b"stalled", b"1"],
    ]


def grid() -> Iterator[tuple[str, list[list[bytes]], list[bytes]]]:
    """The fixed cases: every arity, every malformed number in every numeric
    position, 1 MiB arguments everywhere, wrong types at every key the
    commands touch, repeated keys in every pair of positions."""
    b = b"emq:{q}:"
    extend = [b"EMQ.EXTEND", b + b"active", b + b"job:a", b"a", b"1", b"1000"]
    sweep = [b"EMQ.SWEEP", b + b"active", b + b"pending", b + b"dead", b, b"2", b"10"]
    state = standard_state()
    for full in (extend, sweep):
        for argc in range(13):
            args = (full[1:] * 3)[:argc]
            yield f"arity {argc}", state, [full[0], *args]
    for number in [*MALFORMED, *GOOD_NUMBERS]:
        yield "lease", state, [*extend[:5], number]
        yield "token", state, [*extend[:4], number, b"1000"]
        yield "max-stalled", state, [*sweep[:5], number, b"10"]
        yield "limit", state, [*sweep[:6], number]
    for big in BIG:
        for i in range(1, 6):
            yield "1 MiB extend", state, [*extend[:i], big, *extend[i + 1 :]]
        for i in range(1, 7):
            yield "1 MiB sweep", state, [*sweep[:i], big, *sweep[i + 1 :]]
        # A 1 MiB id that is lapsed: the sweep derives a 1 MiB row key.
        yield "1 MiB id", [[b"ZADD", b + b"active", b"0", big]], sweep
        big_keys = [big + b"active", big + b"pending", big + b"dead", big]
        yield "1 MiB base", [], [b"EMQ.SWEEP", *big_keys, b"1", b"1"]
    keys = {
        "active": b + b"active",
        "pending": b + b"pending",
        "dead": b + b"dead",
        "row a": b + b"job:a",
        "metrics": b + b"metrics:failed",
    }
    for label, key in keys.items():
        for kind in TYPES:
            wrong = [*state, [b"DEL", key], *put(kind, key)]
            for max_stalled in (b"1", b"5"):
                yield f"{label} is a {kind}", wrong, [*sweep[:5], max_stalled, b"10"]
            yield f"{label} is a {kind}", wrong, extend
    for field in (b"stalled", b"attempts"):
        for value in FIELD_VALUES:
            rows = [*state, [b"HSET", b + b"job:a", field, value]]
            yield f"{field!r}={value!r}", rows, [*sweep[:5], b"1", b"10"]
            yield f"{field!r}={value!r}", rows, [*sweep[:5], b"5", b"10"]
            yield f"{field!r}={value!r}", rows, [*extend[:4], value, b"1000"]
    # A recovered job goes to its level's lane: its row's level, right or corrupt, is read.
    for value in [b"-5", b"1000", b"1001", b"-1001", *FIELD_VALUES]:
        rows = [*state, [b"HSET", b + b"job:a", b"priority", value]]
        yield f"priority={value!r}", rows, [*sweep[:5], b"5", b"10"]
    for value in FIELD_VALUES:
        metric = [*state, [b"HSET", b + b"metrics:failed", b"count", value]]
        for max_stalled in (b"1", b"2"):  # a job dies (the metric is read), or none does
            yield f"count={value!r}", metric, [*sweep[:5], max_stalled, b"10"]
    for full in (extend, sweep):
        for i in range(1, len(full)):
            for j in range(1, len(full)):
                if i != j:
                    repeated = list(full)
                    repeated[i] = full[j]
                    yield f"arg {i} repeats arg {j}", state, repeated
    # <job> must be <id>'s row in <active>'s queue.
    for row in (b + b"job:b", b"emq:{r}:job:a", b + b"job:a:", b + b"jobs:a", b"job:a"):
        yield "mismatched <job>", state, [*extend[:2], row, *extend[3:]]
    yield "<active> not ending in active", state, [extend[0], b + b"pending", *extend[2:]]
    # The queue's settings: the dead retention, and corrupt or wrong-typed meta.
    for value in META_VALUES:
        died = [*state, [b"ZADD", b + b"dead", b"5", b"old"], [b"HSET", b + b"job:old", b"state", b"dead"]]
        yield f"dead_ttl_ms={value!r}", [*died, [b"HSET", b + b"meta", b"dead_ttl_ms", value]], sweep
    for kind in TYPES:
        if kind != "hash":
            yield f"meta is a {kind}", [*state, *put(kind, b + b"meta")], sweep
    # A lapsed job with a cancel request ends cancelled.
    yield "cancel requested", [*state, [b"HSET", b + b"job:a", b"cancel_requested", b"stop"]], sweep
    # A row that vanished while its id stayed active, next to a sound one.
    yield "vanished row", [*state, [b"DEL", b + b"job:a"]], sweep
    yield "vanished row", [*state, [b"DEL", b + b"job:a"]], extend
    yield "swept already", [*state, [b"ZREM", b + b"active", b"a"]], extend


GRID = list(grid())


@pytest.mark.slow
def test_fixed_grid(fuzz: FuzzServer) -> None:
    assert len(GRID) > 500
    for label, setup, command in GRID:
        try:
            run_case(fuzz, setup, command)
        except AssertionError as exc:
            raise AssertionError(f"[{label}] {exc}") from exc
    STATS["grid"] += len(GRID)


def test_the_harness_notices_a_crash(module_so: Path) -> None:
    # "0 crashes" means something only if a crash would be seen.  Plain
    # server even under `make check`: a segfault is valgrind's report too.
    holder, stats = FuzzServer(module_so, wrapper=[]), Counter[str]()
    try:
        with pytest.raises(pytest.fail.Exception, match="the server died on"):
            run_case(holder, [], [b"DEBUG", b"SEGFAULT"], stats)
        assert stats["crashes"] == 1 and holder.server is None
    finally:
        holder.stop()


def test_non_integer_stalled_refuses_the_whole_sweep(fuzz: FuzzServer) -> None:
    # docs/reference/: a non-integer `stalled` in a row about to be swept refuses the
    # sweep, writing nothing -- not even the sound rows swept before it.
    b = b"emq:{q}:"
    conn = fuzz.connect()
    conn.pipeline(
        [
            [b"FLUSHALL"],
            [b"ZADD", b + b"active", b"0", b"sound", b"1", b"corrupt"],
            [b"HSET", b + b"job:sound", b"attempts", b"1"],
            [b"HSET", b + b"job:corrupt", b"attempts", b"1", b"stalled", b"1.5"],
        ]
    )
    before = conn.call(b"DEBUG", b"DIGEST")
    with pytest.raises(ServerError) as info:
        conn.call(b"EMQ.SWEEP", b + b"active", b + b"pending", b + b"dead", b, b"3", b"10")
    assert info.value.message == b"ERR a swept job row has a 'stalled' field that is not an integer"
    assert conn.call(b"DEBUG", b"DIGEST") == before
    # With limit 1 only the sound row is about to be swept: the corrupt one is not read.
    assert conn.call(b"EMQ.SWEEP", b + b"active", b + b"pending", b + b"dead", b, b"3", b"1") == [
        [b"sound"],
        [],
        [],
        0,
    ]


def test_vanished_row_is_recreated_and_recovered(fuzz: FuzzServer) -> None:
    b = b"emq:{q}:"
    conn = fuzz.connect()
    conn.pipeline([[b"FLUSHALL"], [b"ZADD", b + b"active", b"0", b"ghost"]])
    assert conn.call(b"EMQ.SWEEP", b + b"active", b + b"pending", b + b"dead", b, b"3", b"10") == [
        [b"ghost"],
        [],
        [],
        0,
    ]
    assert conn.call(b"HGETALL", b + b"job:ghost") == [b"stalled", b"1", b"state", b"pending"]
    assert conn.call(b"LRANGE", b + b"pending", b"0", b"-1") == [b"ghost"]


def test_derived_keys_outside_the_callers_acl_refuse_the_sweep(fuzz: FuzzServer) -> None:
    # The job rows and the metric are not in the argument list, so Redis
    # cannot check them; the module does, before it writes anything.
    b = b"emq:{q}:"
    conn = fuzz.connect()
    conn.pipeline(
        [
            [b"FLUSHALL"],
            [
                b"ACL",
                b"SETUSER",
                b"narrow",
                b"reset",
                b"on",
                b"nopass",
                b"+@all",
                b"~" + b + b"active",
                b"~" + b + b"pending",
                b"~" + b + b"dead",
                b"~" + b + b"delayed",  # SWEEP moves the due delayed jobs to their lanes
                b"~" + b + b"priority",
                b"%R~" + b + b"meta",  # SWEEP reads the queue's settings on every call
            ],
            [b"ACL", b"SETUSER", b"wide", b"reset", b"on", b"nopass", b"+@all", b"~emq:*"],
            [b"ZADD", b + b"active", b"0", b"j"],
            [b"HSET", b + b"job:j", b"attempts", b"1"],
        ]
    )
    sweep = [b"EMQ.SWEEP", b + b"active", b + b"pending", b + b"dead", b, b"1", b"10"]
    before = conn.call(b"DEBUG", b"DIGEST")
    user = Resp(fuzz.server.port) if fuzz.server else None
    assert user is not None
    try:
        assert user.call(b"AUTH", b"narrow", b"x") == b"OK"
        with pytest.raises(ServerError) as info:
            user.call(*sweep)
        assert info.value.message.startswith(b"NOPERM ") and b"derived from <base>" in info.value.message
        assert conn.call(b"DEBUG", b"DIGEST") == before
        OUTCOMES[ERRORS[-1][0]] += 1
        # A sweep with nothing lapsed derives no row and needs no permission beyond <base>meta.
        conn.call(b"ZADD", b + b"active", b"XX", str(FUTURE).encode(), b"j")
        assert user.call(*sweep) == [[], [], [], 0]
        conn.call(b"ZADD", b + b"active", b"XX", b"0", b"j")
        assert user.call(b"AUTH", b"wide", b"x") == b"OK"
        # From a script, as the permitted user: the same code path, the same result.
        script = b"return redis.call('EMQ.SWEEP', KEYS[1], KEYS[2], KEYS[3], ARGV[1], 1, 10)"
        assert user.call(b"EVAL", script, b"3", *sweep[1:4], b) == [[], [b"j"], [], 0]
    finally:
        user.close()
        conn.call(b"ACL", b"DELUSER", b"narrow", b"wide")
    assert conn.call(b"HGET", b + b"metrics:failed", b"count") == b"1"


def test_sweep_on_a_cluster_node(module_so: Path) -> None:
    # In cluster mode SWEEP also checks <base>'s hash tag.  A client cannot
    # reach the refusal (without a tag in <base>, the three set keys never
    # share a slot, so the cluster answers CROSSSLOT first), but the check
    # itself runs on every cluster sweep.
    with EmbeddedServer(cluster_args(), module=module_so) as node:
        conn = Resp(node.port)
        try:
            assert conn.call(b"CLUSTER", b"ADDSLOTSRANGE", b"0", b"16383") == b"OK"
            deadline = time.monotonic() + 60
            while b"cluster_state:ok" not in conn.call(b"CLUSTER", b"INFO"):
                assert time.monotonic() < deadline, "the one-node cluster never came up"
                time.sleep(0.05)
            b = b"emq:{q}:"
            conn.call(b"ZADD", b + b"active", b"0", b"j")
            sweep = [b"EMQ.SWEEP", b + b"active", b + b"pending", b + b"dead", b, b"3", b"10"]
            assert conn.call(*sweep) == [[b"j"], [], [], 0]
            with pytest.raises(ServerError, match="CROSSSLOT"):
                conn.call(b"EMQ.SWEEP", b"q:active", b"q:pending", b"q:dead", b"q:", b"3", b"10")
        finally:
            conn.close()


@pytest.mark.slow
def test_fuzz_totals(fuzz: FuzzServer) -> None:
    """Runs last in this file: the counts of the run, and no crash at all."""
    if not STATS["grid"]:
        pytest.skip("the totals need the whole file's run (the grid did not run)")
    print(
        f"\nfuzz: {STATS['cases']} cases ({STATS['values']} values, {STATS['errors']} errors), "
        f"{STATS['crashes']} crashes, {STATS['partial_writes']} partial writes, "
        f"{STATS['skipped_over_budget']} generated cases past the {BUDGET_S:.0f} s budget"
    )
    for outcome, n in sorted(OUTCOMES.items()):
        print(f"  {n:6d}  {outcome.decode()}")
    assert STATS["crashes"] == 0 and STATS["partial_writes"] == 0
    # Every reply either command can give was provoked at least once.
    expected = [p for p, _ in ERRORS] + [b"extend :1", b"extend :-1", b"sweep recovered", b"sweep dead",
                                         b"sweep cancelled", b"sweep expired", b"sweep nothing"]  # fmt: skip
    assert not [e for e in expected if not OUTCOMES[e]], "never provoked"
    assert STATS["cases"] >= len(GRID) + min(EXAMPLES, 100), STATS
    assert STATS["errors"] > 0 and STATS["values"] > 0
    assert fuzz.connect().call(b"PING") == b"PONG"
