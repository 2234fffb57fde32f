"""The scripts backend against the module: the same random traces, compared after every step.

One server with the module loaded holds two queues: ``m`` gets each command as
the module's EMQ.* command, ``s`` gets the same command line (its keys named
for ``s``) as the scripts backend sends it (``echomq._scripts.render``: FCALL
of the library, FUNCTION LOAD where it is missing; in every fourth trace
EVALSHA of one script per verb, EVAL on NOSCRIPT, the client's fallback).
A trace mixes every verb with bad input: wrong key types, corrupt row fields
and settings, malformed and out-of-range numbers, unknown, repeated and
value-less options, wrong arities, mismatched keys (another queue's, a wrong
suffix, another id's row), stale, forged and junk tokens -- and harness
writes that lapse leases and damage the data the same way on both queues.  After every step:

- the two replies must be the same bytes (RESP2 in even traces, RESP3 in odd
  ones), once the random part of each fencing token is masked;
- every key of the two queues must be equal: type, value, every field, every
  member and score, the expiry;
- the keyspace events each command fired (and the cancel announcements it
  published) must be the same sequence, key for key.

Only what necessarily differs is normalised, and each is asserted on its own:

- **tokens** ``<attempts>-<16 hex>``: the random part is masked for the
  comparison; separately, every token a claim hands out (on both queues) has
  the shape, its counter is the row's ``attempts``, the row's ``token`` is
  it, and no random part ever repeats;
- **server times** (``enqueued_at``, ``claimed_at``, ``finished_at``,
  ``checkpoint_at``, the time scores of ``pending``/``active``/``dead``,
  expiry times): the two commands run a few microseconds apart, so they may
  read different milliseconds.  They may differ by at most the step's own
  duration (the server clock read before and after it), and every time a
  step writes must lie inside that window.  The scripts queue's times are
  then set to the module queue's, so that ties between equal scores (claim
  order) stay the same in both.

The server's settings that scripts cannot read (``emq.max-limit``,
``emq.max-state-bytes``) are set low (8, 16 bytes) so the traces reach them,
and the scripts are given the same values (``ScriptLimits``).

``test_a_wrong_script_is_caught`` swaps in a deliberately wrong CLAIM (it
forgets to bump ``attempts``) and requires the differential to fail.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from echomq import _scripts
from echomq.keyspace import QueueKeys, queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory, needs
from ..resp import RawConnection, ReplyError, parse
from .test_backends import error_table

pytestmark = needs("script_flags", "script flags (#!lua shebangs) are Redis 7.0+")

SEEDS = range(int(os.environ.get("ECHOMQ_DIFF_SEEDS", "16")))
STEPS = int(os.environ.get("ECHOMQ_DIFF_STEPS", "320"))
MAX_LIMIT, MAX_STATE_BYTES = 8, 16
MAX_PAYLOAD_BYTES, MAX_RESULT_BYTES = 1100, 1030  # above the pieces' 1 KiB, so both shapes are met
LIMITS = _scripts.ScriptLimits(
    max_limit=MAX_LIMIT,
    max_state_bytes=MAX_STATE_BYTES,
    max_payload_bytes=MAX_PAYLOAD_BYTES,
    max_result_bytes=MAX_RESULT_BYTES,
)

TOKEN = re.compile(rb"(-?[0-9]+)-([0-9a-f]{16})")
TIME_FIELDS = {b"enqueued_at", b"claimed_at", b"finished_at", b"checkpoint_at"}
# times a step writes in the future (server-now + a back-off, issue 32): resynced as TIME_FIELDS,
# never inside the step's window
LATER_FIELDS = {b"backoff_until", b"due"}
TIME_SETS = (b"active", b"dead", b"delayed")
A_TIME = 10**12  # scores and fields above this are server times (2001 on), not counters

UNIQUE_KEYS = [b"u1", b"u2", "ü".encode(), b"\xff:k"]
UNIQUE_BAD = [[b"UNIQUE", b""], [b"UNIQUE", b"k" * 513], [b"UNIQUE", b"k", b"FOR", b"0"],
              [b"UNIQUE", b"k", b"FOR", b"2592000001"], [b"UNIQUE", b"k", b"FOR", b"-1"],
              [b"UNIQUE", b"k", b"UNTIL", b"x"], [b"UNIQUE", b"k", b"FOR", b"5", b"UNTIL", b"done"],
              [b"REPLACE"], [b"FOR", b"5"], [b"UNTIL", b"done"], [b"UNIQUE", b"k", b"UNIQUE", b"j"],
              [b"UNIQUE"], [b"UNIQUE", b"k", b"REPLACE", b"REPLACE"]]  # fmt: skip
# Groups (issue 45): a few names the trace's jobs share, so that claims and every path out of
# active move their counts; and bad ones.
GROUPS = [b"g1", b"g1", b"g2", b"t:3@x"]
AFTER_BAD = [[b"AFTER"], [b"AFTER", b""], [b"AFTER", b"dq"], [b"ON_PARENT_FAILURE", b"maybe", b"AFTER", b"a"],
             [b"MISSING", b"yes", b"AFTER", b"a"], [b"ON_PARENT_FAILURE", b"ignore"], [b"MISSING", b"done"],
             [b"ON_PARENT_FAILURE"], [b"AFTER", *(b"x%d" % i for i in range(1001))], [b"AFTER", b"nope"],
             [b"AFTER", b"a", b"DELAY", b"5"],
             [b"ON_PARENT_FAILURE", b"fail", b"ON_PARENT_FAILURE", b"fail"]]  # fmt: skip
GROUP_BAD = [[b"GROUP", b""], [b"GROUP", b"a b"], [b"GROUP", b"x" * 129], [b"GROUP", "ü".encode()],
             [b"GROUP"], [b"GROUP", b"g", b"GROUP", b"g"]]  # fmt: skip
IDS = [b"a", b"b", b"c", b"d", b"e", b"f", "ü".encode(), b"sp ace", b"x:y", b"\xff\x00"]
PAYLOADS = [b"", b"p", b"payload", b"\x00\xff", b"1-0123456789abcdef", b"x" * 40]
# Values stored in 64-byte pieces (up to 1 KiB), whole above, or over the ceilings set below.
PIECED = [b"x" * 64, b"y" * 65, bytes(range(256)) * 4, b"z" * 1025, b"w" * 1101]
PRIORITIES = [b"0", b"-1", b"-1000", b"1000", b"3", b"3", b"-2"]
BAD_PRIORITIES = [b"1001", b"-1001", b"x", b"", b"1.5", b"+1", b"-0", b"01"]
REQS = [b"r1", b"r1", b"r2", b"r3"]
ENQUEUE_REQS = [b"e1", b"e1", b"e2", b"e3", b"e4"] * 4 + [b"r1"]
LEASES = [b"60000", b"120000", b"3600000"]
BAD_NUMBERS = [
    b"", b" 1", b"+1", b"1.5", b"1e3", b"0x10", b"-0", b"01", b"0", b"-1", b"nan", b"\xff",
    b"9223372036854775807", b"9223372036854775808", b"-9223372036854775809", b"9007199254740993",
]  # fmt: skip
FAR_DELAY = b"3600000000"  # due in 41 days: never during a trace
FAR_AT = b"99999999999999"  # due in the year 5138
RETENTIONS = [b"-1", b"0", b"60000", b"3600000", b"86400000", b"9007199254740992"]
# Corrupt and odd field values; counters stay below 2^53 where a claim would
# answer them (docs/guides/scripts-backend.md: the scripts answer integers above 2^53 rounded).
FIELD_VALUES = [b"x", b"", b"1.5", b"-3", b"0", b"7", b"9223372036854775807", b"01", b"1 "]
ROW_FIELDS = [b"attempts", b"tries", b"stalled", b"retries", b"token", b"closed_by", b"state",
              b"cancel_requested", b"request", b"payload", b"payload:1", b"result:2", b"priority",
              b"priority", b"traceback"]  # fmt: skip
# Settings of <base>meta: corrupt ones, and retentions that expire nothing during a trace
# (a row expiring a few ms after it finished would vanish at a different step on each queue).
META_VALUES = [b"x", b"", b"1.5", b"-3", b"01", b"9223372036854775807", b"9007199254740993", *RETENTIONS]
STATES = [b"pending", b"active", b"done", b"dead", b"cancelled", b"weird"]
# Request records: a claim's (ids and tokens of the traces), an enqueue's, malformed ones,
# one over the 1000 pairs a claim takes.
FORGED_RECORDS = [b"1:a1:1", b"1:a20:1-0123456789abcdef1:b20:2-0123456789abcdef", b"1", b"3", b"", b"x",
                  b"1:a", b"5:ab", b"1:a0:", b"1:a48:" + b"t" * 48, b"1:a1:1" * 1001]  # fmt: skip
CLOSED_BY = [b"complete", b"fail:pending", b"fail:dead", b"fail:cancelled", b"release:pending",
             b"release:cancelled", b"fail", b"completely"]  # fmt: skip


# -- the two sides -----------------------------------------------------------------------


@dataclass
class Side:
    """One queue and how commands reach it."""

    name: str
    keys: QueueKeys
    other: QueueKeys
    send: Callable[[list[bytes]], bytes]
    tokens: dict[bytes, bytes] = field(default_factory=dict)
    previous: dict[bytes, bytes] = field(default_factory=dict)
    randoms: set[bytes] = field(default_factory=set)

    def token(self, job: bytes, kind: str, junk: bytes) -> bytes:
        current = self.tokens.get(job, b"1-0000000000000000")
        if kind == "current":
            return current
        if kind == "previous":
            return self.previous.get(job, b"0-0000000000000000")
        if kind == "forged":
            return current.rsplit(b"-", 1)[0] + b"-" + b"f" * 16
        return junk


def b(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


Make = Callable[[Side], list[bytes]]


@dataclass
class Step:
    verb: str  # "EMQ.CLAIM", or "harness" for identical raw writes
    make: Make


# -- the trace generator -----------------------------------------------------------------


class Gen:
    """Random steps; every random choice is made once, so both sides get the same command."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.urng = random.Random(rng.getstate()[1][0] ^ 31)  # UNIQUE's options (Gen.unique)
        self.grng = random.Random(rng.getstate()[1][0] ^ 45)  # GROUP's (Gen.group)
        self.drng = random.Random(rng.getstate()[1][0] ^ 46)  # AFTER's (Gen.after)
        self.held: list[bytes] = []  # ids the last claims handed out (the runner keeps it)

    def pick(self, seq: list[Any]) -> Any:
        return self.rng.choice(seq)

    def job(self) -> bytes:
        """An id: mostly one a claim handed out, so holder verbs often hold the job."""
        if self.held and self.chance(0.6):
            return bytes(self.pick(self.held))
        return bytes(self.pick(IDS))

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def number(self, good: list[bytes], bad: float = 0.08) -> bytes:
        return self.pick(BAD_NUMBERS) if self.chance(bad) else self.pick(good)

    def key(self, name: str) -> Callable[[Side], bytes]:
        """A declared key: mostly the side's own, now and then another queue's or a wrong one."""
        roll = self.rng.random()
        if roll < 0.015:
            return lambda s: b(getattr(s.other, name))
        if roll < 0.025:
            return lambda s: b(s.keys.base) + b"nope"
        return lambda s: b(getattr(s.keys, name))

    def base(self) -> Callable[[Side], bytes]:
        roll = self.rng.random()
        if roll < 0.01:
            return lambda s: b(s.other.base)
        if roll < 0.015:
            return lambda s: b(s.keys.base[:-1])
        return lambda s: b(s.keys.base)

    def row(self, job: bytes) -> Callable[[Side], bytes]:
        if self.chance(0.02):
            other = self.pick(IDS)
            return lambda s: b(s.keys.base) + b"job:" + other
        if self.chance(0.01):
            return lambda s: b(s.other.base) + b"job:" + job
        return lambda s: b(s.keys.base) + b"job:" + job

    def tokenize(self, job: bytes) -> Callable[[Side], bytes]:
        kind = self.rng.choices(["current", "previous", "forged", "junk"], [12, 2, 1, 1])[0]
        junk = self.pick([b"", b"1", b"x", b"-1", b"1-0123456789abcdef"])
        return lambda s: s.token(job, kind, junk)

    def options(self, pool: list[list[bytes]], good: list[list[bytes]], p_bad: float = 0.06) -> list[bytes]:
        if self.chance(p_bad):
            return list(self.pick(pool))
        return list(self.pick(good))

    def arity(self, parts: list[Any]) -> list[Any]:
        """Now and then a line too short or too long."""
        if self.chance(0.03):
            return parts[: self.rng.randrange(1, len(parts))]
        if self.chance(0.01):
            return [*parts, b"extra"]
        return parts

    def line(self, verb: str, parts: list[Any]) -> Step:
        parts = self.arity([verb.encode(), *parts])

        def make(s: Side) -> list[bytes]:
            return [p(s) if callable(p) else p for p in parts]

        return Step(verb, make)

    # -- the verbs --

    def when(self) -> list[bytes]:
        """ENQUEUE's and ENQUEUEMANY's options: a due time now, long past or far ahead (never one
        that falls due during a trace, which would be a race between the two queues), and bad ones."""
        opts: list[bytes] = []
        if self.chance(0.25):
            opts += self.pick([[b"DELAY", b"0"], [b"delay", FAR_DELAY], [b"AT", b"0"], [b"AT", b"1000"],
                               [b"at", FAR_AT]])  # fmt: skip
        if self.chance(0.4):  # enqueues' request ids, now and then a claim's (a REQ used twice)
            opts += [self.pick([b"REQ", b"req"]), self.pick(ENQUEUE_REQS)]
        if self.chance(0.35):  # a level: most of a trace's jobs wait in <base>priority
            opts += [self.pick([b"PRIORITY", b"priority"]), self.pick(PRIORITIES)]
        if self.chance(0.2):
            self.rng.shuffle(opts)
        bad = [[b"REQ"], [b"REQ", b""], [b"NOPE", b"1"], [b"REQ", b"r1", b"REQ", b"r2"], [b"DELAY", b"-1"],
               [b"DELAY", b"x"], [b"DELAY", b"9007199254740992"], [b"AT", b"-5"], [b"AT", b"1.5"],
               [b"AT", b"9007199254740993"], [b"DELAY", b"0", b"AT", b"0"], [b"AT", b"0", b"DELAY", b"0"],
               [b"DELAY", b"0", b"DELAY", b"0"], [b"PRIORITY"], [b"PRIORITY", self.pick(BAD_PRIORITIES)],
               [b"PRIORITY", b"1", b"PRIORITY", b"1"]]  # fmt: skip
        return self.options(bad, [opts], 0.1)

    def unique(self) -> list[bytes]:
        """ENQUEUE's UNIQUE options: a few keys the trace's jobs share (held, replaced, released
        by every way a job ends), a window far longer than a trace, REPLACE; and bad ones.  Drawn
        from a generator of their own, so the other choices of a seed's trace stay as they were."""
        u = self.urng
        if u.random() >= 0.35:
            return []
        opts = [u.choice([b"UNIQUE", b"unique"]), u.choice(UNIQUE_KEYS)]
        if u.random() < 0.3:
            opts += u.choice([[b"FOR", b"600000"], [b"UNTIL", b"done"], [b"until", b"DONE"]])
        if u.random() < 0.3:
            opts.append(u.choice([b"REPLACE", b"replace"]))
        if u.random() < 0.1:
            u.shuffle(opts)  # pairs apart: mostly syntax errors, as the module answers them
        return list(u.choice(UNIQUE_BAD)) if u.random() < 0.15 else opts

    def group(self) -> list[bytes]:
        """ENQUEUE's and ENQUEUEMANY's GROUP: most of a trace's jobs in a few groups, and bad
        names; drawn from a generator of their own (as Gen.unique)."""
        g = self.grng
        if g.random() >= 0.5:
            return []
        if g.random() < 0.1:
            return list(g.choice(GROUP_BAD))
        return [g.choice([b"GROUP", b"group"]), g.choice(GROUPS)]

    def after(self, job: bytes) -> list[bytes]:
        """ENQUEUE's dependencies (issue 46), last: a few of the trace's ids (waiting on live
        jobs, resolved at once by ended ones, refused when missing), a policy, MISSING done;
        and bad ones.  Drawn from a generator of their own (as Gen.unique)."""
        d = self.drng
        if d.random() >= 0.3:
            return []
        if d.random() < 0.3:
            bad = [[b"AFTER"], [b"AFTER", b""], [b"AFTER", job],
                   [b"ON_PARENT_FAILURE", b"maybe", b"AFTER", b"a"], [b"MISSING", b"yes", b"AFTER", b"a"],
                   [b"ON_PARENT_FAILURE", b"ignore"], [b"MISSING", b"done"], [b"ON_PARENT_FAILURE"],
                   [b"AFTER", *(b"x%d" % i for i in range(1001))]]  # fmt: skip
            return list(d.choice(bad))
        opts: list[bytes] = []
        if d.random() < 0.5:
            opts += [d.choice([b"ON_PARENT_FAILURE", b"on_parent_failure"]),
                     d.choice([b"fail", b"ignore", b"continue", b"IGNORE"])]  # fmt: skip
        if d.random() < 0.4:
            opts += [b"MISSING", d.choice([b"done", b"DONE"])]
        ids = [i for i in IDS if i != job]
        return [*opts, d.choice([b"AFTER", b"after"]), *d.sample(ids, d.randint(1, 3))]

    def payload(self) -> bytes:
        return bytes(self.pick(PIECED)) if self.chance(0.2) else bytes(self.pick(PAYLOADS))

    def enqueue(self) -> Step:
        job, payload = self.pick(IDS), self.payload()
        opts = [*self.when(), *self.unique(), *self.group(), *self.after(job)]
        return self.line("EMQ.ENQUEUE", [self.key("pending"), self.base(), job, payload, *opts])

    def enqueuemany(self) -> Step:
        n = self.rng.randint(1, 4)
        pairs: list[bytes] = []
        for _ in range(n):
            pairs += [self.pick(IDS), self.payload()]
        count = str(n).encode()
        if self.chance(0.1):
            count = self.pick(
                [b"0", b"x", b"9", b"-1", str(n + 1).encode(), str(n - 1).encode()] * 2
                + [b"4611686018427387905", b"9223372036854775807", b"2147483648"]
            )
        unique = [b"UNIQUE", self.urng.choice(UNIQUE_KEYS)] if self.urng.random() < 0.03 else []
        if self.drng.random() < 0.02:
            unique += self.drng.choice([[b"AFTER", b"a"], [b"ON_PARENT_FAILURE", b"x"], [b"MISSING", b"o"]])
        return self.line(
            "EMQ.ENQUEUEMANY",
            [self.key("pending"), self.base(), count, *pairs, *self.when(), *unique, *self.group()],
        )

    def claim(self) -> Step:
        opts: list[bytes] = []
        if self.chance(0.5):
            opts += [self.pick([b"COUNT", b"count"]), self.number([b"1", b"2", b"3", b"4", b"1001"])]
        if self.chance(0.4):
            opts += [b"REQ", self.pick(REQS)]
        if self.chance(0.15):  # the module waits a few ms for nothing; the script answers at once
            wait = self.number([b"1", b"3"], 0.3)
            opts += [self.pick([b"BLOCK", b"block"]), b"1" if wait == b"0" else wait]  # 0 waits forever
        if self.chance(0.5):
            self.rng.shuffle(opts)  # pairs may split: a syntax error, as it should be
        bad = [
            [b"COUNT"],
            [b"REQ", b""],
            [b"LIMIT", b"1"],
            [b"COUNT", b"1", b"COUNT", b"2"],
            [b"BLOCK", b"-1"],
            [b"BLOCK", b"9007199254740992"],
            [b"BLOCK", b"1", b"BLOCK", b"1"],
        ]
        opts = self.options(bad, [opts])
        return self.line(
            "EMQ.CLAIM", [self.key("pending"), self.key("active"), self.base(), self.number(LEASES), *opts]
        )

    def completeclaim(self) -> Step:
        job = self.job()
        active = self.key("active")
        row = (lambda s: active(s)) if self.chance(0.01) else self.row(job)
        opts: list[bytes] = []
        if self.chance(0.5):
            opts += [self.pick([b"COUNT", b"count"]), self.number([b"1", b"2", b"3", b"1001"])]
        if self.chance(0.4):
            opts += [b"REQ", self.pick(REQS)]
        if self.chance(0.3):
            opts += [self.pick([b"RESULT", b"result"]), self.payload()]
        bad = [[b"COUNT"], [b"REQ", b""], [b"BLOCK", b"1"], [b"COUNT", b"1", b"COUNT", b"2"], [b"RESULT"],
               [b"RESULT", b"a", b"RESULT", b"b"]]  # fmt: skip
        opts = self.options(bad, [opts])
        return self.line("EMQ.COMPLETECLAIM", [
            active, row, self.key("pending"), job, self.tokenize(job), self.number(LEASES), *opts,
        ])  # fmt: skip

    def extend(self, verb: str = "EMQ.EXTEND") -> Step:
        job = self.job()
        same = self.chance(0.01)
        active = self.key("active")
        row = (lambda s: active(s)) if same else self.row(job)
        parts: list[Any] = [active, row, job, self.tokenize(job), self.number(LEASES)]
        if verb == "EMQ.CHECKPOINT":
            state = self.pick([b"s", b"state", b"\x00" * 16, b"y" * 17, b""])
            progress = self.pick([b"50%", b"", b"p" * 16, b"q" * 17])  # emq.max-state-bytes: 16 here
            parts += self.options([[b"STATE"], [b"NOPE", b"x"], [b"STATE", b"a", b"STATE", b"b"],
                                   [b"PROGRESS"], [b"PROGRESS", b"a", b"PROGRESS", b"b"]],
                                  [[], [b"STATE", state], [b"state", state], [b"PROGRESS", progress],
                                   [b"progress", progress, b"STATE", state]])  # fmt: skip
        return self.line(verb, parts)

    def complete(self) -> Step:
        job = self.job()
        result = self.options([[b"RESULT"], [b"RESULT", b"a", b"RESULT", b"b"], [b"NOPE", b"x"]],
                              [[], [], [b"RESULT", self.payload()], [b"result", b""]])  # fmt: skip
        parts = [self.key("active"), self.row(job), job, self.tokenize(job), *result]
        return self.line("EMQ.COMPLETE", parts)

    def fail(self) -> Step:
        job = self.job()
        delay = self.options([[b"DELAY"], [b"DELAY", b"-1"], [b"NOPE", b"1"], [b"DELAY", b"1", b"x", b"y"],
                              [b"DELAY", b"9007199254740992"]],
                             [[], [], [], [b"DELAY", b"0"], [b"delay", FAR_DELAY]], 0.1)  # fmt: skip
        if self.chance(0.3):
            delay += [self.pick([b"TRACE", b"trace"]), self.pick([b"Traceback:\n  boom", b"", b"t" * 200])]
        if self.chance(0.15):
            delay.append(self.pick([b"DEAD", b"dead"]))
        if self.chance(0.03):
            delay += self.pick([[b"TRACE"], [b"DEAD", b"DEAD"], [b"TRACE", b"a", b"TRACE", b"b"]])
        if self.chance(0.05):
            self.rng.shuffle(delay)
        return self.line("EMQ.FAIL", [
            self.key("active"), self.key("pending"), self.key("dead"), self.base(), job, self.tokenize(job),
            self.number([b"1", b"2", b"3", b"5"]), self.pick([b"boom", b"", b"\x00err"]), *delay,
        ])  # fmt: skip

    def release(self) -> Step:
        job = self.job()
        # a handler's 429 (issue 32): a back-off of a day, which EMQ.LIMIT ... BACKOFF 0 lifts
        backoff = self.options([[b"BACKOFF"], [b"BACKOFF", b"x"], [b"NOPE", b"1"], [b"BACKOFF", b"86400001"]],
                               [[], [], [], [b"BACKOFF", b"86400000"], [b"backoff", b"0"]])  # fmt: skip
        return self.line("EMQ.RELEASE", [self.key("active"), self.key("pending"), self.base(), job,
                                         self.tokenize(job), *backoff])  # fmt: skip

    def limit(self) -> Step:
        # day-long windows and back-offs only: the two queues' commands run a few microseconds
        # apart, and a window boundary between them would part the traces
        bad = [[b"RATE", b"0", b"PER", b"86400000"], [b"RATE", b"1"], [b"PER", b"5"], [b"BACKOFF", b"-1"],
               [b"OFF", b"OFF"], [b"NOPE"], [b"RATE", b"2", b"PER", b"86400001"], [b"BACKOFF", b"86400001"],
               [b"OFF", b"RATE", b"1", b"PER", b"86400000"]]  # fmt: skip
        rate = [b"RATE", self.pick([b"1", b"2", b"5"]), b"PER", b"86400000"]
        good = [[], rate, rate, [b"OFF"], [b"off"], [b"BACKOFF", b"0"], [b"BACKOFF", b"0"],
                [b"backoff", b"86400000"], [*rate, b"BACKOFF", b"0"]]  # fmt: skip
        return self.line("EMQ.LIMIT", [self.key("pending"), self.base(), *self.options(bad, good, 0.15)])

    def grouplimit(self) -> Step:
        # a group's cap and pause (issue 45): caps of 1 and 2 on the trace's groups, so claims
        # meet groups at their cap, and every refusal of the options
        bad = [[], [b"a b"], [b"g1", b"MAX", b"0"], [b"g1", b"MAX", b"1000000001"],
               [b"g1", b"MAX", b"1", b"NOMAX"], [b"g1", b"PAUSE", b"RESUME"], [b"g1", b"NOPE"],
               [b"g1", b"GROUP", b"g2"], [b"g1", b"MAX", b"x"], [b"g1", b"MAX"]]  # fmt: skip
        opts = [self.pick(GROUPS)]
        opts += self.pick([[], [b"MAX", b"1"], [b"max", b"2"], [b"MAX", b"2"], [b"NOMAX"]])
        opts += self.pick([[], [], [b"PAUSE"], [b"RESUME"], [b"resume"]])
        opts = self.options(bad, [opts], 0.15)
        return self.line("EMQ.GROUPLIMIT", [self.key("pending"), self.base(), *opts])

    def cancel(self) -> Step:
        job = self.job()
        return self.line("EMQ.CANCEL", [self.key("pending"), self.base(), job, self.pick([b"why", b""])])

    def sweep(self) -> Step:
        limits = [b"1", b"2", b"5", b"8", b"9"]
        return self.line("EMQ.SWEEP", [self.key("active"), self.key("pending"), self.key("dead"), self.base(),
                                       self.number([b"1", b"2", b"3"]), self.number(limits)])  # fmt: skip

    def retention(self) -> Step:
        opts: list[bytes] = []
        for name in (b"DONE", b"CANCELLED", b"DEAD"):
            if self.chance(0.35):
                opts += [self.pick([name, name.lower()]), self.number(RETENTIONS, 0.15)]
        self.rng.shuffle(opts) if self.chance(0.1) else None
        opts = self.options([[b"DONE"], [b"DONE", b"1", b"DONE", b"2"], [b"NOPE", b"1"]], [opts])
        return self.line("EMQ.RETENTION", [self.key("pending"), self.base(), *opts])

    def retry(self) -> Step:
        return self.line("EMQ.RETRY", [self.key("dead"), self.key("pending"), self.base(), self.pick(IDS)])

    def until(self) -> list[bytes]:
        bad = [[b"UNTIL"], [b"UNTIL", b"x"], [b"NOPE", b"1"], [b"UNTIL", b"0", b"UNTIL", b"1"]]
        good = [[], [], [b"UNTIL", b"0"], [b"UNTIL", b"99999999999999"], [b"until", b"-5"]]
        return self.options(bad, good)

    def retrydead(self) -> Step:
        return self.line("EMQ.RETRYDEAD", [self.key("dead"), self.key("pending"), self.base(),
                                           self.number([b"1", b"2", b"10"]), *self.until()])  # fmt: skip

    def purge(self) -> Step:
        return self.line("EMQ.PURGE", [self.key("dead"), self.base(), self.number([b"1", b"2", b"10"]),
                                       *self.until()])  # fmt: skip

    def pause(self) -> Step:
        verb = self.pick(["EMQ.PAUSE", "EMQ.RESUME", "EMQ.RESUME"])
        return self.line(verb, [self.key("pending"), self.base()])

    def obliterate(self) -> Step:
        force = self.options([[b"NOPE"], [b"force", b"x"]], [[], [b"FORCE"], [b"force"]])
        sets = [self.key("active"), self.key("pending"), self.key("dead")]
        return self.line("EMQ.OBLITERATE", [*sets, self.base(), self.number([b"1", b"3", b"100"]), *force])

    def forget(self) -> Step:
        # more ids than emq.max-limit (MAX_LIMIT) now and then: refused whole
        n = self.rng.randint(1, 3) if not self.chance(0.1) else MAX_LIMIT + self.rng.randint(0, 2)
        ids = [self.pick(IDS) for _ in range(n)]
        return self.line("EMQ.FORGET", [self.key("pending"), self.base(), *ids])

    # -- the harness: identical raw writes on both queues --

    def harness(self) -> Step:
        """Raw writes, the same on both queues: lapsed leases, corrupt fields, wrong types."""
        job = self.job()
        roll = self.rng.randrange(12)
        score = str(1000 + self.rng.randrange(100)).encode()
        counters = [b"attempts", b"tries", b"stalled", b"retries"]
        row_field = self.pick(counters) if self.chance(0.7) else self.pick(ROW_FIELDS)
        row_value = self.pick(FIELD_VALUES)
        state_field, state_value = self.pick([b"state", b"closed_by"]), self.pick(STATES + CLOSED_BY)
        meta = self.chance(0.5)
        setting = self.pick([b"count", b"paused", b"done_ttl_ms", b"cancelled_ttl_ms", b"dead_ttl_ms",
                             b"stale", b"seq"])  # fmt: skip
        setting_value = self.pick(META_VALUES)
        target = self.rng.randrange(9)
        due = str(self.rng.randrange(1, 50)).encode()
        forged, rid = self.pick(FORGED_RECORDS), self.pick([b"r3", b"e4"])  # the rarest ids: claims go on

        def write(s: Side) -> list[list[bytes]]:
            k = s.keys
            row = b(k.base) + b"job:" + job
            keys = [b(k.pending), b(k.active), b(k.dead), b(k.meta), b(k.metrics_failed),
                    b(k.priority), b(k.delayed), b(k.base) + b"req:r1", row]  # fmt: skip
            if roll <= 2:  # a holder died long ago: its lease lapsed
                return [[b"ZADD", b(k.active), b"XX", score, job]]
            if roll == 3:
                return [[b"HSET", row, row_field, row_value]]
            if roll == 4:
                return [[b"HSET", row, state_field, state_value]]
            if roll == 5:
                return [[b"HSET", b(k.meta) if meta else b(k.metrics_failed), setting, setting_value]]
            if roll == 6:  # a key of the wrong type
                return [[b"DEL", keys[target]], [b"SET", keys[target], b"wrong"]]
            if roll == 9:  # a request record another call left, or a forged one (issue 28)
                return [[b"SET", b(k.base) + b"req:" + rid, forged]]
            if roll == 7:  # repair: the wrong-typed keys go
                return [[b"EVAL", b"if redis.call('TYPE', KEYS[1]).ok == 'string' then "
                         b"redis.call('DEL', KEYS[1]) end", b"1", key] for key in keys[:8]]  # fmt: skip
            if roll == 10:  # delayed jobs came due (the traces' delays are far off): the next
                return [[b"ZADD", b(k.delayed), b"XX", due, job]]  # claim or sweep moves them
            if roll == 11:  # a waiting job's entry duplicated (a lost tombstone's count)
                return [[b"RPUSH", b(k.pending), job]]
            return [[b"DEL", row]]

        def make(s: Side) -> list[bytes]:
            return [b"HARNESS", *[b"\x00".join(c) for c in write(s)]]

        return Step("harness", make)

    def step(self) -> Step:
        verbs: list[tuple[Callable[[], Step], int]] = [
            (self.enqueue, 12), (self.enqueuemany, 4), (self.claim, 12), (self.extend, 7),
            (lambda: self.extend("EMQ.CHECKPOINT"), 6),
            (self.complete, 7), (self.completeclaim, 6), (self.fail, 7), (self.release, 4), (self.cancel, 5),
            (self.sweep, 6),
            (self.retention, 3), (self.retry, 4), (self.retrydead, 2), (self.purge, 2), (self.pause, 3),
            (self.obliterate, 1), (self.forget, 2), (self.harness, 9), (self.limit, 3),
            (self.grouplimit, 4),
        ]  # fmt: skip
        make = self.rng.choices([v for v, _ in verbs], [w for _, w in verbs])[0]
        return make()


