"""Bad input never hurts the server: the claim path's new options and verb (issue 14, 18).

The harness and rules of test_fuzz.py, for ENQUEUE [DELAY|AT] [REQ],
EMQ.ENQUEUEMANY, FAIL [DELAY] and CLAIM [COUNT] [REQ] [BLOCK]: random
keyspaces and command lines, malformed numbers, binary and repeated ids,
options repeated, mixed and cut short.  After each case: PING answers; the
reply has the verb's shape or is one of the documented errors, word for word
(and in docs/reference/); after an error (or a "gone" :-1) DEBUG DIGEST is
unchanged.  A claim that blocks is ended with CLIENT UNBLOCK from a second
connection after a short wait (and must then answer null), so BLOCK 0 is
fuzzed too; no case may leave a blocked client behind.

Bounded by ``ECHOMQ_FUZZ_CLAIM_PATH_EXAMPLES`` (default 1200) and
``ECHOMQ_FUZZ_SECONDS`` (default 60).  Derandomized.
"""

from __future__ import annotations

import os
import re
import select
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..conftest import supports
from .test_fuzz import BASES, GOOD_NUMBERS, IDS, MALFORMED, FuzzServer, Resp, ServerError, keyspace, short

pytestmark = pytest.mark.memcheck  # make -C module check runs it under valgrind

EXAMPLES = int(os.environ.get("ECHOMQ_FUZZ_CLAIM_PATH_EXAMPLES", "1200"))
WAIT_EXAMPLES = int(os.environ.get("ECHOMQ_FUZZ_WAIT_EXAMPLES", "150"))
BUDGET_S = float(os.environ.get("ECHOMQ_FUZZ_SECONDS", "60"))
BLOCKED_WAIT_S = 0.3  # how long a case lets a claim wait before unblocking it
STATS: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()

VERBS = (b"emq.enqueue", b"emq.enqueuemany", b"emq.fail", b"emq.claim")
ERRORS = [
    rb"ERR wrong number of arguments for 'emq\.(enqueue|enqueuemany|fail|claim)' command",
    rb"ERR <pending> must be <base>pending",
    rb"ERR <pending> and <active> must be <base>pending and <base>active",
    rb"ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead",
    rb"ERR in cluster mode <base> must contain a hash tag, e\.g\. emq:\{queue\}:",
    rb"ERR lease-ms is not an integer",
    rb"ERR lease-ms must be at least 1",
    rb"ERR lease-ms is too large: the deadline would not be an exact score",
    rb"ERR max-attempts must be an integer >= 1",
    rb"ERR COUNT must be an integer >= 1",
    rb"ERR DELAY must be an integer >= 0",
    rb"ERR DELAY is too large: the due time would not be an exact score",
    rb"ERR AT must be an integer >= 0 \(unix time in milliseconds\)",
    rb"ERR AT is too large: the due time would not be an exact score",
    rb"ERR DELAY and AT cannot be used together",
    rb"ERR BLOCK must be an integer >= 0 \(0 waits forever\)",
    rb"ERR BLOCK is too large: the wait would not end at an exact time",
    rb"ERR count must be an integer >= 1",
    rb"ERR count exceeds the server's emq\.max-limit",
    rb"ERR the same id appears twice in one EMQ\.ENQUEUEMANY",
    rb"ERR the REQ request id must not be empty",
    rb"ERR the record of this REQ request id is malformed or another call's",
    rb"ERR syntax error",
    rb"ERR the job row's 'attempts' field is not an integer",
    rb"ERR the job row's 'tries' field is not an integer",
    rb"ERR the metrics:failed 'count' field is not an integer",
    rb"ERR the queue's meta hash holds a setting that is not an integer",
    rb"ERR increment or decrement would overflow",
    rb"WRONGTYPE Operation against a key holding the wrong kind of value",
    rb"EMQSTALE fail token mismatch",
    rb"EMQSTALE job is no longer active",
    rb"EMQEXISTS a job with this id already exists",
    rb"ERR the UNIQUE key must be 1 to 512 bytes long",
    rb"ERR FOR must be an integer from 1 to 2592000000 \(ms: 30 days\)",
    rb"ERR UNTIL takes only 'done' \(a time window is FOR <ms>\)",
    rb"ERR FOR and UNTIL cannot be used together",
    rb"ERR FOR, UNTIL and REPLACE need UNIQUE <key>",
    rb"ERR UNIQUE is for one job: EMQ\.ENQUEUEMANY does not take it",
]
ERROR_RE = re.compile(b"|".join(b"(?:%s)" % p for p in ERRORS))
NUMBERS = [*GOOD_NUMBERS, *MALFORMED]
WHEN = [b"0", b"1", b"250", b"60000", b"5", b"9007199254740992", b"1700000000000"] * 2 + MALFORMED
UNIQUE_KEYS = [b"u", b"u", b"v", b"", b"k" * 512, b"k" * 513, b"\xff"]
BLOCKS = [b"1", b"5", b"0", b"0", b"20"] * 3 + [*MALFORMED[:8], b"-1", b"9007199254740992"]


