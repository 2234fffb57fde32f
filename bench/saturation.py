"""Many workers, one server (issue 34): where one server saturates, for echomq and for BullMQ.

    .venv/bin/python bench/saturation.py [--quick] [--n N] [--rounds R] [--procs 1 2 4 8]
                                    [--only echomq-sync-10 echomq-async bullmq]
                                    [--engine NAME | --server-bin PATH]
    .venv/bin/python bench/run.py --only saturation      (also a section of `make bench`)

For each contender and each number k of worker processes, one fresh redis-server
(echomq.testing.EmbeddedServer; the module loaded for echomq).  The first process
enqueues N no-op jobs with its library's own batch call (echomq's enqueue_many,
BullMQ's addBulk; not measured here); the other k - 1 enqueue none.
Then all k are told to go at once and drain the one queue: echomq's sync Worker
(10 threads each), its asyncio Worker (10 tasks each), BullMQ's Worker
(concurrency 10 each, k node processes).  The contenders are bench/peers' own
(bench/peers/contenders/echomq_peer.py, bench/peers/node/bullmq_peer.mjs) with
``--until-stop``: no single process can tell when the shared queue is done, so
this harness watches the server and says stop.

Per run, from the server's view: the wall clock from the first claim to the
last completion, as this harness's reads of the server find them (one pipelined
read every 2 ms after the go until a job is claimed, then every 10 ms until
every job has finished: echomq, no job pending or active; BullMQ, N in its
completed and failed sets), so jobs/s = N / that span; the server's CPU (INFO
cpu used_cpu_sys + used_cpu_user) over the same span, per job in microseconds
and as a utilisation (CPU seconds per wall second: the server runs commands on
one thread, so it is saturated as that nears 1.0); the worker processes' own
CPU per job (/proc) and the machine's busy cores (/proc/stat).  Then each
process reports how many jobs its handler ran and the first one asks its
library's status API what became of every job (as bench/peers/harness.py
verifies): every job done, and the handler runs summed over the k processes
equal to N, is "exactly once".

On a 2-core machine the k worker processes compete with the server for the
cores, so the ceiling measured here is the machine's, not the server's; the
server's CPU per job at saturation is the figure that carries to a bigger
machine (one server core carries about 1e6 / that figure jobs/s, a bound from
below: a busier server spends less per job).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench import _results as results  # noqa: E402
from bench.peers import harness as peers  # noqa: E402
from bench.peers.procs import ContenderError, Proc, server_stats  # noqa: E402
from echomq.keyspace import queue_keys  # noqa: E402
from echomq.testing import EmbeddedServer  # noqa: E402

KEYS = ("echomq-sync-10", "echomq-async", "bullmq")  # bench/peers/harness.py's contenders, by key
QUEUE = "bench"  # the contenders' default queue name
CLAIM_POLL_S = 0.002  # until the first claim: a short wait, read often
POLL_S = 0.01  # until the last completion
SATURATED = 0.9  # "saturates at k": the first k within 10% of the contender's best jobs/s


@dataclass(frozen=True)
class Sizes:
    n: int
    rounds: int
    procs: tuple[int, ...]


FULL = Sizes(n=40_000, rounds=3, procs=(1, 2, 4, 8))
QUICK = Sizes(n=2_000, rounds=1, procs=(1, 2, 4, 8))


def log(msg: str) -> None:
    print(f"bench/saturation: {msg}", file=sys.stderr, flush=True)


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU ticks of the whole machine, from /proc/stat's first line."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def progress_read(c: peers.Contender, r: redis.Redis, n: int) -> tuple[Callable[[], tuple[int, int]], int]:
    """One pipelined read of the server: (jobs not claimed yet, jobs not finished yet); and its commands."""
    if c.runtime == "node":
        # BullMQ's own keys (its default prefix `bull`): the wait list, and the completed and
        # failed sets (it keeps finished jobs by default).
        wait, completed, failed = (f"bull:{QUEUE}:{name}" for name in ("wait", "completed", "failed"))

        def bullmq() -> tuple[int, int]:
            pipe = r.pipeline(transaction=False)
            pipe.llen(wait)
            pipe.zcard(completed)
            pipe.zcard(failed)
            waiting, ok, bad = pipe.execute()
            return int(waiting), n - int(ok) - int(bad)

        return bullmq, 3
    keys = queue_keys(QUEUE)

    def echomq() -> tuple[int, int]:
        pipe = r.pipeline(transaction=False)
        pipe.llen(keys.pending)
        for name in (keys.priority, keys.delayed, keys.active):
            pipe.zcard(name)
        pending, prioritised, delayed, active = pipe.execute()
        unclaimed = int(pending) + int(prioritised) + int(delayed)
        return unclaimed, unclaimed + int(active)

    return echomq, 4


def handler_runs(c: peers.Contender, verified: dict[str, Any]) -> int:
    """How many jobs one process's handler ran, from its own count after its worker stopped."""
    if c.runtime == "node":
        return int(verified.get("processed", 0))
    s = verified.get("stats") or {}
    return sum(int(s.get(k, 0)) for k in ("completed", "failed", "cancelled", "leases_lost", "rejected"))


