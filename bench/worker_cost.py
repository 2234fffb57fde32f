"""The worker's own cost per job, counted in Python function calls: a figure no busy machine moves.

    .venv/bin/python bench/run.py --only workercost [--quick]   (also part of `make bench`)
    .venv/bin/python bench/worker_cost.py [--quick] [--top 25] [--only SHAPE ...]
    .venv/bin/python bench/worker_cost.py --save-baseline       (accept this run's figures)

Issue 41: echomq's workers spend 38-73 us of their own CPU on a no-op job, and the
machines these figures come from drift by a third within minutes, so a timed run
cannot see a 5% cut.  A count can: each worker shape (sync 1 thread, sync 10 threads,
asyncio 10 tasks, ``@app.task`` sync 10 threads and asyncio 10 tasks; a no-op handler)
runs in a fresh interpreter of its own against one redis-server (emq.so loaded), over
jobs enqueued before it starts; after a warm-up of ``WARM`` jobs a profile hook
(``threading.setprofile``: every thread the worker starts, not the main thread that
watches it) counts each Python function call (a coroutine's or generator's resumption
is one) and each call of a C function, until ``N`` more jobs have finished; the queue
holds a tail beyond that, so the worker never idles inside the stretch.  The figures
are those counts divided by the jobs that finished in the stretch.

What a count is not: time (a call of ``dict.get`` and a call that parses a reply both
count one), nor the C work inside a C call (redis-py's parser, the socket).  What it
sees exactly is the Python path a job takes, which is where issue 41's profile found
the worker's time going (no single hot spot: isinstance, argument checks, call_soon).
The hook slows the worker several times, so the batches a claim answers (which
depend on timing) are not those of a timed run; three runs agree to about 1%.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "python"))

import redis  # noqa: E402

from bench import _results as results  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402

SHAPES: dict[str, str] = {
    "sync-1": "sync Worker, 1 thread",
    "sync-10": "sync Worker, 10 threads",
    "async-10": "asyncio Worker, 10 tasks",
    "task-10": "`@app.task` sync, 10 threads",
    "task-async-10": "`@app.task` asyncio, 10 tasks",
}
WARM = 500
"""Jobs run before the count starts (imports, first calls, the claim loop's first batches)."""
N = 3_000
QUICK_N = 600
TAIL = 0.25
"""Jobs beyond the stretch, as a share of N: the queue is never empty while counting."""
Q = "cost"
POLL_S = 0.001


class Counter:
    """The profile hook: calls and C calls, counted by ``itertools.count`` (atomic under the GIL)."""

    def __init__(self, top: bool) -> None:
        self.on = False
        self.calls = itertools.count()
        self.c_calls = itertools.count()
        self.top = top
        self.where: collections.Counter[str] = collections.Counter()

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if not self.on:
            return
        if event == "call":
            next(self.calls)
            if self.top:
                code, back = frame.f_code, frame.f_back
                caller = f"{Path(back.f_code.co_filename).name}:{back.f_lineno}" if back else "?"
                callee = f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_qualname}"
                self.where[f"{callee} <- {caller}"] += 1
        elif event == "c_call":
            next(self.c_calls)
            if self.top:
                code = frame.f_code  # the caller: where a C call comes from is the point
                name = getattr(arg, "__qualname__", arg)
                caller = f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_qualname}"
                self.where[f"C {name} <- {caller}"] += 1


def finished(stats: Any) -> int:
    return int(stats.completed + stats.failed + stats.cancelled + stats.leases_lost + stats.rejected)


def count(stats: Any, counter: Counter, n: int) -> tuple[int, int, int]:
    """Wait for the warm-up, count over the next n jobs: (calls, C calls, jobs finished meanwhile)."""
    while finished(stats) < WARM:
        time.sleep(POLL_S)
    start = finished(stats)
    calls0, c0 = next(counter.calls), next(counter.c_calls)
    counter.on = True
    while finished(stats) < start + n:
        time.sleep(POLL_S)
    counter.on = False
    jobs = finished(stats) - start
    # next() above took one from each counter; the hook's own reads are not counted.
    return next(counter.calls) - calls0 - 1, next(counter.c_calls) - c0 - 1, jobs


