"""Two builds of emq.so side by side: did a change make EXTEND or SWEEP slower?

    .venv/bin/python bench/builds.py OLD/emq.so NEW/emq.so [--jobs 100000] [--rounds 3]

Each build is loaded into a redis-server of its own (echomq.testing.EmbeddedServer);
the two are measured in interleaved rounds, so both share the machine's drift:

- EXTEND: redis-benchmark, pipeline 16, one live job, against each server; the
  server's own time per call (INFO commandstats usec_per_call after CONFIG
  RESETSTAT) and the calls per second redis-benchmark saw.
- SWEEP: ``--jobs`` claimed jobs with a 1 ms lease, lapsed, recovered by SWEEP
  calls of limit 10,000: server microseconds per recovered job.

It speaks only the commands every build since the first round has (ENQUEUE,
CLAIM, EXTEND, SWEEP with their first-round arguments), so an old commit's
build can be measured against today's.  Prints a table of medians and the
ratio new/old; a ratio near 1.0 is no regression.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from pathlib import Path

import redis

from echomq.testing import EmbeddedServer

Q = "emq:{bench}:"


def populate(r: redis.Redis, jobs: int, lease_ms: int) -> list[tuple[object, object]]:
    """Enqueue and claim ``jobs`` jobs; their (id, token) pairs."""
    for start in range(0, jobs, 1000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(start + 1000, jobs)):
            pipe.execute_command("EMQ.ENQUEUE", Q + "pending", Q, f"j{i}", b"x")
        pipe.execute()
    held = []
    for start in range(0, jobs, 1000):
        pipe = r.pipeline(transaction=False)
        for _ in range(start, min(start + 1000, jobs)):
            pipe.execute_command("EMQ.CLAIM", Q + "pending", Q + "active", Q, lease_ms)
        for reply in pipe.execute():
            job = reply[0] if isinstance(reply[0], list) else reply  # [job, ...] since CLAIM took COUNT
            held.append((job[0], job[1]))
    return held


def usec_per_call(r: redis.Redis, command: str) -> float:
    stats = r.info("commandstats").get(f"cmdstat_{command}")
    return float(stats["usec_per_call"]) if stats else float("nan")


def extend_round(server: EmbeddedServer, job: tuple[object, object], calls: int) -> tuple[float, float]:
    r = server.client()
    r.config_resetstat()
    job_id, token = (part.decode() if isinstance(part, bytes) else str(part) for part in job)
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(server.port),
            "-n",
            str(calls),
            "-P",
            "16",
            "-q",
            "EMQ.EXTEND",
            Q + "active",
            Q + "job:" + job_id,
            job_id,
            token,
            "60000",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rate = float(re.findall(r"([\d.]+) requests per second", out)[-1])
    return usec_per_call(r, "emq.extend"), rate


def sweep_round(server: EmbeddedServer, jobs: int) -> float:
    r = server.client()
    r.flushall()
    populate(r, jobs, lease_ms=1)
    time.sleep(0.01)
    r.config_resetstat()
    recovered = 0
    while recovered < jobs:  # limits of 10,000 (today's emq.max-limit default), as a reaper sweeps
        reply = r.execute_command("EMQ.SWEEP", Q + "active", Q + "pending", Q + "dead", Q, 100, 10_000)
        if not reply[0]:
            break
        recovered += len(reply[0])  # [recovered ids, dead-lettered ids]
    assert recovered == jobs, f"SWEEP recovered {recovered} of {jobs}"
    stats = r.info("commandstats")["cmdstat_emq.sweep"]
    return float(stats["usec"]) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("old", type=Path, help="the build before the change (emq.so)")
    parser.add_argument("new", type=Path, help="the build after the change (emq.so)")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs swept per SWEEP round")
    parser.add_argument("--calls", type=int, default=300_000, help="EXTEND calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    builds = {"old": args.old.resolve(), "new": args.new.resolve()}
    servers = {name: EmbeddedServer(module=path).start() for name, path in builds.items()}
    try:
        results: dict[str, dict[str, list[float]]] = {
            n: {"ext_us": [], "ext_rate": [], "sweep_us": []} for n in builds
        }
        for rnd in range(args.rounds):
            order = list(builds) if rnd % 2 == 0 else list(reversed(builds))
            for name in order:
                r = servers[name].client()
                r.flushall()
                job = populate(r, 1, lease_ms=600_000)[0]
                us, rate = extend_round(servers[name], job, args.calls)
                results[name]["ext_us"].append(us)
                results[name]["ext_rate"].append(rate)
                results[name]["sweep_us"].append(sweep_round(servers[name], args.jobs))
    finally:
        for server in servers.values():
            server.stop()
    med = {n: {k: statistics.median(v) for k, v in m.items()} for n, m in results.items()}
    print(f"old: {builds['old']}\nnew: {builds['new']}\n{args.rounds} interleaved rounds, medians")
    print("| measure | old | new | new/old |\n|---|---|---|---|")
    for key, label in (
        ("ext_us", "EXTEND server usec/call"),
        ("ext_rate", "EXTEND calls/s (P16)"),
        ("sweep_us", f"SWEEP server usec/recovered job ({args.jobs:,} lapsed)"),
    ):
        old, new = med["old"][key], med["new"][key]
        print(f"| {label} | {old:.3f} | {new:.3f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
