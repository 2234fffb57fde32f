"""Schedule ticks (issue 44): how late a schedule's jobs are enqueued after their ticks.

    .venv/bin/python bench/ticks.py [--quick]    # also: bench/run.py --only ticks; make bench

A server of its own per setup (Redis 7.0 from this machine's PATH or echomq's own,
emq.so of this tree loaded, or not for the scripts backend), one schedule of 200 ms
ticks added while the drivers run, for TICKS ticks (``end_at``), ``missed="skip"``
(the default).  The drivers, each at its defaults (a sweep every 5-15 s):

- one thread worker; three thread workers; one asyncio worker (both backends; with the
  module, its own timer off, ``schedule-timer no``, so the row is the clients' alone);
- the module's own timer, with no client process (module/emq_schedules.c); and the timer
  with three thread workers beside it (whoever is first).

Lateness of a tick: its job's ``enqueued_at`` (the server's clock, ms) minus the tick
(both from the job's row and id ``<name>@<tick ms>``); a tick with no job is *missed*
(dropped under ``skip``, or never fired).  p50, p99 and the worst, in ms.  Results go to
bench/results/ticks-*.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import redis.asyncio  # noqa: E402

import echomq  # noqa: E402
import echomq.asyncio as emq  # noqa: E402
from bench import _results as results  # noqa: E402
from echomq import schedules as rules  # noqa: E402
from echomq.testing import EmbeddedServer, module_path  # noqa: E402

Q = "ticks"
EVERY_MS = 200
FULL_TICKS, QUICK_TICKS = 50, 12


def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _thread_workers(n: int) -> Callable[[EmbeddedServer, threading.Event, threading.Event], None]:
    def run(server: EmbeddedServer, ready: threading.Event, stop: threading.Event) -> None:
        workers = [echomq.Worker(echomq.Client(server.client()), Q, lambda ctx: None) for _ in range(n)]
        for w in workers:
            w.start()
        ready.set()
        stop.wait()
        for w in workers:
            w.stop()

    return run


def _asyncio_worker(server: EmbeddedServer, ready: threading.Event, stop: threading.Event) -> None:
    async def main() -> None:
        async def handler(ctx: emq.JobContext) -> None:
            return None

        aclient = emq.Client(redis.asyncio.Redis(port=server.port))
        async with emq.Worker(aclient, Q, handler):
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)
        await aclient.aclose()

    asyncio.run(main())


def _no_client(server: EmbeddedServer, ready: threading.Event, stop: threading.Event) -> None:
    ready.set()
    stop.wait()


DRIVERS: dict[str, Callable[[EmbeddedServer, threading.Event, threading.Event], None]] = {
    "1 thread worker": _thread_workers(1),
    "3 thread workers": _thread_workers(3),
    "1 asyncio worker": _asyncio_worker,
}
TIMER_DRIVERS: dict[str, Callable[[EmbeddedServer, threading.Event, threading.Event], None]] = {
    "the server's own timer, no client": _no_client,
    "the server's timer and 3 thread workers": _thread_workers(3),
}


def server_for(backend: str, timer: bool) -> EmbeddedServer:
    if backend == "scripts":
        return EmbeddedServer(["--appendonly", "no"], load_module=False)
    load = ["--loadmodule", str(module_path()), *([] if timer else ["schedule-timer", "no"])]
    return EmbeddedServer([*load, "--appendonly", "no"], load_module=False)


def measure(backend: str, driver: str, ticks: int) -> dict[str, Any]:
    timer = driver in TIMER_DRIVERS
    with server_for(backend, timer) as server:
        r = server.client()
        ready, stop = threading.Event(), threading.Event()
        target = TIMER_DRIVERS[driver] if timer else DRIVERS[driver]
        runner = threading.Thread(target=target, args=(server, ready, stop), daemon=True)
        runner.start()
        try:
            ready.wait(30)
            time.sleep(0.3)  # the listeners subscribed
            first = (server_ms(r) // 1000 + 1) * 1000
            last = first + (ticks - 1) * EVERY_MS
            client = echomq.Client(server.client())
            client.schedule(Q, "beat", every_ms=EVERY_MS, start_at=first, end_at=last)
            while server_ms(r) < last + 1500:
                time.sleep(0.1)
        finally:
            stop.set()
            runner.join(30)
        late: list[int] = []
        missed = 0
        for i in range(ticks):
            tick = first + i * EVERY_MS
            at = r.hget(f"emq:{{{Q}}}:job:{rules.job_id('beat', tick)}", "enqueued_at")
            if at is None:
                missed += 1
            else:
                late.append(int(at) - tick)
    late.sort()
    return {
        "backend": backend,
        "driver": driver,
        "ticks": ticks,
        "missed": missed,
        "p50_ms": statistics.median(late) if late else None,
        "p99_ms": late[min(len(late) - 1, int(len(late) * 0.99))] if late else None,
        "worst_ms": late[-1] if late else None,
    }


def run(ticks: int, command: str) -> dict[str, Any]:
    rows = [measure(backend, driver, ticks) for backend in ("module", "scripts") for driver in DRIVERS]
    rows += [measure("module", driver, ticks) for driver in TIMER_DRIVERS]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "every_ms": EVERY_MS,
        "rows": rows,
    }


def markdown(res: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:g}"

    out = [
        f"## Schedule ticks: how late their jobs are enqueued ({res['date']}, `{res['command']}`)",
        "",
        f"One schedule of {res['every_ms']} ms ticks, `missed=\"skip\"`, drivers at their defaults (the "
        "module's rows with workers only: its timer off); "
        "lateness = the job's `enqueued_at` minus its tick (server clock, ms).",
        "",
        "| backend | driver | ticks | missed | p50 ms | p99 ms | worst ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in res["rows"]:
        out.append(
            f"| {row['backend']} | {row['driver']} | {row['ticks']} | {row['missed']} | {fmt(row['p50_ms'])} "
            f"| {fmt(row['p99_ms'])} | {fmt(row['worst_ms'])} |"
        )
    return "\n".join(out) + "\n"


def main_section(quick: bool, command: str) -> int:
    res = run(QUICK_TICKS if quick else FULL_TICKS, command)
    text = markdown(res)
    results.save("ticks", res, text)
    print(text, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer ticks: a smoke run, not a verdict")
    args = parser.parse_args(argv)
    return main_section(args.quick, "bench/ticks.py" + (" --quick" if args.quick else ""))


if __name__ == "__main__":
    sys.exit(main())