def child(shape: str, url: str, n: int, top: bool) -> dict[str, Any]:
    """One shape, in this (fresh) process: the counts per job."""
    import echomq
    import echomq.asyncio as emq_async

    total = WARM + n + int(n * TAIL)
    counter = Counter(top)
    threading.setprofile(counter.hook)  # the threads started from here on: the worker's
    client = echomq.Client(redis.Redis.from_url(url))
    stop: Any
    if shape in ("sync-1", "sync-10"):
        client.enqueue_many(Q, [b""] * total)
        slots = 1 if shape == "sync-1" else 10
        worker = echomq.Worker(client, Q, lambda job, cancel: None, concurrency=slots)
        worker.start()
        stats, stop = worker.stats, lambda: worker.stop(grace=0)
    elif shape == "task-10":
        app = echomq.App(client, queue=Q)

        @app.task
        def noop() -> None:
            return None

        for _ in range(total):
            noop.enqueue()
        workers = app.worker(concurrency=10)
        (worker,) = workers.workers
        workers.start()
        stats, stop = worker.stats, lambda: workers.stop(grace=0)
    else:
        if shape == "async-10":
            client.enqueue_many(Q, [b""] * total)
        ready = threading.Event()
        box: dict[str, Any] = {}

        async def run() -> None:
            import redis.asyncio as aioredis

            aclient = emq_async.Client(aioredis.Redis.from_url(url))
            if shape == "async-10":

                async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
                    return None

                worker = emq_async.Worker(aclient, Q, handler, concurrency=10)
                box["stats"], box["stop"] = worker.stats, worker.stop
                main = worker.run()
            else:
                app = emq_async.App(aclient, queue=Q)

                @app.task
                async def noop() -> None:
                    return None

                for _ in range(total):
                    await noop.enqueue()
                workers = app.worker(concurrency=10)
                (worker,) = workers.workers
                box["stats"], box["stop"] = worker.stats, workers.stop
                main = workers.run(handle_signals=False)
            box["loop"] = asyncio.get_running_loop()
            ready.set()
            await main
            await aclient.aclose()

        thread = threading.Thread(target=asyncio.run, args=(run(),), name="loop")
        thread.start()
        ready.wait()
        stats = box["stats"]

        def stop() -> None:
            box["loop"].call_soon_threadsafe(box["stop"])
            thread.join()

    calls, c_calls, jobs = count(stats, counter, n)
    stop()
    out: dict[str, Any] = {
        "shape": shape,
        "jobs": jobs,
        "calls_per_job": round(calls / jobs, 2),
        "c_calls_per_job": round(c_calls / jobs, 2),
        "completed": stats.completed,
    }
    if top:
        out["top"] = [(where, round(k / jobs, 2)) for where, k in counter.where.most_common(top)]
    return out


def measure(n: int, shapes: list[str], top: int = 0) -> dict[str, Any]:
    """Each shape in a process of its own, against one server flushed between them."""
    rows: dict[str, Any] = {}
    with EmbeddedServer(["--appendonly", "no"]) as server:
        r = server.client()
        version = r.info("server")["redis_version"]
        for shape in shapes:
            r.flushall()
            env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
            done = subprocess.run(
                [sys.executable, __file__, "--child", shape, "--url", server.url, "--n", str(n),
                 "--top", str(top)],
                capture_output=True, text=True, env=env, timeout=600,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"{shape}: {done.stderr[-2000:]}")
            rows[shape] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"jobs": n, "warm": WARM, "server": f"redis {version}", "rows": rows}


BASELINE = ROOT / "bench" / "worker-cost-baseline.json"
"""The figures of the last accepted run (``--save-baseline``): each row's ratio to them is printed."""


def markdown(res: dict[str, Any], command: str, baseline: dict[str, Any] | None = None) -> str:
    before = (baseline or {}).get("rows", {})
    lines = [
        "## The worker's own cost per job (Python calls, counted)",
        "",
        f"`{command}`: {res['jobs']:,} no-op jobs after {res['warm']} of warm-up, {res['server']}"
        + (f"; against {BASELINE.name} ({baseline['commit']})" if baseline else "")
        + ".",
        "",
        "| worker | Python calls per job | C calls per job | both | x baseline (both) |",
        "|---|---|---|---|---|",
    ]
    rows = res["rows"]
    for shape, row in rows.items():
        both = row["calls_per_job"] + row["c_calls_per_job"]
        was = before.get(shape)
        ratio = f"{both / (was['calls_per_job'] + was['c_calls_per_job']):.3f}x" if was else "-"
        calls, c_calls = row["calls_per_job"], row["c_calls_per_job"]
        lines.append(f"| {SHAPES[shape]} | {calls:.1f} | {c_calls:.1f} | {both:.1f} | {ratio} |")
    for task, raw in (("task-10", "sync-10"), ("task-async-10", "async-10")):
        if task in rows and raw in rows:
            t, w = (rows[k]["calls_per_job"] + rows[k]["c_calls_per_job"] for k in (task, raw))
            lines.append(f"\n`@app.task` over the raw worker ({SHAPES[raw]}): {t / w:.2f}x the calls.")
    for shape, row in rows.items():
        if row.get("top"):
            lines += ["", f"Most called, {SHAPES[shape]} (per job):", ""]
            lines += [f"    {k:8.2f}  {where}" for where, k in row["top"]]
    lines.append("")
    return "\n".join(lines)


def main_section(quick: bool, command: str, shapes: list[str] | None = None, top: int = 0) -> int:
    res = measure(QUICK_N if quick else N, shapes or list(SHAPES), top)
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else None
    text = markdown(res, command, baseline)
    print(text, flush=True)
    results.save("worker-cost", res, text)
    return 0


def save_baseline() -> int:
    res = measure(N, list(SHAPES))
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    res["commit"] = head.stdout.strip() or "?"
    BASELINE.write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(res, "bench/worker_cost.py --save-baseline"))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_N} jobs a shape instead of {N}")
    parser.add_argument("--only", nargs="+", choices=list(SHAPES), help="these shapes only")
    parser.add_argument(
        "--top", type=int, default=0, help="also list the N most called functions (C calls by caller)"
    )
    parser.add_argument("--save-baseline", action="store_true", help=f"write {BASELINE.name} from this run")
    parser.add_argument("--child", choices=list(SHAPES), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=N, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.url, args.n, args.top)), flush=True)
        os._exit(0)  # the worker's threads are stopped; skip the interpreter's teardown
    if args.save_baseline:
        sys.exit(save_baseline())
    sys.exit(main_section(args.quick, "bench/worker_cost.py " + " ".join(sys.argv[1:]), args.only, args.top))
