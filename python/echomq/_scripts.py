"""The scripts backend: every EMQ.* verb in Lua, for servers without the module.

Sans-I/O, like ``_protocol``: this file turns the command line a ``_protocol``
builder made for the module (``Call.args``) into the FCALL (or EVALSHA) that
runs the same verb in Lua, and says what to send when the server does not
have the code yet.  So there is one builder per verb and two renderings of
its result, and the two backends cannot drift: the Lua receives the very
arguments the module would, parses them as the C handler does (same checks,
same order, same error texts), and answers the same bytes.

The Lua lives in ``echomq/scripts/`` (package data), one file per verb beside
the C file it mirrors; ``_prelude.lua`` is what they share, and a verb file
may include a file its C twin shares with another verb (``-- include:
_lease.lua``).  A verb file's shebang line carries its flags: ``allow-oom``
exactly where the module command is not ``deny-oom``.

Loading.  The verbs are one Redis Functions library, ``echomq_<version>``
(the version is a hash of its code), one function per verb,
``emq_<verb>_<version>``.  The client calls them with FCALL; a node that
answers "Function not found" (a fresh, restarted or flushed server, a node
of a cluster the library has not reached yet) gets FUNCTION LOAD once, and
the call is sent again.  Why a library rather than EVALSHA: the shared code
(the prelude and the verbs' helpers) is built once, when the library loads;
a script runs all of it again on every call, which costs about 12 us per call
-- more than most verbs' own work (bench/backends.py measures both).  A
library is also kept in the RDB and the AOF and sent to replicas, so a
failover does not lose it.  Where the caller may not load a library (FUNCTION
LOAD refused: an ACL, a managed service), the client falls back, for good, to
the same code as one script per verb: EVALSHA, and on NOSCRIPT the same call
as EVAL once, which runs it and caches it on that node.  Both modes are the
same Lua, composed two ways (``library()``, ``scripts()``).  Clients of
different versions coexist (each loads its own library); an old library
stays until an operator removes it (FUNCTION DELETE).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

BackendName = Literal["module", "scripts"]
BackendChoice = Literal["module", "scripts", "auto"]
BACKENDS: tuple[BackendChoice, ...] = ("auto", "module", "scripts")

# The module's default settings (module/emq_config.c), which the scripts cannot read, and
# the highest values a server may set (module/emq_core.h: EMQ_MAX_LIMIT_CEILING,
# EMQ_MAX_STATE_BYTES_CEILING).
DEFAULT_MAX_LIMIT = 10_000
DEFAULT_MAX_STATE_BYTES = 65_536
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
MAX_LIMIT_CEILING = 100_000
MAX_STATE_BYTES_CEILING = 16 * 1024 * 1024
MAX_PAYLOAD_BYTES_CEILING = 16 * 1024 * 1024
MAX_RESULT_BYTES_CEILING = 16 * 1024 * 1024


@dataclass(frozen=True)
class ScriptLimits:
    """The server-side settings a script cannot read, given to the scripts by the client.

    With the module, ``emq.max-limit`` (the most jobs one command takes:
    SWEEP's, RETRYDEAD's, PURGE's and OBLITERATE's ``limit``, ENQUEUEMANY's
    ``count``, FORGET's ids, CLAIM's ``COUNT`` below 1,000),
    ``emq.max-state-bytes`` (the largest checkpoint state or progress),
    ``emq.max-payload-bytes`` (the largest payload) and
    ``emq.max-result-bytes`` (the largest result) are the operator's, on the
    server; the scripts take them from here instead.  Keep them equal to the
    server's if a module is also in use; the defaults are the module's
    defaults, and the ranges the module's (``max_limit`` from 1 to 100,000;
    the sizes from 0 to 16 MiB).
    """

    max_limit: int = DEFAULT_MAX_LIMIT
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES

    def __post_init__(self) -> None:
        for name in ("max_limit", "max_state_bytes", "max_payload_bytes", "max_result_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if not 1 <= self.max_limit <= MAX_LIMIT_CEILING:
            raise ValueError(f"max_limit must be from 1 to {MAX_LIMIT_CEILING}, got {self.max_limit}")
        for name, ceiling in (
            ("max_state_bytes", MAX_STATE_BYTES_CEILING),
            ("max_payload_bytes", MAX_PAYLOAD_BYTES_CEILING),
            ("max_result_bytes", MAX_RESULT_BYTES_CEILING),
        ):
            if not 0 <= getattr(self, name) <= ceiling:
                raise ValueError(f"{name} must be from 0 to {ceiling}, got {getattr(self, name)}")


def check_backend(backend: object) -> BackendChoice:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend


# -- the scripts ---------------------------------------------------------------------

VERBS = (
    "enqueue", "enqueuemany", "claim", "completeclaim", "extend", "checkpoint", "complete", "fail",
    "release", "cancel", "sweep", "retention", "retry", "retrydead", "purge", "pause", "resume",
    "obliterate", "forget", "limit", "grouplimit",
)  # fmt: skip

_INCLUDE = re.compile(r"^-- include: (\S+)$", re.MULTILINE)


def _file(name: str) -> str:
    return resources.files("echomq").joinpath("scripts").joinpath(name).read_text(encoding="utf-8")


# What every verb shares, by concept as the C files are, read as one text in this order (one
# function's body: its locals are each other's): emq_core.c's errors, parsing and limits;
# emq_keys.c's keys, ACL, settings and fence; the v3 keyspace and the lanes (emq_row.c,
# emq_lanes.c); the dependencies (emq_deps.c); the end hooks and unique keys (emq_end.c,
# emq_unique.c), which returns ``emq``.
PRELUDE = ("_prelude.lua", "_keys.lua", "_lanes.lua", "_deps.lua", "_end.lua")


def _prelude() -> str:
    return "".join(_file(name) for name in PRELUDE)


def _parts(verb: str, body: str | None) -> tuple[str, list[str], str]:
    """A verb file's shebang line, its includes and its body (after the shebang)."""
    text = body if body is not None else _file(f"{verb}.lua")
    shebang, _, rest = text.partition("\n")
    if not shebang.startswith("#!lua"):
        raise ValueError(f"{verb}.lua must start with a #!lua shebang line")
    return shebang, _INCLUDE.findall(rest), rest


