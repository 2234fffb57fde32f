"""The scripts backend: every EMQ.* verb as a Lua script, for servers without the module.

Sans-I/O, like ``_protocol``: this file turns the command line a ``_protocol``
builder made for the module (``Call.args``) into the EVALSHA that runs the same
verb as a script, and says how to run it when the server does not have the
script yet.  So there is one builder per verb and two renderings of its
result, and the two backends cannot drift: the script receives the very
arguments the module would, parses them as the C handler does (same checks,
same order, same error texts), and answers the same bytes.

The scripts live in ``echomq/scripts/`` (package data), one file per verb
beside the C file it mirrors; ``_prelude.lua`` is what they share, and a verb
file may include a file its C twin shares with another verb (``-- include:
_lease.lua``).  A script as loaded is: the verb file's shebang line (its
flags: ``allow-oom`` exactly where the module command is not ``deny-oom``),
the prelude, the includes, the verb's body.

Loading: EVALSHA, and on NOSCRIPT (a fresh, restarted or failed-over node, or
one whose cache was flushed) the same call as EVAL once, which runs the script
and caches it on that node.  Nothing is loaded ahead and nothing has to be
cleaned up; clients of different versions coexist (a script is named by its
SHA1); it works the same on a single server, a replica set and every node of
a cluster (EVAL is routed by its keys like EVALSHA).
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

# The module's default settings (module/emq_config.c), which the scripts cannot read.
DEFAULT_MAX_LIMIT = 10_000
DEFAULT_MAX_STATE_BYTES = 65_536


@dataclass(frozen=True)
class ScriptLimits:
    """The server-side settings a script cannot read, given to the scripts by the client.

    With the module, ``emq.max-limit`` (the largest SWEEP ``limit`` and
    ENQUEUEMANY ``count``) and
    ``emq.max-state-bytes`` (the largest checkpoint state) are the
    operator's, on the server; the scripts take them from here instead.  Keep
    them equal to the server's if a module is also in use; the defaults are
    the module's defaults.
    """

    max_limit: int = DEFAULT_MAX_LIMIT
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES

    def __post_init__(self) -> None:
        for name in ("max_limit", "max_state_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if self.max_limit < 1:
            raise ValueError(f"max_limit must be >= 1, got {self.max_limit}")
        if self.max_state_bytes < 0:
            raise ValueError(f"max_state_bytes must be >= 0, got {self.max_state_bytes}")


def check_backend(backend: object) -> BackendChoice:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend


# -- the scripts ---------------------------------------------------------------------

VERBS = (
    "enqueue", "enqueuemany", "claim", "extend", "checkpoint", "complete", "fail", "release", "cancel",
    "sweep", "retention", "retry", "retrydead", "purge", "pause", "resume", "obliterate", "forget",
)  # fmt: skip

_INCLUDE = re.compile(r"^-- include: (\S+)$", re.MULTILINE)


def _file(name: str) -> str:
    return resources.files("echomq").joinpath("scripts").joinpath(name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Script:
    """One verb's script as the server runs it."""

    verb: str
    source: bytes
    sha: str

    @property
    def flags(self) -> str:
        """The shebang's flags (``allow-oom`` where the module command is not deny-oom)."""
        first = self.source.split(b"\n", 1)[0].decode()
        return first.partition("flags=")[2]


def compose(verb: str, body: str | None = None) -> Script:
    """The script of ``verb`` (``"claim"``): shebang, prelude, includes, body.

    ``body`` replaces the verb file's text (the differential test swaps in a
    deliberately wrong script this way).
    """
    text = body if body is not None else _file(f"{verb}.lua")
    shebang, _, rest = text.partition("\n")
    if not shebang.startswith("#!lua"):
        raise ValueError(f"{verb}.lua must start with a #!lua shebang line")
    parts = [shebang, "local emq = (function()", _file("_prelude.lua"), "end)()"]
    parts += [_file(name) for name in _INCLUDE.findall(rest)]
    parts.append(rest)
    source = "\n".join(parts).encode()
    return Script(f"EMQ.{verb.upper()}", source, hashlib.sha1(source).hexdigest())


@cache
def scripts() -> dict[str, Script]:
    """Every verb's script, by the module command's name in upper case (``"EMQ.CLAIM"``)."""
    return {s.verb: s for s in (compose(v) for v in VERBS)}


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


def _enqueuemany_keys(argv: Sequence[Any]) -> list[Any]:
    out = list(argv[:1])
    try:
        count = int(argv[2])
    except (IndexError, TypeError, ValueError):
        return out
    if len(argv) >= 2:
        ids = [argv[3 + 2 * i] for i in range(max(count, 0)) if 3 + 2 * i < len(argv)]
        out += [_cat(_cat(argv[1], "job:"), i) for i in ids]
    return out


def _forget_keys(argv: Sequence[Any]) -> list[Any]:
    out = argv[:1]
    if len(argv) >= 2:
        out = [*out, *(_cat(_cat(argv[1], "job:"), i) for i in argv[2:])]
    return list(out)


KEYS_OF: dict[str, KeyFn] = {
    "EMQ.ENQUEUE": _keys((1,), ((2, "job:", 3),)),
    "EMQ.ENQUEUEMANY": _enqueuemany_keys,
    "EMQ.CLAIM": _claim_keys,
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
}


# -- rendering -----------------------------------------------------------------------


def new_nonce() -> str:
    """CLAIM's nonce: 8 fresh random bytes, the random part of its tokens (claim.lua says how)."""
    return os.urandom(8).hex()


def setting(verb: str, limits: ScriptLimits) -> Any:
    """The one value the script of ``verb`` needs from the client (ARGV[1])."""
    if verb == "EMQ.CLAIM":
        return new_nonce()
    if verb in ("EMQ.SWEEP", "EMQ.ENQUEUEMANY"):
        return limits.max_limit
    if verb == "EMQ.CHECKPOINT":
        return limits.max_state_bytes
    return ""


def verb_of(args: Sequence[Any]) -> str:
    name = args[0]
    return (name.decode() if isinstance(name, bytes) else str(name)).upper()


def render(
    args: Sequence[Any], limits: ScriptLimits, table: dict[str, Script] | None = None
) -> tuple[Any, ...]:
    """The EVALSHA that runs the module command line ``args`` as its script."""
    verb = verb_of(args)
    script = (table or scripts())[verb]
    argv = args[1:]
    keys = KEYS_OF[verb](argv)
    return ("EVALSHA", script.sha, len(keys), *keys, setting(verb, limits), *argv)


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
    """How a client sends a ``Call``: as the EMQ.* command, or as its script."""

    name: BackendName
    limits: ScriptLimits = ScriptLimits()

    def command(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if self.name == "module":
            return args
        return render(args, self.limits)

    def on_noscript(self, command: tuple[Any, ...]) -> tuple[Any, ...]:
        return eval_form(command)
