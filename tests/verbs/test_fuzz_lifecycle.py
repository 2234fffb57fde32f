"""Bad input never hurts the server: the lifecycle and remote-cancel verbs.

The same harness and rules as test_fuzz.py (which covers EXTEND and SWEEP):
random keyspaces and command lines for ENQUEUE, CLAIM, COMPLETE, FAIL,
CANCEL and CHECKPOINT, every arity from 0 to 12, malformed numbers, binary
ids, wrong key types, repeated keys, ENQUEUE's and CLAIM's options (COUNT,
REQ: good, repeated, unknown, empty; ENQUEUE's AFTER and its policy), mismatched <job>/<id> pairs, corrupt
`tries` and queue settings (<base>meta).  After each: PING answers; the reply
has the verb's shape (CLAIM: null or jobs [id, token, payload, attempt,
state], tokens "<attempts>-<16 hex>") or is one of the documented errors,
word for word; after an error, a "gone" :-1, or a reply that the contract
says writes nothing (CLAIM's null or a retried REQ, a retried ENQUEUE,
COMPLETE or FAIL, CANCEL of a finished job or a second request) DEBUG DIGEST
is unchanged.

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
    REFERENCE,
    TOKENS,
    FuzzServer,
    ServerError,
    fuzz,  # noqa: F401  (the module-scoped server fixture, used by name)
    keyspace,
    short,
)

pytestmark = pytest.mark.memcheck  # make -C module check runs it under valgrind

EXAMPLES = int(os.environ.get("ECHOMQ_FUZZ_LIFECYCLE_EXAMPLES", "1500"))
BUDGET_S = float(os.environ.get("ECHOMQ_FUZZ_SECONDS", "60"))
STATS: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()
PROVOKED: Counter[bytes] = Counter()  # how often each documented error was answered

# The arguments before the options; ENQUEUE and CLAIM take options after them.
ARITY = {b"emq.enqueue": 4, b"emq.claim": 4, b"emq.complete": 4, b"emq.fail": 8, b"emq.cancel": 4,
         b"emq.checkpoint": 5, b"emq.completeclaim": 6}  # fmt: skip
WITH_OPTIONS = (
    b"emq.enqueue",
    b"emq.claim",
    b"emq.checkpoint",
    b"emq.fail",
    b"emq.completeclaim",
    b"emq.complete",
)
# Every error the verbs may answer here, with the words the reference's tables (docs/reference/)
# document it by (None: "-" and the error itself).
ERRORS: list[tuple[bytes, str | None]] = [
    (rb"ERR wrong number of arguments for "
     rb"'emq\.(enqueue|claim|complete|completeclaim|fail|cancel|checkpoint)' command",
     "-ERR wrong number of arguments"),
    (rb"ERR <pending> must be <base>pending", None),
    (rb"ERR <pending> and <active> must be <base>pending and <base>active", None),
    (rb"ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead", None),
    (rb"ERR <active> and <job> must be different keys", None),
    (rb"ERR <job> must be <base>job:<id>, where <active> is <base>active", None),
    (rb"ERR lease-ms is not an integer", None),
    (rb"ERR lease-ms must be at least 1", None),
    (rb"ERR lease-ms is too large: the deadline would not be an exact score", "-ERR lease-ms is too large"),
    (rb"ERR max-attempts must be an integer >= 1", None),
    (rb"ERR COUNT must be an integer >= 1", None),
    (rb"ERR syntax error", None),
    (rb"ERR the REQ request id must not be empty", None),
    (rb"ERR the record of this REQ request id is malformed or another call's", None),
    (rb"ERR the job row's 'attempts' field is not an integer", None),
    (rb"ERR the job row's 'tries' field is not an integer", None),
    (rb"ERR the metrics:failed 'count' field is not an integer", None),
    (rb"ERR the queue's meta hash holds a setting that is not an integer", None),
    (rb"ERR the queue's limit hash holds a field that is not a valid integer", None),
    (rb"ERR increment or decrement would overflow", None),
    (rb"WRONGTYPE Operation against a key holding the wrong kind of value", "-WRONGTYPE ..."),
    (rb"EMQSTALE extend token mismatch", None),
    (rb"EMQSTALE complete token mismatch", None),
    (rb"EMQSTALE fail token mismatch", None),
    (rb"EMQSTALE job is no longer active", None),
    (rb"EMQEXISTS a job with this id already exists", "-EMQEXISTS ..."),
    # the v3 keyspace's (PRIORITY, the row's level, the ceilings on what a row holds)
    (rb"ERR PRIORITY must be an integer from -1000 to 1000", None),
    (rb"ERR the job row's 'priority' field is not an integer from -1000 to 1000", None),
    (rb"ERR DELAY must be an integer >= 0", None),
    (rb"ERR DELAY is too large: the due time would not be an exact score", None),
    (rb"ERR the TRACE is larger than 65536 bytes", None),
    (rb"ERR the progress is larger than emq.max-state-bytes", None),
    (rb"ERR the checkpoint state is larger than emq.max-state-bytes", None),
    # groups' (issue 45): a bad name, a count a hand edit broke
    (rb"ERR GROUP must be 1 to 128 bytes of letters, digits and -_\.:@", "-ERR GROUP must be 1 to 128 bytes"),
    (rb"ERR the group hash's 'active' field is not an integer from 0 to 2\^53", "'active' field is not an"),
    # dependencies' (issue 46): AFTER and its options
    (rb"ERR AFTER takes at most 1000 dependencies", None),
    (rb"ERR a dependency id must not be empty", None),
    (rb"ERR a job cannot depend on itself", None),
    (rb"ERR ON_PARENT_FAILURE must be fail, ignore or continue", None),
    (rb"ERR MISSING takes only 'done' \(without it a missing dependency is refused\)",
     "-ERR MISSING takes only 'done' (without it a missing dependency is refused)"),
    (rb"ERR ON_PARENT_FAILURE and MISSING need AFTER <id> \.\.\.",
     "-ERR ON_PARENT_FAILURE and MISSING need AFTER"),
    (rb"ERR dependency [^\r\n]* does not exist", "-ERR dependency <dep-id> does not exist"),
]  # fmt: skip
ERROR_RE = re.compile(b"|".join(b"(?:%s)" % p for p, _ in ERRORS))
NUMBERS = [*GOOD_NUMBERS, *MALFORMED]
TOKEN_RE = re.compile(rb"-?[0-9]+-[0-9a-f]{16}")  # -: a corrupt, negative attempts counts on
REQS = [b"r1", b"r1", b"r2", b"", b"\x00", b"x" * 40]
# Request records that are not a claim's (issue 28): malformed, too many pairs, an enqueue's,
# and large ones whose items a claim must not allocate for: 4 MB of empty items, 2^20 pairs.
FORGED_RECORDS = [b"", b"x", b"9:a", b"1:a", b"1:a1:", b"1:a48:" + b"t" * 48, b"99999999999999:a", b"5:ab",
                  b"1", b"2", b"1:a1:1" * 1001, b"0:" * 2_000_000, b"1:a1:1" * (1 << 20)]  # fmt: skip


def test_every_expected_error_is_documented() -> None:
    for pattern, words in ERRORS:
        words = words or "-" + pattern.decode()
        assert words in REFERENCE, f"docs/reference/ does not document {words!r}"


# Each verb's options and their values: mostly good, some not.  DEAD is a flag (no value).
OPTION_NAMES = {
    b"emq.enqueue": [b"REQ", b"req", b"PRIORITY", b"priority", b"DELAY", b"GROUP", b"group"],
    b"emq.claim": [b"COUNT", b"REQ", b"count", b"Req"],
    b"emq.completeclaim": [b"COUNT", b"REQ", b"RESULT"],
    b"emq.complete": [b"RESULT", b"result"],
    b"emq.fail": [b"DELAY", b"TRACE", b"trace", b"DEAD", b"dead"],
    b"emq.checkpoint": [b"STATE", b"PROGRESS", b"progress"],
}
PRIORITIES = [b"0", b"-1", b"5", b"-1000", b"1000", b"1001", b"-1001", *MALFORMED[:6]]
PIECED = [b"", b"p", b"x" * 64, b"y" * 65, b"z" * 1024, b"w" * 1025, bytes(range(256))]


@st.composite
def options(draw: st.DrawFn, verb: bytes) -> list[bytes]:
    """A verb's options: mostly good, some not."""
    names = OPTION_NAMES[verb]
    out: list[bytes] = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        name = draw(st.sampled_from([*names, *names, *names, b"LIMIT", b""]))
        if name.upper() == b"DEAD":
            out.append(name)
            continue
        if name.upper() == b"COUNT":
            value = draw(st.sampled_from([b"1", b"2", b"5", b"1001", *MALFORMED[:12]]))
        elif name.upper() == b"PRIORITY":
            value = draw(st.sampled_from(PRIORITIES))
        elif name.upper() == b"GROUP":
            value = draw(st.sampled_from([b"g1", b"g1", b"g2", b"t:3@x", b"", b"a b", b"x" * 129]))
        elif name.upper() == b"DELAY":
            value = draw(st.sampled_from([b"0", b"1", b"600000", *MALFORMED[:6]]))
        elif name.upper() in (b"RESULT", b"TRACE", b"PROGRESS", b"STATE"):
            value = draw(st.sampled_from(PIECED))
        else:
            value = draw(st.sampled_from(REQS))
        out += [name, value]
    if out and draw(st.integers(0, 7)) == 0:
        out.pop()  # an option without its value
    return out


