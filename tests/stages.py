"""``make test``'s stages, run in order, each one's time printed at the end.

Which tests a stage runs is said next to the tests, by markers (pyproject.toml):
``smoke`` (every verb's contract: also on Redis 6.2, Valkey 9, Redis 8 and in the
Docker image), ``once`` (what does not depend on the engine: Redis 7.0 only) and
``image`` (the image's own tests).  Adding a test file never means editing this
file or the Makefile.

    python -m tests.stages            # every stage (make test)
    python -m tests.stages valkey     # the stages named

Every stage runs even when one before it failed, so one run shows every failure;
the exit status is 1 when any failed.  A stage's output is printed as it runs (a
group of stages run side by side, should one be made, prints each stage's when it ends).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PYTEST = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile"]
# The two whole-suite stages spend half their time waiting on servers, leases and child
# processes (7 min of CPU in 10 min of two test processes on 2 cores): four processes took
# them from 10 to 5.6 min (Redis 7.0) and 7.3 to 3.8 (Valkey 8).  The smoke stages are busy
# all the time (a fifth faster with four) and keep two.
WIDE = [sys.executable, "-m", "pytest", "-n", "4", "--dist", "loadfile"]


@dataclass(frozen=True)
class Stage:
    name: str
    argv: list[str]
    what: str
    report: bool = False  # a printed report that never fails the suite (its status shown, not counted)


def stages() -> list[list[Stage]]:
    """The stages, as groups: the stages of one group run side by side, the groups one after another.

    The smoke stages are each a group of their own: side by side, one test process each, they
    took 4 to 8 min where one after another with two processes each take 1 to 1.5 min.
    """
    make = os.environ.get("MAKE", "make")
    return [
        [Stage("redis", [*WIDE, "--engine", "redis", "tests"], "the whole suite on Redis 7.0")],
        [Stage("valkey", [*WIDE, "--engine", "valkey", "-m", "not once", "tests"],
               "everything that depends on the engine, on Valkey 8")],
        *([Stage(engine, [*PYTEST, "--engine", engine, "-m", "smoke", "tests"], f"the smoke subset, {name}")]
          for engine, name in (("redis62", "Redis 6.2"), ("valkey9", "Valkey 9"), ("redis8", "Redis 8"))),
        # Side by side: compat makes venvs and runs one test process, the container stage waits
        # on the Docker engine and its image, and the memory check keeps both cores busy under
        # valgrind but asserts no time: together they take about what the memory check takes
        # alone (one after another they took 1.6-1.8 min, then 3.4-3.8: a stop's CI run came
        # within 11 s of the 20 min, issue 40).
        [Stage("compat", [sys.executable, "-m", "tests.compat.run", "--short"],
               "the oldest and newest redis-py on the oldest and newest Python"),
         Stage("container", [make, "--no-print-directory", "test-container"],
               "the Docker image's tests, then the smoke subset against a container of it"),
         Stage("memcheck", [make, "--no-print-directory", "-C", "module", "check",
                            f"CHECK_PYTHON={BIN / 'python'}"], "the memory check (valgrind)"),
         # Each verb's instructions in the server against bench/instructions-baseline.json (issue
         # 41): exact whatever the machine's load, so a regression shows the day it lands.
         Stage("instrs", [sys.executable, "bench/instructions.py"],
               "the server's instructions per call (callgrind; a report, it never fails the suite)",
               report=True)],
        # A regression is seen the day it lands (issue 41): one short round against BullMQ, a report.
        [Stage("peers", [sys.executable, "bench/peers/harness.py", "--n", "2000", "--rounds", "1",
                         "--only", "echomq-sync-1", "echomq-sync-10", "echomq-async", "echomq-task-10",
                         "echomq-task-async", "bullmq", "--no-extras", "--no-census"],
               "the peers race, short (a report: it never fails the suite; make bench has the real one)",
               report=True)],
    ]  # fmt: skip


def _run(stage: Stage, capture: bool) -> tuple[Stage, int, float, str]:
    started = time.monotonic()
    if not capture:
        print(f"\n=== {stage.name}: {stage.what}\n$ {' '.join(stage.argv)}", flush=True)
        code = subprocess.call(stage.argv, cwd=ROOT)
        return stage, code, time.monotonic() - started, ""
    with tempfile.TemporaryFile("w+") as out:
        code = subprocess.call(stage.argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        out.seek(0)
        text = out.read()
    return stage, code, time.monotonic() - started, text


def main(argv: list[str]) -> int:
    chosen = set(argv)
    known = {s.name for group in stages() for s in group}
    if chosen - known:
        print(f"no stage {', '.join(sorted(chosen - known))}; the stages: {', '.join(sorted(known))}")
        return 2
    results: list[tuple[Stage, int, float]] = []
    began = time.monotonic()
    for group in stages():
        group = [s for s in group if not chosen or s.name in chosen]
        if not group:
            continue
        if len(group) == 1:
            stage, code, took, _ = _run(group[0], capture=False)
            results.append((stage, code, took))
            continue
        with ThreadPoolExecutor(len(group)) as pool:
            for stage, code, took, text in pool.map(lambda s: _run(s, capture=True), group):
                print(f"\n=== {stage.name}: {stage.what} (side by side)\n$ {' '.join(stage.argv)}")
                print(text, end="", flush=True)
                results.append((stage, code, took))
    total = time.monotonic() - began
    print("\nmake test, by stage:")
    for stage, code, took in results:
        if stage.report:
            status = "report" if code == 0 else "no rep"
        else:
            status = "ok    " if code == 0 else "FAILED"
        print(f"  {stage.name:<10} {status} {took / 60:5.1f} min   {stage.what}")
    passed = all(code == 0 for stage, code, _ in results if not stage.report)
    print(f"  {'in all':<10} {'ok    ' if passed else 'FAILED'} {total / 60:5.1f} min")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
