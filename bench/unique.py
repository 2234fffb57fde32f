"""Unique jobs (issue 31): what UNIQUE costs an enqueue, and what a unique key costs in memory.

    .venv/bin/python bench/unique.py [--quick]    # also: bench/run.py --only unique; make bench

On Redis 7.0 and Valkey 8 (bench/memory.py's engines), a server of its own per measurement
(emq.so of this tree, no persistence), 76-byte payloads and 29-character ids as
Client.enqueue makes them, no REQ:

a. ENQUEUE's server usec per call (INFO commandstats after CONFIG RESETSTAT): plain; with
   UNIQUE and a fresh key each (the job is added and takes its key); with UNIQUE on a key
   held (nothing added: the key and the holder's state are read); with UNIQUE ... FOR.
b. Bytes per waiting job (used_memory delta / jobs): plain, and with a unique key of 16
   bytes (the row's `unique` field and the string key <base>unique:<key>).

Median of the rounds.  Results go to bench/results/unique-*.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench import _results as results  # noqa: E402
from bench.memory import PAYLOAD, engines, pipelined, server, used  # noqa: E402
from echomq._protocol.calls import new_id  # noqa: E402

B = "emq:{u}:"


@dataclass(frozen=True)
class Sizes:
    jobs: int
    rounds: int


FULL = Sizes(jobs=20_000, rounds=5)
QUICK = Sizes(jobs=2_000, rounds=1)

KINDS = ("plain", "UNIQUE, a new key", "UNIQUE, the key held", "UNIQUE ... FOR 60000, a new key")


def key_of(i: int) -> str:
    return f"order:{i:010d}"  # 16 bytes


def commands(kind: str, jobs: int) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for i in range(jobs):
        args: list[Any] = ["EMQ.ENQUEUE", B + "pending", B, new_id(), PAYLOAD]
        if kind == "UNIQUE, a new key":
            args += ["UNIQUE", key_of(i)]
        elif kind == "UNIQUE, the key held":
            args += ["UNIQUE", "held"]
        elif kind.startswith("UNIQUE ... FOR"):
            args += ["UNIQUE", key_of(i), "FOR", 60_000]
        out.append(tuple(args))
    return out


def enqueue_usec(r: redis.Redis, kind: str, jobs: int) -> float:
    r.execute_command("FLUSHALL", "SYNC")
    pipelined(r, [("EMQ.ENQUEUE", B + "pending", B, b"holder", PAYLOAD, "UNIQUE", "held")])
    batch = commands(kind, jobs)
    r.config_resetstat()
    pipelined(r, batch)
    stats = r.info("commandstats")["cmdstat_emq.enqueue"]
    assert int(stats["calls"]) == jobs, stats
    return float(stats["usec_per_call"])


def bytes_per_job(binary: str, module: Path, kind: str, jobs: int) -> float:
    with server(binary, module) as r:  # a fresh server: no freed memory still being given back
        return _bytes_per_job(r, kind, jobs)


def _bytes_per_job(r: redis.Redis, kind: str, jobs: int) -> float:
    pipelined(r, [("EMQ.ENQUEUE", B + "pending", B, b"warm", PAYLOAD)])  # the queue's keys exist
    base = used(r)
    pipelined(r, commands(kind, jobs))
    return (used(r) - base) / jobs


def run(sizes: Sizes, command: str) -> dict[str, Any]:
    res: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "sizes": sizes.__dict__,
        "usec": {},
        "bytes": {},
    }
    module = ROOT / "module" / "emq.so"
    for engine, binary in engines().items():
        print(f"bench: unique {engine} ...", file=sys.stderr, flush=True)
        usec: dict[str, list[float]] = {}
        size: dict[str, list[float]] = {}
        with server(binary, module) as r:
            for _ in range(sizes.rounds):
                for kind in KINDS:  # interleaved: every kind shares the machine's drift
                    usec.setdefault(kind, []).append(enqueue_usec(r, kind, sizes.jobs))
        for kind in ("plain", "UNIQUE, a new key"):
            size[kind] = [bytes_per_job(binary, module, kind, sizes.jobs)]
        res["usec"][engine] = {k: statistics.median(v) for k, v in usec.items()}
        res["bytes"][engine] = {k: statistics.median(v) for k, v in size.items()}
    return res


def markdown(res: dict[str, Any]) -> str:
    engines_ = list(res["usec"])
    out = [
        f"Unique jobs, {res['date']}, `{res['command']}` ({res['machine']}); "
        f"{res['sizes']['jobs']:,} enqueues per measurement, median of {res['sizes']['rounds']} rounds.",
        "",
        "ENQUEUE, server usec per call:",
        "",
        "| enqueue | " + " | ".join(engines_) + " |",
        "|---|" + "---:|" * len(engines_),
    ]
    for kind in KINDS:
        cells = []
        for e in engines_:
            v, plain = res["usec"][e][kind], res["usec"][e]["plain"]
            cells.append(f"{v:.2f}" + ("" if kind == "plain" else f" ({v / plain:.2f}x)"))
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Bytes per waiting job (used_memory; a 16-byte unique key):",
        "",
        "| job | " + " | ".join(engines_) + " |",
        "|---|" + "---:|" * len(engines_),
    ]
    for kind in ("plain", "UNIQUE, a new key"):
        out.append(f"| {kind} | " + " | ".join(f"{res['bytes'][e][kind]:,.0f}" for e in engines_) + " |")
    adds = [f"{e}: +{res['bytes'][e]['UNIQUE, a new key'] - res['bytes'][e]['plain']:,.0f}" for e in engines_]
    out += ["", "A unique key adds, per job: " + "; ".join(adds) + " bytes."]
    return "\n".join(out) + "\n"


def main_section(quick: bool, command: str) -> int:
    res = run(QUICK if quick else FULL, command)
    text = markdown(res)
    results.save("unique", res, text)
    print(text, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a verdict")
    args = parser.parse_args(argv)
    return main_section(args.quick, "bench/unique.py" + (" --quick" if args.quick else ""))


if __name__ == "__main__":
    sys.exit(main())