# -- comparing -------------------------------------------------------------------------


def mask(data: bytes) -> bytes:
    return TOKEN.sub(rb"\1-<random>", data)


def same_reply(verb: str, m: bytes, s: bytes, tol: int) -> bool:
    """Equal replies; EMQ.LIMIT's backoff-until (server-now + ms) may differ by the step's length."""
    if m == s or verb != "EMQ.LIMIT":
        return m == s
    a, z = parse(m), parse(s)
    if not (isinstance(a, list) and isinstance(z, list) and len(a) == len(z) == 5):
        return False
    return bool(a[:4] == z[:4] and abs(a[4] - z[4]) <= tol)


def to_module_names(data: bytes) -> bytes:
    return data.replace(b"{s}", b"{m}").replace(b"{s2}", b"{m2}")


Snapshot = dict[bytes, tuple[str, Any, int]]


def snapshot(r: redis.Redis, pattern: str, rename: bool) -> Snapshot:
    keys = sorted(r.scan_iter(match=pattern, count=1000))
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
        pipe.pexpiretime(key)
    info = pipe.execute()
    pipe = r.pipeline(transaction=False)
    for i, key in enumerate(keys):
        kind = info[2 * i].decode()
        if kind == "zset":
            pipe.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            pipe.hgetall(key)
        elif kind == "string":
            pipe.get(key)
        elif kind == "list":
            pipe.lrange(key, 0, -1)
        else:
            pipe.type(key)
    values = pipe.execute()
    out: Snapshot = {}
    for i, key in enumerate(keys):
        kind, value = info[2 * i].decode(), values[i]
        if kind == "zset":
            value = dict(value)
        name = to_module_names(key) if rename else key
        out[name] = (kind, value, int(info[2 * i + 1]))
    return out