def run_one(c: peers.Contender, rt: peers.Runtime, n: int, k: int) -> dict[str, Any]:
    """One fresh server, k processes of one contender draining N jobs together."""
    assert rt.argv is not None
    timeout = peers.drain_timeout(n)
    procs: list[Proc] = []
    with EmbeddedServer(["--appendonly", "no"], load_module=c.module) as server:
        r = server.client()
        read, per_read = progress_read(c, r, n)

        def argv(i: int) -> list[str]:
            return [
                *rt.argv,  # type: ignore[misc]
                str(rt.cwd / c.script),
                "--url",
                server.url,
                "--n",
                str(n),
                "--concurrency",
                str(c.concurrency),
                "--timeout",
                str(timeout + 60),  # the harness says stop before; this is a last resort
                *c.args,
                "--enqueue",
                str(n if i == 0 else 0),
                "--until-stop",
            ]

        try:
            procs = [Proc(argv(i), rt.cwd, rt.env) for i in range(k)]
            for p in procs:
                p.expect("ready", timeout=120 + 0.05 * n)
            t_go = time.perf_counter()
            deadline = t_go + timeout
            for p in procs:
                p.send("go")
            while read()[0] >= n and time.perf_counter() < deadline:  # until the first claim
                time.sleep(CLAIM_POLL_S)
            before, busy0 = server_stats(r), machine_busy()
            cpu0 = sum(p.cpu_seconds() for p in procs)
            t0 = time.perf_counter()
            reads = 1
            while (left := read()[1]) > 0 and time.perf_counter() < deadline:  # until the last completion
                time.sleep(POLL_S)
                reads += 1
            t1 = time.perf_counter()
            after, busy1 = server_stats(r), machine_busy()
            cpu1 = sum(p.cpu_seconds() for p in procs)
            timed_out = left > 0
            for p in procs:
                p.send("stop")
            for p in procs:
                p.expect("drained", timeout=60)
            for p in procs:
                p.send("verify")
            verified = [p.expect("verified", timeout=120 + 0.05 * n) for p in procs]
        except ContenderError as exc:
            return {"error": str(exc), "argv": shlex.join(argv(0))}
        finally:
            for p in procs:
                p.close()
    wall = t1 - t0
    server_cpu = after["cpu"] - before["cpu"]
    runs = [handler_runs(c, v) for v in verified]
    return {
        "n": n,
        "k": k,
        "wall_s": wall,
        "go_to_first_claim_s": t0 - t_go,
        "timed_out": timed_out,
        "jobs_per_s": n / wall,
        "server_cpu_us_per_job": server_cpu * 1e6 / n,
        "server_util": server_cpu / wall,
        "workers_cpu_us_per_job": (cpu1 - cpu0) * 1e6 / n,
        "machine_busy_cores": (busy1[0] - busy0[0]) / (busy1[1] - busy0[1]) * (os.cpu_count() or 1),
        # Less this harness's own: its reads and the first INFO (counted once it has run).
        "commands_per_job": (after["commands"] - before["commands"] - 1 - reads * per_read) / n,
        "handler_runs": runs,
        "verified": {key: v for key, v in verified[0].items() if key not in ("event", "stats", "counts")},
        "server_version": before["version"],
    }