def _flags(shebang: str) -> list[str]:
    return [f for f in shebang.partition("flags=")[2].split(",") if f]


@dataclass(frozen=True)
class Script:
    """One verb's script as EVALSHA runs it."""

    verb: str
    source: bytes
    sha: str

    @property
    def flags(self) -> str:
        """The shebang's flags (``allow-oom`` where the module command is not deny-oom)."""
        return ",".join(_flags(self.source.split(b"\n", 1)[0].decode()))


def compose(verb: str, body: str | None = None) -> Script:
    """The script of ``verb`` (``"claim"``): shebang, prelude, includes, the verb called at once.

    ``body`` replaces the verb file's text (the differential test swaps in a
    deliberately wrong script this way).
    """
    shebang, includes, rest = _parts(verb, body)
    parts = [shebang, "local emq = (function()", _prelude(), "end)()"]
    parts += [_file(name) for name in includes]
    parts += ["return (function()", rest, "end)()()"]
    source = "\n".join(parts).encode()
    return Script(f"EMQ.{verb.upper()}", source, hashlib.sha1(source).hexdigest())


@cache
def scripts() -> dict[str, Script]:
    """Every verb's script, by the module command's name in upper case (``"EMQ.CLAIM"``)."""
    return {s.verb: s for s in (compose(v) for v in VERBS)}


@dataclass(frozen=True)
class Library:
    """Every verb as one Redis Functions library: its name, its code, each verb's function."""

    name: str
    source: bytes
    functions: dict[str, str]  # "EMQ.CLAIM" -> "emq_claim_<version>"