@dataclass
class Diff:
    mismatches: list[str] = field(default_factory=list)
    resync_scores: list[tuple[bytes, bytes, float]] = field(default_factory=list)
    resync_expiry: list[tuple[bytes, int]] = field(default_factory=list)
    resync_fields: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)


def is_time_set(key: bytes) -> bool:
    return key.endswith(TIME_SETS) or b":waiters:" in key  # a waiter set: scored with enqueue times


def compare(m: Snapshot, s: Snapshot, tol: int) -> Diff:
    diff = Diff()
    if m.keys() != s.keys():
        diff.mismatches.append(f"keys: module only {sorted(m.keys() - s.keys())}, scripts only "
                               f"{sorted(s.keys() - m.keys())}")  # fmt: skip
    for key in sorted(m.keys() & s.keys()):
        (mk, mv, mx), (sk, sv, sx) = m[key], s[key]
        where = key.decode(errors="replace")
        if mk != sk:
            diff.mismatches.append(f"{where}: type {mk} vs {sk}")
            continue
        if mx != sx:
            if mx > 0 and sx > 0 and abs(mx - sx) <= tol:
                diff.resync_expiry.append((key, mx))
            else:
                diff.mismatches.append(f"{where}: expires at {mx} vs {sx}")
        if mk == "zset":
            if mv.keys() != sv.keys():
                diff.mismatches.append(f"{where}: members {sorted(mv)} vs {sorted(sv)}")
                continue
            for member in mv:
                a, z = mv[member], sv[member]
                if a == z:
                    continue
                if is_time_set(key) and a > A_TIME and z > A_TIME and abs(a - z) <= tol:
                    diff.resync_scores.append((key, member, a))
                else:
                    diff.mismatches.append(f"{where}: {member!r} scored {a} vs {z}")
        elif mk == "hash":
            if mv.keys() != sv.keys():
                diff.mismatches.append(f"{where}: fields {sorted(mv)} vs {sorted(sv)}")
                continue
            for f in mv:
                a, z = mask(mv[f]), mask(sv[f])
                if a == z:
                    continue
                timed = f in TIME_FIELDS or f in LATER_FIELDS
                if timed and a.isdigit() and z.isdigit() and abs(int(a) - int(z)) <= tol:
                    diff.resync_fields.append((key, f, mv[f]))
                    continue
                diff.mismatches.append(f"{where}: {f.decode()} = {mv[f]!r} vs {sv[f]!r}")
        elif mk == "list":
            if mv != sv:
                diff.mismatches.append(f"{where}: entries {mv} vs {sv}")
        elif mask(mv or b"") != mask(sv or b""):
            diff.mismatches.append(f"{where}: {mv!r} vs {sv!r}")
    return diff