# The fuzz runs at the highest emq.max-limit a server may set (issue 28): ENQUEUEMANY's
# counts near 2^62 and 2^63 are refused as too many, counts within it that the arguments do
# not hold as a wrong arity -- the comparison that once overflowed.
CEILING = [[b"CONFIG", b"SET", b"emq.max-limit", b"100000"]] if supports("module_configs") else []
MANY_COUNTS = [b"0", b"5", b"10001", b"100000", b"100001", b"99999", b"2147483647", b"2147483648",
               b"4611686018427387903", b"4611686018427387904", b"4611686018427387905",
               b"9223372036854775807", b"9223372036854775808", b"18446744073709551617"]  # fmt: skip
# Request records a retry could find (issue 28): a claim's, an enqueue's, and forged ones --
# malformed, over the 1000 pairs a claim takes, 4 MB of empty items.
RECORDS = [b"1:a1:1", b"1:a1:11:b1:2", b"1", b"2", b"", b"x", b"9:a", b"1:a1:", b"5:ab",
           b"99999999999999:a", b"1:a48:" + b"t" * 48, b"1:a1:1" * 1001, b"0:" * 2_000_000]  # fmt: skip


@pytest.fixture(scope="module")
def fuzz(module_so: Path) -> Iterator[FuzzServer]:
    holder = FuzzServer(module_so, configure=CEILING)
    holder.connect()
    yield holder
    holder.stop()


def options(draw: st.DrawFn, names: list[bytes], values: dict[bytes, list[bytes]]) -> list[bytes]:
    chosen = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
    if chosen and draw(st.integers(0, 7)) == 0:
        chosen.append(draw(st.sampled_from(chosen)))  # an option given twice
    out: list[bytes] = []
    for name in chosen:
        out += [draw(st.sampled_from([name, name.lower()])), draw(st.sampled_from(values[name]))]
    if out and draw(st.integers(0, 9)) == 0:
        out.pop()  # an option without its value
    return out