@st.composite
def after(draw: st.DrawFn, job: bytes) -> list[bytes]:
    """ENQUEUE's dependencies (issue 46), the last option: mostly none, some ids (live, ended,
    missing, itself), a policy and MISSING, good and bad."""
    if draw(st.integers(0, 3)):
        return []
    out: list[bytes] = []
    if draw(st.booleans()):
        out += [b"ON_PARENT_FAILURE", draw(st.sampled_from([b"fail", b"ignore", b"CONTINUE", b"", b"maybe"]))]
    if draw(st.integers(0, 3)) == 0:
        out += [b"MISSING", draw(st.sampled_from([b"done", b"DONE", b"yes"]))]
    if draw(st.integers(0, 9)):
        ids = draw(st.lists(st.sampled_from([*IDS, job, b""]), max_size=4))
        out += [b"AFTER", *ids]
    return out


def well_formed(draw: st.DrawFn, base: bytes) -> list[bytes]:
    job = draw(st.sampled_from([*IDS[:3], *IDS[:3], *IDS]))
    token = draw(st.sampled_from([b"1", b"1", b"1", b"0", *TOKENS, *FIELD_VALUES[:4]]))
    number = st.sampled_from([b"1000", b"1", b"3", b"3", *NUMBERS])
    verb = draw(st.sampled_from(list(ARITY)))
    # Now and then <job> is another id's row: a mismatched pair (COMPLETE, CHECKPOINT).
    row = base + b"job:" + (job if draw(st.integers(0, 5)) else draw(st.sampled_from(IDS)))
    return {
        b"emq.enqueue": [b"EMQ.ENQUEUE", base + b"pending", base, job, draw(st.binary(max_size=8)),
                         *draw(options(b"emq.enqueue")), *draw(after(job))],
        b"emq.claim": [b"EMQ.CLAIM", base + b"pending", base + b"active", base, draw(number),
                       *draw(options(b"emq.claim"))],
        b"emq.complete": [b"EMQ.COMPLETE", base + b"active", row, job, token,
                          *draw(options(b"emq.complete"))],
        b"emq.completeclaim": [b"EMQ.COMPLETECLAIM", base + b"active", row, base + b"pending", job, token,
                               draw(number), *draw(options(b"emq.completeclaim"))],
        b"emq.fail": [b"EMQ.FAIL", base + b"active", base + b"pending", base + b"dead", base, job, token,
                      draw(number), draw(st.binary(max_size=8)), *draw(options(b"emq.fail"))],
        b"emq.cancel": [b"EMQ.CANCEL", base + b"pending", base, job, draw(st.binary(max_size=8))],
        b"emq.checkpoint": [b"EMQ.CHECKPOINT", base + b"active", row, job, token, draw(number),
                            *draw(options(b"emq.checkpoint"))],
    }[verb]  # fmt: skip