@cache
def library() -> Library:
    """The library: the prelude, each shared file once, each verb made once at load.

    The verbs' code reads KEYS and ARGV; in a library they are the callback's
    arguments, handed over in two locals of the library before each verb runs.
    """
    includes: list[str] = []
    verbs = []
    for verb in VERBS:
        shebang, incl, rest = _parts(verb, None)
        includes += [name for name in incl if name not in includes]
        verbs.append((verb, _flags(shebang), rest))
    parts = [
        "#!lua name=echomq_{version}",
        "local KEYS, ARGV",
        "local emq = (function()",
        _prelude(),
        "end)()",
        *(_file(name) for name in includes),
    ]
    for verb, flags, rest in verbs:
        listed = ", ".join(repr(f) for f in flags)
        parts += [
            f"local verb_{verb} = (function()",
            rest,
            "end)()",
            "redis.register_function{",
            f"    function_name = 'emq_{verb}_{{version}}',",
            f"    callback = function(keys, args) KEYS, ARGV = keys, args return verb_{verb}() end,",
            f"    flags = {{ {listed} }},",
            "}",
        ]
    template = "\n".join(parts)
    version = hashlib.sha1(template.encode()).hexdigest()[:12]
    source = template.replace("{version}", version).encode()
    return Library(
        f"echomq_{version}", source, {f"EMQ.{verb.upper()}": f"emq_{verb}_{version}" for verb in VERBS}
    )


# -- the keys each call declares ----------------------------------------------------
# KEYS are what the server checks (ACL) and routes by (cluster) before the
# script runs: the keys the module command declares, plus the keys derived
# from <base> that the verb always touches and that are known before the call
# (the row of a named id, a claim's request record, the settings of the verbs
# that always read them).  Keys found at run time (a claim's heads, a sweep's
# lapsed rows, the members of a dead-set batch) are in the same slot (the
# hash tag) and are checked by the script itself.  Positions are the module's
# argv (argv[1] = args[0]); a short, malformed line declares what it has, and
# the script answers its error.

KeyFn = Callable[[Sequence[Any]], list[Any]]


def _cat(a: Any, b: Any) -> Any:
    if isinstance(a, bytes) or isinstance(b, bytes):
        return _b(a) + _b(b)
    return str(a) + str(b)