def well_formed(draw: st.DrawFn, base: bytes) -> list[bytes]:
    verb = draw(st.sampled_from([*VERBS, b"emq.claim", b"emq.claim", b"emq.fail"]))
    job = draw(st.sampled_from([*IDS[:3], *IDS]))
    counts = [b"1", b"2", b"5"] * 3 + NUMBERS
    reqs = [b"r1", b"r1", b"r2", b""]
    when = {b"DELAY": WHEN, b"AT": WHEN, b"REQ": reqs, b"COUNT": counts, b"BLOCK": BLOCKS,
            b"UNIQUE": UNIQUE_KEYS, b"FOR": [b"1", b"60000", b"2592000000", b"2592000001", *WHEN],
            b"UNTIL": [b"done", b"DONE", b"x", b""]}  # fmt: skip
    if verb == b"emq.enqueue":
        opts = options(draw, [b"DELAY", b"AT", b"REQ", b"UNIQUE", b"UNIQUE", b"FOR", b"UNTIL"], when)
        if draw(st.integers(0, 3)) == 0:  # REPLACE takes no value: anywhere among the options
            opts.insert(draw(st.integers(0, len(opts))), draw(st.sampled_from([b"REPLACE", b"replace"])))
        return [b"EMQ.ENQUEUE", base + b"pending", base, job, draw(st.binary(max_size=8)), *opts]
    if verb == b"emq.enqueuemany":
        n = draw(st.integers(1, 4))
        pairs = [x for _ in range(n) for x in (draw(st.sampled_from(IDS)), draw(st.binary(max_size=4)))]
        count = draw(st.sampled_from([str(n).encode()] * 4 + MANY_COUNTS + MALFORMED[:6]))
        opts = options(
            draw, [b"DELAY", b"AT", b"REQ", b"UNIQUE"] if n < 4 else [b"DELAY", b"AT", b"REQ"], when
        )
        return [b"EMQ.ENQUEUEMANY", base + b"pending", base, count, *pairs, *opts]
    if verb == b"emq.fail":
        token = draw(st.sampled_from([b"1", b"1", b"0", b"2", b"x"]))
        opts = options(draw, [b"DELAY"], when) if draw(st.integers(0, 5)) else [b"AT", b"5"]
        return [b"EMQ.FAIL", base + b"active", base + b"pending", base + b"dead", base, job, token,
                draw(st.sampled_from([b"3", b"1", *NUMBERS])), b"e", *opts]  # fmt: skip
    opts = options(draw, [b"COUNT", b"REQ", b"BLOCK"], when)
    lease = draw(st.sampled_from([b"60000", b"1000"] * 5 + NUMBERS))
    return [b"EMQ.CLAIM", base + b"pending", base + b"active", base, lease, *opts]


@st.composite
def case(draw: st.DrawFn) -> tuple[list[list[bytes]], list[bytes]]:
    base = draw(st.sampled_from([b"emq:{q}:"] * 4 + BASES))
    setup = draw(keyspace(base))
    for job in draw(st.lists(st.sampled_from(IDS[:3]), max_size=2, unique=True)):  # held with token 1
        setup.append([b"HSET", base + b"job:" + job, b"attempts", b"1", b"token", b"1", b"state", b"active"])
        setup.append([b"ZADD", base + b"active", b"9007199254740000", job])
    for job in draw(st.lists(st.sampled_from(IDS), max_size=3, unique=True)):  # waiting, some delayed
        due = draw(st.sampled_from([b"now", b"now", b"5", b"9000000000000"]))
        if due == b"now":  # in <pending> (the list); else in <base>delayed, due long ago or far ahead
            setup.append([b"RPUSH", base + b"pending", job])
        else:
            setup.append([b"ZADD", base + b"delayed", due, job])
        if draw(st.booleans()):
            setup.append([b"HSET", base + b"job:" + job, b"request", b"r1", b"state", b"pending"])
    if draw(st.integers(0, 5)) == 0:
        setup.append([b"HSET", base + b"meta", b"paused", b"1"])
    if draw(st.integers(0, 3)) == 0:  # an earlier call's record for REQ r1, or a forged one
        setup.append([b"SET", base + b"req:r1", draw(st.sampled_from(RECORDS[:-1] * 3 + RECORDS[-1:]))])
    pool = [base, base + b"active", base + b"pending", base + b"dead", *IDS[:4], *MALFORMED[:8],
            *GOOD_NUMBERS[:3], b"DELAY", b"AT", b"BLOCK", b"REQ", b"COUNT"]  # fmt: skip
    arg = st.sampled_from(pool) | st.binary(max_size=12)
    mode = draw(st.sampled_from(["well-formed", "well-formed", "mutated", "mutated", "random"]))
    if mode == "random":
        name = draw(st.sampled_from([b"EMQ.ENQUEUE", b"EMQ.ENQUEUEMANY", b"EMQ.FAIL", b"EMQ.CLAIM"]))
        return setup, [name, *draw(st.lists(arg, max_size=14))]
    command = well_formed(draw, base)
    if mode == "mutated":
        for _ in range(draw(st.integers(1, 3))):
            how = draw(st.sampled_from(["replace", "repeat", "drop", "add"]))
            i = draw(st.integers(1, len(command) - 1))
            if how == "replace":
                command[i] = draw(arg)
            elif how == "repeat":
                command[i] = command[draw(st.integers(1, len(command) - 1))]
            elif how == "drop" and len(command) > 2:
                del command[i]
            elif how == "add" and len(command) < 16:
                command.insert(i, draw(arg))
            if len(command) < 2:
                break
    return setup, command