@st.composite
def case(draw: st.DrawFn) -> tuple[list[list[bytes]], list[bytes]]:
    base = draw(st.sampled_from(BASES))
    setup = draw(keyspace(base))
    # Waiting jobs, some with a cancel request.  Best effort: where the
    # keyspace made <pending> or the row another type, these are refused
    # (see run_case) and that type is what the case tests.
    for job in draw(st.lists(st.sampled_from(IDS[:3]), max_size=2, unique=True)):  # held, token 1
        row = base + b"job:" + job
        setup.append([b"HSET", row, b"attempts", b"1", b"tries", b"1", b"token", b"1", b"state", b"active"])
        setup.append([b"ZADD", base + b"active", b"9007199254740000", job])
    for job in draw(st.lists(st.sampled_from(IDS[:3]), max_size=2, unique=True)):  # a hold that ended
        row = base + b"job:" + job
        closed_by = draw(st.sampled_from([b"complete", b"fail", b"release", b"other"]))
        where = draw(st.sampled_from([b"pending", b"dead", b"cancelled"]))
        state = {b"complete": b"done", b"fail": where, b"release": b"pending"}.get(closed_by, b"pending")
        if closed_by in (b"fail", b"release"):
            closed_by += b":" + state  # where the first call sent the job
        setup.append([b"HSET", row, b"attempts", b"1", b"token", b"1", b"closed_by", closed_by,
                      b"state", state])  # fmt: skip
        setup.append([b"ZREM", base + b"active", job])
    for job in draw(st.lists(st.sampled_from(IDS), max_size=3, unique=True)):
        # waiting in a lane (<pending>, or <base>priority at a level), or delayed (due or not)
        lane = draw(st.sampled_from(["pending", "pending", "priority", "delayed"]))
        if lane == "pending":
            setup.append([b"RPUSH", base + b"pending", job])
        elif lane == "priority":
            level = draw(st.sampled_from([-3, 2]))
            setup.append([b"ZADD", base + b"priority", str((level + 1024) * 2**42 + 1).encode(), job])
            setup.append([b"HSET", base + b"job:" + job, b"priority", str(level).encode()])
        else:
            setup.append([b"ZADD", base + b"delayed", draw(st.sampled_from([b"0", b"5", b"+inf"])), job])
        if draw(st.integers(0, 3)):  # a row that says pending (else a tombstone, or a row of another job)
            setup.append(
                [
                    b"HSET",
                    base + b"job:" + job,
                    b"state",
                    b"pending",
                    b"payload",
                    draw(st.sampled_from(PIECED)),
                ]
            )
        if draw(st.booleans()):
            setup.append([b"HSET", base + b"job:" + job, b"cancel_requested", b"r"])
        if draw(st.integers(0, 3)) == 0:
            setup.append([b"HSET", base + b"job:" + job, b"tries", draw(st.sampled_from(FIELD_VALUES))])
        if draw(st.integers(0, 3)) == 0:
            setup.append([b"HSET", base + b"job:" + job, b"request", draw(st.sampled_from(REQS[:3]))])
    record = draw(st.sampled_from(["missing"] * 4 + ["record", "record", "garbage", "hash"]))
    if record == "record":  # an earlier CLAIM with REQ r1 took job a with token 1 (and b with 2)
        setup.append([b"SET", base + b"req:r1", draw(st.sampled_from([b"1:a1:1", b"1:a1:11:b1:2"]))])
    elif record == "garbage":
        forged = draw(st.sampled_from(FORGED_RECORDS[:10] * 4 + FORGED_RECORDS[10:]))
        setup.append([b"SET", base + b"req:r1", forged])
    elif record == "hash":
        setup.append([b"HSET", base + b"req:r1", b"f", b"v"])
    # the rate limit every claim reads (issue 32): a rate, a spent window, a back-off, corrupt
    # fields, or another type
    limit = draw(st.sampled_from(["missing"] * 6 + ["rate", "spent", "backoff", "bad", "string"]))
    if limit == "rate":
        setup.append([b"HSET", base + b"limit", b"max", b"2", b"per_ms", b"60000"])
    elif limit == "spent":  # a window reaching far into the future, used up
        setup.append([b"HSET", base + b"limit", b"max", b"1", b"per_ms", b"86400000", b"used", b"1",
                      b"window", b"9007199254740992"])  # fmt: skip
    elif limit == "backoff":
        setup.append([b"HSET", base + b"limit", b"backoff_until", b"9007199254740992"])
    elif limit == "bad":
        field = draw(st.sampled_from([b"max", b"per_ms", b"window", b"used", b"backoff_until"]))
        setup.append([b"HSET", base + b"limit", field, draw(st.sampled_from([b"x", b"-1", b"0", b"1.5"]))])
    elif limit == "string":
        setup.append([b"SET", base + b"limit", b"x"])
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


