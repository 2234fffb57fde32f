"""Bad input never hurts the server: the lifecycle and remote-cancel verbs.

The same harness and rules as test_fuzz.py (which covers EXTEND and SWEEP):
random keyspaces and command lines for ENQUEUE, CLAIM, COMPLETE, FAIL,
CANCEL and CHECKPOINT, every arity from 0 to 12, malformed numbers, binary
ids, wrong key types, repeated keys.  After each: PING answers; the reply has
the verb's shape or is one of the documented errors, word for word; after an
error (or a "gone" :-1) DEBUG DIGEST is unchanged.

Bounded by ``ECHOMQ_FUZZ_LIFECYCLE_EXAMPLES`` (default 1500) and
``ECHOMQ_FUZZ_SECONDS`` (default 60).  Derandomized, so every run tries the
same cases; a fixed grid makes sure each verb also succeeds at least once.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .test_fuzz import (
    BASES,
    FIELD_VALUES,
    GOOD_NUMBERS,
    IDS,
    MALFORMED,
    FuzzServer,
    ServerError,
    fuzz,  # noqa: F401  (the module-scoped server fixture, used by name)
    keyspace,
    short,
)

EXAMPLES = int(os.environ.get("ECHOMQ_FUZZ_LIFECYCLE_EXAMPLES", "1500"))
BUDGET_S = float(os.environ.get("ECHOMQ_FUZZ_SECONDS", "60"))
STATS: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()

ARITY = {b"emq.enqueue": 4, b"emq.claim": 4, b"emq.complete": 4, b"emq.fail": 8, b"emq.cancel": 4,
         b"emq.checkpoint": 5}  # fmt: skip
ERRORS = [
    rb"ERR wrong number of arguments for 'emq\.(enqueue|claim|complete|fail|cancel|checkpoint)' command",
    rb"ERR <pending> must be <base>pending",
    rb"ERR <pending> and <active> must be <base>pending and <base>active",
    rb"ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead",
    rb"ERR <active> and <job> must be different keys",
    rb"ERR lease-ms is not an integer",
    rb"ERR lease-ms must be at least 1",
    rb"ERR lease-ms is too large: the deadline would not be an exact score",
    rb"ERR max-attempts must be an integer >= 1",
    rb"ERR the job row's 'attempts' field is not an integer",
    rb"ERR the metrics:failed 'count' field is not an integer",
    rb"ERR increment or decrement would overflow",
    rb"WRONGTYPE Operation against a key holding the wrong kind of value",
    rb"EMQSTALE (extend|complete|fail) token mismatch",
    rb"EMQSTALE job is no longer active",
    rb"EMQEXISTS a job with this id already exists",
]
ERROR_RE = re.compile(b"|".join(b"(?:%s)" % p for p in ERRORS))
NUMBERS = [*GOOD_NUMBERS, *MALFORMED]


def well_formed(draw: st.DrawFn, base: bytes) -> list[bytes]:
    job = draw(st.sampled_from([*IDS[:3], *IDS[:3], *IDS]))
    token = draw(st.sampled_from([b"1", b"1", b"1", b"0", b"2", *FIELD_VALUES[:4]]))
    number = st.sampled_from([b"1000", b"1", b"3", b"3", *NUMBERS])
    verb = draw(st.sampled_from(list(ARITY)))
    row = base + b"job:" + job
    return {
        b"emq.enqueue": [b"EMQ.ENQUEUE", base + b"pending", base, job, draw(st.binary(max_size=8))],
        b"emq.claim": [b"EMQ.CLAIM", base + b"pending", base + b"active", base, draw(number)],
        b"emq.complete": [b"EMQ.COMPLETE", base + b"active", row, job, token],
        b"emq.fail": [b"EMQ.FAIL", base + b"active", base + b"pending", base + b"dead", base, job, token,
                      draw(number), draw(st.binary(max_size=8))],
        b"emq.cancel": [b"EMQ.CANCEL", base + b"pending", base, job, draw(st.binary(max_size=8))],
        b"emq.checkpoint": [b"EMQ.CHECKPOINT", base + b"active", row, job, token, draw(number)],
    }[verb]  # fmt: skip


@st.composite
def case(draw: st.DrawFn) -> tuple[list[list[bytes]], list[bytes]]:
    base = draw(st.sampled_from(BASES))
    setup = draw(keyspace(base))
    # Waiting jobs, some with a cancel request.  Best effort: where the
    # keyspace made <pending> or the row another type, these are refused
    # (see run_case) and that type is what the case tests.
    for job in draw(st.lists(st.sampled_from(IDS[:3]), max_size=2, unique=True)):  # held, token 1
        setup.append([b"HSET", base + b"job:" + job, b"attempts", b"1", b"state", b"active"])
        setup.append([b"ZADD", base + b"active", b"9007199254740000", job])
    for job in draw(st.lists(st.sampled_from(IDS), max_size=3, unique=True)):
        setup.append([b"ZADD", base + b"pending", draw(st.sampled_from([b"0", b"5", b"-inf"])), job])
        if draw(st.booleans()):
            setup.append([b"HSET", base + b"job:" + job, b"cancel_requested", b"r"])
    pool = [base, base + b"active", base + b"pending", base + b"dead", *(base + b"job:" + i for i in IDS[:3]),
            *IDS[:4], *MALFORMED[:8], *GOOD_NUMBERS[:3]]  # fmt: skip
    arg = st.sampled_from(pool) | st.binary(max_size=16)
    mode = draw(st.sampled_from(["well-formed", "mutated", "mutated", "random"]))
    if mode == "random":
        name = draw(st.sampled_from([b"EMQ." + v[4:].upper() for v in ARITY]))
        return setup, [name, *draw(st.lists(arg, max_size=12))]
    command = well_formed(draw, base)
    if mode == "mutated":
        for _ in range(draw(st.integers(1, 3))):
            how = draw(st.sampled_from(["replace", "repeat", "drop", "add"]))
            i = draw(st.integers(1, len(command) - 1))
            if how == "replace":
                command[i] = draw(arg)
            elif how == "repeat":
                command[i] = command[draw(st.integers(1, len(command) - 1))]
            elif how == "drop" and len(command) > 1:
                del command[i]
            elif how == "add" and len(command) < 13:
                command.insert(i, draw(arg))
            if len(command) < 2:
                break
    return setup, command


def check_value(name: bytes, reply: Any) -> str:
    """The reply's kind, after checking it has the verb's shape."""
    if reply == -1 and name in (b"emq.complete", b"emq.fail", b"emq.cancel", b"emq.checkpoint"):
        return "gone"
    if name == b"emq.enqueue" or name == b"emq.complete":
        assert reply == 1, reply
        return "ok"
    if name == b"emq.claim":
        if reply is None:
            return "empty"
        assert isinstance(reply, list) and isinstance(reply[0], bytes) and isinstance(reply[1], int), reply
        assert reply[1] >= 1, reply
        return "claimed"
    if name == b"emq.fail":
        assert reply in (b"pending", b"dead", b"cancelled"), reply
        return reply.decode()
    if name == b"emq.cancel":
        assert reply in (b"cancelled", b"requested", b"finished"), reply
        return reply.decode()
    assert isinstance(reply, list) and reply[0] == 1 and (reply[1] is None or isinstance(reply[1], bytes))
    return "checkpoint"


def run_case(fuzz: FuzzServer, setup: list[list[bytes]], command: list[bytes]) -> None:  # noqa: F811
    conn = fuzz.connect()
    prepared = conn.pipeline([[b"FLUSHALL"], *setup])
    refused = [r for r in prepared if isinstance(r, ServerError)]
    assert all(r.message.startswith(b"WRONGTYPE") for r in refused), refused
    before = conn.call(b"DEBUG", b"DIGEST")
    name = command[0].lower()
    try:
        reply: Any = conn.call(*command)
        error: bytes | None = None
    except ServerError as exc:
        reply, error = None, exc.message
    try:
        alive = conn.call(b"PING") == b"PONG"
    except (ConnectionError, OSError):
        alive = False
    if not alive:
        STATS["crashes"] += 1
        pytest.fail(f"the server died on {short(command)} after {short(setup)}:\n{fuzz.crashed()}")
    STATS["cases"] += 1
    if error is not None:
        assert ERROR_RE.fullmatch(error), f"unclear error {error!r} for {short(command)}"
        assert error.startswith(b"ERR wrong number of arguments") == (len(command) - 1 != ARITY[name]), error
        OUTCOMES[error.split(b" ")[0].decode()] += 1
        kind = "error"
    else:
        kind = check_value(name, reply)
        OUTCOMES[f"{name.decode()} {kind}"] += 1
    if kind in ("error", "gone"):
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
    derandomize=True,  # the same cases every run: CI's coverage does not depend on luck
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(c=case())
def test_random_lifecycle_command_lines(fuzz: FuzzServer, c: tuple[list[list[bytes]], list[bytes]]) -> None:  # noqa: F811
    if not _START:
        _START.append(time.monotonic())
    if time.monotonic() - _START[0] > BUDGET_S:
        STATS["skipped_over_budget"] += 1
        return
    run_case(fuzz, *c)


def grid() -> list[tuple[list[list[bytes]], list[bytes]]]:
    """Each verb on a queue where it succeeds, so the fuzz never tests only refusals."""
    b = b"emq:{q}:"
    held = [[b"HSET", b + b"job:h", b"attempts", b"1", b"state", b"active"],
            [b"ZADD", b + b"active", b"9007199254740000", b"h"]]  # fmt: skip
    waiting = [
        [b"HSET", b + b"job:w", b"attempts", b"0", b"state", b"pending"],
        [b"ZADD", b + b"pending", b"5", b"w"],
    ]
    return [
        ([], [b"EMQ.ENQUEUE", b + b"pending", b, b"new", b"p"]),
        (waiting, [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000"]),
        (held, [b"EMQ.COMPLETE", b + b"active", b + b"job:h", b"h", b"1"]),
        (held, [b"EMQ.FAIL", b + b"active", b + b"pending", b + b"dead", b, b"h", b"1", b"3", b"e"]),
        (held, [b"EMQ.FAIL", b + b"active", b + b"pending", b + b"dead", b, b"h", b"1", b"1", b"e"]),
        (held, [b"EMQ.CANCEL", b + b"pending", b, b"h", b"r"]),
        (waiting, [b"EMQ.CANCEL", b + b"pending", b, b"w", b"r"]),
        (held, [b"EMQ.CHECKPOINT", b + b"active", b + b"job:h", b"h", b"1", b"1000"]),
    ]


@pytest.mark.slow
def test_lifecycle_grid(fuzz: FuzzServer) -> None:  # noqa: F811
    for setup, command in grid():
        run_case(fuzz, setup, command)


@pytest.mark.slow
def test_lifecycle_fuzz_totals() -> None:
    print(f"\nlifecycle fuzz: {dict(STATS)}\n  outcomes: {dict(sorted(OUTCOMES.items()))}")
    assert STATS["crashes"] == 0 and STATS["partial_writes"] == 0
    assert STATS["cases"] >= min(EXAMPLES, 300), STATS
    # Every verb answered with a value and with a refusal at least once.
    for verb in ("enqueue", "claim", "complete", "fail", "cancel", "checkpoint"):
        assert any(k.startswith(f"emq.{verb} ") for k in OUTCOMES), (verb, OUTCOMES)
    for code in ("ERR", "WRONGTYPE", "EMQSTALE", "EMQEXISTS"):
        assert OUTCOMES[code] > 0, OUTCOMES
    for value in (
        "emq.complete ok",
        "emq.checkpoint checkpoint",
        "emq.claim claimed",
        "emq.cancel requested",
    ):
        assert OUTCOMES[value] > 0, (value, OUTCOMES)
    assert OUTCOMES["emq.fail pending"] + OUTCOMES["emq.fail dead"] + OUTCOMES["emq.fail cancelled"] > 0
