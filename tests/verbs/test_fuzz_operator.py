"""Bad input never hurts the server: the operator's verbs (issue 13).

The harness and rules of test_fuzz.py and test_fuzz_lifecycle.py, for
RETRY, RETRYDEAD, PURGE, RETENTION, PAUSE, RESUME, OBLITERATE, FORGET and LIMIT:
random keyspaces (dead members with rows in every state, a meta hash with
good and corrupt settings, wrong key types) and command lines of every
arity, malformed numbers and options.  After each: PING answers; the reply
has the verb's shape or is one of the documented errors, word for word (and
the reference pages document each); after an error, a "gone" :-1 or a no-op, DEBUG
DIGEST is unchanged.

Bounded by ``ECHOMQ_FUZZ_OPERATOR_EXAMPLES`` (default 1500) and
``ECHOMQ_FUZZ_SECONDS`` (default 60).  Derandomized; a fixed grid makes sure
each verb also succeeds.
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
    GOOD_NUMBERS,
    IDS,
    MALFORMED,
    REFERENCE,
    FuzzServer,
    ServerError,
    fuzz,  # noqa: F401  (the module-scoped server fixture, used by name)
    keyspace,
    short,
)

pytestmark = pytest.mark.memcheck  # make -C module check runs it under valgrind

EXAMPLES = int(os.environ.get("ECHOMQ_FUZZ_OPERATOR_EXAMPLES", "1500"))
BUDGET_S = float(os.environ.get("ECHOMQ_FUZZ_SECONDS", "60"))
STATS: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()

VERBS = [
    b"retry",
    b"retrydead",
    b"purge",
    b"retention",
    b"pause",
    b"resume",
    b"obliterate",
    b"forget",
    b"limit",
]


def arity_ok(name: bytes, n: int) -> bool:
    """Whether `n` arguments (after the name) pass the verb's arity check."""
    return {
        b"retry": n == 4,
        b"retrydead": n >= 4,
        b"purge": n >= 3,
        b"retention": n >= 2,
        b"pause": n == 2,
        b"resume": n == 2,
        b"obliterate": n in (5, 6),
        b"forget": n >= 3,
        b"limit": n >= 2,
    }[name]


# Each error, with the words the reference (docs/reference/) documents it by (None: the text itself).
ERRORS = [
    (rb"ERR wrong number of arguments for 'emq\.(%s)' command" % b"|".join(VERBS),
     "-ERR wrong number of arguments"),
    (rb"ERR <dead> and <pending> must be <base>dead and <base>pending", None),
    (rb"ERR <dead> must be <base>dead", None),
    (rb"ERR <pending> must be <base>pending", None),
    (rb"ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead", None),
    (rb"ERR limit must be an integer >= 1", None),
    (rb"ERR limit exceeds the server's emq\.max-limit", "-ERR limit exceeds the server's emq.max-limit"),
    (
        rb"ERR the number of ids exceeds the server's emq\.max-limit",
        "-ERR the number of ids exceeds the server's emq.max-limit",
    ),
    (rb"ERR UNTIL must be an integer \(server ms\)", "-ERR UNTIL must be an integer (server ms)"),
    (rb"ERR syntax error", None),
    (
        rb"ERR a retention must be -1 \(keep forever\) or an integer from 0 to 9007199254740992 \(ms\)",
        "-ERR a retention must be -1 (keep forever) or an integer from 0 to 9007199254740992 (ms)",
    ),
    (rb"ERR the queue's meta hash holds a setting that is not an integer", None),
    (rb"ERR the job row's 'retries' field is not an integer", None),
    (rb"ERR increment or decrement would overflow", None),
    (rb"WRONGTYPE Operation against a key holding the wrong kind of value", "-WRONGTYPE"),
    (rb"EMQSTATE the job is (pending|active|done): only a dead or cancelled job can be retried",
     "-EMQSTATE the job is"),
    (rb"EMQSTATE the job has no known state: only a dead or cancelled job can be retried", None),
    (rb"EMQBUSY the queue has active jobs: obliterate it with FORCE to delete them too", None),
    (rb"ERR RATE must be an integer from 1 to 1000000000", None),
    (rb"ERR PER must be an integer from 1 to 86400000 \(ms\)",
     "-ERR PER must be an integer from 1 to 86400000 (ms)"),
    (rb"ERR BACKOFF must be an integer from 0 to 86400000 \(ms\)",
     "-ERR BACKOFF must be an integer from 0 to 86400000 (ms)"),
    (rb"ERR the queue's limit hash holds a field that is not a valid integer", None),
]  # fmt: skip
ERROR_RE = re.compile(b"|".join(b"(?:%s)" % p for p, _ in ERRORS))