def check_value(name: bytes, reply: Any, fresh_tokens: bool = True) -> str:
    """The reply's kind, after checking it has the verb's shape.

    A CLAIM that claimed hands out fresh tokens; one that re-answered an
    earlier request (``fresh_tokens`` False) repeats the tokens recorded then."""
    if reply == -1 and name in (b"emq.complete", b"emq.fail", b"emq.cancel", b"emq.checkpoint"):
        return "gone"
    if name == b"emq.enqueue" or name == b"emq.complete":
        assert reply == 1, reply
        return "ok"
    if name == b"emq.claim":
        if reply is None:
            return "empty"
        assert isinstance(reply, list) and 1 <= len(reply) <= 1000, reply
        for job in reply:
            assert isinstance(job, list) and len(job) == 5, job
            job_id, token, payload, attempt, state = job
            assert isinstance(job_id, bytes) and isinstance(payload, bytes) and isinstance(attempt, int), job
            assert state is None or isinstance(state, bytes), job
            assert isinstance(token, bytes) and (TOKEN_RE.fullmatch(token) or not fresh_tokens), job
        assert len({job[0] for job in reply}) == len(reply), "one job claimed twice in one call"
        return "claimed"
    if name == b"emq.completeclaim":
        assert isinstance(reply, list) and len(reply) == 2 and reply[0] in (1, -1), reply
        if reply[1] is None:
            return "gone" if reply[0] == -1 else "completed"
        check_value(b"emq.claim", reply[1], fresh_tokens=False)  # a REQ may re-answer its first jobs
        return "claimed"
    if name == b"emq.fail":
        assert reply in (b"pending", b"dead", b"cancelled"), reply
        return reply.decode()
    if name == b"emq.cancel":
        assert reply in (b"cancelled", b"requested", b"finished"), reply
        return reply.decode()
    assert isinstance(reply, list) and reply[0] == 1 and (reply[1] is None or isinstance(reply[1], bytes))
    return "checkpoint"