def times_written(before: Snapshot, after: Snapshot, now: int) -> Iterator[tuple[str, int]]:
    """(where, ms) of every server time this step wrote (fields and time scores that changed;
    ``now``: the step's end, after which a <base>delayed score is a due time, not a time written)."""
    for key, (kind, value, _) in after.items():
        old = before.get(key, ("", {}, -1))[1] if before.get(key, ("",))[0] == kind else {}
        if kind == "hash":
            for f in TIME_FIELDS & value.keys():
                if old.get(f) != value[f] and value[f].isdigit():
                    yield f"{key!r}.{f.decode()}", int(value[f])
        elif kind == "zset" and key.endswith((b"delayed", b"dead")):
            for member, score in value.items():
                if old.get(member) == score or score < A_TIME:
                    continue
                if key.endswith(b"delayed") and score > now:  # a due time, given with DELAY or AT
                    continue
                yield f"{key!r}[{member!r}]", int(score)


# -- running a trace ------------------------------------------------------------------


class Events:
    """The keyspace events, cancel announcements and done:<id> announcements (sharded: a
    subscription per channel, every id of the traces on both queues) fired between two marks."""

    MARK = "echomq-diff-mark"

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.sub = r.pubsub()
        self.sub.psubscribe("__keyevent@0__:*", "emq:*:cancel")
        self.sub.subscribe(self.MARK)
        done = [f"emq:{{{q}}}:done:".encode() + job for q in ("m", "s") for job in IDS]
        self.sub.ssubscribe(*done)
        for _ in range(3 + len(done)):
            assert self.sub.get_message(timeout=5) is not None

    def take(self) -> list[tuple[bytes, bytes]]:
        self.r.publish(self.MARK, "end")
        out: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = self.sub.get_message(timeout=1)
            if msg is None:
                continue
            if msg["type"] == "message" and msg["channel"] == self.MARK.encode():
                return out
            if msg["type"] in ("pmessage", "smessage"):
                out.append((msg["channel"], msg["data"]))
        raise TimeoutError("the mark never came back")

    def close(self) -> None:
        self.sub.close()