def test_every_operator_error_is_documented() -> None:
    for pattern, words in ERRORS:
        words = words or "-" + pattern.decode()
        assert words in REFERENCE, f"docs/reference/ does not document {words!r}"


STATES = [b"dead", b"dead", b"dead", b"cancelled", b"pending", b"active", b"done", b"", b"weird"]
RETENTIONS = [b"-1", b"0", b"1000", b"9007199254740992", *MALFORMED[:6], b"-2"]
# Limits beyond emq.max-limit (10,000 by default) too, up to 2^63 - 1 (issue 28).
NUMBERS = [b"1", b"2", b"10", *GOOD_NUMBERS[:3], *MALFORMED, b"10001", b"100001", b"4611686018427387905",
           b"9223372036854775807"]  # fmt: skip
LIMIT_VALUES = [b"1", b"5", b"1000", b"0", b"86400000", b"86400001", b"1000000001", *MALFORMED[:6]]
TOO_MANY_IDS = [b"i%d" % i for i in range(10_001)]  # one more id than emq.max-limit


@st.composite
def case(draw: st.DrawFn) -> tuple[list[list[bytes]], list[bytes]]:
    base = draw(st.sampled_from(BASES))
    setup = draw(keyspace(base))
    # Dead members and their rows, in every state and shape.
    for job in draw(st.lists(st.sampled_from(IDS), max_size=4, unique=True)):
        setup.append([b"ZADD", base + b"dead", draw(st.sampled_from([b"0", b"5", b"1000"])), job])
        row = base + b"job:" + job
        if draw(st.booleans()):
            state = draw(st.sampled_from(STATES))
            setup.append([b"HSET", row, b"state", state, b"attempts", b"2", b"tries", b"2"])
            if draw(st.booleans()):
                retries = draw(st.sampled_from([b"1", b"x", b"9223372036854775807"]))
                setup.append([b"HSET", row, b"retries", retries])
            if draw(st.booleans()):
                setup.append(
                    [b"HSET", row, b"closed_by", b"fail:dead", b"finished_at", b"5", b"cancel_requested", b""]
                )
    if draw(st.booleans()):
        fields = [b"done_ttl_ms", b"cancelled_ttl_ms", b"dead_ttl_ms", b"paused"]
        for f in draw(st.lists(st.sampled_from(fields), max_size=3, unique=True)):
            setup.append([b"HSET", base + b"meta", f, draw(st.sampled_from(RETENTIONS))])
    elif draw(st.integers(0, 9)) == 0:
        setup.append([b"SET", base + b"meta", b"x"])
    if draw(st.booleans()):  # the rate limit: good, corrupt, or a rate half there
        fields = [b"max", b"per_ms", b"window", b"used", b"backoff_until"]
        for f in draw(st.lists(st.sampled_from(fields), max_size=5, unique=True)):
            setup.append([b"HSET", base + b"limit", f, draw(st.sampled_from(LIMIT_VALUES))])
    elif draw(st.integers(0, 9)) == 0:
        setup.append([b"SET", base + b"limit", b"x"])
    pool = [base, base + b"active", base + b"pending", base + b"dead", *IDS[:4], *MALFORMED[:8], b"UNTIL",
            b"FORCE", b"DONE", b"CANCELLED", b"DEAD", b"-1", b"0", b"1000", b"RATE", b"PER", b"OFF",
            b"BACKOFF"]  # fmt: skip
    arg = st.sampled_from(pool) | st.binary(max_size=12)
    mode = draw(st.sampled_from(["well-formed", "well-formed", "mutated", "mutated", "random"]))
    verb = draw(st.sampled_from(VERBS))
    name = b"EMQ." + verb.upper()
    if mode == "random":
        return setup, [name, *draw(st.lists(arg, max_size=10))]
    job = draw(st.sampled_from([*IDS[:3], *IDS]))
    n = draw(st.sampled_from(NUMBERS))
    options: list[bytes] = []
    if verb in (b"retrydead", b"purge") and draw(st.booleans()):
        options = [b"UNTIL", draw(st.sampled_from([b"0", b"5", b"9999999999999", b"-1", *MALFORMED[:4]]))]
    if verb == b"limit":
        for opt in draw(
            st.lists(st.sampled_from([b"RATE", b"PER", b"OFF", b"BACKOFF", b"rate"]), max_size=4)
        ):
            options += [opt] if opt == b"OFF" else [opt, draw(st.sampled_from(LIMIT_VALUES))]
    if verb == b"retention":
        for opt in draw(st.lists(st.sampled_from([b"DONE", b"CANCELLED", b"DEAD", b"done"]), max_size=3)):
            options += [opt, draw(st.sampled_from(RETENTIONS))]
    command = {
        b"retry": [name, base + b"dead", base + b"pending", base, job],
        b"retrydead": [name, base + b"dead", base + b"pending", base, n, *options],
        b"purge": [name, base + b"dead", base, n, *options],
        b"retention": [name, base + b"pending", base, *options],
        b"pause": [name, base + b"pending", base],
        b"limit": [name, base + b"pending", base, *options],
        b"resume": [name, base + b"pending", base],
        b"obliterate": [name, base + b"active", base + b"pending", base + b"dead", base, n,
                        *([b"FORCE"] if draw(st.booleans()) else [])],
        b"forget": [name, base + b"pending", base, *draw(st.lists(st.sampled_from(IDS), min_size=1,
                                                                    max_size=4))],
    }[verb]  # fmt: skip
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
            elif how == "add" and len(command) < 12:
                command.insert(i, draw(arg))
            if len(command) < 2:
                break
    return setup, command


