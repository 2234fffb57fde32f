"""The server's instructions per call, counted by valgrind's callgrind: a figure no busy machine moves.

    .venv/bin/python bench/run.py --only instructions [--quick]   (also part of `make bench`)
    .venv/bin/python bench/instructions.py [--quick] [--module PATH]

A timed benchmark on this project's machines (VMs of two cores whose speed drifts by
a third within minutes, issue 41) needs many interleaved rounds to see a 10% change;
the number of instructions the server executes for one call does not drift at all.
So each verb's cost is also counted here, exactly: one redis-server with emq.so runs
under callgrind, the counters are zeroed (``callgrind_control --zero``) after each
phase's setup and dumped (``--dump``) after its calls, and a phase's instructions
divided by its calls is the figure.  Every call is its own round trip, as a worker
sends it, so the figure includes the server's side of the round trip (reading,
parsing, replying); ``PING`` is that floor.  What is not counted: the kernel's time
(the socket's system calls), and the server's cron (at ``hz 1`` here), taken off at the
rate an idle stretch measured.  Instructions are not time (a cache miss costs more than an add), but a
change that adds work to a verb shows here the day it lands, in any weather.

The calls are the client's own (``echomq._protocol``: ENQUEUE, CLAIM and COMPLETECLAIM
carry their REQ, as ``client.enqueue`` and the workers send them), on the same
queue; the bare ``ZADD`` of a lease on the same active set and the seed's EXTEND in
Lua (EVALSHA) are EXTEND's references (issue 41's goal: EXTEND's server CPU at most
1.5x a bare ZADD's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "python"))

import redis  # noqa: E402

from echomq import _protocol as proto  # noqa: E402
from echomq.keyspace import queue_keys  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402
from tests.seed_scripts import EXTEND_LUA_ORIGINAL  # noqa: E402

Q = "q"
LEASE_MS = 60_000
TOTALS = re.compile(r"^(?:summary|totals): (\d+)$", re.M)


class Counted:
    """A server under callgrind, and its counters read phase by phase."""

    def __init__(self, server: EmbeddedServer, out: Path) -> None:
        assert server.process is not None
        self.pid = str(server.process.pid)
        self.out = out
        self.dumps = 0

    def zero(self) -> None:
        subprocess.run(["callgrind_control", "--zero", self.pid], check=True, capture_output=True)

    def dump(self) -> int:
        """The instructions since the last zero (callgrind's part file of this dump)."""
        subprocess.run(["callgrind_control", "--dump", self.pid], check=True, capture_output=True)
        self.dumps += 1
        part = next(self.out.glob(f"cg.{self.pid}.out.{self.dumps}"))
        return int(TOTALS.findall(part.read_text(errors="replace"))[0])


def phases(r: redis.Redis, n: int) -> list[tuple[str, Callable[[], None], Callable[[], None]]]:
    """(name, setup, the n calls) for each figure, in the order they run."""
    keys = queue_keys(Q)
    held: list[tuple[str, str]] = []

    def send(call: proto.Call[Any]) -> Any:
        return call.parse(call, r.execute_command(*call.args))

    def clear() -> None:
        r.flushall()

    def fill() -> None:  # n jobs waiting, a few more than the phase takes
        clear()
        for call in proto.enqueue_many(Q, [(f"j{i}", b"x" * 20) for i in range(n + 2)]):
            send(call)

    def hold() -> None:  # n jobs held
        fill()
        held[:] = [(job.id, job.token) for job in send(proto.claim(Q, LEASE_MS, n))]

    def ping() -> None:
        for _ in range(n):
            r.ping()

    def zadd() -> None:
        for job_id, _ in held:
            r.zadd(keys.active, {job_id: 10**12})

    def extend() -> None:
        for job_id, token in held:
            send(proto.extend(Q, job_id, token, LEASE_MS))

    sha: list[str] = []
    attempts: list[bytes] = []

    def load_lua() -> None:
        hold()
        sha[:] = [r.script_load(EXTEND_LUA_ORIGINAL)]
        attempts[:] = [r.hget(keys.job(job_id), "attempts") or b"" for job_id, _ in held]

    def extend_lua() -> None:
        for (job_id, _), tries in zip(held, attempts, strict=True):
            r.evalsha(sha[0], 2, keys.active, keys.job(job_id), job_id, tries, LEASE_MS)

    def enqueue() -> None:
        for i in range(n):
            send(proto.enqueue(Q, b"x" * 20, f"e{i}"))

    def claim() -> None:
        for _ in range(n):
            send(proto.claim(Q, LEASE_MS))

    def complete() -> None:
        for job_id, token in held:
            send(proto.complete(Q, job_id, token))

    def first() -> None:
        fill()
        (job,) = send(proto.claim(Q, LEASE_MS))
        held[:] = [(job.id, job.token)]

    def complete_claim() -> None:
        ((job_id, token),) = held
        for _ in range(n):
            answer = send(proto.complete_claim(Q, job_id, token, LEASE_MS))
            job_id, token = answer.jobs[0].id, answer.jobs[0].token

    def nothing() -> None:
        pass

    return [
        ("PING", nothing, ping),
        ("ZADD (a lease, bare)", hold, zadd),
        ("EMQ.EXTEND", nothing, extend),
        ("EXTEND, the seed's Lua", load_lua, extend_lua),
        ("EMQ.ENQUEUE (REQ)", clear, enqueue),
        ("EMQ.CLAIM (REQ)", nothing, claim),
        ("EMQ.COMPLETE", hold, complete),
        ("EMQ.COMPLETECLAIM (REQ)", first, complete_claim),
    ]


def measure(n: int, module: Path | None = None, keep: bool = False) -> dict[str, Any]:
    """Instructions per call of each phase (and the references' ratios)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return {"skipped": "valgrind is not installed (Debian: apt-get install valgrind)"}
    out = Path(tempfile.mkdtemp(prefix="echomq-callgrind-"))
    wrapper = f"valgrind --tool=callgrind --dump-instr=no --callgrind-out-file={out}/cg.%p.out"
    before = os.environ.get("ECHOMQ_SERVER_WRAPPER")
    os.environ["ECHOMQ_SERVER_WRAPPER"] = wrapper
    try:
        with EmbeddedServer(
            ["--appendonly", "no", "--hz", "1"], module=module, startup_timeout=120
        ) as server:
            r = server.client()
            counted = Counted(server, out)
            # What the server does on its own (its cron, at hz 1 here), per second, to take off
            # each phase's count: under valgrind a phase lasts seconds.
            counted.zero()
            started = time.monotonic()
            time.sleep(2.0)
            idle = counted.dump() / (time.monotonic() - started)
            rows: dict[str, float] = {}
            for name, setup, calls in phases(r, n):
                setup()
                counted.zero()
                started = time.monotonic()
                calls()
                count = counted.dump()
                rows[name] = max(0.0, count - idle * (time.monotonic() - started)) / n
            version = r.info("server")["redis_version"]
    finally:
        if before is None:
            os.environ.pop("ECHOMQ_SERVER_WRAPPER", None)
        else:
            os.environ["ECHOMQ_SERVER_WRAPPER"] = before
        if keep:
            print(f"callgrind's files: {out} (dump n is the n-th phase)", file=sys.stderr)
        else:
            shutil.rmtree(out, ignore_errors=True)
    zadd, floor = rows["ZADD (a lease, bare)"], rows["PING"]
    return {
        "calls": n,
        "server": f"redis {version}",
        "instructions": {k: round(v) for k, v in rows.items()},
        "idle_per_s": round(idle),
        "extend_over_zadd": round(rows["EMQ.EXTEND"] / zadd, 3),
        "extend_over_zadd_past_the_floor": round((rows["EMQ.EXTEND"] - floor) / (zadd - floor), 3),
        "lua_over_extend": round(rows["EXTEND, the seed's Lua"] / rows["EMQ.EXTEND"], 3),
    }


BASELINE = ROOT / "bench" / "instructions-baseline.json"
"""The figures of the last accepted run (``--save-baseline``): each row's ratio to them is printed."""


def markdown(res: dict[str, Any], command: str, baseline: dict[str, Any] | None = None) -> str:
    if "skipped" in res:
        return f"## Instructions per call\n\nSkipped: {res['skipped']}\n"
    before = (baseline or {}).get("instructions", {})
    same = baseline is not None and baseline.get("server") == res["server"]
    lines = [
        "## Instructions per call (callgrind: the server's own, user space)",
        "",
        f"`{command}`: {res['calls']} calls each, one round trip per call, {res['server']}"
        + (f"; against {BASELINE.name} ({baseline['commit']}, {baseline['server']})" if baseline else "")
        + ("" if same or not baseline else ": another server build, so the ratios compare builds too")
        + ".",
        "",
        "| call | instructions per call | x PING | x baseline |",
        "|---|---|---|---|",
    ]
    floor = res["instructions"]["PING"]
    for name, count in res["instructions"].items():
        ratio = f"{count / before[name]:.3f}x" if before.get(name) else "-"
        lines.append(f"| {name} | {count:,} | {count / floor:.1f}x | {ratio} |")
    lines += [
        "",
        f"EMQ.EXTEND is {res['extend_over_zadd']}x a bare ZADD's instructions "
        f"({res['extend_over_zadd_past_the_floor']}x past the round trip's floor; issue 41's goal "
        f"for server CPU: at most 1.5x); the seed's Lua is {res['lua_over_extend']}x EMQ.EXTEND.",
        "",
    ]
    return "\n".join(lines)


CALLS = 1_000
"""Calls per phase (and jobs held: the active set is a skiplist, as on a busy queue): three runs
agree to under 1% on the verbs, a few per cent on PING and ZADD (the cron, taken off at its
average, is a larger part of a small count)."""


def main_section(quick: bool, command: str, module: Path | None = None, keep: bool = False) -> int:
    del quick  # the same size either way: the baseline's, so that the ratios mean something
    res = measure(CALLS, module, keep)
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else None
    print(markdown(res, command, baseline), flush=True)
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "instructions-latest.json").write_text(json.dumps(res, indent=2))
    return 0


def save_baseline(module: Path | None) -> int:
    res = measure(CALLS, module)
    if "skipped" in res:
        print(res["skipped"], file=sys.stderr)
        return 2
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    res["commit"] = head.stdout.strip() or "?"
    BASELINE.write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(res, "bench/instructions.py --save-baseline"))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="accepted for bench/run.py's sake: the same size"
    )
    parser.add_argument("--module", type=Path, help="another build of emq.so (a before/after)")
    parser.add_argument("--keep", action="store_true", help="keep callgrind's files (callgrind_annotate)")
    parser.add_argument("--save-baseline", action="store_true", help=f"write {BASELINE.name} from this run")
    args = parser.parse_args()
    if args.save_baseline:
        sys.exit(save_baseline(args.module))
    sys.exit(
        main_section(args.quick, "bench/instructions.py " + " ".join(sys.argv[1:]), args.module, args.keep)
    )