def split_events(events: list[tuple[bytes, bytes]]) -> tuple[list[Any], list[Any]]:
    """(module queue's, scripts queue's) events, the scripts' renamed to the module's keys."""
    m: list[Any] = []
    s: list[Any] = []
    for channel, data in events:
        about = data if channel.startswith(b"__keyevent") else channel
        if b"{s}" in about or b"{s2}" in about:
            s.append((to_module_names(channel), to_module_names(data)))
        else:
            m.append((channel, data))
    return m, s


@dataclass
class Stats:
    steps: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    claims: int = 0
    claimed_by_claim: int = 0  # of those, by EMQ.CLAIM itself (not COMPLETECLAIM's half)
    resynced: int = 0


class Differential:
    def __init__(
        self, server: EmbeddedServer, seed: int, table: dict[str, _scripts.Script] | None = None
    ) -> None:
        self.r = server.client()
        self.table = table or _scripts.scripts()
        # The library (FCALL) in most traces, one script per verb (EVALSHA) in every fourth, and
        # always for a swapped-in script.
        self.mode: _scripts.Mode = "eval" if table is not None or seed % 4 == 3 else "functions"
        self.protocol = 3 if seed % 2 else 2
        self.conn = RawConnection(server.host, server.port, self.protocol)
        self.gen = Gen(random.Random(seed))
        self.stats = Stats()
        self.events = Events(self.r)
        self.m = Side("m", queue_keys("m"), queue_keys("m2"), self.conn_send)
        self.s = Side("s", queue_keys("s"), queue_keys("s2"), self.script_send)
        if seed % 3 == 0:  # the first call meets NOSCRIPT or "Function not found": the loading path
            self.r.script_flush()
            self.r.function_flush()

    def close(self) -> None:
        self.events.close()
        self.conn.close()
        self.r.close()

    def now(self) -> int:
        seconds, micros = self.r.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def conn_send(self, argv: list[bytes]) -> bytes:
        return self.conn.call(*argv)

    def script_send(self, argv: list[bytes]) -> bytes:
        command = _scripts.render(argv, LIMITS, self.table, self.mode)
        reply = self.conn.call(*command)
        if reply.startswith(b"-NOSCRIPT"):
            reply = self.conn.call(*_scripts.eval_form(command, self.table))
        elif reply.startswith(b"-ERR Function not found"):
            assert self.conn.call("FUNCTION", "LOAD", _scripts.library().source).startswith(b"$")
            reply = self.conn.call(*command)
        return reply

    def harness(self, side: Side, argv: list[bytes]) -> bytes:
        for packed in argv[1:]:
            self.conn.call(*packed.split(b"\x00"))
        return b"+OK\r\n"

    def run(self, steps: int | list[Step]) -> Stats:
        before_m = snapshot(self.r, "emq:{m*", False)
        before_s = snapshot(self.r, "emq:{s*", True)
        planned = steps if isinstance(steps, list) else None
        for n in range(len(planned) if planned is not None else int(steps)):  # type: ignore[arg-type]
            step = planned[n] if planned is not None else self.gen.step()
            t0 = self.now()
            replies = []
            for side in (self.m, self.s):
                argv = step.make(side)
                replies.append(self.harness(side, argv) if step.verb == "harness" else side.send(argv))
            t1 = self.now()
            m_reply, s_reply = replies
            shown = [a if len(a) < 80 else a[:60] + b"..." for a in step.make(self.m)]  # long payloads cut
            where = f"step {n} {step.verb} {shown!r}"
            assert same_reply(step.verb, mask(m_reply), mask(to_module_names(s_reply)), max(t1 - t0, 1)), (
                f"{where}: module {m_reply!r} vs scripts {s_reply!r}"
            )
            m_events, s_events = split_events(self.events.take())
            assert m_events == s_events, f"{where}: events {m_events} vs {s_events}"
            after_m = snapshot(self.r, "emq:{m*", False)
            after_s = snapshot(self.r, "emq:{s*", True)
            diff = compare(after_m, after_s, max(t1 - t0, 1))
            assert not diff.mismatches, f"{where}: " + "; ".join(diff.mismatches)
            for snap_before, snap_after in ((before_m, after_m), (before_s, after_s)):
                for what, ms in times_written(snap_before, snap_after, t1):
                    assert t0 <= ms <= t1, f"{where}: {what} = {ms}, outside the step [{t0}, {t1}]"
            if step.verb in ("EMQ.CLAIM", "EMQ.COMPLETECLAIM"):
                for side, reply, snap in ((self.m, m_reply, after_m), (self.s, s_reply, after_s)):
                    self.claimed(side, reply, snap, where, step.verb == "EMQ.COMPLETECLAIM")
            if self.resync(diff):
                after_s = snapshot(self.r, "emq:{s*", True)
            before_m, before_s = after_m, after_s
            self.stats.steps += 1
            outcome = parse(m_reply)
            kind = f"error {outcome}" if isinstance(outcome, ReplyError) else "ok"
            self.stats.outcomes[f"{step.verb} {kind}"] += 1
        return self.stats

    def claimed(self, side: Side, reply: bytes, snap: Snapshot, where: str, second: bool = False) -> None:
        """A claim's tokens: the shape, the row's counter and token, a random part never seen before.

        ``second``: the claim's reply is the second element (EMQ.COMPLETECLAIM's)."""
        jobs = parse(reply)
        if second:
            jobs = jobs[1] if isinstance(jobs, list) else None
        if not isinstance(jobs, list):
            return
        for job in jobs:
            job_id, token = job[0], job[1]
            match = TOKEN.fullmatch(token)
            assert match, f"{where}: {side.name} token {token!r}"
            row = snap[b(side.keys.base).replace(b"{s}", b"{m}") + b"job:" + job_id][1]
            assert row[b"token"] == token, f"{where}: {side.name} row token {row[b'token']!r} != {token!r}"
            if side.tokens.get(job_id) == token:
                continue  # a REQ retry answered the same claim again
            assert match.group(1) == row[b"attempts"], f"{where}: {side.name} counter of {token!r}"
            assert match.group(2) not in side.randoms, f"{where}: {side.name} random part repeated"
            side.randoms.add(match.group(2))
            if side is self.m:
                self.gen.held = [*self.gen.held[-5:], job_id]
            if job_id in side.tokens:
                side.previous[job_id] = side.tokens[job_id]
            side.tokens[job_id] = token
            self.stats.claims += 1
            self.stats.claimed_by_claim += not second

    def resync(self, diff: Diff) -> bool:
        """Give the scripts queue the module queue's times (same ties, same claim order)."""
        if not (diff.resync_scores or diff.resync_expiry or diff.resync_fields):
            return False
        pipe = self.r.pipeline(transaction=True)
        for key, member, score in diff.resync_scores:
            pipe.zadd(key.replace(b"{m}", b"{s}").replace(b"{m2}", b"{s2}"), {member: score}, xx=True)
        for key, at in diff.resync_expiry:
            pipe.pexpireat(key.replace(b"{m}", b"{s}").replace(b"{m2}", b"{s2}"), at)
        for key, f, value in diff.resync_fields:
            pipe.hset(key.replace(b"{m}", b"{s}").replace(b"{m2}", b"{s2}"), f, value)
        pipe.execute()
        self.events.take()  # drop the resync's own events
        self.stats.resynced += 1
        return True