def check_value(name: bytes, reply: Any) -> tuple[str, bool]:
    """The reply's kind after checking its shape, and whether it wrote nothing."""
    verb = name[4:]
    if verb == b"retry":
        assert reply in (b"pending", -1), reply
        return ("gone", True) if reply == -1 else ("retried", False)
    if verb in (b"retrydead", b"obliterate"):
        assert isinstance(reply, list) and len(reply) == 2, reply
        assert all(isinstance(v, int) and v >= 0 for v in reply), reply
        if verb == b"retrydead":
            return ("nothing" if reply == [0, 0] else "retried"), reply == [0, 0]
        return ("done" if reply[1] == 0 else "step"), False
    if verb in (b"purge", b"forget"):
        assert isinstance(reply, int) and reply >= 0, reply
        return ("nothing" if reply == 0 else "deleted"), reply == 0
    if verb == b"limit":
        assert isinstance(reply, list) and len(reply) == 5 and all(v >= 0 for v in reply), reply
        assert (reply[0] == 0) == (reply[1] == 0), reply
        return "limit", False
    if verb == b"retention":
        assert isinstance(reply, list) and len(reply) == 3 and all(v >= -1 for v in reply), reply
        return "policy", False
    assert reply in (0, 1), reply
    return ("changed" if reply else "unchanged"), reply == 0


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
        wrong_arity = not arity_ok(name[4:], len(command) - 1)
        assert error.startswith(b"ERR wrong number of arguments") == wrong_arity, error
        OUTCOMES[error.split(b" ")[0].decode()] += 1
        ERRORED.add(error)
        unchanged = True
    else:
        kind, unchanged = check_value(name, reply)
        OUTCOMES[f"{name.decode()} {kind}"] += 1
    if unchanged:
        after = conn.call(b"DEBUG", b"DIGEST")
        STATS["partial_writes"] += after != before
        what = f"{short(command)} after {short(setup)}"
        assert after == before, f"{error or reply!r} but the data changed: {what}"


_START: list[float] = []
ERRORED: set[bytes] = set()


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(c=case())
def test_random_operator_command_lines(fuzz: FuzzServer, c: tuple[list[list[bytes]], list[bytes]]) -> None:  # noqa: F811
    if not _START:
        _START.append(time.monotonic())
    if time.monotonic() - _START[0] > BUDGET_S:
        STATS["skipped_over_budget"] += 1
        return
    run_case(fuzz, *c)