def check_value(command: list[bytes], reply: Any, unblocked: bool) -> str:
    name = command[0].lower()
    if name == b"emq.enqueue":
        if isinstance(reply, list):  # UNIQUE: [1, id] added, [0, holder] held, [2, holder] replaced
            assert len(reply) == 2 and reply[0] in (0, 1, 2) and isinstance(reply[1], bytes), reply
            return ("ok", "held", "replaced")[[1, 0, 2].index(reply[0])]
        assert reply == 1, reply
        return "ok"
    if name == b"emq.enqueuemany":
        assert isinstance(reply, int) and reply == int(command[3]), reply
        return "ok"
    if name == b"emq.fail":
        if reply == -1:
            return "gone"
        assert reply in (b"pending", b"dead", b"cancelled"), reply
        return reply.decode()
    if unblocked:
        assert reply is None, reply  # CLIENT UNBLOCK: the timeout reply
        return "unblocked"
    if reply is None:
        return "empty"
    assert isinstance(reply, list) and reply, reply
    for job in reply:
        assert len(job) == 5 and isinstance(job[0], bytes) and isinstance(job[1], bytes), job
        assert isinstance(job[3], int) and job[3] >= 1 and (job[4] is None or isinstance(job[4], bytes)), job
    return "claimed"


def call_may_block(conn: Resp, control: Resp, command: list[bytes]) -> tuple[Any, bytes | None, bool]:
    """Send one command; a claim still waiting after BLOCKED_WAIT_S is ended by CLIENT UNBLOCK."""
    my_id = conn.call(b"CLIENT", b"ID")
    parts = [b"*%d\r\n" % len(command)]
    for arg in command:
        parts += [b"$%d\r\n" % len(arg), arg, b"\r\n"]
    conn.sock.sendall(b"".join(parts))
    unblocked = False
    if not answered(conn, BLOCKED_WAIT_S) and b"blocked_clients:1" in control.call(b"INFO", b"clients"):
        # 0: it was served meanwhile (a slow server), and its reply is on its way.
        unblocked = control.call(b"CLIENT", b"UNBLOCK", my_id) == 1
    try:
        return conn._read(), None, unblocked
    except ServerError as exc:
        return None, exc.message, unblocked