def verdict(run: dict[str, Any]) -> tuple[bool, str]:
    """(every job done exactly once, what the status API and the handler counts said)."""
    if "error" in run:
        return False, f"ERROR: {run['error']}"
    ok, text = peers.verdict_text({**run, "processed": sum(run["handler_runs"])})
    ran = sum(run["handler_runs"])
    if ran != run["n"]:
        ok, text = False, f"{text}, handlers ran {ran:,} times for {run['n']:,} jobs"
    return ok, text


def run_rounds(
    contenders: list[peers.Contender], rts: dict[str, peers.Runtime], sizes: Sizes
) -> dict[str, Any]:
    cells = [(c, k) for c in contenders if rts[c.runtime].argv is not None for k in sizes.procs]
    per: dict[str, list[dict[str, Any]]] = {f"{c.key}/{k}": [] for c, k in cells}
    for rnd in range(sizes.rounds):
        for c, k in peers.rotate(cells, rnd):
            t = time.monotonic()
            run = run_one(c, rts[c.runtime], sizes.n, k)
            run["round"] = rnd
            per[f"{c.key}/{k}"].append(run)
            _, text = verdict(run)
            speed = (
                f"{run['jobs_per_s']:.0f} jobs/s, server {run['server_util']:.2f} core, "
                f"{run['server_cpu_us_per_job']:.1f} us/job, "
                if "jobs_per_s" in run
                else ""
            )
            log(f"round {rnd + 1}/{sizes.rounds} {c.key} x{k}: {speed}{text} ({time.monotonic() - t:.1f}s)")
    return per


METRICS = (
    "jobs_per_s",
    "server_cpu_us_per_job",
    "server_util",
    "workers_cpu_us_per_job",
    "machine_busy_cores",
    "commands_per_job",
)


