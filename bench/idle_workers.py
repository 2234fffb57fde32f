"""Idle workers (issue 30): the commands an idle echomq Worker sends, and how soon it stops.

    .venv/bin/python bench/idle_workers.py [--quick] [--baseline REF]
    .venv/bin/python bench/run.py --only claimpath       (runs it after the claim path's own)

For each driver (threads, asyncio), each number of slots (1, 8, 64) and each
backend (the module; the scripts, on a server without it), one worker
process at its defaults (``Worker(client, queue, handler, concurrency=N)``)
on a fresh server and an empty queue: after a warm-up, the server counts
every command the worker sends over a window (INFO commandstats, less the
bench's own INFO); then the worker is told to stop and times its stop
(``worker.stop()``, or ``stop()`` to ``await run()`` returning).  Target:
at most 0.5 commands/s whatever the slots, and a stop within 200 ms.

``--baseline REF`` measures the package at that git revision too (its
python/ first on PYTHONPATH, as bench/peers' --baseline does).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench import _results as results  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SLOTS = (1, 8, 64)
KINDS = ("sync", "asyncio")
BACKENDS = ("module", "scripts")
QUEUE = "idle"
TARGET_PER_S = 0.5
TARGET_STOP_S = 0.2

# The worker process: a Worker at its defaults on an empty queue; "ready", then on "stop" it stops
# and says how long that took.
CHILD = r"""
import asyncio, json, sys, time
import redis, redis.asyncio
import echomq, echomq.asyncio as emq
url, kind, slots, queue = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def say(**kw):
    print(json.dumps(kw), flush=True)
if kind == "sync":
    client = echomq.Client(redis.Redis.from_url(url))
    worker = echomq.Worker(client, queue, lambda ctx: None, concurrency=slots)
    worker.start()
    say(event="ready")
    sys.stdin.readline()
    t = time.perf_counter()
    worker.stop()
    say(event="stopped", seconds=time.perf_counter() - t)
else:
    async def handler(ctx):
        return None
    async def main():
        client = emq.Client(redis.asyncio.Redis.from_url(url))
        worker = emq.Worker(client, queue, handler, concurrency=slots)
        task = asyncio.create_task(worker.run(handle_signals=False))
        say(event="ready")
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        t = time.perf_counter()
        worker.stop()
        await task
        say(event="stopped", seconds=time.perf_counter() - t)
        await client.aclose()
    asyncio.run(main())
"""


@dataclass(frozen=True)
class Sizes:
    warmup_s: float
    window_s: float


FULL = Sizes(warmup_s=3.0, window_s=20.0)
QUICK = Sizes(warmup_s=1.0, window_s=6.0)


# What a worker sends itself: the module's verbs, the scripts' calls, and what a connection says.
# (commandstats also counts the commands a script runs inside: those are not sent.)
SENT = {"fcall", "fcall_ro", "evalsha", "eval", "hello", "ping", "subscribe", "client", "function", "command"}


def commands(r: redis.Redis) -> dict[str, int]:
    """Calls so far of each command a worker sends (not the bench's INFO, not a script's inner ones)."""
    stats: dict[str, Any] = r.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
    return {name: n for name, n in calls.items() if name.startswith("emq.") or name.split("|")[0] in SENT}


def export(ref: str) -> Path:
    """The package at ``ref``: its python/ exported to bench/results/, for PYTHONPATH."""
    target = RESULTS / f"baseline-{ref.replace('/', '_')}"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "python/echomq"], capture_output=True)
    archive.check_returncode()
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "python"


def measure(kind: str, slots: int, backend: str, sizes: Sizes, pythonpath: Path | None) -> dict[str, Any]:
    with EmbeddedServer(["--appendonly", "no"], load_module=backend == "module") as server:
        r = server.client()
        env = dict(os.environ)
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, server.url, kind, str(slots), QUEUE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert json.loads(proc.stdout.readline())["event"] == "ready"
            time.sleep(sizes.warmup_s)
            before, t0 = commands(r), time.monotonic()
            time.sleep(sizes.window_s)
            after, elapsed = commands(r), time.monotonic() - t0
            proc.stdin.write("stop\n")
            proc.stdin.flush()
            stopped = json.loads(proc.stdout.readline())
        finally:
            proc.stdin.close()
            proc.wait(30)
    sent = {name: n - before.get(name, 0) for name, n in after.items() if n - before.get(name, 0) > 0}
    return {
        "kind": kind,
        "slots": slots,
        "backend": backend,
        "seconds": elapsed,
        "per_second": sum(sent.values()) / elapsed,
        "by_command": {name: n / elapsed for name, n in sorted(sent.items())},
        "stop_s": stopped["seconds"],
    }


def run(sizes: Sizes, command: str, baseline: str | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}",
        "loadavg_start": os.getloadavg()[0],
        "sizes": sizes.__dict__,
        "rows": [],
    }
    versions: list[tuple[str, Path | None]] = [("this tree", None)]
    if baseline is not None:
        versions.append((f"at {baseline}", export(baseline)))
    for version, path in versions:
        for backend in BACKENDS:
            for kind in KINDS:
                for slots in SLOTS:
                    print(
                        f"bench: idle {kind} worker, {slots} slots, {backend} ({version}) ...",
                        file=sys.stderr,
                    )
                    row = measure(kind, slots, backend, sizes, path)
                    row["version"] = version
                    res["rows"].append(row)
    res["loadavg_end"] = os.getloadavg()[0]
    return res


def markdown(res: dict[str, Any]) -> str:
    out = [
        f"EchoMQ idle workers, {res['date']}, `{res['command']}`",
        f"({res['machine']}; load average {res['loadavg_start']:.2f} at start, "
        f"{res['loadavg_end']:.2f} at end; one worker process at its defaults per row, a fresh server, "
        f"an empty queue; the commands it sent, counted by the server over {res['sizes']['window_s']:.0f} s "
        f"after {res['sizes']['warmup_s']:.0f} s)",
        "",
        f"Targets: at most {TARGET_PER_S} commands/s, a stop within {TARGET_STOP_S * 1000:.0f} ms.",
        "",
        "| worker | slots | backend | version | commands/s | which | stop() ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        which = ", ".join(f"{name} {rate:.2f}" for name, rate in row["by_command"].items()) or "none"
        ok = row["per_second"] <= TARGET_PER_S
        rate = f"{row['per_second']:.2f}" if ok else f"**{row['per_second']:.2f}**"
        stop = f"{row['stop_s'] * 1000:.0f}"
        stop = stop if row["stop_s"] <= TARGET_STOP_S else f"**{stop}**"
        what = f"| {row['kind']} | {row['slots']} | {row['backend']} | {row['version']} |"
        out.append(f"{what} {rate} | {which} | {stop} |")
    return "\n".join(out) + "\n"



def main_section(quick: bool, command: str, baseline: str | None = None) -> int:
    res = run(QUICK if quick else FULL, command, baseline)
    text = markdown(res)
    results.save("idle", res, text)
    print(text, flush=True)
    bad = [
        row
        for row in res["rows"]
        if row["version"] == "this tree" and row["backend"] == "module" and row["per_second"] > TARGET_PER_S
    ]
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short window: a smoke run, not a verdict")
    parser.add_argument("--baseline", metavar="REF", help="also measure the package at this git revision")
    args = parser.parse_args(argv)
    command = "bench/idle_workers.py" + (" --quick" if args.quick else "")
    command += f" --baseline {args.baseline}" if args.baseline else ""
    return main_section(args.quick, command, args.baseline)


if __name__ == "__main__":
    sys.exit(main())