def grid() -> list[tuple[list[list[bytes]], list[bytes]]]:
    """Each verb on a queue where it does something."""
    b = b"emq:{q}:"
    dead = [[b"HSET", b + b"job:d", b"state", b"dead", b"attempts", b"1", b"tries", b"1"],
            [b"ZADD", b + b"dead", b"5", b"d"]]  # fmt: skip
    done = [[b"HSET", b + b"job:f", b"state", b"done"]]
    held = [[b"HSET", b + b"job:h", b"state", b"active"], [b"ZADD", b + b"active", b"5", b"h"]]
    return [
        (dead, [b"EMQ.RETRY", b + b"dead", b + b"pending", b, b"d"]),
        (dead, [b"EMQ.RETRYDEAD", b + b"dead", b + b"pending", b, b"10"]),
        (dead, [b"EMQ.PURGE", b + b"dead", b, b"10", b"UNTIL", b"5"]),
        ([], [b"EMQ.RETENTION", b + b"pending", b, b"DONE", b"0", b"DEAD", b"-1"]),
        ([], [b"EMQ.PAUSE", b + b"pending", b]),
        ([[b"HSET", b + b"meta", b"paused", b"1"]], [b"EMQ.RESUME", b + b"pending", b]),
        (dead + held, [b"EMQ.OBLITERATE", b + b"active", b + b"pending", b + b"dead", b, b"1", b"FORCE"]),
        (dead + held, [b"EMQ.OBLITERATE", b + b"active", b + b"pending", b + b"dead", b, b"10"]),
        (done, [b"EMQ.FORGET", b + b"pending", b, b"f", b"f", b"d"]),
        ([], [b"EMQ.LIMIT", b + b"pending", b, b"RATE", b"5", b"PER", b"1000", b"BACKOFF", b"10"]),
        (
            [[b"HSET", b + b"limit", b"max", b"5", b"per_ms", b"10"]],
            [b"EMQ.LIMIT", b + b"pending", b, b"OFF"],
        ),
        ([[b"HSET", b + b"limit", b"max", b"x"]], [b"EMQ.LIMIT", b + b"pending", b]),
        (held, [b"EMQ.RETRY", b + b"dead", b + b"pending", b, b"h"]),
        # beyond emq.max-limit: refused whole, nothing written
        (dead, [b"EMQ.RETRYDEAD", b + b"dead", b + b"pending", b, b"10001"]),
        (dead, [b"EMQ.PURGE", b + b"dead", b, b"4611686018427387905"]),
        (dead + held, [b"EMQ.OBLITERATE", b + b"active", b + b"pending", b + b"dead", b, b"10001", b"FORCE"]),
        (done, [b"EMQ.FORGET", b + b"pending", b, b"f", *TOO_MANY_IDS]),
        (done, [b"EMQ.FORGET", b + b"pending", b, *TOO_MANY_IDS[:-1]]),  # at the ceiling: runs
    ]


@pytest.mark.slow
def test_operator_grid(fuzz: FuzzServer) -> None:  # noqa: F811
    for setup, command in grid():
        run_case(fuzz, setup, command)


@pytest.mark.slow
def test_operator_fuzz_totals() -> None:
    print(f"\noperator fuzz: {dict(STATS)}\n  outcomes: {dict(sorted(OUTCOMES.items()))}")
    assert STATS["crashes"] == 0 and STATS["partial_writes"] == 0
    assert STATS["cases"] >= min(EXAMPLES, 300), STATS
    for verb in VERBS:
        assert any(k.startswith(f"emq.{verb.decode()} ") for k in OUTCOMES), (verb, OUTCOMES)
    for code in ("ERR", "WRONGTYPE", "EMQSTATE", "EMQBUSY"):
        assert OUTCOMES[code] > 0, OUTCOMES
    for words in (b"ERR limit exceeds the server's emq.max-limit",
                  b"ERR the number of ids exceeds the server's emq.max-limit"):  # fmt: skip
        assert words in ERRORED, sorted(ERRORED)
    for value in (
        "emq.retry retried",
        "emq.retrydead retried",
        "emq.purge deleted",
        "emq.obliterate step",
        "emq.forget deleted",
        "emq.pause changed",
        "emq.resume changed",
        "emq.retention policy",
        "emq.limit limit",
    ):
        assert OUTCOMES[value] > 0, (value, OUTCOMES)