def summarize(
    contenders: list[peers.Contender], rts: dict[str, peers.Runtime], per: dict[str, Any], sizes: Sizes
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for c in contenders:
        rt = rts[c.runtime]
        version = (rt.versions or {}).get(peers.VERSION_OF.get(c.key, ""))
        label = c.label.format(version=f" {version}" if version else "")
        if rt.argv is None:
            rows.append({"key": c.key, "label": label, "skipped": rt.reason})
            continue
        for k in sizes.procs:
            runs = per[f"{c.key}/{k}"]
            good = [run for run in runs if "error" not in run]
            base = {run["round"]: run for run in per.get(f"{peers.BASELINE}/{k}", []) if "error" not in run}
            row: dict[str, Any] = {"key": c.key, "label": label, "k": k, "runs": len(runs)}
            row["verdicts"] = [verdict(run) for run in runs]
            row["all_ok"] = all(ok for ok, _ in row["verdicts"])
            for m in METRICS:
                row[m] = peers.median([run[m] for run in good])
                ratios = [run[m] / base[run["round"]][m] for run in good if run["round"] in base]
                row[m + "_vs_bullmq"] = peers.median(ratios)
            rows.append(row)
    return rows


def ceilings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per contender: its best jobs/s, the first k within 10% of it, and the server's numbers there."""
    out: list[dict[str, Any]] = []
    keys = list(dict.fromkeys(row["key"] for row in rows if "k" in row))
    for key in keys:
        mine = [row for row in rows if row["key"] == key and row["jobs_per_s"] == row["jobs_per_s"]]
        if not mine:
            continue
        best = max(row["jobs_per_s"] for row in mine)
        at = next(row for row in mine if row["jobs_per_s"] >= SATURATED * best)
        out.append(
            {
                "key": key,
                "label": at["label"],
                "best_jobs_per_s": best,
                "k": at["k"],
                "jobs_per_s": at["jobs_per_s"],
                "server_cpu_us_per_job": at["server_cpu_us_per_job"],
                "server_util": at["server_util"],
                "machine_busy_cores": at["machine_busy_cores"],
            }
        )
    base = next((c for c in out if c["key"] == peers.BASELINE), None)
    for c in out:
        nan = float("nan")
        c["best_vs_bullmq"] = c["best_jobs_per_s"] / base["best_jobs_per_s"] if base else nan
        c["cpu_vs_bullmq"] = c["server_cpu_us_per_job"] / base["server_cpu_us_per_job"] if base else nan
    return out


def run(sizes: Sizes, command: str, only: list[str] | None = None) -> dict[str, Any]:
    by_key = {c.key: c for c in peers.CONTENDERS}
    contenders = [by_key[key] for key in KEYS if not only or key in only]
    mach = peers.machine()
    rts = peers.runtimes({c.runtime for c in contenders})
    for name, rt in rts.items():
        if rt.argv is None:
            log(f"{name} contenders skipped: {rt.reason}")
    versions: dict[str, str] = {}
    for rt in rts.values():
        versions.update(rt.versions or {})
    with EmbeddedServer(load_module=False) as probe:
        server = peers.server_label(probe.client().info("server"))
    per = run_rounds(contenders, rts, sizes)
    rows = summarize(contenders, rts, per, sizes)
    mach["loadavg_end"] = list(os.getloadavg())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": mach,
        "server": server,
        "versions": versions,
        "sizes": sizes.__dict__,
        "rows": rows,
        "ceilings": ceilings(rows),
        "runs": per,
    }


def _num(value: float, digits: int = 0) -> str:
    return "n/a" if value != value else f"{value:,.{digits}f}"


def _ratio(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}x"