def grid() -> list[Step]:
    """A fixed trace that reaches the refusals random traces reach rarely: corrupt counters
    met by each verb that reads them, a counter at 2^63-1, every verb's wrong arity."""

    def line(verb: str, *parts: Any) -> Step:
        return Step(verb, lambda s: [verb.encode(), *[p(s) if callable(p) else p for p in parts]])

    def raw(*commands: Callable[[Side], list[bytes]]) -> Step:
        return Step("harness", lambda s: [b"HARNESS", *[b"\x00".join(c(s)) for c in commands]])

    def key(name: str) -> Callable[[Side], bytes]:
        return lambda s: b(getattr(s.keys, name))

    def base(s: Side) -> bytes:
        return b(s.keys.base)

    def row(job: bytes) -> Callable[[Side], bytes]:
        return lambda s: b(s.keys.base) + b"job:" + job

    def hset(job: bytes, f: bytes, v: bytes) -> Step:
        return raw(lambda s: [b"HSET", row(job)(s), f, v])

    def held(job: bytes) -> Callable[[Side], bytes]:
        return lambda s: s.token(job, "current", b"")

    enqueue = lambda job: line("EMQ.ENQUEUE", key("pending"), base, job, b"p")  # noqa: E731
    uq = lambda job, *opts: line("EMQ.ENQUEUE", key("pending"), base, job, b"p" + job, *opts)  # noqa: E731
    claim = line("EMQ.CLAIM", key("pending"), key("active"), base, b"60000")
    claim8 = line("EMQ.CLAIM", key("pending"), key("active"), base, b"60000", b"COUNT", b"8")
    grp = lambda g, v: raw(lambda s: [b"HSET", b(s.keys.base) + b"group:" + g, b"active", v])  # noqa: E731
    sweep = line("EMQ.SWEEP", key("active"), key("pending"), key("dead"), base, b"1", b"8")
    lapse = lambda job: raw(lambda s: [b"ZADD", b(s.keys.active), b"XX", b"5", job])  # noqa: E731
    fail = lambda job: line(  # noqa: E731
        "EMQ.FAIL", key("active"), key("pending"), key("dead"), base, job, held(job), b"1", b"e"
    )
    steps = [
        enqueue(b"a"), hset(b"a", b"attempts", b"x"), claim,  # attempts not an integer
        hset(b"a", b"attempts", b"9223372036854775807"), claim,  # overflow
        hset(b"a", b"attempts", b"1"), hset(b"a", b"tries", b"1.5"), claim,  # tries
        hset(b"a", b"tries", b"0"), claim, lapse(b"a"), hset(b"a", b"stalled", b"?"), sweep,  # stalled
        hset(b"a", b"stalled", b"0"), raw(lambda s: [b"HSET", b(s.keys.metrics_failed), b"count", b"x"]),
        sweep, fail(b"a"),  # the metric, met by a sweep and a fail that kill
        raw(lambda s: [b"DEL", b(s.keys.metrics_failed)]), sweep,
        hset(b"a", b"retries", b"9223372036854775807"),
        line("EMQ.RETRY", key("dead"), key("pending"), base, b"a"),  # overflow of retries
        line("EMQ.RETRYDEAD", key("dead"), key("pending"), base, b"5"),
        hset(b"a", b"retries", b"r"), line("EMQ.RETRY", key("dead"), key("pending"), base, b"a"),
        line("EMQ.RETRYDEAD", key("dead"), key("pending"), base, b"5", b"UNTIL", b"soon"),
        line("EMQ.PURGE", key("dead"), base, b"5", b"UNTIL", b"1.5"),
        hset(b"a", b"retries", b"0"), line("EMQ.RETRYDEAD", key("dead"), key("pending"), base, b"5"),
        # a row's level not an integer in range, met where a job goes back to its lane
        enqueue(b"b"), line("EMQ.CLAIM", key("pending"), key("active"), base, b"60000", b"COUNT", b"8"),
        hset(b"b", b"priority", b"1001"),
        line("EMQ.RELEASE", key("active"), key("pending"), base, b"b", held(b"b")),
        line("EMQ.FAIL", key("active"), key("pending"), key("dead"), base, b"b", held(b"b"), b"5", b"e",
             b"TRACE", b"t" * 65537),  # the fixed ceiling on a traceback
        hset(b"b", b"priority", b"-4"),
        line("EMQ.FAIL", key("active"), key("pending"), key("dead"), base, b"b", held(b"b"), b"5", b"e",
             b"TRACE", b"t" * 65536),
        # the rate limit's hash corrupt (issue 32), met by a claim and by EMQ.LIMIT, then repaired
        enqueue(b"c"), raw(lambda s: [b"HSET", b(s.keys.base) + b"limit", b"used", b"-1"]), claim,
        line("EMQ.LIMIT", key("pending"), base),
        raw(lambda s: [b"DEL", b(s.keys.base) + b"limit"]),
        line("EMQ.LIMIT", key("pending"), base, b"RATE", b"1", b"PER", b"86400000"), claim, claim,
        line("EMQ.LIMIT", key("pending"), base, b"OFF", b"BACKOFF", b"0"),
        # the range refusals, here too: the random traces reach them only by the draw
        line("EMQ.LIMIT", key("pending"), base, b"RATE", b"0", b"PER", b"86400000"),
        line("EMQ.LIMIT", key("pending"), base, b"RATE", b"2", b"PER", b"86400001"),
        # UNIQUE: every refusal; a key held, replaced, of the wrong type, an orphan taken over,
        # released by a CANCEL; ENQUEUEMANY refusing it
        *[uq(b"u", *bad) for bad in UNIQUE_BAD],
        uq(b"u", b"UNIQUE", b"g"), uq(b"v", b"UNIQUE", b"g"), uq(b"v", b"UNIQUE", b"g", b"REPLACE"),
        uq(b"v", b"UNIQUE", b"t", b"FOR", b"600000"), uq(b"w", b"UNIQUE", b"t", b"REPLACE"),
        raw(lambda s: [b"HSET", b(s.keys.base) + b"unique:h", b"f", b"v"]), uq(b"w", b"UNIQUE", b"h"),
        raw(lambda s: [b"SET", b(s.keys.base) + b"unique:o", b"ghost"]), uq(b"w", b"UNIQUE", b"o"),
        line("EMQ.CANCEL", key("pending"), base, b"u", b"r"), uq(b"x", b"UNIQUE", b"g"),
        line("EMQ.ENQUEUEMANY", key("pending"), base, b"1", b"y", b"p", b"UNIQUE", b"g"),
        # the head of a level (issue 39): released in separate calls, then a sweep's recoveries,
        # at a level above 0 and one below; a member of <base>priority without a row, dropped
        *[line("EMQ.ENQUEUE", key("pending"), base, j, b"p", b"PRIORITY", lv)
          for lv in (b"3", b"-3") for j in (lv + b"h1", lv + b"h2", lv + b"h3", lv + b"h4")],
        line("EMQ.CLAIM", key("pending"), key("active"), base, b"60000", b"COUNT", b"8"),
        line("EMQ.CLAIM", key("pending"), key("active"), base, b"60000", b"COUNT", b"8"),
        *[line("EMQ.RELEASE", key("active"), key("pending"), base, j, held(j))
          for j in (b"3h1", b"3h2", b"-3h1", b"-3h2")],
        *[raw(lambda s, j=j, at=at: [b"ZADD", b(s.keys.active), b"XX", at, j])  # two per level, one sweep
          for j, at in ((b"3h3", b"7"), (b"3h4", b"6"), (b"-3h3", b"9"), (b"-3h4", b"8"))],
        line("EMQ.SWEEP", key("active"), key("pending"), key("dead"), base, b"5", b"8"),
        raw(lambda s: [b"ZADD", b(s.keys.priority), str(1027 * 2**42).encode(), b"ghost"]),
        line("EMQ.CLAIM", key("pending"), key("active"), base, b"60000", b"COUNT", b"8"),
        line("EMQ.CLAIM", key("pending"), key("active"), base, b"60000", b"COUNT", b"8"),
        # GROUP (issue 45): every refusal of a name; a group's count corrupt, out of range or of
        # the wrong type, met by a claim, a complete, a sweep; a count at 2^53 that a claim would pass
        *[uq(b"gq", *bad) for bad in GROUP_BAD],
        line("EMQ.ENQUEUEMANY", key("pending"), base, b"1", b"gq", b"p", b"GROUP", b""),
        line("EMQ.ENQUEUEMANY", key("pending"), base, b"2", b"ga", b"p", b"gb", b"p", b"GROUP", b"g"),
        uq(b"gc", b"GROUP", b"g"), uq(b"gd", b"GROUP", b"h"),
        grp(b"g", b"x"), claim8, grp(b"g", b"1.5"), claim8, grp(b"g", b"9007199254740993"), claim8,
        grp(b"g", b"9007199254740992"), claim8, grp(b"g", b"9007199254740991"), claim8,
        raw(lambda s: [b"DEL", b(s.keys.base) + b"group:g"]), claim8, claim8,
        grp(b"g", b"-1"), line("EMQ.COMPLETE", key("active"), row(b"ga"), b"ga", held(b"ga")),
        raw(lambda s: [b"SET", b(s.keys.base) + b"group:g", b"s"]),
        line("EMQ.RELEASE", key("active"), key("pending"), base, b"gb", held(b"gb")),
        raw(lambda s: [b"DEL", b(s.keys.base) + b"group:g"]), grp(b"g", b"3"),
        line("EMQ.COMPLETE", key("active"), row(b"ga"), b"ga", held(b"ga")),
        lapse(b"gb"), lapse(b"gc"), lapse(b"gd"), grp(b"h", b"?"), sweep,
        grp(b"h", b"1"), sweep, sweep, claim8,
        # AFTER (issue 46): every refusal; a chain waiting, resolved by a complete, failed by a
        # fail (the cascade), a waiter cancelled, a resolution stopped by a corrupt `waits` and
        # by a waiter set of the wrong type, taken again by an enqueue and a sweep
        *[uq(b"dq", *bad) for bad in AFTER_BAD], enqueue(b"d1"),
        uq(b"d2", b"AFTER", b"d1"), uq(b"d3", b"ON_PARENT_FAILURE", b"continue", b"AFTER", b"d2", b"d1"),
        uq(b"d4", b"AFTER", b"d2"), uq(b"d5", b"MISSING", b"done", b"AFTER", b"d9", b"d3"),
        line("EMQ.CANCEL", key("pending"), base, b"d5", b"r"),
        claim8, line("EMQ.COMPLETE", key("active"), row(b"d1"), b"d1", held(b"d1")), claim8, fail(b"d2"),
        claim8, enqueue(b"d6"), uq(b"d7", b"AFTER", b"d6"), uq(b"d8", b"AFTER", b"d6"),
        hset(b"d7", b"waits", b"x"), claim8,
        line("EMQ.COMPLETE", key("active"), row(b"d6"), b"d6", held(b"d6")), hset(b"d7", b"waits", b"1"),
        enqueue(b"d0"), raw(lambda s: [b"SET", b(s.keys.base) + b"waiters:d0", b"s"]),
        uq(b"da", b"AFTER", b"d0"), sweep, claim8,
        # caps (EMQ.GROUPLIMIT): a cap of 1 a claim of 8 meets, a slot freed by COMPLETECLAIM, a
        # pause and a resume, a stored `max` corrupt (met by an enqueue and the verb), an
        # OBLITERATE without FORCE refused while a job is active
        raw(lambda s: [b"DEL", b(s.keys.base) + b"group:g", b(s.keys.base) + b"group:h"]),
        uq(b"k1", b"GROUP", b"k"), uq(b"k2", b"GROUP", b"k"), uq(b"k3", b"GROUP", b"k"),
        line("EMQ.GROUPLIMIT", key("pending"), base, b"k", b"MAX", b"1"), claim8,
        line("EMQ.COMPLETECLAIM", key("active"), row(b"k1"), key("pending"), b"k1", held(b"k1"), b"60000",
             b"COUNT", b"8"),
        line("EMQ.GROUPLIMIT", key("pending"), base, b"k", b"PAUSE", b"NOMAX"),
        line("EMQ.GROUPLIMIT", key("pending"), base, b"k", b"RESUME", b"MAX", b"3"),
        raw(lambda s: [b"HSET", b(s.keys.base) + b"group:k", b"max", b"0"]), uq(b"k4", b"GROUP", b"k"),
        line("EMQ.GROUPLIMIT", key("pending"), base, b"k"), claim8,
        # the default cap (`*`): set, met by a claim, corrupt in meta (met by the verb and a claim), removed
        line("EMQ.GROUPLIMIT", key("pending"), base, b"*", b"MAX", b"1"), claim8,
        raw(lambda s: [b"HSET", b(s.keys.base) + b"meta", b"group_max", b"x"]),
        line("EMQ.GROUPLIMIT", key("pending"), base, b"*"), claim8,
        raw(lambda s: [b"HDEL", b(s.keys.base) + b"meta", b"group_max"]),
        line("EMQ.GROUPLIMIT", key("pending"), base, b"*", b"NOMAX"),
        raw(lambda s: [b"HDEL", b(s.keys.base) + b"group:k", b"max"]), claim8,
        line("EMQ.OBLITERATE", key("active"), key("pending"), key("dead"), base, b"5"),
    ]  # fmt: skip
    for verb in _scripts.scripts():
        steps.append(line(verb))  # no arguments at all: the server's arity error
        steps.append(line(verb, key("pending")))
    return steps