def _b(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape")
    return str(v).encode()


def _keys(positions: Sequence[int], derived: Sequence[tuple[int, str, int | None]] = ()) -> KeyFn:
    """Keys at argv ``positions``, then ``argv[base] + mid + argv[tail]`` for each derived."""

    def keys(argv: Sequence[Any]) -> list[Any]:
        out = [argv[p - 1] for p in positions if p <= len(argv)]
        for base, mid, tail in derived:
            if base <= len(argv) and (tail is None or tail <= len(argv)):
                out.append(_cat(_cat(argv[base - 1], mid), argv[tail - 1] if tail else ""))
        return out

    return keys


def _claim_keys(argv: Sequence[Any]) -> list[Any]:
    out = _keys((1, 2), ((3, "meta", None),))(argv)
    for i in range(4, len(argv) - 1, 2):  # options after <lease-ms>: the first REQ names the record
        if _b(argv[i]).upper() == b"REQ" and len(argv) > 2:
            out.append(_cat(_cat(argv[2], "req:"), argv[i + 1]))
            break
    return out


def _completeclaim_keys(argv: Sequence[Any]) -> list[Any]:
    out = list(argv[:3])
    active = argv[0] if argv else ""
    suffix = b"active" if isinstance(active, bytes) else "active"
    if not active.endswith(suffix):  # type: ignore[arg-type]
        return out  # the script answers the <job> key's error; nothing more to declare
    base = active[: len(active) - len(suffix)]
    out.append(_cat(base, "meta"))
    for i in range(6, len(argv) - 1, 2):  # options after <lease-ms>: the first REQ names the record
        if _b(argv[i]).upper() == b"REQ":
            out.append(_cat(_cat(base, "req:"), argv[i + 1]))
            break
    return out


def _record_key(argv: Sequence[Any], base: int, first_option: int) -> list[Any]:
    """An enqueue's request record, ``<base>req:<request-id>``, when the options name one (the first REQ)."""
    for i in range(first_option - 1, len(argv) - 1, 2):
        if _b(argv[i]).upper() == b"REQ" and base <= len(argv):
            return [_cat(_cat(argv[base - 1], "req:"), argv[i + 1])]
    return []


def _enqueue_keys(argv: Sequence[Any]) -> list[Any]:
    return [*_keys((1,), ((2, "job:", 3),))(argv), *_record_key(argv, 2, 5)]


def _enqueuemany_keys(argv: Sequence[Any]) -> list[Any]:
    out = list(argv[:1])
    try:
        count = int(argv[2])
    except (IndexError, TypeError, ValueError):
        return out
    if len(argv) >= 2:
        # the ids the line has, never more: a count may be anything (2^62, say), the line is short
        held = min(max(count, 0), max(len(argv) - 3, 0) // 2 + 1)
        ids = [argv[3 + 2 * i] for i in range(held) if 3 + 2 * i < len(argv)]
        out += [_cat(_cat(argv[1], "job:"), i) for i in ids]
        if 0 <= count == held:
            out += _record_key(argv, 2, 4 + 2 * count)
    return out


def _forget_keys(argv: Sequence[Any]) -> list[Any]:
    out = argv[:1]
    if len(argv) >= 2:
        out = [*out, *(_cat(_cat(argv[1], "job:"), i) for i in argv[2:])]
    return list(out)


KEYS_OF: dict[str, KeyFn] = {
    "EMQ.ENQUEUE": _enqueue_keys,
    "EMQ.ENQUEUEMANY": _enqueuemany_keys,
    "EMQ.CLAIM": _claim_keys,
    "EMQ.COMPLETECLAIM": _completeclaim_keys,
    "EMQ.EXTEND": _keys((1, 2)),
    "EMQ.CHECKPOINT": _keys((1, 2)),
    "EMQ.COMPLETE": _keys((1, 2)),
    "EMQ.FAIL": _keys((1, 2, 3), ((4, "job:", 5),)),
    "EMQ.RELEASE": _keys((1, 2), ((3, "job:", 4),)),
    "EMQ.CANCEL": _keys((1,), ((2, "job:", 3),)),
    "EMQ.SWEEP": _keys((1, 2, 3), ((4, "meta", None),)),
    "EMQ.RETENTION": _keys((1,)),
    "EMQ.RETRY": _keys((1, 2), ((3, "job:", 4),)),
    "EMQ.RETRYDEAD": _keys((1, 2)),
    "EMQ.PURGE": _keys((1,)),
    "EMQ.PAUSE": _keys((1,), ((2, "meta", None),)),
    "EMQ.RESUME": _keys((1,), ((2, "meta", None),)),
    "EMQ.OBLITERATE": _keys((1, 2, 3), ((4, "meta", None),)),
    "EMQ.FORGET": _forget_keys,
    "EMQ.LIMIT": _keys((1,), ((2, "limit", None),)),
    "EMQ.GROUPLIMIT": _keys((1,)),
}


# -- rendering -----------------------------------------------------------------------


def new_nonce() -> str:
    """CLAIM's nonce: 8 fresh random bytes, the random part of its tokens (claim.lua says how)."""
    return os.urandom(8).hex()


# The verbs that take a count or a list, bounded by emq.max-limit.
LIMITED = ("EMQ.SWEEP", "EMQ.RETRYDEAD", "EMQ.PURGE", "EMQ.OBLITERATE", "EMQ.FORGET")


def setting(verb: str, limits: ScriptLimits) -> Any:
    """The one value the script of ``verb`` needs from the client (ARGV[1])."""
    if verb == "EMQ.CLAIM":
        return f"{new_nonce()} {limits.max_limit}"
    if verb == "EMQ.COMPLETECLAIM":
        return f"{new_nonce()} {limits.max_limit} {limits.max_result_bytes}"
    if verb in ("EMQ.ENQUEUE", "EMQ.ENQUEUEMANY"):
        return f"{limits.max_limit} {limits.max_payload_bytes}"
    if verb in LIMITED:
        return limits.max_limit
    if verb == "EMQ.CHECKPOINT":
        return limits.max_state_bytes
    if verb == "EMQ.COMPLETE":
        return limits.max_result_bytes
    return ""


def verb_of(args: Sequence[Any]) -> str:
    name = args[0]
    return (name.decode() if isinstance(name, bytes) else str(name)).upper()


Mode = Literal["functions", "eval"]


def render(
    args: Sequence[Any], limits: ScriptLimits, table: dict[str, Script] | None = None, mode: Mode = "eval"
) -> tuple[Any, ...]:
    """The FCALL (``mode="functions"``) or EVALSHA that runs the module command line ``args``."""
    verb = verb_of(args)
    argv = args[1:]
    keys = KEYS_OF[verb](argv)
    name = library().functions[verb] if mode == "functions" else (table or scripts())[verb].sha
    command = "FCALL" if mode == "functions" else "EVALSHA"
    return (command, name, len(keys), *keys, setting(verb, limits), *argv)


def eval_form(command: Sequence[Any], table: dict[str, Script] | None = None) -> tuple[Any, ...]:
    """The EVAL twin of a rendered EVALSHA: sent once when the node answers NOSCRIPT.

    Nothing ran (NOSCRIPT is answered before the script starts), so sending
    the same call again as EVAL is safe; it also caches the script on that
    node, so the next EVALSHA finds it.
    """
    sha = command[1]
    for script in (table or scripts()).values():
        if script.sha == sha:
            return ("EVAL", script.source, *command[2:])
    raise KeyError(f"no script with SHA1 {sha}")


def load_refused(error: Exception) -> bool:
    """Is FUNCTION LOAD refused for good (an ACL, a server without Functions), not a race?"""
    return "already exists" not in str(error)


# -- choosing the backend ----------------------------------------------------------

PROBE = ("COMMAND INFO", "emq.claim")
"""Asked once per client when the backend is "auto": does the server know EMQ.CLAIM?

One argument "COMMAND INFO" (redis-py splits it) keeps redis-py's COMMAND
parser away from the null it answers for an unknown command."""


def backend_from_probe(reply: Any) -> BackendName:
    """The backend a ``PROBE`` reply calls for: the module when the server has it."""
    if isinstance(reply, dict):  # a cluster client's {node: reply}
        reply = next(iter(reply.values()), None)
    if isinstance(reply, list | tuple) and reply and reply[0]:
        return "module"
    return "scripts"


class ClaimPoll:
    """A blocking claim on the scripts backend: claims polled with backoff, on the client.

    A script may not block, so ``claim(..., block_ms=...)`` becomes a claim
    now, then again after 1 ms, 2, 4, ... up to ``MAX_PAUSE_MS`` between tries,
    until a job comes or ``block_ms`` has passed (0: no limit); the last try
    is at the deadline, so the claim never ends before ``block_ms``.  While
    the queue stays empty a waiting claimer costs the server one claim per
    ``MAX_PAUSE_MS`` (20 a second), and a job enqueued meanwhile waits at
    most that long for it (half, on average) -- the module's BLOCK costs no
    command and hands the job over at once (bench/backends.py measures both).
    """

    FIRST_PAUSE_MS = 1
    MAX_PAUSE_MS = 50

    def __init__(self, block_ms: int, now: float) -> None:
        if isinstance(block_ms, bool) or not isinstance(block_ms, int) or not 0 <= block_ms <= 2**53:
            raise ValueError(f"block_ms must be an int between 0 and 2**53 ms, got {block_ms!r}")
        self.deadline = None if block_ms == 0 else now + block_ms / 1000
        self.pause_ms = self.FIRST_PAUSE_MS

    def next_pause(self, now: float) -> float | None:
        """Seconds to wait before the next try, or None when the time is up."""
        if self.deadline is not None and now >= self.deadline:
            return None
        pause = self.pause_ms / 1000
        self.pause_ms = min(self.pause_ms * 2, self.MAX_PAUSE_MS)
        return pause if self.deadline is None else min(pause, self.deadline - now)


@dataclass(frozen=True)
class Rendering:
    """How a client sends a ``Call``: as the EMQ.* command, or as its Lua (FCALL or EVALSHA)."""

    name: BackendName
    limits: ScriptLimits = ScriptLimits()
    mode: Mode = "functions"

    def command(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if self.name == "module":
            return args
        return render(args, self.limits, mode=self.mode)

    def load(self) -> tuple[Any, ...] | None:
        """What to send to a node that lacks the code, before the call again: FUNCTION LOAD
        (functions), or nothing (eval: the call itself goes as EVAL, ``again``)."""
        return ("FUNCTION", "LOAD", library().source) if self.mode == "functions" else None

    def again(self, command: tuple[Any, ...]) -> tuple[Any, ...]:
        """The call to send again once the node has the code (or as EVAL, which loads it)."""
        return command if self.mode == "functions" else eval_form(command)

    def as_eval(self) -> Rendering:
        """The fallback where FUNCTION LOAD is refused: one script per verb."""
        return Rendering(self.name, self.limits, "eval")