def markdown(res: dict[str, Any]) -> str:
    m, sz, vers = res["machine"], res["sizes"], res["versions"]
    peer_line = ", ".join(f"{name} {vers[name]}" for name in ("bullmq", "ioredis", "node") if name in vers)
    out = [
        f"EchoMQ many workers, one server, {res['date']}, `{res['command']}`",
        f"(machine: {m['cpu']}, {m['cores']} cores, {m['arch']}; load average "
        f"{m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end; "
        f"{res['server']}; {m['python']}; echomq {vers.get('echomq', '?')}; {peer_line or 'BullMQ absent'})",
        "",
        f"{sz['n']:,} no-op jobs enqueued first, then k worker processes started together drain them; "
        f"a fresh server per run; medians of {sz['rounds']} interleaved round(s); "
        "x BullMQ is the median of the per-round ratios to BullMQ at the same k.",
        "",
        "| contender | k | jobs/s | x BullMQ | server CPU us/job | x BullMQ | server CPU util | "
        "workers CPU us/job | machine busy cores | verified by its own status API |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        if "skipped" in row:
            out.append(f"| {row['label']} | skipped: {row['skipped']} |  |  |  |  |  |  |  |  |")
            continue
        verdicts = row["verdicts"]
        if row["all_ok"]:
            check = f"all {sz['n']:,} done once in {len(verdicts)}/{len(verdicts)} runs"
        else:
            bad = "; ".join(f"run {i + 1}: {text}" for i, (ok, text) in enumerate(verdicts) if not ok)
            check = f"**{bad}**"
        out.append(
            f"| {row['label']} | {row['k']} | {_num(row['jobs_per_s'])} "
            f"| {_ratio(row['jobs_per_s_vs_bullmq'])} "
            f"| {_num(row['server_cpu_us_per_job'], 1)} | {_ratio(row['server_cpu_us_per_job_vs_bullmq'])} "
            f"| {_num(row['server_util'], 2)} | {_num(row['workers_cpu_us_per_job'])} "
            f"| {_num(row['machine_busy_cores'], 2)} | {check} |"
        )
    out += [
        "",
        "Where each saturates (the first k within 10% of its best jobs/s):",
        "",
        "| contender | best jobs/s | x BullMQ's best | saturates at k | server CPU us/job there | x BullMQ "
        "| server CPU util there | machine busy cores there | jobs/s one server core carries |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in res["ceilings"]:
        per_core = 1e6 / c["server_cpu_us_per_job"] if c["server_cpu_us_per_job"] else float("nan")
        out.append(
            f"| {c['label']} | {_num(c['best_jobs_per_s'])} | {_ratio(c['best_vs_bullmq'])} | {c['k']} "
            f"| {_num(c['server_cpu_us_per_job'], 1)} | {_ratio(c['cpu_vs_bullmq'])} "
            f"| {_num(c['server_util'], 2)} | {_num(c['machine_busy_cores'], 2)} | {_num(per_core)} |"
        )
    out += [
        "",
        "jobs/s, from the server's view: N / the span from the first claim (the first of this "
        f"harness's reads, every {CLAIM_POLL_S * 1000:.0f} ms after the go, that finds a job claimed) "
        f"to the last completion (the first read, every {POLL_S * 1000:.0f} ms, that finds every job "
        "finished).  server CPU: INFO used_cpu_sys + used_cpu_user over that span, per job and per "
        "wall second (utilisation: the server runs commands on one thread, so it saturates as this "
        "nears 1.0).  workers CPU: the k processes' utime + stime (/proc).  machine busy cores: "
        "/proc/stat over the span.  done once: the first process's status API says every job done and "
        "the k handlers ran N times in all.  On this machine the k worker processes compete with the "
        "server for its cores, so the ceiling measured is the machine's; the server's CPU per job at "
        "saturation is the figure that carries to a bigger one: one server core carries about 1e6 / it "
        "jobs/s (a bound from below: a busier server spends less per job).",
    ]
    return "\n".join(out) + "\n"



def exit_code(res: dict[str, Any]) -> int:
    """1 when the package under test lost, failed or repeated a job (a peer that does is a finding)."""
    bad = [row for row in res["rows"] if row["key"].startswith("echomq") and not row.get("all_ok", True)]
    return 1 if bad else 0


def main_section(quick: bool, command: str, sizes: Sizes | None = None, only: list[str] | None = None) -> int:
    t0 = time.monotonic()
    log("many workers, one server ...")
    res = run(sizes or (QUICK if quick else FULL), command, only)
    text = markdown(res)
    path = results.save("saturation", res, text)
    print(text, flush=True)
    log(f"done in {time.monotonic() - t0:.1f}s; written to {path.relative_to(ROOT)} (and saturation-latest)")
    return exit_code(res)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"N={QUICK.n}, R={QUICK.rounds}: a smoke run")
    parser.add_argument("--n", type=int, help=f"jobs per run (default {FULL.n:,})")
    parser.add_argument("--rounds", type=int, help=f"interleaved rounds (default {FULL.rounds})")
    parser.add_argument("--procs", type=int, nargs="+", help="numbers of worker processes (default 1 2 4 8)")
    parser.add_argument("--only", nargs="+", choices=KEYS, help="run only these contenders")
    peers.add_server_options(parser)
    args = parser.parse_args(argv)
    peers.choose_server(args)
    base = QUICK if args.quick else FULL
    sizes = Sizes(
        n=args.n or base.n,
        rounds=args.rounds or base.rounds,
        procs=tuple(args.procs) if args.procs else base.procs,
    )
    command = shlex.join(["bench/saturation.py", *(argv if argv is not None else sys.argv[1:])])
    return main_section(args.quick, command, sizes, args.only)


if __name__ == "__main__":
    sys.exit(main())