# -- the tests --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def diff_server(server_factory: ServerFactory) -> EmbeddedServer:
    srv = server_factory(["--notify-keyspace-events", "KEA"])
    r = srv.client()
    r.config_set("emq.max-limit", MAX_LIMIT)
    r.config_set("emq.max-state-bytes", MAX_STATE_BYTES)
    r.config_set("emq.max-payload-bytes", MAX_PAYLOAD_BYTES)
    r.config_set("emq.max-result-bytes", MAX_RESULT_BYTES)
    r.close()
    return srv


TOTALS = Stats()


@pytest.mark.parametrize("seed", ["grid", *SEEDS])
def test_scripts_answer_and_write_exactly_what_the_module_does(
    diff_server: EmbeddedServer, seed: int | str
) -> None:
    diff_server.client().flushall()
    d = Differential(diff_server, 0 if seed == "grid" else int(seed))
    try:
        stats = d.run(grid() if seed == "grid" else STEPS)
    finally:
        d.close()
    TOTALS.steps += stats.steps
    TOTALS.claims += stats.claims
    TOTALS.resynced += stats.resynced
    TOTALS.outcomes.update(stats.outcomes)


def test_the_traces_reach_every_verb_and_its_refusals(diff_server: EmbeddedServer) -> None:
    """Runs after the traces: the comparison covered every verb, succeeding and refusing."""
    if TOTALS.steps == 0:
        pytest.skip("the traces did not run in this session")
    verbs = {k.split(" ")[0] for k in TOTALS.outcomes} - {"harness"}
    assert verbs == {s.verb for s in _scripts.scripts().values()}
    for verb in verbs:
        assert TOTALS.outcomes[f"{verb} ok"] > 0, verb
        assert any(k.startswith(f"{verb} error") for k in TOTALS.outcomes), verb
    errors = {k.split(" ", 2)[2] for k in TOTALS.outcomes if " error " in k}
    unreached = [text for text in REACHED_ERRORS if text not in errors]
    assert not unreached, "\n".join(unreached)
    print(f"\nbackends differential: {TOTALS.steps} steps, {TOTALS.claims} claims, "
          f"{sum(v for k, v in TOTALS.outcomes.items() if not k.startswith('harness'))} verb calls, "
          f"0 mismatches; times resynced after {TOTALS.resynced} steps")  # fmt: skip
    for key in sorted(TOTALS.outcomes):
        print(f"  {key}: {TOTALS.outcomes[key]}")