class Harness:
    def __init__(self, fuzz: FuzzServer) -> None:
        self.fuzz = fuzz
        self.control: Resp | None = None

    def connections(self) -> tuple[Resp, Resp]:
        conn = self.fuzz.connect()
        if self.control is None:
            assert self.fuzz.server is not None
            self.control = Resp(self.fuzz.server.port)
        return conn, self.control

    def reset(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None


@pytest.fixture(scope="module")
def harness(fuzz: FuzzServer) -> Iterator[Harness]:
    h = Harness(fuzz)
    yield h
    h.reset()


def active_of(conn: Resp, key: bytes) -> Any:
    """The members and scores of a claim's <active>, or its type when it is not a sorted set."""
    kind = conn.call(b"TYPE", key)
    return conn.call(b"ZRANGE", key, b"0", b"-1", b"WITHSCORES") if kind == b"zset" else kind


def run_case(h: Harness, setup: list[list[bytes]], command: list[bytes]) -> None:
    conn, control = h.connections()
    prepared = conn.pipeline([[b"FLUSHALL"], *setup])
    refused = [r for r in prepared if isinstance(r, ServerError)]
    assert all(r.message.startswith(b"WRONGTYPE") for r in refused), refused
    before = conn.call(b"DEBUG", b"DIGEST")
    claim = command[0].lower() == b"emq.claim" and len(command) > 2
    active_before = active_of(conn, command[2]) if claim else None
    reply, error, unblocked = call_may_block(conn, control, command)
    try:
        alive = conn.call(b"PING") == b"PONG"
    except (ConnectionError, OSError):
        alive = False
    if not alive:
        STATS["crashes"] += 1
        h.reset()
        pytest.fail(f"the server died on {short(command)} after {short(setup)}:\n{h.fuzz.crashed()}")
    STATS["cases"] += 1
    assert b"blocked_clients:0" in control.call(b"INFO", b"clients"), "a case left a blocked client"
    if error is not None:
        assert ERROR_RE.fullmatch(error), f"unclear error {error!r} for {short(command)}"
        assert not unblocked, "an error after CLIENT UNBLOCK"
        OUTCOMES[error.split(b" ")[0].decode()] += 1
        OUTCOMES[f"error {error[:40].decode(errors='replace')}"] += 1
        OUTCOMES[f"{command[0].lower().decode()} error"] += 1
        kind = "error"
    else:
        kind = check_value(command, reply, unblocked)
        OUTCOMES[f"{command[0].lower().decode()} {kind}"] += 1
    if claim and kind in ("unblocked", "empty"):
        # A claim that took nothing may still have dropped tombstones (entries of <pending> that
        # name no claimable job) and moved due jobs: it made no job active.
        assert active_of(conn, command[2]) == active_before, short(command)
    elif kind in ("error", "gone", "unblocked", "empty", "held"):
        after = conn.call(b"DEBUG", b"DIGEST")
        STATS["partial_writes"] += after != before
        assert after == before, (
            f"{error or reply!r} but the data changed: {short(command)} after {short(setup)}"
        )


_START: list[float] = []


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(c=case())
def test_random_claim_path_command_lines(harness: Harness, c: tuple[list[list[bytes]], list[bytes]]) -> None:
    if not _START:
        _START.append(time.monotonic())
    if time.monotonic() - _START[0] > BUDGET_S:
        STATS["skipped_over_budget"] += 1
        return
    run_case(harness, *c)


# -- waits woken by what happens next -----------------------------------------------------
#
# The same keyspaces, copied into db 0 and db 1.  In db 0 a valid claim blocks
# (its queue has nothing claimable: no job, only delayed ones, or paused);
# then one "waker" runs in both databases: a job enqueued, a due job whose
# row is corrupt put at the head, the queue paused, <pending> deleted or
# retyped, everything flushed.  The claim, served from its reply callback or
# ended by CLIENT UNBLOCK, must answer a valid reply or a documented error;
# when it claimed nothing (an error, or null) db 0 must equal db 1 key by key:
# the reply path wrote nothing either.

WAKERS: list[list[list[bytes]]] = [
    [[b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x"]],
    [[b"EMQ.ENQUEUEMANY", b"{p}", b"{b}", b"2", b"w1", b"x", b"w2", b"y"]],
    [[b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x", b"DELAY", b"30"]],
    [[b"RPUSH", b"{p}", b"{id}"], [b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x"]],
    [[b"HSET", b"{b}job:{id}", b"attempts", b"x"], [b"LPUSH", b"{p}", b"{id}"],
     [b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x"]],
    [[b"ZADD", b"{b}delayed", b"1", b"{id}"],  # a due job (moved to its lane by the woken claim)
     [b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x", b"PRIORITY", b"3"]],
    [[b"HSET", b"{b}meta", b"paused", b"1"], [b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x"]],
    [[b"SET", b"{p}", b"x"]],
    [[b"DEL", b"{p}"], [b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x"]],
    [[b"SET", b"{b}active", b"x"], [b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x"]],
    [[b"FLUSHDB"], [b"EMQ.ENQUEUE", b"{p}", b"{b}", b"w", b"x"]],
]  # fmt: skip


def fill(template: list[bytes], base: bytes, job: bytes) -> list[bytes]:
    out = []
    for part in template:
        part = part.replace(b"{p}", base + b"pending").replace(b"{b}", base).replace(b"{id}", job)
        out.append(part)
    return out


ROW_SHAPES: list[list[bytes] | None] = [
    [b"state", b"pending"],
    [b"state", b"pending", b"attempts", b"2", b"tries", b"1"],
    [b"attempts", b"x"],
    [b"tries", b"9223372036854775807"],
    [b"attempts", b"9223372036854775807"],
    None,  # a string where the row should be
]


@st.composite
def wait_case(draw: st.DrawFn) -> tuple[list[list[bytes]], list[bytes], list[list[bytes]]]:
    b = b"emq:{q}:"
    setup: list[list[bytes]] = []
    for job in IDS[:4]:
        shape = draw(st.sampled_from(ROW_SHAPES))
        if shape is None:
            setup.append([b"SET", b + b"job:" + job, b"x"])
        else:
            setup.append([b"HSET", b + b"job:" + job, *shape])
    for job in draw(st.lists(st.sampled_from(IDS), max_size=3, unique=True)):  # delayed jobs only
        setup.append([b"ZADD", b + b"delayed", b"9000000000000", job])
    for job in draw(st.lists(st.sampled_from(IDS), max_size=2, unique=True)):
        setup.append([b"ZADD", b + b"active", b"9000000000000", job])
    if draw(st.integers(0, 4)) == 0:
        setup.append([b"HSET", b + b"meta", b"paused", b"1"])
    opts = [b"BLOCK", draw(st.sampled_from([b"0", b"5000"]))]
    if draw(st.booleans()):
        opts += [b"COUNT", draw(st.sampled_from([b"1", b"3"]))]
    if draw(st.booleans()):
        opts += [b"REQ", b"r1"]
    claim = [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"60000", *opts]
    waker = [fill(c, b, draw(st.sampled_from(IDS[:4]))) for c in draw(st.sampled_from(WAKERS))]
    return setup, claim, waker


TIME_FIELDS = {b"enqueued_at", b"claimed_at", b"finished_at"}


def db_values(conn: Resp, db: bytes) -> dict[bytes, Any]:
    """What each key of `db` holds, but the server times (the waker ran in the two
    databases a millisecond apart): zsets by members, rows without their times."""
    conn.call(b"SELECT", db)
    values: dict[bytes, Any] = {}
    for key in conn.call(b"KEYS", b"*"):
        kind = conn.call(b"TYPE", key)
        if kind == b"zset":
            values[key] = sorted(conn.call(b"ZRANGE", key, b"0", b"-1"))
        elif kind == b"hash":
            flat = conn.call(b"HGETALL", key)
            values[key] = sorted(
                (f, v) for f, v in zip(flat[::2], flat[1::2], strict=True) if f not in TIME_FIELDS
            )
        else:
            values[key] = conn.call(b"DEBUG", b"DIGEST-VALUE", key)
    conn.call(b"SELECT", b"0")
    return values


def send(conn: Resp, command: list[bytes]) -> None:
    parts = [b"*%d\r\n" % len(command)]
    for arg in command:
        parts += [b"$%d\r\n" % len(arg), arg, b"\r\n"]
    conn.sock.sendall(b"".join(parts))


def read(conn: Resp) -> tuple[Any, bytes | None]:
    try:
        return conn._read(), None
    except ServerError as exc:
        return None, exc.message


def answered(conn: Resp, seconds: float) -> bool:
    return bool(select.select([conn.sock], [], [], seconds)[0])


def run_wait_case(h: Harness, setup: list[list[bytes]], claim: list[bytes], waker: list[list[bytes]]) -> None:
    conn, control = h.connections()
    conn.call(b"FLUSHALL")
    for db in (b"1", b"0"):
        conn.call(b"SELECT", db)
        conn.pipeline(setup)  # a refused setup step (a wrong type) is part of the case
    my_id = conn.call(b"CLIENT", b"ID")
    STATS["wait cases"] += 1
    send(conn, claim)
    deadline = time.monotonic() + 5
    while b"blocked_clients:1" not in control.call(b"INFO", b"clients"):
        if answered(conn, 0.002):  # not a queue to wait on: answered at once
            reply, error = read(conn)
            assert error is None or ERROR_RE.fullmatch(error), error
            OUTCOMES["wait: answered at once"] += 1
            return
        assert time.monotonic() < deadline, "neither answered nor blocked"
    for db in (b"1", b"0"):  # the same waker in both: only db 0 has a waiting claim
        control.call(b"SELECT", db)
        control.pipeline(waker)
    control.call(b"SELECT", b"0")
    unblocked = False
    if not answered(conn, 0.2):  # a waker's DELAY 30 is served by the timer well within this
        unblocked = control.call(b"CLIENT", b"UNBLOCK", my_id) == 1  # 0: served meanwhile
    reply, error = read(conn)
    assert conn.call(b"PING") == b"PONG"
    assert b"blocked_clients:0" in control.call(b"INFO", b"clients"), "a case left a blocked client"
    if error is not None:
        assert ERROR_RE.fullmatch(error), f"unclear error {error!r} from a woken claim"
        OUTCOMES[f"wait: error {error[:40].decode(errors='replace')}"] += 1
    elif unblocked:
        assert reply is None, reply
        OUTCOMES["wait: still waiting, unblocked"] += 1
    else:
        kind = check_value(claim, reply, False)
        OUTCOMES[f"wait: woken, {kind}"] += 1
        if kind == "claimed":
            return
    wrote = f"{error or reply!r} from a woken claim, but it wrote: {short(claim)} {short(waker)}"
    assert db_values(conn, b"0") == db_values(conn, b"1"), f"{wrote} after {short(setup)}"


@pytest.mark.slow
@settings(
    max_examples=WAIT_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(c=wait_case())
def test_random_waits_woken_or_not(
    harness: Harness, c: tuple[list[list[bytes]], list[bytes], list[list[bytes]]]
) -> None:
    if not _START:
        _START.append(time.monotonic())
    if time.monotonic() - _START[0] > 2 * BUDGET_S:
        STATS["skipped_over_budget"] += 1
        return
    run_wait_case(harness, *c)


def grid() -> list[tuple[list[list[bytes]], list[bytes]]]:
    """Each new shape on a queue where it succeeds (or waits), so the fuzz never tests only refusals."""
    b = b"emq:{q}:"
    held = [[b"HSET", b + b"job:h", b"attempts", b"1", b"token", b"1", b"state", b"active"],
            [b"ZADD", b + b"active", b"9007199254740000", b"h"]]  # fmt: skip
    waiting = [[b"HSET", b + b"job:w", b"attempts", b"0", b"state", b"pending"],
               [b"RPUSH", b + b"pending", b"w"]]  # fmt: skip
    return [
        ([], [b"EMQ.ENQUEUE", b + b"pending", b, b"new", b"p", b"DELAY", b"100"]),
        ([], [b"EMQ.ENQUEUE", b + b"pending", b, b"new", b"p", b"AT", b"5", b"REQ", b"r"]),
        ([], [b"EMQ.ENQUEUEMANY", b + b"pending", b, b"2", b"x", b"1", b"y", b"2", b"DELAY", b"5"]),
        (
            held,
            [
                b"EMQ.FAIL",
                b + b"active",
                b + b"pending",
                b + b"dead",
                b,
                b"h",
                b"1",
                b"3",
                b"e",
                b"DELAY",
                b"9",
            ],
        ),
        (waiting, [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000", b"BLOCK", b"0"]),
        (waiting, [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000"]),
        ([], [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000", b"BLOCK", b"0"]),
        ([], [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000", b"BLOCK", b"5"]),
    ]


@pytest.mark.slow
def test_claim_path_grid(harness: Harness) -> None:
    for setup, command in grid():
        run_case(harness, setup, command)


@pytest.mark.slow
def test_claim_path_fuzz_totals() -> None:
    print(f"\nclaim-path fuzz: {dict(STATS)}\n  outcomes: {dict(sorted(OUTCOMES.items()))}")
    assert STATS["crashes"] == 0 and STATS["partial_writes"] == 0
    assert STATS["cases"] >= min(EXAMPLES, 300), STATS
    for value in ("emq.enqueue ok", "emq.enqueuemany ok", "emq.claim claimed", "emq.claim unblocked",
                  "wait: woken, claimed", "wait: still waiting, unblocked"):  # fmt: skip
        assert OUTCOMES[value] > 0, (value, OUTCOMES)
    assert any(k.startswith("wait: error") for k in OUTCOMES), OUTCOMES
    assert OUTCOMES["emq.fail pending"] + OUTCOMES["emq.fail dead"] > 0, OUTCOMES
    for code in ("ERR", "WRONGTYPE", "EMQEXISTS"):
        assert OUTCOMES[code] > 0, OUTCOMES
    for text in ("DELAY must", "AT must", "BLOCK must", "the same id", "count must", "DELAY and AT"):
        assert any(text in k for k in OUTCOMES), (text, OUTCOMES)