def probe(conn: Any, *command: bytes) -> Any:
    try:
        return conn.call(*command)
    except ServerError:
        return None


def lanes_move(conn: Any, base: bytes) -> bool:
    """Whether a claim on `base` would write even when it takes nothing: the queue runs, and
    <pending> has entries (tombstones are dropped), <base>priority members (one whose row is
    gone or not pending is dropped as a tombstone too) or <base>delayed due members (moved to
    their lanes)."""
    if probe(conn, b"HEXISTS", base + b"meta", b"paused") == 1:
        return False
    entries = probe(conn, b"LLEN", base + b"pending") or 0
    seconds, micros = conn.call(b"TIME")
    now = int(seconds) * 1000 + int(micros) // 1000 + 1000  # a member due within the call counts
    due = probe(conn, b"ZCOUNT", base + b"delayed", b"-inf", str(now).encode()) or 0
    levels = probe(conn, b"ZCARD", base + b"priority") or 0
    return bool(entries or due or levels)


def writes_nothing(conn: Any, command: list[bytes]) -> set[str]:
    """Before the command: the reply kinds that, on this data, must write nothing.

    CLAIM: null (nothing claimable), or anything when its REQ was answered before
    (<base>req:<rid> exists: a retry re-answers).  ENQUEUE: :1 for a row that
    exists (its own request's retry).  COMPLETE / FAIL: success for an id not in
    <active> (a retry, answered from closed_by).  CANCEL: +finished, and
    +requested when a request is stored already."""
    name, n = command[0].lower(), len(command)
    quiet = {"error", "gone"}
    if name == b"emq.claim":
        if n >= 4 and not lanes_move(conn, command[3]):
            quiet.add("empty")  # a claim that takes nothing may still drop tombstones, move due jobs
        opts = command[5:]
        if n >= 5 and n % 2 == 1:
            reqs = [opts[i + 1] for i in range(0, len(opts), 2) if opts[i].upper() == b"REQ"]
            if reqs and probe(conn, b"TYPE", command[3] + b"req:" + reqs[-1]) == b"string":
                quiet.add("claimed")
    elif name == b"emq.enqueue" and n >= 4:  # a retry: its request's record exists
        opts = command[5:]
        reqs = [opts[i + 1] for i in range(0, len(opts) - 1, 2) if opts[i].upper() == b"REQ"]
        if reqs and probe(conn, b"EXISTS", command[2] + b"req:" + reqs[0]):
            quiet.add("ok")
    elif name in (b"emq.complete", b"emq.fail") and n >= 6:
        job_id = command[3] if name == b"emq.complete" else command[5]
        if probe(conn, b"ZSCORE", command[1], job_id) is None:
            quiet.update(("ok", "pending", "dead", "cancelled"))
    elif name == b"emq.completeclaim" and n >= 7:
        quiet.discard("gone")  # the complete half is gone, and the claim half may move the lanes
        # nothing to complete, and the claim half found nothing to move
        if probe(conn, b"ZSCORE", command[1], command[4]) is None and not lanes_move(conn, command[1][:-6]):
            quiet.update(("completed", "gone"))
    elif name == b"emq.cancel" and n >= 4:
        quiet.add("finished")
        if probe(conn, b"HEXISTS", command[2] + b"job:" + command[3], b"cancel_requested"):
            quiet.add("requested")
    return quiet