# Every error the traces must reach: the module's table (module/emq_core.c) but for what
# needs a cluster, an ACL or memory pressure (tests/verbs/test_backends.py has those), and each
# verb's arity error.
# AFTER_FIELD stops a drain of dependencies and is never answered (tests/verbs/test_dependencies.py).
# GROUP_WALK needs more than 10,000 groups (tests/verbs/test_group_default.py, both backends, literally).
UNREACHABLE_HERE = {"NO_HASH_TAG", "NOPERM_DERIVED", "TRYAGAIN", "OOM", "AFTER_FIELD", "GROUP_WALK"}
REACHED_ERRORS = [
    *(text for name, text in error_table().items() if name not in UNREACHABLE_HERE),
    *(f"ERR wrong number of arguments for '{verb.lower()}' command" for verb in _scripts.scripts()),
]

WRONG_CLAIM = ("redis.call('HINCRBY', j.row, 'attempts', 1)", "-- forgot: HINCRBY attempts")


def test_a_wrong_script_is_caught(diff_server: EmbeddedServer) -> None:
    """A CLAIM that forgets to bump `attempts` makes the differential fail, in every trace that claims.

    It answers the right token (its counter is computed) and writes the rest
    of the row: what gives it away is the `attempts` field left behind and the
    `hincrby` event that never fired.
    """
    # CLAIM's writes live in _claim.lua (shared with COMPLETECLAIM): inlined here, made wrong
    source = _scripts._file("claim.lua").replace("-- include: _claim.lua", _scripts._file("_claim.lua"))
    assert WRONG_CLAIM[0] in source
    table = {**_scripts.scripts(), "EMQ.CLAIM": _scripts.compose("claim", source.replace(*WRONG_CLAIM))}
    caught, quiet = [], []
    for seed in range(8):
        diff_server.client().flushall()
        d = Differential(diff_server, seed, table)
        try:
            stats = d.run(STEPS)
            quiet.append((seed, stats.claimed_by_claim))
        except AssertionError as exc:
            caught.append(str(exc))
        finally:
            d.close()
    # A trace goes unnoticed only if its CLAIMs never claimed a job (the wrong part never ran;
    # COMPLETECLAIM's claims are the right script's).
    assert all(claims == 0 for _, claims in quiet), f"the wrong CLAIM went unnoticed: {quiet}"
    assert len(caught) >= 4, quiet
    for message in caught:
        assert "EMQ.CLAIM" in message and ("hincrby" in message or "attempts" in message), message
