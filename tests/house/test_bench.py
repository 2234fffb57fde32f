"""The benchmark starts on a fresh clone: every bench module imports, and ``bench/run.py --help`` runs.

``make bench`` is not part of ``make test``, so nothing else would notice a bench
module that imports what the tree lacks (a new shared file left out of its
commit broke every section that way, unseen until a bench run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.once  # the engine does not matter

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for path in [*ROOT.glob("bench/*.py"), *ROOT.glob("bench/peers/*.py")]
    if path.name != "__init__.py"
)


def test_there_are_bench_modules() -> None:
    assert "bench.run" in MODULES and "bench._results" in MODULES and len(MODULES) >= 10


@pytest.mark.parametrize("module", MODULES)
def test_a_bench_module_imports(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_bench_runner_answers_help() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--help"], cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--only" in done.stdout


def test_the_worker_cost_counter_answers_help() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "worker_cost.py"), "--help"], cwd=ROOT, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--save-baseline" in done.stdout and "--top" in done.stdout