def run_case(fuzz: FuzzServer, setup: list[list[bytes]], command: list[bytes]) -> None:  # noqa: F811
    conn = fuzz.connect()
    prepared = conn.pipeline([[b"FLUSHALL"], *setup])
    refused = [r for r in prepared if isinstance(r, ServerError)]
    assert all(r.message.startswith(b"WRONGTYPE") for r in refused), refused
    quiet = writes_nothing(conn, command)
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
        argc = len(command) - 1
        wrong_arity = argc < ARITY[name] if name in WITH_OPTIONS else argc != ARITY[name]
        assert error.startswith(b"ERR wrong number of arguments") == wrong_arity, error
        OUTCOMES[error.split(b" ")[0].decode()] += 1
        PROVOKED[next(p for p, _ in ERRORS if re.fullmatch(p, error))] += 1
        kind = "error"
    else:
        reanswered = name == b"emq.claim" and "claimed" in quiet
        kind = check_value(name, reply, fresh_tokens=not reanswered)
        if reanswered and kind == "claimed":  # the recorded jobs, still held with the recorded token
            base = command[3]
            for job_id, token, *_ in reply:
                assert conn.call(b"HGET", base + b"job:" + job_id, b"token") == token, (reply, command)
                assert conn.call(b"ZSCORE", command[2], job_id) is not None, (reply, command)
            kind = "reanswered"
        OUTCOMES[f"{name.decode()} {kind}"] += 1
    if kind in quiet or kind == "reanswered":
        after = conn.call(b"DEBUG", b"DIGEST")
        STATS["partial_writes"] += after != before
        STATS["quiet"] += 1
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
    """Each verb on a queue where it succeeds, each retry path, and each error
    at least once, so the fuzz never tests only refusals and provokes every
    documented error whatever the random cases did."""
    b = b"emq:{q}:"
    held = [[b"HSET", b + b"job:h", b"attempts", b"1", b"tries", b"1", b"token", b"1", b"state", b"active"],
            [b"ZADD", b + b"active", b"9007199254740000", b"h"]]  # fmt: skip
    # rows as an older version wrote them (attempts=0, request) and as v3 writes them
    waiting = [
        [b"HSET", b + b"job:w", b"attempts", b"0", b"tries", b"0", b"state", b"pending", b"request", b"r1"],
        [b"RPUSH", b + b"pending", b"w"],
        [b"HSET", b + b"job:x", b"state", b"pending", b"payload", b"y" * 65, b"payload:1", b"y"],
        [b"RPUSH", b + b"pending", b"x"],
    ]
    ranked = [  # a job at level -3 and one at level 2, and a tombstone in <pending>
        [b"HSET", b + b"job:u", b"state", b"pending", b"priority", b"-3"],
        [b"ZADD", b + b"priority", str(1021 * 2**42 + 1).encode(), b"u"],
        [b"HSET", b + b"job:v", b"state", b"pending", b"priority", b"2"],
        [b"ZADD", b + b"priority", str(1026 * 2**42 + 2).encode(), b"v"],
        [b"HSET", b + b"job:t", b"state", b"cancelled"],
        [b"RPUSH", b + b"pending", b"t"],
        [b"HSET", b + b"meta", b"stale", b"1", b"seq", b"2"],
    ]

    def ended(closed_by: bytes, state: bytes) -> list[list[bytes]]:
        row = b + b"job:h"
        return [[b"HSET", row, b"attempts", b"1", b"token", b"1", b"state", state, b"closed_by", closed_by]]

    def row(field: bytes, value: bytes) -> list[list[bytes]]:
        return [*waiting, [b"HSET", b + b"job:w", field, value]]

    enqueue = [b"EMQ.ENQUEUE", b + b"pending", b, b"new", b"p"]
    claim = [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000"]
    complete = [b"EMQ.COMPLETE", b + b"active", b + b"job:h", b"h", b"1"]
    fail = [b"EMQ.FAIL", b + b"active", b + b"pending", b + b"dead", b, b"h", b"1", b"3", b"e"]
    cancel = [b"EMQ.CANCEL", b + b"pending", b, b"w", b"r"]
    checkpoint = [b"EMQ.CHECKPOINT", b + b"active", b + b"job:h", b"h", b"1", b"1000"]
    bad_meta = [b"HSET", b + b"meta", b"done_ttl_ms", b"soon"]
    return [
        # each verb succeeds
        ([], enqueue),
        ([], [*enqueue, b"REQ", b"r1"]),
        (waiting, claim),
        (waiting, [*claim, b"COUNT", b"5", b"REQ", b"r1"]),
        (held, complete),
        (held, fail),
        (held, [*fail[:7], b"1", b"e"]),
        ([*held, [b"HSET", b + b"job:h", b"cancel_requested", b"r"]], fail),
        ([*held, *waiting], [*cancel[:3], b"h", b"r"]),
        (waiting, cancel),
        (held, checkpoint),
        # retries and no-ops: they answer, and write nothing
        ([*waiting, [b"SET", b + b"req:r1", b"1"]], [*enqueue[:3], b"w", b"p", b"req", b"r1"]),
        ([[b"SET", b + b"req:r1", b"1"]], [*enqueue, b"REQ", b"r1"]),  # the job ran and is gone: answered
        ([*held, [b"SET", b + b"req:r1", b"1:h1:1"], *waiting], [*claim, b"REQ", b"r1"]),
        ([*held, [b"HSET", b + b"job:h", b"token", b"1-0123456789abcdef"],
          [b"SET", b + b"req:r1", b"1:h18:1-0123456789abcdef1:w18:1-0123456789abcdef"], *waiting],
         [*claim, b"COUNT", b"2", b"REQ", b"r1"]),
        ([[b"SET", b + b"req:r1", b"1:h1:1"], *waiting], [*claim, b"REQ", b"r1"]),
        ([*waiting, [b"HSET", b + b"meta", b"paused", b"1"]], claim),
        ([[b"ZADD", b + b"delayed", b"+inf", b"later"], [b"HSET", b + b"job:later", b"state", b"pending"]],
         claim),
        (ranked, [*claim, b"COUNT", b"3"]),  # u, then the tombstone dropped, then v
        ([*ranked, *waiting], [*claim, b"COUNT", b"5"]),
        ([*ranked, [b"ZADD", b + b"delayed", b"1", b"u"], [b"ZREM", b + b"priority", b"u"]], claim),
        ([], [*enqueue, b"PRIORITY", b"-7", b"DELAY", b"0"]),
        # a group's count (issue 45): moved by a claim and a complete; corrupt, met by both
        ([], [*enqueue, b"GROUP", b"g1"]),
        ([], [*enqueue, b"GROUP", b"a b"]),
        ([[b"HSET", b + b"job:w", b"state", b"pending", b"group", b"g1"], [b"RPUSH", b + b"pending", b"w"]],
         claim),
        ([[b"HSET", b + b"job:w", b"state", b"pending", b"group", b"g1"], [b"RPUSH", b + b"pending", b"w"],
          [b"HSET", b + b"group:g1", b"active", b"x"]], claim),
        ([*held, [b"HSET", b + b"job:h", b"group", b"g1"], [b"HSET", b + b"group:g1", b"active", b"1"]],
         complete),
        ([*held, [b"HSET", b + b"job:h", b"group", b"g1"], [b"HSET", b + b"group:g1", b"active", b"-1"]],
         complete),
        ([], [*enqueue, b"priority", b"1000", b"DELAY", b"60000"]),
        # dependencies (issue 46): a waiter on a live job, resolved by its complete; every refusal
        (held, [*enqueue, b"AFTER", b"h"]),
        ([*held, [b"HSET", b + b"job:h", b"waiters", b"1"], [b"ZADD", b + b"waiters:h", b"1", b"new"],
          [b"HSET", b + b"job:new", b"state", b"waiting", b"waits", b"1", b"after", b"1"],
          [b"HSET", b + b"deps:new", b"h", b"waiting"]], complete),
        (held, [*enqueue, b"AFTER", *(b"x%d" % i for i in range(1001))]),
        (held, [*enqueue, b"AFTER", b"h", b""]),
        (held, [*enqueue, b"AFTER", b"new"]),
        (held, [*enqueue, b"AFTER", b"nope"]),
        (held, [*enqueue, b"ON_PARENT_FAILURE", b"maybe", b"AFTER", b"h"]),
        (held, [*enqueue, b"MISSING", b"yes", b"AFTER", b"h"]),
        (held, [*enqueue, b"MISSING", b"done"]),
        ([], [enqueue[0], *enqueue[1:4], b"q" * 1025]),
        (held, [*complete, b"RESULT", b"r" * 1024]),
        (held, [*fail, b"TRACE", b"Traceback\n", b"DEAD"]),
        ([*held, [b"HSET", b + b"job:h", b"priority", b"-9"]], [*fail, b"DELAY", b"0"]),
        ([*held, [b"HSET", b + b"job:h", b"traceback", b"old"]], [*fail[:7], b"1", b"e", b"dead"]),
        (held, [*checkpoint, b"PROGRESS", b"50%", b"STATE", b"s" * 65]),
        (ended(b"complete", b"done"), complete),
        (ended(b"fail:dead", b"dead"), fail),
        (ended(b"fail:pending", b"pending"), fail),
        ([*ended(b"complete", b"done"), *waiting], [*cancel[:3], b"h", b"r"]),
        # every error
        ([], [b"EMQ.COMPLETE", b + b"active"]),
        ([], [b"EMQ.ENQUEUE", b"emq:{r}:pending", b, b"new", b"p"]),
        ([], [b"EMQ.CLAIM", b + b"pending", b"emq:{r}:active", b, b"1000"]),
        # the rate limit (issue 32): corrupt, a back-off in force, a window spent
        ([*waiting, [b"HSET", b + b"limit", b"max", b"x", b"per_ms", b"10"]],
         [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000"]),
        ([*waiting, [b"HSET", b + b"limit", b"backoff_until", b"9007199254740992"]],
         [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000", b"COUNT", b"5"]),
        ([*waiting, [b"HSET", b + b"limit", b"max", b"1", b"per_ms", b"10"]],
         [b"EMQ.CLAIM", b + b"pending", b + b"active", b, b"1000", b"COUNT", b"5"]),
        (held, [*fail[:3], b"emq:{r}:dead", *fail[4:]]),
        (held, [complete[0], complete[1], complete[1], *complete[3:]]),
        (held, [complete[0], complete[1], b + b"job:w", *complete[3:]]),
        (held, [*checkpoint[:2], b"emq:{r}:job:h", *checkpoint[3:]]),
        (waiting, [*claim[:4], b"x"]),
        (waiting, [*claim[:4], b"0"]),
        (waiting, [*claim[:4], b"9007199254740992"]),
        (held, [*fail[:7], b"0", b"e"]),
        (waiting, [*claim, b"COUNT", b"0"]),
        (waiting, [*claim, b"COUNT"]),
        ([], [*enqueue, b"REQ", b"a", b"REQ", b"b"]),
        ([], [*enqueue, b"REQ", b""]),
        (waiting, [*claim, b"REQ", b""]),
        (row(b"attempts", b"x"), claim),
        (row(b"tries", b"1.5"), claim),
        (row(b"attempts", b"9223372036854775807"), claim),
        ([*held, [b"HSET", b + b"job:h", b"tries", b"x"]], fail),
        ([*held, [b"HSET", b + b"metrics:failed", b"count", b"x"]], [*fail[:7], b"1", b"e"]),
        ([*waiting, bad_meta], claim),
        ([*held, bad_meta], complete),
        ([*held, bad_meta], fail),
        ([*waiting, bad_meta], cancel),
        ([[b"SET", b + b"pending", b"x"]], claim),
        ([*held, [b"SET", b + b"req:r1", b"x"], [b"DEL", b + b"req:r1"], [b"RPUSH", b + b"req:r1", b"x"]],
         [*claim, b"REQ", b"r1"]),
        ([*held, [b"SET", b + b"req:r1", b"1"]], [*claim, b"REQ", b"r1"]),  # an enqueue's record
        ([*held, [b"SET", b + b"req:r1", b"0:" * 2_000_000]], [*claim, b"REQ", b"r1"]),  # 4 MB forged
        (held, [*checkpoint[:4], b"2", b"1000"]),
        (held, [*complete[:4], b"2"]),
        (held, [*fail[:6], b"1-0123456789abcdef", *fail[7:]]),
        ([[b"HSET", b + b"job:h", b"attempts", b"1", b"token", b"1"]], complete),
        ([], [*enqueue, b"PRIORITY", b"1001"]),
        ([], [*enqueue, b"PRIORITY", b"x"]),
        ([], [*enqueue, b"DELAY", b"-1"]),
        ([], [*enqueue, b"DELAY", b"9007199254740992"]),
        ([*held, [b"HSET", b + b"job:h", b"priority", b"high"]], fail),
        (held, [*fail, b"TRACE", b"t" * 65537]),
        (held, [*checkpoint, b"PROGRESS", b"p" * 65537]),
        (held, [*checkpoint, b"STATE", b"s" * 65537]),
        (waiting, [*enqueue[:3], b"w", b"p"]),
    ]  # fmt: skip


@pytest.mark.slow
def test_lifecycle_grid(fuzz: FuzzServer) -> None:  # noqa: F811
    for setup, command in grid():
        try:
            run_case(fuzz, setup, command)
        except AssertionError as exc:
            raise AssertionError(f"{short(command)} after {short(setup)}: {exc}") from exc
    STATS["grid"] += 1


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
        "emq.enqueue ok",
        "emq.complete ok",
        "emq.checkpoint checkpoint",
        "emq.claim claimed",
        "emq.claim reanswered",
        "emq.claim empty",
        "emq.cancel requested",
        "emq.cancel cancelled",
        "emq.cancel finished",
        "emq.fail pending",
        "emq.fail dead",
        "emq.fail cancelled",
    ):
        assert OUTCOMES[value] > 0, (value, OUTCOMES)
    if STATS["grid"]:  # every documented error was answered at least once
        assert not [p for p, _ in ERRORS if not PROVOKED[p]], "never provoked"
    assert STATS["quiet"] > 0
